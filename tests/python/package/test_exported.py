"""conveyor.Pipeline over torch.export programs (ExportedProgram objects and
.pt2 files): C++ runs the exported graph operator by operator with autograd,
so a step equals eager PyTorch's, to float64 rounding."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import conveyor

from test_package import TwoInputs, batch, loss_fn


def exported(model, n=12):
    x, gate, _ = batch(n)
    rows = torch.export.Dim("batch", min=1)
    return torch.export.export(model, (x, gate), dynamic_shapes=({0: rows}, {0: rows}))


def models(seed=0):
    torch.manual_seed(seed)
    eager = TwoInputs().double()
    return eager, exported(copy.deepcopy(eager))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_an_exported_program_trains_as_eager_pytorch(schedule):
    eager, program = models()
    pipe = conveyor.Pipeline(program, split_points=["block1", "head"], microbatches=4, schedule=schedule,
                             loss_fn=loss_fn)
    assert pipe.num_stages == 3
    assert [n for n, _ in pipe.named_parameters()] == [n for n, _ in eager.named_parameters()]
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    losses = []
    x, gate, y = batch(n=10, seed=3)  # micro-batches of 3, 3, 2 and 2 samples
    for step in range(4):
        opt.zero_grad()
        losses.append(pipe.train_step((x, gate), y).loss)
        ref.zero_grad()
        expected = sum(loss_fn(eager(a, b), t) * len(t) for a, b, t in
                       zip(x.tensor_split(4), gate.tensor_split(4), y.tensor_split(4))) / len(y)
        expected.backward()
        assert abs(losses[-1] - expected.item()) <= 1e-10, step
        if step == 0:
            got = dict(pipe.named_parameters())
            for name, p in eager.named_parameters():
                assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name
        opt.step()
        ref.step()
    for (name, p), (_, q) in zip(pipe.named_parameters(), eager.named_parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-10), name
    assert losses[-1] < losses[0]
    # The pipeline trains its own copy of the program's weights.
    state = pipe.state_dict()
    assert not torch.equal(state["head.weight"], program.state_dict["head.weight"])
    assert torch.allclose(pipe.forward(x, gate), eager(x, gate), rtol=0, atol=1e-10)


def test_a_saved_program_is_read_from_its_path(tmp_path):
    eager, program = models(1)
    path = tmp_path / "model.pt2"
    torch.export.save(program, path)
    pipe = conveyor.Pipeline(str(path), workers=2, microbatches=2, schedule="1f1b", loss_fn=loss_fn)
    assert pipe.num_stages == 2
    x, gate, y = batch()
    result = pipe.train_step((x, gate), y)
    loss_fn(eager(x, gate), y).backward()
    assert abs(result.loss - loss_fn(eager(x, gate), y).item()) <= 1e-10
    got = dict(pipe.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda v: self.fc(v), lambda v: -v, (x,))


def test_control_flow_is_refused_naming_the_node(tmp_path):
    program = torch.export.export(Branchy().double(), (torch.randn(3, 4, dtype=torch.float64),))
    with pytest.raises(ValueError, match=r"node 'cond' .*higher-order operator"):
        conveyor.Pipeline(program, microbatches=1, loss_fn=loss_fn)


def test_a_static_batch_is_refused_with_advice():
    torch.manual_seed(0)
    x, gate, y = batch(8)
    program = torch.export.export(TwoInputs().double(), (x, gate))  # batch fixed at 8
    pipe = conveyor.Pipeline(program, split_points=["head"], microbatches=4, loss_fn=loss_fn)
    with pytest.raises(conveyor.PipelineError, match=r"exported with size 8 in dimension 0, got 2.*dynamic"):
        pipe.train_step((x, gate), y)
