#!/usr/bin/env bash
# The ResNet study at small scale: set-up, build the example, then train a
# ResNet-20 split into 2, 4 and 11 stages of whole blocks under naive
# sequential model parallelism, DDG, features replay and PipeDream on
# scikit-learn's digits (CPU), and print the accuracy, divergence and timing
# tables. The default run takes about ten minutes on two cores. Arguments go
# to the program:
#   bash scripts/seed_study.sh --help
#   bash scripts/seed_study.sh --stages 2,3,4,6,11 --lrs 0.01,0.04,0.16 --epochs 10
#   bash scripts/seed_study.sh --methods sequential,gpipe,1f1b --stages 2,4
#   bash scripts/seed_study.sh --cifar ~/data/cifar-10-batches-bin --train-limit 5000
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CONVEYOR_BUILD_DIR:-$root/build}"
log="$build/seed-study-build.log"
mkdir -p "$build"
echo "seed_study: setting up and building resnet_study (the first build takes several minutes; log: $log)" >&2
if ! { bash "$root/scripts/build.sh" --target conveyor && cmake "$build" -DCONVEYOR_BUILD_STUDIES=ON &&
       cmake --build "$build" --target resnet_study; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "seed_study: the set-up or build failed; the whole log is $log" >&2
  exit 1
fi

# The digits ship inside scikit-learn; the program reads the file itself
# (gzip, no Python), here we only say where it is unless the caller did.
data_args=()
case " $* " in
  *" --digits"* | *" --cifar"* | *" --help "* | *" -h "*) ;;
  *)
    py="$root/.venv/bin/python"
    if ! digits="$("$py" -c 'import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz"))' 2>/dev/null)"; then
      echo "seed_study: scikit-learn is not installed in $root/.venv (it ships the digits data):" >&2
      echo "  $py -m pip install scikit-learn   (or pass --digits PATH or --cifar DIR)" >&2
      exit 2
    fi
    data_args=(--digits "$digits")
    ;;
esac
exec "$build/examples/resnet_study" ${data_args[@]+"${data_args[@]}"} "$@"
