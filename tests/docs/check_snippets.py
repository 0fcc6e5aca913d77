"""Checks every fenced code block of the README and the manual (docs/), so
that a stale example fails the tests:

  python   run: each page's blocks in order, in one namespace, in a scratch
           folder (a block of the README is instead a verbatim copy of an
           example file, checked by the readme_quotes_* tests, which run it);
  bash     each command's script or program exists, and every --flag it
           passes is one that program's source defines; every VARIABLE= is
           one the sources read;
  text     a schedule's text is what the library prints for it; a tree of
           the source layout names only paths that exist;
  cpp      compiled and run by test_doc_snippets (extract_cpp.py), not here;
  others   refused: a block must say its language, and a language nothing
           checks has no place in the manual.

It also checks that the README's picture, docs/schedules.svg, is what the
library draws now, and that the checkpoint guide's table of what each side
saves names only functions the C++ headers declare and methods the Python
package has, that the guides stay within their words, and that their prose
reads (prose_lint.py: no sentence over 40 words, no bullet over 8 lines).
  python tests/docs/check_snippets.py      (ctest: docs_snippets)
"""
import itertools
import os
import pathlib
import re
import shlex
import sys
import tempfile
import traceback

import torch

import conveyor
from doc_blocks import ROOT, every_block
import prose_lint

# Where the flags of a program that a command names are defined.
PROGRAM_SOURCES = {
    "scripts/demo.sh": ["scripts/demo.sh", "examples/language_model/lm_pipeline.cpp"],
    "build/examples/lm_pipeline": ["examples/language_model/lm_pipeline.cpp"],
    "build/examples/distributed_train": ["examples/distributed"],
    "build/examples/translator": ["examples/translator"],
    "build/examples/bert_pipeline": ["examples/bert"],
    "build/examples/train_script": ["examples/torchscript/train_script.cpp"],
    "build/benchmarks/bench_fused_lstm": ["benchmarks/bench_fused_lstm.cpp"],
    "build/benchmarks/bench_fused_attention": ["benchmarks/bench_fused_attention.cpp"],
}
# Folders whose sources may read an environment variable a command sets.
VARIABLE_SOURCES = ["plugin", "ops", "scripts", "examples"]


def source_text(paths):
    text = []
    for p in paths:
        p = ROOT / p
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.suffix in (".cpp", ".h", ".sh", ".py"))
        text += [f.read_text(errors="replace") for f in files]
    return "\n".join(text)


def check_python(blocks):
    """Each page's blocks run in order in one namespace."""
    failures = []
    by_page = {}
    for b in blocks:
        by_page.setdefault(b.page, []).append(b)
    for page, page_blocks in by_page.items():
        if page == pathlib.Path("README.md"):
            continue  # quotes of example files: readme_quotes_* and the examples' own tests
        namespace = {"__name__": f"docs:{page}"}
        with tempfile.TemporaryDirectory() as scratch:
            here = os.getcwd()
            os.chdir(scratch)
            try:
                for b in page_blocks:
                    # In a file of its own, whose name says where the block is: torch.jit.script
                    # and inspect read a class's source from it.
                    source = pathlib.Path(scratch) / (re.sub(r"\W", "_", f"{page}_line{b.line}") + ".py")
                    source.write_text(b.code)
                    try:
                        exec(compile(b.code, str(source), "exec"), namespace)
                    except Exception:
                        failures.append(f"{page}:{b.line}: the block raised:\n{traceback.format_exc(limit=3)}")
                        break
            finally:
                os.chdir(here)
    return failures


def commands(code):
    """The shell commands of a block: lines joined at a trailing backslash, comments dropped."""
    joined = code.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s(?:&&|\|\||;)\s", line):
            words = shlex.split(part, comments=True)
            if words:
                yield words


def check_shell(block):
    failures = []
    where = f"{block.page}:{block.line}"
    for words in commands(block.code):
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VARIABLE=value
            name = words.pop(0).split("=")[0]
            if name not in source_text(VARIABLE_SOURCES):
                failures.append(f"{where}: no source reads the variable {name}")
        if not words:
            continue
        program = None
        for w in words:
            if re.search(r"\.(sh|py)$", w) or w.startswith(("build/examples/", "build/benchmarks/")):
                program = w
                break
        if program is None:
            continue  # a tool of the system's (cmake, pip, torchrun with --no-python ...) or the user's program
        if program.startswith("build/"):
            if program not in PROGRAM_SOURCES:
                failures.append(f"{where}: {program}: the docs tests do not know its source (PROGRAM_SOURCES)")
                continue
        elif not (ROOT / program).is_file():
            failures.append(f"{where}: {program} does not exist")
            continue
        sources = source_text(PROGRAM_SOURCES.get(program, [program]))
        after = words[words.index(program) + 1:]
        for w in after:
            flag = w.split("=")[0]
            if flag.startswith("--") and len(flag) > 2 and f'"{flag}' not in sources and f"{flag})" not in sources \
                    and f"{flag}=" not in sources and f"'{flag}" not in sources and f"{flag} " not in sources:
                failures.append(f"{where}: {program} defines no flag {flag}")
    return failures


