#!/usr/bin/env python3
"""torch.distributed.pipelining's schedules beside Conveyor's of the same names.

The model and batch of bench_schedules (a 16-layer MLP of width 512, mean
squared error, batch 64, M = 8) on K = 2 ranks: torch.distributed.pipelining
runs one process per rank (Gloo, CPU, one intra-op thread each) under
ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B and
ScheduleInterleavedZeroBubble (two chunks per rank, looped like Conveyor's),
ScheduleZBVZeroBubble and ScheduleDualPipeV (two chunks per rank in a V: rank r
runs stages r and 2K-1-r, as Conveyor's zb-v and dualpipev);
Conveyor runs bench_schedules (a thread per stage in one process). The two
take turns --rounds times; each reports the median step of its --steps steps
per round, and the table gives the median over rounds, with the ratio
torch.distributed.pipelining / Conveyor (above 1: Conveyor is faster).

  python benchmarks/bench_pippy_schedules.py --conveyor build/benchmarks/bench_schedules
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

WIDTH, LAYERS = 512, 8  # Linear + Tanh pairs: 16 layers, as bench_schedules' MLP

# Conveyor's name -> (torch.distributed.pipelining's class name, chunks per rank, placed in a V)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", 1, False),
    "1f1b": ("Schedule1F1B", 1, False),
    "interleaved (v=2)": ("ScheduleInterleaved1F1B", 2, False),
    "zb-interleaved (v=2)": ("ScheduleInterleavedZeroBubble", 2, False),
    "zb-v": ("ScheduleZBVZeroBubble", 2, True),
    "dualpipev": ("ScheduleDualPipeV", 2, True),
}


def make_model():
    torch.manual_seed(1)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers)


def pieces(model, n):
    size = len(model) // n
    return [nn.Sequential(*list(model)[i * size:(i + 1) * size]) for i in range(n)]


def rank_main(rank, port, args, queue):
    world = 2
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed import pipelining

    torch.manual_seed(0)
    x = torch.randn(args.batch, WIDTH)
    y = torch.randn(args.batch, WIDTH)
    runs = {}
    for name, (cls_name, chunks, v_shape) in SCHEDULES.items():
        n = world * chunks
        parts = pieces(make_model(), n)
        if v_shape:
            mine = [rank, n - 1 - rank]
        else:
            mine = [s for s in range(n) if s % world == rank]  # looped placement
        stages = [pipelining.PipelineStage(parts[s], s, n, torch.device("cpu")) for s in mine]
        cls = getattr(pipelining, cls_name)
        loss_fn = nn.functional.mse_loss
        schedule = cls(stages[0] if chunks == 1 else stages, n_microbatches=args.microbatches, loss_fn=loss_fn)
        has_first, has_last = 0 in mine, n - 1 in mine
        runs[name] = (schedule, has_first, has_last)

    def step(name):
        schedule, first, last = runs[name]
        kwargs = {}
        if last:
            kwargs.update(target=y, losses=[])
        dist.barrier()
        t0 = time.perf_counter()
        schedule.step(x, **kwargs) if first else schedule.step(**kwargs)
        dist.barrier()
        return time.perf_counter() - t0

    for name in runs:  # warm-up (shape inference)
        step(name)
    times = {name: [] for name in runs}
    for _ in range(args.steps):
        for name in runs:
            times[name].append(step(name))
    if rank == 0:
        queue.put({name: statistics.median(t) for name, t in times.items()})
    dist.destroy_process_group()


def pippy_round(args):
    return run_ranks(rank_main, 2, args)


def conveyor_round(args):
    out = subprocess.run([args.conveyor, "--model", "mlp", "--workers", "2", "--microbatches", str(args.microbatches),
                          "--batch", str(args.batch), "--steps", str(args.steps)],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    result = {}
    for line in out.splitlines():
        m = re.match(r"\| ([^|]+?) \| ([0-9.]+) \|", line)
        if m:
            result[m.group(1)] = float(m.group(2)) / 1e3
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conveyor", default="build/benchmarks/bench_schedules")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.access(args.conveyor, os.X_OK):
        sys.exit(f"bench_pippy_schedules: no Conveyor benchmark at {args.conveyor} (build it: "
                 "bash scripts/build.sh --target bench_schedules)")
    pippy, conveyor = {n: [] for n in SCHEDULES}, {n: [] for n in SCHEDULES}
    for r in range(args.rounds):
        for name, t in pippy_round(args).items():
            pippy[name].append(t)
        got = conveyor_round(args)
        for name in SCHEDULES:
            conveyor[name].append(got[name])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"MLP {2 * LAYERS} layers of {WIDTH}, batch {args.batch}, M = {args.microbatches}, K = 2, "
          f"{os.cpu_count()} CPUs; median over {args.rounds} alternated rounds of each one's median of "
          f"{args.steps} steps\n")
    print("| schedule | torch.distributed.pipelining ms | Conveyor ms | ratio |\n|---|---|---|---|")
    for name in SCHEDULES:
        p, c = statistics.median(pippy[name]) * 1e3, statistics.median(conveyor[name]) * 1e3
        print(f"| {name} | {p:.1f} | {c:.1f} | {p / c:.2f} |")


if __name__ == "__main__":
    main()
