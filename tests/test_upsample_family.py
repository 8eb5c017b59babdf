"""upsample_nearest / upsample_linear / pixel_shuffle / pixel_unshuffle, any
spatial rank: the cases the generic property suite does not pin down.

torch's F.interpolate index rules, exactly: nearest's floor(float32(d) *
float32(1/scale)) with the given scale factor (not the recomputed one) and
its copies when the size is kept or doubled in 2-d, and floor(float32(d *
r)) with d * r in the data's precision and no copies in 1-d and 3-d (torch's
generic CPU kernel); linear's half-pixel and
align_corners rules, and its copy when the size is kept, whatever the
scale. Checked position by position against torch for every input side
1..12 and many sizes and factors, along an axis of each rank (1-d, either
axis of 2-d, the depth of 3-d); PyTorch's OpInfo samples (sizes 3 and 5 from
4, uneven shapes, factors 1.7 and 0.6, in 1-d, 2-d and 3-d) and a UNET's
scale 2 forward and backward in every dtype; NaN propagation (0 * NaN, as
torch) and infinities through the axes a 1-d or 2-d input does not have;
16-bit gradient sums rounded once; empty batches; views; attribute and rank
errors; pixel shuffles against torch, an explicit loop, NNlib's
column-major algorithm on the same memory, and each other; torch doing
nothing but allocate.
"""
import ml_dtypes
import numpy as np
import pytest

from helpers import call, rel, rnd
from triflux import backend
from triflux.errors import ShapeError
from triflux.reference import upsample as ref
from triflux.specs.upsample import pixel_shuffle_spec, scale_tuple, upsample2d_spec, upsample_spec

torch = pytest.importorskip("torch")
F = torch.nn.functional

GPU = backend.functional("CUDA")
needs_kernels = pytest.mark.skipif(
    not GPU, reason="no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)")

if GPU:
    from torch_ops import assert_torch_only_moves_memory
    from triflux.triton_kernels import launch
    from triflux.triton_kernels import upsample as ku
    DEVICE = "cpu" if launch.INTERPRET else "cuda"

NEAREST, LINEAR = "upsample_nearest", "upsample_linear"
SHUFFLE, UNSHUFFLE = "pixel_shuffle", "pixel_unshuffle"
MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}
#: PyTorch's OpInfo input shapes per rank (even and uneven)
SHAPES = {1: [(2, 3, 4)], 2: [(2, 3, 4, 4), (2, 3, 4, 5)], 3: [(2, 3, 4, 4, 4), (2, 3, 4, 3, 5)]}


def _cases(rank):
    out = []
    for name in (NEAREST, LINEAR):
        corners = (False, True) if name == LINEAR else (None,)
        for ac in corners:
            extra = {} if ac is None else {"align_corners": ac}
            out += [(name, dict(scale=(2,) * rank, **extra)),                                   # a UNET's
                    (name, dict(size=(3,) * rank, **extra)), (name, dict(size=(5,) * rank, **extra)),   # OpInfo's
                    (name, dict(scale=(1.7,) * rank, **extra)), (name, dict(scale=(0.6,) * rank, **extra)),
                    (name, dict(scale=(1.3, 2.5, 0.75)[:rank], **extra)), (name, dict(size=(9, 2, 4)[:rank], **extra))]
    return out


CASES = _cases(2)
#: (rank, name, attrs) of every rank
ALL_CASES = [(r, n, a) for r in (1, 2, 3) for n, a in _cases(r)]
TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def torch_interpolate(name, x, size=None, scale=None, align_corners=None):
    rank = x.ndim - 2
    mode = "nearest" if name == NEAREST else MODES[rank]
    kw = {} if name == NEAREST else {"align_corners": bool(align_corners)}
    if size is not None:
        return F.interpolate(x, size=tuple(size) if isinstance(size, tuple) else size, mode=mode, **kw)
    scale = tuple(float(s) for s in scale) if isinstance(scale, tuple) else float(scale)
    return F.interpolate(x, scale_factor=scale, mode=mode, **kw)


def torch_both(name, x, g, **attrs):
    tx = torch.from_numpy(np.array(x, dtype=np.float64)).requires_grad_()
    ty = torch_interpolate(name, tx, **attrs)
    ty.backward(torch.from_numpy(np.array(g, dtype=np.float64)))
    return ty.detach().numpy(), tx.grad.numpy()


def out_shape(x_shape, size=None, scale=None, **_):
    return upsample_spec(NEAREST, x_shape, "float64", size, scale).out_shape


