#!/usr/bin/env python3
"""Conveyor's pipelines against torch.distributed.pipelining on this machine.

Two models of examples/distributed_train (--model), each built from the same
seed in the same order here as there, so all contestants start from the
same weights and see the same data, K stages (--ranks, default 2) cut as
Conveyor cuts them (uniform by layers, the first pieces one layer longer),
mean cross-entropy, SGD stepped after every batch:

  mlp  6 hidden layers of 512 (ReLU, He initialisation) + a linear layer to 10
       classes, 13 layers (K = 2: cut 7 | 6), batch 256 of synthetic
       features labelled by a fixed linear teacher (seeded per step), learning
       rate 0.05;
  lm   the demo's LSTM language model (examples/common/lm_model.h: embedding 64, two
       LSTMs of 128, dropout 0, linear to 2000 words), 7 layers (K = 2: cut
       4 | 3), batch 64 sequences of 20 tokens, each target a fixed function
       of its token, learning rate 0.5.

The schedules with two chunks per rank cut 2K pieces: the interleaved ones
place pieces r and r + K on rank r, the V ones r and 2K - 1 - r (the loss on
rank 0); the lm's 7 layers make at most 7 pieces.

Four contestants, one intra-op thread per stage, CPU:

  pippy     torch.distributed.pipelining (ScheduleGPipe / Schedule1F1B; the
            interleaved and V schedules with two chunks per rank), one
            process per stage, Gloo (spawned here); against Conveyor's
            eager-1f1b (1F1B with forwards run ahead, "eager-1f1b+N" for a
            lookahead of N) it runs Schedule1F1B, the schedule it replaces;
  c10d      Conveyor, one process per stage over c10d/Gloo
            (torchrun ... distributed_train --parallel=pipeline
            --no-shared-memory);
  shm       the same, neighbouring processes passing activations and
            gradients through shared memory (distributed_train's default);
  threads   Conveyor in one process, a thread per stage
            (distributed_train --parallel=threads).

Each runs --steps steps; samples/s counts the steps after the first (as
distributed_train does). The contestants take turns, --rounds times; the
table gives the median samples/s of each and the ratios to pippy, and checks
that the losses of the first and last step agree across all of them.

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

SEED = 1
MODELS = {
    "mlp": dict(batch=256, lr=0.05, flags=[]),
    "lm": dict(batch=64, lr=0.5, flags=["--model=lm", "--hidden=128"]),
}
# The schedules with two chunks per rank.
TWO_CHUNKS = {"interleaved", "zb-interleaved", "zb-v", "dualpipev"}
INPUTS, HIDDEN, LAYERS, CLASSES = 256, 512, 6, 10  # mlp
VOCAB, EMBED, LM_HIDDEN, LENGTH = 2000, 64, 128, 20  # lm


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous: Gloo sends only contiguous tensors."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class FirstOutput(nn.Module):
    """conveyor::FirstOutput: an LSTM's output without its state (contiguous both ways, for PiPPy's sends)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(_ContiguousGrad.apply(x))[0].contiguous()


def make_model(kind):
    """distributed_train's make_model, draw for draw."""
    torch.manual_seed(SEED)
    if kind == "lm":  # make_language_model builds the decoder first
        decoder = nn.Linear(LM_HIDDEN, VOCAB)
        embedding = nn.Embedding(VOCAB, EMBED)
        lstm1 = nn.LSTM(EMBED, LM_HIDDEN, batch_first=True)
        lstm2 = nn.LSTM(LM_HIDDEN, LM_HIDDEN, batch_first=True)
        return nn.Sequential(embedding, nn.Dropout(0.0), FirstOutput(lstm1), nn.Dropout(0.0), FirstOutput(lstm2),
                             nn.Dropout(0.0), decoder)
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


def global_batch(kind, step, batch):
    if kind == "lm":
        torch.manual_seed(SEED + step)
        x = torch.randint(VOCAB, (batch, LENGTH))
        return x, (x * 7 + 3) % VOCAB
    torch.manual_seed(SEED + 7919)
    teacher = torch.randn(INPUTS, CLASSES)
    torch.manual_seed(SEED + step)
    x = torch.randn(batch, INPUTS)
    return x, (x @ teacher).argmax(1)


