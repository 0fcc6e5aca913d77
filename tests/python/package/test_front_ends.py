"""How conveyor.Pipeline takes an nn.Module: exported with torch.export by
default (from example_inputs, a sample, or the first step's inputs), the
module's own tensors trained, tied weights as one parameter under their
first name; TorchScript and tracing by keyword; what is refused, and how."""
import copy
import pathlib
import sys
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import conveyor

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from make_export_fixtures import TiedLm as ExportedTiedLm  # noqa: E402


class TiedLm(ExportedTiedLm):
    """A language model whose output projection is its embedding, with a
    non-persistent buffer, returning a dict."""

    def __init__(self):
        super().__init__(vocab=20, width=8)

    def forward(self, tokens):
        return {"logits": super().forward(tokens), "hidden": self.embed(tokens)}


def token_loss(out, target):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def tokens(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, (6, 5), generator=g), torch.randint(20, (6, 5), generator=g)


def tied_model():
    torch.manual_seed(0)
    return TiedLm().double()


def test_a_module_is_exported_at_its_first_step_and_its_own_tensors_train():
    model = tied_model()
    eager = copy.deepcopy(model)
    pipe = conveyor.Pipeline(model, split_points=["head"], microbatches=3, loss_fn=token_loss, output="logits")
    assert "first train_step" in repr(pipe)
    with pytest.raises(RuntimeError, match="exported at the first train_step or forward"):
        pipe.num_stages
    # Before it is built, the pipeline's weights are the module's: an optimizer may be made now.
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    x, y = tokens()
    for _ in range(4):
        pipe.train_step(x, y)
        token_loss(eager(x)["logits"], y).backward()
        opt.step(), ref.step(), opt.zero_grad(), ref.zero_grad()
    assert pipe.num_stages == 2
    for name, p in eager.named_parameters():
        assert torch.allclose(dict(model.named_parameters())[name], p, rtol=0, atol=1e-12), name
    # The module itself holds the trained weights, and the pipeline's output is the model's.
    assert torch.allclose(pipe.forward(x), eager(x)["logits"], rtol=0, atol=1e-12)
    assert torch.allclose(model(x)["logits"], eager(x)["logits"], rtol=0, atol=1e-12)


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.register_buffer("shift", torch.full((8,), 0.5))

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)) + self.shift)))


def test_an_optimizer_over_the_modules_own_parameters_trains_its_stages_on_their_devices():
    """With devices=, each stage's parameters and buffers are moved to its
    device in place (as nn.Module.to moves them): the module's own objects,
    so an optimizer made over model.parameters() before the pipeline, as
    tutorials make it, steps what trains. Two stages on "cpu" here; the GPU
    machine runs the same with "cuda:0" (tests/python/gpu/device_pipeline_check.py)."""
    torch.manual_seed(3)
    model = Chain().double()
    eager = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    pipe = conveyor.Pipeline(model, split_points=["b"], workers=2, microbatches=2, devices=["cpu", "cpu"],
                             loss_fn=F.mse_loss)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        x, y = torch.randn(6, 4, generator=g, dtype=torch.double), torch.randn(6, 3, generator=g, dtype=torch.double)
        pipe.train_step(x, y)
        F.mse_loss(eager(x), y).backward()
        opt.step(), ref.step(), opt.zero_grad(), ref.zero_grad()
    own = dict(model.named_parameters())
    assert [n for n, _ in pipe.named_parameters()] == list(own)
    assert all(p is own[n] for n, p in pipe.named_parameters()), "the module's own parameter objects"
    for name, p in eager.named_parameters():
        assert torch.allclose(own[name], p, rtol=0, atol=1e-10), name
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in pipe.state_dict().items())