def _one_axis(rank, axis, n):
    """(shape of an input with side n along spatial ``axis`` and 1 elsewhere, a function making
    an R-tuple of per-axis values with v along ``axis`` and ``other`` elsewhere)."""
    shape = (1, 1) + tuple(n if k == axis else 1 for k in range(rank))
    return shape, lambda v, other: tuple(v if k == axis else other for k in range(rank))


# --- reference (CPU) --------------------------------------------------------------------------

@pytest.mark.parametrize("rank,name,attrs", ALL_CASES)
def test_reference_matches_torch(rank, name, attrs):
    for shape in SHAPES[rank]:
        x = rnd(shape, 0)
        g = rnd(out_shape(x.shape, **attrs), 1)
        ty, tdx = torch_both(name, x, g, **attrs)
        y = call(ref, name, "forward", x, **attrs)
        dx, = call(ref, name, "backward", g, y, x, **attrs)
        assert y.shape == ty.shape and dx.shape == x.shape
        assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12, (shape, name, attrs)


@pytest.mark.parametrize("rank", [1, 3])
def test_reference_takes_one_number_for_every_axis(rank):
    x = rnd(SHAPES[rank][0], 2)
    for name, extra in ((NEAREST, {}), (LINEAR, {"align_corners": False})):
        for a in (dict(scale=1.7), dict(size=5)):
            want = torch_interpolate(name, torch.from_numpy(x), **a, **extra).numpy()
            assert rel(call(ref, name, "forward", x, **a, **extra), want) < 1e-12, (name, a)


