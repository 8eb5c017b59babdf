"""dropout: the checks the generic suite cannot make elementwise.

Kernel (Triton's Philox) and reference (NumPy's generator) draw different
masks, so each side is checked on its own: the same seed gives the same
output, other seeds differ, the fraction of zeros is ~p and E[y] ~ x (also
against torch's own dropout), the backward redraws the forward's mask (zeros
coincide, kept values are g / (1 - p)), p = 0 is the identity and p = 1 gives
zeros (no division by zero), the mask depends on (seed, linear index) only
(a strided view gives the same output as its dense copy), and torch does
nothing but allocate and view.
"""
import math

import numpy as np
import pytest

from triflux import backend
from triflux.reference import dropout as ref
from triflux.testing import dropout as tdrop

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux.triton_kernels import launch  # noqa: E402
from triflux.triton_kernels import dropout as kd  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"
N = 1 << 16
SIGMAS = 6.0


def _np(t):
    return t.detach().to("cpu").to(torch.float64).numpy()


def _kernel_side(x, p, seed, dtype=torch.float32, g=None):
    kx = torch.from_numpy(x).to(dtype).to(DEVICE)
    y = kd.dropout_forward(kx, p, seed)
    gg = torch.from_numpy(g if g is not None else np.ones_like(x)).to(dtype).to(DEVICE)
    (dx,) = kd.dropout_backward(gg, y, kx, p, seed)
    return _np(y), _np(dx)


def _ref_side(x, p, seed, g=None):
    y = ref.dropout_forward(x, p, seed)
    (dx,) = ref.dropout_backward(g if g is not None else np.ones_like(x), y, x, p, seed)
    return y, dx


SIDES = {"reference": _ref_side, "kernel": _kernel_side}


@pytest.mark.parametrize("side", SIDES)
def test_same_seed_same_output_other_seed_differs(side):
    x = np.random.default_rng(0).standard_normal((37, 29))
    a, _ = SIDES[side](x, 0.5, 1234)
    b, _ = SIDES[side](x, 0.5, 1234)
    c, _ = SIDES[side](x, 0.5, 1235)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_moments(side, p):
    """Fraction of zeros ~ p (binomial standard error) and E[y] = x: for
    x = 1 the kept values are exactly 1 / (1 - p)."""
    x = np.ones(N)
    y, _ = SIDES[side](x, p, 20240611)
    zeros = float(np.mean(y == 0))
    se = math.sqrt(p * (1 - p) / N)
    assert abs(zeros - p) <= SIGMAS * se, f"{side}: zero fraction {zeros:.4f}, expected {p} +- {SIGMAS * se:.3g}"
    np.testing.assert_allclose(y[y != 0], 1 / (1 - p), rtol=1e-6)
    se_mean = math.sqrt(p / (1 - p) / N)           # var(m / (1 - p)) = p / (1 - p)
    assert abs(y.mean() - 1.0) <= SIGMAS * se_mean
    # torch's own dropout (the oracle): same distribution
    t = _np(tdrop.dropout_torch(torch.ones(N, dtype=torch.float64), p, 20240611))
    se2 = math.sqrt(2 * p * (1 - p) / N)
    assert abs(zeros - float(np.mean(t == 0))) <= SIGMAS * se2


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("p", [0.3, 0.75])
def test_backward_redraws_the_forward_mask(side, p):
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 2.0, (13, 17, 5))        # no zeros in x: y == 0 exactly where dropped
    g = rng.uniform(0.5, 2.0, x.shape)
    y, dx = SIDES[side](x, p, 99, g=g)
    np.testing.assert_array_equal(y == 0, dx == 0)
    keep = y != 0
    assert 0 < keep.sum() < keep.size
    np.testing.assert_allclose(dx[keep], g[keep] / (1 - p), rtol=1e-6)
    np.testing.assert_allclose(y[keep], x[keep] / (1 - p), rtol=1e-6)