def test_the_options_are_parsed_and_checked_once_a_construction():
    """At construction (a bad option fails there), never again when the
    exported module is built at the first step."""
    for front_end in ("export", "script"):
        before = conveyor._C.request_counts()
        pipe = conveyor.Pipeline(Chain().double(), split_points=["b"], microbatches=2, loss_fn=F.mse_loss,
                                 front_end=front_end)
        pipe.train_step(torch.randn(4, 4, dtype=torch.double), torch.randn(4, 3, dtype=torch.double))
        after = conveyor._C.request_counts()
        assert {k: after[k] - before[k] for k in after} == {"parses": 1, "checks": 1, "plan_checks": 1,
                                                            "kind_checks": 1}, front_end


def test_a_tied_weight_is_one_parameter_by_its_first_name_and_every_state_dict_key():
    model = tied_model()
    pipe = conveyor.Pipeline(model, split_points=["head"], microbatches=2, loss_fn=token_loss, output="logits",
                             example_inputs=tokens()[0])
    assert [n for n, _ in pipe.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert "head.weight" not in dict(pipe.named_parameters())  # the embedding's first name only
    assert list(pipe.state_dict()) == list(model.state_dict())  # both names; the non-persistent buffer in neither
    assert "scale" in dict(pipe.named_buffers())
    assert len(pipe.parameters()) == len(list(model.parameters()))
    # A state dict loads back into both stages' copies.
    state = {k: v + 1 for k, v in model.state_dict().items()}
    pipe.load_state_dict(state)
    x, _ = tokens()
    assert torch.allclose(pipe.forward(x), TiedLm.forward(model, x)["logits"], rtol=0, atol=1e-12)


def test_the_output_a_loss_reads_is_chosen_by_key_index_or_callable():
    x, y = tokens()
    for output in ("logits", lambda out: out["logits"]):
        model = tied_model()
        pipe = conveyor.Pipeline(model, microbatches=2, loss_fn=token_loss, output=output)
        pipe.train_step(x, y)
        assert torch.allclose(pipe.forward(x), model(x)["logits"], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"output='logit'(.|\n)*it has logits, hidden"):
        conveyor.Pipeline(tied_model(), loss_fn=token_loss, output="logit", example_inputs=x)


class Keywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x, scale=1.0, return_both=False):
        h = self.a(x) * scale
        return (self.b(h), h) if return_both else self.b(h)


def test_model_kwargs_reach_every_forward():
    torch.manual_seed(1)
    model = Keywords().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    pipe = conveyor.Pipeline(model, split_points=["b"], microbatches=2, loss_fn=F.mse_loss, output=0,
                             model_kwargs={"scale": 3.0, "return_both": True})
    result = pipe.train_step(x, y)
    expected = F.mse_loss(model(x, scale=3.0), y)
    assert abs(result.loss - expected.item()) <= 1e-12


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return self.b(h if h.sum() > 0 else -h)  # data-dependent: torch.export cannot take it


