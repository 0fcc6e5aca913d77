"""The TorchScript recipe (examples/torchscript/), run as its guide says: the
model saved from Python, then trained from C++ in one process and as 2
processes under torchrun. Both must pass and end at the same held-out loss
(the printed 6 decimals).

    python tests/examples/torchscript_recipe.py --binary build/examples/train_script
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

SAVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torchscript",
                    "save_model.py")


def run(command) -> str:
    job = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert job.returncode == 0, f"{command[0]} failed ({job.returncode}):\n{job.stdout}"
    return job.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = os.path.join(folder, "regressor.pt")
        run([sys.executable, SAVE, model])
        losses = {}
        for processes in (1, 2):
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={processes}", "--no-python"] if processes > 1 else []
            out = run([*launcher, args.binary, model])
            passed = re.findall(r"PASS: held-out loss (\S+)", out)
            assert len(passed) == 1, f"expected one PASS line:\n{out}"
            losses[processes] = passed[0]
    assert losses[1] == losses[2], f"one process ends at {losses[1]}, two at {losses[2]}"
    print(f"PASS: the TorchScript recipe trains to {losses[1]} in one process and across two")


if __name__ == "__main__":
    main()
