"""softmax / logsoftmax / logsumexp: the cases the generic property suite
does not pin down.

Stability at +-1e4, -inf entries and all -inf rows (torch's NaN / -inf),
every axis of strided views read in place, rows longer than one chunk (the
online two-sweep path), empty dims, half precision against torch by ratio,
and torch doing nothing but allocate and make views.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import ShapeError
from triflux.reference import softmax as ref

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux.triton_kernels import copy, launch  # noqa: E402
from triflux.triton_kernels import softmax as ks  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"
INF = float("inf")

TORCH = {
    "softmax": lambda x, axis: torch.softmax(x, axis),
    "logsoftmax": lambda x, axis: torch.log_softmax(x, axis),
    "logsumexp": lambda x, axis, keepdims=False: torch.logsumexp(x, axis, keepdim=keepdims),
}
NAMES = tuple(TORCH)


def _t(array, dtype=torch.float32):
    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(dtype).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").double().numpy()


def _rand(shape, seed=0, scale=3.0):
    return np.random.default_rng(seed).uniform(-scale, scale, shape)


def _fns(name):
    return (getattr(ks, name + "_forward"), getattr(ks, name + "_backward"),
            getattr(ref, name + "_forward"), getattr(ref, name + "_backward"))


def _check(name, x, axis, dtype=torch.float32, keepdims=None, xt=None, tol=None):
    """Kernel (on ``xt``, default a dense copy of ``x``) and reference against
    torch in float64, forward and backward; NaN and inf must sit where torch
    has them."""
    kf, kb, rf, rb = _fns(name)
    kw = {} if keepdims is None else {"keepdims": keepdims}
    if xt is None:
        xt = _t(x, dtype)
    x = _np(xt)                                         # the values the kernel sees
    tx = torch.from_numpy(x.copy()).requires_grad_()
    ty = TORCH[name](tx, axis, **kw)
    g = _rand(tuple(ty.shape), 99, 1.0)
    g = _np(_t(g, dtype))
    ty.backward(torch.from_numpy(g.copy()))
    ty, tdx = ty.detach().numpy(), tx.grad.numpy()

    y = kf(xt, axis, **kw)
    assert tuple(y.shape) == ty.shape and y.dtype == dtype
    dx = kb(_t(g, dtype), y, xt, axis, **kw)[0]
    assert tuple(dx.shape) == x.shape and dx.dtype == dtype
    ry = rf(x, axis, **kw)
    rdx = rb(g, ty, x, axis, **kw)[0]

    if tol is None:
        tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 4e-3,
               torch.bfloat16: 3e-2}[dtype]
    for got, want in [(_np(y), ty), (ry, ty), (rdx, tdx)]:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    # the kernel's backward starts from its own (rounded) y, except that
    # logsumexp recomputes y from x
    want_dx = rb(g, ty if name == "logsumexp" else _np(y), x, axis, **kw)[0]
    np.testing.assert_allclose(_np(dx), want_dx, rtol=tol, atol=tol, equal_nan=True)
    return _np(y), _np(dx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_extreme_logits_are_exact(name, dtype):
    x = np.array([[1e4, -1e4, 0.0, 1.0],
                  [1e4, 1e4, 1e4, 1e4],
                  [-1e4, -1e4, -1e4, -1e4],
                  [-1e4, 1e4, -1e4, 0.0]])
    x = _np(_t(x, dtype))                               # e.g. 9984 in bfloat16
    y, dx = _check(name, x, 1, dtype, tol=1e-6 if dtype == torch.float32 else None,
                   keepdims=False if name == "logsumexp" else None)
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    if name == "softmax":
        np.testing.assert_array_equal(y[0], [1, 0, 0, 0])
        np.testing.assert_array_equal(y[1], [0.25] * 4)
    if name == "logsumexp" and dtype == torch.float32:
        np.testing.assert_allclose(y[1], 1e4 + np.log(4), rtol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_logsumexp_backward_recomputes_y(dtype):
    """logsumexp(x) ~ 1e4 stored in bfloat16 is off by up to 32 (5e-4 in
    float32); exp(x - y) would turn that into a factor e^32 (a relative error
    of 5e-4). The backward recomputes y from x."""
    x = _np(_t(np.array([[1e4, 1e4 - 1.0, 0.0, 1e4 - 3.0]]), dtype))
    xt = _t(x, dtype)
    y = ks.logsumexp_forward(xt, 1)
    g = _t(np.array([1.0]), dtype)
    dx = _np(ks.logsumexp_backward(g, y, xt, 1)[0])
    exact = torch.softmax(torch.from_numpy(x), 1).numpy()
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    np.testing.assert_allclose(dx, exact, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", NAMES)
def test_minus_inf_entries_and_rows(name):
    x = np.array([[0.0, -INF, 1.0, -INF, 2.0],
                  [-INF, -INF, -INF, -INF, -INF],          # fully masked row
                  [-INF, 3.0, -INF, -INF, -INF],
                  [1e4, -INF, -1e4, 0.0, 5.0]])
    kw = {"keepdims": True} if name == "logsumexp" else {}
    y, dx = _check(name, x, 1, **kw)
    # masked entries get probability 0 (log: -inf), and their gradient is 0
    finite_rows = [0, 2, 3]
    if name == "softmax":
        assert (y[finite_rows][np.isneginf(x[finite_rows])] == 0).all()
    if name == "logsoftmax":
        assert np.isneginf(y[finite_rows][np.isneginf(x[finite_rows])]).all()
    assert np.isfinite(y[finite_rows]).all() or name == "logsoftmax"
    assert not np.isnan(dx[finite_rows]).any()
    # the all -inf row: torch's NaN for (log)softmax, -inf for logsumexp
    if name == "logsumexp":
        assert np.isneginf(y[1]).all()
    else:
        assert np.isnan(y[1]).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_every_axis_of_views(name, axis, monkeypatch):
    """Any axis of a transposed / strided view, read in place (no copy)."""
    base = _t(_rand((7, 10, 5), 1))
    views = [base, base.permute(2, 0, 1), base[:, ::2, :], base.transpose(0, 2)[::2]]
    rec = []
    real = launch.launch

    def recording_launch(kernel, grid, *args, **meta):
        rec.append([a.data_ptr() for a in args if isinstance(a, torch.Tensor)])
        return real(kernel, grid, *args, **meta)

    for xt in views:
        monkeypatch.setattr(copy, "contiguous", pytest.fail)
        monkeypatch.setattr(copy, "copy_into", pytest.fail)
        monkeypatch.setattr(launch, "launch", recording_launch)
        for keepdims in ((False, True) if name == "logsumexp" else (None,)):
            rec.clear()
            _check(name, None, axis, keepdims=keepdims, xt=xt)
            assert rec[0][0] == base.data_ptr()           # forward read the view itself
        monkeypatch.undo()


@pytest.mark.parametrize("name", NAMES)
def test_rows_longer_than_one_chunk(name, monkeypatch):
    """The two-sweep path (online max and rescaled sum) with small chunks,
    and one row longer than the interpreter's real chunk."""
    monkeypatch.setattr(ks, "INTERP_MAX_BLOCK_L", 16)
    monkeypatch.setattr(ks, "GPU_MAX_BLOCK_L", 16)
    x = _rand((3, 53, 4), 2)
    x[0, 40, :] = 1e4                     # the maximum arrives late
    x[1, :30, :] = -INF                   # the first chunks are all masked
    x[2, 5, 1] = -1e4
    kw = {"keepdims": False} if name == "logsumexp" else {}
    _check(name, x, 1, **kw)
    _check(name, x, 1, dtype=torch.float64, **kw)
    monkeypatch.undo()
    long = _rand((2, ks.INTERP_MAX_BLOCK_L + 1000), 3)
    long[1, -1] = 1e4
    _check(name, long, 1, **kw)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk", [None, 8], ids=["one chunk", "online sweep"])
