"""torch.ops.conveyor.fused_attention from Python: same values and gradients
as torch.nn.functional.scaled_dot_product_attention on CPU in float64."""
import os

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(scope="module", autouse=True)
def plugin():
    torch.ops.load_library(os.environ["CONVEYOR_LIB"])


def _inputs(b, h, sq, sk, d, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda s: torch.randn(b, h, s, d, generator=g, dtype=torch.float64, requires_grad=True)
    return make(sq), make(sk), make(sk), torch.randn(b, h, sq, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize(
    "shape,causal,padded",
    [
        ((2, 3, 17, 17, 64), False, False),
        ((1, 2, 1, 1, 64), False, False),
        ((2, 2, 13, 29, 128), True, True),
        ((2, 2, 31, 9, 40), True, False),
        ((1, 1, 8, 12, 40), False, True),
    ],
)
def test_matches_sdpa_in_float64(shape, causal, padded):
    b, h, sq, sk, d = shape
    q, k, v, grad_out = _inputs(*shape, seed=sum(shape))
    mask = None
    allowed = None
    if padded:
        mask = torch.rand(b, sk, generator=torch.Generator().manual_seed(1)) < 0.3
        mask[:, 0] = False
        allowed = ~mask[:, None, None, :]
        if causal:
            allowed = allowed & torch.ones(sq, sk, dtype=torch.bool).tril()
    out = torch.ops.conveyor.fused_attention(q, k, v, mask, causal, None)
    if allowed is None:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    got_grads = torch.autograd.grad(out, (q, k, v), grad_out)
    want_grads = torch.autograd.grad(want, (q, k, v), grad_out)
    for name, got, expected in zip("qkv", got_grads, want_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10, msg=f"grad {name}")


def test_explicit_scale_and_forward_lse():
    q, k, v, _ = _inputs(1, 2, 5, 7, 16, seed=3)
    out = torch.ops.conveyor.fused_attention(q, k, v, None, False, 0.25)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.25), rtol=1e-10, atol=1e-10)
    out2, lse = torch.ops.conveyor.fused_attention_forward(q.detach(), k.detach(), v.detach(), None, False, 0.25)
    want_lse = torch.logsumexp(q.detach() @ k.detach().transpose(-2, -1) * 0.25, dim=-1)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out2, out.detach(), rtol=0, atol=0)


def test_gradcheck():
    q, k, v, _ = _inputs(1, 1, 3, 4, 4, seed=4)
    mask = torch.tensor([[False, True, False, False]])
    fn = lambda q, k, v: torch.ops.conveyor.fused_attention(q, k, v, mask, True, None)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)


def test_bad_input_raises_with_the_dimension_named():
    q = torch.randn(2, 3, 5, 64)
    k = torch.randn(2, 3, 7, 32)
    with pytest.raises(RuntimeError, match=r"k has head_dim \(dim 3\) 32 but q has 64"):
        torch.ops.conveyor.fused_attention(q, k, k, None, False, None)
