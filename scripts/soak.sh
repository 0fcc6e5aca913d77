#!/usr/bin/env bash
# The soak: 1,000 in-process training steps of each of a synchronous (1f1b)
# and an asynchronous (pipedream) schedule, with a stage exception or a NaN
# loss injected in about one step in four. Each failed step is rolled back
# and skipped; the program checks that only those steps failed, that the final
# weights equal a run that never took them, that resident memory after
# warm-up stays within a bound and that no thread is left behind, prints the
# figures and exits 1 if a check fails (benchmarks/soak.cpp). Takes under a
# minute on two cores, after the build. Arguments go to the program:
#   bash scripts/soak.sh --steps 5000 --fault-every 3 --seed 7
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
log="$build/soak-build.log"
mkdir -p "$build"
echo "soak: setting up and building the soak program (the first build takes several minutes; log: $log)" >&2
if ! bash "$root/scripts/build.sh" --target soak >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "soak: the set-up or build failed; the whole log is $log" >&2
  exit 1
fi
status=0
for schedule in 1f1b pipedream; do
  "$build/benchmarks/soak" --steps 1000 --warmup 100 --schedule "$schedule" "$@" || status=1
done
exit "$status"
