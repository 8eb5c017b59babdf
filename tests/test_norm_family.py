"""batchnorm_train / batchnorm_test: the cases the generic property suite
does not pin down.

Forward and every gradient against torch on (N, C), (N, C, L) and
(N, C, H, W) shapes for several eps, float16 inputs, channels with one or two
values (M = 1: y = beta exactly; M = 2: xhat = +-1 up to eps), all-equal and
offset channels (the kernel's mean must not show its rounding), empty dims,
strided views, shape errors, and torch doing nothing but allocate and view.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import ShapeError
from triflux.reference import norm as ref

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux.triton_kernels import launch  # noqa: E402
from triflux.triton_kernels import norm as kn  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"
SHAPES = [(5, 3), (2, 3, 7), (2, 3, 5, 4)]


def _np(t):
    return t.detach().to("cpu").to(torch.float64).numpy()


def _inputs(shape, seed, offset=0.0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape) * 1.5 + offset
    gamma = rng.uniform(0.5, 2.0, c) * rng.choice([-1, 1], c)
    beta = rng.standard_normal(c)
    mean = rng.standard_normal(c) + offset
    var = rng.uniform(0.1, 3.0, c)
    return x, gamma, beta, mean, var


def _torch_train(x, gamma, beta, g, eps):
    ts = [torch.from_numpy(a).requires_grad_(True) for a in (x, gamma, beta)]
    y = torch.nn.functional.batch_norm(ts[0], None, None, ts[1], ts[2], training=True, eps=eps)
    grads = torch.autograd.grad(y, ts, torch.from_numpy(g))
    return y.detach().numpy(), [gr.numpy() for gr in grads]


def _torch_test(x, gamma, beta, mean, var, g, eps):
    ts = [torch.from_numpy(a).requires_grad_(True) for a in (x, gamma, beta)]
    y = torch.nn.functional.batch_norm(ts[0], torch.from_numpy(mean), torch.from_numpy(var),
                                       ts[1], ts[2], training=False, eps=eps)
    grads = torch.autograd.grad(y, ts, torch.from_numpy(g))
    return y.detach().numpy(), [gr.numpy() for gr in grads]


def _close(a, e, rtol):
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    err = np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-30) if e.size else 0.0
    assert err <= rtol, f"normwise relative error {err:.3g} > {rtol:g}"


def _kernel(args, dtype):
    return [torch.from_numpy(np.asarray(a)).to(dtype).to(DEVICE) for a in args]


@pytest.mark.parametrize("train", [True, False])
def test_nan_and_infinities_in_x_as_torch(train):
    """NaN, +inf and -inf in three channels of x: those channels' outputs and
    gradients are NaN or +-inf where torch's are (the kernel's variance floor
    max(var, 0) must keep the NaN), the fourth channel is untouched."""
    x, gamma, beta, mean, var = _inputs((3, 4, 5), 11)
    x[1, 0, 2], x[0, 1, 4], x[2, 2, 0] = np.nan, np.inf, -np.inf
    g = np.random.default_rng(12).standard_normal(x.shape)
    if train:
        want_y, want = _torch_train(x, gamma, beta, g, 1e-5)
        ry, rg = ref.batchnorm_train_forward(x, gamma, beta), ref.batchnorm_train_backward(g, None, x, gamma, beta)
        kf, kb, args = kn.batchnorm_train_forward, kn.batchnorm_train_backward, (x, gamma, beta)
    else:
        want_y, want = _torch_test(x, gamma, beta, mean, var, g, 1e-5)
        ry = ref.batchnorm_test_forward(x, gamma, beta, mean, var)
        rg = ref.batchnorm_test_backward(g, None, x, gamma, beta, mean, var)
        kf, kb, args = kn.batchnorm_test_forward, kn.batchnorm_test_backward, (x, gamma, beta, mean, var)
    assert np.isnan(want_y[:, :3]).any() and np.isfinite(want_y[:, 3]).all()
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        kargs = _kernel(args, dtype)
        ky = kf(*kargs)
        kg = kb(_kernel((g,), dtype)[0], ky, *kargs)
        for got, exp, what in [(ry, want_y, "reference y"), (_np(ky), want_y, f"kernel y {dtype}")] + \
                [(rg[i], want[i], f"reference grad {i}") for i in range(3)] + \
                [(_np(kg[i]), want[i], f"kernel grad {i} {dtype}") for i in range(3)]:
            np.testing.assert_allclose(got, exp, rtol=rtol, atol=rtol, equal_nan=True, err_msg=what)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_train_matches_torch(shape, eps):
    x, gamma, beta, _, _ = _inputs(shape, 1)
    g = np.random.default_rng(2).standard_normal(shape)
    ty, tg = _torch_train(x, gamma, beta, g, eps)
    ry = ref.batchnorm_train_forward(x, gamma, beta, eps=eps)
    rg = ref.batchnorm_train_backward(g, ry, x, gamma, beta, eps=eps)
    _close(ry, ty, 1e-12)
    for a, e in zip(rg, tg):
        _close(a, e, 1e-11)
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        kx, kg_, kb, kgrad = _kernel((x, gamma, beta, g), dtype)
        ky = kn.batchnorm_train_forward(kx, kg_, kb, eps=eps)
        _close(_np(ky), ty, rtol)
        kgrads = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb, eps=eps)
        assert [t.dtype for t in kgrads] == [dtype] * 3
        for a, e in zip(kgrads, tg):
            _close(_np(a), e, 10 * rtol)


@pytest.mark.parametrize("shape", SHAPES)
def test_test_mode_matches_torch(shape):
    eps = 1e-3
    x, gamma, beta, mean, var = _inputs(shape, 3)
    g = np.random.default_rng(4).standard_normal(shape)
    ty, tg = _torch_test(x, gamma, beta, mean, var, g, eps)
    ry = ref.batchnorm_test_forward(x, gamma, beta, mean, var, eps=eps)
    rg = ref.batchnorm_test_backward(g, ry, x, gamma, beta, mean, var, eps=eps)
    _close(ry, ty, 1e-12)
    assert rg[3] is None and rg[4] is None
    for a, e in zip(rg[:3], tg):
        _close(a, e, 1e-12)
    kx, kg_, kb, km, kv, kgrad = _kernel((x, gamma, beta, mean, var, g), torch.float32)
    ky = kn.batchnorm_test_forward(kx, kg_, kb, km, kv, eps=eps)
    _close(_np(ky), ty, 1e-5)
    kgrads = kn.batchnorm_test_backward(kgrad, ky, kx, kg_, kb, km, kv, eps=eps)
    assert kgrads[3] is None and kgrads[4] is None
    for a, e in zip(kgrads[:3], tg):
        _close(_np(a), e, 1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_float16_within_torch_error(train):
    """float16 in, float16 out: the kernel's error against float64 is of the
    order of torch's own float16 error (torch computes in float32 inside too)."""
    shape = (3, 4, 5, 5)
    x, gamma, beta, mean, var = _inputs(shape, 5)
    x, gamma, beta, mean, var = (a.astype(np.float16).astype(np.float64) for a in (x, gamma, beta, mean, var))
    g = np.random.default_rng(6).standard_normal(shape).astype(np.float16).astype(np.float64)
    args = (x, gamma, beta) if train else (x, gamma, beta, mean, var)
    fwd = kn.batchnorm_train_forward if train else kn.batchnorm_test_forward
    bwd = kn.batchnorm_train_backward if train else kn.batchnorm_test_backward
    rfwd = ref.batchnorm_train_forward if train else ref.batchnorm_test_forward
    rbwd = ref.batchnorm_train_backward if train else ref.batchnorm_test_backward
    ry = rfwd(*args, eps=1e-5)
    rg = rbwd(g, ry, *args, eps=1e-5)
    k = _kernel(args + (g,), torch.float16)
    ky = fwd(*k[:-1], eps=1e-5)
    assert ky.dtype == torch.float16
    _close(_np(ky), ry, 2 * 2.0 ** -11)
    kgrads = bwd(k[-1], ky, *k[:-1], eps=1e-5)
    for a, e in zip(kgrads[:3], rg[:3]):
        assert a.dtype == torch.float16
        _close(_np(a), e, 8 * 2.0 ** -11)


