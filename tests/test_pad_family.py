"""pad: the cases the generic property suite does not pin down.

Every mode's index rule at and around its limits, position by position,
against NumPy's np.pad (reflect, symmetric, edge, wrap, constant) and
torch's own multi-axis F.pad (where torch has the mode and rank), on axes of
1 to 6 elements; negative pads (crops) with torch's semantics, every pair
from -5 to 5 on axes of 1 to 4 and PyTorch's OpInfo samples; size-1 and empty axes; constant fills of NaN, +-inf, -0.0
and a float64 value that float32 cannot hold, in every dtype; 1-d to 7-d
inputs (a 7-d call with every axis padded goes through the kernel in
passes); non-contiguous and broadcast (stride 0) inputs and gradients; the
backward as the adjoint of the forward, deterministic, its 16-bit sums
rounded once; the errors (length, sign, type, mode, value, every mode's
limit) raised by the spec before any work, on both sides; torch doing
nothing but allocate.
"""
import ml_dtypes
import numpy as np
import pytest

from helpers import rnd
from triflux import backend
from triflux.errors import ArgumentError, ShapeError
from triflux.reference import pad as ref
from triflux.specs.pad import MODES, pad_limit, pad_spec
from triflux.testing.pad import pad_torch

torch = pytest.importorskip("torch")
F = torch.nn.functional

GPU = backend.functional("CUDA")
needs_kernels = pytest.mark.skipif(
    not GPU, reason="no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)")

if GPU:
    from torch_ops import assert_torch_only_moves_memory
    from triflux.triton_kernels import launch
    from triflux.triton_kernels import pad as ker
    DEVICE = "cpu" if launch.INTERPRET else "cuda"

#: NumPy's name of each mode
NUMPY_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "symmetric": "symmetric",
              "circular": "wrap"}
DTYPES = ("float32", "float64", "float16", "bfloat16")


def np_dtype(dtype):
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def numpy_pad(x, padding, mode, value=0.0):
    pairs = [(padding[2 * k], padding[2 * k + 1]) for k in range(x.ndim)]
    kw = {"constant_values": value} if mode == "constant" else {}
    return np.pad(x, pairs, mode=NUMPY_MODE[mode], **kw)


def limits(mode, n):
    """Pads to try on an axis of n: 0, 1, the limit and one past it (None: the mode has none)."""
    lim = pad_limit(mode, n)
    top = 4 if lim is None else lim
    return sorted({p for p in (0, 1, top - 1, top) if 0 <= p <= top})


# --- the reference ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_reference_index_rules_match_numpy_at_every_limit(mode):
    # one axis of n = 1..6 elements, every pair of pads from {0, 1, limit - 1, limit}: distinct powers
    # of two, so y names what was read; the gradient of distinct powers of two names what was summed
    for n in range(1, 7):
        x = 2.0 ** np.arange(n)
        for lo in limits(mode, n):
            for hi in limits(mode, n):
                y = ref.pad_forward(x, padding=(lo, hi), mode=mode, value=-1.0 if mode == "constant" else 0.0)
                want = numpy_pad(x, (lo, hi), mode, -1.0)
                np.testing.assert_array_equal(y, want, err_msg=f"{mode} n={n} ({lo}, {hi})")
                g = 2.0 ** np.arange(y.size)
                tx = torch.from_numpy(x).requires_grad_()
                pad_torch(tx, (lo, hi), mode, -1.0 if mode == "constant" else 0.0).backward(torch.from_numpy(g))
                dx, = ref.pad_backward(g, y, x, padding=(lo, hi), mode=mode,
                                       value=-1.0 if mode == "constant" else 0.0)
                np.testing.assert_array_equal(dx, tx.grad.numpy(), err_msg=f"{mode} backward n={n} ({lo}, {hi})")


