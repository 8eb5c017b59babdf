"""batchnorm_train / batchnorm_test / batchnorm_running_update: the cases
the generic property suite does not pin down.

Forward and every gradient against torch on (N, C), (N, C, L) and
(N, C, H, W) shapes for several eps, float16 inputs, channels with one or two
values (M = 1: y = beta exactly; M = 2: xhat = +-1 up to eps), all-equal and
offset channels (the kernel's mean must not show its rounding), empty dims,
strided views, shape errors, and torch doing nothing but allocate and view.
The running statistics against torch (M = 0, M = 1, infinities), and as
moved by batchnorm_train in the same launches. The GPU's split of a channel
over several programs, run in the interpreter (its plan forced). The layer's
launches per training step, and its running statistics after running out
of memory.
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


# --- the running statistics ---------------------------------------------------------------------

def _torch_running(x, running_mean, running_var, momentum):
    rm, rv = torch.from_numpy(running_mean.copy()), torch.from_numpy(running_var.copy())
    if x.size:
        torch.batch_norm(torch.from_numpy(x), None, None, rm, rv, True, momentum, 1e-5, False)
    return rm.numpy(), rv.numpy()


def _kernel_running_update(x, running_mean, running_var, momentum, dtype=torch.float64):
    kx, km, kv = _kernel((x, running_mean.copy(), running_var.copy()), dtype)   # (from_numpy shares memory)
    assert kn.batchnorm_running_update_forward(kx, km, kv, momentum=momentum) is None
    return _np(km), _np(kv)


def _reference_running_update(x, running_mean, running_var, momentum):
    m, v = running_mean.copy(), running_var.copy()
    assert ref.batchnorm_running_update_forward(x, m, v, momentum=momentum) is None
    return m, v


@pytest.mark.parametrize("shape", SHAPES + [(0, 3, 4), (2, 3, 0)])
@pytest.mark.parametrize("momentum", [0.1, 0.75])
def test_running_update_matches_torch(shape, momentum):
    """running = (1 - momentum) running + momentum * (mean, unbiased variance),
    and nothing moves for an empty batch (M = 0), as torch's."""
    x, _, _, mean, var = _inputs(shape, 14, offset=20.0)
    want = _torch_running(x, mean, var, momentum)
    for got in (_reference_running_update(x, mean, var, momentum), _kernel_running_update(x, mean, var, momentum)):
        for a, e in zip(got, want):
            np.testing.assert_allclose(a, e, rtol=1e-12, atol=0)
    got = _kernel_running_update(x, mean, var, momentum, torch.float32)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_running_update_with_one_value_and_nonfinite_channels():
    """M = 1: the variance taken is the biased one (0; torch's would be 0/0 =
    NaN). A channel with +inf moves to mean inf and variance NaN, one with
    NaN to NaN (torch's), the others as usual."""
    x, _, _, mean, var = _inputs((1, 3), 15)
    want_mean = 0.9 * mean + 0.1 * x[0]
    for got in (_reference_running_update(x, mean, var, 0.1), _kernel_running_update(x, mean, var, 0.1)):
        np.testing.assert_allclose(got[0], want_mean, rtol=1e-14)
        np.testing.assert_allclose(got[1], 0.9 * var, rtol=1e-14)
    x, _, _, mean, var = _inputs((3, 3, 4), 16)
    x[1, 0, 2], x[0, 1, 3] = np.inf, np.nan
    want = _torch_running(x, mean, var, 0.1)
    assert np.isinf(want[0][0]) and np.isnan(want[1][0]) and np.isnan(want[0][1])
    for got in (_reference_running_update(x, mean, var, 0.1), _kernel_running_update(x, mean, var, 0.1),
                _kernel_running_update(x, mean, var, 0.1, torch.float32)):
        for a, e in zip(got, want):
            np.testing.assert_allclose(a, e, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 2)])
