#!/usr/bin/env bash
# Everything Conveyor checks on a GPU, as one command of at most 9 minutes on
# a fresh GPU machine (one H100 or H200, 16 cores; the image's python3 with a
# CUDA torch, nvcc, cmake, ninja, pybind11, scikit-build-core; no apt, no
# network):
#
#   bash scripts/gpu.sh              (the device call's carry: [".gpu"])
#   bash scripts/gpu.sh --racecheck  (compute-sanitizer racecheck, bisected: a mode of its own)
#
# Before it, on this Debian machine: bash scripts/prepare_gpu.sh, which puts
# what the GPU machine lacks (GoogleTest's source) in the git-ignored .gpu.
#
# Steps, in this order, so that a run cut short still answers the first
# questions, each under `timeout` within the run's budget
# (CONVEYOR_GPU_BUDGET_S, default 520 s; a step that cannot start in time is
# SKIPPED and named):
#   configure, build  the GPU build only (CONVEYOR_OPS_ONLY: the library, the
#                     fused ops' test and benchmark binaries) with the Python
#                     module, against python3's torch, every core
#   op_tests_lstm     test_fused_lstm: every case, CPU and CUDA (a skipped
#                     CUDA case fails): every LSTM kernel against float64
#                     cuDNN, TF32 on and off, the flat weights, and the
#                     pipeline checks of tests/device_pipeline_checks.h
#   bench_lstm        every LSTM kernel against cuDNN at pipeline micro-batch
#                     sizes (bench_fused_lstm --sweep: batch 1-16 x hidden
#                     512, 1024; bf16, fp16, fp32; forward and forward+backward),
#                     alternated, with this GPU's dispatch-table rows
#   op_tests_attention  test_fused_attention likewise
#   bench_attention   the attention kernels against SDPA, unmasked and with a key-padding
#                     mask (against SDPA given the mask and SDPA on each sequence alone), with its rows
#   python_package    pip install . (no build isolation, the same build
#                     folder) into <build>/site, then
#   python_pipeline   tests/python/gpu/device_pipeline_check.py --require-cuda
#   pipeline_one_gpu  the pipeline's own cost on the one GPU: conveyor.Pipeline
#                     with 1, 2 and 4 workers against eager PyTorch and
#                     torch.distributed.pipelining on one rank
#                     (benchmarks/pipeline_one_gpu.py)
#   memcheck_*        compute-sanitizer memcheck on the CUDA op tests and the
#                     pipeline checks (SKIP, not FAIL, where the sanitizer
#                     refuses the device, as on gVisor machines), then
#                     synccheck on the op tests if time is left
# With --racecheck, after the build: racecheck on a trivial kernel of its own
# (does the sanitizer work on this machine at all?), then on the op tests one
# Conveyor kernel at a time (--kernel-name), the caching allocator off.
#
# Results in $OUT (default <build>/out), at most 8 files, each written as its
# step ends: 1-summary.txt (device, tools, one line a step), 2-logs.txt
# (every step's log; over 4 MiB, head and tail), 3-bench-lstm.txt,
# 4-bench-attention.txt, 5-dispatch-lstm.txt, 6-dispatch-attention.txt,
# 7-pipeline-one-gpu.txt.
# Exit status 1, naming them, when a step failed or was skipped for time.
#
# Without a CUDA device (or nvcc) it configures and builds what it can and
# reports each GPU step SKIPPED, saying why: the dry run on any machine.
# CONVEYOR_GPU_DRY_RUN=1 prints each step's command instead of running it.
#
# Settings (environment):
#   CONVEYOR_BUILD_DIR     build folder (default build-gpu, git-ignored)
#   CONVEYOR_PYTHON        Python whose torch to build against (default python3)
#   CONVEYOR_GTEST_SOURCE  GoogleTest source (default .gpu/googletest, else /usr/src/googletest)
#   TORCH_CUDA_ARCH_LIST   default 9.0 (Hopper)
#   CONVEYOR_GPU_BUDGET_S  the run's time budget in seconds (default 520)
#   CONVEYOR_GPU_BUILD_S   the build step's limit (default 420; a 2-core dry run needs ~1500)
#   CONVEYOR_SANITIZER_KERNELS  --kernel-name filter: only kernels whose name holds this are
#       instrumented (default kns=conveyor: Conveyor's own kernels, not torch's; empty: every kernel)
set -uo pipefail
mode=all
for arg in "$@"; do
  case "$arg" in
    --racecheck) mode=racecheck ;;
    *) echo "gpu.sh: unknown argument '$arg' (--racecheck, or nothing for the whole run)" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=lib/gpu_steps.sh