def _torch_fpad(x, padding, mode, value):
    """torch's own F.pad on the trailing axes that ``padding`` pads (leading pairs must be zero)."""
    pairs = [(padding[2 * k], padding[2 * k + 1]) for k in range(x.dim())]
    first = next(k for k, p in enumerate(pairs) if p != (0, 0))
    flat = [p for pair in reversed(pairs[first:]) for p in pair]
    return F.pad(x, flat, mode=mode, **({"value": value} if mode == "constant" else {}))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,padding", [
    ((2, 3, 5), (0, 0, 0, 0, 4, 4)),                       # 1-d torch pad of a (N, C, W) input
    ((2, 3, 4, 5), (0, 0, 0, 0, 3, 1, 2, 4)),              # 2-d
    ((1, 2, 3, 4, 5), (0, 0, 0, 0, 2, 2, 3, 0, 1, 4)),     # 3-d
    ((3, 4, 5), (0, 0, 3, 2, 4, 1)),                       # 2-d on an unbatched (C, H, W)
])
def test_reference_matches_torch_fpad(mode, shape, padding):
    # torch's multi-axis kernels (not the oracle's axis-by-axis build), pads at the reflect limit
    lims = [pad_limit("reflect", n) for n in shape]
    padding = tuple(min(p, lims[i // 2]) for i, p in enumerate(padding)) if mode == "reflect" else padding
    value = 2.5 if mode == "constant" else 0.0
    x = rnd(shape, 0)
    tx = torch.from_numpy(x).requires_grad_()
    ty = _torch_fpad(tx, padding, mode, value)
    g = rnd(tuple(ty.shape), 1)
    ty.backward(torch.from_numpy(g))
    y = ref.pad_forward(x, padding=padding, mode=mode, value=value)
    dx, = ref.pad_backward(g, y, x, padding=padding, mode=mode, value=value)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-13, atol=1e-13)


def _torch_negative(x, lo, hi, mode):
    """torch's result (and its gradient function) for pads (lo, hi), negative ones too, of
    the 1-d ``x``; symmetric, which torch lacks: np.pad's positive parts, then the crop."""
    n = x.shape[-1]
    if mode == "symmetric":
        if max(lo, hi) > n or n + lo + hi < 0:
            raise ValueError("outside the limits")
        idx = np.pad(np.arange(n), (max(lo, 0), max(hi, 0)), mode="symmetric")
        return x[..., torch.from_numpy(idx[max(-lo, 0): idx.size - max(-hi, 0)])]
    return F.pad(x.reshape(1, 1, n), (lo, hi), mode=mode).reshape(-1)


@pytest.mark.parametrize("mode", MODES)
def test_reference_negative_pads_match_torch(mode):
    # every (lo, hi) in [-5, 5]^2 on axes of 1 to 4 elements: where torch gives a non-empty result
    # and triflux accepts the pads, the same values and gradients; triflux refuses exactly the pads
    # torch refuses (and torch's circular reads memory it never wrote for some crops: refused here)
    for n in (1, 2, 3, 4):
        x = 2.0 ** np.arange(n)
        for lo in range(-5, 6):
            for hi in range(-5, 6):
                tx = torch.from_numpy(x).requires_grad_()
                try:
                    ty = _torch_negative(tx, lo, hi, mode)
                    torch_ok = ty.numel() > 0
                except (RuntimeError, ValueError):
                    torch_ok = False
                try:
                    y = ref.pad_forward(x, padding=(lo, hi), mode=mode)
                except ShapeError:
                    assert not torch_ok or mode == "circular" and -min(lo, 0) - min(hi, 0) > 0, \
                        f"{mode} n={n} ({lo}, {hi}): refused, torch pads"
                    continue
                if y.size == 0:
                    continue                                  # torch's reflect and replicate refuse these
                assert torch_ok, f"{mode} n={n} ({lo}, {hi}): accepted, torch refuses"
                g = 2.0 ** np.arange(y.size)
                ty.backward(torch.from_numpy(g))
                dx, = ref.pad_backward(g, y, x, padding=(lo, hi), mode=mode)
                np.testing.assert_array_equal(y, ty.detach().numpy(), err_msg=f"{mode} n={n} ({lo}, {hi})")
                np.testing.assert_array_equal(dx, tx.grad.numpy(), err_msg=f"{mode} backward n={n} ({lo}, {hi})")


#: PyTorch's OpInfo samples with negative pads (nn.functional.pad and its replicate_negative variant)
OPINFO_NEGATIVE = [(mode, (1, 3, 4, 4), (-1, 1, -2, 1)) for mode in ("constant", "reflect", "replicate", "circular")] \
    + [("constant", (5, 3), (-1, -2, 1, 1))] \
    + [("replicate", shape, pad) for shape, pad in [((5, 3, 4, 4), (-4, 5, 0, 0)), ((6, 2, 4, 4), (0, 0, 2, -4)),
                                                     ((5, 6, 4, 4), (5, -4, -4, 3)), ((4, 2, 5, 5), (-2, -1, 4, 6)),
                                                     ((2, 6, 5, 5), (8, -1, -1, -3)), ((8, 1, 5, 5), (-2, -1, -1, -3))]]


def _axis_order(shape, torch_pad):
    """torch's F.pad list (last axis first) as triflux's padding (every axis, in order)."""
    pairs = [(0, 0)] * len(shape)
    for j in range(len(torch_pad) // 2):
        pairs[len(shape) - 1 - j] = (torch_pad[2 * j], torch_pad[2 * j + 1])
    return tuple(p for pair in pairs for p in pair)


@pytest.mark.parametrize("mode,shape,torch_pad", OPINFO_NEGATIVE)
def test_reference_opinfo_negative_samples(mode, shape, torch_pad):
    x = rnd(shape, 5)
    tx = torch.from_numpy(x).requires_grad_()
    ty = F.pad(tx, torch_pad, mode=mode)
    g = rnd(tuple(ty.shape), 6)
    ty.backward(torch.from_numpy(g))
    padding = _axis_order(shape, torch_pad)
    y = ref.pad_forward(x, padding=padding, mode=mode)
    dx, = ref.pad_backward(g, y, x, padding=padding, mode=mode)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mode", MODES)
def test_reference_every_rank_and_the_adjoint(rank, mode):
    # every axis padded (up to its limit), any rank: np.pad's forward, and <pad(x), g> = <x, dx>
    rng = np.random.default_rng(rank)
    shape = tuple(int(s) for s in rng.integers(1, 5 if rank < 4 else 4, rank))
    padding = tuple(int(min(rng.integers(0, 4), 3 if pad_limit(mode, n) is None else pad_limit(mode, n)))
                    for n in shape for _ in range(2))
    x = rng.standard_normal(shape)
    y = ref.pad_forward(x, padding=padding, mode=mode)
    np.testing.assert_array_equal(y, numpy_pad(x, padding, mode))
    g = rng.standard_normal(y.shape)
    dx, = ref.pad_backward(g, y, x, padding=padding, mode=mode)
    assert dx.shape == x.shape and dx.flags.c_contiguous
    np.testing.assert_allclose(np.sum(y * g), np.sum(x * dx), rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_reference_size_one_and_empty_axes(mode):
    # an empty axis with pads of 0 is fine in every mode; only constant pads it; size 1 reflects nothing
    x = np.zeros((2, 0, 3))
    padding = (1, 0, 2 if mode == "constant" else 0, 1 if mode == "constant" else 0, 1, 1)
    if mode == "reflect":
        padding = (1, 0, 0, 0, 2, 2)
    y = ref.pad_forward(x, padding=padding, mode=mode, value=7.0 if mode == "constant" else 0.0)
    assert y.shape == tuple(n + padding[2 * k] + padding[2 * k + 1] for k, n in enumerate(x.shape))
    if mode == "constant":
        assert y.size and np.all(y == 7.0)                  # nothing of x, all fill
    dx, = ref.pad_backward(np.ones(y.shape), y, x, padding=padding, mode=mode)
    assert dx.shape == x.shape
    one = np.array([[3.0]])
    top = 2 if pad_limit(mode, 1) is None else pad_limit(mode, 1)    # reflect 0, symmetric and circular 1
    y = ref.pad_forward(one, padding=(top, top, 0, top), mode=mode)
    np.testing.assert_array_equal(y, numpy_pad(one, (top, top, 0, top), mode))
    dx, = ref.pad_backward(np.ones(y.shape), y, one, padding=(top, top, 0, top), mode=mode)
    assert dx[0, 0] == (1 if mode == "constant" else y.size)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -0.0, 0.1, -1e300])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_constant_fills(value, dtype):
    x = rnd((2, 3), 0).astype(np_dtype(dtype))
    y = ref.pad_forward(x, padding=(1, 0, 2, 1), mode="constant", value=value)
    assert y.dtype == x.dtype
    fill = np.array(value).astype(x.dtype)
    pad = np.ones(y.shape, bool)
    pad[1:, 2:5] = False
    got = y.astype(np.float64)
    np.testing.assert_array_equal(got[pad], np.full(pad.sum(), fill.astype(np.float64)))   # NaN == NaN here
    assert np.array_equal(np.signbit(got[pad]), np.signbit(np.full(pad.sum(), fill.astype(np.float64))))
    np.testing.assert_array_equal(got[1:, 2:5], x.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reference_16bit_sums_round_once(dtype):
    # replicate 12 positions into each edge: 13 positive terms summed in float32, rounded once
    u = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    rng = np.random.default_rng(5)
    x = rng.uniform(0.25, 0.35, (3, 2)).astype(np_dtype(dtype))
    y = ref.pad_forward(x, padding=(0, 0, 12, 12), mode="replicate")
    g = rng.uniform(0.25, 0.35, y.shape).astype(x.dtype)
    dx, = ref.pad_backward(g, y, x, padding=(0, 0, 12, 12), mode="replicate")
    dx64, = ref.pad_backward(g.astype(np.float64), y.astype(np.float64), x.astype(np.float64),
                             padding=(0, 0, 12, 12), mode="replicate")
    assert dx.dtype == x.dtype
    assert np.max(np.abs(dx.astype(np.float64) - dx64) / dx64) <= u * (1 + 1e-3) + 1e-5


# --- errors (the spec, before any work) -------------------------------------------------------

@pytest.mark.parametrize("shape,padding,mode,match", [
    ((2, 3), (1, 1), "constant", r"pad: padding has 2 entries, but x has 2 axes, so it needs 4 = 2 x 2"),
    ((5,), (1, 1, 1, 1), "reflect", r"needs 2 = 2 x 1"),
    ((2, 3), (1, -4, 0, 0), "constant", r"negative pads crop, but axis 0 .* \(1, -4\): that crops 4 of its 2 "
                                        r"elements; crop at most 2 in all"),
    ((2, 3), (0, 0, -2, -2), "circular", r"crops 4 of its 3 elements"),
    ((2, 3), (-3, 0, 0, 0), "reflect", r"crops 3 of its 2 elements and leaves -1"),
    ((2, 3), (0, 0, -1, 3), "circular", r"\(-1, 3\) \(cropped to 2 by the negative pad\): its limit is 2"),
    ((2, 3), (1, 1.5, 0, 0), "constant", r"must hold ints.*1\.5"),
    ((2, 3), 2, "constant", r"tuple of 4 ints"),
    ((), (), "constant", r"at least one axis.*0-d"),
    ((2, 3), (0, 0, 3, 0), "reflect", r"mode='reflect'.*axis 1 of x \(shape \(2, 3\)\) has size 3 and padding "
                                      r"\(lo, hi\) = \(3, 0\): its limit is 2; pad that axis by at most 2, or use "
                                      r"mode='symmetric'"),
    ((1, 4), (0, 1, 0, 0), "reflect", r"axis 0 .* size 1 .* \(0, 1\): its limit is 0"),
    ((2, 3), (2, 0, 0, 4), "symmetric", r"mode='symmetric'.*axis 1 .* size 3 .* \(0, 4\): its limit is 3.*"
                                        r"'replicate'"),
    ((4, 2), (0, 0, 3, 0), "circular", r"mode='circular'.*wraps around at most once.*axis 1 .* size 2 .* "
                                       r"its limit is 2"),
    ((3, 0), (0, 0, 1, 0), "replicate", r"mode='replicate'.*axis 1 .* is empty .* \(1, 0\).*mode='constant'"),
])
def test_errors_name_the_axis_the_limit_and_the_fix(shape, padding, mode, match):
    with pytest.raises(ShapeError, match=match):
        pad_spec(shape, "float32", padding, mode)
    with pytest.raises(ShapeError, match=match):
        ref.pad_forward(np.zeros(shape), padding=padding, mode=mode)


@pytest.mark.parametrize("mode,value,match", [
    ("zeros", 0.0, r"mode must be one of 'constant', 'reflect'"),
    ("reflect", 1.0, r"value applies to mode='constant' only.*'reflect'"),
    ("circular", float("nan"), r"value applies to mode='constant' only"),
    ("constant", "1", r"value must be a number"),
])
def test_errors_of_mode_and_value(mode, value, match):
    with pytest.raises(ArgumentError, match=match):
        ref.pad_forward(np.zeros((2, 3)), padding=(1, 1, 1, 1), mode=mode, value=value)


def test_limits_are_allowed():
    # every mode at its limit on every axis of sizes 1..4, and pads of 0 on empty axes
    for mode in MODES:
        for n in range(0, 5):
            lim = pad_limit(mode, n)
            p = 5 if lim is None else lim
            spec = pad_spec((n, 2), "float64", (p, p, 0, 0), mode)
            assert spec.out_shape == (n + 2 * p, 2) and spec.rank == 2 and spec.padded_axes == ((0,) if p else ())


# --- kernels ----------------------------------------------------------------------------------

def _tensor(a, dtype):
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(getattr(torch, dtype)).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").double().numpy()


def _check_kernel(x, padding, mode, value=0.0, dtype="float64", xt=None, gt=None, g=None):
    """Kernel forward and backward against the reference on the same (rounded) values: exact,
    but the backward of a 16-bit dtype (summed in float32 there, in float64 in the reference)."""
    xt = _tensor(x, dtype) if xt is None else xt
    x = _np(xt)
    y = ref.pad_forward(x, padding=padding, mode=mode, value=value)
    ky = ker.pad_forward(xt, padding=padding, mode=mode, value=value)
    assert tuple(ky.shape) == y.shape and ky.dtype == xt.dtype and ky.is_contiguous()
    want = y.astype(np_dtype(dtype)).astype(np.float64)         # the fill rounded to the dtype
    np.testing.assert_array_equal(_np(ky), want, err_msg=f"{mode} {padding} {dtype} forward")
    if g is None:
        g = np.arange(1.0, y.size + 1).reshape(y.shape) % 7 - 3   # small integers: exact sums
    gt = _tensor(g, dtype) if gt is None else gt
    dx, = ref.pad_backward(_np(gt), y, x, padding=padding, mode=mode, value=value)
    kdx, = ker.pad_backward(gt, ky, xt, padding=padding, mode=mode, value=value)
    assert tuple(kdx.shape) == x.shape and kdx.dtype == xt.dtype and kdx.is_contiguous()
    np.testing.assert_array_equal(_np(kdx), dx.astype(np_dtype(dtype)).astype(np.float64),
                                  err_msg=f"{mode} {padding} {dtype} backward")
    return ky, kdx


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_kernel_index_rules_at_every_limit(mode):
    # one axis of n = 1, 2, 3, 5 (then the same along axis 0 of a 2-d input), every pair of pads from
    # {0, 1, limit - 1, limit}: the kernels' own index and fold rules against the spec's tables
    for n in (1, 2, 3, 5):
        x = 2.0 ** np.arange(n)
        for lo in limits(mode, n):
            for hi in limits(mode, n):
                _check_kernel(x, (lo, hi), mode, value=-1.0 if mode == "constant" else 0.0)
        lim = pad_limit(mode, n)
        top = 3 if lim is None else lim
        _check_kernel(np.arange(2.0 * n).reshape(n, 2), (top, top, 0, 1 if pad_limit(mode, 2) != 0 else 0), mode)


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_kernel_negative_pads(mode):
    # crops on one axis, then on two axes of a 3-d input (and PyTorch's OpInfo samples below)
    for n, pads in ((1, (-1, 0, 1)), (4, (-4, -3, -1, 0, 2, 3))):
        x = 2.0 ** np.arange(n)
        for lo in pads:
            for hi in pads:
                if min(lo, hi) >= 0:
                    continue
                try:
                    pad_spec((n,), "float64", (lo, hi), mode)
                except ShapeError:
                    continue
                _check_kernel(x, (lo, hi), mode)
    x = rnd((3, 4, 5), 8)
    _check_kernel(x, (0, 0, -1, 2, 3, -2) if mode != "reflect" else (0, 0, -1, 2, 3, -2), mode, value=0.0)
    _check_kernel(x, (-1, -1, 0, -2, -4, 1), mode)


@needs_kernels
@pytest.mark.parametrize("mode,shape,torch_pad", OPINFO_NEGATIVE[:2] + OPINFO_NEGATIVE[4:7])
def test_kernel_opinfo_negative_samples(mode, shape, torch_pad):
    _check_kernel(rnd(shape, 5), _axis_order(shape, torch_pad), mode, dtype="float32")


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_kernel_every_rank(mode):
    # 1-d to 5-d with every axis padded, and a 7-d input with every axis padded (more axes than
    # the forward's 6: it pads in passes) and a permuted, sliced 7-d view (made dense first)
    rng = np.random.default_rng(3)
    for shape in [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2), (2, 2, 1, 3, 2), (2, 1, 2, 1, 2, 1, 2)]:
        padding = tuple(1 if pad_limit(mode, n) != 0 else 0 for n in shape for _ in range(2))
        _check_kernel(rng.standard_normal(shape), padding, mode)
    base = _tensor(rng.standard_normal((3, 2, 3, 2, 2, 3, 4)), "float32")
    view = base.permute(6, 0, 2, 1, 5, 3, 4)[::2, :, ::2]          # no two neighbours merge
    padding = (1, 0, 0, 1) + (1, 1) * 5 if mode != "reflect" else (1, 0, 0, 1, 0, 0) + (1, 1) * 4
    _check_kernel(None, padding, mode, dtype="float32", xt=view)


@needs_kernels
@pytest.mark.parametrize("mode", MODES)
def test_kernel_reads_views_in_place(mode):
    # permuted, sliced and broadcast (stride 0) inputs, non-contiguous gradients
    x = rnd((2, 3, 5, 4), 2)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float32").permute(0, 3, 1, 2)
    padding = (0, 0, 1, 2, 2, 2, 3, 0) if mode != "reflect" else (0, 0, 1, 2, 2, 2, 3, 0)
    shape = tuple(n + padding[2 * k] + padding[2 * k + 1] for k, n in enumerate(x.shape))
    g = np.round(rnd(shape, 3) * 4)                                     # integers: exact sums
    gt = _tensor(np.repeat(g, 2, axis=3), "float32")[..., ::2]
    assert not xt.is_contiguous() and not gt.is_contiguous()
    _check_kernel(None, padding, mode, dtype="float32", xt=xt, gt=gt)
    xt = _tensor(rnd((1, 4, 1), 4), "float32").expand(3, 4, 5)        # stride 0 along two axes
    _check_kernel(None, (1, 1, 2, 3, 2, 2), mode, dtype="float32", xt=xt)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -0.0, 0.1, 1e-310])
