"""Models written as a new user writes them, each a shape that split points
must cut (make_fixtures.py scripts and saves them; the Python tests script
them in-process):

  LoopedTransformer  forward(x, mask) loops over an nn.ModuleList of masked
                     attention blocks, then calls an nn.Sequential whole: a
                     [T, T] causal mask rides along through every stage
  DirectRnn          calls nn.LSTM and nn.GRU directly (out, _ = self.rnn(x)),
                     which TorchScript compiles as calls of forward__0
  OverloadedBlocks   two submodules with an overloaded forward, one called
                     without its optional gate (forward__0), one with it
                     (forward__1)
"""
import math
from typing import Optional

import torch
from torch import Tensor, nn


class MaskedBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.ff = nn.Linear(width, width)
        self.scale = 1.0 / math.sqrt(width)

    def forward(self, h, mask):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + mask
        h = h + self.out(torch.matmul(torch.softmax(scores, dim=-1), v))
        return h + torch.tanh(self.ff(h))


class LoopedTransformer(nn.Module):
    def __init__(self, inputs=6, width=8, outputs=3, depth=4):
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        self.layers = nn.ModuleList([MaskedBlock(width) for _ in range(depth)])
        self.ffn = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, outputs)

    def forward(self, x, mask):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, mask)
        return self.head(self.ffn(h))


def causal_mask(steps, dtype=torch.float64):
    """[T, T]: 0 on and below the diagonal, -inf above (no sample dimension)."""
    return torch.full((steps, steps), float("-inf"), dtype=dtype).triu(1)


class DirectRnn(nn.Module):
    def __init__(self, vocab=30):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.lstm = nn.LSTM(8, 10, batch_first=True)
        self.gru = nn.GRU(10, 10, batch_first=True)
        self.head = nn.Linear(10, vocab)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        out, _ = self.gru(out)
        return self.head(out)


class Gated(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    @torch.jit._overload_method  # noqa: F811
    def forward(self, x: Tensor, gate: None = None) -> Tensor:
        pass

    @torch.jit._overload_method  # noqa: F811
    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        pass

    def forward(self, x: Tensor, gate: Optional[Tensor] = None) -> Tensor:  # noqa: F811
        h = torch.tanh(self.a(x))
        if gate is not None:
            h = h * gate
        return self.b(h) + x


class OverloadedBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.block = Gated()
        self.gated = Gated()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.block(self.stem(x))
        return self.head(self.gated(h, torch.sigmoid(h)))


def save_cut_fixtures(path):
    """Scripts each model in float64 and saves it under path(file name)."""
    torch.jit.save(torch.jit.script(LoopedTransformer().double()), path("looped_transformer.pt"))
    torch.jit.save(torch.jit.script(DirectRnn().double()), path("direct_rnn.pt"))
    torch.jit.save(torch.jit.script(OverloadedBlocks().double()), path("overloaded_blocks.pt"))