def test_nan_and_infinite_rows_as_torch(name, chunk, monkeypatch):
    """Rows holding NaN (NaN everywhere), +inf (softmax/logsoftmax NaN,
    logsumexp +inf, as torch), +inf with -inf, all -inf, and -inf chunks ahead
    of a maximum of -1e4 (the online sweep must not rescale its empty sum by
    exp(0 - (-1e4)) = inf), forward and backward, float32 and float64."""
    if chunk:
        monkeypatch.setattr(ks, "INTERP_MAX_BLOCK_L", chunk)
        monkeypatch.setattr(ks, "GPU_MAX_BLOCK_L", chunk)
    x = _rand((8, 37), 4)
    x[0, 5] = np.nan
    x[1, 30] = INF
    x[2, 3], x[2, 20] = INF, -INF
    x[3, :] = -INF
    x[4, :25], x[4, 25:] = -INF, -1e4 + _rand(12, 5, 1.0)
    x[5, 36], x[5, 0] = np.nan, INF
    x[6, 10] = -INF
    x[7, :] = INF
    kw = {"keepdims": False} if name == "logsumexp" else {}
    for dtype in (torch.float32, torch.float64):
        _check(name, x, 1, dtype=dtype, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_empty_dims(name):
    kf, kb, rf, rb = _fns(name)
    for shape, axis in [((0, 5), 1), ((5, 0), 1), ((0, 5), 0), ((3, 0, 2), 1), ((0,), 0)]:
        x = np.zeros(shape)
        for keepdims in ((False, True) if name == "logsumexp" else (None,)):
            kw = {} if keepdims is None else {"keepdims": keepdims}
            want = TORCH[name](torch.from_numpy(x), axis, **kw).numpy()
            y = kf(_t(x), axis, **kw)
            np.testing.assert_array_equal(_np(y), want)    # logsumexp of nothing: -inf
            np.testing.assert_array_equal(rf(x, axis, **kw), want)
            dx = kb(_t(np.ones(want.shape)), y, _t(x), axis, **kw)[0]
            assert tuple(dx.shape) == shape
            assert rb(np.ones(want.shape), want, x, axis, **kw)[0].shape == shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_within_ratio_of_torch(name, dtype):
    """The kernel's error against float64 stays within 2x of torch's own in
    the same dtype (plus a half-ulp floor of the output)."""
    xt = _t(_rand((9, 300), 4, 6.0), dtype)
    x = _np(xt)
    exact = TORCH[name](torch.from_numpy(x), 1).numpy()
    theirs = TORCH[name](xt.cpu(), 1).double().numpy()
    mine = _np(getattr(ks, name + "_forward")(xt, 1))
    ulp = np.abs(exact).max() * (2.0 ** -9 if dtype == torch.bfloat16 else 2.0 ** -12)
    assert np.abs(mine - exact).max() <= 2 * np.abs(theirs - exact).max() + ulp


def test_axis_errors():
    x = _t(np.zeros((2, 3)))
    with pytest.raises(ShapeError, match="out of range"):
        ks.softmax_forward(x, 2)
    with pytest.raises(ShapeError, match="one axis"):
        ks.logsumexp_forward(x, (0, 1))
    with pytest.raises(ShapeError, match="at least one dimension"):
        ks.softmax_forward(_t(np.zeros(())), 0)
    with pytest.raises(ShapeError, match="out of range"):
        ref.logsoftmax_forward(np.zeros((2, 3)), -3)
    # a 1-tuple axis is accepted, negative axes count from the end
    np.testing.assert_array_equal(_np(ks.softmax_forward(x, (-1,))), np.full((2, 3), 1 / 3, np.float32))


def test_ops_checks_before_dispatching(monkeypatch):
    """The ops functions raise the spec's errors at the API edge, before any
    reference or kernel runs."""
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a bad softmax"))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="out of range"):
        ops.softmax(x, 2)
    with pytest.raises(ShapeError, match="one axis"):
        ops.logsumexp(x, (0, 1))
    with pytest.raises(ShapeError, match="at least one dimension"):
        ops.logsoftmax(np.zeros((), np.float32), 0)


def test_torch_only_allocates_and_views():
    x = _t(_rand((4, 6, 5), 5)).transpose(0, 2)
    g3, g2 = _t(np.ones((5, 6, 4))), _t(np.ones((5, 4)))
    empty = _t(np.zeros((3, 0)))
    def work():
        for name in NAMES:
            kw = {"keepdims": False} if name == "logsumexp" else {}
            kf, kb, _, _ = _fns(name)
            y = kf(x, 1, **kw)
            kb(g2 if name == "logsumexp" else g3, y, x, 1, **kw)
            kf(empty, 1, **kw)
    ops = assert_torch_only_moves_memory(work, "the softmax kernels")
    assert "empty.memory_format" in ops