def test_one_value_per_channel_gives_beta():
    """M = 1 (N = 1, no spatial positions): var = 0, xhat = 0, y = beta; the
    gradient of x is exactly 0 (g - mean(g)), dgamma = 0, dbeta = g."""
    x, gamma, beta, _, _ = _inputs((1, 4), 7, offset=30.0)
    g = np.random.default_rng(8).standard_normal((1, 4))
    ry = ref.batchnorm_train_forward(x, gamma, beta)
    np.testing.assert_array_equal(ry, beta[None, :])
    for dtype in (torch.float32, torch.float64):
        kx, kg_, kb, kgrad = _kernel((x, gamma, beta, g), dtype)
        ky = kn.batchnorm_train_forward(kx, kg_, kb)
        np.testing.assert_array_equal(_np(ky), _np(kb)[None, :])
        dx, dgamma, dbeta = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb)
        np.testing.assert_array_equal(_np(dx), 0.0)
        np.testing.assert_array_equal(_np(dgamma), 0.0)
        np.testing.assert_array_equal(_np(dbeta), _np(kgrad)[0])


def test_two_values_and_constant_channels():
    """M = 2 (xhat = +-1 up to eps) and an all-equal channel at offset 50: the
    kernel's (float32) mean must not leak its rounding into x - mean."""
    x = np.array([[50.3, 1.0], [50.3, 2.0]])       # channel 0 constant, channel 1 two values
    gamma, beta = np.array([1.5, -0.5]), np.array([0.25, 1.0])
    g = np.array([[0.3, -1.2], [0.7, 0.4]])
    ty, tg = _torch_train(x, gamma, beta, g, 1e-5)
    kx, kg_, kb, kgrad = _kernel((x, gamma, beta, g), torch.float32)
    ky = kn.batchnorm_train_forward(kx, kg_, kb, eps=1e-5)
    assert np.all(_np(ky)[:, 0] == np.float32(0.25)), _np(ky)
    _close(_np(ky), ty, 1e-6)
    dx, dgamma, dbeta = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb, eps=1e-5)
    assert _np(dgamma)[0] == 0.0
    _close(_np(dgamma), tg[1], 1e-6)
    _close(_np(dbeta), tg[2], 1e-6)
    _close(_np(dx)[:, 0], tg[0][:, 0], 1e-5)