@pytest.mark.parametrize("name,align_corners", [(NEAREST, None), (LINEAR, False), (LINEAR, True)])
def test_index_rules_match_torch_everywhere(name, align_corners):
    # every input side 1..12 to every output side 1..25, given as a size and as factors (the output
    # floor(n * factor)), along one axis, that axis cycling through 1-d, both axes of 2-d and the
    # three of 3-d: the source positions and weights are torch's exactly (the input holds distinct
    # powers of two, so y identifies what was read)
    factors = (0.3, 0.5, 0.6, 0.7, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0, 1 / 3, 2.9999, 10 / 3, 7.0)
    extra = {} if align_corners is None else {"align_corners": align_corners}
    places = [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    for n in range(1, 13):
        rank, axis = places[n % len(places)]
        shape, per_axis = _one_axis(rank, axis, n)
        x = 2.0 ** np.arange(n, dtype=np.float64).reshape(shape)
        attrs = [dict(size=per_axis(m, 1)) for m in range(1, 26)] + \
            [dict(scale=per_axis(f, 1.0)) for f in factors if int(n * f) >= 1]
        for a in attrs:
            want = torch_interpolate(name, torch.from_numpy(x), **a, **extra).numpy()
            got = call(ref, name, "forward", x, **a, **extra)
            # (linear: the same weights, summed in another order: within an ulp or two)
            np.testing.assert_allclose(got, want, rtol=0 if name == NEAREST else 1e-15, atol=0,
                                       err_msg=f"{name} n={n} {a} {extra}")
            got32 = call(ref, name, "forward", x.astype(np.float32), **a, **extra)
            want32 = torch_interpolate(name, torch.from_numpy(x.astype(np.float32)), **a, **extra).numpy()
            np.testing.assert_allclose(got32, want32, rtol=1e-6, err_msg=f"{name} float32 n={n} {a} {extra}")


def _nan_input(rank):
    x = rnd(SHAPES[rank][-1], 3)
    x[(0, 0) + (1,) * rank] = np.nan
    return x


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_reference_nan_propagates_as_torch(rank):
    # linear reads both neighbours even where a weight is 0: NaN spreads as in torch
    x = _nan_input(rank)
    for name, attrs in _cases(rank):
        ty, _ = torch_both(name, x, np.zeros(out_shape(x.shape, **attrs)), **attrs)
        np.testing.assert_array_equal(np.isnan(call(ref, name, "forward", x, **attrs)), np.isnan(ty),
                                      err_msg=f"{name} {attrs}")


#: an infinity through a kept side (1 * inf + 0 * inf = NaN in torch) and through an upsampled one,
#: along the last axis of inputs of each rank whose other sides are 1: a 1-d input has no other
#: axis (inf stays inf where 2-d and 3-d get NaN from their real size-1 axes)
INF_CASES = [(rank, size) for rank in (1, 2, 3) for size in (3, 6)]


def _inf_input(rank):
    return np.array([1.0, np.inf, 3.0]).reshape((1, 1) + (1,) * (rank - 1) + (3,))


@pytest.mark.parametrize("rank,size", INF_CASES)
def test_reference_infinity_through_absent_and_size_one_axes_as_torch(rank, size):
    x = _inf_input(rank)
    attrs = dict(size=(1,) * (rank - 1) + (size,), align_corners=False)
    want = torch_interpolate(LINEAR, torch.from_numpy(x), **attrs).numpy()
    np.testing.assert_array_equal(call(ref, LINEAR, "forward", x, **attrs), want)


#: 1-d and 3-d nearest (torch's generic kernel) forms d * r in the data's precision: at these sizes
#: float32 and float64 data read different sources, each as torch does (2-d computes in float32 always)
PRECISION_CASES = [((1, 2, 2), (82,)), ((1, 1, 3), (123,)), ((1, 1, 1, 2, 2), (1, 3, 94))]


def _torch_in(dtype, x, g, **attrs):
    """torch's forward in ``dtype`` and the true gradient of it (the adjoint of the gather it does;
    torch's own backward uses the 2-d rule: test_nearest_1d_3d_gradient_is_the_forwards)."""
    ty = torch_interpolate(NEAREST, torch.from_numpy(x.astype(dtype)), **attrs).numpy()
    return ty, _adjoint_of_torch_forward(x.shape, g, dtype, **attrs)


def _adjoint_of_torch_forward(shape, g, dtype, **attrs):
    """sum of g over the outputs that torch's nearest forward copies from each input element
    (found by running the forward on the flat positions)."""
    n = int(np.prod(shape))
    pos = torch_interpolate(NEAREST, torch.from_numpy(np.arange(n, dtype=np.float64).reshape(shape).astype(dtype)),
                            **attrs).numpy().astype(np.int64)
    return np.bincount(pos.ravel(), weights=np.asarray(g, np.float64).ravel(), minlength=n).reshape(shape)


@pytest.mark.parametrize("shape,size", PRECISION_CASES)
def test_reference_nearest_1d_3d_precision_as_torch(shape, size):
    x = np.arange(1.0, 1 + np.prod(shape)).reshape(shape)
    g = np.arange(1.0, 1 + np.prod(out_shape(shape, size=size))).reshape(out_shape(shape, size=size))
    got = {}
    for dtype in (np.float32, np.float64):
        ty, tdx = _torch_in(dtype, x, g, size=size)
        got[dtype] = y = call(ref, NEAREST, "forward", x.astype(dtype), size=size)
        np.testing.assert_array_equal(y, ty)
        np.testing.assert_array_equal(call(ref, NEAREST, "backward", g.astype(dtype), y, x.astype(dtype),
                                           size=size)[0], tdx)
    assert not np.array_equal(got[np.float32], got[np.float64])


@pytest.mark.parametrize("shape,attrs", [((1, 1, 3), dict(scale=(1.1,))), ((1, 1, 3, 1, 2), dict(scale=(2.2, 1, 1))),
                                          ((2, 1, 2, 3), dict(scale=(1.1, 2.2)))])
def test_nearest_1d_3d_gradient_is_the_forwards(shape, attrs):
    # torch 2.13's CPU nearest: the 1-d and 3-d forward (generic kernel) reads 3 elements scaled by
    # 1.1 from (0, 0, 1), its backward (nearest_idx, 2-d's rule) sends gradients to (0, 1, 2) as if it
    # copied; the reference's backward is the adjoint of its (torch's) forward: finite differences agree
    x = rnd(shape, 7)
    y = call(ref, NEAREST, "forward", x, **attrs)
    np.testing.assert_array_equal(y, torch_interpolate(NEAREST, torch.from_numpy(x), **attrs).numpy())
    g = rnd(y.shape, 8)
    dx, = call(ref, NEAREST, "backward", g, y, x, **attrs)
    np.testing.assert_array_equal(dx, _adjoint_of_torch_forward(shape, g, np.float64, **attrs))
    e = np.zeros(shape)
    for i in range(x.size):                    # the forward is linear: its derivative along e_i, exactly
        e.flat[i] = 1.0
        assert np.isclose(dx.flat[i], np.sum(g * call(ref, NEAREST, "forward", e, **attrs)))
        e.flat[i] = 0.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,attrs,shape", [
    (NEAREST, dict(scale=(1, 64)), (1, 2, 2, 3)), (LINEAR, dict(size=(2, 200)), (1, 2, 2, 3)),
    (LINEAR, dict(scale=(1, 48), align_corners=True), (1, 2, 2, 3)),
    (NEAREST, dict(scale=(64,)), (1, 2, 3)), (LINEAR, dict(size=(2, 1, 120)), (1, 2, 2, 1, 3))])
