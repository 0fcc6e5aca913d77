"""Training a Hugging Face causal language model with a pipeline: a small
Llama (or GPT-2) from transformers, as the library builds it, cut between its
decoder layers into a 1F1B pipeline, trained with torch.optim.AdamW over the
model's own parameters on English text (Debian's 'fortunes', which the
set-up installs; this file's own text where it is absent), byte by byte.
Nothing is downloaded: the weights start random, as a fine-tuning run would
start from a checkpoint (load one with from_pretrained instead; the rest is
the same). Exits 1 unless the loss falls by a third.

  python examples/python/finetune_causal_lm.py [--model llama|gpt2] [--steps 60]
"""
import argparse
import glob
import pathlib
import sys

import torch
import torch.nn.functional as F

import conveyor

SEQUENCE = 64


def text() -> bytes:
    files = sorted(glob.glob("/usr/share/games/fortunes/*"))
    corpus = b"".join(pathlib.Path(f).read_bytes() for f in files if not f.endswith((".dat", ".u8")))
    return corpus[:400_000] if len(corpus) > 10_000 else pathlib.Path(__file__).read_bytes() * 20


def batches(data: torch.Tensor, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(len(data) - SEQUENCE - 1, (batch,), generator=g)
        window = torch.stack([data[s:s + SEQUENCE + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def model_of(kind: str, layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if kind == "gpt2":
        config = GPT2Config(vocab_size=256, n_positions=SEQUENCE, n_embd=128, n_layer=layers, n_head=4,
                            bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(config), [f"transformer.h.{layers // 2}"]
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config), [f"model.layers.{layers // 2}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, split_points = model_of(args.model, args.layers)
    # The model itself: exported at the first step, its logits read by the loss.
    pipe = conveyor.Pipeline(model, split_points=split_points, microbatches=args.microbatches, schedule="1f1b",
                             output="logits", model_kwargs={"use_cache": False},
                             loss_fn=lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten()))
    # No weight decay on norms and biases, by the model's own parameter names.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3)
    data = torch.tensor(list(text()), dtype=torch.long)
    losses = []
    for step, (inputs, target) in zip(range(args.steps), batches(data, args.batch, seed=1)):
        result = pipe.train_step(inputs, target)
        pipe.clip_grad_norm(1.0)
        opt.step()
        opt.zero_grad()
        losses.append(result.loss)
        if step == 0:
            print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
                  f"{pipe.num_stages} stages on {pipe.num_workers} workers, {args.microbatches} micro-batches")
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {result.loss:.3f}  ({result.wall_seconds * 1e3:.0f} ms, bubble {result.bubble:.0%})")
    # The trained weights are the model's: generate a few bytes with it, eagerly.
    model.eval()
    prompt = torch.tensor([list(b"The ")])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    print("greedy continuation:", bytes(out[0].tolist()).decode("utf-8", "replace"))
    if not losses[-1] < losses[0] * 2 / 3:
        sys.exit(f"the loss did not fall by a third: {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"PASS: loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