def test_large_offset_is_stable():
    """x = 1000 + N(0, 1): the variance is taken of deviations (two-pass), not as E[x^2] - E[x]^2."""
    x, gamma, beta, _, _ = _inputs((8, 3, 9), 9, offset=1000.0)
    ty, _ = _torch_train(x, gamma, beta, np.ones_like(x), 1e-5)
    kx, kg_, kb = _kernel((x, gamma, beta), torch.float32)
    _close(_np(kn.batchnorm_train_forward(kx, kg_, kb)), ty, 1e-4)


@pytest.mark.parametrize("shape", [(0, 3), (0, 3, 4), (2, 0, 5), (2, 3, 0), (0, 0)])
def test_empty_dims(shape):
    x, gamma, beta, mean, var = _inputs(shape, 10)
    g = np.zeros(shape)
    c = shape[1]
    ry = ref.batchnorm_train_forward(x, gamma, beta)
    dx, dgamma, dbeta = ref.batchnorm_train_backward(g, ry, x, gamma, beta)
    assert ry.shape == shape and dx.shape == shape
    np.testing.assert_array_equal(dgamma, np.zeros(c))
    np.testing.assert_array_equal(dbeta, np.zeros(c))
    kx, kg_, kb, km, kv, kgrad = _kernel((x, gamma, beta, mean, var, g), torch.float32)
    ky = kn.batchnorm_train_forward(kx, kg_, kb)
    assert tuple(ky.shape) == shape
    kdx, kdgamma, kdbeta = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb)
    assert tuple(kdx.shape) == shape
    np.testing.assert_array_equal(_np(kdgamma), np.zeros(c))
    np.testing.assert_array_equal(_np(kdbeta), np.zeros(c))
    kt = kn.batchnorm_test_forward(kx, kg_, kb, km, kv)
    assert tuple(kt.shape) == shape
    tg = kn.batchnorm_test_backward(kgrad, kt, kx, kg_, kb, km, kv)
    np.testing.assert_array_equal(_np(tg[1]), np.zeros(c))


