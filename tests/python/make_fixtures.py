"""Writes the TorchScript fixtures the C++ tests load (python make_fixtures.py OUTDIR).

Made at test time so that no binary lives in the repository. All models are
float64 so the tests can compare gradients to 1e-10.

  mlp.pt          scripted; forward is a chain stem -> encoder -> act -> head,
                  encoder itself a chain layer1 -> act -> layer2
  lstm_lm.pt      scripted; embed -> rnn1 -> rnn2 -> proj, each rnn a wrapper
                  module around nn.LSTM that returns the output only
  lstm_mix.pt     scripted; embed -> deep (2-layer LSTM) -> both (bidirectional)
                  -> projected (proj_size 6) -> head: one LSTM the fused op
                  runs and two it cannot
  lstm_traced.pt  lstm_lm.pt's model traced (aten::lstm with constant arguments)
  resnet.pt       traced; stem -> block1 -> block2 -> head, residual adds
                  inside the blocks
  nonchain.pt     scripted; a residual add at the top level (no chain)
  dropout_mlp.pt  scripted chain with dropout in its first half
  two_input.pt    scripted; forward(x, mask): the mask is read in every stage
  seq2seq.pt      scripted LSTM encoder-decoder with attention; forward(src,
                  tgt): both decoder attention layers read the encoder's output
  resnet_scripted.pt  resnet.pt's model scripted (cut inside a block)
  non_tensor_cut.pt   scripted; an int made in stage 0 is used in stage 1
  list_cut.pt     scripted; a list of ints made in stage 0 is used in stage 1
  tied_lm.pt      scripted LSTM language model whose projection is the
                  embedding's weight (self.proj.weight = self.embed.weight)
  shared_call.pt  scripted; one Linear called before and after another
  tied_head_lm.pt scripted LSTM language model whose output is
                  F.linear(h, self.embed.weight): one attribute, two stages
  looped_transformer.pt, direct_rnn.pt, overloaded_blocks.pt
                  scripted models of cut_models.py: a ModuleList looped in
                  forward(x, mask), nn.LSTM and nn.GRU called directly,
                  overloaded forwards
  corrupt.pt      mlp.pt cut in half
  not_script.pt   torch.save of a dict of tensors
"""
import argparse
import os
import warnings

import torch
from torch import nn

from cut_models import save_cut_fixtures


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(16, 16)
        self.act = nn.Tanh()
        self.layer2 = nn.Linear(16, 16)

    def forward(self, x):
        x = self.layer1(x)
        x = self.act(x)
        return self.layer2(x)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.encoder = Encoder()
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = self.stem(x)
        x = self.encoder(x)
        x = self.act(x)
        return self.head(x)


class LstmOutput(nn.Module):
    def __init__(self, inputs, hidden, **options):
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, batch_first=True, **options)

    def forward(self, x):
        out, _ = self.lstm(x)
        return out


class LstmLm(nn.Module):
    def __init__(self, vocab=40):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.rnn1 = LstmOutput(8, 12)
        self.rnn2 = LstmOutput(12, 12)
        self.proj = nn.Linear(12, vocab)

    def forward(self, tokens):
        return self.proj(self.rnn2(self.rnn1(self.embed(tokens))))


class LstmMix(nn.Module):
    def __init__(self, vocab=40):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.deep = LstmOutput(8, 12, num_layers=2)
        self.both = LstmOutput(12, 5, bidirectional=True)
        self.projected = LstmOutput(10, 9, proj_size=6)
        self.head = nn.Linear(6, vocab)

    def forward(self, tokens):
        return self.head(self.projected(self.both(self.deep(self.embed(tokens)))))


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(x.mean(dim=(2, 3)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = Stem()
        self.block1 = Block(6)
        self.block2 = Block(6)
        self.head = Head()

    def forward(self, x):
        return self.head(self.block2(self.block1(self.stem(x))))


class NonChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x):
        x = self.a(x)
        y = self.b(x)
        return self.c(torch.tanh(x + y))


class DropoutMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.3)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(self.act(self.drop(self.fc1(x))))


class TwoInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x, mask):
        h = torch.tanh(self.a(x)) * mask
        h = torch.tanh(self.b(h)) * mask + x
        return self.c(h)


