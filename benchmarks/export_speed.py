"""The torch.export interpreter's cost per step (benchmarks/results/export_speed.md).

One training step (forward, backward, SGD) of the same model, side by side in
one process, taking turns: eager PyTorch; Conveyor's pipeline over the model
scripted with TorchScript; Conveyor's pipeline over the model exported with
torch.export (C++ runs the graph node by node through the dispatcher). The
pipelines are cut at the same module into 2 stages, 2 micro-batches, 1F1B,
so what differs between them is the front end. Times are medians of ROUNDS rounds of STEPS steps each.

    .venv/bin/python benchmarks/export_speed.py            # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/export_speed.py --rounds 9 --steps 40
"""
import argparse
import copy
import os
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from make_export_fixtures import LstmLm, Mlp, Transformer  # noqa: E402

import conveyor  # noqa: E402


def cases(batch):
    g = torch.Generator().manual_seed(0)
    yield ("MLP (7 layers, 12-16-5)", Mlp(), ["head"], (torch.randn(batch, 12, generator=g),),
           torch.randn(batch, 5, generator=g))
    yield ("LSTM LM (2 layers, width 10, 7 steps)", LstmLm(), ["rnn2"],
           (torch.randint(0, 23, (batch, 7), generator=g),), torch.randint(0, 23, (batch, 7), generator=g))
    yield ("transformer (2 encoder layers, width 16)", Transformer(), ["layers.1"],
           (torch.randn(batch, 5, 6, generator=g),), torch.randn(batch, 5, 3, generator=g))


def loss_of(target):
    if target.dtype == torch.long:
        return lambda out, t: F.cross_entropy(out.reshape(-1, out.size(-1)), t.reshape(-1))
    return F.mse_loss


def timed(step, steps):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"batch {args.batch}, median of {args.rounds} rounds x {args.steps} steps, 1 thread\n")
    print("| model | eager PyTorch | Conveyor + TorchScript | Conveyor + torch.export | export / eager | "
          "export / TorchScript |")
    print("|---|---|---|---|---|---|")
    for name, model, split, inputs, target in cases(args.batch):
        torch.manual_seed(0)
        model = model.train()
        loss = loss_of(target)
        eager = copy.deepcopy(model)
        opt = torch.optim.SGD(eager.parameters(), lr=0.01)

        def eager_step():
            opt.zero_grad()
            loss(eager(*inputs), target).backward()
            opt.step()

        rows = torch.export.Dim("batch", min=1)
        program = torch.export.export(copy.deepcopy(model), inputs, dynamic_shapes=tuple({0: rows} for _ in inputs))
        pipes = {kind: conveyor.Pipeline(m, split_points=split, microbatches=2, schedule="1f1b", loss_fn=loss,
                                         optimizer="sgd", lr=0.01)
                 for kind, m in (("script", copy.deepcopy(model)), ("export", program))}
        steps = {"eager": eager_step}
        for kind, pipe in pipes.items():
            steps[kind] = (lambda p: lambda: p.train_step(inputs, target))(pipe)
        for step in steps.values():  # warm-up
            timed(step, 3)
        times = {kind: [] for kind in steps}
        for _ in range(args.rounds):
            for kind, step in steps.items():
                times[kind].append(timed(step, args.steps))
        med = {kind: statistics.median(t) * 1e3 for kind, t in times.items()}
        print(f"| {name} | {med['eager']:.3f} ms | {med['script']:.3f} ms | {med['export']:.3f} ms | "
              f"{med['export'] / med['eager']:.2f}x | {med['export'] / med['script']:.2f}x |")


if __name__ == "__main__":
    main()
