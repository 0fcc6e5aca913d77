#!/usr/bin/env bash
# The manual: builds docs/ into build/docs/html and prints the path of its
# index.html. Set-up and build as the test command makes them, the Python
# package installed into .venv, the manual's tools (docs/requirements.txt)
# and Debian's Chromium and its driver; then docs/generate.py draws the
# pictures and writes the generated pages, Sphinx builds the pages with
# warnings as errors, and docs/check_pages.py opens the built front page and
# guides in headless Chromium and finds their titles and pictures.
#   bash scripts/docs.sh               all of it, from a fresh clone
#   bash scripts/docs.sh --no-build    the build and the installed package are
#                                      current (the test command's call)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
start=$(date +%s)
case "${1:-}" in
  --no-build) ;;
  "")
    bash "$root/scripts/build.sh"
    # shellcheck source=lib/install_package.sh
    source "$root/scripts/lib/install_package.sh"
    install_conveyor_package docs.sh "$root" "$build"
    ;;
  *) echo "docs.sh: unknown argument '$1' (--no-build, or nothing)" >&2; exit 2 ;;
esac
py="$root/.venv/bin/python"
# shellcheck source=lib/debian_packages.sh
source "$root/scripts/lib/debian_packages.sh"
install_debian_packages docs.sh chromium chromium-driver
log="$build/docs.log"
mkdir -p "$build/docs"
if ! "$py" -m pip install -q -r "$root/docs/requirements.txt" >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "docs.sh: installing docs/requirements.txt failed (log: $log)" >&2
  exit 1
fi
"$py" "$root/docs/generate.py" "$build"
html="$build/docs/html"
rm -rf "$html"
# -W: a warning fails the build; -n: references that lead nowhere are warnings.
if ! "$py" -m sphinx -W --keep-going -n -q -b html "$root/docs" "$html" >"$log" 2>&1; then
  cat "$log" >&2
  echo "docs.sh: the manual has warnings or errors (above; log: $log)" >&2
  exit 1
fi
"$py" "$root/docs/check_pages.py" "$html"
echo "docs.sh: built in $(( $(date +%s) - start )) s; open $html/index.html"
