"""torch.classes.conveyor.Pipeline cutting models as a new user writes them:
between the items of a ModuleList looped in forward(x, mask), with the [T, T]
mask shared by every micro-batch; at an nn.LSTM and an nn.GRU called
directly; inside a module whose forward is overloaded."""
import os
import sys
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_testing import assert_same_grads, plugin, scripted  # noqa: E402,F401  (plugin: a fixture)
from cut_models import DirectRnn, LoopedTransformer, OverloadedBlocks, causal_mask  # noqa: E402





@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("split_points", [["layers.2"], ["layers.1", "layers.3"], ["layers.2", "ffn.2"]])
def test_a_looped_module_list_is_cut_between_its_items(schedule, split_points):
    eager, model = scripted(LoopedTransformer)
    x, mask, y = torch.randn(6, 5, 6, dtype=torch.float64), causal_mask(5), torch.randn(6, 5, 3, dtype=torch.float64)
    options = {"microbatches": 3, "schedule": schedule, "split_points": split_points}
    with pytest.raises(ValueError, match=r"shared_inputs\(\{1\}\).*\"shared_inputs\": \[1\]"):
        torch.classes.conveyor.Pipeline(model, options).train_step((x, mask), y)
    pipe = torch.classes.conveyor.Pipeline(model, {**options, "shared_inputs": [1]})
    loss = pipe.train_step((x, mask), y)
    ref = torch.nn.functional.mse_loss(eager(x, mask), y)
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-10)
    assert_same_grads(pipe, eager)


@pytest.mark.parametrize("split_points", [["lstm"], ["gru"], ["lstm", "gru", "head"]])
def test_a_directly_called_rnn_is_a_split_point(split_points):
    eager, model = scripted(DirectRnn)
    tokens, y = torch.randint(30, (6, 5)), torch.randint(30, (6, 5))
    pipe = torch.classes.conveyor.Pipeline(
        model, {"microbatches": 3, "schedule": "1f1b", "split_points": split_points, "loss": "cross_entropy"})
    loss = pipe.train_step(tokens, y)
    ref = torch.nn.functional.cross_entropy(eager(tokens).reshape(-1, 30), y.reshape(-1))
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-10)
    assert_same_grads(pipe, eager)


def test_a_cut_inside_an_overloaded_forward():
    eager, model = scripted(OverloadedBlocks)
    x, y = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    pipe = torch.classes.conveyor.Pipeline(model, {"microbatches": 2, "split_points": ["block.b", "gated.b"]})
    pipe.train_step(x, y)
    torch.nn.functional.mse_loss(eager(x), y).backward()
    assert_same_grads(pipe, eager)
