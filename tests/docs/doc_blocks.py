"""The fenced code blocks of the README and the manual's pages, as the docs
tests read them: shared by check_snippets.py (Python, shell and text blocks)
and extract_cpp.py (C++ blocks)."""
import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
MARK = re.compile(r"<!--\s*(?P<mark>[a-z ]+):\s*(?P<why>.*?)\s*-->")


@dataclasses.dataclass
class Block:
    page: pathlib.Path  # relative to the repository
    line: int           # of the block's first line of code, 1-based
    language: str       # the info string's first word ("" when none)
    code: str           # with the fence's indentation removed
    mark: str = ""      # "compile only" when an HTML comment just above says so
    why: str = ""


def pages():
    """README.md and docs/**/*.md, the generated pages left out."""
    found = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [p.relative_to(ROOT) for p in found if "_generated" not in p.parts]


def blocks(page):
    lines = (ROOT / page).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:end]) + "\n"
        above = lines[i - 1] if i > 0 else ""
        mark = MARK.search(above)
        language = info.split()[0] if info else ""
        out.append(Block(page, i + 2, language, code, mark["mark"] if mark else "", mark["why"] if mark else ""))
        i = end + 1
    return out


def every_block():
    return [b for p in pages() for b in blocks(p)]
