"""The keywords of conveyor.Pipeline: each option's row comes from the C++
declaration (plugin/core/option_list.h), with its type,
default, documentation, bound and choices; only the keywords that hold Python
objects are declared here."""
import difflib
import inspect
import textwrap
from typing import Any, Dict, Optional, Tuple

from . import _C

# Every option's row, declared once in C++ (plugin/core/option_list.h): the
# keywords, their types, defaults and help all come from it.
_TABLE = {row["name"]: row for row in _C.option_table() if row["type"] is not None}
_CPP_ONLY = {row["name"]: row for row in _C.option_table() if row["type"] is None}

# The keywords that hold Python objects, which only Python can take: their
# rows are in the C++ list too (plugin/core/option_list.h); an empty documentation
# is the C++ row's of the same name.
_PYTHON_KEYWORDS = {row["name"]: (row["type"], row["doc"] or _CPP_ONLY[row["name"]]["doc"])
                    for row in _C.python_keywords()}
_HINTS = {"stages": "workers (threads) or split_points (where stages begin)", "loss": "loss_fn",
          "num_microbatches": "microbatches", "chunks_per_worker": "chunks",
          "shard_optimizer_state": 'shard="optimizer"'}


_REQUIRED = object()


def _described(name: str, annotation: str, default: Any, doc: str, row: Optional[dict] = None) -> str:
    extra = ""
    if row and row["choices"]:
        extra += " One of " + ", ".join(repr(c) for c in row["choices"]) + "."
    if row and row["bound"]:
        extra += f" Must be {row['bound']}."
    head = f"{name} ({annotation}): " if default is _REQUIRED else f"{name} ({annotation}, default {default!r}): "
    return textwrap.fill(head + doc + extra, width=100, initial_indent="    ", subsequent_indent="        ")


def documentation(head: str) -> str:
    """The class's help: `head`, then every keyword by section."""
    lines = [head, "Args:", _described("model", "nn.Module | ScriptModule | ExportedProgram | str", _REQUIRED, _MODEL_DOC)]
    lines += [_described(name, annotation, None, doc) for name, (annotation, doc) in _PYTHON_KEYWORDS.items()]
    for section in dict.fromkeys(row["section"] for row in _TABLE.values()):
        lines.append(f"\n  {section}:")
        rows = [(n, r) for n, r in _TABLE.items() if r["section"] == section]
        lines += [_described(n, r["type"], r["default"], r["doc"], r) for n, r in rows]
    lines.append("\nAn option given as None takes its default. Unknown keywords are refused by name (TypeError), "
                 "values of the wrong type with TypeError, bad values with ValueError.")
    return "\n".join(lines)


def signature() -> inspect.Signature:
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
              inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, keyword, default=None, annotation=a) for n, (a, _) in _PYTHON_KEYWORDS.items()]
    params += [inspect.Parameter(n, keyword, default=r["default"], annotation=r["type"]) for n, r in _TABLE.items()]
    return inspect.Signature(params)


_MODEL_DOC = ("An nn.Module (exported with torch.export by default, see front_end): the pipeline trains the "
              "module's own parameter and buffer tensors, each moved in place to its stage's device (as "
              "nn.Module.to moves them), so an optimizer over model.parameters(), made before or after, and "
              "model.state_dict() see them; a tied weight is one parameter, by its first name. Or a "
              "torch.jit.ScriptModule, a torch.export.ExportedProgram (exported with the batch dimension dynamic; "
              "the pipeline trains its tensors), or the path of a torch.jit.save or torch.export.save file.")


def split_keywords(keywords: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The Python objects' keywords (None where absent) and the options given;
    an unknown keyword is a TypeError naming it, with the closest known."""
    unknown = sorted(k for k in keywords if k not in _TABLE and k not in _PYTHON_KEYWORDS)
    if unknown:
        name = unknown[0]
        close = _HINTS.get(name) or ", ".join(difflib.get_close_matches(name, [*_PYTHON_KEYWORDS, *_TABLE], n=3))
        raise TypeError(f"conveyor.Pipeline: unknown keyword argument '{name}'" +
                        (f"; did you mean {close}?" if close else "") + " (help(conveyor.Pipeline) lists them)")
    python = {k: keywords.get(k) for k in _PYTHON_KEYWORDS}
    return python, {k: v for k, v in keywords.items() if k not in _PYTHON_KEYWORDS}
