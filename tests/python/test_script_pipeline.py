"""torch.classes.conveyor.Pipeline: a TorchScript model pipelined from Python.

Gradients equal the unsplit model's, a torch.optim optimizer over
pipe.parameters() trains the pipeline's (and the ScriptModule's) weights,
state dicts and checkpoints use the model's names, and errors arrive as
Python exceptions that say what went wrong and where.
"""
import copy
import os
import sys
import warnings

import pytest
import torch
from torch import nn

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notices

# The models the C++ tests load as fixtures, here scripted in-process.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_testing import assert_same_grads, plugin  # noqa: E402,F401  (plugin: a fixture)
from make_fixtures import LstmOutput, Mlp, NonChain  # noqa: E402



class LstmLm(nn.Module):
    def __init__(self, vocab=30):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.rnn = LstmOutput(8, 12)
        self.proj = nn.Linear(12, vocab)

    def forward(self, tokens):
        return self.proj(self.rnn(self.embed(tokens)))


class Mse(nn.Module):
    def forward(self, out, target):
        return ((out - target) ** 2).mean()


def eager_and_scripted(cls, seed=0):
    torch.manual_seed(seed)
    eager = cls().double()
    return eager, torch.jit.script(copy.deepcopy(eager))


def batch(n=12):
    return torch.randn(n, 8, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)



def assert_step_equals_eager(pipe, eager, x, y):
    """One pipelined step gives the unsplit model's mean-squared-error loss and gradients."""
    loss = pipe.train_step(x, y)
    ref = nn.functional.mse_loss(eager(x), y)
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-10)
    assert_same_grads(pipe, eager)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_gradients_equal_the_unsplit_models(schedule, stages):
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"workers": stages, "microbatches": 3, "schedule": schedule})
    assert pipe.num_stages() == stages
    x, y = batch()
    assert_step_equals_eager(pipe, eager, x, y)


@pytest.mark.parametrize(
    "options",
    [
        {"workers": 2, "microbatches": 4, "schedule": "interleaved"},
        {"workers": 2, "microbatches": 3, "schedule": "zb-h1", "recompute": True},
        {"workers": 2, "microbatches": 4, "schedule": "zb-interleaved", "offload": "true"},
        {"workers": 2, "microbatches": 3, "schedule": "zb-v"},
        {"workers": 2, "microbatches": 4, "schedule": "dualpipev", "recompute": True},
        {"workers": 2, "microbatches": 5, "schedule": "v-min"},
    ],
)
def test_interleaved_and_zero_bubble_schedules_give_the_unsplit_gradients(options):
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, options)
    x, y = batch()
    assert_step_equals_eager(pipe, eager, x, y)


def test_balance_by_time_profiles_a_sample_and_predicts():
    eager, scripted = eager_and_scripted(Mlp)
    x, y = batch()
    pipe = torch.classes.conveyor.Pipeline(
        scripted, {"workers": 2, "microbatches": 3, "balance": "time", "sample": (x, y)})
    plan = pipe.plan()
    assert "plan (balance: time): 2 stages" in plan and "predicted step" in plan
    assert_step_equals_eager(pipe, eager, x, y)
    with pytest.raises(ValueError, match="balance by time profiles the model on a sample batch"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "balance": "time"})
    with pytest.raises(ValueError, match="an \\(input, target\\) tuple"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "balance": "time", "sample": x})


def test_lstm_language_model_with_cross_entropy_and_string_options():
    eager, scripted = eager_and_scripted(LstmLm)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"workers": "3", "microbatches": "2", "loss": "cross_entropy"})
    tokens, target = torch.randint(30, (6, 5)), torch.randint(30, (6, 5))
    loss = pipe.train_step(tokens, target)
    out = eager(tokens)
    ref = nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-10)
    assert_same_grads(pipe, eager)


def assert_same_weights(pipe, eager, tol=1e-10):
    got = pipe.named_parameters()
    for name, p in eager.named_parameters():
        assert (got[name] - p).abs().max().item() <= tol, name


def has_fused_lstm():
    try:
        torch.ops.conveyor.lstm
        return True
    except (AttributeError, RuntimeError):
        return False


