"""The keywords of conveyor.Pipeline: each option's row comes from the C++
declaration (plugin/option_list.h), with its type,
default, documentation, bound and choices; only the keywords that hold Python
objects are declared here."""
import difflib
import inspect
import textwrap
from typing import Any, Dict, Optional, Tuple

from . import _C

# Every option's row, declared once in C++ (plugin/option_list.h): the
# keywords, their types, defaults and help all come from it.
_TABLE = {row["name"]: row for row in _C.option_table() if row["type"] is not None}
_CPP_ONLY = {row["name"]: row for row in _C.option_table() if row["type"] is None}

# The keywords that hold Python objects, which only Python can take.
_PYTHON_KEYWORDS = {
    "loss_fn": ("Union[Callable, str, torch.jit.ScriptModule, None]",
                "loss_fn(output, target) -> scalar tensor, any Python callable (called on the last stage's thread "
                "with the GIL held for the call; output and target are tensors, or tuples of them for several), or "
                "\"cross_entropy\" / \"mse\", or a scripted module; loss_reduction says whether it returns a "
                "mean (the default) or a sum over its micro-batch."),
    "lr_schedule": ("Optional[Callable[[int], float]]", _CPP_ONLY["lr_schedule"]["doc"]),
    "sample": ("Optional[Tuple[Tensors, Tensors]]",
               "An (inputs, target) batch of the size each step trains on, profiled for balance=\"time\" and "
               "plan=\"auto\"."),
    "front_end": ("Optional[str]",
                  "How an nn.Module becomes a graph the pipeline cuts: \"export\" (torch.export, the batch dimension "
                  "dynamic, in training mode; the default), \"script\" (torch.jit.script; the default where fused_ops "
                  "or optimize asks for TorchScript) or \"trace\" (torch.jit.trace of one run on example_inputs). "
                  "Other models run as given."),
    "example_inputs": ("Optional[Tensors]",
                       "Inputs to export or trace the model with, when it is built; without them (or sample) an "
                       "nn.Module is exported at the first train_step or forward, from its inputs."),
    "output": ("Union[str, int, Callable, None]",
               "For a forward that returns a dict, a dataclass (Hugging Face's ModelOutput) or a tuple: the output "
               "the pipeline returns and the loss reads, by key or attribute (\"logits\"), by index, or as "
               "output(result) -> tensors. With front_end \"export\" or \"trace\"."),
    "model_kwargs": ("Optional[Dict[str, Any]]",
                     "Keyword arguments every forward call takes (use_cache=False, return_dict=True), with the "
                     "inputs positionally. With front_end \"export\" or \"trace\"."),
    "process_group": ("Optional[ProcessGroup]",
                      "Run across processes (under torchrun, after torch.distributed.init_process_group): the group "
                      "of this replica's processes, each running one worker's stages (its rank in the group is the "
                      "worker; workers is its size). Every process builds the pipeline from the same model and "
                      "options and calls train_step with its replica's batch; parameters() and state_dict() are "
                      "then its own stages', StepResult.loss the whole batch's on every process."),
    "replica_group": ("Optional[ProcessGroup]",
                      "With process_group, data parallelism across replicas of the pipeline: the processes running "
                      "this worker in every replica. Gradients are averaged across it; replica 0's initial weights "
                      "are broadcast. conveyor.process_groups(workers) makes both groups."),
}
_HINTS = {"stages": "workers (threads) or split_points (where stages begin)", "loss": "loss_fn",
          "num_microbatches": "microbatches", "chunks_per_worker": "chunks"}


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
