#!/usr/bin/env bash
# The test command: set-up, build, the Python package installed into .venv
# (pip install . reusing the build), fuzzing of the parsers, the manual's
# build and checks (scripts/docs.sh), every test (C++ and Python) via ctest,
# then the C++ tests again under sanitizers.
#   bash scripts/test.sh            the full run, as CI makes it
#   bash scripts/test.sh --quick    for contributors: set-up, an incremental
#                                   build and install, and every test not
#                                   labelled "slow", the manual's build included
#                                   (no fuzzing, no sanitizers);
#                                   a few minutes after the first build
#   bash scripts/test.sh --busy     either run with every core kept busy by a
#                                   load generator (Debian's stress-ng, one
#                                   CPU hog a core, stopped when the run ends):
#                                   the tests assert nothing a loaded machine
#                                   breaks, and this shows it
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quick=0
busy=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --busy) busy=1 ;;
    *) echo "test.sh: unknown argument '$arg' (--quick, --busy, or nothing for the full run)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
if [ "$busy" = 1 ]; then
  # shellcheck source=lib/debian_packages.sh
  source "$root/scripts/lib/debian_packages.sh"
  install_debian_packages test.sh stress-ng
  # Its own time limit too, so that the load ends even if this script is killed.
  stress-ng --cpu "$(nproc)" --cpu-load 100 --timeout 3h --quiet &
  load=$!
  stop_load() { kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true; }
  trap stop_load EXIT
  trap 'exit 130' INT TERM
  echo "test.sh: every core kept busy: stress-ng --cpu $(nproc) (pid $load)"
fi
bash "$root/scripts/build.sh"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
export PATH="$root/.venv/bin:$PATH"
# shellcheck source=lib/install_package.sh
source "$root/scripts/lib/install_package.sh"
install_conveyor_package test.sh "$root" "$build"
if [ "$quick" = 1 ]; then
  bash "$root/scripts/docs.sh" --no-build
  ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900 --label-exclude slow
  echo "test.sh --quick: done in $(( $(date +%s) - start )) s"
  exit 0
fi
# The parsers under libFuzzer + ASan/UBSan first (seed CONVEYOR_FUZZ_SEED,
# default 1, and a fixed number of inputs per target, so that every run of
# this command fuzzes as far on any machine; CONVEYOR_FUZZ_SECONDS=0 skips
# it), then every test.
if [ "${CONVEYOR_FUZZ_SECONDS:-60}" != 0 ]; then
  CONVEYOR_FUZZ_SEED="${CONVEYOR_FUZZ_SEED:-1}" bash "$root/scripts/fuzz.sh"
fi
# The manual (scripts/docs.sh): built with warnings as errors, its pictures
# drawn by the library, its pages checked in a headless browser; its code
# blocks run, compile and are checked as ctest tests (tests/docs).
bash "$root/scripts/docs.sh" --no-build
ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" --timeout 900
# The C++ tests under ASan + UBSan and the in-process runtime's under TSan,
# in build-asan/ and build-tsan/ (CONVEYOR_SANITIZE=0 skips).
if [ "${CONVEYOR_SANITIZE:-1}" != 0 ]; then bash "$root/scripts/sanitize.sh"; fi
echo "test.sh: done in $(( $(date +%s) - start )) s"