@pytest.mark.parametrize("stages", [1, 3])
def test_fused_ops_run_the_lstms_fused_with_the_same_gradients(stages):
    if not has_fused_lstm():
        pytest.skip("the plugin was built without the fused LSTM op")
    eager, scripted = eager_and_scripted(LstmLm)
    pipe = torch.classes.conveyor.Pipeline(
        scripted, {"workers": stages, "microbatches": 2, "loss": "cross_entropy", "fused_ops": True})
    report = pipe.fused_ops_report()
    assert "swapped 1, skipped 0" in report and "swapped rnn.lstm" in report, report
    tokens, target = torch.randint(30, (6, 5)), torch.randint(30, (6, 5))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = pipe.train_step(tokens, target)
    assert any(e.name == "conveyor::fused_lstm" for e in prof.events()), "the fused op did not run"
    out = eager(tokens)
    ref = nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1))
    ref.backward()
    assert loss == pytest.approx(ref.item(), abs=1e-10)
    assert_same_grads(pipe, eager)
    # The pipeline trains the caller's module: its tensors, not copies.
    assert {p.data_ptr() for p in pipe.parameters()} == {q.data_ptr() for q in scripted.parameters()}


def test_the_pipelines_own_optimizer_steps_in_train_step_like_torch_optim():
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(
        scripted, {"workers": 2, "microbatches": 3, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9})
    opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x, y = batch()
        pipe.train_step(x, y)
        opt.zero_grad()
        nn.functional.mse_loss(eager(x), y).backward()
        opt.step()
    assert_same_weights(pipe, eager)
    assert all(p.grad is None for p in pipe.parameters())  # train_step cleared them after its step


def test_asynchronous_schedules_from_python_update_after_every_microbatch():
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(
        scripted, {"workers": 1, "microbatches": 4, "schedule": "pipedream", "optimizer": "sgd", "lr": 0.1})
    x, y = batch()
    pipe.train_step(x, y)
    # One stage: PipeDream is plain SGD with one update per micro-batch.
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for xm, ym in zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4)):
        opt.zero_grad()
        nn.functional.mse_loss(eager(xm), ym).backward()
        opt.step()
    assert_same_weights(pipe, eager)

    _, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(
        scripted, {"workers": 3, "microbatches": 4, "schedule": "ddg", "optimizer": "adam", "lr": 0.01})
    losses = [pipe.train_step(x, y) for _ in range(20)]
    assert losses[-1] < 0.7 * losses[0], losses


def test_optimizer_options_are_checked():
    _, scripted = eager_and_scripted(Mlp)
    with pytest.raises(ValueError, match="'lr' sets the pipeline's own optimizer: give 'optimizer' too"):
        torch.classes.conveyor.Pipeline(scripted, {"lr": 0.1})
    with pytest.raises(ValueError, match="option 'optimizer' needs 'lr'"):
        torch.classes.conveyor.Pipeline(scripted, {"optimizer": "sgd"})
    with pytest.raises(ValueError, match="'momentum' is for optimizer 'sgd', not 'adam'"):
        torch.classes.conveyor.Pipeline(scripted, {"optimizer": "adam", "lr": 0.1, "momentum": 0.9})
    with pytest.raises(ValueError, match="optimizer must be one of 'sgd', 'adam', 'adamw', got str 'lbfgs'"):
        torch.classes.conveyor.Pipeline(scripted, {"optimizer": "lbfgs", "lr": 0.1})
    with pytest.raises(ValueError, match="needs its own"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "microbatches": 2, "schedule": "pipedream"})
    with pytest.raises(ValueError, match="option 'stages' is now 'workers'"):
        torch.classes.conveyor.Pipeline(scripted, {"stages": 2})


def test_split_points_pipeline_a_forward_that_is_no_chain():
    eager, scripted = eager_and_scripted(NonChain)
    with pytest.raises(ValueError, match=r"not a plain chain.*aten::add.*split points that work here: b, c"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2})
    pipe = torch.classes.conveyor.Pipeline(scripted, {"split_points": ["b"], "microbatches": 4})
    x, y = batch()
    pipe.train_step(x, y)
    nn.functional.mse_loss(eager(x), y).backward()
    assert_same_grads(pipe, eager)
    with pytest.raises(ValueError, match=r"split point 0 \('d'\) names no submodule"):
        torch.classes.conveyor.Pipeline(scripted, {"split_points": "d"})