def test_strided_views_read_in_place():
    x, gamma, beta, mean, var = _inputs((3, 4, 6), 11)
    g = np.random.default_rng(12).standard_normal((3, 4, 6))
    ty, tg = _torch_train(x, gamma, beta, g, 1e-5)
    kx = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 1, 0))).float().permute(2, 1, 0)
    wide = torch.from_numpy(np.repeat(gamma, 2)).float()
    kgam = wide[::2]
    kb = torch.from_numpy(beta).float()
    kg = torch.from_numpy(np.ascontiguousarray(g.transpose(1, 0, 2))).float().permute(1, 0, 2)
    assert not kx.is_contiguous() and not kgam.is_contiguous() and not kg.is_contiguous()
    ky = kn.batchnorm_train_forward(kx, kgam, kb)
    _close(_np(ky), ty, 1e-5)
    grads = kn.batchnorm_train_backward(kg, ky, kx, kgam, kb)
    for a, e in zip(grads, tg):
        _close(_np(a), e, 1e-5)


def test_ops_checks_before_dispatching(monkeypatch):
    """``ops.batchnorm`` raises the spec's errors at the API edge, before any
    reference or kernel runs."""
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a bad batchnorm"))
    x, three = ops.as_tensor(np.zeros((2, 3), np.float32)), ops.as_tensor(np.ones(3, np.float32))
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        ops.batchnorm(x, ops.as_tensor(np.ones(2, np.float32)), three)
    with pytest.raises(ShapeError, match=r"\(N, C"):
        ops.batchnorm(ops.as_tensor(np.zeros(3, np.float32)), three, three)
    with pytest.raises(ValueError, match="eps"):
        ops.batchnorm(x, three, three, eps=-1.0)


def test_shape_errors():
    x = np.zeros((2, 3))
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        ref.batchnorm_train_forward(x, np.ones(2), np.zeros(3))
    with pytest.raises(ShapeError, match=r"\(N, C"):
        ref.batchnorm_train_forward(np.zeros(3), np.ones(3), np.zeros(3))
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        kn.batchnorm_test_forward(torch.zeros(2, 3), torch.ones(3), torch.zeros(3), torch.zeros(4), torch.ones(3))


def test_torch_only_allocates_and_views():
    x, gamma, beta, mean, var = _inputs((2, 3, 4, 5), 13)
    kx, kg_, kb, km, kv = _kernel((x, gamma, beta, mean, var), torch.float32)
    kx = kx.transpose(2, 3)

    def work():
        y = kn.batchnorm_train_forward(kx, kg_, kb)
        kn.batchnorm_train_backward(y, y, kx, kg_, kb)
        z = kn.batchnorm_test_forward(kx, kg_, kb, km, kv)
        kn.batchnorm_test_backward(z, z, kx, kg_, kb, km, kv)
    assert_torch_only_moves_memory(work, "the batch-norm kernels")
