"""maxpool / meanpool / lpnormpool / adaptive_maxpool / adaptive_meanpool
(any spatial rank): the cases the generic property suite does not pin down.

Fixed configurations against torch's own functions, forward and gradient:
the ones a UNET uses, PyTorch's OpInfo samples (dilation, ceil_mode,
count_include_pad=False, adaptive output sizes), ceil-mode windows that torch
drops and keeps; torch's argmax rule (the first maximal element in window
scan order, the last NaN, padding never chosen, an all -inf window); NaN
propagation; 16-bit sums rounded once (held to the unit roundoff plus
float32 noise, stricter than the property suite, whose ratio test would
accept torch's own 16-bit accumulation in avg_pool2d's backward); empty batch
and channel dims; channels-last and strided views read in place; attribute
errors; and torch doing nothing but allocate and make views. Rank 1 and 3
versions of the configurations where a rank bug could hide (the lifting of
the kernels' canonical 3-d geometry, the separable maps along R axes, the
tiled fast path, the argmax's multi-index). lpnormpool against torch's
lp_pool1d/2d/3d: PyTorch's LPPool module samples (inputs in [-9, 9], so
NaN for p = 1.5), torch's ceil-mode scaling, its zero-sum gradient (0,
where NNlib's formula gives NaN), p = inf, and padding and dilation.
"""
import ml_dtypes
import numpy as np
import pytest

from helpers import call, rel, rnd
from triflux import backend
from triflux.errors import ArgumentError, ShapeError
from triflux.reference import pool as ref
from triflux.specs.pool import pool2d_spec, pool_axis, pool_spec

torch = pytest.importorskip("torch")
F = torch.nn.functional

GPU = backend.functional("CUDA")
needs_kernels = pytest.mark.skipif(
    not GPU, reason="no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)")

if GPU:
    from torch_ops import assert_torch_only_moves_memory
    from triflux.triton_kernels import launch
    from triflux.triton_kernels import pool as kp
    DEVICE = "cpu" if launch.INTERPRET else "cuda"

MAX, MEAN, AMAX, AMEAN, LP = "maxpool", "meanpool", "adaptive_maxpool", "adaptive_meanpool", "lpnormpool"


def _max(window, stride, padding=None, dilation=None, ceil_mode=False):
    R = len(window)
    return (MAX, dict(window=window, stride=stride, padding=padding or (0,) * (2 * R), dilation=dilation or (1,) * R,
                      ceil_mode=ceil_mode))


def _mean(window, stride, padding=None, ceil_mode=False, count_include_pad=True):
    return (MEAN, dict(window=window, stride=stride, padding=padding or (0,) * (2 * len(window)), ceil_mode=ceil_mode,
                       count_include_pad=count_include_pad))


def _lp(p, window, stride, padding=None, dilation=None, ceil_mode=False):
    R = len(window)
    return (LP, dict(p=p, window=window, stride=stride, padding=padding or (0,) * (2 * R),
                     dilation=dilation or (1,) * R, ceil_mode=ceil_mode))


UNET = [_max((2, 2), (2, 2)), _max((3, 3), (1, 1), (1, 1, 1, 1)), _mean((2, 2), (2, 2)),
        _mean((3, 3), (1, 1), (1, 1, 1, 1))]
