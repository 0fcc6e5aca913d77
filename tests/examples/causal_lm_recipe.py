"""The Hugging Face recipe (examples/python/finetune_causal_lm.py), run as
its guide says: in one process on 4 CPU workers, 10 steps saved to a
checkpoint and resumed to step 20; and under torchrun as 4 processes, one
stage each, the same. Both must end at the held-out loss of 20 uninterrupted
steps in one process (the printed 6 decimals): the checkpoint with the
optimizer's state resumes the run exactly, in one process or across four.
On the CPU (CUDA hidden), where both are deterministic.

    python tests/examples/causal_lm_recipe.py
"""
import os
import re
import subprocess
import sys
import tempfile

RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python",
                      "finetune_causal_lm.py")


def run(flags, processes=0):
    """The recipe's PASS value and its whole output."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] \
        if processes else [sys.executable]
    job = subprocess.run([*launcher, RECIPE, *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""), timeout=300)
    assert job.returncode == 0, f"the recipe failed ({job.returncode}):\n{job.stdout}"
    passed = re.findall(r"PASS: held-out loss (\S+)", job.stdout)
    assert len(passed) == 1, f"expected one PASS line:\n{job.stdout}"
    return passed[0], job.stdout


def main():
    whole, _ = run(["--steps", "20"])
    for processes in (0, 4):
        with tempfile.TemporaryDirectory() as folder:
            run(["--steps", "10", "--checkpoint", folder], processes)
            files = sorted(os.listdir(folder))
            expected = 2 * max(processes, 1)  # a pipeline and an optimizer file per process
            assert len(files) == expected, f"{expected} files expected: {files}"
            resumed, out = run(["--steps", "20", "--checkpoint", folder], processes)
            assert "resumed at step 10" in out, f"the second run did not resume:\n{out}"
        where = f"{processes} processes" if processes else "one process"
        assert resumed == whole, f"{where}: resumed at step 10, the held-out loss is {resumed}, not {whole}"
        print(f"{where}: resumed at step 10, held-out loss {resumed} as uninterrupted")
    print("PASS: the recipe resumes exactly")


if __name__ == "__main__":
    main()