def test_reference_16bit_sums_round_once(name, attrs, shape, dtype):
    # positive gradients summed over dozens of outputs per input element, in the input's 16-bit
    # dtype: the float64 reference's sums rounded once (at most the unit roundoff u) plus float32 noise
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    u = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    rng = np.random.default_rng(5)
    x = rng.uniform(0.25, 0.35, shape).astype(np_dtype)
    y = call(ref, name, "forward", x, **attrs)
    g = rng.uniform(0.25, 0.35, y.shape).astype(np_dtype)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    dx64, = call(ref, name, "backward", g.astype(np.float64), y.astype(np.float64), x.astype(np.float64), **attrs)
    assert dx.dtype == np_dtype
    err = np.abs(dx.astype(np.float64) - dx64) / np.abs(dx64)
    assert err.max() <= u * (1 + 1e-3) + 1e-5, (name, dtype, err.max() / u)


EMPTY = [(0, 3, 4, 4), (2, 0, 4, 4), (0, 3, 4), (2, 0, 3, 4, 2)]


@pytest.mark.parametrize("shape", EMPTY)
def test_reference_empty(shape):
    for name, attrs in _cases(len(shape) - 2)[:2] + _cases(len(shape) - 2)[7:9]:
        x = np.zeros(shape)
        y = call(ref, name, "forward", x, **attrs)
        assert y.shape == out_shape(shape, **attrs)
        dx, = call(ref, name, "backward", np.zeros(y.shape), y, x, **attrs)
        assert dx.shape == shape


@pytest.mark.parametrize("shape,attrs,match", [
    ((1, 1, 3, 3), dict(size=(2, 2), scale=(2, 2)), "exactly one of size"),
    ((1, 1, 3, 3), dict(), "exactly one of size"),
    ((1, 1, 3, 3), dict(scale=(0, 2)), "positive"),
    ((1, 1, 3, 3), dict(scale=(-1.5, 2)), "positive"),
    ((1, 1, 3, 3), dict(scale=(float("inf"), 2)), "positive"),
    ((1, 1, 3, 3), dict(size=(0, 2)), "greater than 0"),
    ((1, 1, 3), dict(size=-2), "greater than 0"),
    ((1, 1, 3, 3), dict(scale=(0.2, 1)), r"greater than 0.*floor"),
    ((1, 1, 3, 3), dict(size=(2.5, 2)), "ints"),
    # the rank: read from x, and every per-axis attribute must have that many entries
    ((1, 1, 3, 3), dict(size=(2, 2, 2)), r"size has 3 entries \(2, 2, 2\), but x of shape \(1, 1, 3, 3\) has 2 "
                                         r"spatial axes: give 2"),
    ((1, 1, 3, 3, 3), dict(scale=(2, 2)), r"scale has 2 entries .* 3 spatial axes: give 3"),
    ((1, 1, 3), dict(size=(4, 4)), r"size has 2 entries .* 1 spatial axis: give 1"),
    ((3, 3), dict(scale=2), r"expects an input \(N, C, \*spatial\) with 1, 2 or 3 spatial axes.*got shape \(3, 3\)"),
    ((1, 1, 2, 2, 2, 2), dict(scale=2), r"1, 2 or 3 spatial axes.*6 dimensions"),
])
def test_reference_errors(shape, attrs, match):
    for name in (NEAREST, LINEAR):
        with pytest.raises(ShapeError, match=match) as e:
            call(ref, name, "forward", np.zeros(shape), **attrs)
        assert name in str(e.value)


def test_spec_api():
    spec = upsample_spec(LINEAR, (2, 3, 4, 5, 6), "float32", scale=(2, 1.5, 0.5), align_corners=True)
    assert spec.rank == 3 and spec.out_shape == (2, 3, 8, 7, 3) and spec.torch_mode == "trilinear"
    assert spec.scale == (2.0, 1.5, 0.5) and spec.size is None and spec.align_corners
    assert upsample_spec(NEAREST, (2, 3, 4), np.float64, size=7).size == (7,)
    assert scale_tuple(2, 3) == (2, 2, 2) and scale_tuple((2.0, 1.5), 2) == (2, 1.5)
    with pytest.raises(ShapeError, match="scale has 2 entries"):
        scale_tuple((2, 2), 1)
    with pytest.raises(ShapeError, match="align_corners applies to upsample_linear only"):
        upsample_spec(NEAREST, (1, 1, 3), "float32", scale=2, align_corners=True)
    # the 2-D entry point of ops.py and layers/ (by the old names)
    assert upsample2d_spec("upsample_bilinear2d", (1, 1, 3, 3), "float32", scale=(2, 2)).linear
    with pytest.raises(ShapeError, match="NCHW"):
        upsample2d_spec("upsample_nearest2d", (1, 1, 3), "float32", scale=2)


