"""The training options on the examples (benchmarks/results/training_options.md).

The translator and BERT trained with and without bf16 autocast and with and
without clipping by global norm, side by side in one run: loss (and BLEU),
throughput and the bytes that crossed the stage boundaries. Then the step-time
ratio bf16 / fp32: the median of alternated short translator runs. Logs go to
build/training-options/.

    .venv/bin/python benchmarks/training_options.py            # about 30 minutes on 2 cores
    .venv/bin/python benchmarks/training_options.py --steps 300 --rounds 3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def count(text):
    """A number as format_count prints it: 114, 2.04k, 1.3M."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}
    text = text.replace(",", "")
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def run(cmd, log):
    with open(log, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    with open(log) as f:
        return f.read()


def find(pattern, text, default="?"):
    m = re.search(pattern, text)
    return m.group(1) if m else default


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("CONVEYOR_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-bert", action="store_true")
    a = ap.parse_args()
    out = os.path.join(a.build, "training-options")
    os.makedirs(out, exist_ok=True)
    translator = os.path.join(a.build, "examples", "translator")
    bert = os.path.join(a.build, "examples", "bert_pipeline")

    print(f"## translator: 2 stages, 1f1b, {a.steps} steps, Adam, batches of up to 64 pairs\n")
    print("| autocast | clip | train loss, first step -> last 50 | BLEU | target tokens/s | bytes across the boundary, last step |")
    print("|---|---|---|---|---|---|")
    for autocast in ("none", "bf16"):
        for clip in ("0", "1"):
            name = f"translator-{autocast}-clip{clip}"
            text = run([translator, "--stages", "2", "--schedule", "1f1b", "--steps", str(a.steps), "--autocast",
                        autocast, "--clip", clip, "--out-dir", os.path.join(out, name), "--require-bleu", "off",
                        "--require-drop", "0"], os.path.join(out, name + ".log"))
            loss = find(r"train loss ([0-9.]+ at the first step -> [0-9.]+)", text).replace(" at the first step", "")
            print(f"| {autocast} | {clip} | {loss} | {find(r'model ([0-9.]+)', text)} | "
                  f"{find(r'([0-9.,kM]+) target tokens/s', text)} | {find(r'([0-9.,kMG]+) bytes across', text)} |",
                  flush=True)

    print(f"\n## translator throughput, bf16 against fp32: {a.rounds} alternated rounds of 100 steps (no BLEU)\n")
    ratios = []
    for r in range(a.rounds):
        rate = {}
        for autocast in ("none", "bf16"):
            text = run([translator, "--stages", "2", "--schedule", "1f1b", "--steps", "100", "--autocast", autocast,
                        "--bleu", "off", "--eval-every", "0", "--require-drop", "0",
                        "--out-dir", os.path.join(out, "speed")], os.path.join(out, f"speed-{autocast}-{r}.log"))
            rate[autocast] = count(find(r"([0-9.,kM]+) target tokens/s", text, "nan"))
        ratios.append(rate["none"] / rate["bf16"])
        print(f"round {r + 1}: fp32 {rate['none']:.0f}, bf16 {rate['bf16']:.0f} target tokens/s; "
              f"step time bf16 / fp32 {ratios[-1]:.3f}", flush=True)
    print(f"\nmedian step-time ratio bf16 / fp32: {statistics.median(ratios):.3f}")

    if a.skip_bert:
        return
    print("\n## BERT: 3 stages, 1f1b, 1 epoch\n")
    print("| autocast | clip | epoch 1 | test |")
    print("|---|---|---|---|")
    for autocast in ("none", "bf16"):
        for clip in ("0", "1"):
            name = f"bert-{autocast}-clip{clip}"
            text = run([bert, "--stages", "3", "--schedule", "1f1b", "--autocast", autocast, "--clip", clip,
                        "--require-drop", "0"], os.path.join(out, name + ".log"))
            epoch = find(r"epoch 1: (.*)", text, text.strip().splitlines()[-1] if text.strip() else "?")
            print(f"| {autocast} | {clip} | {epoch} | {find(r'test (masked-LM loss .*?);', text)} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
