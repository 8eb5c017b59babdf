"""Dense on inputs with several batch axes, against torch.nn.Linear with the
same weights, forward and gradients, on both devices.

Dense computes ``x @ weight.T`` with ``weight.T`` a transposed (column-major)
view; its weight gradient sums over every batch axis of ``x``. The CPU
reference once transposed all axes of the batched operands where only the
last two swap: ``x`` of shape (2, 5, 3) raised a NumPy shape error, and
(3, 3, 3) (every side equal) gave a wrong weight gradient without a word.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import triflux as tf
from helpers import DEVICES, device

torch = pytest.importorskip("torch")


def _against_linear(dev, in_features, out_features, x_np, dtype, rtol, atol):
    """Dense(in => out) on ``device(dev)`` vs torch.nn.Linear (float64) with the
    same weights, for the loss sum(c * m(x)) with a fixed random ``c``."""
    d = device(dev)
    rng = np.random.default_rng(1)
    layer = tf.Dense(in_features, out_features, dtype=dtype,
                     bias=rng.standard_normal(out_features).astype(dtype))
    linear = torch.nn.Linear(in_features, out_features).double()
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(layer.weight.numpy().astype(np.float64)))
        linear.bias.copy_(torch.from_numpy(layer.bias.numpy().astype(np.float64)))
    c_np = rng.standard_normal(x_np.shape[:-1] + (out_features,))
    layer, x, c = d(layer), d(x_np.astype(dtype)), d(c_np.astype(dtype))

    y, (g, gx) = tf.withgradient(lambda m, x: (m(x) * c).sum(), layer, x)
    tx = torch.from_numpy(x_np.astype(dtype).astype(np.float64)).requires_grad_()
    ty = linear(tx)
    (ty * torch.from_numpy(c_np.astype(dtype).astype(np.float64))).sum().backward()

    np.testing.assert_allclose(layer(x).numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(g["weight"].numpy(), linear.weight.grad.numpy(), rtol=rtol, atol=atol,
                               err_msg="weight gradient")
    np.testing.assert_allclose(g["bias"].numpy(), linear.bias.grad.numpy(), rtol=rtol, atol=atol,
                               err_msg="bias gradient")
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol, err_msg="input gradient")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("in_features,out_features,x_shape", [
    (3, 4, (2, 5, 3)),          # raised "matmul: Input operand 1 has a mismatch" on the CPU
    (3, 3, (3, 3, 3)),          # every side equal: a silently wrong weight gradient on the CPU
    (3, 3, (3, 3, 3, 3)),       # three batch axes
    (2, 5, (4, 1, 3, 2)),
    (4, 2, (7, 4)),             # one batch axis, as before
])
def test_dense_with_several_batch_axes_matches_linear(dev, in_features, out_features, x_shape):
    x = np.random.default_rng(0).standard_normal(x_shape)
    _against_linear(dev, in_features, out_features, x, np.float32, rtol=1e-5, atol=1e-5)


def test_the_issue_example_weight_gradient_on_the_cpu():
    """tf.gradient(lambda m: m(x).sum(), tf.Dense(3, 4)) with x of shape (2, 5, 3)."""
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    m = tf.Dense(3, 4)
    (g,) = tf.gradient(lambda m: m(x).sum(), m)
    # d/dW sum(x @ W^T + b) = sum over the batch of ones(4) x^T: every row is x summed over (2, 5)
    want = np.broadcast_to(x.reshape(-1, 3).astype(np.float64).sum(axis=0), (4, 3))
    np.testing.assert_allclose(g["weight"].numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g["bias"].numpy(), np.full(4, 10.0), rtol=1e-6)


@st.composite
def _dense_cases(draw):
    """(in, out, x shape): one to three batch axes; every side equal in half
    the draws (square shapes are where a wrong transpose goes unnoticed)."""
    if draw(st.booleans()):
        s = draw(st.integers(2, 4))
        return s, s, (s,) * draw(st.integers(2, 4))
    batch = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    in_features = draw(st.integers(1, 5))
    return in_features, draw(st.integers(1, 5)), batch + (in_features,)


@pytest.mark.parametrize("dev", DEVICES)
@given(case=_dense_cases(), seed=st.integers(0, 2 ** 16))
def test_dense_over_batch_shapes_matches_linear(dev, case, seed):
    in_features, out_features, x_shape = case
    x = np.random.default_rng(seed).standard_normal(x_shape)
    _against_linear(dev, in_features, out_features, x, np.float64, rtol=1e-10, atol=1e-10)
