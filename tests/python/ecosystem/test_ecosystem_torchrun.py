"""The ecosystem models (ResNet-18, GPT-2, Llama, BERT) across two processes
under torchrun, each process building conveyor.Pipeline from the module
itself (exported there): the losses, gradients and optimizer steps equal
eager PyTorch's, GPT-2's embedding tied across the two processes."""
import copy
import os
import pathlib
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import ecosystem_worker as worker  # noqa: E402
from ecosystem_models import CASES, missing  # noqa: E402

TOLERANCE = 1e-10


def close(got, want):
    """Equal to float64 rounding, relative to the tensor's scale (random-init
    ResNet gradients reach 1e3)."""
    return (got - want).abs().max().item() <= TOLERANCE * max(1.0, want.abs().max().item())


def eager_run(name):
    """The eager model, one thread as each process has: a random ResNet's
    second step moves its weights by 1e-8 between one thread and two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _eager_run(name)
    finally:
        torch.set_num_threads(threads)


def _eager_run(name):
    case = CASES[name]()
    model = copy.deepcopy(case.model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    losses, grads = [], {}
    for step in range(worker.STEPS):
        losses.append(case.eager_step(model, worker.MICROBATCHES))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads, dict(model.named_parameters()), list(model.state_dict())


@pytest.mark.parametrize("name,schedule", [("gpt2", "1f1b"), ("resnet18", "zb-h1"), ("llama", "zb-h1"),
                                           ("bert", "1f1b")])
def test_two_processes_train_as_eager_pytorch(tmp_path, name, schedule):
    why = missing(name)
    if why:
        pytest.skip(why)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               worker.__file__, str(tmp_path), name, schedule]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    losses, grads, weights, keys = eager_run(name)
    seen = set()
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        assert saved["worker"] == rank
        assert saved["grads"], f"rank {rank} holds no parameters"
        for n, g in saved["grads"].items():
            assert close(g, grads[n]), f"rank {rank} {n}"
            assert close(saved["weights"][n], weights[n]), \
                f"rank {rank} {n}: {(saved['weights'][n] - weights[n]).abs().max().item()}"
        assert close(torch.tensor(saved["losses"]), torch.tensor(losses))
        assert set(saved["state_keys"]) <= set(keys)
        seen |= set(saved["grads"])
    assert seen == set(grads)  # every parameter is some process's (a tied one in each that reads it)
