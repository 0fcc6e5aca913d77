"""The installed `conveyor` package (pip install .): an nn.Module and a Python
loss function in, exact gradients and a StepResult out, errors as the Python
exceptions they should be. Runs against the installed package, not build/."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import conveyor

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices


def test_the_package_is_the_installed_one():
    source_tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert "site-packages" in conveyor.__file__ or "dist-packages" in conveyor.__file__, conveyor.__file__
    assert not conveyor.__file__.startswith(source_tree + os.sep + "python"), conveyor.__file__
    assert conveyor.torch_version == torch.__version__


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class TwoInputs(nn.Module):
    """Two inputs (features and a per-sample gate), a residual across a cut."""

    def __init__(self, width=16, classes=5):
        super().__init__()
        self.embed = nn.Linear(6, width)
        self.block0 = Block(width)
        self.block1 = Block(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x, gate):
        h = torch.tanh(self.embed(x)) * torch.sigmoid(gate)
        skip = h
        h = self.block1(self.block0(h))
        return self.head(h + skip)


def batch(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    gate = torch.randn(n, 16, generator=g, dtype=torch.float64)
    y = torch.randint(5, (n,), generator=g)
    return x, gate, y


def loss_fn(out, target):
    return F.cross_entropy(out, target)


def models(seed=0):
    torch.manual_seed(seed)
    eager = TwoInputs().double()
    return eager, copy.deepcopy(eager)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "eager-1f1b+2"])
def test_gradients_equal_eager_pytorch(schedule):
    eager, model = models()
    name, _, ahead = schedule.partition("+")
    pipe = conveyor.Pipeline(model, split_points=["block1", "head"], microbatches=4, schedule=name,
                             lookahead=int(ahead) if ahead else None,
                             loss_fn=lambda out, target: F.cross_entropy(out, target))
    x, gate, y = batch()
    result = pipe.train_step((x, gate), y)  # exports the model from its inputs, then trains
    assert pipe.num_stages == 3
    if ahead:  # stage 0 runs (1 + 2) forwards ahead per later stage: all 4
        assert pipe.schedule.splitlines()[1].split()[:5] == ["0F0", "0F1", "0F2", "0F3", "0B0"]
    expected = loss_fn(eager(x, gate), y)
    expected.backward()
    assert abs(result.loss - expected.item()) <= 1e-10
    got = dict(pipe.named_parameters())
    assert list(got) == [n for n, _ in eager.named_parameters()]
    for name, p in eager.named_parameters():
        assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name
    # Each micro-batch's own loss; equal micro-batches weigh alike in the mean.
    assert len(result.microbatch_losses) == 4
    assert abs(sum(result.microbatch_losses) / 4 - result.loss) <= 1e-10


def test_torch_optim_over_parameters_trains_as_eager_does():
    eager, model = models(1)
    pipe = conveyor.Pipeline(model, split_points=["block0", "head"], microbatches=3, schedule="1f1b", loss_fn=loss_fn)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    losses = []
    for step in range(5):
        x, gate, y = batch(seed=10)  # one batch, seen again: its loss must fall
        opt.zero_grad()
        losses.append(pipe.train_step((x, gate), y).loss)
        opt.step()
        ref.zero_grad()
        loss_fn(eager(x, gate), y).backward()
        ref.step()
    for (name, p), (_, q) in zip(pipe.named_parameters(), eager.named_parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-10), name
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("plan", ["auto", "tuned"])
def test_plan_auto_searches_the_whole_plan_and_trains_exactly(plan):
    torch.manual_seed(3)
    eager = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)).double()
    model = copy.deepcopy(eager)
    x, _, y = batch(16)
    pipe = conveyor.Pipeline(model, plan=plan, sample=(x, y), max_workers=2, loss_fn=loss_fn)
    assert "searched" in pipe.plan and "rank" in pipe.plan, pipe.plan
    assert ("chose the fastest measured" in pipe.plan) == (plan == "tuned"), pipe.plan
    assert 1 <= pipe.num_workers <= 2
    assert pipe.prediction is not None
    result = pipe.train_step(x, y)
    expected = loss_fn(eager(x), y)
    expected.backward()
    assert abs(result.loss - expected.item()) <= 1e-10
    got = dict(pipe.named_parameters())
    for name, p in eager.named_parameters():
        assert torch.allclose(got[name].grad, p.grad, rtol=0, atol=1e-10), name
    with pytest.raises(ValueError, match='plan "auto" chooses where to cut'):
        conveyor.Pipeline(copy.deepcopy(eager), plan="auto", split_points=["2"], sample=(x, y), loss_fn=loss_fn)
    with pytest.raises(ValueError, match="give sample"):
        conveyor.Pipeline(copy.deepcopy(eager), plan="auto", loss_fn=loss_fn)
    with pytest.raises(ValueError, match="bound the search"):
        conveyor.Pipeline(copy.deepcopy(eager), max_workers=2, loss_fn=loss_fn)
    with pytest.raises(ValueError, match="no plan fits a memory budget"):
        conveyor.Pipeline(copy.deepcopy(eager), plan="auto", sample=(x, y), memory_budget=100, loss_fn=loss_fn)


class LossBroke(Exception):
    pass


def test_a_loss_that_raises_reaches_the_caller_as_itself_and_the_step_rolls_back():
    _, model = models()
    calls = {"n": 0}

    def flaky(out, target):
        calls["n"] += 1
        if calls["n"] == 2:
            raise LossBroke("no loss today")
        return loss_fn(out, target)

    pipe = conveyor.Pipeline(model, split_points=["block1"], microbatches=3, schedule="1f1b", loss_fn=flaky,
                             optimizer="sgd", lr=0.1)
    before = {n: p.detach().clone() for n, p in pipe.named_parameters()}
    x, gate, y = batch()
    with pytest.raises(LossBroke, match="no loss today") as raised:
        pipe.train_step((x, gate), y)
    assert any("conveyor stage 1, micro-batch 1" in note for note in getattr(raised.value, "__notes__", []))
    for n, p in pipe.named_parameters():
        assert torch.equal(p, before[n]), n  # the pipeline's optimizer did not step
    assert pipe.train_step((x, gate), y).stepped  # and the next step runs


def test_a_loss_that_returns_no_tensor_is_a_type_error():
    _, model = models()
    pipe = conveyor.Pipeline(model, split_points=["block1"], loss_fn=lambda out, target: 3.0)
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor, got float"):
        pipe.train_step(batch()[:2], batch()[2])


def test_state_dict_round_trips_through_torch_save(tmp_path):
    _, model = models(2)
    pipe = conveyor.Pipeline(model, split_points=["block1"], microbatches=2, loss_fn=loss_fn)
    path = tmp_path / "state.pt"
    torch.save(pipe.state_dict(), path)
    _, other = models(3)
    other_pipe = conveyor.Pipeline(other, split_points=["block1"], microbatches=2, loss_fn=loss_fn)
    x, gate, _ = batch()
    assert not torch.equal(pipe(x, gate), other_pipe(x, gate))
    assert other_pipe.load_state_dict(torch.load(path)) == ([], [])
    assert torch.equal(pipe(x, gate), other_pipe(x, gate))
    state = pipe.state_dict()
    state["extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unexpected 'extra'"):
        other_pipe.load_state_dict(state)
    assert other_pipe.load_state_dict(state, strict=False).unexpected_keys == ["extra"]


def test_step_result_shows_where_the_time_went(tmp_path):
    _, model = models()
    x, gate, y = batch(24)
    pipe = conveyor.Pipeline(model, split_points=["block1"], microbatches=4, schedule="1f1b", loss_fn=loss_fn,
                             balance="time", sample=((x, gate), y))
    result = pipe.train_step((x, gate), y)
    assert isinstance(result, conveyor.StepResult)
    assert 0 <= result.bubble < 1
    assert len(result.busy_seconds) == pipe.num_stages == 2
    assert [len(events) for events in result.trace] == [8, 8]  # 4 forwards and 4 backwards per stage
    path = tmp_path / "step.json"
    result.write_chrome_trace(str(path))
    events = json.loads(path.read_text())
    assert len([e for e in events["traceEvents"] if e.get("ph") == "X"]) == 16
    svg = result.timeline_svg()
    assert svg.startswith("<svg") and ">predicted</text>" in svg and ">measured</text>" in svg
    assert result.prediction is not None and result.prediction["step_seconds"] > 0
    assert len(result.prediction["stages"]) == 2
    with pytest.raises(ValueError, match="must end in .svg"):
        result.write_timeline(str(tmp_path / "step.png"))


def test_schedule_svg_draws_named_schedules_on_one_axis():
    svg = conveyor.schedule_svg(["1f1b", "zb-v"], workers=4, microbatches=8)
    assert svg.startswith("<svg")
    # 1F1B's bubble on 4 stages of F = 1, B = 2 and 8 micro-batches: 3 * 3 / (3 * 3 + 8 * 3) = 27%.
    assert ">1f1b: 4 workers, 8 micro-batches, bubble 27%</text>" in svg
    assert ">zb-v: 4 workers, 8 micro-batches, bubble " in svg
    assert ">stage 3</text>" in svg and ">worker 3</text>" in svg  # a V's rows are workers of two stages
    assert conveyor.schedule_svg("gpipe", 2, 4).count(">stage ") == 2
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        conveyor.schedule_svg("nope", 4, 8)
    with pytest.raises(ValueError, match="dualpipev"):
        conveyor.schedule_svg("dualpipev", 4, 2)  # fewer micro-batches than it takes
    # Sharded stages: a strip of gathers and reductions under each worker, and its legend.
    plain, sharded = conveyor.schedule_svg("zb-v", 4, 8), conveyor.schedule_svg("zb-v", 4, 8, shard="parameters")
    gathers = sharded.count('fill="#54a24b"')  # one UNSHARD per stage, the legend's swatch besides
    assert 'fill="#54a24b"' not in plain and gathers == 8 + 1, gathers
    assert sharded.count('fill="#b279a2"') == 8 + 1 and ">REDUCE_GRAD (reduce across replicas)</text>" in sharded
    with pytest.raises(ValueError, match="unknown sharding level 'zero3'.*'parameters'"):
        conveyor.schedule_svg("1f1b", 2, 4, shard="zero3")


def test_every_option_is_a_keyword_with_the_cpp_default_and_reaches_the_pipeline():
    import inspect
    table = {row["name"]: row for row in conveyor._C.option_table() if row["type"] is not None}
    params = inspect.signature(conveyor.Pipeline.__init__).parameters
    for name, row in table.items():
        assert params[name].default == row["default"], name
    # Untouched options run with their defaults: the options read back are the
    # ones given (the cut the split points resolve to is not written back as
    # boundaries, so they build the same pipeline again).
    x, gate, _ = batch()
    pipe = conveyor.Pipeline(TwoInputs(), split_points=["block1"], loss_fn=loss_fn, example_inputs=(x, gate))
    changed = {k for k, v in pipe.options.items() if v != table[k]["default"]}
    assert changed == {"split_points"}, changed
    assert pipe.options["boundaries"] == [] and pipe.num_workers == 2
    # Values given arrive as given, each converted as its row says.
    pipe = conveyor.Pipeline(TwoInputs(), split_points=["block1"], loss_fn=loss_fn, example_inputs=(x, gate),
                             microbatches=2, timeout=2.5,
                             clip_norm_type="inf", autocast=torch.bfloat16, loss_scaling={"init_scale": 8.0},
                             optimizer="sgd", lr=0.1, weight_decay=0.01, loss_reduction="sum", clip_grad_value=0.5)
    got = pipe.options
    assert (got["microbatches"], got["timeout"], got["autocast"]) == (2, 2.5, "bf16")
    assert got["clip_norm_type"] == float("inf") and got["clip_grad_value"] == 0.5
    assert got["loss_scaling"] == {"init_scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 2000}
    assert (got["optimizer"], got["lr"], got["weight_decay"], got["loss_reduction"]) == ("sgd", 0.1, 0.01, "sum")
    # A row of the distributed section is refused in one process, not ignored.
    with pytest.raises(ValueError, match="option 'shared_memory' is for a pipeline across processes"):
        conveyor.Pipeline(TwoInputs(), loss_fn=loss_fn, shared_memory=False)


def test_help_documents_every_argument():
    import inspect
    doc = conveyor.Pipeline.__doc__
    for name in inspect.signature(conveyor.Pipeline.__init__).parameters:
        if name not in ("self", "unknown"):
            assert name in doc, name


@pytest.mark.parametrize("keyword, message", [
    ({"stages": 2}, "unknown keyword argument 'stages'; did you mean workers"),
    ({"micro_batches": 2}, "unknown keyword argument 'micro_batches'; did you mean microbatches"),
    ({"shard_optimizer_state": True},
     "unknown keyword argument 'shard_optimizer_state'; did you mean shard=\"optimizer\""),
    ({"frobnicate": True}, "unknown keyword argument 'frobnicate'"),
])
def test_unknown_keywords_are_refused_by_name(keyword, message):
    with pytest.raises(TypeError, match=message):
        conveyor.Pipeline(TwoInputs(), loss_fn=loss_fn, **keyword)


@pytest.mark.parametrize("keyword, error, message", [
    ({"microbatches": "4"}, TypeError, "microbatches must be an int, got str"),
    ({"microbatches": 0}, ValueError, "microbatches must be at least 1"),
    ({"schedule": "zigzag"}, ValueError, "zigzag"),
    ({"balance": "weight"}, ValueError, "balance must be one of"),
    ({"timeout": -1}, ValueError, "timeout must be a positive number of seconds"),
    ({"autocast": "fp8"}, ValueError, "autocast must be one of"),
    ({"optimizer": "lamb"}, ValueError, "optimizer must be one of"),
    ({"loss_fn": 3}, TypeError, "loss_fn must be a callable"),
    ({"split_points": ["nowhere"]}, ValueError, "nowhere"),
    ({"lr": 0.1}, ValueError, "give 'optimizer' too"),
    ({"shared_memory": "yes"}, TypeError, "shared_memory must be True or False, got str"),
    ({"shard": "zero3"}, ValueError, "shard must be one of"),
    ({"workers": -1}, ValueError, "workers must be at least 0, got -1"),
    ({"clip_norm_type": "two"}, TypeError, "clip_norm_type must be a number, got str 'two'"),
])
def test_bad_options_are_refused_naming_them(keyword, error, message):
    kwargs = {"split_points": ["block1"], "loss_fn": loss_fn}
    kwargs.update(keyword)
    with pytest.raises(error, match=message):
        conveyor.Pipeline(TwoInputs(), **kwargs)


class Unscriptable(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), Odd())

    def forward(self, x):
        return self.inner(x)


class Odd(nn.Module):
    def forward(self, x):
        return x * len({"a": x}.items().__iter__.__name__)  # not TorchScript


def test_a_model_that_does_not_script_names_the_submodule_and_offers_the_other_front_ends():
    with pytest.raises(ValueError, match=r"submodule 'inner.1' \(Odd\)(.|\n)*front_end='export'"):
        conveyor.Pipeline(Unscriptable(), loss_fn=loss_fn, front_end="script")
    # torch.export runs the Python, so the default front end takes it.
    model = Unscriptable().double()
    pipe = conveyor.Pipeline(model, loss_fn=loss_fn)
    x = torch.randn(4, 4, dtype=torch.float64)
    assert torch.equal(pipe.forward(x), model(x))


def test_a_stalled_stage_is_a_timeout_error():
    import time
    _, model = models()

    # A timeout no ordinary forward outlasts on a loaded machine, and a stall
    # of three times it: stage 0 gives up waiting for the gradient first.
    def slow(out, target):
        time.sleep(3.0)
        return loss_fn(out, target)

    pipe = conveyor.Pipeline(model, split_points=["block1"], microbatches=2, loss_fn=slow, timeout=1.0)
    x, gate, y = batch()
    with pytest.raises(TimeoutError) as raised:
        pipe.train_step((x, gate), y)
    assert isinstance(raised.value, conveyor.PipelineTimeoutError)
    assert raised.value.stage == 0 and "timed out" in str(raised.value)


def test_the_pipelines_own_optimizer_with_a_python_learning_rate_schedule():
    _, model = models(4)
    seen = []

    def schedule(update):
        seen.append(update)
        return 0.05 / (1 + update)

    pipe = conveyor.Pipeline(model, split_points=["block1"], microbatches=4, schedule="pipedream", loss_fn=loss_fn,
                             optimizer="sgd", lr=0.05, lr_schedule=schedule)
    x, gate, y = batch(32)
    first = pipe.train_step((x, gate), y)
    for _ in range(10):
        last = pipe.train_step((x, gate), y)
    assert last.loss < first.loss
    assert first.updates == [4, 4]  # an update per micro-batch on every stage
    assert 0 in seen and max(seen) == 43  # 11 steps x 4 micro-batches, counted from 0 on each stage


def test_a_torch_version_mismatch_is_refused_at_import():
    code = "import torch; torch.__version__ = '0.0.1'; import conveyor"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert run.returncode != 0
    assert "ImportError" in run.stderr
    assert f"built against torch {torch.__version__}, but this environment has torch 0.0.1" in run.stderr


def test_the_schedule_names_are_the_schedule_librarys_wherever_they_are_shown():
    names = conveyor.schedule_names()
    assert names == conveyor.schedule_names(True) + conveyor.schedule_names(False)
    assert {"1f1b", "zb-v"} <= set(conveyor.schedule_names(True)) and "pipedream" in conveyor.schedule_names(False)
    row = next(r for r in conveyor._C.option_table() if r["name"] == "schedule")
    assert all(f'"{n}"' in row["doc"] for n in names), row["doc"]
    assert all(repr(n) in conveyor.Pipeline.__doc__ for n in names)
    with pytest.raises(ValueError, match="unknown schedule 'zb-x'"):
        conveyor.schedule_svg("zb-x", workers=2, microbatches=4)
