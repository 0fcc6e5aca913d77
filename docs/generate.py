"""Writes what the manual shows but does not keep in git, into docs/_generated/:
every schedule drawn by the library, the option reference from the options'
declarations, the C++ headers' pages from cmake/public_headers.cmake, the
results pages from benchmarks/, and one real run of the demo (its planner
report, its last step predicted above measured, its Chrome trace).

  python docs/generate.py BUILD_DIR      (scripts/docs.sh runs it)
"""
import pathlib
import re
import shutil
import subprocess
import sys

import conveyor
from conveyor import _C

from decision_picture import decision_svg

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
OUT = DOCS / "_generated"
# The pictures' shape: enough workers and micro-batches to show a schedule's
# warm-up, steady state and drain; interleaved needs M a multiple of K, dualpipev M >= 2K.
WORKERS, MICROBATCHES = 4, 8


def schedules():
    folder = OUT / "schedules"
    folder.mkdir(parents=True)
    lines = []
    for name in _C.schedule_names():
        (folder / f"{name}.svg").write_text(conveyor.schedule_svg(name, WORKERS, MICROBATCHES))
        lines += [f"# {name}", "", f"![{name} on {WORKERS} workers](../_generated/schedules/{name}.svg)", ""]
    (OUT / "schedule_gallery.md").write_text("\n".join(lines))
    # The front page's picture: the README shows the same, committed as docs/schedules.svg.
    (folder / "1f1b-zb-v.svg").write_text(conveyor.schedule_svg(["1f1b", "zb-v"], WORKERS, MICROBATCHES))
    # The distributed guide's: where ZeRO-3 gathers and reduces in the same two.
    (folder / "sharded.svg").write_text(
        conveyor.schedule_svg(["1f1b", "zb-v"], WORKERS, MICROBATCHES, shard="parameters"))
    # The schedules guide's decision picture, with the schedules it leads to drawn in it.
    (folder / "choose.svg").write_text(decision_svg())


def options():
    (OUT / "options.md").write_text(_C.options_reference())


def public_headers():
    """cmake/public_headers.cmake's list (the installed headers), then schedules/ and ops/."""
    text = (ROOT / "cmake" / "public_headers.cmake").read_text()
    lists = dict(re.findall(r"set\((CONVEYOR_\w+)\s+([^)]*)\)", text))
    headers = []
    for item in lists["CONVEYOR_PUBLIC_HEADERS"].split():
        ref = re.fullmatch(r"\$\{(\w+)\}", item)
        headers += lists[ref.group(1)].split() if ref else [item]
    headers += sorted(str(p.relative_to(ROOT)) for d in ("schedules", "ops") for p in (ROOT / d).rglob("*.h")
                      if "host_emulation" not in p.parts)
    return headers


def summary(header):
    """The header's first comment sentence (or line), as plain text for a table cell."""
    comment = []
    for line in (ROOT / header).read_text().splitlines()[1:]:
        if not line.startswith("//"):
            if comment:
                break
            continue
        comment.append(line[2:].strip())
    text = " ".join(comment)
    sentence = re.split(r"(?<=[.:;])\s", text, maxsplit=1)[0] if text else ""
    return sentence.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def cpp_reference():
    """A page per header; the table and its toctree are included into
    docs/reference/cpp.md, so their paths are relative to that page."""
    folder = OUT / "cpp"
    folder.mkdir(parents=True)
    rows = ["| header | what it declares |", "|---|---|"]
    pages = []
    for header in public_headers():
        slug = header.replace("/", "_").removesuffix(".h")
        include = "conveyor/conveyor.h" if header == "plugin/conveyor.h" else f"conveyor/{header}"
        (folder / f"{slug}.md").write_text(
            f"# `<{include}>`\n\n```{{literalinclude}} ../../../{header}\n:language: cpp\n```\n")
        rows.append(f"| [`{header}`](../_generated/cpp/{slug}.md) | {summary(header)} |")
        pages.append(f"../_generated/cpp/{slug}")
    toc = ["", "```{toctree}", ":hidden:", ""] + pages + ["```", ""]
    (OUT / "cpp_headers.md").write_text("\n".join(rows + toc))


def results():
    folder = OUT / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", folder / "results")
    # The index's link to the folder (for a repository's web view) becomes its name: the pages are below.
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text().replace("[results/](results/)", "`results/`")
    names = sorted(p.stem for p in (folder / "results").glob("*.md"))
    toc = ["", "```{toctree}", ":hidden:", ""] + [f"results/{n}" for n in names] + ["```", ""]
    (folder / "index.md").write_text(text + "\n".join(toc))


def demo(build):
    """One short run of the demo: its report, its last step drawn and traced."""
    folder = OUT / "demo"
    folder.mkdir(parents=True)
    binary = build / "examples" / "lm_pipeline"
    command = [str(binary), "--steps", "30", "--eval-every", "0", "--timeline", str(folder / "step.svg"),
               "--trace", str(folder / "step_trace.json")]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    report = run.stdout
    # 30 steps do not beat the unigram baseline, the demo's exit status 1; anything else fails.
    if run.returncode not in (0, 1) or "predicted vs measured" not in report:
        raise SystemExit(f"generate.py: the demo failed ({run.returncode}):\n{report}\n{run.stderr}")
    for name in ("step.svg", "step_trace.json"):
        if not (folder / name).stat().st_size:
            raise SystemExit(f"generate.py: the demo wrote no {name}")
    shown = "lm_pipeline " + " ".join(a if "/" not in a else pathlib.Path(a).name for a in command[1:])
    (folder / "report.txt").write_text(f"$ {shown}\n{report}")


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    build = pathlib.Path(sys.argv[1]).resolve()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    schedules()
    options()
    cpp_reference()
    results()
    demo(build)
    print(f"generate.py: wrote {sum(1 for p in OUT.rglob('*') if p.is_file())} files into {OUT}")


if __name__ == "__main__":
    main()
