#!/usr/bin/env bash
# Installs what Conveyor needs, idempotently (a second run only checks):
#  - Debian packages: GoogleTest, 'fortunes' (the demo's English text), and
#    SentencePiece (spm_train and the C++ library: the BERT example's tokenizer),
#    and the translator's parallel corpus: the King James Version and the
#    Reina-Valera 1909 as SWORD modules, with diatheke to read them;
#  - the project's own virtual environment .venv with LibTorch (the torch
#    wheel: the CUDA 13 build where a CUDA compiler is found, the CPU build
#    where none is; scripts/lib/choose_torch.sh), numpy, pytest,
#    scikit-learn, sacrebleu, the build requirements of pip install . (also
#    as wheels in .venv/wheelhouse), and torchvision and transformers (the
#    ecosystem tests).
# Override the torch release with CONVEYOR_TORCH_VERSION=2.13.0 (a CPU build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/choose_torch.sh
source "$root/scripts/lib/choose_torch.sh"
torch_version="$(conveyor_torch_version)"
fallback_torch="$conveyor_cpu_torch"

apt_packages=(libgtest-dev libgmock-dev googletest nlohmann-json3-dev fortunes sentencepiece libsentencepiece-dev diatheke
  sword-text-kjv sword-text-sparv)
# shellcheck source=lib/debian_packages.sh
source "$root/scripts/lib/debian_packages.sh"
install_debian_packages setup "${apt_packages[@]}"

venv="$root/.venv"
py="$venv/bin/python"
[ -x "$py" ] || python3 -m venv "$venv"
have_torch() { "$py" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$1' else 1)" 2>/dev/null; }
# The CPU build stands in for a CUDA one that failed to install, never the
# other way round: a CUDA LibTorch does not configure without the toolkit.
if ! have_torch "$torch_version" && { [ "$torch_version" = "$fallback_torch" ] || ! have_torch "$fallback_torch"; }; then
  [ "$torch_version" != "$fallback_torch" ] || conveyor_have_nvcc ||
    echo "setup: no CUDA compiler found (nvcc): LibTorch comes from the CPU build of torch"
  echo "setup: installing torch==$torch_version into .venv (LibTorch comes from this wheel)"
  if ! "$py" -m pip install -q "torch==$torch_version"; then
    echo "setup: torch==$torch_version failed to install; falling back to torch==$fallback_torch (CPU build)" >&2
    "$py" -m pip install -q "torch==$fallback_torch"
  fi
fi
# numpy and pytest for the Python tests; scikit-learn ships the digits images
# the ResNet study trains on (sklearn/datasets/data/digits.csv.gz); sacrebleu
# scores the translator.
# pip install . takes its build requirements from pyproject.toml: installed
# here for the test command's own install (no build isolation), and kept as
# wheels in .venv/wheelhouse for the test that installs as a user does, in a
# fresh environment with build isolation (tests/pip_install_configure.sh),
# where nothing may be fetched.
mapfile -t build_requires < <("$py" -c "import tomllib
print(*tomllib.load(open('$root/pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')")
"$py" -c "import numpy, pytest, sklearn, sacrebleu, scikit_build_core" 2>/dev/null ||
  "$py" -m pip install -q numpy pytest scikit-learn sacrebleu "${build_requires[@]}"
stamp="$venv/wheelhouse/.requires"
if [ "$(cat "$stamp" 2>/dev/null)" != "${build_requires[*]}" ]; then
  rm -rf "$venv/wheelhouse"
  "$py" -m pip download -q -d "$venv/wheelhouse" "${build_requires[@]}"
  echo "${build_requires[*]}" >"$stamp"
fi
# The models users bring, for the ecosystem tests (tests/python/ecosystem):
# torchvision's (the release built against this torch) and Hugging Face's
# transformers, in small configurations with random weights (nothing is
# downloaded at run time).
installed_torch="$("$py" -c "import torch; print(torch.__version__.split('+')[0])")"
torchvision_version="$(conveyor_torchvision_version "$installed_torch")"
transformers_version="5.24.0"
"$py" -c "import torchvision, transformers, sys
sys.exit(0 if (torchvision.__version__.split('+')[0], transformers.__version__) == ('$torchvision_version', '$transformers_version') else 1)" 2>/dev/null ||
  "$py" -m pip install -q "torchvision==$torchvision_version" "transformers==$transformers_version"
# The index's torchvision for the CPU wheel of torch 2.13 does not load beside
# it (its operators are missing): then the tests that need it say so and skip.
if ! "$py" -c "import torchvision" 2>/dev/null; then
  echo "setup: torchvision $torchvision_version does not load beside torch $installed_torch; removing it" >&2
  "$py" -m pip uninstall -q -y torchvision
fi
# Build tools: use the machine's cmake/ninja when recent enough, else the venv's.
if ! cmake --version 2>/dev/null | awk 'NR==1{split($3,v,"."); exit !(v[1]>3 || (v[1]==3 && v[2]>=25))}'; then
  "$py" -m pip install -q "cmake>=3.25"
fi
command -v ninja >/dev/null 2>&1 || [ -x "$venv/bin/ninja" ] || "$py" -m pip install -q ninja
