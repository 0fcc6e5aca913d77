#!/usr/bin/env bash
# The GPU machine calls (one H100 or H200; the image's python3 with a CUDA
# torch, nvcc, cmake, ninja, compute-sanitizer; no apt, no internet; at most 10
# minutes a command). Two phases, one device call each:
#
#   bash scripts/gpu.sh build-test
#       configure with CONVEYOR_CUDA=ON against python3's torch (GPU-only:
#       CONVEYOR_OPS_ONLY=ON, no examples, no TorchScript, so the plugin,
#       test_fused_lstm, test_fused_attention, bench_fused_lstm and
#       bench_fused_attention), build with every core, run the two op test
#       binaries (CPU and CUDA cases; a skipped CUDA case fails the step),
#       then compute-sanitizer memcheck, synccheck and racecheck on their CUDA
#       tests alone: --gtest_filter FusedLstmCuda.* (T<=7, B<=48, H<=40) and
#       FusedAttentionCuda.* (at most 2x4x300x300 or 1x2x257x513, head dim
#       <= 200), small shapes; the benchmarks' large ones never run under a
#       sanitizer. Only Conveyor's kernels are instrumented (--kernel-name).
#   bash scripts/gpu.sh bench
#       the two op benchmarks, which also write this GPU's dispatch-table rows
#       (dispatch-lstm.txt, dispatch-attention.txt; two more files in $OUT);
#       reuses the build folder when it is there (a warm
#       machine keeps it between calls), else builds just them first.
#   bash scripts/gpu.sh configure
#       the configure step alone; needs no GPU (a check on any machine with
#       nvcc, e.g. CONVEYOR_PYTHON=.venv/bin/python CONVEYOR_BUILD_DIR=/tmp/x).
#
# Before the first call, on the Debian machine: bash scripts/prepare_gpu.sh,
# which copies GoogleTest's source to the git-ignored .gpu/googletest; name
# ".gpu" in the device call's carry list so that it travels.
#
# No demo here: examples/lm_pipeline reads Debian's 'fortunes' text, which the
# GPU machines lack (and the examples are not built).
#
# Each step runs under `timeout`, and the phase as a whole keeps to a budget
# (CONVEYOR_GPU_BUDGET_S, default 540 s): a step gets at most what is left,
# and one that cannot start in time is reported SKIPPED. Results go to $OUT
# (default <build>/out), two files a phase (bench adds its two tables), written as each step ends:
#   summary-<phase>.txt  device and tools, PASS/FAIL/TIMEOUT per step, seconds
#   logs-<phase>.txt     every step's full log (over 4 MiB: head and tail)
# The script exits 1 and names the failed steps if any step did not pass.
# A phase cut short by its budget (a cold first build is the slow part) can be
# called again while the machine is warm: the build folder is kept, so the
# build is then a no-op and the remaining steps get the time.
#
# Settings (environment):
#   CONVEYOR_BUILD_DIR     build folder (default build-gpu, git-ignored)
#   CONVEYOR_PYTHON        Python whose torch to build against (default python3)
#   CONVEYOR_GTEST_SOURCE  GoogleTest source (default .gpu/googletest, else /usr/src/googletest)
#   TORCH_CUDA_ARCH_LIST   default 9.0 (Hopper)
#   CONVEYOR_GPU_BUDGET_S  the phase's time budget in seconds (default 540)
#   CONVEYOR_SANITIZE_LSTM_FILTER       gtest filter (default FusedLstmCuda.*)
#   CONVEYOR_SANITIZE_ATTENTION_FILTER  gtest filter (default FusedAttentionCuda.*)
#   CONVEYOR_SANITIZER_KERNELS  --kernel-name filter: only kernels whose name holds
#       this are instrumented (default kns=conveyor: Conveyor's own kernels, not
#       torch's; empty: every kernel)
#   CONVEYOR_BENCH_LSTM_ARGS, CONVEYOR_BENCH_ATTENTION_ARGS  extra benchmark flags
#   CONVEYOR_GPU_DRY_RUN=1  print each step's command instead of running it
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1

phase="${1:-}"
case "$phase" in
  build-test | bench | configure) ;;
  *)
    echo "usage: bash scripts/gpu.sh build-test|bench|configure  (see the header of this script)" >&2
    exit 2
    ;;
esac

start=$(date +%s)
budget="${CONVEYOR_GPU_BUDGET_S:-540}"
deadline=$((start + budget))
dry="${CONVEYOR_GPU_DRY_RUN:-0}"
[ "$dry" = 0 ] || dry=1
build="${CONVEYOR_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build/out}"
steplogs="$build/gpu-logs"
mkdir -p "$out" "$steplogs"
summary="$out/summary-$phase.txt"
logs="$out/logs-$phase.txt"
: >"$summary"
: >"$logs"
failed=()

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }

# --- the machine and its tools -------------------------------------------------
py="${CONVEYOR_PYTHON:-python3}"
gtest="${CONVEYOR_GTEST_SOURCE:-$root/.gpu/googletest}"
[ -d "$gtest" ] || gtest=/usr/src/googletest
sanitizer="$(command -v compute-sanitizer || true)"
if [ -z "$sanitizer" ] && [ "$dry" = 1 ]; then
  sanitizer=compute-sanitizer
elif [ -z "$sanitizer" ]; then
  nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
  for c in "$nvcc_dir/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && sanitizer="$c" && break
  done
fi

tool_line() {  # tool_line LABEL COMMAND...: one line of the summary's header
  local text
  text="$(timeout 60 "${@:2}" 2>&1 | grep -v '^\s*$' | tr '\n' ' ' | cut -c1-300)" || true
  say "$(printf '%-18s %s' "$1:" "${text:-(not available)}")"
}
say "Conveyor scripts/gpu.sh $phase, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
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
if [ "$phase" = build-test ]; then
  lstm_filter="${CONVEYOR_SANITIZE_LSTM_FILTER:-FusedLstmCuda.*}"
  attention_filter="${CONVEYOR_SANITIZE_ATTENTION_FILTER:-FusedAttentionCuda.*}"
  kernel_filter="${CONVEYOR_SANITIZER_KERNELS-kns=conveyor}"
  say "$(printf '%-18s %s' "sanitizer filters:" "test_fused_lstm $lstm_filter; test_fused_attention $attention_filter; kernels ${kernel_filter:-all}")"
fi
[ "$dry" = 1 ] && say "DRY RUN: each step's command is printed, not run"
say ""

# --- steps ---------------------------------------------------------------------
# Reads a gtest log: fails a run where no test ran, or where a CUDA test
# skipped (torch saw no device), and keeps gtest's and the sanitizer's totals.
# shellcheck disable=SC2329  # called through step's CHECK argument
check_gtest() {  # check_gtest LOG: prints a note, returns 1 when the run does not count
  local log=$1 note bad=0
  note="$(grep -E '^\[==========\] [0-9]+ tests? from .* ran' "$log" | tail -n 1 | sed 's/^\[==========\] //')"
  if grep -q 'Device not supported' "$log"; then
    note="compute-sanitizer refused the device (seen on gVisor machines); $note"; bad=1
  fi
  if grep -qE '^\[  SKIPPED \] .*Cuda' "$log"; then
    note="CUDA tests SKIPPED: torch saw no device; $note"; bad=1
  elif grep -qE '^\[  PASSED  \] 0 tests' "$log" || ! grep -qE '^\[  PASSED  \]' "$log"; then
    note="no test passed (the filter matched none, or the binary died); $note"; bad=1
  fi
  local totals
  totals="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 2 | sed 's/^=* *//' | paste -sd ';' - | sed 's/;/; /g')"
  [ -n "$totals" ] && note="$note; $totals"
  echo "$note"
  return "$bad"
}

append_log() {  # append_log NAME STATUS SECONDS LOG
  local size
  size=$(stat -c %s "$4" 2>/dev/null || echo 0)
  {
    echo "=================================================================="
    echo "== $1: $2 after $3 s"
    echo "=================================================================="
    if ((size > 4 * 1024 * 1024)); then
      head -c 1048576 "$4"
      echo
      echo "[... $((size - 3 * 1048576)) bytes cut ...]"
      tail -c 2097152 "$4"
    else
      cat "$4"
    fi
    echo
  } >>"$logs"
}

# step NAME TIMEOUT_S CHECK COMMAND...: runs COMMAND under timeout, logs it,
# records PASS/FAIL/TIMEOUT/SKIPPED. CHECK is '-' or check_gtest.
step() {
  local name=$1 limit=$2 check=$3
  shift 3
  local left=$((deadline - $(date +%s) - 5))
  local log="$steplogs/$name.log"
  if ((left < 20)); then
    say "$(printf '%-8s %-28s %5s s  %s' SKIPPED "$name" 0 "the phase's ${budget} s budget is spent")"
    failed+=("$name")
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "== $name (timeout ${limit} s): $*"
  if [ "$dry" = 1 ]; then
    say "$(printf '%-8s %-28s %5s s  %s' DRY "$name" 0 "$*")"
    return 0
  fi
  local t0 rc status note=""
  t0=$(date +%s)
  echo "\$ $*" >"$log"
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0))
  if ((rc == 124 || rc == 137)); then
    status=TIMEOUT note="killed after ${limit} s"
  elif ((rc != 0)); then
    status=FAIL note="exit $rc"
  else
    status=PASS
  fi
  if [ "$check" != - ]; then
    local more
    if ! more="$($check "$log")"; then
      [ "$status" = PASS ] && status=FAIL
    fi
    note="${note:+$note; }$more"
  fi
  say "$(printf '%-8s %-28s %5s s  %s' "$status" "$name" "$secs" "$note")"
  append_log "$name" "$status" "$secs" "$log"
  if [ "$status" = PASS ]; then
    tail -n 4 "$log"
    return 0
  fi
  tail -n 30 "$log"
  failed+=("$name")
  return 1
}