def check_text(block):
    where = f"{block.page}:{block.line}"
    first = block.code.splitlines()[0] if block.code.strip() else ""
    m = re.fullmatch(r"# schedule (\S+) stages=(\d+) microbatches=(\d+)", first)
    if m:
        printed = torch.ops.conveyor.schedule(m[1], int(m[2]), int(m[3]))
        return [] if printed.strip() == block.code.strip() else [
            f"{where}: the schedule's text is not what the library prints:\n{printed}"]
    if first.startswith("CMakeLists.txt"):
        return check_tree(block, where)
    return [f"{where}: a text block that nothing checks (a schedule's text or the layout tree only)"]


def check_tree(block, where):
    """A line that starts at column 0 or 2 names a path first (at 2, under the last top-level folder)."""
    failures, top = [], None
    for line in block.code.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 2:
            continue
        name = line.split()[0]
        path = ROOT / name if indent == 0 else ROOT / (top or "") / name
        if not path.exists():
            failures.append(f"{where}: the tree names {path.relative_to(ROOT)}, which does not exist")
        if indent == 0:
            top = line.split()[0] if line.split()[0].endswith("/") else top
    return failures


def check_picture():
    committed = (ROOT / "docs" / "schedules.svg").read_text()
    drawn = conveyor.schedule_svg(["1f1b", "zb-v"], workers=4, microbatches=8)
    return [] if committed == drawn else [
        "docs/schedules.svg is not what the library draws: python -c \"import conveyor; "
        "open('docs/schedules.svg', 'w').write(conveyor.schedule_svg(['1f1b', 'zb-v'], 4, 8))\""]


def check_checkpoint_table():
    """docs/guides/checkpoints.md's "What each side saves": | what | C++ | Python |."""
    page = ROOT / "docs" / "guides" / "checkpoints.md"
    where = f"{page.relative_to(ROOT)}: the table of what each side saves"
    lines = page.read_text().split("## What each side saves", 1)[-1].splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table[2:]]  # below the rule
    if len(rows) < 3 or any(len(r) != 3 for r in rows):
        return [f"{where} is missing, has fewer than 3 rows, or rows without 3 cells"]
    # The declarations, not the comments that may still name a function that is gone.
    headers = "\n".join(line for f in sorted((ROOT / "plugin" / "checkpoint").glob("*.h"))
                        for line in f.read_text().splitlines() if not line.lstrip().startswith("//"))
    owners = {"pipe": conveyor.Pipeline, "optimizer": torch.optim.Optimizer, "torch": torch}
    failures = []
    for what, cpp, python in rows:
        for name in re.findall(r"`([^`]+)`", cpp):
            owner, _, member = name.rpartition("::")
            declared = re.search(rf"struct {re.escape(owner)}\b[^}}]*\b{re.escape(member)}\b", headers) if owner \
                else re.search(rf"\b{re.escape(name)}\(", headers)
            if not declared:
                failures.append(f"{where}: {what}: plugin/checkpoint/ declares no {name}")
        for code in re.findall(r"`([^`]+)`", python):
            calls = [("pipe", code)] if re.fullmatch(r"\w+", code) else re.findall(r"(\w+)\.(\w+)", code)
            if not calls:
                failures.append(f"{where}: {what}: nothing checks `{code}`")
            for obj, method in calls:
                if obj not in owners or not hasattr(owners[obj], method):
                    failures.append(f"{where}: {what}: {obj} has no {method}")
    return failures


# The guides are read first and whole: a new page makes room in the others.
GUIDE_WORDS = 13000


def check_guide_words():
    words = sum(len(p.read_text().split()) for p in (ROOT / "docs" / "guides").glob("*.md"))
    return [] if words <= GUIDE_WORDS else [
        f"docs/guides/ holds {words} words, over its {GUIDE_WORDS}: make room before adding"]


def main():
    blocks = every_block()
    failures = check_picture() + check_checkpoint_table() + check_guide_words()
    failures += [f for page in prose_lint.guides() for f in prose_lint.problems(page)]
    counts = {}
    for b in blocks:
        counts[b.language] = counts.get(b.language, 0) + 1
        if b.language in ("bash", "sh", "console"):
            failures += check_shell(b)
        elif b.language == "text":
            failures += check_text(b)
        elif b.language not in ("python", "cpp") and not b.language.startswith("{"):
            failures.append(f"{b.page}:{b.line}: a block in '{b.language or 'no language'}', which nothing checks")
    failures += check_python([b for b in blocks if b.language == "python"])
    print("check_snippets.py: " + ", ".join(f"{n} {lang or 'plain'}" for lang, n in sorted(counts.items())) +
          f" blocks in {len({b.page for b in blocks})} pages")
    if failures:
        print("\n".join(failures))
        sys.exit(f"check_snippets.py: {len(failures)} blocks fail")
    print("check_snippets.py: every block checked")


if __name__ == "__main__":
    main()
