#!/usr/bin/env bash
# The library links the shared libstdc++, whatever the toolchain would do with
# "-lstdc++" (cmake/SharedLibstdcxx.cmake says why).
#   shared_libstdcxx.sh <source dir> <work dir> <cxx compiler> <library>...
# 1. The built libraries (libconveyor, the Python module) need libstdc++.so.6.
# 2. A relocated GCC whose own library folder has only libstdc++.a (as on the
#    GPU machines) is made here with -B; with it, a shared library linked with
#    plain -lstdc++ carries a static copy (the crash), and one linked as
#    SharedLibstdcxx.cmake says needs libstdc++.so.6 and holds no copy.
set -euo pipefail
src="$1" work="$2" cxx="$3"
shift 3
needs() { readelf -d "$1" | grep 'NEEDED.*\[libstdc++\.so\.6\]' >/dev/null; }
holds_copy() { nm -D --defined-only "$1" | grep '_ZNSo9_M_insertIdEERSoT_' >/dev/null; }  # ostream::_M_insert<double>
for lib in "$@"; do
  needs "$lib" || { echo "FAIL: $lib does not need libstdc++.so.6"; readelf -d "$lib" | grep NEEDED; exit 1; }
  echo "ok: $lib needs libstdc++.so.6"
done

archive="$("$cxx" -print-file-name=libstdc++.a)"
[ -f "$archive" ] || { echo "SKIP: $cxx has no libstdc++.a to relocate"; exit 0; }
rm -rf "$work" && mkdir -p "$work/gcc" "$work/bin"
cp "$archive" "$work/gcc/"
printf '#!/bin/sh\nexec %s -B%s/gcc/ "$@"\n' "$cxx" "$work" >"$work/bin/g++"
chmod +x "$work/bin/g++"
cat >"$work/f.cpp" <<'CPP'
#include <sstream>
#include <string>
std::string format(double x) { std::ostringstream s; s << x; return s.str(); }
CPP
"$work/bin/g++" -shared -fPIC -o "$work/plain.so" "$work/f.cpp" -Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state
if needs "$work/plain.so" || ! holds_copy "$work/plain.so"; then
  echo "FAIL: the relocated toolchain did not reproduce the static copy; the check below proves nothing"
  exit 1
fi
echo "ok: with plain -lstdc++ the relocated toolchain puts a static libstdc++ into the library"
cat >"$work/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.24)
project(shared_libstdcxx CXX)
include("$src/cmake/SharedLibstdcxx.cmake")
conveyor_shared_libstdcxx(libstdcxx)
add_library(f SHARED f.cpp)
target_link_options(f PRIVATE "SHELL:-Wl,--push-state,--no-as-needed \${libstdcxx} -Wl,--pop-state")
CMAKE
CXX="$work/bin/g++" cmake -S "$work" -B "$work/build" -G Ninja >/dev/null
cmake --build "$work/build" >/dev/null
lib="$work/build/libf.so"
if ! needs "$lib" || holds_copy "$lib"; then
  echo "FAIL: linked as SharedLibstdcxx.cmake says, the library still holds a static libstdc++"
  exit 1
fi
echo "shared_libstdcxx: PASS"