#: torch-expressible (symmetric padding): compared with torch's own functions
NEW = [
    _max((3, 2), (2, 1), (1, 1, 1, 1), (1, 2), True),          # OpInfo's max_pool2d sample
    _max((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),          # a ceil window that torch drops on 8 rows
    _max((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True),          # a partial ceil window that torch keeps
    _max((2, 3), (1, 2), (1, 1, 0, 0), (3, 2), False),
    _mean((3, 3), (1, 1), (1, 1, 1, 1), True, False),          # OpInfo's avg_pool2d samples
    _mean((4, 4), (2, 3), (1, 1, 1, 1), True, False),
    _mean((6, 6), (3, 3), (2, 2, 3, 3), True, True),
    _mean((4, 4), (2, 2), (2, 2, 2, 2), True, True),
    _mean((3, 2), (2, 2), (1, 1, 1, 1), False, False),
    (AMAX, dict(size=(5, 7))), (AMAX, dict(size=(1, 1))), (AMAX, dict(size=(3, 11))), (AMAX, dict(size=(8, 2))),
    (AMEAN, dict(size=(5, 7))), (AMEAN, dict(size=(1, 1))), (AMEAN, dict(size=(3, 11))), (AMEAN, dict(size=(8, 2))),
]
#: asymmetric padding (each side at most half the window's extent): torch's functions after F.pad (the testing oracle)
ODD = [_max((3, 2), (2, 3), (1, 0, 1, 0)), _max((2, 2), (2, 1), (0, 1, 1, 0), (2, 1), True),
       _mean((2, 3), (3, 1), (0, 1, 1, 0)), _mean((3, 3), (2, 2), (1, 0, 0, 1), True, False)]
#: 1-d configurations on (2, 3, 11) and 3-d ones on (2, 2, 5, 6, 4)
RANK1 = [_max((3,), (2,), (1, 1), (2,), True), _max((2,), (2,)), _max((2,), (1,), (0, 1), (3,)),
         _mean((4,), (3,), (2, 2), True, False), _mean((3,), (2,), (1, 0)),
         _lp(2.0, (3,), (2,), ceil_mode=True), _lp(1.5, (2,), (3,), (1, 0), (2,)),
         (AMAX, dict(size=(4,))), (AMEAN, dict(size=(13,)))]
RANK3 = [_max((2, 2, 2), (2, 2, 2)), _max((2, 3, 2), (2, 1, 2), (1, 1, 1, 1, 0, 1), (1, 1, 2), True),
         _mean((3, 2, 2), (2, 2, 1), (1, 1, 0, 0, 1, 0), True, False), _mean((2, 2, 3), (1, 2, 2), (1, 1, 1, 1, 1, 1)),
         _lp(3.0, (2, 2, 2), (2, 1, 2), ceil_mode=True), _lp(2.0, (2, 3, 1), (1, 2, 1), (1, 0, 1, 1, 0, 0), (2, 1, 1)),
         (AMAX, dict(size=(3, 5, 2))), (AMEAN, dict(size=(2, 7, 1)))]
#: the input each rank's configurations run on
SHAPE = {1: (2, 3, 11), 2: (2, 3, 8, 7), 3: (2, 2, 5, 6, 4)}
TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def _rank(attrs):
    return len(attrs["size"] if "size" in attrs else attrs["window"])


def torch_pool(name, x, window=None, stride=None, padding=None, dilation=None, ceil_mode=False,
               count_include_pad=True, size=None, p=None):
    """torch's own functional ops (of the attrs' rank); asymmetric padding and
    lp_pool with padding or dilation through the testing oracle (F.pad first)."""
    from triflux.testing import pool as oracle
    if name == AMAX:
        return getattr(F, f"adaptive_max_pool{len(size)}d")(x, size)
    if name == AMEAN:
        return getattr(F, f"adaptive_avg_pool{len(size)}d")(x, size)
    R = len(window)
    if name == LP:
        if any(padding) or any(d != 1 for d in dilation):
            return oracle.lpnormpool_torch(x, p, window, stride, padding, dilation, ceil_mode)
        if R == 1:
            return F.lp_pool1d(x, p, window[0], stride[0], ceil_mode)
        return getattr(F, f"lp_pool{R}d")(x, p, window, stride, ceil_mode)
    lo, hi = padding[0::2], padding[1::2]
    if lo != hi:
        if name == MAX:
            return oracle.maxpool_torch(x, window, stride, padding, dilation, ceil_mode)
        return oracle.meanpool_torch(x, window, stride, padding, ceil_mode, count_include_pad)
    if name == MAX:
        return getattr(F, f"max_pool{R}d")(x, window, stride, lo, dilation, ceil_mode=ceil_mode)
    return getattr(F, f"avg_pool{R}d")(x, window, stride, lo, ceil_mode=ceil_mode,
                                       count_include_pad=count_include_pad)


def torch_both(name, x, g, **attrs):
    tx = torch.from_numpy(np.array(x, dtype=np.float64)).requires_grad_()
    ty = torch_pool(name, tx, **attrs)
    ty.backward(torch.from_numpy(np.array(g, dtype=np.float64)))
    return ty.detach().numpy(), tx.grad.numpy()


def out_shape(name, x_shape, **attrs):
    if name in (AMAX, AMEAN):
        return x_shape[:2] + tuple(attrs["size"])
    spec = pool_spec(name, x_shape, "float64", attrs["window"], attrs["stride"], attrs["padding"],
                     attrs.get("dilation"), attrs["ceil_mode"], attrs.get("p"))
    return spec.out_shape


# --- reference (CPU) --------------------------------------------------------------------------

@pytest.mark.parametrize("name,attrs", UNET + NEW + ODD + RANK1 + RANK3)
def test_reference_matches_torch(name, attrs):
    x = rnd(SHAPE[_rank(attrs)], 0)
    if name == LP:
        x = np.abs(x)
    g = rnd(out_shape(name, x.shape, **attrs), 1)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = call(ref, name, "forward", x, **attrs)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    assert y.shape == ty.shape and dx.shape == x.shape
    assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12


def test_ceil_mode_sizes_follow_torch():
    # every window/stride/padding/dilation up to 3 on sides 1..12: the output size of ceil and
    # floor mode is torch's, and a configuration is refused exactly when torch has no output or a
    # window of padding only (torch reads out of bounds there)
    x = torch.zeros(1, 1, 12, 1)
    for n in range(1, 13):
        for k in (1, 2, 3):
            for s in (1, 2, 3):
                for d in (1, 2, 3):
                    for p in range(0, k // 2 + 1):
                        for ceil in (False, True):
                            try:
                                want = F.max_pool2d(x[:, :, :n], (k, 1), (s, 1), (p, 0), (d, 1), ceil_mode=ceil).shape[2]
                            except RuntimeError:
                                want = None
                            try:
                                got = pool_axis(n, k, s, p, p, d, ceil).out
                            except ShapeError:
                                got = None
                            if got is None and want is not None:       # refused: only padding in a window
                                starts = np.arange(want) * s - p
                                assert any(all(not 0 <= i + a * d < n for a in range(k)) for i in starts)
                                continue
                            assert got == want, (n, k, s, d, p, ceil)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reference_keeps_dtype(dtype):
    x = rnd((1, 2, 5, 5), 0).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    for name, attrs in UNET + NEW[:2] + [NEW[9], NEW[13]]:
        y = call(ref, name, "forward", x, **attrs)
        dx, = call(ref, name, "backward", np.ones(y.shape, x.dtype), y, x, **attrs)
        assert y.dtype == x.dtype and dx.dtype == x.dtype


def test_reference_max_ties_first_in_scan_order():
    # overlapping 3x3 windows over a constant image: every window sends its gradient
    # to its first real pixel (row-major scan), exactly as torch
    x = np.ones((1, 1, 5, 6))
    attrs = _max((3, 3), (1, 1), (1, 1, 1, 1))[1]
    g = np.arange(30, dtype=np.float64).reshape(1, 1, 5, 6)
    _, tdx = torch_both(MAX, x, g, **attrs)
    dx, = ref.maxpool_backward(g, None, x, **attrs)
    np.testing.assert_array_equal(dx, tdx)


@pytest.mark.parametrize("window,shape", [((2, 2), (2, 3, 8, 6)), ((2, 2), (1, 2, 7, 5)), ((3, 2), (2, 1, 9, 7)),
                                          ((1, 3), (1, 2, 4, 9)), ((3,), (2, 3, 10)), ((2, 1, 2), (1, 2, 5, 3, 4))])
@pytest.mark.parametrize("values", ["ties", "nonfinite"])
def test_reference_tiled_windows_take_their_own_path_and_agree(monkeypatch, window, shape, values):
    """Windows that tile the input (stride = window, no padding, and inputs
    whose last rows/columns no window reaches) take the strided-taps path,
    forward and backward: the same results, bits included, as the general
    separable path, and torch's, with ties, NaN and infinities."""
    rng = np.random.default_rng(7)
    pool_values = (-1.0, 0.0, 1.0, 2.0) if values == "ties" else (np.nan, np.inf, -np.inf, 0.5, -2.0, 3.0)
    x = rng.choice(pool_values, shape).astype(np.float32)
    attrs = _max(window, window)[1]
    y = ref.maxpool_forward(x, **attrs)
    g = rnd(y.shape, 3).astype(np.float32)
    dx, = ref.maxpool_backward(g, y, x, **attrs)
    ty, tdx = torch_both(MAX, x.astype(np.float64), g.astype(np.float64), **attrs)
    np.testing.assert_array_equal(y, ty.astype(np.float32))
    np.testing.assert_array_equal(dx, tdx.astype(np.float32))     # (with NaN maxima: the general path)
    monkeypatch.setattr(ref, "_tile", lambda axis: 0)                 # every window the general way
    np.testing.assert_array_equal(ref.maxpool_forward(x, **attrs), y)
    np.testing.assert_array_equal(ref.maxpool_backward(g, y, x, **attrs)[0], dx)


@pytest.mark.parametrize("name,attrs", [_max((4, 1), (4, 1)), _max((2, 2), (1, 1), (1, 1, 1, 1), (2, 1)),
                                        (AMAX, dict(size=(1, 1))), (AMAX, dict(size=(2, 3))),
                                        _max((2, 2, 2), (1, 1, 2)), (AMAX, dict(size=(1, 2, 1))),
                                        _max((8,), (3,), (0, 0), (2,)), (AMAX, dict(size=(3,)))])
def test_reference_last_nan_takes_the_gradient(name, attrs):
    # torch's scan takes a value that is greater or NaN: of several NaN in a window the last one wins
    x = np.array([[[[np.nan, 1.0, np.nan, 2.0], [0.0, np.nan, 3.0, np.nan], [np.nan] * 4, [1.0, 2.0, 3.0, 4.0]]]])
    if _rank(attrs) == 3:
        x = x.reshape(1, 1, 2, 2, 4)
    elif _rank(attrs) == 1:
        x = x.reshape(1, 1, 16)
    g = rnd(out_shape(name, x.shape, **attrs), 2)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = call(ref, name, "forward", x, **attrs)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ty))
    np.testing.assert_array_equal(dx, tdx)


def test_reference_all_minus_inf_window_goes_to_first_real_pixel():
    x = np.full((1, 1, 3, 3), -np.inf)
    g = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    attrs = _max((3, 3), (1, 1), (1, 1, 1, 1))[1]
    ty, tdx = torch_both(MAX, x, g, **attrs)
    y = ref.maxpool_forward(x, **attrs)
    assert np.all(y == -np.inf)
    np.testing.assert_array_equal(ref.maxpool_backward(g, y, x, **attrs)[0], tdx)


#: long sums: (name, attrs, input shape, positive values); the sums a 16-bit accumulation gets wrong
LONG_SUMS = [
    (MEAN, _mean((1, 64), (1, 1))[1], (1, 1, 2, 96)),                 # 64-term forward sums, 64 windows per pixel
    (AMEAN, dict(size=(2, 1)), (1, 1, 2, 256)),
    (AMAX, dict(size=(1, 300)), (1, 1, 1, 1)),                        # 300 windows route to one pixel
    (MAX, _max((1, 40), (1, 1))[1], (1, 1, 1, 79)),                   # the 40 windows over the middle pixel route there
    (LP, _lp(2.0, (1, 64), (1, 1))[1], (1, 1, 2, 96)),                # 64-term sums of squares
    (MEAN, _mean((1, 1, 64), (1, 1, 1))[1], (1, 1, 1, 2, 80)),        # and along a volume's last axis
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,attrs,shape", LONG_SUMS)
def test_reference_16bit_sums_round_once(name, attrs, shape, dtype):
    # the reference in float16/bfloat16 vs the float64 reference on the same values: one rounding
    # of the result (at most the unit roundoff u, relative) plus float32 noise. Positive values and
    # gradients make a 16-bit running sum lose several units.
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    u = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    rng = np.random.default_rng(3)
    x = rng.uniform(0.25, 0.35, shape).astype(np_dtype)
    if name == MAX:
        x[..., shape[-1] // 2] = 1                                  # the maximum of every window
    y = call(ref, name, "forward", x, **attrs)
    g = rng.uniform(0.25, 0.35, y.shape).astype(np_dtype)
    y64 = call(ref, name, "forward", x.astype(np.float64), **attrs)
    dx64, = call(ref, name, "backward", g.astype(np.float64), y64, x.astype(np.float64), **attrs)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    for got, want in ((y, y64), (dx, dx64)):
        err = np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-30)
        assert err.max() <= u * (1 + 1e-3) + 1e-5, (name, dtype, err.max() / u)


@pytest.mark.parametrize("name,attrs", UNET[:1] + [NEW[0], NEW[9], NEW[13], _lp(2.0, (2, 2), (2, 2))])
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_reference_empty(name, attrs, shape):
    x = np.zeros(shape)
    y = call(ref, name, "forward", x, **attrs)
    assert y.shape == out_shape(name, shape, **attrs)
    dx, = call(ref, name, "backward", np.zeros(y.shape), y, x, **attrs)
    assert dx.shape == shape


@pytest.mark.parametrize("attrs,match", [
    (dict(window=(2, 2), stride=(2, 2), padding=(2, 0, 0, 0)), r"padding \(2, 0, 0, 0\) has \(2, 0\) along the height, "
                                                               r"more than half.*at most 1 \(torch's rule\)"),
    (dict(window=(3, 3), stride=(1, 1), padding=(0, 0, 0, 2)), "more than half"),
    (dict(window=(5, 2), stride=(1, 1), padding=(0, 0, 0, 0)), "larger than the padded input"),
    (dict(window=(0, 2), stride=(1, 1), padding=(0, 0, 0, 0)), "window"),
    (dict(window=(2, 2), stride=(1, 0), padding=(0, 0, 0, 0)), "stride"),
    (dict(window=(2, 2), stride=(1, 1), padding=(0, 0, 0)), r"padding must be 4 non-negative ints \(lo, hi\) per"),
    (dict(window=(2, 2), stride=(1,), padding=(0, 0, 0, 0)), r"stride must be 2 positive ints"),
    (dict(window=(2, 2), stride=(1, 1), padding=(0, 0, 0, 0), dilation=(0, 1)), "dilation"),
    (dict(window=(2, 2), stride=(1, 1), padding=(1, 1, 0, 0), dilation=(3, 1)), "reads only padding"),
    (dict(window=(2,), stride=(1,), padding=(0, 0)), r"`(maxpool|meanpool)`: the window \(2,\) has 1 entries, so it pools "
                                                     r"an input \(N, C, L\) of 3 dims, but the input has shape "
                                                     r"\(1, 1, 2, 3\) \(4 dims\); give 2 entries"),
    (dict(window=(2, 2, 2, 2), stride=(1,) * 4, padding=(0,) * 8), "1, 2 or 3 entries"),
])
def test_reference_errors(attrs, match):
    with pytest.raises(ShapeError, match=match):
        ref.maxpool_forward(np.zeros((1, 1, 2, 3)), **attrs)
    if "dilation" not in attrs:
        with pytest.raises(ShapeError, match=match):
            ref.meanpool_forward(np.zeros((1, 1, 2, 3)), **attrs)


@pytest.mark.parametrize("call_op,match", [
    (lambda ops, x: ops.maxpool2d(x, 2, padding=(2, 0, 0, 0)), "more than half"),
    (lambda ops, x: ops.maxpool2d(x, 5, stride=1), "larger than the padded input"),
    (lambda ops, x: ops.maxpool2d(x, (2, 1), padding=(1, 1, 0, 0), dilation=(3, 1)), "reads only padding"),
    (lambda ops, x: ops.meanpool2d(x, 2, stride=(1, 0)), "stride"),
    (lambda ops, x: ops.adaptive_maxpool2d(x, (0, 2)), "size"),
])
def test_ops_check_the_spec_before_dispatch(monkeypatch, call_op, match):
    """ops build the family's spec at the API edge: bad geometry never reaches a device."""
    import importlib
    import triflux as tf
    from triflux import ops
    for module in (ops, importlib.import_module("triflux.spatial")):
        if hasattr(module, "apply"):
            monkeypatch.setattr(module, "apply", lambda *a, **k: pytest.fail("dispatched a call the spec refuses"))
    with pytest.raises(ShapeError, match=match):
        call_op(ops, tf.tensor(np.zeros((1, 1, 2, 3), np.float32)))


def test_reference_errors_rank_and_size():
    with pytest.raises(ShapeError, match=r"pools an input \(N, C, H, W\) of 4 dims, but the input has shape \(3, 3\)"):
        ref.maxpool_forward(np.zeros((3, 3)), (2, 2), (2, 2), (0, 0, 0, 0))
    with pytest.raises(ShapeError, match="size"):
        ref.adaptive_maxpool_forward(np.zeros((1, 1, 3, 3)), (0, 2))
    with pytest.raises(ShapeError, match="positive input"):
        ref.adaptive_meanpool_forward(np.zeros((1, 1, 0, 3)), (1, 1))
    with pytest.raises(ShapeError, match=r"`adaptive_maxpool`: the output size \(2, 2, 2\) has 3 entries.*\(2, 3, 4, 4\)"):
        ref.adaptive_maxpool_forward(np.zeros((2, 3, 4, 4)), (2, 2, 2))


def test_adaptive_output_larger_than_the_input_as_torch():
    # torch allows any output size (windows repeat input positions), 1-d to 3-d; so does triflux
    x = rnd((1, 2, 2, 3, 1), 4)
    g = rnd((1, 2, 5, 7, 3), 5)
    for name in (AMAX, AMEAN):
        ty, tdx = torch_both(name, x, g, size=(5, 7, 3))
        y = ref.adaptive_maxpool_forward(x, (5, 7, 3)) if name == AMAX else ref.adaptive_meanpool_forward(x, (5, 7, 3))
        dx, = call(ref, name, "backward", g, y, x, size=(5, 7, 3))
        assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12


def test_2d_spec_names_stay():
    # the 2-D entry points keep working (layers and old code call them) and build the generic spec
    spec = pool2d_spec("maxpool2d", (1, 1, 6, 5), "float32", (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False)
    assert spec is pool_spec("maxpool", (1, 1, 6, 5), "float32", (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False)
    assert spec.rank == 2 and spec.out_shape == (1, 1, 3, 2)
    from triflux.specs.pool import adaptive_pool2d_spec, adaptive_pool_spec
    assert adaptive_pool2d_spec("adaptive_meanpool2d", (1, 1, 6, 5), "float32", (2, 3)) is \
        adaptive_pool_spec("adaptive_meanpool", (1, 1, 6, 5), "float32", (2, 3))


# --- lpnormpool ---------------------------------------------------------------------------------

#: PyTorch's LPPool1d/2d/3d module samples (common_modules): (p, window, stride), input shape
LP_SAMPLES = [(1.5, 2, None, (1, 3, 7)), (2, 2, 3, (1, 3, 7)), (2, 2, 2, (1, 3, 7, 7)), (1.5, 2, None, (1, 3, 7, 7)),
              (2, 2, 2, (1, 3, 7, 7, 7)), (1.5, 2, None, (1, 3, 7, 7, 7))]


def _lp_sample(p, k, s, shape):
    R = len(shape) - 2
    return _lp(float(p), (k,) * R, (k if s is None else s,) * R)


@pytest.mark.parametrize("p,k,s,shape", LP_SAMPLES)
def test_reference_lp_matches_torch_module_samples(p, k, s, shape):
    # make_tensor's values lie in [-9, 9]: x^1.5 of a negative value is NaN in torch, and here
    x = np.random.default_rng(1).uniform(-9, 9, shape)
    name, attrs = _lp_sample(p, k, s, shape)
    g = rnd(out_shape(name, x.shape, **attrs), 2)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = ref.lpnormpool_forward(x, **attrs)
    dx, = ref.lpnormpool_backward(g, y, x, **attrs)
    if p == 1.5:
        assert np.isnan(y).any()
    assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12


@pytest.mark.parametrize("attrs", [_lp(1.0, (3, 3), (2, 2), ceil_mode=True)[1], _lp(3.0, (2,), (2,))[1],
                                   _lp(2.0, (2, 2, 2), (2, 2, 2), (1, 0, 0, 1, 1, 1), (1, 2, 1))[1]])
def test_reference_lp_signs_and_zero_sums_follow_torch(attrs):
    # integers: odd p keeps signs (a negative sum gives NaN, except p = 1, the signed sum); a
    # window of zeros (or one whose sum cancels exactly) passes gradient 0, as torch's
    # sign(u) * relu(|u|) does, where NNlib's x^(p-1) y^(1-p) would give 0 * inf = NaN
    shape = {1: (2, 3, 8), 2: (2, 3, 7, 6), 3: (1, 2, 4, 5, 4)}[len(attrs["window"])]
    x = np.random.default_rng(2).integers(-2, 3, shape).astype(np.float64)
    x[0, 0] = 0.0
    g = rnd(out_shape(LP, x.shape, **attrs), 3)
    ty, tdx = torch_both(LP, x, g, **attrs)
    y = ref.lpnormpool_forward(x, **attrs)
    dx, = ref.lpnormpool_backward(g, y, x, **attrs)
    assert np.all(dx[0, 0] == 0) and np.all(y[0, 0] == 0)
    np.testing.assert_allclose(y, ty, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(dx, tdx, rtol=1e-12, atol=1e-14, equal_nan=True)


def test_reference_lp_ceil_mode_scales_partial_windows_as_torch():
    # torch's lp_pool is avg_pool(x^p) * prod(k): a ceil-mode window with 2 of its 3 taps inside
    # the input is scaled by 3/2 (NNlib, which has no ceil_mode, would sum the 2 taps)
    x = np.array([[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]])
    y = ref.lpnormpool_forward(x, 1.0, (3,), (2,), (0, 0), ceil_mode=True)
    np.testing.assert_allclose(y, [[[6.0, 12.0, 16.5]]])
    np.testing.assert_allclose(y, F.lp_pool1d(torch.from_numpy(x), 1.0, 3, 2, ceil_mode=True).numpy())


@pytest.mark.parametrize("R", [1, 2, 3])
def test_reference_lp_inf_is_max_of_abs(R):
    x = rnd(SHAPE[R], 6)
    x.flat[3] = np.nan
    name, attrs = _lp(float("inf"), (2,) * R, (2,) * R)
    g = rnd(out_shape(name, x.shape, **attrs), 7)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = ref.lpnormpool_forward(x, **attrs)
    np.testing.assert_array_equal(y, ref.maxpool_forward(np.abs(x), **{k: v for k, v in attrs.items() if k != "p"}))
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(ref.lpnormpool_backward(g, y, x, **attrs)[0], tdx)   # sign(NaN) = 0, as torch


@pytest.mark.parametrize("p", [0, -1.0, float("nan"), "2"])
def test_lp_p_must_be_positive(p):
    with pytest.raises(ArgumentError, match="p must be a positive number"):
        ref.lpnormpool_forward(np.zeros((1, 1, 4)), p, (2,), (2,), (0, 0))
    with pytest.raises(ArgumentError, match="takes no p"):
        pool_spec("maxpool", (1, 1, 4), "float32", (2,), (2,), (0, 0), p=2.0)


# --- kernels ----------------------------------------------------------------------------------

def _tensor(a, dtype):
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(getattr(torch, dtype)).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").double().numpy()


def _kernel_vs_torch(name, attrs, x, g, dtype, xt=None, gt=None):
    xt = _tensor(x, dtype) if xt is None else xt
    gt = _tensor(g, dtype) if gt is None else gt
    x, g = _np(xt), _np(gt)                         # the values the kernel sees
    ty, tdx = torch_both(name, x, g, **attrs)
    y = call(kp, name, "forward", xt, **attrs)
    dx, = call(kp, name, "backward", gt, y, xt, **attrs)
    assert tuple(y.shape) == ty.shape and y.dtype == xt.dtype and y.is_contiguous()
    assert tuple(dx.shape) == x.shape and dx.dtype == xt.dtype and dx.is_contiguous()
    assert rel(_np(y), ty) <= TOL[dtype], (name, attrs, dtype, "forward")
    assert rel(_np(dx), tdx) <= TOL[dtype], (name, attrs, dtype, "backward")
    return y, dx


@needs_kernels
@pytest.mark.parametrize("name,attrs,dtype",
                         [(n, a, d) for n, a in UNET for d in ("float32", "float64", "float16", "bfloat16")]
                         + [(n, a, "float32") for n, a in NEW + ODD + RANK1 + RANK3])
def test_kernel_matches_torch(name, attrs, dtype):
    x = rnd(SHAPE[_rank(attrs)], 0)
    if name == LP:
        x = np.abs(x)
    g = rnd(out_shape(name, x.shape, **attrs), 1)
    _kernel_vs_torch(name, attrs, x, g, dtype)


@needs_kernels
@pytest.mark.parametrize("p,k,s,shape", LP_SAMPLES[::2] + LP_SAMPLES[1::4])
def test_kernel_lp_matches_torch_module_samples(p, k, s, shape):
    x = np.random.default_rng(1).uniform(-9, 9, shape)
    name, attrs = _lp_sample(p, k, s, shape)
    g = rnd(out_shape(name, x.shape, **attrs), 2)
    _kernel_vs_torch(name, attrs, x, g, "float32")


@needs_kernels
@pytest.mark.parametrize("attrs", [_lp(1.0, (3, 3), (2, 2), ceil_mode=True)[1], _lp(3.0, (2,), (2,))[1],
                                   _lp(float("inf"), (2, 2, 1), (1, 2, 1), (1, 1, 0, 0, 0, 0))[1],
                                   _lp(float("inf"), (2, 2), (2, 2))[1]])
def test_kernel_lp_signs_and_zero_sums(attrs):
    shape = {1: (2, 3, 8), 2: (2, 3, 7, 6), 3: (1, 2, 4, 5, 4)}[len(attrs["window"])]
    x = np.random.default_rng(2).integers(-2, 3, shape).astype(np.float64)
    x[0, 0] = 0.0
    x[-1, -1, ..., -1] = np.nan
    g = rnd(out_shape(LP, x.shape, **attrs), 3)
    y, dx = _kernel_vs_torch(LP, attrs, x, g, "float32")
    assert np.all(_np(dx)[0, 0] == 0)


@needs_kernels
@pytest.mark.parametrize("name,attrs", UNET[:2] + [NEW[0], NEW[4], NEW[9], NEW[13], ODD[1]])
def test_kernel_reads_views_in_place(name, attrs):
    x = rnd((2, 3, 7, 9), 2)
    g = rnd(out_shape(name, x.shape, **attrs), 3)
    # channels-last input, a gradient that is every other column of a wider buffer
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float32").permute(0, 3, 1, 2)
    wide = _tensor(np.repeat(g, 2, axis=3), "float32")
    gt = wide[..., ::2]
    assert not xt.is_contiguous() and not gt.is_contiguous()
    _kernel_vs_torch(name, attrs, x, g, "float32", xt=xt, gt=gt)


@needs_kernels
@pytest.mark.parametrize("name,attrs", [_max((3, 3), (1, 1), (1, 1, 1, 1)), _max((2, 2), (2, 2)),
                                        _max((3, 2), (2, 1), (0, 1, 1, 1)), _max((3, 2), (2, 1), (1, 1, 1, 1), (1, 2), True),
                                        _max((2, 2), (3, 2), (1, 0, 1, 1), (2, 1), True),
                                        (AMAX, dict(size=(3, 4))), (AMAX, dict(size=(9, 9)))])
def test_kernel_max_ties_and_nan(name, attrs):
    rng = np.random.default_rng(4)
    x = rng.choice([-1.0, 0.0, 1.0, np.nan], size=(2, 2, 7, 6), p=[0.3, 0.3, 0.3, 0.1])
    x[0, 0] = 1.0                                  # one image entirely tied
    x[1, 1, :2, :2] = np.nan                       # windows with several NaN
    g = rng.integers(-4, 5, out_shape(name, x.shape, **attrs)) * 1.0
    y, dx = _kernel_vs_torch(name, attrs, x, g, "float32")
    rdx, = call(ref, name, "backward", g, _np(y), x, **attrs)
    np.testing.assert_array_equal(_np(dx), rdx)     # integer gradients: exact


@needs_kernels
@pytest.mark.parametrize("name,attrs,launches", [(*_max((2, 2), (2, 2)), 1), (*_max((2, 2, 2), (2, 2, 2)), 1),
                                                 (*_lp(float("inf"), (2,), (3,)), 1),
                                                 (*_max((3, 3), (2, 2), (1, 1, 1, 1)), 2),
                                                 (*_max((2, 2), (2, 2), dilation=(2, 1)), 2)])
def test_max_pool_backward_of_windows_apart_is_one_launch(name, attrs, launches, monkeypatch):
    """Windows that share no input element (stride at least the dilated window):
    the backward recomputes each window's argmax itself, one launch and no
    scratch; overlapping windows take the forward's argmax first (two)."""
    from triflux.triton_kernels import launch
    x = rnd(SHAPE[_rank(attrs)], 5)
    g = rnd(out_shape(name, x.shape, **attrs), 6)
    xt = _tensor(x, "float32")
    y = call(kp, name, "forward", xt, **attrs)
    kernels, real = [], launch.launch
    monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (kernels.append(k), real(k, grid, *a, **m))[1])
    dx, = call(kp, name, "backward", _tensor(g, "float32"), y, xt, **attrs)
    assert len(kernels) == launches and kernels[-1] is kp._pool_bwd_kernel, kernels
    x, g = _np(xt), _np(_tensor(g, "float32"))         # the values the kernel sees
    np.testing.assert_allclose(_np(dx), call(ref, name, "backward", g, _np(y), x, **attrs)[0], rtol=1e-6)


@needs_kernels
def test_kernel_all_minus_inf():
    x = np.full((1, 1, 3, 3), -np.inf)
    g = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    attrs = _max((3, 3), (1, 1), (1, 1, 1, 1))[1]
    xt = _tensor(x, "float32")
    y = kp.maxpool_forward(xt, **attrs)
    dx, = kp.maxpool_backward(_tensor(g, "float32"), y, xt, **attrs)
    np.testing.assert_array_equal(_np(dx), ref.maxpool_backward(g, _np(y), x, **attrs)[0])


@needs_kernels
@pytest.mark.parametrize("name,attrs", UNET[:1] + [NEW[0], NEW[9], NEW[13], _lp(2.0, (2, 2), (2, 2))])
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_kernel_empty(name, attrs, shape):
    xt = _tensor(np.zeros(shape), "float32")
    y = call(kp, name, "forward", xt, **attrs)
    assert tuple(y.shape) == out_shape(name, shape, **attrs)
    dx, = call(kp, name, "backward", y, y, xt, **attrs)
    assert tuple(dx.shape) == shape


@needs_kernels
def test_kernel_errors():
    xt = _tensor(np.zeros((1, 1, 3, 3)), "float32")
    with pytest.raises(ShapeError, match="more than half"):
        kp.maxpool_forward(xt, (2, 2), (2, 2), (0, 0, 2, 0))
    with pytest.raises(ShapeError, match="reads only padding"):
        kp.maxpool_forward(xt, (2, 1), (1, 1), (1, 1, 0, 0), (4, 1))
    with pytest.raises(ShapeError, match=r"pools an input \(N, C, H, W\) of 4 dims"):
        kp.adaptive_maxpool_forward(xt[0], (2, 2))
    with pytest.raises(ShapeError, match="padding must be 6"):
        kp.lpnormpool_forward(xt[None], 2.0, (2, 2, 2), (2, 2, 2), (0, 0, 0, 0))
    with pytest.raises(ShapeError, match="gradient"):
        kp.meanpool_backward(xt, None, xt, (2, 2), (2, 2), (0, 0, 0, 0))
    with pytest.raises(ShapeError, match="gradient"):
        kp.adaptive_maxpool_backward(xt, None, xt, (2, 2))
    with pytest.raises(ShapeError, match="gradient"):
        kp.lpnormpool_backward(xt, None, xt, 2.0, (2, 2), (2, 2), (0, 0, 0, 0))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    x = rnd((2, 3, 7, 9), 2)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float16").permute(0, 3, 1, 2)
    assert not xt.is_contiguous()

    def run():
        for name, attrs in UNET + [NEW[0], NEW[4], NEW[9], NEW[13], _lp(1.5, (3, 2), (2, 1), (1, 0, 1, 1), (1, 2))]:
            y = call(kp, name, "forward", xt, **attrs)
            call(kp, name, "backward", y, y, xt, **attrs)

    assert_torch_only_moves_memory(run, "the pool kernels")