def test_train_forward_with_running_statistics_is_both_calls_in_one(shape):
    """batchnorm_train given the running statistics: the same y as without
    them and the same running statistics as batchnorm_running_update, bit for
    bit, on both sides; both new vectors are stored in place."""
    x, gamma, beta, mean, var = _inputs(shape, 17, offset=3.0)
    ry = ref.batchnorm_train_forward(x, gamma, beta, mean.copy(), var.copy(), eps=1e-3, momentum=0.3)
    np.testing.assert_array_equal(ry, ref.batchnorm_train_forward(x, gamma, beta, eps=1e-3))
    rm, rv = mean.copy(), var.copy()
    ref.batchnorm_train_forward(x, gamma, beta, rm, rv, eps=1e-3, momentum=0.3)
    for a, e in zip((rm, rv), _reference_running_update(x, mean, var, 0.3)):
        np.testing.assert_array_equal(a, e)
    for dtype in (torch.float32, torch.float64):
        kx, kg_, kb, km, kv = _kernel((x, gamma, beta, mean.copy(), var.copy()), dtype)
        ky = kn.batchnorm_train_forward(kx, kg_, kb, km, kv, eps=1e-3, momentum=0.3)
        np.testing.assert_array_equal(_np(ky), _np(kn.batchnorm_train_forward(kx, kg_, kb, eps=1e-3)))
        for a, e in zip((km, kv), _kernel_running_update(x, mean, var, 0.3, dtype)):
            np.testing.assert_array_equal(_np(a), e)
        grads = kn.batchnorm_train_backward(ky, ky, kx, kg_, kb, km, kv, eps=1e-3, momentum=0.3)
        assert len(grads) == 5 and grads[3] is None and grads[4] is None


# --- the GPU's split of a channel over several programs, run in the interpreter -----------------

#: shapes whose channels the GPU plan splits: rows of whole tiles, a row split in
#: tiles, (N, C) with uneven splits, and odd spatial sizes (masked tile columns)
SPLIT_SHAPES = [(8, 2, 32, 32), (16, 3, 40, 40), (20000, 2), (500, 2, 3, 7)]


@pytest.fixture
def gpu_plan(monkeypatch):
    """The GPU's tiles and split, computed by the same kernels in the interpreter."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    return lambda spec: kn._plan(spec, False, launch.sm_count(0))


@pytest.mark.parametrize("gpu,splits_at_batch_4", [("H100", 2), ("A100", 3)])
def test_gpu_plan_fills_the_gpu_for_unet_batch_norms(gpu, splits_at_batch_4):
    """The BatchNorms of a UNet at batch 32, 128x128 (C = 16..64) keep the
    GPU at least 85% busy by the wave model (whole rounds of programs, each
    as long as its tiles), each program with many values; at batch 4, 64x64,
    64 channels of 8 tiles are split as the GPU's SMs make best (a 16-warp
    float32 program saturates an SM: 2 splits are one round of an H100's 132
    SMs, where an A100's 108 run 3 splits of 3 tiles in two rounds)."""
    from triflux.gpus import GPUS
    from triflux.specs.norm import batchnorm_spec
    sms = GPUS[gpu].sms
    for c in (16, 32, 64):
        spec = batchnorm_spec((32, c, 128, 128), ((c,), (c,)), np.float32, 1e-5)
        plan = kn._plan(spec, False, sms)
        programs = c * plan.splits
        rounds_time = programs / launch.wave_efficiency(programs, plan.num_warps, kn._GPU_REGISTERS, sms) * \
            plan.tiles_per_program
        assert c * plan.num_tiles / rounds_time >= 0.85, (c, plan)
        assert plan.tiles_per_program * plan.block_n * plan.block_s >= 4096
        assert kn._plan(spec, True, sms).splits == 1            # the interpreter: one program per channel
    spec = batchnorm_spec((4, 64, 64, 64), ((64,), (64,)), np.float32, 1e-5)
    assert kn._plan(spec, False, sms).splits == splits_at_batch_4


