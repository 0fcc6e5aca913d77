"""Writes the torch.export fixtures the C++ tests load (python make_export_fixtures.py OUTDIR).

Made at test time, so no binary lives in the repository. Every model is
float64 and exported in training mode with a dynamic batch dimension, then
saved with torch.export.save as NAME.pt2. Beside each, NAME.ref.pt (a plain
torch.save dict of tensors) holds what eager PyTorch computes on the same
batch, split into MICROBATCHES micro-batches as the pipeline splits it
(tensor_split along dimension 0, each micro-batch's mean loss weighted by its
share of the samples):

  input.I, target.I      the batch
  loss                   the first step's loss
  grad.NAME              every parameter's gradient after the first step
  step3.NAME             every parameter and buffer after three SGD steps
                         (lr LR, no momentum) on that batch

Models (split points that the tests use are listed in SPLITS):
  mlp          Linear/Tanh stack in a Sequential "body", then a "head"
  lstm_lm      embedding -> two nn.LSTM -> projection (aten::lstm)
  resblock     conv stem, a residual block with BatchNorm, pooled linear head
  transformer  two nn.TransformerEncoderLayer (scaled dot-product attention)
  seq2seq      LSTM encoder and decoder with dot-product attention over the
               encoder's outputs, which cross every later cut
  tied_lm      embedding -> "body" -> "head" whose weight is the embedding's,
               scaled by a non-persistent buffer (kept among the archive's
               constants)
Bad inputs for the loader's refusals:
  truncated.pt2       mlp.pt2 cut in half
  foreign.pt2         a TorchScript archive (torch.jit.save), not a program
  future.pt2          mlp.pt2 with its schema's major version set to 99
  custom_op.pt2       calls conveyor_test::twice, an operator only Python defines
  static_batch.pt2    mlp exported without a dynamic batch (batch 8)
"""
import argparse
import io
import json
import os
import zipfile

import torch
from torch import nn
import torch.nn.functional as F

MICROBATCHES = 4
LR = 0.05
BATCH = 10  # splits into micro-batches of 3, 3, 2 and 2


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16),
                                  nn.Tanh())
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.body(x))


class LstmLm(nn.Module):
    def __init__(self, vocab=23, width=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn1 = nn.LSTM(width, width, batch_first=True)
        self.rnn2 = nn.LSTM(width, width, batch_first=True)
        self.proj = nn.Linear(width, vocab)

    def forward(self, tokens):
        h, _ = self.rnn1(self.embed(tokens))
        h, _ = self.rnn2(h)
        return self.proj(h)


class TiedLm(nn.Module):
    def __init__(self, vocab=19, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)) * self.scale)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ResBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.block = Block(6)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        y = self.block(F.relu(self.stem(x)))
        return self.head(y.mean(dim=(2, 3)))


class Transformer(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.embed = nn.Linear(6, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, dim_feedforward=24, dropout=0.0, batch_first=True) for _ in range(2))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


class Seq2seq(nn.Module):
    def __init__(self, vocab=17, width=10):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, width)
        self.encoder = nn.LSTM(width, width, batch_first=True)
        self.tgt_embed = nn.Embedding(vocab, width)
        self.decoder = nn.LSTM(width, width, batch_first=True)
        self.attend = nn.Linear(width, width)
        self.combine = nn.Linear(2 * width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, src, tgt):
        memory, _ = self.encoder(self.src_embed(src))
        h, _ = self.decoder(self.tgt_embed(tgt))
        scores = torch.bmm(self.attend(h), memory.transpose(1, 2))
        context = torch.bmm(torch.softmax(scores, dim=-1), memory)
        return self.out(torch.tanh(self.combine(torch.cat([h, context], dim=-1))))


def mse(out, target):
    return F.mse_loss(out, target)


