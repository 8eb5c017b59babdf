"""matmul family: the cases the generic property suite does not pin down.

Every rank combination of NumPy's matmul, broadcast batch axes, transposed
and strided operands read in place (no copy), empty sides, half precision
against torch by ratio, the GPU tile configuration run in the interpreter,
and torch doing nothing but allocate and make views.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import DTypeError, ShapeError
from triflux.reference import matmul as ref

if not backend.functional("CUDA"):
    pytest.skip("no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)",
                allow_module_level=True)

import torch  # noqa: E402
from torch_ops import assert_torch_only_moves_memory  # noqa: E402

from triflux.triton_kernels import copy, launch  # noqa: E402
from triflux.triton_kernels import matmul as km  # noqa: E402

DEVICE = "cpu" if launch.INTERPRET else "cuda"


def _t(array, dtype=torch.float32):
    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(dtype).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").double().numpy()


def _rand(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


SHAPES = [
    ((5,), (5,)),                    # inner product -> 0-d
    ((1,), (1,)),
    ((3, 5), (5,)),                  # matrix @ vector
    ((5,), (5, 7)),                  # vector @ matrix
    ((6, 5), (5, 4)),
    ((1, 1), (1, 1)),
    ((17, 13), (13, 33)),
    ((2, 1, 5, 3), (4, 3, 7)),       # broadcast batch axes
    ((7, 3, 5), (5, 4)),             # batched @ matrix (folded into one product)
    ((3, 5), (7, 5, 4)),             # matrix @ batched
    ((1, 4, 3), (2, 3, 5)),
    ((2, 5, 3), (3,)),               # batched @ vector
    ((3,), (4, 3, 2)),               # vector @ batched
    ((2, 3, 1, 2, 3), (3, 1, 3, 2)),  # more batch axes than one
]


@pytest.mark.parametrize("sa,sb", SHAPES)
def test_shapes_forward_backward(sa, sb):
    a, b = _rand(sa, 1), _rand(sb, 2)
    c = km.matmul_forward(_t(a), _t(b))
    expect = np.matmul(a, b)
    assert tuple(c.shape) == expect.shape and c.dtype == torch.float32
    np.testing.assert_allclose(_np(c), expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref.matmul_forward(a, b), expect, rtol=1e-12, atol=1e-12)

    g = _rand(expect.shape, 3)
    da, db = km.matmul_backward(_t(g), c, _t(a), _t(b))
    ra, rb = ref.matmul_backward(g, expect, a, b)
    ta, tb = torch.from_numpy(a).requires_grad_(), torch.from_numpy(b).requires_grad_()
    torch.matmul(ta, tb).backward(torch.from_numpy(np.asarray(g)))
    np.testing.assert_allclose(ra, ta.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rb, tb.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert tuple(da.shape) == sa and tuple(db.shape) == sb
    np.testing.assert_allclose(_np(da), ra, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(db), rb, rtol=1e-5, atol=1e-5)


def test_float64_is_exact_enough():
    a, b = _rand((3, 17, 33), 4), _rand((33, 9), 5)
    c = km.matmul_forward(_t(a, torch.float64), _t(b, torch.float64))
    assert c.dtype == torch.float64
    np.testing.assert_allclose(_np(c), a @ b, rtol=1e-13, atol=1e-13)


class _Launches:
    """Records the tensors each kernel launch receives."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = launch.launch

        def recording_launch(kernel, grid, *args, **meta):
            self.calls.append([x for x in args if isinstance(x, torch.Tensor)])
            return real(kernel, grid, *args, **meta)
        monkeypatch.setattr(launch, "launch", recording_launch)

    def inputs(self, i=0):
        return self.calls[i]