@pytest.mark.parametrize("shape", SPLIT_SHAPES)
def test_gpu_split_matches_the_reference(shape, gpu_plan):
    x, gamma, beta, mean, var = _inputs(shape, 18, offset=40.0)
    spec_plan = gpu_plan(kn._spec(torch.from_numpy(x), (torch.from_numpy(gamma),) * 2, 1e-5))
    assert spec_plan.splits > 1, spec_plan
    g = np.random.default_rng(19).standard_normal(shape)
    ty, tg = _torch_train(x, gamma, beta, g, 1e-5)
    want_running = _torch_running(x, mean, var, 0.1)
    t_y, t_g = _torch_test(x, gamma, beta, mean, var, g, 1e-5)
    for dtype, rtol in ((torch.float64, 1e-11), (torch.float32, 2e-5)):
        kx, kg_, kb, km, kv, kgrad = _kernel((x, gamma, beta, mean.copy(), var.copy(), g), dtype)
        ky = kn.batchnorm_train_forward(kx, kg_, kb, km, kv, eps=1e-5, momentum=0.1)
        _close(_np(ky), ty, rtol)
        for a, e in zip((km, kv), want_running):
            _close(_np(a), e, rtol)
        kgrads = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb, eps=1e-5)
        for a, e in zip(kgrads, tg):
            _close(_np(a), e, 10 * rtol)
        km, kv = _kernel((mean, var), dtype)
        _close(_np(kn.batchnorm_test_forward(kx, kg_, kb, km, kv, eps=1e-5)), t_y, rtol)
        kgrads = kn.batchnorm_test_backward(kgrad, ky, kx, kg_, kb, km, kv, eps=1e-5)
        for a, e in zip(kgrads[:3], t_g):
            _close(_np(a), e, 10 * rtol)


def test_gpu_split_keeps_constant_channels_exact(gpu_plan):
    """An all-equal channel at a large offset, split over several programs:
    its mean's rounding does not show (y = beta exactly, dgamma = 0), and a
    nearly constant one keeps its small variance."""
    shape = (16, 2, 32, 32)
    x = np.full(shape, 50.3)
    x[:, 1] += np.random.default_rng(20).standard_normal((16, 32, 32)) * 1e-3
    gamma, beta = np.array([1.5, -0.5]), np.array([0.25, 1.0])
    g = np.random.default_rng(21).standard_normal(shape)
    kx, kg_, kb, kgrad = _kernel((x, gamma, beta, g), torch.float32)
    xr = _np(kx)
    ty, tg = _torch_train(xr, gamma, beta, g, 1e-5)
    ky = kn.batchnorm_train_forward(kx, kg_, kb, eps=1e-5)
    assert np.all(_np(ky)[:, 0] == np.float32(0.25))
    _close(_np(ky)[:, 1], ty[:, 1], 1e-4)
    dx, dgamma, dbeta = kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb, eps=1e-5)
    assert _np(dgamma)[0] == 0.0
    _close(_np(dgamma)[1], tg[1][1], 1e-4)


# --- the layer's training step --------------------------------------------------------------------

def _record_launches(monkeypatch):
    names = []
    real = launch.launch

    def recording(kernel, grid, *args, **meta):
        names.append(kernel.__name__)
        return real(kernel, grid, *args, **meta)
    monkeypatch.setattr(launch, "launch", recording)
    return names


@pytest.mark.parametrize("gpu", [False, True], ids=["interpreter", "gpu plan"])
@pytest.mark.parametrize("shape", [(8, 3, 32, 32), (4, 3, 5, 5)])
def test_layer_training_step_launches(gpu, shape, monkeypatch):
    """A BatchNorm in training mode normalises and moves its running
    statistics in one launch, or two where the channels are split over
    several programs (partial statistics, then y and the running statistics);
    relu (one of the activations the primitive applies itself) adds none,
    another activation (gelu) one. Test mode takes one launch, relu included."""
    import triflux as tf
    if gpu:
        monkeypatch.setattr(launch, "INTERPRET", False)
    names = _record_launches(monkeypatch)
    dev = tf.CUDADevice(0)
    x = dev(np.random.default_rng(22).standard_normal(shape).astype(np.float32))
    split = kn._plan(kn._spec(x._data, (), 1e-5), launch.INTERPRET, launch.sm_count(0)).splits > 1
    assert split == (gpu and shape[0] == 8)
    norm_launches = ["_partial_stats_kernel"] * split + ["_batchnorm_train_forward_kernel"]
    for activation in (tf.identity, tf.relu, tf.gelu):
        bn = tf.trainmode(dev(tf.BatchNorm(3, activation)))
        names.clear()
        bn(x)
        assert names[:len(norm_launches)] == norm_launches
        assert len(names) == len(norm_launches) + (activation is tf.gelu), names
        assert not np.array_equal(bn.running_mean.numpy(), np.zeros(3))
    bn = dev(tf.BatchNorm(3, tf.relu))
    names.clear()
    y = tf.testmode(bn)(x)
    assert names == ["_batchnorm_test_kernel"], names
    assert np.all(y.numpy() >= 0)


