"""What conveyor.Pipeline does with its arguments before the C++ side sees
them: each checked for its type and value (TypeError, ValueError naming the
argument), and the model made TorchScript."""
import os
import tempfile
import warnings

import torch
from torch import nn

def _fail(kind, name, expected, value):
    raise kind(f"conveyor.Pipeline: {name} must be {expected}, got {type(value).__name__} {value!r}"[:300])


def _int(name, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(TypeError, name, "an int", value)
    if minimum is not None and value < minimum:
        _fail(ValueError, name, f"at least {minimum}", value)
    return value


def _float(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(TypeError, name, "a number", value)
    return float(value)


def _bool(name, value):
    if not isinstance(value, bool):
        _fail(TypeError, name, "True or False", value)
    return value


def _tensors(name, value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, torch.Tensor) for v in value):
        return tuple(value)
    _fail(TypeError, name, "a tensor or a tuple of tensors", value)


def _first_line(error):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _program_file(model, example_inputs, options):
    """For a torch.export program, a temporary .pt2 holding it (C++ reads the
    program from its archive; the caller deletes it); None for other models."""
    if not isinstance(model, torch.export.ExportedProgram):
        return None
    if example_inputs is not None or options.get("fused_ops"):
        raise ValueError("conveyor.Pipeline: example_inputs and fused_ops are for nn.Modules; an "
                         "ExportedProgram runs the operators it was exported with")
    fd, path = tempfile.mkstemp(suffix=".pt2")
    os.close(fd)
    torch.export.save(model, path)
    return path


def _script(model, example_inputs):
    """A ScriptModule (or a saved one's path) for `model`."""
    if isinstance(model, torch.jit.ScriptModule):
        return model
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if not isinstance(model, nn.Module):
        _fail(TypeError, "model", "an nn.Module, a torch.jit.ScriptModule or the path of a torch.jit.save file", model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=FutureWarning)  # TorchScript's deprecation notices
        warnings.simplefilter("ignore", category=DeprecationWarning)
        if example_inputs is not None:
            inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            return torch.jit.trace(model, inputs, check_trace=False)
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
                    where, why = f"submodule '{name}' ({type(sub).__name__})", sub_error
                    break
            raise ValueError(
                f"conveyor.Pipeline: TorchScript cannot compile {where}: {_first_line(why)}\n{why}\n"
                "Pipelines run TorchScript; rewrite that construct, or pass example_inputs=(...) to trace the "
                "model instead (tracing records one run: no data-dependent control flow).") from error
