#!/usr/bin/env bash
# The test command: set-up, build, fuzz the parsers, then every test (C++ and Python) via ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
bash "$root/scripts/build.sh"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
export PATH="$root/.venv/bin:$PATH"
# The parsers under libFuzzer + ASan/UBSan first (CONVEYOR_FUZZ_SECONDS per
# target, default 60; 0 skips), then every test.
if [ "${CONVEYOR_FUZZ_SECONDS:-60}" != 0 ]; then bash "$root/scripts/fuzz.sh"; fi
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900
echo "test.sh: done in $(( $(date +%s) - start )) s"
