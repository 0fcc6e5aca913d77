"""The guides' prose, read as a newcomer reads it: no sentence over 40 words
and no bullet over 8 lines, outside code blocks, tables and headings (a code
span counts as one word, a link as its text). check_snippets.py runs it on
docs/guides/; run alone it names each long sentence or bullet:

  python tests/docs/prose_lint.py [docs/guides/page.md ...]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENTENCE_WORDS = 40
BULLET_LINES = 8
BULLET = re.compile(r"\s*([-*]|\d+\.)\s")


def paragraphs(text):
    """(first line, is a bullet, lines) of each paragraph or bullet of prose."""
    out, current, start, bullet, fence = [], [], 0, False, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence:
            fence = None if stripped == fence else fence
            continue
        opening = re.match(r"(`{3,})", stripped)
        if opening or not stripped or stripped.startswith(("|", "#")):
            if current:
                out.append((start, bullet, current))
            current = []
            fence = opening[1] if opening else None
            continue
        if BULLET.match(line) or not current:
            if current:
                out.append((start, bullet, current))
            current, start, bullet = [], number, bool(BULLET.match(line))
        current.append(stripped)
    if current:
        out.append((start, bullet, current))
    return out


def sentences(lines):
    text = " ".join(lines)
    text = re.sub(r"`[^`]*`", "CODE", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"^\s*([-*]|\d+\.)\s", "", text, count=1)  # the bullet's own mark
    return re.split(r"(?<=[.!?])\s+", text)  # at a full stop, question or exclamation mark


def problems(page):
    found = []
    for start, bullet, lines in paragraphs((ROOT / page).read_text()):
        if bullet and len(lines) > BULLET_LINES:
            found.append(f"{page}:{start}: a bullet of {len(lines)} lines (at most {BULLET_LINES})")
        for sentence in sentences(lines):
            words = len(sentence.split())
            if words > SENTENCE_WORDS:
                found.append(f"{page}:{start}: a sentence of {words} words (at most {SENTENCE_WORDS}): "
                             f"{sentence[:70]}...")
    return found


def guides():
    return sorted(p.relative_to(ROOT) for p in (ROOT / "docs" / "guides").glob("*.md"))


if __name__ == "__main__":
    pages = [pathlib.Path(p).resolve().relative_to(ROOT) for p in sys.argv[1:]] or guides()
    found = [f for p in pages for f in problems(p)]
    print("\n".join(found) or "prose_lint.py: every sentence and bullet within bounds")
    sys.exit(1 if found else 0)
