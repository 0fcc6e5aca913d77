"""What conveyor.Pipeline does with its arguments before the C++ side sees
them: each checked for its type and value (TypeError, ValueError naming the
argument). What it does with the model is in _front_end.py."""
import torch


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