source "$root/scripts/lib/gpu_steps.sh"

budget="${CONVEYOR_GPU_BUDGET_S:-520}"
gpu_steps_begin "$budget" "${CONVEYOR_GPU_DRY_RUN:-0}"
build="${CONVEYOR_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build/out}"
gpu_steps_files "$out" "$build/gpu-logs"
py="${CONVEYOR_PYTHON:-python3}"
py="$(cd "$(dirname "$(command -v "$py" || echo "$py")")" && pwd)/$(basename "$py")"  # absolute, links kept (a venv's)
gtest="${CONVEYOR_GTEST_SOURCE:-$root/.gpu/googletest}"
[ -d "$gtest" ] || gtest=/usr/src/googletest
sanitizer="$(gpu_find_sanitizer)"
[ -n "$sanitizer" ] || [ "${CONVEYOR_GPU_DRY_RUN:-0}" = 0 ] || sanitizer=compute-sanitizer
kernel_filter="${CONVEYOR_SANITIZER_KERNELS-kns=conveyor}"

# --- the machine ------------------------------------------------------------------
say "Conveyor scripts/gpu.sh, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "$(printf '%-18s %s' "git:" "$(git -C "$root" log -1 --format='%h %s' 2>/dev/null || echo '(no git)')$(
  git -C "$root" status --porcelain 2>/dev/null | grep -q . && echo ' (+ uncommitted changes)')")"
say "$(printf '%-18s %s' "host:" "$(uname -r), $(nproc) cores, $(awk '/MemTotal/{printf "%d GiB", $2/1048576}' /proc/meminfo)")"
tool_line "gpu" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
tool_line "torch" "$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "device:",
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")'
tool_line "nvcc" bash -c 'nvcc --version | tail -n 2'
tool_line "compute-sanitizer" bash -c "${sanitizer:-false} --version | tail -n 1"
tool_line "cmake" bash -c 'cmake --version | head -n 1'
tool_line "ninja" ninja --version
say "$(printf '%-18s %s' "googletest:" "$gtest")"
say "$(printf '%-18s %s' "build folder:" "$build")"
say "$(printf '%-18s %s' "budget:" "${budget} s")"
# Why the GPU steps cannot run here, if they cannot (empty: they can).
no_gpu=""
if [ "$dry" = 0 ]; then
  if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    no_gpu="torch sees no CUDA device"
  elif ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    no_gpu="no nvcc: the CUDA kernels are not built"
  fi
fi
[ -z "$no_gpu" ] || say "NO GPU: $no_gpu; the GPU steps are reported SKIPPED"
[ "$dry" = 1 ] && say "DRY RUN: each step's command is printed, not run"
say ""

# --- configure and build ------------------------------------------------------------
if [ ! -f "$gtest/CMakeLists.txt" ]; then
  gpu_fail configure "no GoogleTest source at $gtest: run scripts/prepare_gpu.sh here and carry .gpu"
  gpu_finish
fi
if ! prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>&1)"; then
  gpu_fail configure "$py cannot import torch: $prefix"
  gpu_finish
fi
cuda_mode=ON
[ -z "$no_gpu" ] || cuda_mode=AUTO
step configure 240 - cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCONVEYOR_CUDA="$cuda_mode" -DCONVEYOR_OPS_ONLY=ON -DCONVEYOR_BUILD_TESTS=ON -DCONVEYOR_BUILD_BENCHMARKS=ON \
  -DCONVEYOR_BUILD_EXAMPLES=OFF -DCONVEYOR_PYTHON_MODULE=ON -DCONVEYOR_PYTHON="$py" \
  -DPython_EXECUTABLE="$py" -DCMAKE_PREFIX_PATH="$prefix" -DCONVEYOR_GTEST_SOURCE="$gtest" \
  -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" || gpu_finish
step build "${CONVEYOR_GPU_BUILD_S:-420}" - cmake --build "$build" --parallel "$(nproc)" || gpu_finish

# --- the sanitizer's kernel filter ------------------------------------------------------
kernels=()
if [ -n "$kernel_filter" ] && { [ "$dry" = 1 ] || "${sanitizer:-false}" --help 2>&1 | grep -q -- '--kernel-name'; }; then
  kernels=(--kernel-name "$kernel_filter")
fi
if [ -z "$sanitizer" ] && [ -z "$no_gpu" ]; then
  gpu_fail compute-sanitizer "not found (PATH, next to nvcc, /usr/local/cuda)"
fi

