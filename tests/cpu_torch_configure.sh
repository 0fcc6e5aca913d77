#!/usr/bin/env bash
# A machine without a CUDA toolkit: set-up's choice (the CPU build of torch,
# scripts/lib/choose_torch.sh) in a virtual environment of its own under
# WORK_DIR, then the project configured against its LibTorch with no CUDA
# compiler to be found, as the README's commands would: it must configure,
# without CUDA kernels; and pip install . from a fresh environment with that
# torch must configure too (pip_install_configure.sh).
# Usage: cpu_torch_configure.sh SOURCE_DIR WORK_DIR WHEELHOUSE
set -euo pipefail
src="$1" work="$2" wheels="$3"
version="$(env -u CONVEYOR_TORCH_VERSION CONVEYOR_NVCC_CANDIDATES=/nonexistent/nvcc PATH=/usr/bin:/bin \
  bash -c "source '$src/scripts/lib/choose_torch.sh' && conveyor_torch_version")"
venv="$work/venv"
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==$version"
fi
prefix="$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
"$venv/bin/python" -c "import torch; assert torch.version.cuda is None, torch.version.cuda; print('torch', torch.__version__)"
rm -rf "$work/build"
# No nvcc on PATH, and CUDACXX pointing nowhere keeps CMake from the toolkit's usual places.
no_toolkit=(env -u CUDA_HOME CUDACXX=/nonexistent/bin/nvcc
  PATH="$(dirname "$(command -v cmake)"):$(dirname "$(command -v ninja)"):/usr/bin:/bin")
"${no_toolkit[@]}" cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCONVEYOR_PYTHON="$venv/bin/python" -DPython_EXECUTABLE="$venv/bin/python"
"${no_toolkit[@]}" bash "$src/tests/pip_install_configure.sh" "$src" "$work/pip" "$venv/bin/python" "$wheels"
