"""The schedules guide's decision picture: where to start, and what to change
when memory or the bubble is the problem, each step naming its option and
showing, where it leads to another schedule, that schedule as the library
draws it (conveyor.schedule_svg, nested in the picture)."""
import re
from html import escape

import conveyor

# (column heading, whether each step is the next to try, [(option text, schedule drawn or None, note)])
START = ('schedule="1f1b", microbatches ≈ 4 × workers', "1f1b", "exact gradients; stage k keeps ≤ K − k")
COLUMNS = [
    ("short of memory", True, [
        ("recompute=True", None, "keep inputs, replay the forward"),
        ("offload=True", None, "on a GPU: the stash in host memory"),
        ('schedule="v-half"', "v-half", "half of 1F1B's activations"),
        ('schedule="v-min"', "v-min", "a third of them"),
        ('plan="auto", memory_budget=…', None, "searched, a schedule synthesised under the cap"),
    ]),
    ("bubble too large", True, [
        ("more microbatches", None, "1F1B idles (K − 1)/(M + K − 1)"),
        ('schedule="interleaved", chunks=2', "interleaved", "bubble halved"),
        ('schedule="zb-h1"', "zb-h1", "weight gradients fill the bubble"),
        ('schedule="zb-v"', "zb-v", "almost none, at 1F1B's memory"),
    ]),
    ("other needs", False, [
        ('schedule="eager-1f1b", lookahead', "eager-1f1b", "a slow link: forwards run ahead of its round trip"),
        ('"pipedream", "ddg" or "fr"', "pipedream", "staleness for speed: an update per micro-batch"),
    ]),
]

WIDTH, COLUMN_WIDTH, GAP = 1040, 320, 30
BOX_TEXT, THUMB = 46, 92  # a box's text rows and its drawing's height
WORKERS, MICROBATCHES = 4, 8


def _drawing(name, x, y, width, height):
    """The library's own drawing of `name`, scaled into (x, y, width, height)."""
    svg = conveyor.schedule_svg(name, WORKERS, MICROBATCHES)
    head = re.match(r"<svg [^>]*>", svg)
    view = re.search(r'viewBox="([^"]+)"', head.group(0)).group(1)
    body = svg[head.end():svg.rindex("</svg>")]
    return (f'<svg x="{x}" y="{y}" width="{width}" height="{height}" viewBox="{view}" '
            f'preserveAspectRatio="xMinYMin meet">{body}</svg>')


def _box(x, y, width, option, schedule, note, fill):
    height = BOX_TEXT + (THUMB if schedule else 0)
    parts = [f'<rect x="{x}" y="{y}" width="{width}" height="{height}" rx="6" fill="{fill}" stroke="#888"/>',
             f'<text x="{x + 10}" y="{y + 19}" font-size="14" font-family="monospace" font-weight="bold">'
             f'{escape(option)}</text>',
             f'<text x="{x + 10}" y="{y + 37}" font-size="12" font-family="sans-serif" fill="#444">'
             f'{escape(note)}</text>']
    if schedule:
        parts.append(_drawing(schedule, x + 6, y + BOX_TEXT - 2, width - 12, THUMB))
    return parts, height


def _arrow(x, y0, y1):
    return (f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1 - 6}" stroke="#666" stroke-width="2"/>'
            f'<polygon points="{x - 5},{y1 - 8} {x + 5},{y1 - 8} {x},{y1}" fill="#666"/>')


def decision_svg():
    parts = []
    start_width = 420
    start_x = (WIDTH - start_width) // 2
    box, start_height = _box(start_x, 10, start_width, *START, fill="#e3eef9")
    parts += box
    top = 10 + start_height
    bottom = top
    for i, (heading, in_turn, steps) in enumerate(COLUMNS):
        x = i * (COLUMN_WIDTH + GAP) + 10
        centre = x + COLUMN_WIDTH // 2
        parts.append(f'<path d="M {WIDTH // 2} {top} L {WIDTH // 2} {top + 14} L {centre} {top + 14}" '
                     'stroke="#666" stroke-width="2" fill="none"/>')
        parts.append(_arrow(centre, top + 14, top + 44))
        parts.append(f'<text x="{centre}" y="{top + 62}" font-size="15" font-family="sans-serif" '
                     f'font-weight="bold" text-anchor="middle">{escape(heading)}</text>')
        y = top + 72
        for k, (option, schedule, note) in enumerate(steps):
            if k:
                if in_turn:
                    parts.append(_arrow(centre, y, y + 18))
                y += 18
            box, height = _box(x, y, COLUMN_WIDTH, option, schedule, note, fill="#fdf1e4" if i < 2 else "#eef6ea")
            parts += box
            y += height
        bottom = max(bottom, y)
    height = bottom + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}"><rect width="100%" height="100%" fill="#ffffff"/>'
            + "".join(parts) + "</svg>\n")