def cross_entropy(out, target):
    return nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def uniform_pieces(layers, n):
    """Conveyor's uniform cut: n pieces of consecutive layers, the first ones one longer."""
    each, extra = divmod(len(layers), n)
    pieces, at = [], 0
    for i in range(n):
        size = each + (1 if i < extra else 0)
        pieces.append(layers[at:at + size])
        at += size
    return pieces


def pippy_rank(rank, port, args, kind, schedule, microbatches, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ranks = args.ranks
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    from torch.distributed import pipelining

    model, spec = make_model(kind), MODELS[kind]
    interleaved = {"interleaved": pipelining.ScheduleInterleaved1F1B,
                   "zb-interleaved": pipelining.ScheduleInterleavedZeroBubble}
    v_shaped = {"zb-v": pipelining.ScheduleZBVZeroBubble, "dualpipev": pipelining.ScheduleDualPipeV}
    if schedule in interleaved or schedule in v_shaped:
        # Two chunks per rank: in a loop (pieces r and r + K), or in a V (r and 2K - 1 - r: the loss on rank 0).
        pieces = [nn.Sequential(*p) for p in uniform_pieces(list(model), 2 * ranks)]
        mine = [rank, rank + ranks] if schedule in interleaved else [rank, 2 * ranks - 1 - rank]
        stages = [pipelining.PipelineStage(pieces[i], i, 2 * ranks, torch.device("cpu")) for i in mine]
        sched = {**interleaved, **v_shaped}[schedule](stages, n_microbatches=microbatches, loss_fn=cross_entropy)
        params = [p for i in mine for p in pieces[i].parameters()]
    else:
        part = nn.Sequential(*uniform_pieces(list(model), ranks)[rank])
        stage = pipelining.PipelineStage(part, rank, ranks, torch.device("cpu"))
        cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[pippy_schedule(schedule)]
        sched = cls(stage, n_microbatches=microbatches, loss_fn=cross_entropy)
        params = list(part.parameters())
    opt = torch.optim.SGD(params, lr=spec["lr"])
    losses_by_step, start = [], None
    last = 0 if schedule in v_shaped else ranks - 1  # the rank that computes the loss
    for step in range(args.steps):
        x, y = global_batch(kind, step, spec["batch"])
        losses = []
        if rank == 0 and rank == last:
            sched.step(x, target=y, losses=losses)
        elif rank == 0:
            sched.step(x)
        elif rank == last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        if rank == last:
            losses_by_step.append(torch.stack(losses).mean().item())
        opt.step()
        opt.zero_grad()
        if step == 0:
            start = time.perf_counter()
    seconds = time.perf_counter() - start
    if rank == last:
        queue.put((spec["batch"] * (args.steps - 1) / seconds, losses_by_step[0], losses_by_step[-1]))
    dist.destroy_process_group()


def run_pippy(args, kind, schedule, microbatches):
    return run_ranks(pippy_rank, args.ranks, args, kind, schedule, microbatches)


def pippy_schedule(schedule):
    """What torch.distributed.pipelining runs against a schedule of Conveyor's (it has no eager 1F1B: Schedule1F1B)."""
    return "1f1b" if schedule.startswith("eager-1f1b") else schedule


def conveyor_schedule_flags(schedule):
    """["--schedule=eager-1f1b", "--lookahead=2"] for "eager-1f1b+2"."""
    name, _, lookahead = schedule.partition("+")
    return [f"--schedule={name}"] + ([f"--lookahead={lookahead}"] if lookahead else [])


def run_conveyor(args, kind, mode, schedule, microbatches, extra=()):
    spec = MODELS[kind]
    flags = [f"--parallel={mode}", f"--workers={args.ranks}", f"--microbatches={microbatches}"]
    flags += conveyor_schedule_flags(schedule)
    flags += list(extra)
    flags += [f"--steps={args.steps}", f"--batch={spec['batch']}", f"--lr={spec['lr']}", "--threads=1",
              f"--log-every={args.steps - 1}"] + spec["flags"]
    if mode == "pipeline":
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, "--standalone", f"--nproc-per-node={args.ranks}", "--no-python", args.binary] + flags
    else:
        cmd = [args.binary] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900).stdout
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss\s+([0-9.]+)", out, re.M)]
    rate = float(re.search(r"samples/s: ([0-9.e+]+)", out).group(1))
    return rate, losses[0], losses[-1]