def test_kernel_constant_fills(dtype, value):
    # the fill reaches the kernel exactly (0.1 and a subnormal in float64 too), -0.0 keeps its sign
    x = rnd((2, 3, 4), 0)
    x[0, 1, 2] = np.nan
    ky, _ = _check_kernel(x, (1, 0, 0, 2, 3, 1), "constant", value=value, dtype=dtype)
    corner = _np(ky)[0, 0, 0]
    want = np.array(value).astype(np_dtype(dtype)).astype(np.float64)
    assert (np.isnan(corner) and np.isnan(want)) or (corner == want and np.signbit(corner) == np.signbit(want))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_every_dtype_and_deterministic(dtype):
    # every mode in every dtype on a 3-d input; 16-bit backward sums (a long replicate pad)
    # rounded once; two backward runs bit for bit the same
    rng = np.random.default_rng(7)
    x = rng.uniform(0.25, 0.35, (2, 3, 4))
    for mode in MODES:
        padding = (0, 1, 2, 2, 3, 3) if mode != "replicate" else (0, 1, 2, 2, 12, 12)
        xt = _tensor(x, dtype)
        y = ref.pad_forward(_np(xt), padding=padding, mode=mode)
        g = _tensor(rng.uniform(0.25, 0.35, y.shape), dtype)
        ky = ker.pad_forward(xt, padding=padding, mode=mode)
        np.testing.assert_array_equal(_np(ky), y)
        kdx, = ker.pad_backward(g, ky, xt, padding=padding, mode=mode)
        again, = ker.pad_backward(g, ky, xt, padding=padding, mode=mode)
        assert torch.equal(kdx, again)
        dx64, = ref.pad_backward(_np(g), y, _np(xt), padding=padding, mode=mode)
        # (up to 13 positive terms: 12 roundings of the float32 or float64 sum, then one to the dtype)
        bound = {"float64": 2.0 ** -48, "float32": 2.0 ** -20, "float16": 2.0 ** -11 + 1e-5,
                 "bfloat16": 2.0 ** -8 + 1e-5}[dtype]
        assert np.max(np.abs(_np(kdx) - dx64) / dx64) <= bound, (mode, dtype)


