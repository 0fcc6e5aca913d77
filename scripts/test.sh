#!/usr/bin/env bash
# The test command: set-up, build, fuzz the parsers, every test (C++ and Python) via ctest, then
# the C++ tests again under sanitizers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
bash "$root/scripts/build.sh"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
export PATH="$root/.venv/bin:$PATH"
# The parsers under libFuzzer + ASan/UBSan first (CONVEYOR_FUZZ_SECONDS per
# target, default 60; 0 skips; seed CONVEYOR_FUZZ_SEED, default 1, so that
# every run of this command fuzzes the same inputs), then every test.
if [ "${CONVEYOR_FUZZ_SECONDS:-60}" != 0 ]; then
  CONVEYOR_FUZZ_SEED="${CONVEYOR_FUZZ_SEED:-1}" bash "$root/scripts/fuzz.sh"
fi
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900
# The C++ tests under ASan + UBSan and the in-process runtime's under TSan,
# in build-asan/ and build-tsan/ (CONVEYOR_SANITIZE=0 skips).
if [ "${CONVEYOR_SANITIZE:-1}" != 0 ]; then bash "$root/scripts/sanitize.sh"; fi
echo "test.sh: done in $(( $(date +%s) - start )) s"
