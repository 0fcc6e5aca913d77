#!/usr/bin/env python3
"""The pipeline's own cost on one device: conveyor.Pipeline with 1, 2 and 4
workers, every stage on the same GPU, against the same model trained
eagerly (one forward and backward of the whole batch, then the optimizer),
and against torch.distributed.pipelining with every stage on one rank.

On one device the stages cannot run in parallel, so a pipeline can only add
time: what it adds is the runtime's own cost (micro-batching, the schedule,
copies, synchronisation), which is what this measures. The goal for one
worker is at most 1.03x eager's step.

Two models, float32, SGD, cross-entropy:

  transformer  width 512, 4 pre-norm blocks (8 heads, PyTorch's scaled dot-
               product attention, causal; MLP 4x), vocabulary 8000, batch 8
               sequences of 512 tokens, 4 micro-batches;
  lstm         the demo's language model (examples/language_model: embedding
               128, two LSTMs of 256, linear to 10000 words; dropout 0),
               batch 32 windows of 35 tokens, 4 micro-batches.

K workers cut the model's layers into K pieces (1F1B; one worker runs them
as one stage under "sequential"). torch.distributed.pipelining gets the same
pieces as stages of one rank (world size 1, Gloo), under
ScheduleInterleaved1F1B, where its schedules allow that (it prints why not
otherwise). The contestants take turns --rounds times; each is timed over
--steps steps after --warmup, with the device synchronised at each end; the
table gives the median step time and the ratio to eager's. All start from
the same weights and see the same batches, so they must end with the same
weights: the table gives each one's largest difference from eager's, and the
run fails (exit status 1) where one exceeds 1e-3.

  python benchmarks/pipeline_one_gpu.py                 # CUDA when present, else the CPU
  python benchmarks/pipeline_one_gpu.py --small         # tiny models: checks that it runs
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import conveyor


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h):
        n, s, d = h.shape
        qkv = self.qkv(self.norm1(h)).view(n, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(n, s, d))
        return h + self.ff(self.norm2(h))


class Transformer(nn.Module):
    def __init__(self, vocab, d, heads, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.out = nn.Linear(d, vocab)

    def forward(self, x):
        return self.out(self.blocks(self.embed(x)))


class LstmLM(nn.Module):
    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm1 = nn.LSTM(embed, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.lstm1(self.embed(x))
        h, _ = self.lstm2(h)
        return self.out(h)


def models(small):
    """name -> (make, layer names in order, vocab, batch, seq)."""
    if small:
        return {"transformer": (lambda: Transformer(50, 32, 2, 4), ["embed"] + [f"blocks.{i}" for i in range(4)] +
                                ["out"], 50, 4, 16),
                "lstm": (lambda: LstmLM(50, 8, 16), ["embed", "lstm1", "lstm2", "out"], 50, 8, 7)}
    return {"transformer": (lambda: Transformer(8000, 512, 8, 4), ["embed"] + [f"blocks.{i}" for i in range(4)] +
                            ["out"], 8000, 8, 512),
            "lstm": (lambda: LstmLM(10000, 128, 256), ["embed", "lstm1", "lstm2", "out"], 10000, 32, 35)}


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def cut(layers, k):
    """The split points (first layer of each piece but the first) of K pieces, the first ones a layer longer."""
    sizes = [len(layers) // k + (1 if i < len(layers) % k else 0) for i in range(k)]
    points, at = [], 0
    for size in sizes[:-1]:
        at += size
        points.append(layers[at])
    return points


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Eager:
    name = "eager"

    def __init__(self, model, lr):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(self, x, y):
        self.opt.zero_grad()
        loss_fn(self.model(x), y).backward()
        self.opt.step()

    def weights(self):
        return dict(self.model.named_parameters())


class Conveyor:
    def __init__(self, model, layers, workers, microbatches, device, lr):
        self.name = f"conveyor K={workers}"
        points = cut(layers, workers)
        self.pipe = conveyor.Pipeline(model, split_points=points, workers=workers, microbatches=microbatches,
                                      schedule="1f1b" if workers > 1 else "sequential", devices=[str(device)],
                                      loss_fn=loss_fn)
        self.lr = lr
        self.opt = None

    def step(self, x, y):
        self.pipe.train_step(x, y)  # the first step builds the pipeline
        self.opt = self.opt or torch.optim.SGD(self.pipe.parameters(), lr=self.lr)
        self.opt.step()
        self.opt.zero_grad()

    def weights(self):
        return dict(self.pipe.named_parameters())


class Pippy:
    """torch.distributed.pipelining, every piece a stage of this one rank."""

    def __init__(self, model, layers, workers, microbatches, device, lr):
        from torch.distributed import pipelining
        self.name = f"pippy K={workers}"
        self.model = model  # the pieces' modules are its own
        pieces = split_module(model, cut(layers, workers), layers)
        self.params = [p for piece in pieces for p in piece.parameters()]
        stages = [pipelining.PipelineStage(piece, i, len(pieces), device) for i, piece in enumerate(pieces)]
        self.schedule = pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)
        self.opt = torch.optim.SGD(self.params, lr=lr)

    def step(self, x, y):
        self.opt.zero_grad()
        self.schedule.step(x, target=y)
        self.opt.step()

    def weights(self):
        return dict(self.model.named_parameters())


class Piece(nn.Module):
    """Layers of a model, run in order (each model here is such a chain)."""

    def __init__(self, model, names):
        super().__init__()
        self.names = names
        for name in names:
            self.add_module(name.replace(".", "_"), model.get_submodule(name))

    def forward(self, h):
        for name in self.names:
            h = getattr(self, name.replace(".", "_"))(h)
            if isinstance(h, tuple):  # an LSTM's (output, state)
                h = h[0]
        return h


def split_module(model, points, layers):
    pieces, current = [], []
    for name in layers:
        if name in points:
            pieces.append(Piece(model, current))
            current = []
        current.append(name)
    pieces.append(Piece(model, current))
    return pieces


def time_steps(contestant, data, device, steps):
    synchronize(device)
    start = time.perf_counter()
    for x, y in data[:steps]:
        contestant.step(x, y)
    synchronize(device)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", choices=["all", "transformer", "lstm"], default="all")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma separated")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pippy", action="store_true", help="leave torch.distributed.pipelining out")
    parser.add_argument("--small", action="store_true", help="tiny models (a check that the script runs)")
    args = parser.parse_args()
    device = torch.device(args.device)
    workers = [int(w) for w in args.workers.split(",")]
    print(f"conveyor {conveyor.__version__}, torch {torch.__version__}, device "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, float32, "
          f"{args.microbatches} micro-batches, median of {args.rounds} rounds of {args.steps} steps", flush=True)
    if not args.no_pippy:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    failures = 0
    for name, (make, layers, vocab, batch, seq) in models(args.small).items():
        if args.model not in ("all", name):
            continue
        torch.manual_seed(1)
        base = make()
        gen = torch.Generator().manual_seed(2)
        data = [(torch.randint(vocab, (batch, seq), generator=gen).to(device),
                 torch.randint(vocab, (batch, seq), generator=gen).to(device))
                for _ in range(args.warmup + args.steps)]
        contestants = [Eager(copy.deepcopy(base).to(device), 0.01)]
        for k in workers:
            contestants.append(Conveyor(copy.deepcopy(base).to(device), layers, k, args.microbatches, device, 0.01))
        if not args.no_pippy:
            for k in workers:
                try:  # a step on a copy first: does pipelining run this?
                    Pippy(copy.deepcopy(base).to(device), layers, k, args.microbatches, device, 0.01).step(*data[0])
                    contestants.append(Pippy(copy.deepcopy(base).to(device), layers, k, args.microbatches, device,
                                             0.01))
                except Exception as e:  # noqa: BLE001 -- report what pipelining refuses, keep measuring the rest
                    print(f"  {name}: torch.distributed.pipelining with {k} stages on one rank: not run "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:160]})", flush=True)
        for c in contestants:  # warm-up, and the pipelines' first (building) step
            time_steps(c, data, device, args.warmup)
        times = {c.name: [] for c in contestants}
        for _ in range(args.rounds):
            for c in contestants:
                times[c.name].append(time_steps(c, data[args.warmup:], device, args.steps))
        eager = statistics.median(times["eager"])
        want = contestants[0].weights()
        print(f"\n{name}: batch {batch} x {seq} tokens")
        print(f"  {'contestant':<16} {'step ms':>10} {'/ eager':>8} {'weights vs eager':>17}")
        for c in contestants:
            ms = statistics.median(times[c.name])
            got = c.weights()
            diff = max((got[n].detach().cpu() - w.detach().cpu()).abs().max().item() for n, w in want.items())
            print(f"  {c.name:<16} {ms * 1e3:10.3f} {ms / eager:7.3f}x {diff:17.1e}", flush=True)
            if not diff <= 1e-3:
                print(f"  FAILED: {c.name} ended with other weights than eager's")
                failures += 1
    if not args.no_pippy:
        import torch.distributed as dist
        dist.destroy_process_group()
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
