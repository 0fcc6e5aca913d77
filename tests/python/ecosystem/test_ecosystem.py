"""Models from the ecosystem (torchvision, Hugging Face transformers) through
conveyor.Pipeline as a user brings them: the module itself, cut inside its
stack of blocks, exported with torch.export by default. In float64, each
trains as eager PyTorch does, micro-batch by micro-batch (batch norm's
running statistics included), under 1F1B, zero-bubble and interleaved
schedules, and a few AdamW steps over the module's own parameters match."""
import copy
import pathlib
import sys

import pytest
import torch

import conveyor

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from ecosystem_models import CASES, missing  # noqa: E402

MICROBATCHES = 4
TOLERANCE = 1e-10


def skip_if_missing(name):
    why = missing(name)
    if why:
        pytest.skip(why)


def eager_step(case, model):
    return case.eager_step(model, MICROBATCHES)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved", "zb-v"])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_and_statistics_equal_eager_pytorch(name, schedule):
    skip_if_missing(name)
    case = CASES[name]()
    eager = copy.deepcopy(case.model)
    two_chunks = schedule in ("interleaved", "zb-v")  # 2 workers of 2 chunks: looped, or in a V
    split = case.four_stages if two_chunks else case.split_points
    pipe = conveyor.Pipeline(case.model, split_points=split, microbatches=MICROBATCHES, schedule=schedule,
                             loss_fn=case.loss_fn, workers=2 if two_chunks else None, **case.keywords)
    result = pipe.train_step(case.inputs, case.target)
    assert pipe.num_stages == len(split) + 1
    assert abs(result.loss - eager_step(case, eager)) <= TOLERANCE
    # The pipeline's parameters are the module's own, named as PyTorch names them.
    assert [n for n, _ in pipe.named_parameters()] == [n for n, _ in eager.named_parameters()]
    assert list(pipe.state_dict()) == list(eager.state_dict())
    mine = dict(case.model.named_parameters())
    for n, p in pipe.named_parameters():
        assert p is mine[n], n
    for n, p in eager.named_parameters():
        worst = (mine[n].grad - p.grad).abs().max().item()
        assert worst <= TOLERANCE, f"{n}: gradient differs by {worst}"
    for n, b in eager.named_buffers():
        got = dict(case.model.named_buffers())[n]
        assert torch.allclose(got.double(), b.double(), rtol=0, atol=TOLERANCE), n


@pytest.mark.parametrize("name", ["resnet18", "gpt2"])
def test_adamw_over_the_modules_parameters_steps_as_eager(name):
    skip_if_missing(name)
    case = CASES[name](seed=1)
    eager = copy.deepcopy(case.model)
    # The optimizer is made over the module before the pipeline: the pipeline trains those tensors.
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    pipe = conveyor.Pipeline(case.model, split_points=case.split_points, microbatches=MICROBATCHES, schedule="1f1b",
                             loss_fn=case.loss_fn, **case.keywords)
    for step in range(3):
        loss = pipe.train_step(case.inputs, case.target).loss
        assert abs(loss - eager_step(case, eager)) <= 1e-9, step
        opt.step(), ref.step(), opt.zero_grad(), ref.zero_grad()
    for n, p in eager.named_parameters():
        worst = (dict(case.model.named_parameters())[n] - p).abs().max().item()
        assert worst <= 1e-9, f"{n}: differs by {worst} after 3 AdamW steps"
    # Inference through the pipeline is the trained module's, in evaluation mode too.
    for mode in (True, False):
        pipe.train(mode), eager.train(mode)
        with torch.no_grad():  # micro-batch by micro-batch, as the pipeline runs (batch norm's statistics)
            want = torch.cat([case.forward(eager, *[t.chunk(MICROBATCHES)[i] for t in case.inputs])
                              for i in range(MICROBATCHES)])
        assert torch.allclose(pipe.forward(*case.inputs), want, rtol=0, atol=1e-9), mode


def test_torchscript_cuts_torchvision_resnet_inside_its_helper_method():
    """ResNet's forward is self._forward_impl(x): its layers are called there."""
    skip_if_missing("resnet18")
    case = CASES["resnet18"]()
    eager = copy.deepcopy(case.model)
    pipe = conveyor.Pipeline(case.model, split_points=["layer2", "layer4"], microbatches=MICROBATCHES,
                             loss_fn=case.loss_fn, front_end="script")
    result = pipe.train_step(case.inputs, case.target)
    assert abs(result.loss - eager_step(case, eager)) <= TOLERANCE
    for n, p in eager.named_parameters():
        assert (dict(case.model.named_parameters())[n].grad - p.grad).abs().max().item() <= TOLERANCE, n


def test_a_model_the_front_ends_cannot_take_is_refused_naming_the_construct():
    case = CASES["gpt2"]()
    # As it comes, GPT-2 returns its key/value cache, which no list of tensors holds.
    with pytest.raises(ValueError, match=r"DynamicCache(.|\n)*choose the tensors the loss reads with output="):
        conveyor.Pipeline(case.model, split_points=case.split_points, loss_fn=case.loss_fn,
                          example_inputs=case.inputs)
    # Traced, its output projection reads the embedding inside a call in another stage: refused, naming both.
    with pytest.raises(ValueError, match=r"'lm_head.weight' \(the tensor of 'transformer.wte.weight'\)"):
        conveyor.Pipeline(case.model, split_points=case.split_points, loss_fn=case.loss_fn, front_end="trace",
                          example_inputs=case.inputs, **case.keywords)
    # TorchScript does not compile it, and says which submodule and which construct.
    with pytest.raises(ValueError, match=r"TorchScript cannot compile submodule '[\w.]+' \(\w+\)"):
        conveyor.Pipeline(case.model, split_points=case.split_points, loss_fn=case.loss_fn, front_end="script")


def test_an_encoder_decoder_takes_its_inputs_by_name():
    """Hugging Face's T5: input_ids and decoder_input_ids by keyword, cut
    before the decoder (the encoder's output crosses the cut), the
    embedding shared by encoder, decoder and head."""
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    config = T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).double()
    eager = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(96, (8, 10), generator=g),
             "decoder_input_ids": torch.randint(96, (8, 6), generator=g)}
    target = torch.randint(96, (8, 6), generator=g)
    loss_fn = CASES["gpt2"]().loss_fn
    pipe = conveyor.Pipeline(model, split_points=["decoder"], microbatches=MICROBATCHES, schedule="1f1b",
                             loss_fn=loss_fn, output="logits", model_kwargs={"use_cache": False})
    result = pipe.train_step(batch, target)
    expected = 0.0
    for i in range(MICROBATCHES):
        out = eager(**{k: v.chunk(MICROBATCHES)[i] for k, v in batch.items()}, use_cache=False).logits
        loss = loss_fn(out, target.chunk(MICROBATCHES)[i]) / MICROBATCHES
        loss.backward()
        expected += loss.item()
    assert abs(result.loss - expected) <= TOLERANCE
    assert [n for n, _ in pipe.named_parameters()] == [n for n, _ in eager.named_parameters()]
    for n, p in eager.named_parameters():
        assert (dict(model.named_parameters())[n].grad - p.grad).abs().max().item() <= TOLERANCE, n
