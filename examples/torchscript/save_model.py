"""Recipe, first half: a Python nn.Module, scripted and saved for C++.

A regressor of an input layer, a stack of residual blocks and a head, with
random weights; torch.jit.script compiles its forward (the loop over the
blocks included), and torch.jit.save writes the file that
train_script.cpp loads.

  python examples/torchscript/save_model.py regressor.pt
"""
import sys

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.linear(self.norm(x)))


class Regressor(nn.Module):
    def __init__(self, inputs: int = 16, width: int = 64, blocks: int = 4):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(blocks)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


if __name__ == "__main__":
    torch.manual_seed(0)
    path = sys.argv[1] if len(sys.argv) > 1 else "regressor.pt"
    torch.jit.save(torch.jit.script(Regressor()), path)
    print(f"saved {path}: its submodules, which split points name: "
          + ", ".join(name for name, _ in Regressor().named_modules() if name.count(".") < 2 and name))
