"""What the TorchScript class's Python tests share: the plugin loaded, a model
scripted beside its eager twin, and gradients compared by name."""
import copy
import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def plugin():
    """Loads the plugin under test (ctest sets CONVEYOR_LIB); a test module imports it to use it."""
    torch.ops.load_library(os.environ["CONVEYOR_LIB"])


def scripted(cls, seed=0):
    """An instance of `cls` in float64 and a scripted copy with the same weights."""
    torch.manual_seed(seed)
    eager = cls().double()
    return eager, torch.jit.script(copy.deepcopy(eager))


def assert_same_grads(pipe, eager, tol=1e-10):
    """The pipeline has the eager model's parameters, by name, each with its gradient within `tol`."""
    got = pipe.named_parameters()
    expected = dict(eager.named_parameters())
    assert sorted(got) == sorted(expected)
    for name, p in expected.items():
        assert got[name].grad is not None, name
        assert (got[name].grad - p.grad).abs().max().item() <= tol, name
