#!/usr/bin/env bash
# One call on a machine with an NVIDIA GPU (no apt, no internet needed):
# configures with CONVEYOR_CUDA=ON against the machine's own torch, builds
# everything, runs every test (the CUDA cases included), runs the CUDA tests
# under compute-sanitizer when it is there, then the kernel benchmarks and
# the demo on the GPU. Logs and tables go to $OUT (default build-gpu/out).
#
#   GoogleTest: Debian's googletest source tree (/usr/src/googletest) copied
#   to .gpu/googletest, or CONVEYOR_GTEST_SOURCE=/path/to/googletest.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${CONVEYOR_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build/out}"
mkdir -p "$out"
py="${CONVEYOR_PYTHON:-$(command -v python3)}"
gtest="${CONVEYOR_GTEST_SOURCE:-$root/.gpu/googletest}"
[ -d "$gtest" ] || gtest=/usr/src/googletest
prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
status=0
step() {  # step NAME COMMAND...: runs, logs to $out/NAME.log, remembers failure
  local name=$1; shift
  echo "== $name: $*"
  if ! "$@" >"$out/$name.log" 2>&1; then
    echo "!! $name failed (see $out/$name.log)"; tail -n 30 "$out/$name.log"; status=1
  else
    tail -n 5 "$out/$name.log"
  fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/device.txt"
step configure cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCONVEYOR_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$prefix" -DCONVEYOR_GTEST_SOURCE="$gtest" -DCONVEYOR_PYTHON="$py" \
  -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
step build cmake --build "$build" --parallel "$(nproc)"
step ctest ctest --test-dir "$build" --output-on-failure --parallel 4 --timeout 900
if command -v compute-sanitizer >/dev/null; then
  for t in test_fused_lstm test_fused_attention test_conveyor; do
    [ -x "$build/tests/$t" ] && step "memcheck_$t" compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$build/tests/$t" --gtest_filter='*Cuda*:*CUDA*'
  done
fi
for b in bench_fused_lstm bench_fused_attention; do
  [ -x "$build/benchmarks/$b" ] && step "$b" "$build/benchmarks/$b"
done
[ -x "$build/examples/lm_pipeline" ] && step demo "$build/examples/lm_pipeline" --device cuda
echo "gpu.sh: done, status $status; logs in $out"
exit $status