def _no_copies(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("matmul copied an operand")
    monkeypatch.setattr(copy, "contiguous", refuse)
    monkeypatch.setattr(copy, "copy_into", refuse)
    monkeypatch.setattr(copy, "cast", refuse)


@pytest.mark.parametrize("which", ["a.T", "b.T", "both.T", "strided", "batch-strided", "expanded"])
def test_views_are_read_in_place(monkeypatch, which):
    """Transposed, strided and broadcast (stride 0) operands go to the kernel
    as they are: no contiguous copy, the launch sees the original storage."""
    base_a, base_b = _t(_rand((13, 7), 6)), _t(_rand((7, 11), 7))
    if which == "a.T":
        a, b = _t(_rand((7, 13), 6)).T, base_b                  # a: a (13, 7) view
    elif which == "b.T":
        a, b = base_a, _t(_rand((11, 7), 8)).T
    elif which == "both.T":
        a, b = _t(_rand((7, 13), 6)).T, _t(_rand((11, 7), 8)).T
    elif which == "strided":
        a, b = _t(_rand((13, 14), 6))[:, ::2], _t(_rand((14, 11), 8))[::2]
    elif which == "batch-strided":
        a = _t(_rand((6, 13, 7), 6))[::2]                  # (3, 13, 7), batch stride doubled
        b = _t(_rand((3, 11, 7), 8)).transpose(1, 2)       # (3, 7, 11) transposed
    else:
        a = base_a.unsqueeze(0).expand(4, 13, 7)           # stride 0 batch axis
        b = _t(_rand((4, 7, 11), 8))
    assert not (a.is_contiguous() and b.is_contiguous())
    expect = np.matmul(_np(a), _np(b))
    rec = _Launches(monkeypatch)
    _no_copies(monkeypatch)
    c = km.matmul_forward(a, b)
    np.testing.assert_allclose(_np(c), expect, rtol=1e-5, atol=1e-5)
    assert len(rec.calls) == 1
    got_a, got_b = rec.inputs()[:2]
    assert got_a.data_ptr() == a.data_ptr() and got_b.data_ptr() == b.data_ptr()


def test_backward_reads_views_in_place(monkeypatch):
    """dA = G @ B^T and dB = A^T @ G: transposed views, no copies."""
    a, b = _t(_rand((13, 7), 6)), _t(_rand((11, 7), 8)).T
    g = _t(_rand((13, 11), 9))
    c = km.matmul_forward(a, b)
    _no_copies(monkeypatch)
    rec = _Launches(monkeypatch)
    da, db = km.matmul_backward(g, c, a, b)
    ra, rb = ref.matmul_backward(_np(g), _np(c), _np(a), _np(b))
    np.testing.assert_allclose(_np(da), ra, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(db), rb, rtol=1e-5, atol=1e-5)
    assert len(rec.calls) >= 2
    for call in rec.calls[:2]:
        ptrs = {t.data_ptr() for t in call[:2]}
        assert ptrs <= {a.data_ptr(), b.data_ptr(), g.data_ptr()}


def test_empty_sides():
    z = km.matmul_forward(_t(np.ones((3, 0))), _t(np.ones((0, 4))))       # K = 0
    assert tuple(z.shape) == (3, 4) and not _np(z).any()
    z = km.matmul_forward(_t(np.ones((0,))), _t(np.ones((0,))))           # 0-d zero
    assert tuple(z.shape) == () and _np(z) == 0
    for sa, sb, so in [((0, 3), (3, 4), (0, 4)), ((3, 4), (4, 0), (3, 0)),
                       ((0, 2, 3), (3, 4), (0, 2, 4)), ((2, 0, 3), (1, 3, 5), (2, 0, 5)),
                       ((5, 3), (0, 3, 2), (0, 5, 2))]:
        a, b = _t(np.ones(sa)), _t(np.ones(sb))
        c = km.matmul_forward(a, b)
        assert tuple(c.shape) == so
        g = _t(np.ones(so))
        da, db = km.matmul_backward(g, c, a, b)
        ra, rb = ref.matmul_backward(np.ones(so), np.ones(so), np.ones(sa), np.ones(sb))
        assert tuple(da.shape) == sa and tuple(db.shape) == sb
        np.testing.assert_array_equal(_np(da), ra)
        np.testing.assert_array_equal(_np(db), rb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_ratio_of_torch(dtype):
    """The kernel's error against float64 stays within 2x of torch's own in
    the same dtype (plus a half-ulp floor of the output)."""
    a = _t(_rand((3, 19, 67), 10), dtype)
    b = _t(_rand((67, 21), 11), dtype)
    a64, b64 = _np(a), _np(b)
    exact = a64 @ b64
    c = km.matmul_forward(a, b)
    assert c.dtype == dtype
    torch_c = torch.matmul(a.cpu(), b.cpu()).double().numpy()
    ulp = np.abs(exact).max() * (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11)
    err = np.abs(_np(c) - exact).max()
    assert err <= 2 * np.abs(torch_c - exact).max() + ulp


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_backward_sums_broadcast_batch_once(dtype):
    """Gradients of broadcast operands are batch sums: kept in float32 until
    the sum is done, so they are rounded once, like torch's."""
    a = _t(_rand((8, 1, 9, 13), 20), dtype)
    b = _t(_rand((1, 6, 13, 11), 21), dtype)
    g = _t(_rand((8, 6, 9, 11), 22), dtype)
    ra, rb = ref.matmul_backward(_np(g), None, _np(a), _np(b))
    da, db = km.matmul_backward(g, None, a, b)
    ta, tb = a.cpu().clone().requires_grad_(), b.cpu().clone().requires_grad_()
    torch.matmul(ta, tb).backward(g.cpu())
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    for mine, theirs, exact in [(da, ta.grad, ra), (db, tb.grad, rb)]:
        assert mine.dtype == dtype
        err = np.abs(_np(mine) - exact).max()
        # one rounding: within half an ulp, i.e. u relative (torch rounds each
        # batch item's product and then the sum, and exceeds that here)
        assert err <= u * np.abs(exact).max()
        assert err <= 2 * np.abs(theirs.double().numpy() - exact).max()


def test_gpu_tiles_in_the_interpreter(monkeypatch):
    """The GPU's configuration (one batch item per program, tiles smaller than
    the problem, several K steps, grouped tile order) computes the same."""
    w = dict(num_warps=4)
    for dtype, tiles in [(torch.float32, (1, 16, 16, 8, w)), (torch.float64, (1, 16, 16, 8, w)),
                         (torch.float16, (1, 16, 16, 16, w)), (torch.float32, (4, 16, 16, 8, w))]:
        monkeypatch.setattr(km, "_tiles", lambda *args, _t=tiles: _t)
        a = _t(_rand((2, 23, 20), 12), dtype).transpose(1, 2)     # (2, 20, 23)
        b = _t(_rand((2, 1, 23, 41), 13), dtype)[:, :, :, ::2]    # (2, 1, 23, 21)
        c = km.matmul_forward(a, b)
        expect = np.matmul(_np(a), _np(b))
        tol = 1e-12 if dtype == torch.float64 else 1e-2 if dtype == torch.float16 else 1e-5
        np.testing.assert_allclose(_np(c), expect, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,shape,sms,expected", [
    (np.float32, (128, 256, 784), 132, ((32, 32, 32), 4, 3)),     # the MLP's first layer: fill the SMs
    (np.float32, (4096, 4096, 512), 132, ((64, 64, 32), 4, 2)),   # many tiles either way: the larger
    (np.float16, (128, 256, 784), 108, ((64, 32, 32), 4, 3)),
    (np.float16, (8192, 512, 64), 128, ((64, 64, 64), 4, 3)),      # two whole rounds
])
def test_gpu_tiles_by_the_wave_model(monkeypatch, dtype, shape, sms, expected):
    """A GPU's tiles: the largest within 10% of the best share of whole waves
    of programs over the SMs (``launch.wave_efficiency``)."""
    monkeypatch.setattr(km.launch, "INTERPRET", False)
    km._tiles.cache_clear()
    try:
        _, bm, bn, bk, options = km._tiles(1, *shape, np.dtype(dtype), sms)
    finally:
        km._tiles.cache_clear()
    assert ((bm, bn, bk), options["num_warps"], options["num_stages"]) == expected
    assert launch.wave_efficiency(132 * 4, 4, 128, 132) == 1.0          # 4 programs of 4 warps per SM: one round
    assert launch.wave_efficiency(132 * 4 + 1, 4, 128, 132) == pytest.approx(529 / 1056)


def test_errors():
    with pytest.raises(ShapeError, match="inner sizes"):
        km.matmul_forward(_t(np.ones((2, 3))), _t(np.ones((4, 2))))
    with pytest.raises(ShapeError, match="do not broadcast"):
        km.matmul_forward(_t(np.ones((2, 2, 3))), _t(np.ones((3, 3, 2))))
    with pytest.raises(ShapeError, match="scalar"):
        km.matmul_forward(_t(np.ones(())), _t(np.ones((3,))))
    with pytest.raises(DTypeError, match="same dtype"):
        km.matmul_forward(_t(np.ones((2, 3))), _t(np.ones((3, 2)), torch.float64))
    with pytest.raises(ShapeError, match="inner sizes"):
        ref.matmul_forward(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(DTypeError):
        ref.matmul_forward(np.ones((2, 3), np.float32), np.ones((3, 2)))


def test_ops_checks_before_dispatching(monkeypatch):
    """``ops.matmul`` raises the spec's errors at the API edge, before any
    reference or kernel runs."""
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a bad matmul"))
    with pytest.raises(ShapeError, match="inner sizes"):
        ops.matmul(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ShapeError, match="do not broadcast"):
        ops.matmul(np.ones((2, 2, 3), np.float32), np.ones((3, 3, 2), np.float32))
    with pytest.raises(ShapeError, match="scalar"):
        ops.matmul(np.ones((), np.float32), np.ones((3,), np.float32))


def test_torch_only_allocates_and_views():
    a = _t(_rand((2, 1, 5, 3), 14)).transpose(-1, -2).contiguous().transpose(-1, -2)
    b = _t(_rand((4, 3, 7), 15))
    v = _t(_rand((3,), 16))
    g = _t(_rand((2, 4, 5, 7), 17))
    e = _t(np.ones((3, 0)))
    def work():
        c = km.matmul_forward(a, b)
        km.matmul_backward(g, c, a, b)
        w = km.matmul_forward(a, v)
        km.matmul_backward(w, w, a, v)
        km.matmul_forward(a[0, 0], e)
    ops = assert_torch_only_moves_memory(work, "the matmul kernels")
    assert "empty.memory_format" in ops               # the recorder sees allocations


@pytest.mark.parametrize("side", ["reference", "kernel"])
def test_partial_backward_and_layout_of_weight_gradients(side):
    """``needs`` skips unneeded gradients; a transposed operand (Dense's
    weight.T) gets its gradient in its own memory layout."""
    from triflux.reference import matmul as rm
    rng = np.random.default_rng(3)
    x, w, g = rng.standard_normal((5, 7)), rng.standard_normal((4, 7)), rng.standard_normal((5, 4))
    if side == "reference":
        da, db = rm.matmul_backward(g, None, x, w.T, needs=(False, True))
        assert da is None and db.flags.f_contiguous
        full = rm.matmul_backward(g, None, x, w.T)
        np.testing.assert_allclose(db, full[1])
        np.testing.assert_allclose(db, x.T @ g)
    else:
        f64 = torch.float64
        xt, wt, gt = _t(x, f64), _t(w, f64), _t(g, f64)
        da, db = km.matmul_backward(gt, None, xt, wt.transpose(0, 1), needs=(False, True))
        assert da is None and db.transpose(0, 1).is_contiguous()
        np.testing.assert_allclose(db.cpu().numpy(), x.T @ g, rtol=1e-12)
        for shape in [(2, 5, 7), (5, 7)]:                  # folded batch and plain
            xs = rng.standard_normal(shape)
            gs = rng.standard_normal(shape[:-1] + (4,))
            _, db = km.matmul_backward(_t(gs, f64), None, _t(xs, f64), wt.transpose(0, 1), needs=(False, True))
            np.testing.assert_allclose(db.cpu().numpy(), xs.reshape(-1, 7).T @ gs.reshape(-1, 4), rtol=1e-12)


def runs_of_eight(strategy, runs=20):
    """Draws of ``strategy`` as the property suite sees them: ``runs`` runs
    (seeds 0, 1, ...) of 8 examples each, as lists of cases."""
    from hypothesis import HealthCheck, Phase, given, seed, settings
    out = []
    for s in range(runs):
        out.append([])

        @seed(s)
        @settings(max_examples=8, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw(case):
            out[-1].append(case)
        draw()
    return out


def test_strategy_draws_the_cases_that_hide_bugs():
    """The property suite sees 8 draws per dtype, so the cases that once hid
    bugs must be in nearly every run of 8: a matrix transposed in memory
    against a stack (Dense's ``x @ weight.T``; the reference transposed every
    axis of the stack), a batch sum of over a thousand terms (which a 16-bit
    accumulator loses), several batch axes; and often every side equal (a
    wrong transpose then gives numbers, not a shape error)."""
    from triflux.testing.matmul import matmul_strategy
    runs = runs_of_eight(matmul_strategy("bfloat16"))

    def runs_with(pred):
        return sum(any(pred(*c.inputs, c) for c in run) for run in runs) / len(runs)

    def transposed_matrix_vs_stack(a, b, c):
        return any(x.ndim == 2 and y.ndim >= 3 and c.layout(i) == "transposed" and min(x.shape) > 1
                   for i, (x, y) in enumerate(((a, b), (b, a))))

    assert runs_with(transposed_matrix_vs_stack) >= 0.9
    assert runs_with(lambda a, b, c: max(np.prod(a.shape[:-2]), np.prod(b.shape[:-2])) >= 1000) >= 0.9
    assert runs_with(lambda a, b, c: max(a.ndim, b.ndim) >= 4) >= 0.9
    assert runs_with(lambda a, b, c: max(a.ndim, b.ndim) >= 3 and len(set(a.shape + b.shape)) == 1) >= 0.6


# --- dense_bias_act: act(x @ w^T + b), a Dense layer as one primitive -------------------------

from triflux.primitives import REGISTRY  # noqa: E402

#: the activations dense_bias_act fuses, as declared with the primitive
DENSE_ACTS = REGISTRY["dense_bias_act"].fusable_activations
#: x's shapes: leading axes none, one, two; no rows; no features
DENSE_X = [(7,), (5, 7), (2, 3, 7), (0, 7), (4, 0)]


def _dense_sides():
    """(name, forward, backward, to the side, back to NumPy) of the reference and the kernel."""
    yield "reference", ref.dense_bias_act_forward, ref.dense_bias_act_backward, lambda a: a, np.asarray
    yield ("kernel", km.dense_bias_act_forward, km.dense_bias_act_backward,
           lambda a: _t(a, torch.float64), _np)


@pytest.mark.parametrize("act", DENSE_ACTS)
@pytest.mark.parametrize("x_shape", DENSE_X, ids=str)
def test_dense_bias_act_is_the_product_then_the_bias_then_the_activation(x_shape, act):
    """Both sides, float64: the forward is act(x @ w^T + b) and the backward
    the chain rule through it, written out in NumPy (gz = G act'(z) from z,
    not from y), for every leading-axes shape."""
    K = x_shape[-1]
    x, w, b = _rand(x_shape, 1), _rand((3, K), 2), _rand((3,), 3)
    z = x @ w.T + b
    y_expected = {"identity": z, "relu": np.maximum(z, 0), "sigmoid": 1 / (1 + np.exp(-z)),
                  "tanh": np.tanh(z)}[act]
    g = _rand(y_expected.shape, 4)
    slope = {"identity": np.ones_like(z), "relu": (z > 0) * 1.0, "sigmoid": y_expected * (1 - y_expected),
             "tanh": 1 - np.tanh(z) ** 2}[act]
    rows = int(np.prod(x_shape[:-1]))
    gz = (g * slope).reshape(rows, 3)
    expected = ((gz @ w).reshape(x_shape), gz.T @ x.reshape(rows, K), gz.sum(axis=0))
    for side, forward, backward, to, back in _dense_sides():
        y = forward(to(x), to(w), to(b), activation=act)
        assert tuple(y.shape) == y_expected.shape, f"{side}: {tuple(y.shape)}"
        np.testing.assert_allclose(back(y), y_expected, rtol=1e-12, atol=1e-14, err_msg=f"{side} y")
        for got, want, what in zip(backward(to(g), y, to(x), to(w), to(b), activation=act), expected,
                                   ("dx", "dw", "db")):
            assert tuple(got.shape) == want.shape, f"{side} {what}: {tuple(got.shape)}"
            np.testing.assert_allclose(back(got), want, rtol=1e-12, atol=1e-14, err_msg=f"{side} {what}")


def test_dense_relu_gradient_is_a_select():
    """relu's backward keeps G where y > 0 or y is NaN and gives 0 elsewhere,
    whatever G is there (an infinite or NaN G included): torch's
    threshold_backward, on both sides and in the reference's conv and norm
    too (they share ``through_activation``)."""
    from triflux.reference._activation import through_activation
    nan, inf = np.nan, np.inf
    y = np.array([[0.0, -0.0, 2.0, nan, 0.0, 1.0]])
    g = np.array([[inf, nan, -inf, 3.0, -inf, nan]])
    want = np.array([[0.0, 0.0, -inf, 3.0, 0.0, nan]])
    for dtype in (np.float32, np.float64):
        np.testing.assert_array_equal(through_activation(g.astype(dtype), y.astype(dtype), "relu"), want)
    x, w = np.ones((1, 6)), np.eye(6)
    for side, _, backward, to, back in _dense_sides():
        _, _, db = backward(to(g), to(y), to(x), to(w), to(np.zeros(6)), activation="relu")
        np.testing.assert_array_equal(back(db), want[0], err_msg=side)


def test_dense_bias_act_partial_backward():
    """Declared partial_backward: a gradient not in ``needs`` is None, the
    others are those of the full backward; the weight's gradient has the
    weight's (row-major) layout."""
    x, w, b = _rand((2, 3, 7), 5), _rand((4, 7), 6), _rand((4,), 7)
    for side, forward, backward, to, back in _dense_sides():
        args = [to(a) for a in (x, w, b)]
        y = forward(*args, activation="tanh")
        g = to(_rand(tuple(y.shape), 8))
        full = backward(g, y, *args, activation="tanh")
        for i in range(3):
            needs = tuple(j != i for j in range(3))
            part = backward(g, y, *args, activation="tanh", needs=needs)
            assert part[i] is None, f"{side}: gradient {i} computed though not needed"
            for j in (j for j in range(3) if j != i):
                np.testing.assert_array_equal(back(part[j]), back(full[j]), err_msg=f"{side} gradient {j}")
        dw = full[1]
        assert (dw.flags.c_contiguous if side == "reference" else dw.is_contiguous()), f"{side}: dw not row-major"


def test_dense_bias_act_with_no_features_is_the_activated_bias():
    """K = 0: every row is act(b) (the kernel runs its epilogue on an empty sum)."""
    b = _rand((3,), 9)
    for side, forward, _, to, back in _dense_sides():
        y = forward(to(np.zeros((4, 0))), to(np.zeros((3, 0))), to(b), activation="sigmoid")
        np.testing.assert_allclose(back(y), np.broadcast_to(1 / (1 + np.exp(-b)), (4, 3)), rtol=1e-12,
                                   err_msg=side)


def test_matrix_product_epilogue_on_batched_products():
    """The kernel's bias and activation epilogue on stacks of products too
    (several batch items per program in the interpreter, one on a GPU)."""
    a, b, bias = _rand((3, 5, 7), 10), _rand((3, 7, 4), 11), _rand((4,), 12)
    code = km.ACTIVATION_CODES["relu"]
    c = km.matrix_product(_t(a, torch.float64), _t(b, torch.float64), bias=_t(bias, torch.float64), activation=code)
    np.testing.assert_allclose(_np(c), np.maximum(a @ b + bias, 0), rtol=1e-12)


def test_dense_bias_act_kernels_use_torch_only_for_memory():
    x = _t(_rand((2, 5, 7), 13)).transpose(0, 1)                # (5, 2, 7): no (rows, K) view, a copy
    w, b = _t(_rand((4, 7), 14)), _t(_rand((4,), 15))
    xh, wh, bh = (t.to(torch.bfloat16) for t in (x, w, b))

    def work():
        for act in DENSE_ACTS:
            y = km.dense_bias_act_forward(x, w, b, activation=act)
            km.dense_bias_act_backward(y.transpose(0, 1).transpose(0, 1), y, x, w, b, activation=act)
        y = km.dense_bias_act_forward(xh, wh, bh, activation="tanh")    # 16-bit: gz cast for the products
        km.dense_bias_act_backward(y, y, xh, wh, bh, activation="tanh")
    assert_torch_only_moves_memory(work, "the dense_bias_act kernels")


def test_dense_bias_act_errors():
    """The spec refuses, with what to change, on both sides and at the API
    edge (before any dispatch); ops promote a bias as matmul(x, w.T) + b would."""
    import triflux as tf
    from triflux import ops
    x, w, b = (np.zeros(s, np.float32) for s in ((4, 3), (2, 3), (2,)))
    for side, forward, _, to, _ in _dense_sides():
        with pytest.raises(ValueError, match="activation must be one of"):
            forward(to(x), to(w), to(b), activation="gelu")
        with pytest.raises(ShapeError, match=r"bias must have shape \(2,\)"):
            forward(to(x), to(w), to(np.zeros(3)), activation="relu")
        with pytest.raises(ShapeError, match="looks like Flux's"):
            forward(to(x.T), to(w), to(b))
    with pytest.raises(DTypeError, match="one dtype"):
        ref.dense_bias_act_forward(x, w.astype(np.float64), b)
    with pytest.raises(ValueError, match="put all three on one device"):
        km.dense_bias_act_forward(_t(x), _t(w).to("meta"), _t(b))
    assert ops.dense_bias_act(tf.tensor(x), tf.tensor(w), tf.tensor(np.zeros(2))).dtype == np.float64
    with pytest.raises(ShapeError, match="matrix"):
        ops.dense_bias_act(tf.tensor(x), tf.tensor(np.zeros(3, np.float32)), tf.tensor(b))


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_dense_layer_is_one_fused_primitive_and_computes_as_before(dev):
    """Dense with a bias and a fusable activation records one dense_bias_act;
    other activations and bias=False keep matmul (+ bias) and the activation.
    Fused or not, the layer's output and its parameters' gradients are those
    of the unfused ops."""
    import triflux as tf
    from triflux import ops
    from helpers import device, recorded_primitives
    d = device(dev)
    rng = np.random.default_rng(0)
    x, c = (d(tf.tensor(rng.standard_normal(s))) for s in ((2, 3, 5), (2, 3, 4)))
    for act, name in ((tf.relu, "relu"), (tf.σ, "sigmoid"), (tf.tanh, "tanh"), (tf.identity, "identity")):
        layer = d(tf.Dense(5, 4, act, dtype=np.float64))
        assert recorded_primitives(layer, x) == ["dense_bias_act"], f"Dense with {name}: not fused"

        def unfused(m):
            return ops.sum(act(ops.matmul(x, m.weight.T) + m.bias) * c)
        value, (g,) = tf.withgradient(lambda m: ops.sum(m(x) * c), layer)
        value_unfused, (g_unfused,) = tf.withgradient(unfused, layer)
        np.testing.assert_allclose(tf.cpu(value).numpy(), tf.cpu(value_unfused).numpy(), rtol=1e-12)
        for key in ("weight", "bias"):
            np.testing.assert_allclose(tf.cpu(g[key]).numpy(), tf.cpu(g_unfused[key]).numpy(), rtol=1e-12,
                                       atol=1e-15, err_msg=f"{name} {key}")
    names = recorded_primitives(d(tf.Dense(5, 4, tf.leakyrelu, dtype=np.float64)), x)
    assert "dense_bias_act" not in names and names[-1] == "leakyrelu" and "matmul" in names, names
    names = recorded_primitives(d(tf.Dense(5, 4, tf.relu, bias=False, dtype=np.float64)), x)
    assert "dense_bias_act" not in names and names[-1] == "relu", names


def test_dense_bias_gradient_in_splits(monkeypatch):
    """On a GPU, the bias gradient of many rows is summed in several programs
    of 32 columns x 32 rows (64 rows a split) and a second launch (no
    atomics): forced here in the interpreter, on a (rows, O) matrix as
    dense_bias_act passes it."""
    from triflux.triton_kernels import bias_act
    g, y = _rand((2000, 70), 21), 1 / (1 + np.exp(-_rand((2000, 70), 22)))
    gt, yt, bt = _t(g, torch.float64), _t(y, torch.float64), _t(_rand((70,), 23), torch.float64)
    launched, real_launch = [], launch.launch
    monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (launched.append((k, grid, m)),
                                                                    real_launch(k, grid, *a, **m))[1])
    monkeypatch.setattr(launch, "INTERPRET", False)
    gz, db = bias_act.act_grad_and_bias_grad(gt.view(2000, 70, 1, 1), yt.view(2000, 70, 1, 1), bt,
                                             km.ACTIVATION_CODES["sigmoid"])
    monkeypatch.setattr(launch, "INTERPRET", True)
    monkeypatch.setattr(launch, "launch", real_launch)
    assert [k for k, _, _ in launched] == [bias_act._act_grad_kernel, bias_act._sum_splits_kernel], launched
    (_, grid, meta), _ = launched
    assert grid == (3, 32) and (meta["BLOCK_SIZE_CHANNELS"], meta["BLOCK_SIZE_PIXELS"]) == (32, 32), launched
    gz64 = g * y * (1 - y)
    np.testing.assert_allclose(_np(gz).reshape(2000, 70), gz64, rtol=1e-12)
    np.testing.assert_allclose(_np(db), gz64.sum(axis=0), rtol=1e-10)