# --- racecheck, bisected: a mode of its own ------------------------------------------------
if [ "$mode" = racecheck ]; then
  if [ -n "$sanitizer" ] || [ -n "$no_gpu" ]; then
    # A kernel that cannot race: does racecheck itself work on this machine?
    trivial="$build/racecheck_trivial"
    step trivial_build 120 - nvcc -o "$trivial" "$root/scripts/lib/racecheck_trivial.cu"
    gpu_step racecheck_trivial 60 check_racecheck "${sanitizer:-compute-sanitizer}" --tool racecheck \
      --error-exitcode 1 "$trivial"
    # Then one Conveyor kernel at a time, on the tests that run it.
    while read -r op kernel; do
      upper="$(tr '[:lower:]' '[:upper:]' <<<"${op:0:1}")${op:1}"
      gpu_step "racecheck_${kernel%_kernel}" 120 check_gtest env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CONVEYOR_REQUIRE_CUDA=1 \
        "${sanitizer:-compute-sanitizer}" --tool racecheck --error-exitcode 1 --kernel-name "kns=$kernel" \
        "$build/tests/test_fused_$op" --gtest_filter="Fused${upper}Cuda.*"
    done <<'KERNELS'
lstm lstm_forward_persistent_kernel
lstm lstm_backward_persistent_kernel
lstm lstm_forward_step_kernel
lstm lstm_backward_step_kernel
attention flash_forward_kernel
attention flash_backward_kernel
attention simple_forward_kernel
attention simple_dq_kernel
attention simple_dkdv_kernel
attention row_dot_kernel
KERNELS
  fi
  gpu_finish
fi

# --- the LSTM first: its tests, then its measurements ---------------------------------------
gpu_step op_tests_lstm 180 check_gtest env CONVEYOR_REQUIRE_CUDA=1 "$build/tests/test_fused_lstm"
gpu_step bench_lstm 150 - gpu_tee "$out/3-bench-lstm.txt" "$build/benchmarks/bench_fused_lstm" --sweep \
  --repeats 5 --table-out "$out/5-dispatch-lstm.txt"

# --- attention ------------------------------------------------------------------------------
gpu_step op_tests_attention 180 check_gtest env CONVEYOR_REQUIRE_CUDA=1 "$build/tests/test_fused_attention"
gpu_step bench_attention 200 - gpu_tee "$out/4-bench-attention.txt" "$build/benchmarks/bench_fused_attention" \
  --iters 10 --table-out "$out/6-dispatch-attention.txt"

# --- the pipelines from Python, and their own cost on the one GPU -----------------------------
site="$build/site"
step python_package 240 - "$py" -m pip install --no-build-isolation --no-deps --upgrade --target "$site" \
  -C build-dir="$build" "$root"
gpu_step python_pipeline 180 check_pass env PYTHONPATH="$site" CONVEYOR_FUSED_DISPATCH=fused "$py" "$root/tests/python/gpu/device_pipeline_check.py" \
  --require-cuda --repeats 3
gpu_step pipeline_one_gpu 150 check_pass gpu_tee "$out/7-pipeline-one-gpu.txt" env PYTHONPATH="$site" "$py" \
  "$root/benchmarks/pipeline_one_gpu.py" --device cuda

# --- compute-sanitizer, cheapest first -------------------------------------------------
if [ -n "$sanitizer" ] || [ -n "$no_gpu" ]; then
  # memcheck without torch's caching allocator: each tensor is an allocation
  # of its own, so a read past its end is seen.
  for op in lstm attention; do
    upper="$(tr '[:lower:]' '[:upper:]' <<<"${op:0:1}")${op:1}"
    gpu_step "memcheck_$op" 150 check_gtest env PYTORCH_NO_CUDA_MEMORY_CACHING=1 CONVEYOR_REQUIRE_CUDA=1 \
      "${sanitizer:-compute-sanitizer}" --tool memcheck --error-exitcode 1 "${kernels[@]}" \
      "$build/tests/test_fused_$op" --gtest_filter="Fused${upper}Cuda.*:Fused${upper}DevicePipeline.Exact*"
  done
  for op in lstm attention; do
    upper="$(tr '[:lower:]' '[:upper:]' <<<"${op:0:1}")${op:1}"
    gpu_step "synccheck_$op" 120 check_gtest "${sanitizer:-compute-sanitizer}" --tool synccheck --error-exitcode 1 \
      "${kernels[@]}" "$build/tests/test_fused_$op" --gtest_filter="Fused${upper}Cuda.*"
  done
fi
gpu_finish
