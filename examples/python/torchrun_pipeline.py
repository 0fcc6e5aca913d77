"""The quickstart's tagger trained across processes: one pipeline worker per
process under torchrun, and, with more processes, data-parallel replicas of
the pipeline (pipeline x data parallelism). Every process runs this same
program; rank 0 prints. Exits 1 unless the loss falls.

  torchrun --nproc-per-node=2 examples/python/torchrun_pipeline.py   # one 2-stage pipeline
  torchrun --nproc-per-node=4 examples/python/torchrun_pipeline.py   # 2 replicas of it

Gloo carries the messages (CPU tensors); on GPUs, initialize with
backend="cpu:gloo,cuda:nccl" and pass devices="cuda": each process then
drives cuda:LOCAL_RANK, and CUDA tensors travel over NCCL.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import conveyor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart import Tagger, data  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2, help="pipeline workers (processes per replica)")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)  # the same model everywhere (replica 0's weights are broadcast anyway)
    process_group, replica_group = conveyor.process_groups(args.workers)
    pipe = conveyor.Pipeline(Tagger(), split_points=["layers.2"], microbatches=8, schedule="1f1b",
                             loss_fn=lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()),
                             process_group=process_group, replica_group=replica_group)
    # Each process steps its own stage's weights; their gradients are the global batch's.
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        tokens, mask, target = data(seed=step)  # the global batch; each replica trains on its shard
        # The first step exports the model from its inputs and builds the pipeline.
        result = pipe.train_step(pipe.shard((tokens, mask)), pipe.shard(target))
        if rank == 0 and step == 0:
            print(f"{dist.get_world_size()} processes: {pipe.replicas} replica(s) of a {pipe.num_stages}-stage "
                  "pipeline")
        opt.step()
        opt.zero_grad()
        losses.append(result.loss)  # the global batch's loss, on every process
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {result.loss:.4f}  worker 0 busy {result.busy_seconds[0] * 1e3:.1f} ms")
    dist.destroy_process_group()
    if not losses[-1] < 0.6 * losses[0]:
        sys.exit(f"rank {rank}: the loss did not fall enough: {losses[0]:.4f} -> {losses[-1]:.4f}")
    if rank == 0:
        print(f"PASS: loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
