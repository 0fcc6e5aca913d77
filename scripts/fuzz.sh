#!/usr/bin/env bash
# Fuzzes Conveyor's parsers with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer: installs Debian's clang (idempotently), builds
# tests/fuzz into build-fuzz/, replays the committed corpus (every file of
# tests/fuzz/corpus/<target>/ must pass), then fuzzes each target for a
# bounded time. Exits non-zero on a crash, a hang (an input over 10 s), a leak
# or a sanitizer report, naming the input it saved.
#   bash scripts/fuzz.sh                 every target (schedule, c10d_header, checkpoint),
#                                        CONVEYOR_FUZZ_SECONDS each (default 60)
#   bash scripts/fuzz.sh schedule 600    one target, ten minutes
# CONVEYOR_FUZZ_SEED=N (the test command sets 1) makes a run repeatable: the
# same seed from the committed corpus alone (a fresh working corpus) mutates the
# same inputs in the same order, and each target then runs a fixed number of
# inputs (CONVEYOR_FUZZ_RUNS, or the target's own below: about a minute's worth
# on a 2-core machine), not a time's worth, so that a faster or slower machine
# fuzzes as far; the time, four times CONVEYOR_FUZZ_SECONDS, then only bounds
# the run. (Runs from one seed are alike, not identical: the corpora they keep
# differ by a few inputs from run to run, and the inputs mutated after them.)
# Unset, each run draws its own seed (printed in the log) and keeps the corpus
# it grew in build-fuzz/corpus-<target>/ for the next.
# A crash becomes a regression test: add its input to tests/fuzz/corpus/<target>/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
targets=(schedule c10d_header checkpoint)
if [ $# -ge 1 ]; then targets=("$1"); fi
seconds="${2:-${CONVEYOR_FUZZ_SECONDS:-60}}"
seed="${CONVEYOR_FUZZ_SEED:-}"
build="${CONVEYOR_FUZZ_BUILD_DIR:-$root/build-fuzz}"
declare -A seeded_runs=([schedule]=1000000 [c10d_header]=6000000 [checkpoint]=12000)

# shellcheck source=lib/debian_packages.sh
source "$root/scripts/lib/debian_packages.sh"
install_debian_packages fuzz clang libclang-rt-14-dev
export PATH="$root/.venv/bin:$PATH"
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  generator=(); command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  torch_root="$("$root/.venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
  CXX=clang++ cmake -S "$root/tests/fuzz" -B "$build" "${generator[@]}" -DTORCH_ROOT="$torch_root" >/dev/null
fi
cmake --build "$build" --parallel "$(nproc)" >/dev/null

# Sanitizers: leaks count as failures, but those of tests/fuzz/lsan.supp
# (LibTorch's own, each with its reason); UBSan reports abort (as a crash).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
# fuzz_one TARGET: replays the committed corpus, then fuzzes; prints what it
# did (and, on a failure, the log's tail) and returns non-zero on a failure.
fuzz_one() {
  local t="$1" bin="$build/fuzz_$1" corpus="$root/tests/fuzz/corpus/$1" work="$build/corpus-$1"
  local artifacts="$build/artifacts-$1/" rss=2048 seeding=() runs drawn
  if [ -n "$seed" ]; then rm -rf "$work"; seeding=(-seed="$seed"); fi
  mkdir -p "$work" "$artifacts"
  echo "fuzz: $t: replaying $(find "$corpus" -type f | wc -l) committed inputs"
  if ! "$bin" -runs=0 -rss_limit_mb=$rss "$corpus" >"$build/replay-$t.log" 2>&1 ||
    ! "$bin" -rss_limit_mb=$rss $(find "$corpus" -type f) >>"$build/replay-$t.log" 2>&1; then
    tail -n 40 "$build/replay-$t.log"
    echo "fuzz: $t: a committed input fails (log: $build/replay-$t.log)"
    return 1
  fi
  local bound=(-max_total_time="$seconds") what="for ${seconds} s"
  if [ -n "$seed" ]; then
    bound=(-runs="${CONVEYOR_FUZZ_RUNS:-${seeded_runs[$t]}}" -max_total_time=$((seconds * 4)))
    what="${CONVEYOR_FUZZ_RUNS:-${seeded_runs[$t]}} inputs, seed $seed"
  fi
  echo "fuzz: $t: fuzzing $what"
  if "$bin" "$work" "$corpus" "${seeding[@]}" "${bound[@]}" -timeout=10 -rss_limit_mb=$rss \
      -artifact_prefix="$artifacts" -print_final_stats=1 >"$build/fuzz-$t.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$t.log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $t: PASS, $runs inputs run, corpus $(find "$work" -type f | wc -l) files"
  else
    tail -n 40 "$build/fuzz-$t.log"
    drawn=$(grep -o 'Seed: [0-9]*' "$build/fuzz-$t.log" | head -n 1 | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $t: FAILED (seed $drawn); the input is in $artifacts (log: $build/fuzz-$t.log)"
    return 1
  fi
}

for t in "${targets[@]}"; do
  [ -x "$build/fuzz_$t" ] || { echo "fuzz: no target '$t' (have: ${targets[*]})" >&2; exit 2; }
done
# The targets run side by side, one per core (each fuzzer is one process);
# their reports are printed in order once all are done. A target's inputs do
# not depend on what runs beside it: each has its own seed and corpus.
jobs="$(nproc)"
running=0
for t in "${targets[@]}"; do
  (
    rc=0
    fuzz_one "$t" >"$build/summary-$t.log" 2>&1 || rc=$?
    echo "$rc" >"$build/summary-$t.rc"
  ) &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
status=0
for t in "${targets[@]}"; do
  if [ "$(cat "$build/summary-$t.rc")" = 0 ]; then cat "$build/summary-$t.log"; else cat "$build/summary-$t.log" >&2; status=1; fi
done
exit $status
