"""conveyor.Pipeline from Python with several workers on one GPU and the fused
ops (an LSTM language model whose nn.LSTMs fused_ops swaps, and a small
transformer that calls torch.ops.conveyor.fused_attention), as
tests/device_pipeline_checks.h does it from C++:

  exact     under gpipe, 1f1b, interleaved and zb-h1, float64 gradients and
            loss equal eager PyTorch's on the same device within 1e-10;
  5 steps   a torch.optim.Adam the caller steps right after each train_step,
            with no synchronisation (and pipedream with the pipeline's own
            Adam) leaves the weights of the same run on the CPU (1e-9),
            repeated to catch races;
  the module's own parameters  an AdamW over model.parameters(), made
            before the pipeline, steps the stages on their device: 3 steps
            equal eager's within 1e-10.

Run it with CONVEYOR_FUSED_DISPATCH=fused, so that the fused kernels run
wherever they can (the dispatch table would send most calls to cuDNN and SDPA). Without CUDA it
runs on the CPU (so that it cannot rot between GPU runs);
with --require-cuda a missing device fails. Prints a line per check and
PASS or FAIL last; exit status 1 on failure. Run by scripts/gpu.sh on the GPU
machine, and by ctest (python_device_pipeline) everywhere.
"""
import argparse
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import conveyor

VOCAB = 40
failures = []


class LstmLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.lstm1 = nn.LSTM(8, 12, batch_first=True)
        self.lstm2 = nn.LSTM(12, 12, batch_first=True)
        self.out = nn.Linear(12, VOCAB)

    def forward(self, x):
        h, _ = self.lstm1(self.embed(x))
        h, _ = self.lstm2(h)
        return self.out(h)


class Block(nn.Module):
    """A pre-norm transformer block whose attention is Conveyor's fused op."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, h):
        n, s, d = h.shape
        qkv = self.qkv(self.norm1(h)).view(n, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.ops.conveyor.fused_attention(q, k, v, None, True, None)  # causal, [N, heads, S, d / heads]
        h = h + self.proj(a.transpose(1, 2).reshape(n, s, d))
        return h + self.ff(self.norm2(h))


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


MODELS = {"lstm": (LstmLM, ["lstm1", "lstm2", "out"]),
          "transformer": (TinyTransformer, ["layers.0", "layers.1", "layers.2"])}


def loss_fn(out, target):
    return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB, (8, 7), generator=g), torch.randint(VOCAB, (8, 7), generator=g)


def check(ok, what):
    print(f"  {'ok    ' if ok else 'FAILED'} {what}", flush=True)
    if not ok:
        failures.append(what)


def max_diff(a, b):
    return max((x.detach().cpu() - y.detach().cpu()).abs().max().item() for x, y in zip(a, b))


def pipeline(model, device, split_points, workers, schedule, **kw):
    return conveyor.Pipeline(model, split_points=split_points, workers=workers, microbatches=4, schedule=schedule,
                             devices=[str(device)], fused_ops=True, loss_fn=loss_fn, **kw)


def exact(name, device):
    make, points = MODELS[name]
    x, y = batch(1)
    x, y = x.to(device), y.to(device)
    for schedule in ["gpipe", "1f1b", "interleaved", "zb-h1"]:
        for workers in ([2] if schedule == "interleaved" else [2, 3, 4]):
            split = points if schedule == "interleaved" else points[:workers - 1]
            torch.manual_seed(30 + workers)
            eager = make().double().to(device)
            pipe = pipeline(copy.deepcopy(eager), device, split, workers, schedule)
            want = loss_fn(eager(x), y)
            want.backward()
            got = pipe.train_step(x, y).loss
            grads = dict(eager.named_parameters())
            diff = max((p.grad.cpu() - grads[n].grad.cpu()).abs().max().item() for n, p in pipe.named_parameters())
            check(diff <= 1e-10 and abs(got - want.item()) <= 1e-10,
                  f"{name} {schedule} K={workers} on {device}: gradients within {diff:.1e} of eager")


def five_steps(name, device, schedule, workers):
    make, points = MODELS[name]
    torch.manual_seed(40)
    model = make().double().to(device)
    asynchronous = schedule == "pipedream"
    kw = {"optimizer": "adam", "lr": 1e-3} if asynchronous else {}
    pipe = pipeline(model, device, points[:workers - 1], workers, schedule, **kw)
    caller = None
    for step in range(5):
        x, y = batch(10 + step)
        pipe.train_step(x.to(device), y.to(device))  # the first step builds the pipeline
        if not asynchronous:
            caller = caller or torch.optim.Adam(pipe.parameters(), lr=1e-3)
            caller.step()  # right away: no torch.cuda.synchronize()
            caller.zero_grad()
    return [p for _, p in pipe.named_parameters()]


def steps_match_cpu(name, device, repeats):
    for schedule, workers in [("1f1b", 3), ("zb-h1", 2), ("pipedream", 3)]:
        want = five_steps(name, torch.device("cpu"), schedule, workers)
        for r in range(repeats):
            diff = max_diff(five_steps(name, device, schedule, workers), want)
            check(diff <= 1e-9, f"{name} {schedule} K={workers} on {device}, 5 steps with the caller's Adam, run {r}: "
                                f"weights within {diff:.1e} of the CPU's")


def module_optimizer(device):
    """An optimizer over model.parameters(), made before the pipeline as
    tutorials make it, trains the stages on their devices: the pipeline
    moves the module's own parameters there in place."""
    make, points = MODELS["lstm"]
    torch.manual_seed(50)
    model = make().double()
    eager = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    pipe = conveyor.Pipeline(model, split_points=points[:1], workers=2, microbatches=4, schedule="1f1b",
                             devices=[str(device), str(device)], loss_fn=loss_fn)
    for step in range(3):
        x, y = batch(20 + step)
        x, y = x.to(device), y.to(device)
        pipe.train_step(x, y)
        loss_fn(eager(x), y).backward()
        opt.step(), ref.step(), opt.zero_grad(), ref.zero_grad()
    own = dict(model.named_parameters())
    same = all(p is own[n] and p.device == device for n, p in pipe.named_parameters())
    diff = max((own[n].detach().cpu() - p.detach().cpu()).abs().max().item() for n, p in eager.named_parameters())
    check(same and diff <= 1e-10, f"lstm K=2 on {device}, 3 AdamW steps over model.parameters(): the module's own "
                                  f"parameters on the device, within {diff:.1e} of eager")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-cuda", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
    elif args.require_cuda:
        print("FAIL: --require-cuda but torch sees no CUDA device")
        return 1
    else:
        device = torch.device("cpu")
    print(f"conveyor {conveyor.__version__}, torch {torch.__version__}, device {device}", flush=True)
    for name in MODELS:
        exact(name, device)
        steps_match_cpu(name, device, args.repeats)
    module_optimizer(device)
    print(f"FAIL: {len(failures)} checks failed" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
