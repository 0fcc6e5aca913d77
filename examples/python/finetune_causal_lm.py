"""Recipe: a Hugging Face causal language model pipelined over 4 devices.

A small Llama (or GPT-2) from transformers, as the library builds it, cut
between its decoder layers into 4 stages on 4 devices, trained under 1F1B
with torch.optim.AdamW on English text (Debian's 'fortunes', which the set-up
installs; this file's own text where it is absent), byte by byte; saved to a
checkpoint with the optimizer's state, resumed from it when run again, and
evaluated on text it never trained on. Nothing is downloaded: the weights
start random (from_pretrained loads real ones; the rest is the same). Exits 1
unless the held-out loss ends below two thirds of a random model's (ln 256).

One process, each stage on its own device (4 GPUs; on fewer, the stages share
them; without one, 4 CPU workers):
  python examples/python/finetune_causal_lm.py --steps 30 --checkpoint run/
  python examples/python/finetune_causal_lm.py --steps 60 --checkpoint run/   # resumes at step 30
One process per stage (GPU LOCAL_RANK where every process has one, else the CPU):
  torchrun --nproc-per-node=4 examples/python/finetune_causal_lm.py --steps 30 --checkpoint run/
"""
import argparse
import glob
import math
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import conveyor

SEQUENCE = 64
STAGES = 4


def text() -> bytes:
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if os.path.isfile(f))
    corpus = b"".join(pathlib.Path(f).read_bytes() for f in files if not f.endswith((".dat", ".u8")))
    return corpus[:400_000] if len(corpus) > 10_000 else pathlib.Path(__file__).read_bytes() * 20


def batch(data: torch.Tensor, size: int, seed: int):
    starts = torch.randint(len(data) - SEQUENCE - 1, (size,), generator=torch.Generator().manual_seed(seed))
    window = torch.stack([data[s:s + SEQUENCE + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


def model_of(kind: str, layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if kind == "gpt2":
        # No dropout: random draws in 4 stages at once would not repeat, nor resume exactly
        # (stage_rng=True gives each stage its own streams, at the cost of taking turns).
        config = GPT2Config(vocab_size=256, n_positions=SEQUENCE, n_embd=128, n_layer=layers, n_head=4,
                            bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(config), "transformer.h"
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config), "model.layers"


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (at least 4: one a stage)")
    parser.add_argument("--steps", type=int, default=60, help="train until this step")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--checkpoint", help="a folder: resume from its checkpoint if any, save to it at the end")
    args = parser.parse_args()
    across_processes = "WORLD_SIZE" in os.environ  # under torchrun
    rank, world = 0, 1
    # Across processes each drives GPU LOCAL_RANK: only with a GPU for every process on this machine.
    gpus = torch.cuda.device_count()
    on_gpus = gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if across_processes else gpus > 0
    if across_processes:
        dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpus else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same model in every process
    model, stack = model_of(args.model, args.layers)
    # Split points name submodules: print(model) or model.named_modules() shows them. Without them only
    # the top-level children would be cut between.
    split_points = [f"{stack}.{args.layers * k // STAGES}" for k in range(1, STAGES)]
    if across_processes:  # one stage a process: its own GPU (cuda:LOCAL_RANK) or the CPU
        placement = dict(process_group=dist.group.WORLD, devices="cuda" if on_gpus else "cpu")
    else:  # 4 GPUs: one a stage; fewer: shared in turn; none: 4 CPU workers
        placement = dict(devices=[f"cuda:{k % gpus}" if gpus else "cpu" for k in range(STAGES)])
    data = torch.tensor(list(text()), dtype=torch.long)
    data, held_out = data[:-20_000], batch(data[-20_000:], args.batch, seed=0)  # the last 20 kB never trains
    pipe = conveyor.Pipeline(model, split_points=split_points, microbatches=args.microbatches, schedule="1f1b",
                             output="logits", model_kwargs={"use_cache": False}, loss_fn=loss_fn,
                             example_inputs=held_out[0], **placement)
    # The pipeline's parameters are the model's own (on their stages' devices; across processes, this
    # process's stage's): no weight decay on norms and biases, chosen by the model's names.
    named = list(pipe.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0}], lr=3e-3)

    # Each process writes its own files (across processes, its stage's), named for the layout; the
    # processes resume together, from the same step.
    folder = args.checkpoint or "."
    files = [os.path.join(folder, f"{what}.{rank}-of-{world}.{ending}") for what, ending in
             (("pipeline", "ckpt"), ("adamw", "pt"))]
    start = 0
    if args.checkpoint and os.path.exists(files[0]):
        start = pipe.load_checkpoint(files[0])
        opt.load_state_dict(torch.load(files[1], map_location="cpu"))  # moved to each parameter's device
    if across_processes:
        steps = torch.tensor([start, -start])
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
        if steps[0] != -steps[1]:
            sys.exit(f"rank {rank}: the processes' checkpoints in {folder} are of different steps")
    if start and rank == 0:
        print(f"resumed at step {start} from {args.checkpoint}")

    def evaluate():
        """The held-out loss where the output is (across processes, on the last stage's process), else None."""
        pipe.eval()
        logits = pipe(held_out[0])  # inference: no autograd graph
        pipe.train()
        return None if logits is None else loss_fn(logits, held_out[1].to(logits.device)).item()

    before = evaluate()
    if rank == 0:
        print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {pipe.num_stages} "
              f"stages ({', '.join(split_points)} begin one) on {placement['devices']}")
    for step in range(start, args.steps):
        result = pipe.train_step(*batch(data, args.batch, seed=step))
        pipe.clip_grad_norm(1.0)
        opt.step()
        opt.zero_grad()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {result.loss:.3f}  ({result.wall_seconds * 1e3:.0f} ms, bubble "
                  f"{result.bubble:.0%})")
    if args.checkpoint:
        os.makedirs(args.checkpoint, exist_ok=True)
        pipe.save_checkpoint(files[0], step=max(start, args.steps))
        torch.save(opt.state_dict(), files[1])
    final = evaluate()
    if across_processes:
        dist.destroy_process_group()
    if final is None:
        return  # another process holds the output
    print(f"held-out loss {before:.3f} -> {final:.3f}")
    if not final < math.log(256) * 2 / 3:
        sys.exit(f"the held-out loss did not fall below two thirds of a random model's: {final:.3f}")
    print(f"PASS: held-out loss {final:.6f}")


if __name__ == "__main__":
    main()
