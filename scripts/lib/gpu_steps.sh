# Sourced by scripts/gpu.sh: its steps, each under `timeout` within the run's
# budget, logged, and summed up one line each in the summary file.
# Globals set here: start deadline budget dry summary logs steplogs failed no_gpu.

gpu_steps_begin() {  # gpu_steps_begin BUDGET_S DRY
  start=$(date +%s)
  budget=$1
  deadline=$((start + budget))
  dry=$2
  [ "$dry" = 0 ] || dry=1
  failed=()
  no_gpu=""
}

gpu_steps_files() {  # gpu_steps_files OUT_DIR STEP_LOG_DIR
  mkdir -p "$1" "$2"
  summary="$1/1-summary.txt"
  logs="$1/2-logs.txt"
  steplogs="$2"
  : >"$summary"
  : >"$logs"
}

say() { echo "$*" | tee -a "$summary"; }

tool_line() {  # tool_line LABEL COMMAND...: one line of the summary's header
  local text
  text="$(timeout 60 "${@:2}" 2>&1 | grep -v '^\s*$' | tr '\n' ' ' | cut -c1-300)" || true
  say "$(printf '%-18s %s' "$1:" "${text:-(not available)}")"
}

gpu_find_sanitizer() {  # prints compute-sanitizer's path, or nothing
  local c nvcc_dir
  if command -v compute-sanitizer 2>/dev/null; then return; fi
  nvcc_dir="$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
  for c in "$nvcc_dir/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -x "$c" ] && echo "$c" && return
  done
}

line() {  # line STATUS NAME SECONDS NOTE
  say "$(printf '%-8s %-22s %5s s  %s' "$1" "$2" "$3" "$4")"
}

gpu_fail() {  # gpu_fail NAME WHY: a step that could not even start
  line FAIL "$1" 0 "$2"
  failed+=("$1")
}

# Reads a gtest log: fails a run where no test ran or a CUDA test skipped
# (torch saw no device); a sanitizer that refuses the device is a SKIP.
# Prints a note; returns 0 (counts), 1 (fails) or 2 (skipped).
# shellcheck disable=SC2329  # called through step's CHECK argument
check_gtest() {
  local log=$1 note totals
  note="$(grep -E '^\[==========\] [0-9]+ tests? from .* ran' "$log" | tail -n 1 | sed 's/^\[==========\] //')"
  if grep -q 'Device not supported' "$log"; then
    echo "compute-sanitizer refuses this device (as on gVisor machines): not checked"
    return 2
  fi
  totals="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 2 | sed 's/^=* *//' | paste -sd ';' - | sed 's/;/; /g')"
  [ -n "$totals" ] && note="$note; $totals"
  if grep -qE '^\[  SKIPPED \] .*Cuda' "$log"; then
    echo "CUDA tests SKIPPED: torch saw no device; $note"
    return 1
  elif grep -qE '^\[  PASSED  \] 0 tests' "$log" || ! grep -qE '^\[  PASSED  \]' "$log"; then
    echo "no test passed (the filter matched none, or the binary died); $note"
    return 1
  fi
  echo "$note"
}

# racecheck on a program of its own: its summary, a refused device a SKIP.
# shellcheck disable=SC2329
check_racecheck() {
  local log=$1 totals
  if grep -q 'Device not supported' "$log"; then
    echo "compute-sanitizer refuses this device: not checked"
    return 2
  fi
  totals="$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|failed to handle' "$log" | sed 's/^=* *//' | paste -sd ';' -)"
  if grep -q '^PASS' "$log" && ! grep -q 'failed to handle' "$log"; then
    echo "${totals:-no summary}"
  else
    echo "${totals:-$(tail -n 1 "$log" | cut -c1-200)}"
    return 1
  fi
}

# A script that ends with a PASS line.
# shellcheck disable=SC2329
check_pass() {
  local log=$1
  if tail -n 1 "$log" | grep -q '^PASS'; then
    echo "$(grep -c '^  ok' "$log") checks passed"
  else
    echo "$(tail -n 1 "$log" | cut -c1-200)"
    return 1
  fi
}

# gpu_tee FILE COMMAND...: COMMAND's output into FILE as it comes (row by row).
gpu_tee() {
  local file=$1
  shift
  "$@" 2>&1 | tee "$file"
  return "${PIPESTATUS[0]}"
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

# step NAME TIMEOUT_S CHECK COMMAND...: runs COMMAND under timeout (at most
# what the budget has left), logs it, records PASS/FAIL/TIMEOUT/SKIP.
# CHECK is '-' or a function of the log (check_gtest, check_pass).
step() {
  local name=$1 limit=$2 check=$3
  shift 3
  local left=$((deadline - $(date +%s) - 5))
  local log="$steplogs/$name.log"
  if ((left < 20)); then
    line SKIPPED "$name" 0 "the run's ${budget} s budget is spent"
    failed+=("$name")
    return 1
  fi
  ((limit > left)) && limit=$left
  echo "== $name (timeout ${limit} s): $*"
  if [ "$dry" = 1 ]; then
    line DRY "$name" 0 "$*"
    return 0
  fi
  local t0 rc status note="" secs
  t0=$(date +%s)
  echo "\$ $*" >"$log"
  # A function (gpu_tee) runs in a subshell of its own under timeout.
  if declare -F "$1" >/dev/null; then
    timeout -k 10 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@" >>"$log" 2>&1
  else
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  fi
  rc=$?
  secs=$(($(date +%s) - t0))
  if ((rc == 124 || rc == 137)); then
    status=TIMEOUT note="killed after ${limit} s"
  elif ((rc != 0)); then
    status=FAIL note="exit $rc"
  else
    status=PASS
  fi
  if [ "$check" != - ]; then
    local more verdict
    more="$($check "$log")"
    verdict=$?
    if ((verdict == 2)); then
      status=SKIP
    elif ((verdict != 0)) && [ "$status" = PASS ]; then
      status=FAIL
    fi
    note="${note:+$note; }$more"
  fi
  line "$status" "$name" "$secs" "$note"
  append_log "$name" "$status" "$secs" "$log"
  case "$status" in
    PASS | SKIP)
      tail -n 4 "$log"
      return 0
      ;;
  esac
  tail -n 30 "$log"
  failed+=("$name")
  return 1
}

# gpu_step: a step that needs the GPU; SKIPPED, with the reason, without one.
gpu_step() {
  if [ -n "$no_gpu" ]; then
    line SKIPPED "$1" 0 "$no_gpu"
    return 0
  fi
  step "$@"
}

gpu_finish() {  # the result; the whole summary printed last (the call's output tail)
  local rc=0
  echo "" >>"$summary"
  if ((${#failed[@]})); then
    echo "RESULT: FAIL ($(($(date +%s) - start)) s): ${failed[*]}" >>"$summary"
    rc=1
  elif [ -n "$no_gpu" ]; then
    echo "RESULT: BUILT, GPU steps SKIPPED ($no_gpu) ($(($(date +%s) - start)) s)" >>"$summary"
  else
    echo "RESULT: PASS ($(($(date +%s) - start)) s)" >>"$summary"
  fi
  echo "full logs: $logs" >>"$summary"
  echo
  echo "------------------------------------------------------------------ $summary"
  cat "$summary"
  exit $rc
}
