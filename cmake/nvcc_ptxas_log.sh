#!/usr/bin/env bash
# The CUDA compiler launcher of the conveyor target (CMakeLists.txt): runs the
# nvcc command it is given, keeps what ptxas -v reports (registers, spills and
# stack of every kernel, per architecture) in <object>.ptxas beside the object
# file for tests/check_ptxas.cmake, and passes every other line of the
# compiler's error output (warnings, errors) through as nvcc printed it.
set -uo pipefail
object=""
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && object="$arg"
  previous="$arg"
done
log="${object:-nvcc}.ptxas"
[ -n "$object" ] || log="$(mktemp)"
"$@" 2>"$log"
status=$?
grep -v -E '^ptxas info +:|^ +[0-9]+ bytes stack frame' "$log" >&2
[ -n "$object" ] || rm -f "$log"
exit "$status"
