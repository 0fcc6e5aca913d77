#!/usr/bin/env bash
# Builds and runs the attention kernels on the host emulation (see README.md).
# Usage: run.sh [flash|simple]   (both when omitted)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
cuda="${CUDA_HOME:-/usr/local/cuda}"
out="${TMPDIR:-/tmp}/conveyor_attention_check_kernels"
"${CXX:-g++}" -std=c++20 -O2 -pthread -Wno-attributes \
  -I"$here/include" -I"$root" -I"$cuda/include" -include "$here/emulated_cuda.h" \
  "$here/check_kernels.cpp" -o "$out"
exec "$out" "$@"
