#!/usr/bin/env bash
# The BERT half of the seed study at small scale: set-up, build the example,
# then train the small BERT of bert_pipeline on the masked-LM task split into
# 2, 3 and 4 stages under naive sequential model parallelism, DDG, features
# replay and PipeDream over three learning rates, on the fortunes (CPU), and
# print the loss/accuracy, divergence and timing tables. The default run takes
# about a quarter of an hour on two cores. Arguments go to the program:
#   bash scripts/bert_study.sh --help
#   bash scripts/bert_study.sh --lrs 0.0005,0.002,0.008 --epochs 3
#   bash scripts/bert_study.sh --methods sequential,gpipe,1f1b --stages 2,4
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
log="$build/bert-study-build.log"
mkdir -p "$build"
echo "bert_study: setting up and building bert_study (the first build takes several minutes; log: $log)" >&2
if ! bash "$root/scripts/build.sh" --target bert_study >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "bert_study: the set-up or build failed (is libsentencepiece-dev installed?); the whole log is $log" >&2
  exit 1
fi
exec "$build/examples/bert_study" "$@"