finish() {  # writes the result, prints the whole summary last (the call's output tail)
  local rc=0
  echo "" >>"$summary"
  if ((${#failed[@]})); then
    echo "RESULT: FAIL ($phase, $(elapsed) s): ${failed[*]}" >>"$summary"
    rc=1
  else
    echo "RESULT: PASS ($phase, $(elapsed) s)" >>"$summary"
  fi
  echo "full logs: $logs" >>"$summary"
  echo
  echo "------------------------------------------------------------------ $summary"
  cat "$summary"
  exit $rc
}

# --- configure and build ---------------------------------------------------------
configure() {
  if [ ! -f "$gtest/CMakeLists.txt" ]; then
    say "FAIL     configure: no GoogleTest source at $gtest: run scripts/prepare_gpu.sh here and carry .gpu"
    failed+=(configure)
    return 1
  fi
  local prefix
  if ! prefix="$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>&1)"; then
    say "FAIL     configure: $py cannot import torch: $prefix"
    failed+=(configure)
    return 1
  fi
  step configure 240 - cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCONVEYOR_CUDA=ON -DCONVEYOR_OPS_ONLY=ON -DCONVEYOR_BUILD_TESTS=ON -DCONVEYOR_BUILD_BENCHMARKS=ON \
    -DCONVEYOR_BUILD_EXAMPLES=OFF -DCONVEYOR_TORCHSCRIPT=OFF \
    -DCMAKE_PREFIX_PATH="$prefix" -DCONVEYOR_GTEST_SOURCE="$gtest" \
    -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
}

case "$phase" in
  configure)
    configure
    finish
    ;;
  build-test)
    configure || finish
    step build 540 - cmake --build "$build" --parallel "$(nproc)" || finish
    ;;
  bench)
    if [ -f "$build/build.ninja" ]; then
      say "$(printf '%-8s %-28s %5s s  %s' REUSED configure 0 "$build")"
    else
      configure || finish
    fi
    step build_benchmarks 540 - cmake --build "$build" --parallel "$(nproc)" \
      --target bench_fused_lstm bench_fused_attention || finish
    ;;
esac

# --- build-test: the op tests, then the sanitizers ------------------------------
if [ "$phase" = build-test ]; then
  # Every test of both binaries, CPU and CUDA cases (a skipped CUDA case fails).
  step test_fused_lstm 240 check_gtest "$build/tests/test_fused_lstm"
  step test_fused_attention 240 check_gtest "$build/tests/test_fused_attention"
  if [ -z "$sanitizer" ]; then
    say "FAIL     compute-sanitizer: not found (PATH, next to nvcc, /usr/local/cuda)"
    failed+=(compute-sanitizer)
  else
    kernels=()
    if [ -n "$kernel_filter" ] && { [ "$dry" = 1 ] || "$sanitizer" --help 2>&1 | grep -q -- '--kernel-name'; }; then
      kernels=(--kernel-name "$kernel_filter")
    fi
    # Cheapest first, racecheck (the slowest) last. memcheck runs without
    # torch's caching allocator, so that each tensor is an allocation of its
    # own and a read past its end is seen.
    for tool in memcheck synccheck racecheck; do
      san=("$sanitizer" --tool "$tool" --error-exitcode 1 "${kernels[@]}")
      [ "$tool" = memcheck ] && san=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${san[@]}")
      step "${tool}_fused_lstm" 180 check_gtest "${san[@]}" \
        "$build/tests/test_fused_lstm" --gtest_filter="$lstm_filter"
      step "${tool}_fused_attention" 180 check_gtest "${san[@]}" \
        "$build/tests/test_fused_attention" --gtest_filter="$attention_filter"
    done
  fi
  finish
fi

# --- bench: the op benchmarks ------------------------------------------------------
# shellcheck disable=SC2086  # the extra flags are meant to split into words
# Each also writes the rows of a dispatch table for this GPU (dispatch-*.txt in
# $OUT): append them to ops/dispatch/fused_dispatch_table.txt to make the
# fused ops take the faster path here (ops/dispatch/fused_dispatch.h).
step bench_fused_lstm 240 - "$build/benchmarks/bench_fused_lstm" --grid --table-out "$out/dispatch-lstm.txt" \
  ${CONVEYOR_BENCH_LSTM_ARGS:-}
# shellcheck disable=SC2086
step bench_fused_attention 240 - "$build/benchmarks/bench_fused_attention" \
  --table-out "$out/dispatch-attention.txt" ${CONVEYOR_BENCH_ATTENTION_ARGS:-}
finish
