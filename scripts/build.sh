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
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DCONVEYOR_PYTHON="$py" ${CONVEYOR_CMAKE_ARGS:-}
fi
cmake --build "$build" --parallel "$(nproc)" "$@"
