"""float16/bfloat16 on the CPU: the reference sums in float32 and rounds once,
as the kernels do.

A sum of many 16-bit terms accumulated in the 16-bit type stalls once the
partial sum is large next to each term (in bfloat16, 0.04 vanishes against
16): the gradient of a broadcast input, the batch sum of a matrix gradient
and the bias gradient of a convolution all are such sums. Each case here
sums over a thousand terms of one sign, whose exact sum the 16-bit result
must match to within its own rounding (u = 2^-8 for bfloat16, 2^-11 for
float16; float32 accumulation adds ~1e-7 relative at most).
"""
import numpy as np
import pytest

import triflux as tf
from helpers import DEVICES, device
from triflux import ops
from triflux import dtypes as tfd
from triflux.reference import conv as rconv
from triflux.reference import matmul as rmatmul
from triflux.reference import shape as rshape
from triflux.reference import softmax as rsoftmax

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
HALF = list(UNIT_ROUNDOFF)


def _positive(shape, seed, dtype, high=0.075):
    """Values in (0, high], rounded to ``dtype``."""
    return np.random.default_rng(seed).uniform(high / 100, high, shape).astype(tfd.as_dtype(dtype))


def _assert_rounded_once(got, exact, dtype, what):
    """``got`` (in ``dtype``) is ``exact`` rounded once: within u |exact|
    elementwise (plus float32 accumulation, ~1e-7 relative)."""
    got = np.asarray(got)
    assert got.dtype == tfd.as_dtype(dtype), f"{what}: dtype {got.dtype}, expected {dtype}"
    got = got.astype(np.float64)
    bound = (UNIT_ROUNDOFF[dtype] + 1e-6) * np.abs(exact)
    worst = np.argmax(np.abs(got - exact) - bound)
    assert np.all(np.abs(got - exact) <= bound), \
        f"{what} in {dtype}: {got.ravel()[worst]!r} where the exact sum is {np.ravel(exact)[worst]!r} " \
        f"(more than one rounding away: it was accumulated in {dtype})"


@pytest.mark.parametrize("dev", DEVICES)
def test_gradient_of_broadcast_one_element_bfloat16(dev):
    """The issue's example: d/da sum(broadcast_to(a, (1000,)) * g) = sum(g)
    for a one-element bfloat16 ``a``; the CPU gave 33.0 for 37.28."""
    d = device(dev)
    g_np = _positive((1000,), 0, "bfloat16")
    a = d(tf.bf16(np.array([1.0])))
    g = d(g_np)
    (ga,) = tf.gradient(lambda a: (ops.broadcast_to(a, (1000,)) * g).sum(), a)
    _assert_rounded_once(ga.numpy(), g_np.astype(np.float64).sum(keepdims=True), "bfloat16",
                         f"gradient of a broadcast input on {dev}")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape,target", [((1,), (1000,)), ((3, 1), (3, 1200)), ((1, 2), (41, 29, 2))])
def test_broadcast_to_backward_sums_in_float32(dtype, shape, target):
    g = _positive(target, 1, dtype)
    x = np.ones(shape, tfd.as_dtype(dtype))
    (dx,) = rshape.broadcast_to_backward(g, None, x, shape=target)
    exact = rshape.broadcast_to_backward(g.astype(np.float64), None, x.astype(np.float64), shape=target)[0]
    _assert_rounded_once(dx, exact, dtype, f"broadcast_to {shape} -> {target} backward")


def _matmul_cases():
    """(a, b) shapes whose gradients sum over a thousand products, and which
    operand is transposed in memory (Dense's weight.T)."""
    return [((1000, 1, 2), (2, 3), None),          # dB = sum over the stack of A^T G
            ((1000, 1, 2), (2, 3), "b"),           # ... with B transposed (Dense)
            ((2, 3), (1000, 3, 1), "a"),           # dA = sum over the stack of G B^T
            ((1, 2, 3), (1000, 3, 2), None),       # a broadcast batch axis
            ((1, 1500), (1500, 2), None)]          # a long inner product (forward too)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape_a,shape_b,transposed", _matmul_cases())
def test_matmul_sums_in_float32(dtype, shape_a, shape_b, transposed):
    a = _positive(shape_a, 2, dtype, high=1.0)
    b = _positive(shape_b, 3, dtype, high=1.0)
    if transposed == "a":
        a = np.asfortranarray(a)
    if transposed == "b":
        b = np.asfortranarray(b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    out = rmatmul.matmul_forward(a, b)
    _assert_rounded_once(out, a64 @ b64, dtype, f"matmul {shape_a} @ {shape_b}")
    g = _positive(out.shape, 4, dtype, high=1.0)
    da, db = rmatmul.matmul_backward(g, out, a, b)
    ea, eb = rmatmul.matmul_backward(g.astype(np.float64), None, a64, b64)
    _assert_rounded_once(da, ea, dtype, f"matmul {shape_a} @ {shape_b}: gradient of a")
    _assert_rounded_once(db, eb, dtype, f"matmul {shape_a} @ {shape_b}: gradient of b")


@pytest.mark.parametrize("dtype", HALF)
def test_conv_bias_gradient_sums_in_float32(dtype):
    """conv_bias_act's db = sum over (n, p, q) of G: 4 * 20 * 20 = 1600 terms."""
    dt = tfd.as_dtype(dtype)
    x = _positive((4, 2, 22, 22), 5, dtype)
    w = _positive((3, 2, 3, 3), 6, dtype)
    b = np.zeros(3, dt)
    y = rconv.conv_bias_act_forward(x, w, b)
    g = _positive(y.shape, 7, dtype)
    _, _, db = rconv.conv_bias_act_backward(g, y, x, w, b)
    _assert_rounded_once(db, g.astype(np.float64).sum(axis=(0, 2, 3)), dtype, "conv_bias_act bias gradient")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("layer", ["Conv", "ConvTranspose"])
def test_conv_layer_bias_gradient_bfloat16(dev, layer):
    """The bias gradient of a Conv (bias fused into the primitive) and of a
    ConvTranspose (bias added by broadcasting) is the sum of the output
    gradient over (n, p, q): here sum(c) over 3 * 20 * 20 = 1200 terms."""
    d = device(dev)
    m = d(tf.bf16(getattr(tf, layer)((3, 3), 2, 2)))
    side = 22 if layer == "Conv" else 18                 # a 20 x 20 output either way
    x = d(tf.bf16(np.random.default_rng(8).standard_normal((3, 2, side, side))))
    c_np = _positive((3, 2, 20, 20), 9, "bfloat16")
    c = d(c_np)
    (g,) = tf.gradient(lambda m: (m(x) * c).sum(), m)
    _assert_rounded_once(g["bias"].numpy(), c_np.astype(np.float64).sum(axis=(0, 2, 3)), "bfloat16",
                         f"{layer} bias gradient on {dev}")


@pytest.mark.parametrize("dtype", HALF)
def test_softmax_row_sums_in_float32(dtype):
    """softmax over a row of 2000 entries: each y_i = exp(x_i - m) / sum_j ...,
    with the row sum in float32 and one rounding at the end."""
    x = np.random.default_rng(10).uniform(-1, 1, (2, 2000)).astype(tfd.as_dtype(dtype))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    _assert_rounded_once(rsoftmax.softmax_forward(x, axis=1), e / e.sum(axis=1, keepdims=True), dtype,
                         "softmax forward")
