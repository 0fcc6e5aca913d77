#!/usr/bin/env bash
# The test command: set-up, build, then every test (C++ and Python) via ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
bash "$root/scripts/build.sh"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
export PATH="$root/.venv/bin:$PATH"
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900
echo "test.sh: done in $(( $(date +%s) - start )) s"