@pytest.mark.parametrize("kw,match", [
    (dict(scale=0.2), r"greater than 0.*floor"),
    (dict(scale=(0, 2)), "positive"),
    (dict(size=(0, 2)), "greater than 0"),
    (dict(scale=(1, 2, 3)), "scale has 3 entries"),
])
def test_ops_check_the_spec_before_dispatch(monkeypatch, kw, match):
    """ops.upsample builds the family's spec at the API edge: bad attributes never reach a device."""
    import sys
    import triflux as tf
    from triflux import ops
    home = sys.modules[ops.upsample.__module__]           # (ops re-exports it from where it lives)
    monkeypatch.setattr(home, "apply", lambda *a, **k: pytest.fail("dispatched a call the spec refuses"))
    for mode in ("nearest", "bilinear"):
        with pytest.raises(ShapeError, match=match):
            ops.upsample(tf.tensor(np.zeros((1, 1, 3, 3), np.float32)), mode=mode, **kw)


# --- pixel shuffle (reference) ----------------------------------------------------------------

def _shuffle_by_loops(x, r):
    """y[n, c, r p + i] = x[n, c r^R + sum_k i_k r^(R-1-k), p], element by element."""
    rank = x.ndim - 2
    n, cr, spatial = x.shape[0], x.shape[1], x.shape[2:]
    c_out = cr // r ** rank
    y = np.empty((n, c_out) + tuple(s * r for s in spatial), x.dtype)
    for idx in np.ndindex(*y.shape):
        c, pos = idx[1], idx[2:]
        sub = [q % r for q in pos]
        channel = c * r ** rank + sum(i * r ** (rank - 1 - k) for k, i in enumerate(sub))
        y[idx] = x[(idx[0], channel) + tuple(q // r for q in pos)]
    return y


def _nnlib_pixel_shuffle(x, r):
    """NNlib's pixel_shuffle, transcribed, on the column-major (Julia) view of a row-major array:
    x (N, C, *s) row-major is Julia's (s reversed..., C, N)."""
    jx = x.T                                             # the same memory as a Julia array (s_1..s_d, C, N)
    d = jx.ndim - 2
    sizein = jx.shape[:d]
    cin, n = jx.shape[d], jx.shape[d + 1]
    cout = cin // r ** d
    jx = jx.reshape(sizein + (r,) * d + (cout, n), order="F")
    perm = [a for k in range(d) for a in (d + k, k)]     # [d+1, 1, d+2, 2, ..., 2d, d], 0-based
    jx = np.transpose(jx, perm + [2 * d, 2 * d + 1])
    jy = jx.reshape(tuple(r * s for s in sizein) + (cout, n), order="F")
    return jy.T                                          # back to row-major (N, C, *(r s))


@pytest.mark.parametrize("rank,r", [(1, 1), (1, 3), (2, 2), (2, 3), (3, 2)])
def test_pixel_shuffle_is_the_index_map_torch_and_nnlib(rank, r):
    x = rnd((2, 2 * r ** rank) + (3, 2, 2)[:rank], 4)
    y = call(ref, SHUFFLE, "forward", x, factor=r)
    np.testing.assert_array_equal(y, _shuffle_by_loops(x, r))
    np.testing.assert_array_equal(y, _nnlib_pixel_shuffle(x, r))
    if rank == 2:
        np.testing.assert_array_equal(y, F.pixel_shuffle(torch.from_numpy(x), r).numpy())
    back = call(ref, UNSHUFFLE, "forward", y, factor=r)
    np.testing.assert_array_equal(back, x)
    if rank == 2:
        np.testing.assert_array_equal(back, F.pixel_unshuffle(torch.from_numpy(y), r).numpy())
    # the backward of each is the other's forward: a permutation's adjoint is its inverse
    g = rnd(y.shape, 5)
    np.testing.assert_array_equal(call(ref, SHUFFLE, "backward", g, y, x, factor=r)[0],
                                  call(ref, UNSHUFFLE, "forward", g, factor=r))
    np.testing.assert_array_equal(call(ref, UNSHUFFLE, "backward", x, back, y, factor=r)[0],
                                  call(ref, SHUFFLE, "forward", x, factor=r))


@pytest.mark.parametrize("shape,name,r,want", [
    ((1, 0, 1, 1), SHUFFLE, 1, (1, 0, 1, 1)), ((1, 1, 0, 1), SHUFFLE, 1, (1, 1, 0, 1)),    # OpInfo's
    ((1, 9, 0, 2), SHUFFLE, 3, (1, 1, 0, 6)), ((0, 8, 2, 1, 1), SHUFFLE, 2, (0, 1, 4, 2, 2)),
    # (torch 2.13's pixel_unshuffle returns these as they are, in the input's shape)
    ((1, 3, 0, 15), UNSHUFFLE, 3, (1, 27, 0, 5)), ((0, 1, 4), UNSHUFFLE, 2, (0, 2, 2)),
])
def test_pixel_shuffle_empty(shape, name, r, want):
    x = np.zeros(shape)
    y = call(ref, name, "forward", x, factor=r)
    assert y.shape == want == pixel_shuffle_spec(name, shape, "float32", r).out_shape
    assert call(ref, name, "backward", y, y, x, factor=r)[0].shape == shape


@pytest.mark.parametrize("name,shape,r,match", [
    (SHUFFLE, (1, 6, 2, 2), 2, r"pixel_shuffle: x of shape \(1, 6, 2, 2\) has 6 channels, not divisible by "
                               r"r\^R = 2\^2 = 4.*give a multiple of 4 channels"),
    (SHUFFLE, (1, 4, 2, 2, 2), 2, r"not divisible by r\^R = 2\^3 = 8"),
    (UNSHUFFLE, (1, 1, 4, 5), 2, r"pixel_unshuffle: x of shape \(1, 1, 4, 5\) has spatial sides \(4, 5\), not all "
                                 r"divisible by the factor 2 \(axis 1.*5\); crop or pad"),
    (UNSHUFFLE, (1, 1, 3), 2, r"not all divisible by the factor 2"),
    (SHUFFLE, (1, 4, 2, 2), 0, "the factor must be a positive int"),
    (UNSHUFFLE, (1, 4, 2, 2), 1.5, "the factor must be a positive int"),
    (SHUFFLE, (4, 2), 1, r"pixel_shuffle expects an input \(N, C\*r\^R, \*spatial\) with 1, 2 or 3 spatial axes"),
])
def test_pixel_shuffle_errors(name, shape, r, match):
    with pytest.raises(ShapeError, match=match):
        call(ref, name, "forward", np.zeros(shape), factor=r)


# --- kernels ----------------------------------------------------------------------------------

def _tensor(a, dtype):
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(getattr(torch, dtype)).to(DEVICE)


def _np(t):
    return t.detach().to("cpu").double().numpy()


def _kernel_vs_torch(name, attrs, x, g, dtype, xt=None, gt=None):
    xt = _tensor(x, dtype) if xt is None else xt
    gt = _tensor(g, dtype) if gt is None else gt
    x, g = _np(xt), _np(gt)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = call(ku, name, "forward", xt, **attrs)
    dx, = call(ku, name, "backward", gt, y, xt, **attrs)
    assert tuple(y.shape) == ty.shape and y.dtype == xt.dtype and y.is_contiguous()
    assert tuple(dx.shape) == x.shape and dx.dtype == xt.dtype and dx.is_contiguous()
    assert rel(_np(y), ty) <= TOL[dtype], (name, attrs, dtype, "forward")
    assert rel(_np(dx), tdx) <= TOL[dtype], (name, attrs, dtype, "backward")


@needs_kernels
@pytest.mark.parametrize("name,attrs,dtype",
                         [(n, a, d) for n, a in (CASES[0], CASES[7], CASES[14])
                          for d in ("float32", "float64", "float16", "bfloat16")]
                         + [(n, a, "float32") for n, a in CASES])
def test_kernel_matches_torch(name, attrs, dtype):
    x = rnd((2, 3, 4, 5), 0)
    g = rnd(out_shape(x.shape, **attrs), 1)
    _kernel_vs_torch(name, attrs, x, g, dtype)


#: of each rank's cases: nearest's size 5 and 0.6, linear's size 3 and 1.7, linear with align_corners'
#: size 5, 0.6 and uneven factors (OpInfo's kinds), and a UNET's scale 2 (nearest, linear)
SOME = (0, 2, 4, 7, 8, 10, 16, 18, 19)


@needs_kernels
@pytest.mark.parametrize("rank,name,attrs", [(r, *_cases(r)[i]) for r in (1, 3) for i in SOME])
def test_kernel_matches_torch_1d_3d(rank, name, attrs):
    # OpInfo's kinds of 1-d and 3-d cases in float32; a UNET's 3-d scale 2 in every dtype
    x = rnd(SHAPES[rank][-1], 0)
    g = rnd(out_shape(x.shape, **attrs), 1)
    dtypes = ("float32", "float64", "float16", "bfloat16") if rank == 3 and attrs.get("scale") == (2, 2, 2) \
        and not attrs.get("align_corners") else ("float32",)
    for dtype in dtypes:
        _kernel_vs_torch(name, attrs, x, g, dtype)


@needs_kernels
@pytest.mark.parametrize("name,align_corners", [(NEAREST, None), (LINEAR, False), (LINEAR, True)])
def test_kernel_index_rules_match_reference(name, align_corners):
    # one axis, several sides to sizes and factors below, at and above them, that axis cycling
    # through 1-d, both axes of 2-d and the first of 3-d (each canonical axis's backward pass):
    # integer-valued gradients make every misplaced or missed contribution visible
    extra = {} if align_corners is None else {"align_corners": align_corners}
    # (2-d's axes are the kernels' canonical H and W, 3-d's first their D)
    places = [(1, 0), (2, 1), (3, 0), (2, 0)]
    for i, n in enumerate((1, 2, 3, 5, 8)):
        for j, a in enumerate([("size", m) for m in (1, 2, 3, 4, 6, 7, 9, 11, 16, 19)] +
                              [("scale", f) for f in (0.6, 1.2, 1.7, 2.5, 10 / 3, 7.0) if int(n * f) >= 1]):
            rank, axis = places[(i + j) % len(places)]
            shape, per_axis = _one_axis(rank, axis, n)
            a = {a[0]: per_axis(a[1], 1 if a[0] == "size" else 1.0)}
            x = 2.0 ** np.arange(n, dtype=np.float64).reshape(shape)
            y = call(ref, name, "forward", x, **a, **extra)
            g = np.arange(1.0, y.size + 1).reshape(y.shape)
            ky = call(ku, name, "forward", _tensor(x, "float64"), **a, **extra)
            kdx, = call(ku, name, "backward", _tensor(g, "float64"), ky, _tensor(x, "float64"), **a, **extra)
            np.testing.assert_allclose(_np(ky), y, rtol=1e-13, err_msg=f"{name} n={n} {a} {extra}")
            np.testing.assert_allclose(_np(kdx), call(ref, name, "backward", g, y, x, **a, **extra)[0],
                                       rtol=1e-13, err_msg=f"{name} backward n={n} {a} {extra}")


def _view(x, dtype="float32"):
    """A non-contiguous view holding x: channels-last storage permuted back."""
    rank = x.ndim - 2
    last = (0,) + tuple(range(2, 2 + rank)) + (1,)
    back = (0, rank + 1) + tuple(range(1, rank + 1))
    return _tensor(np.ascontiguousarray(x.transpose(last)), dtype).permute(back)


@needs_kernels
@pytest.mark.parametrize("rank,name,attrs", [(2, *CASES[0]), (2, *CASES[3]), (2, *CASES[8]), (2, *CASES[13]),
                                             (1, *_cases(1)[10]), (3, *_cases(3)[4]), (3, *_cases(3)[9])])
def test_kernel_reads_views_in_place(rank, name, attrs):
    x = rnd((2, 3, 5, 4, 3)[:2 + rank], 2)
    g = rnd(out_shape(x.shape, **attrs), 3)
    xt = _view(x)
    gt = _tensor(np.repeat(g, 2, axis=-1), "float32")[..., ::2]
    assert not xt.is_contiguous() and not gt.is_contiguous()
    _kernel_vs_torch(name, attrs, x, g, "float32", xt=xt, gt=gt)


@needs_kernels
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_kernel_nan_propagates_as_torch(rank):
    x = _nan_input(rank)
    for name, attrs in _cases(rank):
        y = call(ku, name, "forward", _tensor(x, "float32"), **attrs)
        np.testing.assert_array_equal(np.isnan(_np(y)), np.isnan(call(ref, name, "forward", x, **attrs)),
                                      err_msg=f"{name} {attrs}")


@needs_kernels
@pytest.mark.parametrize("rank,size", INF_CASES)
def test_kernel_infinity_through_absent_and_size_one_axes_as_torch(rank, size):
    x = _inf_input(rank)
    attrs = dict(size=(1,) * (rank - 1) + (size,), align_corners=False)
    want = torch_interpolate(LINEAR, torch.from_numpy(x), **attrs).numpy()
    np.testing.assert_array_equal(_np(call(ku, LINEAR, "forward", _tensor(x, "float32"), **attrs)), want)


@needs_kernels
@pytest.mark.parametrize("shape,size", PRECISION_CASES)
def test_kernel_nearest_1d_3d_precision_as_torch(shape, size):
    x = np.arange(1.0, 1 + np.prod(shape)).reshape(shape)
    g = np.arange(1.0, 1 + np.prod(out_shape(shape, size=size))).reshape(out_shape(shape, size=size))
    for dtype in ("float32", "float64"):
        ty, tdx = _torch_in(getattr(np, dtype), x, g, size=size)
        xt = _tensor(x, dtype)
        y = ku.upsample_nearest_forward(xt, size=size)
        np.testing.assert_array_equal(_np(y), ty)
        np.testing.assert_array_equal(_np(ku.upsample_nearest_backward(_tensor(g, dtype), y, xt, size=size)[0]), tdx)


@needs_kernels
@pytest.mark.parametrize("shape", EMPTY)
def test_kernel_empty(shape):
    xt = _tensor(np.zeros(shape), "float32")
    for name, attrs in _cases(len(shape) - 2)[:2] + _cases(len(shape) - 2)[7:9]:
        y = call(ku, name, "forward", xt, **attrs)
        assert tuple(y.shape) == out_shape(shape, **attrs)
        dx, = call(ku, name, "backward", y, y, xt, **attrs)
        assert tuple(dx.shape) == shape


@needs_kernels
def test_kernel_errors():
    xt = _tensor(np.zeros((1, 1, 3, 3)), "float32")
    with pytest.raises(ShapeError, match="exactly one of size"):
        ku.upsample_linear_forward(xt, size=(2, 2), scale=(2, 2))
    with pytest.raises(ShapeError, match=r"size has 1 entries"):
        ku.upsample_linear_forward(xt, size=(2,))
    with pytest.raises(ShapeError, match="1, 2 or 3 spatial axes"):
        ku.upsample_nearest_forward(xt[0, 0], scale=(2, 2))
    with pytest.raises(ShapeError, match="gradient"):
        ku.upsample_nearest_backward(xt, None, xt, scale=(2, 2))
    with pytest.raises(ShapeError, match="not divisible by r"):
        ku.pixel_shuffle_forward(xt, factor=2)
    with pytest.raises(ShapeError, match="gradient"):
        ku.pixel_unshuffle_backward(xt, None, xt, factor=3)


@needs_kernels
@pytest.mark.parametrize("rank,r", [(1, 3), (2, 2), (3, 2)])
def test_kernel_pixel_shuffle_views_and_dtypes(rank, r):
    x = rnd((2, 2 * r ** rank) + (3, 2, 2)[:rank], 6)
    want = call(ref, SHUFFLE, "forward", x, factor=r)
    for dtype in ("float32", "bfloat16"):
        xt = _view(x, dtype)
        assert not xt.is_contiguous()
        y = ku.pixel_shuffle_forward(xt, factor=r)
        assert y.dtype == xt.dtype and y.is_contiguous()
        np.testing.assert_array_equal(_np(y), _np(_tensor(want, dtype)))
        back = ku.pixel_unshuffle_forward(y, factor=r)
        np.testing.assert_array_equal(_np(back), _np(xt))
        # backward: the inverse map, also from a gradient in another dtype than the input
        gt = _tensor(np.repeat(want, 2, axis=-1), "float64")[..., ::2]
        dx, = ku.pixel_shuffle_backward(gt, y, xt, factor=r)
        assert dx.dtype == xt.dtype
        np.testing.assert_array_equal(_np(dx), _np(_tensor(x, dtype)))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    x = rnd((2, 3, 5, 4), 2)
    xt = _view(x, "float16")
    x1, x3 = _view(rnd((2, 3, 5), 3), "float16"), _view(rnd((1, 2, 3, 2, 3), 4), "float16")

    def run():
        for rank, t in ((2, xt), (1, x1), (3, x3)):
            for name, attrs in (CASES if rank == 2 else _cases(rank)[3:4] + _cases(rank)[10:11]):
                y = call(ku, name, "forward", t, **attrs)
                call(ku, name, "backward", y, y, t, **attrs)
        for name, t in ((SHUFFLE, x3), (UNSHUFFLE, _view(rnd((1, 2, 4, 2, 2), 5), "float16"))):
            y = call(ku, name, "forward", t, factor=2 if name == UNSHUFFLE else 1)
            call(ku, name, "backward", y, y, t, factor=2 if name == UNSHUFFLE else 1)

    assert_torch_only_moves_memory(run, "the upsample kernels")
