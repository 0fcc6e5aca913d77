"""torch.ops.conveyor.fused_lstm from Python: same values and gradients as
torch.nn.LSTM with the same weights, on CPU in float64."""
import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def plugin():
    torch.ops.load_library(os.environ["CONVEYOR_LIB"])


def _reference_and_weights(input_size, hidden, layers, bias, seed):
    torch.manual_seed(seed)
    ref = torch.nn.LSTM(input_size, hidden, num_layers=layers, bias=bias).double()
    # The op takes torch.nn.LSTM's flat weight order; clones are separate leaves.
    weights = [p.detach().clone().requires_grad_() for p in _flat(ref)]
    return ref, weights


def _flat(lstm):
    return [w for layer in lstm.all_weights for w in layer]


@pytest.mark.parametrize(
    "seq_len,batch,input_size,hidden,layers,bias",
    [
        (5, 3, 4, 7, 1, True),
        (1, 1, 3, 33, 2, True),
        (4, 2, 5, 7, 3, False),
        (6, 4, 2, 12, 4, True),
    ],
)
def test_matches_torch_lstm_in_float64(seq_len, batch, input_size, hidden, layers, bias):
    ref, weights = _reference_and_weights(input_size, hidden, layers, bias, seed=seq_len + 10 * hidden)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(seq_len, batch, input_size, generator=g, dtype=torch.float64)
    h0 = torch.randn(layers, batch, hidden, generator=g, dtype=torch.float64)
    c0 = torch.randn(layers, batch, hidden, generator=g, dtype=torch.float64)
    w_out = torch.randn(seq_len, batch, hidden, generator=g, dtype=torch.float64)
    w_state = torch.randn(2, layers, batch, hidden, generator=g, dtype=torch.float64)

    def loss(out, h_n, c_n):
        return (out * w_out).sum() + (h_n * w_state[0]).sum() + (c_n * w_state[1]).sum()

    xs, h0s, c0s = (t.clone().requires_grad_() for t in (x, h0, c0))
    out, h_n, c_n = torch.ops.conveyor.fused_lstm(xs, h0s, c0s, weights, bias)
    got_grads = torch.autograd.grad(loss(out, h_n, c_n), [xs, h0s, c0s, *weights])

    xr, h0r, c0r = (t.clone().requires_grad_() for t in (x, h0, c0))
    out_r, (h_r, c_r) = ref(xr, (h0r, c0r))
    want_grads = torch.autograd.grad(loss(out_r, h_r, c_r), [xr, h0r, c0r, *_flat(ref)])

    for got, want, name in [(out, out_r, "output"), (h_n, h_r, "h_n"), (c_n, c_r, "c_n")]:
        assert (got - want).abs().max().item() <= 1e-10, name
    names = ["input", "h0", "c0", *(name for name, _ in ref.named_parameters())]
    for got, want, name in zip(got_grads, want_grads, names):
        assert (got - want).abs().max().item() <= 1e-10, f"grad of {name}"


def test_gradcheck_tiny_float64():
    _, weights = _reference_and_weights(3, 4, 2, True, seed=3)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)

    def fn(x, h0, c0, *w):
        return torch.ops.conveyor.fused_lstm(x, h0, c0, list(w), True)

    assert torch.autograd.gradcheck(fn, (x, h0, c0, *weights), eps=1e-6, atol=1e-7)


def test_bad_input_raises_with_the_dimension_named():
    _, weights = _reference_and_weights(4, 6, 1, True, seed=1)
    state = torch.zeros(1, 3, 6, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"input feature size \(input dim 2\) is 5 but weight_ih_l0 expects 4"):
        torch.ops.conveyor.fused_lstm(torch.zeros(2, 3, 5, dtype=torch.float64), state, state, weights, True)
    with pytest.raises(RuntimeError, match=r"h0 must have shape"):
        torch.ops.conveyor.fused_lstm(torch.zeros(2, 3, 4, dtype=torch.float64), state[:, :2], state, weights, True)