@needs_kernels
def test_kernel_empty_and_errors():
    for mode in MODES:
        xt = _tensor(np.zeros((2, 0, 3)), "float32")
        padding = (1, 1, 0, 0, 1, 0) if mode != "reflect" else (1, 0, 0, 0, 2, 2)
        y = ker.pad_forward(xt, padding=padding, mode=mode)
        assert tuple(y.shape) == (4 if mode != "reflect" else 3, 0, 4 if mode != "reflect" else 7)
        dx, = ker.pad_backward(y, y, xt, padding=padding, mode=mode)
        assert tuple(dx.shape) == (2, 0, 3)
    xt = _tensor(np.zeros((0, 2)), "float32")
    y = ker.pad_forward(xt, padding=(1, 2, 1, 0), mode="constant", value=-4.0)
    np.testing.assert_array_equal(_np(y), np.full((3, 3), -4.0))
    xt = _tensor(np.zeros((2, 3)), "float32")
    with pytest.raises(ShapeError, match=r"its limit is 2"):
        ker.pad_forward(xt, padding=(0, 0, 3, 0), mode="reflect")
    with pytest.raises(ShapeError, match=r"needs 4 = 2 x 2"):
        ker.pad_forward(xt, padding=(1, 1), mode="constant")
    with pytest.raises(ShapeError, match="gradient"):
        ker.pad_backward(xt, None, xt, padding=(1, 1, 0, 0), mode="circular")


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    x = rnd((2, 3, 5, 4), 2)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float16").permute(0, 3, 1, 2)

    def run():
        for mode in MODES:
            y = ker.pad_forward(xt, padding=(0, 0, 1, 0, 2, 2, 1, 3), mode=mode)
            ker.pad_backward(y, y, xt, padding=(0, 0, 1, 0, 2, 2, 1, 3), mode=mode)

    assert_torch_only_moves_memory(run, "the pad kernels")