def cross_entropy(out, target):
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def cases():
    g = torch.Generator().manual_seed(7)
    tokens = lambda *s, v: torch.randint(0, v, s, generator=g)
    yield "mlp", Mlp(), (torch.randn(BATCH, 12, generator=g),), (torch.randn(BATCH, 5, generator=g),), mse
    yield "lstm_lm", LstmLm(), (tokens(BATCH, 7, v=23),), (tokens(BATCH, 7, v=23),), cross_entropy
    yield ("resblock", ResBlock(), (torch.randn(BATCH, 3, 6, 6, generator=g),), (torch.randn(BATCH, 4, generator=g),),
           mse)
    yield ("transformer", Transformer(), (torch.randn(BATCH, 5, 6, generator=g),),
           (torch.randn(BATCH, 5, 3, generator=g),), mse)
    yield "tied_lm", TiedLm(), (tokens(BATCH, 6, v=19),), (tokens(BATCH, 6, v=19),), cross_entropy
    yield ("seq2seq", Seq2seq(), (tokens(BATCH, 6, v=17), tokens(BATCH, 5, v=17)), (tokens(BATCH, 5, v=17),),
           cross_entropy)


def export(model, inputs, dynamic=True):
    batch = torch.export.Dim("batch", min=1)
    shapes = tuple({0: batch} for _ in inputs) if dynamic else None
    return torch.export.export(model, inputs, dynamic_shapes=shapes)


def step(model, inputs, targets, loss_fn):
    """One micro-batched step: the gradient of the batch's mean loss; returns the loss."""
    n = inputs[0].size(0)
    total = 0.0
    parts = [x.tensor_split(MICROBATCHES) for x in inputs]
    goals = [t.tensor_split(MICROBATCHES) for t in targets]
    for i in range(MICROBATCHES):
        share = parts[0][i].size(0) / n
        loss = loss_fn(model(*(p[i] for p in parts)), *(t[i] for t in goals))
        (loss * share).backward()
        total += loss.item() * share
    return total


def reference(model, inputs, targets, loss_fn):
    ref = {f"input.{i}": x for i, x in enumerate(inputs)}
    ref.update({f"target.{i}": t for i, t in enumerate(targets)})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for k in range(3):
        opt.zero_grad()
        loss = step(model, inputs, targets, loss_fn)
        if k == 0:
            ref["loss"] = torch.tensor(loss, dtype=torch.float64)
            ref.update({f"grad.{n}": p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    ref.update({f"step3.{n}": t.detach().clone() for n, t in model.state_dict().items()})
    return ref


def rewrite(src, dst, edit):
    """Copies archive `src` to `dst`, passing models/model.json through `edit`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("models/model.json"):
                data = json.dumps(edit(json.loads(data))).encode()
            zout.writestr(item, data)


def bad_inputs(out, mlp_path):
    data = open(mlp_path, "rb").read()
    with open(os.path.join(out, "truncated.pt2"), "wb") as f:
        f.write(data[: len(data) // 2])
    torch.jit.save(torch.jit.script(Mlp().double()), os.path.join(out, "foreign.pt2"))

    def future(program):
        program["schema_version"]["major"] = 99
        return program

    rewrite(mlp_path, os.path.join(out, "future.pt2"), future)

    @torch.library.custom_op("conveyor_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class CustomOp(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return twice(self.lin(x))

    torch.export.save(export(CustomOp().double(), (torch.randn(3, 4, dtype=torch.float64),)),
                      os.path.join(out, "custom_op.pt2"))
    torch.export.save(export(Mlp().double(), (torch.randn(8, 12, dtype=torch.float64),), dynamic=False),
                      os.path.join(out, "static_batch.pt2"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    for name, model, inputs, targets, loss_fn in cases():
        model = model.double().train()
        inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
        targets = tuple(t.double() if t.is_floating_point() else t for t in targets)
        program = export(model, inputs)
        path = os.path.join(args.out, name + ".pt2")
        torch.export.save(program, path)
        # The reference trains a copy of the weights the program holds.
        torch.save(reference(model, inputs, targets, loss_fn), os.path.join(args.out, name + ".ref.pt"))
    bad_inputs(args.out, os.path.join(args.out, "mlp.pt2"))
    print("wrote", len(os.listdir(args.out)), "files to", args.out)


if __name__ == "__main__":
    main()
