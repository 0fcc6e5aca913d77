"""How conveyor.Pipeline turns the model it is given into what the C++
builder reads (plugin/builder/front_end.h):

- an nn.Module is exported with torch.export by default (the batch
  dimension dynamic, in training mode), and the pipeline trains the module's
  own parameter and buffer tensors; front_end="script" compiles it with
  TorchScript instead and front_end="trace" traces it;
- a ScriptModule, or the path of a torch.jit.save file, is TorchScript;
- an ExportedProgram (or a .pt2 path) runs as exported, training the
  program's tensors (those of the module it was exported from).
"""
import contextlib
import difflib
import inspect
import io
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from ._arguments import _fail

FRONT_ENDS = ("export", "script", "trace")

OutputChoice = Union[None, str, int, Callable[[Any], Any]]


@dataclass
class Built:
    """What the C++ pipeline is made from: `model` (a ScriptModule's C++
    module or a file path), `tensors` (for an archive: (name, tensor) pairs
    that stand for its copies) and the file to delete after building."""
    model: Any
    tensors: List[Tuple[str, torch.Tensor]] = field(default_factory=list)
    temporary: Optional[str] = None

    def close(self) -> None:
        if self.temporary:
            os.unlink(self.temporary)
            self.temporary = None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def choose(model: Any, front_end: Optional[str], options: Dict[str, Any]) -> str:
    """The front end for `model`: "export", "script", "trace", or "given"
    (a ScriptModule, an ExportedProgram or a path, which need none)."""
    if front_end is not None and front_end not in FRONT_ENDS:
        _fail(ValueError, "front_end", "one of " + ", ".join(repr(f) for f in FRONT_ENDS), front_end)
    if isinstance(model, (torch.jit.ScriptModule, torch.export.ExportedProgram, str, os.PathLike)):
        if front_end is not None:
            raise ValueError(f"conveyor.Pipeline: front_end={front_end!r} is for an nn.Module; the model is a "
                             f"{type(model).__name__}, which runs as it is")
        return "given"
    if not isinstance(model, nn.Module):
        _fail(TypeError, "model", "an nn.Module, a torch.jit.ScriptModule, a torch.export.ExportedProgram or the "
              "path of a saved one", model)
    if front_end is None:
        # The fused ops and the TorchScript optimizer work on TorchScript.
        return "script" if options.get("fused_ops") or options.get("optimize") else "export"
    return front_end


def check_split_point_names(model: nn.Module, split_points: Any) -> None:
    """Split points name submodules: one that is none is refused before
    the model is exported (whether it is called once, at the top of the
    forward, the builder checks on the graph)."""
    if not isinstance(split_points, (list, tuple)):
        return  # the options' own check names a value of the wrong type
    names = [n for n, _ in model.named_modules() if n]
    for point in split_points:
        if isinstance(point, str) and point not in names:
            close = difflib.get_close_matches(point, names, n=3)
            raise ValueError(f"conveyor.Pipeline: split point {point!r} names no submodule of the "
                             f"{type(model).__name__}" + (f"; did you mean {', '.join(close)}?" if close else
                                                          f" (its submodules: {', '.join(names[:12])}...)"))


