# The manual's Sphinx configuration. scripts/docs.sh builds it with warnings
# as errors, after docs/generate.py has drawn the pictures and written the
# generated pages into docs/_generated/ (git-ignored).
import re

import conveyor

project = "Conveyor"
author = "The Conveyor authors"
copyright = "2026, The Conveyor authors"
release = conveyor.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["requirements.txt"]
myst_heading_anchors = 3  # "[text](page.md#a-heading)" links to a heading of another page

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "furo"
html_title = f"Conveyor {release}"
html_static_path = []

# Types of torch and the standard library in signatures: without network
# access there is no inventory to link them to, so they stay plain text.
nitpick_ignore_regex = [
    (r"py:class", r"(torch|os|collections|typing)\..*"),
    (r"py:class", r"(Tensors|ProcessGroup|conveyor\._pipeline\.IncompatibleKeys)"),
]


# The Python package's docstrings are written for help(): Google-style "Args:"
# whose entries are grouped under the options' sections ("  cutting:"), with
# text that reST would read as markup (clip_grad_norm_, |g|). For the manual
# they become a rubric per section and a definition list of plain text.
ENTRY = re.compile(r"^    (\w+) \((.*)\): (.*)$")
SECTION = re.compile(r"^  (\w[\w ]*):$")


def plain(text):
    """Text that reST shows as it is."""
    text = re.sub(r"([\\`*|])", r"\\\1", text)
    return re.sub(r"(\w)_(?=\W|$)", r"\1\\_", text)


def rest_arguments(lines):
    out, entry = [], None

    def flush():
        if entry:
            name, kind, text = entry
            out.extend([f"``{name}`` ({plain(kind)})", f"    {plain(' '.join(text))}", ""])

    head = lines.index("Args:") if "Args:" in lines else len(lines)
    out.extend(plain(line) if line.strip() else line for line in lines[:head])
    if head == len(lines):
        return out
    out.extend(["", ".. rubric:: Arguments", ""])
    for line in lines[head + 1:]:
        m, s = ENTRY.match(line), SECTION.match(line)
        if m or s or not line.startswith("        "):
            flush()
            entry = None
        if m:
            entry = (m[1], m[2], [m[3]])
        elif s:
            out.extend([f".. rubric:: Options: {s[1]}", ""])
        elif line.startswith("        ") and entry:
            entry[2].append(line.strip())
        elif line.strip():
            out.extend(["", plain(line.strip())])
    flush()
    return out


def process_docstring(app, what, name, obj, options, lines):
    if name.startswith("conveyor") and "Args:" in lines:
        lines[:] = rest_arguments(lines)


def setup(app):
    app.connect("autodoc-process-docstring", process_docstring)
