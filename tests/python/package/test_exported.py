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


def step_like_eager(pipe, eager, x, gate, y):
    """One step of the pipeline: its loss and every gradient are eager PyTorch's."""
    result = pipe.train_step((x, gate), y)
    loss_fn(eager(x, gate), y).backward()
    assert abs(result.loss - loss_fn(eager(x, gate), y).item()) <= 1e-10
    got = dict(pipe.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name


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
    # The pipeline trains the program's own tensors (those of the module it was exported from).
    assert dict(pipe.named_parameters())["head.weight"].data_ptr() == program.state_dict["head.weight"].data_ptr()
    assert torch.equal(pipe.state_dict()["head.weight"], program.state_dict["head.weight"])
    assert torch.allclose(pipe.forward(x, gate), eager(x, gate), rtol=0, atol=1e-10)


def test_a_saved_program_is_read_from_its_path(tmp_path):
    eager, program = models(1)
    path = tmp_path / "model.pt2"
    torch.export.save(program, path)
    pipe = conveyor.Pipeline(str(path), workers=2, microbatches=2, schedule="1f1b", loss_fn=loss_fn)
    assert pipe.num_stages == 2
    x, gate, y = batch()
    step_like_eager(pipe, eager, x, gate, y)


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


class Normed(nn.Module):
    """Batch norm in the first stage: its running statistics are buffers the graph updates."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x, gate):
        return self.head(torch.relu(self.norm(self.embed(x))) * gate[:, :8].sigmoid())


@pytest.mark.parametrize("functional", [False, True])
def test_batch_norm_statistics_follow_eager_in_training_and_functional_graphs(functional):
    """A training graph updates running statistics in place; a functional one
    (run_decompositions) returns them as buffer mutations in its signature."""
    torch.manual_seed(2)
    eager = Normed().double()
    program = exported(copy.deepcopy(eager))
    if functional:
        program = program.run_decompositions()
        assert any(s.kind.name == "BUFFER_MUTATION" for s in program.graph_signature.output_specs)
    pipe = conveyor.Pipeline(program, split_points=["head"], microbatches=2, schedule="gpipe", loss_fn=loss_fn)
    x, gate, y = batch(n=8, seed=4)
    result = pipe.train_step((x, gate), y)
    expected = sum(loss_fn(eager(a, b), t) for a, b, t in zip(x.chunk(2), gate.chunk(2), y.chunk(2))) / 2
    expected.backward()
    assert abs(result.loss - expected.item()) <= 1e-10
    got = dict(pipe.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name
    buffers = dict(pipe.named_buffers())
    for name, b in eager.named_buffers():
        assert torch.allclose(buffers[name].to(b.dtype), b, rtol=0, atol=1e-12), name
    assert buffers["norm.num_batches_tracked"].item() == 2


def test_a_checkpoint_resumes_an_exported_pipeline_as_if_never_stopped(tmp_path):
    _, program = models(3)
    x, gate, y = batch(seed=5)

    def pipeline():
        return conveyor.Pipeline(program, split_points=["block1"], microbatches=2, schedule="1f1b",
                                 loss_fn=loss_fn, optimizer="adam", lr=1e-2)

    whole = pipeline()
    for _ in range(4):
        whole.train_step((x, gate), y)
    first = pipeline()
    for _ in range(2):
        first.train_step((x, gate), y)
    first.save_checkpoint(tmp_path / "run.ckpt", step=2)
    resumed = pipeline()
    assert resumed.load_checkpoint(tmp_path / "run.ckpt") == 2
    for _ in range(2):
        resumed.train_step((x, gate), y)
    for (name, p), (_, q) in zip(resumed.named_parameters(), whole.named_parameters()):
        assert torch.equal(p, q), name


def test_without_split_points_balance_by_time_chooses_the_stages():
    eager, program = models(4)
    x, gate, y = batch()
    pipe = conveyor.Pipeline(program, workers=2, microbatches=2, schedule="1f1b", balance="time",
                             sample=((x, gate), y), loss_fn=loss_fn)
    assert pipe.num_stages == 2
    assert "predicted" in pipe.plan.lower()
    step_like_eager(pipe, eager, x, gate, y)
