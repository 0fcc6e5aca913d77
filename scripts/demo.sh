#!/usr/bin/env bash
# The demo: set-up, build the example, then train a word-level LSTM language
# model as a 2-stage 1F1B pipeline on the text of Debian's 'fortunes' package
# (CPU; --device cuda puts the stages on GPUs). It exits non-zero unless the
# model beats a unigram baseline. Arguments go to the program:
#   bash scripts/demo.sh --help
#   bash scripts/demo.sh --schedule gpipe --microbatches 8 --steps 200
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
log="$build/demo-build.log"
mkdir -p "$build"
echo "demo: setting up and building lm_pipeline (the first build takes several minutes; log: $log)" >&2
if ! bash "$root/scripts/build.sh" --target lm_pipeline >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "demo: the set-up or build failed; the whole log is $log" >&2
  exit 1
fi
exec "$build/examples/lm_pipeline" "$@"
