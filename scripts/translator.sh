#!/usr/bin/env bash
# The translator's full run (docs/guides/examples.md, "The translator"): builds the example,
# trains it on the CPU for a few minutes (2-stage 1F1B pipeline), and fails
# unless the training loss falls and the model's BLEU on the test split beats
# the copy-the-source baseline's. Then the torchrun hybrid: samples/s for 1
# and 2 processes, measured, and the simulator's projection for more,
# labelled as such. Logs and translations go to build/translator-run/.
#
#   bash scripts/translator.sh                  # everything (about 10 minutes on 2 cores)
#   bash scripts/translator.sh --skip-hybrid    # the training run only
#   bash scripts/translator.sh --hybrid-only    # the hybrid measurements only
#   STEPS=1200 HYBRID_STEPS=60 bash scripts/translator.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${STEPS:-1000}"
hybrid_steps="${HYBRID_STEPS:-40}"
skip_hybrid=0
skip_training=0
for arg in "$@"; do
  case "$arg" in
    --skip-hybrid) skip_hybrid=1 ;;
    --hybrid-only) skip_training=1 ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "translator.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

bash "$root/scripts/build.sh" --target translator conveyor
build="${CONVEYOR_BUILD_DIR:-$root/build}"
py="$root/.venv/bin/python"
out="$build/translator-run"
mkdir -p "$out"
translator="$build/examples/translator"
start=$(date +%s)

if [ "$skip_training" = 0 ]; then
  echo "== training: $translator --steps $steps (log: $out/train.log)"
  set +e
  "$translator" --stages 2 --schedule 1f1b --microbatches 4 --steps "$steps" --out-dir "$out" 2>&1 | tee "$out/train.log"
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    echo "translator.sh: the training run failed (exit $status): see $out/train.log" >&2
    exit "$status"
  fi
  grep -q '^PASS' "$out/train.log" || { echo "translator.sh: no PASS line in $out/train.log" >&2; exit 1; }
fi

[ "$skip_hybrid" = 1 ] && { echo "translator.sh: done in $(( $(date +%s) - start )) s"; exit 0; }

# The hybrid: the same program under torchrun. Each row trains HYBRID_STEPS
# global batches of 64 pairs (4 micro-batches per replica), without BLEU.
echo "== hybrid (torchrun), $hybrid_steps steps each"
hybrid_row() {  # name processes replicas threads
  local log="$out/hybrid-$1.log"
  "$root/.venv/bin/torchrun" --standalone --nproc-per-node="$2" --no-python "$translator" --replicas "$3" \
    --threads "$4" --steps "$hybrid_steps" --eval-every 0 --bleu off --require-drop 0.1 >"$log" 2>&1 ||
    { echo "translator.sh: hybrid run $1 failed: see $log" >&2; tail -20 "$log" >&2; exit 1; }
  grep '^samples/s:' "$log" | tail -1 | awk '{print $2}'
}
p1t1=$(hybrid_row p1-t1 1 1 1)
p1t2=$(hybrid_row p1-t2 1 1 2)
d2k1=$(hybrid_row d2-k1 2 2 1)
d1k2=$(hybrid_row d1-k2 2 1 1)

"$py" - "$build/libconveyor.so" "$p1t1" "$p1t2" "$d2k1" "$d1k2" <<'EOF' | tee "$out/hybrid.md"
import sys
import torch

torch.ops.load_library(sys.argv[1])
p1t1, p1t2, d2k1, d1k2 = (float(x) for x in sys.argv[2:6])
B, M = 64, 4  # global batch (pairs), micro-batches per replica

print("| setup | processes | samples/s (measured) |")
print("|---|---:|---:|")
print(f"| 1 process, 1 thread (D=1, K=1) | 1 | {p1t1:.1f} |")
print(f"| 1 process, 2 threads (D=1, K=1) | 1 | {p1t2:.1f} |")
print(f"| 2 replicas x 1 stage (D=2, K=1) | 2 | {d2k1:.1f} |")
print(f"| 1 replica x 2 stages (D=1, K=2), 1f1b | 2 | {d1k2:.1f} |")

# Projection: one core per process. A step of the whole model on one core
# takes t1 = B / p1t1 (forward : backward = 1 : 2); K stages of equal cost
# split it, and each replica has B / D pairs in M micro-batches, priced by
# the simulator for a 1F1B schedule. Replicas all-reduce their stage's
# gradients: the 2-replica run's time above half of t1 is taken as one
# all-reduce of the whole model; a ring all-reduce of 1/K of it among D
# replicas costs 2 (D - 1) / D of that per byte.
t1 = B / p1t1
allreduce_2 = max(0.0, B / d2k1 - t1 / 2)

def projected(d, k):
    f = t1 / (3 * d * k * M)
    text = torch.ops.conveyor.schedule("1f1b", k, M)
    makespan = torch.ops.conveyor.simulate(text, [f] * k, [2 * f] * k)[0]
    reduce = allreduce_2 * (2 * (d - 1) / d) / k if d > 1 else 0.0
    return B / (makespan + reduce)

print()
print("Projection by schedules::simulate (not measured; one core per process):")
print()
print("| D x K | processes | projected samples/s |")
print("|---|---:|---:|")
for d, k in [(2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4), (8, 1), (4, 4), (8, 2)]:
    print(f"| {d} x {k} | {d * k} | {projected(d, k):.1f} |")
EOF
echo "translator.sh: done in $(( $(date +%s) - start )) s"