def check_same_start(args):
    """Both frameworks build the same model and batch: the first step's loss agrees (to the 4 decimals printed)."""
    for kind, spec in MODELS.items():
        x, y = global_batch(kind, 0, spec["batch"])
        with torch.no_grad():
            want = cross_entropy(make_model(kind)(x), y).item()
        out = subprocess.run([args.binary, "--parallel=threads", "--steps=1", f"--batch={spec['batch']}"]
                             + spec["flags"], check=True, capture_output=True, text=True, timeout=300).stdout
        got = float(re.search(r"^step\s+0\s+loss\s+([0-9.]+)", out, re.M).group(1))
        print(f"{kind}: torch.nn {want:.4f}, Conveyor {got:.4f}")
        if abs(got - want) > 1e-3:
            sys.exit(f"bench_vs_pippy: the {kind} models or data differ between the frameworks")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="build/examples/distributed_train")
    parser.add_argument("--models", nargs="+", default=["mlp", "lm"], choices=sorted(MODELS))
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    parser.add_argument("--microbatches", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="K: processes (and threads), one stage or two chunks each")
    parser.add_argument("--check", action="store_true", help="only check that both frameworks start the same")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"bench_vs_pippy: no {args.binary} (build it: bash scripts/build.sh --target distributed_train)")
    if args.check:
        return check_same_start(args)
    for kind in args.models:
        for schedule in args.schedules:
            pieces = args.ranks * (2 if schedule in TWO_CHUNKS else 1)
            if pieces > len(make_model(kind)):
                sys.exit(f"bench_vs_pippy: {schedule} on {args.ranks} ranks cuts {pieces} pieces; "
                         f"the {kind} has {len(make_model(kind))} layers")
    contestants = {
        "pippy": lambda k, s, m: run_pippy(args, k, s, m),
        "c10d": lambda k, s, m: run_conveyor(args, k, "pipeline", s, m, ["--no-shared-memory"]),
        "shm": lambda k, s, m: run_conveyor(args, k, "pipeline", s, m),
        "threads": lambda k, s, m: run_conveyor(args, k, "threads", s, m),
    }
    configs = [(k, s, m) for k in args.models for s in args.schedules for m in args.microbatches]
    rates, losses = {}, {}
    for r in range(args.rounds):
        for config in configs:
            order = list(contestants) if r % 2 == 0 else list(reversed(contestants))
            for name in order:
                rate, first, last = contestants[name](*config)
                rates.setdefault(config + (name,), []).append(rate)
                losses.setdefault(config, []).append((first, last))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"K = {args.ranks}, {args.steps} steps, {os.cpu_count()} CPUs, one intra-op thread per stage; median "
          f"samples/s over {args.rounds} alternated rounds\n")
    print("| model | schedule | M | pippy | Conveyor c10d | c10d, shared memory | Conveyor threads | c10d / pippy "
          "| shared memory / pippy | threads / pippy | losses agree (max diff) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for config in configs:
        p, c, h, t = (statistics.median(rates[config + (n,)]) for n in ("pippy", "c10d", "shm", "threads"))
        pairs = losses[config]
        diff = max(max(abs(a[0] - b[0]), abs(a[1] - b[1])) for a in pairs for b in pairs)
        kind, schedule, m = config
        print(f"| {kind} | {schedule} | {m} | {p:.0f} | {c:.0f} | {h:.0f} | {t:.0f} | {c / p:.2f} | {h / p:.2f} "
              f"| {t / p:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
