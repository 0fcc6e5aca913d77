"""One rank of a conveyor.Pipeline across processes, run by test_torchrun.py
under torchrun:
    python -m torch.distributed.run --standalone --nproc-per-node=N torchrun_worker.py OUT_DIR SCHEDULE WORKERS
Trains the model below (float64, the same on every rank) for STEPS steps of
torch.optim.SGD over pipe.parameters() (mode "exported": the model as a
torch.export program; mode "gloo": shared_memory=False), each replica on its
shard of the batch, and saves to OUT_DIR/rank<R>.pt this rank's first-step
gradients, final weights (by the model's names), losses and shared-memory links."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 3
BATCH = 16
SPLIT_POINTS = ["mid"]


class Net(nn.Module):
    """Two inputs, a residual block, and a cut inside the forward."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x, scale):
        h = torch.tanh(self.embed(x)) * scale
        h = self.block(h) + h
        return self.head(torch.relu(self.mid(h)))


def make_model() -> Net:
    torch.manual_seed(0)
    return Net().double()


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 6, generator=g, dtype=torch.float64)
    scale = torch.rand(BATCH, 1, generator=g, dtype=torch.float64) + 0.5
    y = torch.randint(0, 3, (BATCH,), generator=g)
    return (x, scale), y


def loss_fn(out, target):
    return F.cross_entropy(out, target)


def train(pipe, steps: int = STEPS):
    """SGD with momentum over pipe.parameters(); returns the first step's
    gradients by name and the losses."""
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
    grads, losses = {}, []
    for step in range(steps):
        inputs, target = batch(step)
        result = pipe.train_step(pipe.shard(inputs), pipe.shard(target))
        losses.append(result.loss)
        if step == 0:
            grads = {n: p.grad.clone() for n, p in pipe.named_parameters()}
        opt.step()
        opt.zero_grad()
    return grads, losses


def sharded(out_dir: str, schedule: str, process_group, replica_group):
    """Adam, the pipeline's own, 3 steps with its state (and its gradients,
    and its parameters) sharded across the replicas and without: each run's
    weights, and the last one's schedule."""
    import torch.distributed as dist

    import conveyor

    weights = {}
    for shard in ("none", "optimizer", "gradients", "parameters"):
        pipe = conveyor.Pipeline(make_model(), split_points=SPLIT_POINTS, microbatches=4, schedule=schedule,
                                 loss_fn=loss_fn, process_group=process_group, replica_group=replica_group,
                                 timeout=120, optimizer="adam", lr=0.01, shard=shard)
        for step in range(3):
            inputs, target = batch(step)
            pipe.train_step(pipe.shard(inputs), pipe.shard(target))
        if shard == "parameters":  # the weights are each replica's pieces until gathered
            try:
                pipe.state_dict()
            except ValueError as e:
                assert "unshard() gathers them" in str(e), e
            else:
                raise AssertionError("the sharded weights gave a state dict")
        pipe.unshard()
        weights[shard] = {n: p.detach().clone() for n, p in pipe.state_dict().items()}
        weights["schedule"] = pipe.schedule  # each stage's reduce-scatter an action of it
    try:  # the option reaches the pipeline: an asynchronous schedule cannot shard
        conveyor.Pipeline(make_model(), split_points=SPLIT_POINTS, microbatches=4, schedule="pipedream",
                          loss_fn=loss_fn, process_group=process_group, replica_group=replica_group, timeout=120,
                          optimizer="sgd", lr=0.01, shard="optimizer",
                          example_inputs=pipe.shard(inputs))  # built now, not at the first step
        weights["refusal"] = "(accepted)"
    except ValueError as e:
        weights["refusal"] = str(e)
    torch.save(weights, f"{out_dir}/rank{dist.get_rank()}.pt")


def exported_model():
    """make_model() as a torch.export program, its batch dimension dynamic."""
    rows = torch.export.Dim("batch", min=1)
    return torch.export.export(make_model(), batch(0)[0], dynamic_shapes=({0: rows}, {0: rows}))


def main(out_dir: str, schedule: str, workers: int, mode: str = "sgd"):
    import torch.distributed as dist

    import conveyor

    dist.init_process_group("gloo")
    process_group, replica_group = conveyor.process_groups(workers)
    if mode == "sharded":
        sharded(out_dir, schedule, process_group, replica_group)
        dist.barrier()
        dist.destroy_process_group()
        return
    model = exported_model() if mode == "exported" else make_model()
    link = {"shared_memory": False} if mode == "gloo" else {}  # else the default: shared memory
    pipe = conveyor.Pipeline(model, split_points=SPLIT_POINTS, microbatches=4, schedule=schedule,
                             loss_fn=loss_fn, process_group=process_group, replica_group=replica_group, timeout=120,
                             **link)
    grads, losses = train(pipe)
    out = pipe.forward(*batch(0)[0])
    torch.save({"worker": pipe.worker, "replica": pipe.replica, "replicas": pipe.replicas, "grads": grads,
                "losses": losses, "state": dict(pipe.state_dict()), "output": out,
                "shared_memory_links": pipe._c.shared_memory_links()},
               f"{out_dir}/rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
