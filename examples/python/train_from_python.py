"""Train a TorchScript model with Conveyor's pipeline, driven from Python.

The model is an ordinary torch.nn.Module, scripted with torch.jit.script and
handed to torch.classes.conveyor.Pipeline, which cuts it into stages and runs
each training step under a pipeline schedule (micro-batches flowing through
the stages in threads). With a synchronous schedule the optimizer is plain
torch.optim.Adam over pipe.parameters(): those are the model's own tensors,
so it updates the pipeline directly. The asynchronous schedules (pipedream,
ddg, fr) update every stage after every micro-batch, so there the pipeline
owns the optimizer ({"optimizer": "adam", "lr": ...}) and train_step steps it.

The task is synthetic: classify points of three interleaved spirals, so the
example needs nothing but torch. The loss printed every few steps falls.

  python examples/python/train_from_python.py                      # 2 workers, 1F1B
  python examples/python/train_from_python.py --workers 4 --schedule gpipe
  python examples/python/train_from_python.py --split-points body.1,head --checkpoint /tmp/spirals.ckpt
  python examples/python/train_from_python.py --schedule pipedream --workers 3 --microbatches 8

The plugin is build/libconveyor.so unless --lib or $CONVEYOR_LIB says otherwise.
"""
import argparse
import math
import os
import sys
import warnings

import torch
from torch import nn


class Block(nn.Module):
    """A residual block: the add stays inside the block, so the model's own
    forward remains a plain chain of submodules, which the pipeline can cut
    anywhere without split points."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class SpiralNet(nn.Module):
    def __init__(self, width=64, depth=4, classes=3):
        super().__init__()
        self.stem = nn.Linear(2, width)
        self.body = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


def spirals(n, classes=3, noise=0.15, seed=0):
    """n points on `classes` interleaved spiral arms, with their arm as label."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(classes, (n,), generator=g)
    r = torch.rand(n, generator=g)
    angle = 4.0 * r + label * (2 * math.pi / classes) + noise * torch.randn(n, generator=g)
    points = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=1)
    return points, label


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=os.environ.get("CONVEYOR_LIB", "build/libconveyor.so"),
                        help="path of libconveyor.so (default: $CONVEYOR_LIB or build/libconveyor.so)")
    parser.add_argument("--workers", type=int, default=2,
                        help="threads, one stage each (ignored with --split-points)")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--schedule", default="1f1b",
                        help="pipeline schedule: sequential, gpipe, 1f1b, or asynchronous pipedream, ddg, fr")
    parser.add_argument("--split-points", default="",
                        help="comma-separated submodules that begin a stage, e.g. body.2,head")
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--batch", type=int, default=256, help="samples per step")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--checkpoint", default="", help="write a checkpoint here at the end and read it back")
    parser.add_argument("--require-accuracy", type=float, default=0.0,
                        help="exit with status 1 if the final test accuracy is below this")
    args = parser.parse_args()

    if not os.path.exists(args.lib):
        sys.exit(f"no plugin at {args.lib}: build it (scripts/build.sh) or pass --lib / set CONVEYOR_LIB")
    torch.ops.load_library(args.lib)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices

    torch.manual_seed(0)
    model = torch.jit.script(SpiralNet())
    options = {"microbatches": args.microbatches, "schedule": args.schedule, "loss": "cross_entropy"}
    if args.split_points:
        options["split_points"] = args.split_points
    else:
        options["workers"] = args.workers
    asynchronous = args.schedule in ("pipedream", "ddg", "fr")
    if asynchronous:
        options.update({"optimizer": "adam", "lr": args.lr})
    pipe = torch.classes.conveyor.Pipeline(model, options)
    print(f"{pipe.num_stages()} stages: {pipe.plan()}")

    opt = None if asynchronous else torch.optim.Adam(pipe.parameters(), lr=args.lr)
    accuracy = 0.0
    test_x, test_y = spirals(1024, seed=1)
    for step in range(1, args.steps + 1):
        x, y = spirals(args.batch, seed=100 + step)
        if opt:
            opt.zero_grad()
        loss = pipe.train_step(x, y)
        if opt:
            opt.step()
        if step == 1 or step % 10 == 0 or step == args.steps:
            accuracy = (pipe.forward(test_x).argmax(dim=1) == test_y).float().mean().item()
            print(f"step {step:4d}  loss {loss:.4f}  test accuracy {accuracy:.3f}")

    if args.checkpoint:
        pipe.save_checkpoint(args.checkpoint, args.steps)
        saved = torch.load(args.checkpoint)
        print(f"checkpoint {args.checkpoint}: step {saved['step']}, {len(saved['model'])} tensors "
              f"({', '.join(list(saved['model'])[:3])}, ...)")
        assert pipe.load_checkpoint(args.checkpoint) == args.steps
    if accuracy < args.require_accuracy:
        sys.exit(f"test accuracy {accuracy:.3f} is below the required {args.require_accuracy}")


if __name__ == "__main__":
    main()
