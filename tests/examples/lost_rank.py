"""A distributed run that loses a rank and finishes as if it had not.

Runs distributed_train twice under torchrun with two processes, checkpointing
every few steps and --resume auto: once undisturbed, once with rank 1 killed
(SIGKILL) after a checkpoint mid-run, so that torchrun (--max-restarts=1)
restarts the job and it resumes from the newest checkpoint both ranks hold.
Both runs must end with the same weights, bit for bit.

    python tests/examples/lost_rank.py --binary build/examples/distributed_train
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import torch

STEPS, EVERY = 120, 10


def run(binary: str, run_dir: str, state_dict: str, kill_after_step: int = 0) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=1", "--monitor-interval=0.2", "--no-python", binary, "--parallel=pipeline",
               "--schedule=1f1b", "--optimizer=adam", "--lr=0.001", f"--steps={STEPS}", "--log-every=1000",
               f"--save-every={EVERY}", f"--run-dir={run_dir}", "--resume=auto", f"--state-dict={state_dict}",
               "--timeout-ms=10000"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if kill_after_step:
        marker = os.path.join(run_dir, f"step{kill_after_step}-rank1-of2.ckpt")
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            assert job.poll() is None, "the job ended before the checkpoint of step %d" % kill_after_step
            assert time.monotonic() < deadline, "no checkpoint of step %d in 120 s" % kill_after_step
            time.sleep(0.01)
        victim = rank_process(binary, run_dir, rank=1)
        os.kill(victim, signal.SIGKILL)
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 0, f"the job failed ({job.returncode}):\n{output}"
    return output


def rank_process(binary: str, run_dir: str, rank: int) -> int:
    """The pid of the process of `rank` of the job writing to `run_dir`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if (args and os.path.basename(args[0].decode()) == os.path.basename(binary)
                and f"--run-dir={run_dir}".encode() in args and f"RANK={rank}".encode() in env):
            return int(pid)
    raise AssertionError(f"no process of rank {rank} writing to {run_dir}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-lost-rank-") as scratch:
        undisturbed, resumed = os.path.join(scratch, "undisturbed.pt"), os.path.join(scratch, "resumed.pt")
        first = run(args.binary, os.path.join(scratch, "a"), undisturbed)
        assert "resumed from" not in first, first
        second = run(args.binary, os.path.join(scratch, "b"), resumed, kill_after_step=4 * EVERY)
        # torchrun restarted the job, which went on from the newest checkpoint
        # both ranks had: rank 1's of step 40, or rank 0's before it where the
        # kill came before rank 0 had written its own of step 40.
        match = re.search(r"resumed from step (\d+)", second)
        assert match, "the restarted job did not resume:\n" + second
        step = int(match.group(1))
        assert 3 * EVERY <= step < STEPS, f"resumed from step {step}"
        want, got = torch.load(undisturbed), torch.load(resumed)
        assert want.keys() == got.keys(), (sorted(want), sorted(got))
        for name, tensor in want.items():
            assert torch.equal(tensor, got[name]), f"{name} differs by {(tensor - got[name]).abs().max().item()}"
        print(f"lost rank: rank 1 killed after the checkpoint of step {4 * EVERY}, the job resumed from step "
              f"{step} and ended with the undisturbed run's {len(want)} tensors, bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
