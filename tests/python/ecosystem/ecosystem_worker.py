"""One process of an ecosystem model's pipeline under torchrun (see
test_ecosystem_torchrun.py): builds conveyor.Pipeline from the module as a
user would, in each process, trains two steps of SGD with momentum over the module's own
parameters (two stages: the case's last cut), and saves its losses, first-step gradients and final weights of
the parameters its stages hold to <out>/rank<r>.pt.
Usage: torchrun --nproc-per-node=2 ecosystem_worker.py <out> <model> <schedule>"""
import pathlib
import sys

import torch
import torch.distributed as dist

import conveyor

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ecosystem_models import CASES  # noqa: E402

MICROBATCHES = 4
STEPS = 2


def main():
    out, name, schedule = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(backend="gloo")
    case = CASES[name]()
    process_group, replica_group = conveyor.process_groups(2)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-4, momentum=0.9)
    pipe = conveyor.Pipeline(case.model, split_points=case.split_points[-1:], microbatches=MICROBATCHES,
                             schedule=schedule, loss_fn=case.loss_fn, process_group=process_group,
                             replica_group=replica_group, timeout=300, **case.keywords)
    losses, grads = [], {}
    for step in range(STEPS):
        losses.append(pipe.train_step(case.inputs, case.target).loss)
        if step == 0:
            grads = {n: p.grad.clone() for n, p in pipe.named_parameters()}
        opt.step()
        opt.zero_grad()
    torch.save({"losses": losses, "grads": grads, "worker": pipe.worker,
                "weights": {n: p.detach().clone() for n, p in pipe.named_parameters()},
                "state_keys": list(pipe.state_dict())}, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
