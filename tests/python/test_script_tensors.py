"""torch.classes.conveyor.Pipeline with several tensors: a model of two
inputs takes a tuple, an encoder-decoder's memory crosses cuts, and a model
that ties its projection to its embedding trains with identical copies."""
import os
import sys
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_testing import assert_same_grads, plugin, scripted  # noqa: E402,F401  (plugin: a fixture)
from make_fixtures import Seq2Seq, TiedHeadLm, TiedLm, TwoInput  # noqa: E402





@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_two_input_model_takes_a_tuple(schedule):
    eager, model = scripted(TwoInput)
    x = torch.randn(6, 8, dtype=torch.float64)
    mask = (torch.rand(6, 8) > 0.3).double()
    y = torch.randn(6, 3, dtype=torch.float64)
    pipe = torch.classes.conveyor.Pipeline(model, {"microbatches": 3, "schedule": schedule, "split_points": ["b", "c"]})
    loss = pipe.train_step((x, mask), y)
    ref = torch.nn.functional.mse_loss(eager(x, mask), y)
    ref.backward()
    assert abs(loss - ref.item()) < 1e-10
    assert_same_grads(pipe, eager)
    assert torch.allclose(pipe.forward((x, mask)), eager(x, mask).detach(), atol=1e-12)


def test_the_encoder_output_crosses_two_cuts():
    eager, model = scripted(Seq2Seq)
    src, tgt, y = torch.randint(30, (4, 7)), torch.randint(30, (4, 5)), torch.randint(30, (4, 5))
    pipe = torch.classes.conveyor.Pipeline(
        model, {"microbatches": 2, "split_points": ["dec1", "dec2"], "loss": "cross_entropy"})
    pipe.train_step((src, tgt), y)
    torch.nn.functional.cross_entropy(eager(src, tgt).reshape(-1, 30), y.reshape(-1)).backward()
    assert_same_grads(pipe, eager)


@pytest.mark.parametrize("cls,options", [(TiedLm, {"workers": 2}), (TiedHeadLm, {"split_points": ["rnn2"]})])
def test_a_tied_embedding_stays_one_weight_in_value(cls, options):
    eager, model = scripted(cls)
    tokens, y = torch.randint(40, (6, 5)), torch.randint(40, (6, 5))
    pipe = torch.classes.conveyor.Pipeline(
        model, {**options, "microbatches": 3, "loss": "cross_entropy", "optimizer": "sgd", "lr": 0.5})
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.5)
    for _ in range(5):
        pipe.train_step(tokens, y)
        eager_opt.zero_grad()
        torch.nn.functional.cross_entropy(eager(tokens).reshape(-1, 40), y.reshape(-1)).backward()
        eager_opt.step()
    copies = [p for p in pipe.parameters() if p.shape == eager.embed.weight.shape]
    assert len(copies) == 1  # one parameter, as in the model (each stage holds a copy the pipeline keeps equal)
    assert (copies[0] - eager.embed.weight).abs().max().item() < 1e-10
    # Each stage's copy is in value the same: the forward is the eager model's.
    assert (pipe.forward(tokens) - eager(tokens)).abs().max().item() < 1e-10


def test_a_tuple_with_a_non_tensor_is_refused():
    _, model = scripted(TwoInput)
    pipe = torch.classes.conveyor.Pipeline(model, {"split_points": ["b"]})
    with pytest.raises(ValueError, match="element 1 of the input is a str"):
        pipe.train_step((torch.randn(2, 8, dtype=torch.float64), "mask"), torch.randn(2, 3))