def as_inputs(value: Any) -> Tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@contextlib.contextmanager
def _training_mode(model: nn.Module):
    """Every submodule in training mode for the export (dropout and batch
    norm appear in the graph), their own modes back afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _selected(out: Any, output: OutputChoice) -> Any:
    if output is None:
        return out
    if callable(output):
        return output(out)
    if isinstance(output, str):
        if isinstance(out, dict) and output in out:
            return out[output]
        if hasattr(out, output):
            return getattr(out, output)
        keys = list(out.keys()) if isinstance(out, dict) else [k for k in vars(out)] if hasattr(out, "__dict__") else []
        raise ValueError(f"conveyor.Pipeline: output={output!r}, but the model returns a {type(out).__name__} "
                         f"without it" + (f" (it has {', '.join(map(str, keys))})" if keys else ""))
    return out[output]


@contextlib.contextmanager
def _forward_as_given(model: nn.Module, n: int, output: OutputChoice, kwargs: Dict[str, Any],
                      names: Optional[Tuple[str, ...]] = None):
    """model's forward, for the time of an export or a trace, taking the
    pipeline's `n` inputs (positionally, or as the keyword arguments `names`
    where the batch was a dict), with `kwargs`, returning `output`: the
    module itself is exported, so its parameters keep their names."""
    if output is None and not kwargs and not names:
        yield
        return
    own = type(model).forward

    def forward(*inputs):
        given = {**dict(zip(names, inputs)), **kwargs} if names else kwargs
        return _selected(own(model, *(() if names else inputs), **given), output)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(f"input{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)])
    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def _module_tensors(model: nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """The module's parameters and buffers under every name, in its order
    (the first name of a tied weight first)."""
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]


def _saved(program: torch.export.ExportedProgram) -> str:
    fd, path = tempfile.mkstemp(suffix=".pt2")
    os.close(fd)
    try:
        torch.export.save(program, path)
    except BaseException:
        os.unlink(path)
        raise
    return path


def exported_program(program: torch.export.ExportedProgram) -> Built:
    """An ExportedProgram: its own tensors (the module's it came from)."""
    tensors = [*program.state_dict.items(), *program.constants.items()]
    path = _saved(program)
    return Built(path, [(n, t) for n, t in tensors if isinstance(t, torch.Tensor)], path)


def _export_error(error: Exception, output: OutputChoice, printed: str) -> ValueError:
    """What failed, in a few lines: torch.export's first line, the user's
    line it failed at and what to do. The whole of torch's error is the
    result's `torch_error`; what torch printed meanwhile (the graph it
    recorded before failing, its warnings) is `export_output`."""
    text = str(error)
    at = re.search(r"The following call raised this error:\n((?:.+\n?){1,2})", text)
    where = "".join(f"\n{line.rstrip()}" for line in at[1].splitlines()) if at else ""
    outputs = ""
    if output is None and "output" in text:
        outputs = ("The forward returns what no list of tensors holds: choose the tensors the loss reads with "
                   "output= (a key such as \"logits\", an index or a callable), and turn off what it need not "
                   "return with model_kwargs= (Hugging Face: {\"use_cache\": False}).\n")
    failure = ValueError(
        f"conveyor.Pipeline: torch.export cannot export the model: {_first_line(error)}{where}\n{outputs}"
        "It is exported with the batch dimension (each input's first) dynamic, in training mode. Rewrite that "
        "construct, or build with front_end='script' (TorchScript) or front_end='trace' (tracing one run; give "
        "example_inputs=...).\n(torch.export's whole error: this exception's .torch_error"
        + ("; what it printed, the graph it recorded among it: .export_output)" if printed.strip() else ")"))
    failure.torch_error, failure.export_output = error, printed
    return failure


def export(model: nn.Module, inputs: Tuple[Any, ...], output: OutputChoice, kwargs: Dict[str, Any],
           names: Optional[Tuple[str, ...]] = None) -> Built:
    """`model` exported with torch.export on `inputs` (every tensor's first
    dimension dynamic, so micro-batches of any size run)."""
    batch = torch.export.Dim("batch")
    shapes = tuple({0: batch} if isinstance(x, torch.Tensor) and x.dim() > 0 else None for x in inputs)
    # torch.export prints the graph it recorded to stderr when it fails: kept
    # on the error instead, and written out only if the export succeeds.
    printed, kept = io.StringIO(), False
    try:
        with _training_mode(model), _forward_as_given(model, len(inputs), output, kwargs, names), \
                contextlib.redirect_stderr(printed):
            program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    except Exception as error:  # torch.export raises many kinds; all are reported alike
        kept = True
        raise _export_error(error, output, printed.getvalue()) from None
    finally:
        if not kept:  # a success, or an interrupt: what was printed is shown after all
            sys.stderr.write(printed.getvalue())
    # The module's own tensors under every name (a tied weight's first name
    # first), then the constants torch.export lifted out of the code.
    given = dict(_module_tensors(model))
    for name, t in [*program.state_dict.items(), *program.constants.items()]:
        if isinstance(t, torch.Tensor):
            given.setdefault(name, t)
    path = _saved(program)
    return Built(path, list(given.items()), path)


def script(model: nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=FutureWarning)  # TorchScript's deprecation notices
        warnings.simplefilter("ignore", category=DeprecationWarning)
        try:
            return torch.jit.script(model)
        except Exception as error:  # TorchScript raises several kinds; all are reported alike
            where, why = "the model", error
            # The deepest submodule that fails alone is where the construct is.
            for name, sub in sorted(model.named_modules(), key=lambda item: -item[0].count(".")):
                if not name:
                    continue
                try:
                    torch.jit.script(sub)
                except Exception as sub_error:  # noqa: BLE001
                    # A class the first attempt half-compiled cannot be compiled again
                    # ("Can't redefine method"): its first error is the one to show.
                    redefined = "Can't redefine method" in str(sub_error)
                    where, why = f"submodule '{name}' ({type(sub).__name__})", error if redefined else sub_error
                    break
            raise ValueError(
                f"conveyor.Pipeline: TorchScript cannot compile {where}: {_first_line(why)}\n{why}\n"
                "Rewrite that construct, or build with front_end='export' (the default: torch.export), or "
                "front_end='trace' with example_inputs=(...) (tracing records one run: no data-dependent control "
                "flow).") from error


def trace(model: nn.Module, inputs: Tuple[Any, ...], output: OutputChoice, kwargs: Dict[str, Any],
          names: Optional[Tuple[str, ...]] = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        with _forward_as_given(model, len(inputs), output, kwargs, names):
            return torch.jit.trace(model, inputs, check_trace=False)
