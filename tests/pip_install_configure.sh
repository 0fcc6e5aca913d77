#!/usr/bin/env bash
# pip install . as a user runs it, as far as a configured build: a fresh
# virtual environment that has torch (TORCH_PYTHON's, seen through a .pth
# file), build isolation on, the build requirements taken from WHEELHOUSE
# (set-up downloads them; nothing is fetched here). scikit-build-core then
# builds only CMake's built-in list_install_components target and installs
# no component, so the library is not compiled a second time: the check is
# that configuring finds the environment's torch and, with a CUDA torch, the
# NVRTC beside it. Run with the PATH the case needs (no nvcc for a CPU torch).
# Usage: pip_install_configure.sh SOURCE_DIR WORK_DIR TORCH_PYTHON WHEELHOUSE
set -euo pipefail
src="$1" work="$2" torch_py="$3" wheels="$4"
if [ ! -d "$wheels" ]; then
  echo "pip_install_configure: no wheels of the build requirements at $wheels: run scripts/setup.sh" >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work"
"$torch_py" -m venv "$work/venv"
py="$work/venv/bin/python"
torch_site="$("$torch_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$torch_site" >"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/with_torch.pth"
cuda="$("$py" -c 'import torch; print(torch.version.cuda or "")')"
echo "pip_install_configure: fresh environment with torch $("$py" -c 'import torch; print(torch.__version__)')"
if ! "$py" -m pip install -v --no-deps --no-index --find-links "$wheels" -C build-dir="$work/build" \
  -C build.targets=list_install_components -C install.components=none "$src" >"$work/pip.log" 2>&1; then
  grep -E "CMake Error|NOTFOUND|conveyor:|FATAL|ERROR" "$work/pip.log" | head -n 40 || tail -n 40 "$work/pip.log"
  echo "pip_install_configure: FAIL: pip install . did not configure (log: $work/pip.log)"
  exit 1
fi
grep -E "conveyor: (LibTorch|CUDA kernels|no nvcc)|Configuring done" "$work/pip.log" | sed 's/^ *//'
cache="$work/build/CMakeCache.txt"
torch_dir="$(sed -n 's/^Torch_DIR:PATH=//p' "$cache")"
case "$torch_dir" in
  "$torch_site"/*) ;;
  *) echo "pip_install_configure: FAIL: configured against $torch_dir, not the environment's torch in $torch_site"; exit 1 ;;
esac
if [ -n "$cuda" ]; then
  nvrtc="$(sed -n 's/^CUDA_nvrtc_LIBRARY:FILEPATH=//p' "$cache")"
  [ -f "$nvrtc" ] || { echo "pip_install_configure: FAIL: CUDA torch $cuda but NVRTC is '$nvrtc'"; exit 1; }
  echo "pip_install_configure: NVRTC $nvrtc"
fi
echo "pip_install_configure: PASS: pip install . configured against $torch_dir"
