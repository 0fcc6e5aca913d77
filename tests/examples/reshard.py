"""A distributed run that moves to another layout, and its checkpoint read in Python.

Runs distributed_train under torchrun as 2 stages x 2 replicas (4 processes,
Adam, its state and the gradients sharded across the replicas: ZeRO-2) for 6 steps, each
rank checkpointing every 3 steps. A second job of 3 processes (3 stages x 1
replica) starts from the step-3 files alone (--resume auto reads every
rank's file when the job's size differs) and runs to step 6: its trained
model must equal the uninterrupted run's (float32, other reduction orders:
to 1e-5). conveyor_checkpoint then exports the plain state dict of the 4
step-6 files, which Python's torch.load (weights only) reads into the unsplit
model by its own names: it must equal the model the run gathered, and give
its loss.

    python tests/examples/reshard.py --binary build/examples/distributed_train \\
        --tool build/examples/conveyor_checkpoint
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import torch

FLAGS = ["--parallel=pipeline", "--schedule=1f1b", "--optimizer=adam", "--lr=0.001", "--steps=6", "--log-every=1000",
         "--save-every=3", "--resume=auto", "--timeout-ms=20000", "--hidden=64", "--layers=4", "--inputs=32"]


def run(binary: str, processes: int, flags: list) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "--no-python", binary, *FLAGS, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
    assert job.returncode == 0, f"the job failed ({job.returncode}):\n{job.stdout}"
    return job.stdout


def unsplit_mlp() -> torch.nn.Sequential:
    """distributed_train's --model=mlp at --inputs=32 --hidden=64 --layers=4 (10 classes)."""
    layers, width = [], 32
    for _ in range(4):
        layers += [torch.nn.Linear(width, 64), torch.nn.ReLU()]
        width = 64
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--tool", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-reshard-") as tmp:
        whole, moved = os.path.join(tmp, "whole"), os.path.join(tmp, "moved")
        uninterrupted, resumed = os.path.join(tmp, "uninterrupted.pt"), os.path.join(tmp, "resumed.pt")
        run(args.binary, 4, ["--workers=2", "--replicas=2", "--shard=gradients", f"--run-dir={whole}",
                             f"--state-dict={uninterrupted}"])
        os.makedirs(moved)
        for path in glob.glob(os.path.join(whole, "step3-rank*-of4.ckpt")):
            shutil.copy(path, moved)
        output = run(args.binary, 3, ["--workers=3", "--replicas=1", f"--run-dir={moved}", f"--state-dict={resumed}"])
        assert "resumed from step 3" in output and "written by 4 ranks" in output, output

        want = torch.load(uninterrupted)
        got = torch.load(resumed)
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for name, tensor in want.items():
            assert torch.allclose(got[name], tensor, rtol=1e-4, atol=1e-5), \
                f"{name}: resumed at 3 x 1 differs by {(got[name] - tensor).abs().max().item()}"

        plain = os.path.join(tmp, "plain.pt")
        files = sorted(glob.glob(os.path.join(whole, "step6-rank*-of4.ckpt")))
        assert len(files) == 4, files
        subprocess.run([args.tool, "export", plain, *files], check=True)
        exported = torch.load(plain)  # weights only: a plain dict of tensors
        for name, tensor in want.items():
            assert torch.equal(exported[name], tensor), f"{name}: the exported state dict differs"
        model, reference = unsplit_mlp(), unsplit_mlp()
        model.load_state_dict(exported)  # strict: the model's own names, every one
        reference.load_state_dict(want)
        torch.manual_seed(0)
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        assert loss.item() == torch.nn.functional.cross_entropy(reference(x), y).item()
        print("resumed at 3 stages x 1 replica from 4 files as uninterrupted; "
              f"exported state dict loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