def test_layer_running_statistics_agree_on_both_devices():
    import triflux as tf
    x = (np.random.default_rng(23).standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)
    layers = [d(tf.trainmode(tf.BatchNorm(3, momentum=0.2))) for d in (tf.cpu_device(), tf.CUDADevice(0))]
    for _ in range(3):
        for bn, d in zip(layers, (tf.cpu_device(), tf.CUDADevice(0))):
            bn(d(x))
    for name in ("running_mean", "running_var"):
        a, b = (getattr(bn, name).numpy() for bn in layers)
        np.testing.assert_allclose(b, a, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("gpu", [False, True], ids=["interpreter", "gpu plan"])
@pytest.mark.parametrize("shape", [(8, 3, 32, 32), (4, 3, 5, 5), (0, 3, 5, 5)])
def test_moved_statistics_go_aside_and_the_running_ones_stay(gpu, shape, monkeypatch):
    """Given ``moved``, batchnorm_train writes the moved running statistics
    there (the same values an in-place move stores; the old ones where the
    batch is empty) and leaves the running statistics as they were: what a
    training step uses to commit them only when it succeeds. No launch of
    its own: the move is part of the normalisation's launch."""
    import triflux as tf
    from triflux import ops
    if gpu:
        monkeypatch.setattr(launch, "INTERPRET", False)
    x = (np.random.default_rng(26).standard_normal(shape) * 2 + 1).astype(np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)
    old_mean, old_var = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.0, 2.0, 0.5], np.float32)
    for d in (tf.cpu_device(), tf.CUDADevice(0)):
        in_place = (d(old_mean.copy()), d(old_var.copy()))
        ops.batchnorm(d(x), d(gamma), d(beta), running=in_place, momentum=0.3)
        running = (d(old_mean.copy()), d(old_var.copy()))
        moved = (d(np.full(3, 7.0, np.float32)), d(np.full(3, 7.0, np.float32)))
        names = _record_launches(monkeypatch)
        ops.batchnorm(d(x), d(gamma), d(beta), running=running, moved=moved, momentum=0.3)
        if d != tf.cpu_device() and shape[0]:
            assert names[-1] == "_batchnorm_train_forward_kernel", names
        np.testing.assert_array_equal(running[0].numpy(), old_mean)
        np.testing.assert_array_equal(running[1].numpy(), old_var)
        for got, want in zip(moved, in_place):
            np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_fused_activation_layer_matches_the_layer_then_the_activation(activation):
    """``BatchNorm(C, act)`` hands act to the primitive; the output, the
    gradients and the running statistics equal ``BatchNorm(C)`` followed by
    the activation as its own primitive, on both devices and in both modes."""
    import triflux as tf
    act = getattr(tf, activation)
    x = (np.random.default_rng(25).standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)
    for d in (tf.cpu_device(), tf.CUDADevice(0)):
        fused, plain = d(tf.BatchNorm(3, act)), d(tf.BatchNorm(3))
        for m in (fused, plain):
            m.weight = d(np.array([1.5, -0.5, 2.0], np.float32))
            m.bias = d(np.array([0.1, 0.3, -0.2], np.float32))
        xd = d(x)
        loss_f, (gf,) = tf.withgradient(lambda m: (m(xd) * xd).sum(), fused)
        loss_p, (gp,) = tf.withgradient(lambda m: (act(m(xd)) * xd).sum(), plain)
        np.testing.assert_allclose(loss_f.item(), loss_p.item(), rtol=1e-5)
        for k in ("weight", "bias"):
            np.testing.assert_allclose(gf[k].numpy(), gp[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
        for k in ("running_mean", "running_var"):
            np.testing.assert_array_equal(getattr(fused, k).numpy(), getattr(plain, k).numpy(), err_msg=k)
        np.testing.assert_allclose(tf.testmode(fused)(xd).numpy(), act(tf.testmode(plain)(xd)).numpy(),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gpu", [False, True], ids=["interpreter", "gpu plan"])
def test_out_of_memory_in_the_layer_leaves_its_running_statistics(gpu, monkeypatch):
    """Every allocation of the training-mode call (y, and the partial
    statistics of a split) happens before the launch that moves the running
    statistics: running out of memory at any of them leaves both vectors as
    they were."""
    import triflux as tf
    from triflux.errors import OutOfMemoryError
    if gpu:
        monkeypatch.setattr(launch, "INTERPRET", False)
    dev = tf.CUDADevice(0)
    bn = tf.trainmode(dev(tf.BatchNorm(3)))
    x = dev(np.random.default_rng(24).standard_normal((8, 3, 32, 32)).astype(np.float32))
    bn(x)
    before = tf.state(bn)
    real_empty, calls = launch.empty, []

    def failing_empty(shape, dtype, device):
        calls.append(shape)
        if len(calls) == fail_at:
            raise OutOfMemoryError("out of memory (test)")
        return real_empty(shape, dtype, device)
    monkeypatch.setattr(launch, "empty", failing_empty)
    fail_at = None
    bn(x)
    allocations = len(calls)
    assert allocations == 1 + gpu            # y; with the GPU's split, the partial statistics
    for fail_at in range(1, allocations + 1):
        calls.clear()
        state = tf.state(bn)
        with pytest.raises(OutOfMemoryError):
            bn(x)
        after = tf.state(bn)
        for name in ("running_mean", "running_var"):
            assert after[name].tobytes() == state[name].tobytes(), (fail_at, name)
    assert not np.array_equal(before["running_mean"], tf.state(bn)["running_mean"])


@pytest.fixture
def tiny_gpu_plan(monkeypatch):
    """The GPU plan with tiles of 4 values and splits of 8, so that the
    strategies' small channels are split over several programs."""
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(kn, "_GPU_TILE", 4)
    monkeypatch.setattr(kn, "_MIN_VALUES_PER_PROGRAM", 8)
    kn._plan.cache_clear()
    yield
    kn._plan.cache_clear()


def _assert_matches(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)], err_msg=what)
    _close(got[finite], want[finite], 1e-9)


def test_gpu_split_of_drawn_cases(tiny_gpu_plan):
    """The strategies' cases (offsets, NaN and infinities, empty and uneven
    channels), split over several programs: float64 kernels against the
    reference, forward, backward and the running statistics."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from triflux.testing import norm as strategies

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(train=strategies.batchnorm_train_strategy("float64"),
           update=strategies.batchnorm_running_update_strategy("float64"), data=st.data())
    def check(train, update, data):
        x, gamma, beta = train.inputs
        eps = train.attrs["eps"]
        g = data.draw(st.builds(lambda seed: np.random.default_rng(seed).standard_normal(x.shape),
                                st.integers(0, 2 ** 16)))
        kx, kg_, kb, kgrad = _kernel((x, gamma, beta, g), torch.float64)
        ky = kn.batchnorm_train_forward(kx, kg_, kb, eps=eps)
        _assert_matches(_np(ky), ref.batchnorm_train_forward(x, gamma, beta, eps=eps), f"y {x.shape}")
        for i, (a, e) in enumerate(zip(kn.batchnorm_train_backward(kgrad, ky, kx, kg_, kb, eps=eps),
                                       ref.batchnorm_train_backward(g, None, x, gamma, beta, eps=eps))):
            _assert_matches(_np(a), e, f"gradient {i} {x.shape}")
        x, mean, var = update.inputs
        want = _reference_running_update(x, mean, var, update.attrs["momentum"])
        for a, e in zip(_kernel_running_update(x, mean, var, update.attrs["momentum"]), want):
            _assert_matches(a, e, f"running statistics {x.shape}")
    check()


def test_batchnorm_backward_reads_the_statistics_its_forward_kept():
    """Inside a recorded gradient the reference forward keeps the batch mean
    and variance with its output: the backward of that very array reads them,
    of a copy recomputes them, with the same gradients bit for bit."""
    from triflux.reference import norm
    from triflux.reference._util import keeping_for_backward, kept_for_backward
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5, 5)) * 3 + 50
    gamma, beta = rng.standard_normal(4), rng.standard_normal(4)
    with keeping_for_backward():
        y = norm.batchnorm_train_forward(x, gamma, beta, activation="relu")
    assert kept_for_backward(y) is not None and kept_for_backward(y.copy()) is None
    g = rng.standard_normal(y.shape)
    kept = norm.batchnorm_train_backward(g, y, x, gamma, beta, activation="relu")
    recomputed = norm.batchnorm_train_backward(g, y.copy(), x, gamma, beta, activation="relu")
    for a, b in zip(kept, recomputed):
        np.testing.assert_array_equal(a, b)