class Unpacking(nn.Module):
    """A block TorchScript cannot compile: a tensor unpacked as a tuple."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, h):
        q, k, v = self.qkv(h).view(h.shape[0], 3, 4).permute(1, 0, 2)
        return q * k + v


def test_torchscripts_refusal_names_the_submodule_and_its_first_error():
    # The whole model's attempt half-compiles the class; the submodule's
    # second attempt would only say "Can't redefine method".
    with pytest.raises(ValueError, match=r"cannot compile submodule 'block' \(Unpacking\): "
                                         r"(.|\n)*Tensor cannot be used as a tuple") as refused:
        conveyor.Pipeline(nn.Sequential(OrderedDict(a=nn.Linear(4, 4), block=Unpacking())), split_points=["block"],
                          front_end="script")
    assert "redefine" not in str(refused.value)


def test_what_the_front_ends_refuse_is_named_with_the_alternative(capfd):
    x = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"torch.export cannot export the model(.|\n)*front_end='script'") as refused:
        conveyor.Pipeline(Branchy(), loss_fn=F.mse_loss, example_inputs=x)
    # What failed in a few lines, at the forward's own line; torch's whole error and the graph it printed are
    # kept on the error, not written to the terminal.
    message = str(refused.value)
    assert len(message.splitlines()) <= 6 and "in forward" in message and "if " in message, message
    assert "def forward" in refused.value.export_output and "def forward" not in capfd.readouterr().err
    assert isinstance(refused.value.torch_error, Exception)
    # TorchScript compiles the branch.
    pipe = conveyor.Pipeline(Branchy(), split_points=["b"], loss_fn=F.mse_loss, front_end="script")
    assert pipe.forward(x).shape == (4, 4)
    with pytest.raises(ValueError, match="split point 'bdy' names no submodule of the TiedLm; did you mean body"):
        conveyor.Pipeline(tied_model(), split_points=["bdy"], loss_fn=token_loss)
    with pytest.raises(ValueError, match="front_end must be one of 'export', 'script', 'trace'"):
        conveyor.Pipeline(tied_model(), front_end="fx")
    with pytest.raises(ValueError, match="front_end='trace' records one run: give example_inputs"):
        conveyor.Pipeline(tied_model(), front_end="trace")
    with pytest.raises(ValueError, match="output and model_kwargs shape the forward"):
        conveyor.Pipeline(torch.jit.script(Branchy()), output=0)
    # One rule, in C++: asked of the front end before the export, and of a program given as it is.
    exported_operators = "fused_ops swaps TorchScript submodules and torch::nn layers; a torch.export program runs"
    with pytest.raises(ValueError, match=exported_operators):
        conveyor.Pipeline(tied_model(), front_end="export", fused_ops=True)
    program = torch.export.export(Two(), (torch.randn(3, 4),))
    with pytest.raises(ValueError, match=exported_operators):
        conveyor.Pipeline(program, fused_ops=True, loss_fn=F.mse_loss)
    with pytest.raises(ValueError, match="optimize lets the TorchScript executor optimize the stages; the model is a "
                                         "torch.export program"):
        conveyor.Pipeline(tied_model(), front_end="export", optimize=True)
    # Options that need no model are refused at once, before any export.
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'"):
        conveyor.Pipeline(tied_model(), schedule="zigzag")
    with pytest.raises(ValueError, match='plan "auto" profiles the model: give sample'):
        conveyor.Pipeline(tied_model(), plan="auto", loss_fn=token_loss)


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_tracing_and_scripting_stay_selectable():
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    for front_end in ("trace", "script"):
        torch.manual_seed(3)
        model = Two().double()
        eager = copy.deepcopy(model)
        example = {"example_inputs": x} if front_end == "trace" else {}
        pipe = conveyor.Pipeline(model, split_points=["b"], microbatches=2, loss_fn=F.mse_loss, front_end=front_end,
                                 **example)
        assert isinstance(pipe.model, nn.Module) and pipe.num_stages == 2
        result = pipe.train_step(x, y)
        expected = F.mse_loss(eager(x), y)
        expected.backward()
        assert abs(result.loss - expected.item()) <= 1e-12, front_end
        for name, p in eager.named_parameters():
            assert torch.allclose(dict(pipe.named_parameters())[name].grad, p.grad, rtol=0, atol=1e-12), name


def test_an_eval_mode_module_builds_in_eval_and_trains_after_train():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2)).double().eval()
    eager = copy.deepcopy(model)
    x = torch.randn(8, 4, dtype=torch.float64)
    pipe = conveyor.Pipeline(model, split_points=["2"], microbatches=2, loss_fn=F.mse_loss, example_inputs=x)
    assert not pipe.training and not model.training  # exported in training mode, the module's modes restored
    assert torch.allclose(pipe.forward(x), eager(x), rtol=0, atol=1e-12)  # running statistics, no dropout
    pipe.train()
    before = model[1].running_mean.clone()
    pipe.train_step(x, torch.randn(8, 2, dtype=torch.float64))
    assert not torch.equal(model[1].running_mean, before)  # batch statistics, in the module's own buffer


class HelperAndNumbers(nn.Module):
    """A forward that calls a helper method (as torchvision's _forward_impl)
    and keeps an int and a float, made before the cut, for after it."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self._forward_impl(x)

    def _forward_impl(self, x):
        width = x.size(1)
        scale = float(width) ** 0.5
        h = self.b(torch.tanh(self.a(x)))
        return self.c(h) * scale / width


@pytest.mark.parametrize("front_end", ["script", "export"])
def test_torchscript_cuts_inside_helper_methods_and_sends_numbers_across(front_end):
    torch.manual_seed(4)
    model = HelperAndNumbers().double()
    eager = copy.deepcopy(model)
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    pipe = conveyor.Pipeline(model, split_points=["b", "c"], microbatches=3, loss_fn=F.mse_loss, front_end=front_end)
    result = pipe.train_step(x, y)
    expected = sum(F.mse_loss(eager(a), t) for a, t in zip(x.chunk(3), y.chunk(3))) / 3
    expected.backward()
    assert pipe.num_stages == 3
    assert abs(result.loss - expected.item()) <= 1e-12
    for name, p in eager.named_parameters():
        assert torch.allclose(dict(pipe.named_parameters())[name].grad, p.grad, rtol=0, atol=1e-12), name


class ByName(nn.Module):
    """A forward whose tensors come by keyword, as Hugging Face's do."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None):
        return self.b(self.a(input_ids) * attention_mask + decoder_input_ids)


def test_inputs_given_by_name_bind_the_forwards_keyword_arguments():
    torch.manual_seed(5)
    model = ByName().double()
    eager = copy.deepcopy(model)
    g = torch.Generator().manual_seed(5)
    batch = {"decoder_input_ids": torch.randn(6, 4, generator=g, dtype=torch.float64),
             "input_ids": torch.randn(6, 4, generator=g, dtype=torch.float64),
             "attention_mask": (torch.rand(6, 4, generator=g) > 0.3).double()}
    y = torch.randn(6, 2, generator=g, dtype=torch.float64)
    pipe = conveyor.Pipeline(model, split_points=["b"], microbatches=2, loss_fn=F.mse_loss)
    result = pipe.train_step(batch, y)
    expected = sum(F.mse_loss(eager(**{k: v.chunk(2)[i] for k, v in batch.items()}), y.chunk(2)[i])
                   for i in range(2)) / 2
    expected.backward()
    assert abs(result.loss - expected.item()) <= 1e-12
    for name, p in eager.named_parameters():
        assert torch.allclose(dict(pipe.named_parameters())[name].grad, p.grad, rtol=0, atol=1e-12), name
    reordered = dict(reversed(list(batch.items())))  # the names bind, not the order
    assert torch.allclose(pipe.forward(reordered), eager(**batch), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="has the keys input_ids; the pipeline was built for decoder_input_ids"):
        pipe.train_step({"input_ids": batch["input_ids"]}, y)
    with pytest.raises(ValueError, match="takes its inputs by name"):
        pipe.train_step(batch["input_ids"], y)
    with pytest.raises(ValueError, match="binds keyword arguments of an nn.Module's forward"):
        conveyor.Pipeline(torch.jit.script(Two()), split_points=["b"], loss_fn=F.mse_loss).train_step(batch, y)


def test_save_model_state_is_what_the_unsplit_module_loads_strictly(tmp_path):
    """The plain state dict by the module's own keys: a tied weight under
    both its names, no non-persistent buffer, so load_state_dict is strict."""
    model = tied_model()
    x, y = tokens()
    pipe = conveyor.Pipeline(model, split_points=["head"], microbatches=3, loss_fn=token_loss, output="logits",
                             optimizer="sgd", lr=0.1, example_inputs=x)
    pipe.train_step(x, y)
    pipe.save_model_state(tmp_path / "model.pt")
    saved = torch.load(tmp_path / "model.pt")
    assert list(saved) == list(model.state_dict())
    fresh = TiedLm().double()
    fresh.load_state_dict(saved)  # strict
    for name, t in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), name
