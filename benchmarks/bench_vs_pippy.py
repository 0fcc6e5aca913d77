#!/usr/bin/env python3
"""Conveyor's pipelines against torch.distributed.pipelining on this machine.

The same model, data, loss and optimizer as examples/distributed_train: an
MLP of 6 hidden layers of 512 (ReLU, He initialisation) plus a linear layer
to 10 classes, 13 layers cut 7 | 6 into K = 2 stages, batch 256 of synthetic
data labelled by a fixed linear teacher (seeded per step), mean cross-entropy,
SGD with learning rate 0.05 stepped after every batch. Three contestants,
one intra-op thread per stage, CPU:

  pippy     torch.distributed.pipelining (ScheduleGPipe / Schedule1F1B), one
            process per stage, Gloo (spawned here);
  c10d      Conveyor, one process per stage over c10d/Gloo
            (torchrun ... distributed_train --parallel=pipeline);
  threads   Conveyor in one process, a thread per stage
            (distributed_train --parallel=threads).

Each runs --steps steps; samples/s counts the steps after the first (as
distributed_train does). The contestants take turns, --rounds times; the
table gives the median samples/s of each and the ratios to pippy, and checks
that the losses of the first and last step agree across all three.

  python benchmarks/bench_vs_pippy.py --binary build/examples/distributed_train
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spawn_ranks import run_ranks  # noqa: E402

SEED, INPUTS, HIDDEN, LAYERS, CLASSES, LR = 1, 256, 512, 6, 10, 0.05
CUT = 7  # uniform boundaries of 13 layers into 2 stages: [0, 7) | [7, 13)


def make_model():
    """distributed_train's make_model, draw for draw."""
    torch.manual_seed(SEED)
    layers, width = [], INPUTS

    def linear(i, o):
        layer = nn.Linear(i, o)
        nn.init.kaiming_normal_(layer.weight, a=0.0, mode="fan_in", nonlinearity="relu")
        nn.init.zeros_(layer.bias)
        return layer

    for _ in range(LAYERS):
        layers += [linear(width, HIDDEN), nn.ReLU()]
        width = HIDDEN
    layers.append(linear(width, CLASSES))
    return nn.Sequential(*layers)


def global_batch(step, batch):
    torch.manual_seed(SEED + 7919)
    teacher = torch.randn(INPUTS, CLASSES)
    torch.manual_seed(SEED + step)
    x = torch.randn(batch, INPUTS)
    return x, (x @ teacher).argmax(1)


def pippy_rank(rank, port, args, schedule, microbatches, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed import pipelining

    model = make_model()
    part = nn.Sequential(*list(model)[:CUT]) if rank == 0 else nn.Sequential(*list(model)[CUT:])
    stage = pipelining.PipelineStage(part, rank, 2, torch.device("cpu"))
    cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=microbatches, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    losses_by_step, start = [], None
    for step in range(args.steps):
        x, y = global_batch(step, args.batch)
        if rank == 0:
            sched.step(x)
        else:
            losses = []
            sched.step(target=y, losses=losses)
            losses_by_step.append(torch.stack(losses).mean().item())
        opt.step()
        opt.zero_grad()
        if step == 0:
            start = time.perf_counter()
    seconds = time.perf_counter() - start
    if rank == 1:
        queue.put((args.batch * (args.steps - 1) / seconds, losses_by_step[0], losses_by_step[-1]))
    dist.destroy_process_group()


def run_pippy(args, schedule, microbatches):
    return run_ranks(pippy_rank, 2, args, schedule, microbatches)


def run_conveyor(args, mode, schedule, microbatches):
    flags = [f"--parallel={mode}", "--stages=2", f"--schedule={schedule}", f"--microbatches={microbatches}",
             f"--steps={args.steps}", f"--batch={args.batch}", "--threads=1", f"--log-every={args.steps - 1}"]
    if mode == "pipeline":
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, "--standalone", "--nproc-per-node=2", "--no-python", args.binary] + flags
    else:
        cmd = [args.binary] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss\s+([0-9.]+)", out, re.M)]
    rate = float(re.search(r"samples/s: ([0-9.e+]+)", out).group(1))
    return rate, losses[0], losses[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="build/examples/distributed_train")
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--microbatches", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"bench_vs_pippy: no {args.binary} (build it: bash scripts/build.sh --target distributed_train)")
    contestants = {
        "pippy": lambda s, m: run_pippy(args, s, m),
        "c10d": lambda s, m: run_conveyor(args, "pipeline", s, m),
        "threads": lambda s, m: run_conveyor(args, "threads", s, m),
    }
    rates = {}
    losses = {}
    for r in range(args.rounds):
        for schedule in args.schedules:
            for m in args.microbatches:
                order = list(contestants) if r % 2 == 0 else list(reversed(contestants))
                for name in order:
                    rate, first, last = contestants[name](schedule, m)
                    rates.setdefault((schedule, m, name), []).append(rate)
                    losses.setdefault((schedule, m), []).append((first, last))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"MLP 13 layers (6 x 512 ReLU + 10), batch {args.batch}, K = 2, {args.steps} steps, "
          f"{os.cpu_count()} CPUs, one intra-op thread per stage; median samples/s over {args.rounds} "
          "alternated rounds\n")
    print("| schedule | M | pippy | Conveyor c10d | Conveyor threads | c10d / pippy | threads / pippy "
          "| losses agree (max diff) |\n|---|---|---|---|---|---|---|---|")
    for schedule in args.schedules:
        for m in args.microbatches:
            p, c, t = (statistics.median(rates[(schedule, m, n)]) for n in ("pippy", "c10d", "threads"))
            pairs = losses[(schedule, m)]
            diff = max(max(abs(a[0] - b[0]), abs(a[1] - b[1])) for a in pairs for b in pairs)
            print(f"| {schedule} | {m} | {p:.0f} | {c:.0f} | {t:.0f} | {c / p:.2f} | {t / p:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
