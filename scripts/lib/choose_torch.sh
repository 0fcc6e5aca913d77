# Sourced by scripts/setup.sh: conveyor_torch_version prints the torch release
# whose wheel supplies LibTorch here. CONVEYOR_TORCH_VERSION, when set, wins;
# otherwise the CUDA 13 build where a CUDA compiler is found (a CUDA
# LibTorch's CMake config needs the toolkit), and the CPU build where none is.
# CONVEYOR_NVCC_CANDIDATES: the places looked at besides PATH.
conveyor_cuda_torch="2.14.1"
conveyor_cpu_torch="2.13.0"

conveyor_have_nvcc() {
  command -v nvcc >/dev/null 2>&1 && return 0
  local candidate
  for candidate in ${CONVEYOR_NVCC_CANDIDATES-${CUDACXX:-} ${CUDA_HOME:+$CUDA_HOME/bin/nvcc} /usr/local/cuda/bin/nvcc}; do
    [ -x "$candidate" ] && return 0
  done
  return 1
}

conveyor_torch_version() {
  if [ -n "${CONVEYOR_TORCH_VERSION:-}" ]; then
    echo "$CONVEYOR_TORCH_VERSION"
  elif conveyor_have_nvcc; then
    echo "$conveyor_cuda_torch"
  else
    echo "$conveyor_cpu_torch"
  fi
}

# The torchvision release built against torch 2.N.x: 0.(N+15).x (2.14.1 and
# 0.29.1, 2.11.0 and 0.26.0); the ecosystem tests bring its ResNet-18.
conveyor_torchvision_version() {
  local torch="$1" minor patch
  minor="$(echo "$torch" | cut -d. -f2)"
  patch="$(echo "$torch" | cut -d. -f3 | cut -d+ -f1)"
  echo "0.$((minor + 15)).$patch"
}