class Attention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.out = nn.Linear(2 * hidden, hidden)

    def forward(self, h, memory):
        weights = torch.softmax(torch.bmm(h, memory.transpose(1, 2)), dim=-1)
        return torch.tanh(self.out(torch.cat([h, torch.bmm(weights, memory)], dim=-1)))


class Seq2Seq(nn.Module):
    def __init__(self, vocab=30, hidden=10):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, hidden)
        self.encoder = LstmOutput(hidden, hidden)
        self.tgt_embed = nn.Embedding(vocab, hidden)
        self.dec1 = LstmOutput(hidden, hidden)
        self.attn1 = Attention(hidden)
        self.dec2 = LstmOutput(hidden, hidden)
        self.attn2 = Attention(hidden)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, src, tgt):
        memory = self.encoder(self.src_embed(src))
        h = self.attn1(self.dec1(self.tgt_embed(tgt)), memory)
        h = self.attn2(self.dec2(h), memory)
        return self.proj(h)


class NonTensorCut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        n: int = x.size(1) // 2
        h = self.a(x)
        return self.b(h)[:, :n]


class ListCut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        shape = x.size()
        h = self.a(x)
        return self.b(h).reshape(shape)


class TiedLm(LstmLm):
    def __init__(self, vocab=40):
        super().__init__(vocab)
        self.embed = nn.Embedding(vocab, 12)
        self.rnn1 = LstmOutput(12, 12)
        self.proj = nn.Linear(12, vocab, bias=False)
        self.proj.weight = self.embed.weight


class SharedCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.mid = nn.Linear(8, 8)

    def forward(self, x):
        return self.shared(torch.tanh(self.mid(self.shared(x))))


class TiedHeadLm(nn.Module):
    def __init__(self, vocab=40):
        super().__init__()
        self.embed = nn.Embedding(vocab, 12)
        self.rnn1 = LstmOutput(12, 12)
        self.rnn2 = LstmOutput(12, 12)

    def forward(self, tokens):
        h = self.rnn2(self.rnn1(self.embed(tokens)))
        return torch.nn.functional.linear(h, self.embed.weight)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", help="directory to write the fixtures into (created if missing)")
    out = parser.parse_args().outdir
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)

    def path(name):
        return os.path.join(out, name)

    torch.jit.save(torch.jit.script(Mlp().double()), path("mlp.pt"))
    torch.jit.save(torch.jit.script(LstmLm().double()), path("lstm_lm.pt"))
    torch.jit.save(torch.jit.script(LstmMix().double()), path("lstm_mix.pt"))
    torch.jit.save(torch.jit.trace(LstmLm().double(), torch.randint(40, (3, 4))), path("lstm_traced.pt"))
    resnet = ResNet().double()
    torch.jit.save(torch.jit.trace(resnet, torch.randn(2, 3, 8, 8, dtype=torch.float64)), path("resnet.pt"))
    torch.jit.save(torch.jit.script(NonChain().double()), path("nonchain.pt"))
    torch.jit.save(torch.jit.script(DropoutMlp().double()), path("dropout_mlp.pt"))

    torch.jit.save(torch.jit.script(TwoInput().double()), path("two_input.pt"))
    torch.jit.save(torch.jit.script(Seq2Seq().double()), path("seq2seq.pt"))
    torch.jit.save(torch.jit.script(ResNet().double()), path("resnet_scripted.pt"))
    torch.jit.save(torch.jit.script(NonTensorCut().double()), path("non_tensor_cut.pt"))
    torch.jit.save(torch.jit.script(ListCut().double()), path("list_cut.pt"))
    torch.jit.save(torch.jit.script(TiedLm().double()), path("tied_lm.pt"))
    torch.jit.save(torch.jit.script(TiedHeadLm().double()), path("tied_head_lm.pt"))
    torch.jit.save(torch.jit.script(SharedCall().double()), path("shared_call.pt"))
    save_cut_fixtures(path)

    with open(path("mlp.pt"), "rb") as f:
        data = f.read()
    with open(path("corrupt.pt"), "wb") as f:
        f.write(data[: len(data) // 2])
    torch.save({"weight": torch.randn(3, 3)}, path("not_script.pt"))
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    main()