@pytest.mark.parametrize("side", SIDES)
def test_p_zero_is_identity_and_p_one_is_zero(side):
    x = np.random.default_rng(2).standard_normal((9, 11))
    y, dx = SIDES[side](x, 0.0, 5)
    np.testing.assert_allclose(y, x, rtol=1e-7)
    np.testing.assert_array_equal(dx, 1.0)
    y, dx = SIDES[side](x, 1.0, 5)
    assert np.all(y == 0) and np.all(dx == 0) and np.all(np.isfinite(y))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_kernel_dtypes(dtype):
    x = np.random.default_rng(3).uniform(0.5, 2.0, (64, 33))
    kx = torch.from_numpy(x).to(dtype).to(DEVICE)
    y = kd.dropout_forward(kx, 0.25, 7)
    assert y.dtype == dtype
    (dx,) = kd.dropout_backward(y, y, kx, 0.25, 7)
    assert dx.dtype == dtype
    yn, xn = _np(y), _np(kx)
    keep = yn != 0
    u = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float64: 1e-15}[dtype]
    np.testing.assert_allclose(yn[keep], xn[keep] / 0.75, rtol=2 * u)
    np.testing.assert_array_equal(_np(dx) == 0, ~keep)
    assert abs((~keep).mean() - 0.25) < 0.05


def test_mask_depends_on_seed_and_linear_index_only():
    """A transposed or strided view gives the output of its dense copy; a
    longer array's mask extends a shorter one's (both sides)."""
    x = np.random.default_rng(4).standard_normal((12, 10))
    dense = torch.from_numpy(x).float()
    t = torch.from_numpy(np.ascontiguousarray(x.T)).float().t()
    wide = torch.from_numpy(np.repeat(x, 2, axis=1)).float()[:, ::2]
    assert not t.is_contiguous() and not wide.is_contiguous()
    a = _np(kd.dropout_forward(dense, 0.4, 11))
    np.testing.assert_array_equal(_np(kd.dropout_forward(t, 0.4, 11)), a)
    np.testing.assert_array_equal(_np(kd.dropout_forward(wide, 0.4, 11)), a)
    ones = np.ones(200)
    for side in SIDES:
        long, _ = SIDES[side](ones, 0.4, 11)
        short, _ = SIDES[side](ones[:50], 0.4, 11)
        np.testing.assert_array_equal(long[:50], short)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_scalars_and_empty(shape):
    x = np.full(shape, 2.0)
    for side in SIDES:
        y, dx = SIDES[side](x, 0.5, 3)
        assert np.shape(y) == shape and np.shape(dx) == shape


def test_bad_arguments():
    x = np.ones(4)
    with pytest.raises(ValueError, match="p must be in"):
        ref.dropout_forward(x, 1.5, 0)
    with pytest.raises(ValueError, match="p must be in"):
        kd.dropout_forward(torch.ones(4), -0.1, 0)
    with pytest.raises(ValueError, match="seed"):
        kd.dropout_forward(torch.ones(4), 0.5, -1)


def test_torch_only_allocates_and_views():
    x = torch.randn(8, 9).t()

    def work():
        y = kd.dropout_forward(x, 0.5, 1)
        kd.dropout_backward(y, y, x, 0.5, 1)
    assert_torch_only_moves_memory(work, "the dropout kernel")


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_and_infinities_multiply_like_torch(p, dtype):
    """y = x * (m / (1 - p)) as torch computes it: a dropped NaN or infinity
    is NaN (x * 0), a kept one NaN or +-inf; the backward's mask likewise.
    The mask of each side comes from the same call on ones."""
    x = np.tile([np.nan, np.inf, -np.inf, 1.5], 64)
    g = np.tile([2.0, np.nan, -1.0, np.inf], 64)
    seed = 1234
    for forward, backward, to in ((kd.dropout_forward, kd.dropout_backward,
                                   lambda a: torch.from_numpy(a).to(dtype).to(DEVICE)),
                                  (ref.dropout_forward, ref.dropout_backward, lambda a: a)):
        scale = forward(to(np.ones_like(x)), p, seed)           # m / (1 - p)
        y = forward(to(x), p, seed)
        (dx,) = backward(to(g), y, to(x), p, seed)
        scale, y, dx = (_np(a) if isinstance(a, torch.Tensor) else np.asarray(a) for a in (scale, y, dx))
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(y, x * scale)
            np.testing.assert_array_equal(dx, g * scale)
        if 0 < p < 1:
            assert np.isnan(y[1::4]).any() and np.isinf(y[1::4]).any()   # dropped and kept infinities
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        t = torch.nn.functional.dropout(torch.from_numpy(x), p=p, training=True)
    assert np.isnan(t.numpy()[0::4]).all()   # torch: NaN stays NaN, dropped or not