def test_a_scripted_loss_module_gives_the_same_gradients():
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"split_points": "encoder.layer2,head", "microbatches": 4,
                                                      "loss": torch.jit.script(Mse())})
    assert pipe.num_stages() == 3
    x, y = batch()
    pipe.train_step(x, y)
    nn.functional.mse_loss(eager(x), y).backward()
    assert_same_grads(pipe, eager)


def test_torch_optim_over_parameters_trains_the_pipeline_and_the_script_module():
    eager, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "microbatches": 4})
    script_ptrs = {p.data_ptr() for p in scripted.parameters()}
    assert {p.data_ptr() for p in pipe.parameters()} == script_ptrs
    opt = torch.optim.Adam(pipe.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(eager.parameters(), lr=1e-2)
    x, y = batch(16)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        losses.append(pipe.train_step(x, y))
        opt.step()
        ref_opt.zero_grad()
        nn.functional.mse_loss(eager(x), y).backward()
        ref_opt.step()
    assert losses[-1] < losses[0]
    for name, p in eager.named_parameters():
        assert (pipe.state_dict()[name] - p).abs().max().item() <= 1e-10, name
    assert (scripted(x) - eager(x)).abs().max().item() <= 1e-10  # the caller's ScriptModule was trained
    assert (pipe.forward(x) - eager(x)).abs().max().item() <= 1e-10


def test_state_dict_moves_between_the_pipeline_and_the_model(tmp_path):
    eager, scripted = eager_and_scripted(Mlp)
    path = str(tmp_path / "mlp.pt")
    torch.jit.save(scripted, path)
    pipe = torch.classes.conveyor.Pipeline(path, {"workers": 2})  # from a file: its own copy
    state = pipe.state_dict()
    assert list(state) == list(eager.state_dict())
    other, _ = eager_and_scripted(Mlp, seed=5)
    pipe.load_state_dict(other.state_dict())
    x, _ = batch()
    assert (pipe.forward(x) - other(x)).abs().max().item() <= 1e-12
    eager.load_state_dict(pipe.state_dict())
    assert (eager(x) - other(x)).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="missing 'stem.weight'"):
        pipe.load_state_dict({k: v for k, v in state.items() if k != "stem.weight"})
    with pytest.raises(ValueError, match="'head.bias' has shape"):
        pipe.load_state_dict({**state, "head.bias": torch.zeros(4, dtype=torch.float64)})


def test_checkpoint_is_read_by_torch_load_and_restores_the_weights(tmp_path):
    _, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "microbatches": 2})
    path = str(tmp_path / "run.ckpt")
    pipe.save_checkpoint(path, 7)
    saved = pipe.state_dict()
    ckpt = torch.load(path)
    assert ckpt["format"] == "conveyor-checkpoint" and ckpt["step"] == 7 and ckpt["num_stages"] == 2
    assert list(ckpt["model"]) == list(saved)
    for name, t in saved.items():
        assert torch.equal(ckpt["model"][name], t), name
    assert ckpt["stages"][1]["parameters"] == ["head.weight", "head.bias"]
    # The options as Python gives them, lists included (weights-only loading refuses typed ones).
    options = ckpt["options"]
    assert (options["workers"], options["microbatches"], options["timeout"]) == (2, 2, 300.0)
    assert options["boundaries"] == [] and options["tied_parameters"] == [] and options["loss_scaling"] is None
    with torch.no_grad():
        for p in pipe.parameters():
            p.zero_()
    assert pipe.load_checkpoint(path) == 7
    for name, t in pipe.state_dict().items():
        assert torch.equal(t, ckpt["model"][name]), name
    # At another number of stages it reshards: the same weights by name.
    three = torch.classes.conveyor.Pipeline(scripted, {"workers": 3})
    assert three.load_checkpoint(path) == 7
    for name, t in three.state_dict().items():
        assert torch.equal(t, ckpt["model"][name]), name
    # The plain state dict and the checkpoint's weights load into the unsplit
    # eager model, which then gives the pipeline's loss.
    eager, _ = eager_and_scripted(Mlp)
    state = str(tmp_path / "model.pt")
    three.save_model_state(state)
    x = batch(6)[0]
    want = three.forward(x)
    for weights in (torch.load(state), ckpt["model"]):
        eager.load_state_dict(weights)
        assert torch.allclose(eager(x), want, rtol=0, atol=1e-12)
    random = torch.classes.conveyor.Pipeline(scripted, {"workers": 3, "stage_rng": True})
    with pytest.raises(ValueError, match="is of a pipeline of 2 stages, this one has 3.*stage_rng"):
        random.load_checkpoint(path)


