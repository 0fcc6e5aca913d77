"""The Python guide's example (docs/guides/python.md), whole: a small tagger (embedding, four
residual layers in an nn.ModuleList, a head) trained as a 3-stage 1F1B
pipeline with a Python loss function and torch.optim.AdamW. Exits 1 unless
the loss falls. Needs the installed package (pip install .).

  python examples/python/quickstart.py [--steps 60]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

import conveyor


class Layer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Linear(width, width)

    def forward(self, h, mask):
        return h + torch.relu(self.ff(self.norm(h))) * mask.unsqueeze(-1)


class Tagger(nn.Module):
    def __init__(self, vocab=32, width=64, depth=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Layer(width) for _ in range(depth)])
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens, mask):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, mask)
        return self.head(h)


def data(batch=64, length=12, vocab=32, seed=0):
    """Token sequences (the last few positions padding) and each token's tag: (token * 5 + 3) % vocab."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length)
    mask[:, -2:] = 0
    return tokens, mask, (tokens * 5 + 3) % vocab


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Tagger()
    losses = []
    for step in range(args.steps):
        tokens, mask, target = data(seed=step)
        if step == 0:
            pipe = conveyor.Pipeline(model, split_points=["layers.2", "head"], microbatches=8, schedule="1f1b",
                                     loss_fn=lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
            opt = torch.optim.AdamW(pipe.parameters(), lr=1e-3)
            result = pipe.train_step((tokens, mask), target)   # a conveyor.StepResult: .loss, .microbatch_losses, .bubble, ...
            opt.step(); opt.zero_grad()
            print(pipe)
        else:
            result = pipe.train_step((tokens, mask), target)
            opt.step()
            opt.zero_grad()
        losses.append(result.loss)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {result.loss:.4f}  bubble {result.bubble:.0%}  "
                  f"micro-batch losses {min(result.microbatch_losses):.3f}..{max(result.microbatch_losses):.3f}")
    if not losses[-1] < 0.5 * losses[0]:
        sys.exit(f"the loss did not fall enough: {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"PASS: loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
