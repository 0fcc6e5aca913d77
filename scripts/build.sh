#!/usr/bin/env bash
# Configures and builds Conveyor into build/ (after scripts/setup.sh).
# Extra arguments are passed to the build (e.g. --target lm_pipeline).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
export PATH="$root/.venv/bin:$PATH"
py="$root/.venv/bin/python"
torch_prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
# A build configured against another torch (set-up switched between the CUDA
# and the CPU wheel) is configured afresh; unchanged commands do not recompile.
torch_now="$("$py" -c 'import torch; print(torch.__version__)')"
if [ -f "$build/build.ninja" ] && [ -f "$build/.torch-version" ] && [ "$(cat "$build/.torch-version")" != "$torch_now" ]; then
  echo "build: torch is now $torch_now (was $(cat "$build/.torch-version")): configuring $build afresh"
  rm -f "$build/CMakeCache.txt" "$build/build.ninja"
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DCONVEYOR_PYTHON="$py" -DPython_EXECUTABLE="$py" ${CONVEYOR_CMAKE_ARGS:-}
fi
echo "$torch_now" >"$build/.torch-version"
cmake --build "$build" --parallel "$(nproc)" "$@"