def test_errors_in_stages_arrive_as_python_exceptions_naming_the_stage():
    _, scripted = eager_and_scripted(Mlp)
    pipe = torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "microbatches": 2})
    x, _ = batch(4)
    with pytest.raises(RuntimeError, match=r"stage 1 failed in 1F0 .*mse_loss|stage 1 failed"):
        pipe.train_step(x, torch.randn(4, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"stage 0 failed in 0F0 \(forward of micro-batch 0\): layer stem"):
        pipe.forward(torch.randn(4, 7, dtype=torch.float64))


def test_bad_arguments_are_clear_errors(tmp_path):
    _, scripted = eager_and_scripted(Mlp)
    with pytest.raises(ValueError, match=r"unknown option 'stagez' \(known: .*workers"):
        torch.classes.conveyor.Pipeline(scripted, {"stagez": 2})
    with pytest.raises(ValueError, match="microbatches must be an int, got str 'many'"):
        torch.classes.conveyor.Pipeline(scripted, {"microbatches": "many"})
    with pytest.raises(ValueError, match="the model must be a TorchScript module"):
        torch.classes.conveyor.Pipeline(torch.zeros(3), {})
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="not a readable zip archive"):
        torch.classes.conveyor.Pipeline(str(bad), {})


# --- training options -----------------------------------------------------------


def test_loss_scaling_and_clipping_follow_grad_scaler_and_clip_grad_norm_on_the_unsplit_model():
    # Steps 1 and 4 overflow (an inf in the input): GradScaler skips them and
    # backs off; the pipeline must skip the same steps with the same scales.
    eager, scripted = eager_and_scripted(Mlp, seed=3)
    pipe = torch.classes.conveyor.Pipeline(
        scripted,
        {"workers": 2, "microbatches": 2, "schedule": "gpipe", "optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
         "clip_grad_norm": 0.05, "loss_scaling": {"init_scale": 1024.0, "growth_interval": 2.0}})
    opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    for step in range(6):
        x, y = batch(8)
        overflow = step in (1, 4)
        if overflow:
            x[0, 0] = float("inf")
        pipe.train_step(x, y)
        info = pipe.last_step()
        opt.zero_grad()
        scaler.scale(((eager(x) - y) ** 2).mean()).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.05)
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        assert info["loss_scale"] == scale_before, step
        assert info["skipped_updates"] == (1.0 if overflow else 0.0), step
        assert info["stepped"] == (0.0 if overflow else 1.0), step
        if not overflow:
            assert norm.item() > 0.05 and abs(info["grad_norm"] - norm.item()) <= 1e-10, step
        got = pipe.named_parameters()
        for name, p in eager.named_parameters():
            assert torch.allclose(got[name], p, rtol=0, atol=1e-10), (step, name)


def test_bad_training_options_are_value_errors():
    _, scripted = eager_and_scripted(Mlp)
    with pytest.raises(ValueError, match="autocast"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "autocast": "int8"})
    with pytest.raises(ValueError, match="call Pipeline::clip_grad_norm"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "clip_grad_norm": 1.0})
    with pytest.raises(ValueError, match="loss scaling needs the pipeline's own optimizer"):
        torch.classes.conveyor.Pipeline(scripted, {"workers": 2, "loss_scaling": True})
