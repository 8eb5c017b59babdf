"""upsample_nearest2d / upsample_bilinear2d: the cases the generic property
suite does not pin down.

torch's F.interpolate index rules, exactly: nearest's floor(float32(d) *
float32(1/scale)) with the given scale factor (not the recomputed one) and
its copies when the size is kept or doubled; bilinear's half-pixel and
align_corners rules, and its copy when the size is kept, whatever the
scale. Checked position by position against torch for every input side
1..12 and many sizes and factors; PyTorch's OpInfo samples (sizes 3 and 5
from 4, uneven shapes, factors 1.7 and 0.6) and a UNET's scale 2 forward and
backward in every dtype; NaN propagation (0 * NaN, as torch); 16-bit
gradient sums rounded once; empty batches; views; attribute errors; torch
doing nothing but allocate.
"""
import ml_dtypes
import numpy as np
import pytest

from helpers import call, rel, rnd
from triflux import backend
from triflux.errors import ShapeError
from triflux.reference import upsample as ref
from triflux.specs.upsample import upsample2d_spec

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

NEAREST, BILINEAR = "upsample_nearest2d", "upsample_bilinear2d"


def _cases():
    out = []
    for name in (NEAREST, BILINEAR):
        corners = (False, True) if name == BILINEAR else (None,)
        for ac in corners:
            extra = {} if ac is None else {"align_corners": ac}
            out += [(name, dict(scale=(2, 2), **extra)),                   # a UNET's
                    (name, dict(size=(3, 3), **extra)), (name, dict(size=(5, 5), **extra)),   # OpInfo's
                    (name, dict(scale=(1.7, 1.7), **extra)), (name, dict(scale=(0.6, 0.6), **extra)),
                    (name, dict(scale=(1.3, 2.5), **extra)), (name, dict(size=(9, 2), **extra))]
    return out


CASES = _cases()
TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def torch_interpolate(name, x, size=None, scale=None, align_corners=None):
    mode = "nearest" if name == NEAREST else "bilinear"
    kw = {} if name == NEAREST else {"align_corners": bool(align_corners)}
    if size is not None:
        return F.interpolate(x, size=tuple(size), mode=mode, **kw)
    return F.interpolate(x, scale_factor=tuple(float(s) for s in scale), mode=mode, **kw)


def torch_both(name, x, g, **attrs):
    tx = torch.from_numpy(np.array(x, dtype=np.float64)).requires_grad_()
    ty = torch_interpolate(name, tx, **attrs)
    ty.backward(torch.from_numpy(np.array(g, dtype=np.float64)))
    return ty.detach().numpy(), tx.grad.numpy()


def out_shape(x_shape, size=None, scale=None, **_):
    return upsample2d_spec("upsample_nearest2d", x_shape, "float64", size, scale).out_shape


# --- reference (CPU) --------------------------------------------------------------------------

@pytest.mark.parametrize("name,attrs", CASES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 4), (2, 3, 4, 5)])   # OpInfo's even and uneven inputs
def test_reference_matches_torch(name, attrs, shape):
    x = rnd(shape, 0)
    g = rnd(out_shape(x.shape, **attrs), 1)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = call(ref, name, "forward", x, **attrs)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    assert y.shape == ty.shape and dx.shape == x.shape
    assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12


@pytest.mark.parametrize("name,align_corners", [(NEAREST, None), (BILINEAR, False), (BILINEAR, True)])
def test_index_rules_match_torch_everywhere(name, align_corners):
    # every input side 1..12 to every output side 1..25, given as a size and as factors (the output
    # floor(n * factor)), along one axis: the source positions and weights are torch's exactly
    # (the input holds distinct powers of two, so y identifies what was read)
    factors = (0.3, 0.5, 0.6, 0.7, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0, 1 / 3, 2.9999, 10 / 3, 7.0)
    extra = {} if align_corners is None else {"align_corners": align_corners}
    for n in range(1, 13):
        x = 2.0 ** np.arange(n, dtype=np.float64).reshape(1, 1, n, 1)
        attrs = [dict(size=(m, 1)) for m in range(1, 26)] + \
            [dict(scale=(f, 1.0)) for f in factors if int(n * f) >= 1]
        for a in attrs:
            want = torch_interpolate(name, torch.from_numpy(x), **a, **extra).numpy()
            got = call(ref, name, "forward", x, **a, **extra)
            # (bilinear: the same weights, summed in another order: within an ulp or two)
            np.testing.assert_allclose(got, want, rtol=0 if name == NEAREST else 1e-15, atol=0,
                                       err_msg=f"{name} n={n} {a} {extra}")
            got32 = call(ref, name, "forward", x.astype(np.float32), **a, **extra)
            want32 = torch_interpolate(name, torch.from_numpy(x.astype(np.float32)), **a, **extra).numpy()
            np.testing.assert_allclose(got32, want32, rtol=1e-6, err_msg=f"{name} float32 n={n} {a} {extra}")


def test_reference_nan_propagates_as_torch():
    # bilinear reads both neighbours even where a weight is 0: NaN spreads as in torch
    x = rnd((1, 2, 4, 5), 3)
    x[0, 0, 1, 2] = np.nan
    for name, attrs in CASES:
        ty, _ = torch_both(name, x, np.zeros(out_shape(x.shape, **attrs)), **attrs)
        np.testing.assert_array_equal(np.isnan(call(ref, name, "forward", x, **attrs)), np.isnan(ty),
                                      err_msg=f"{name} {attrs}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,attrs", [(NEAREST, dict(scale=(1, 64))), (BILINEAR, dict(size=(2, 200))),
                                        (BILINEAR, dict(scale=(1, 48), align_corners=True))])
def test_reference_16bit_sums_round_once(name, attrs, dtype):
    # positive gradients summed over dozens of outputs per input pixel, in the input's 16-bit
    # dtype: the float64 reference's sums rounded once (at most the unit roundoff u) plus float32 noise
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    u = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    rng = np.random.default_rng(5)
    x = rng.uniform(0.25, 0.35, (1, 2, 2, 3)).astype(np_dtype)
    y = call(ref, name, "forward", x, **attrs)
    g = rng.uniform(0.25, 0.35, y.shape).astype(np_dtype)
    dx, = call(ref, name, "backward", g, y, x, **attrs)
    dx64, = call(ref, name, "backward", g.astype(np.float64), y.astype(np.float64), x.astype(np.float64), **attrs)
    assert dx.dtype == np_dtype
    err = np.abs(dx.astype(np.float64) - dx64) / np.abs(dx64)
    assert err.max() <= u * (1 + 1e-3) + 1e-5, (name, dtype, err.max() / u)


@pytest.mark.parametrize("name,attrs", CASES[:2] + CASES[7:9])
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_reference_empty(name, attrs, shape):
    x = np.zeros(shape)
    y = call(ref, name, "forward", x, **attrs)
    assert y.shape == out_shape(shape, **attrs)
    dx, = call(ref, name, "backward", np.zeros(y.shape), y, x, **attrs)
    assert dx.shape == shape


@pytest.mark.parametrize("attrs,match", [
    (dict(size=(2, 2), scale=(2, 2)), "exactly one of size"),
    (dict(), "exactly one of size"),
    (dict(scale=(0, 2)), "positive"),
    (dict(scale=(-1.5, 2)), "positive"),
    (dict(size=(0, 2)), "greater than 0"),
    (dict(scale=(0.2, 1)), r"greater than 0.*floor"),
    (dict(size=(2.5, 2)), "ints"),
])
def test_reference_errors(attrs, match):
    for name in (NEAREST, BILINEAR):
        with pytest.raises(ShapeError, match=match):
            call(ref, name, "forward", np.zeros((1, 1, 3, 3)), **attrs)
    with pytest.raises(ShapeError, match="NCHW"):
        ref.upsample_nearest2d_forward(np.zeros((3, 3)), scale=(2, 2))


@pytest.mark.parametrize("kw,match", [
    (dict(scale=0.2), r"greater than 0.*floor"),
    (dict(scale=(0, 2)), "positive"),
    (dict(size=(0, 2)), "greater than 0"),
    (dict(scale=(1, 2, 3)), "scale must be a number or a pair"),
])
def test_ops_check_the_spec_before_dispatch(monkeypatch, kw, match):
    """ops.upsample builds the family's spec at the API edge: bad attributes never reach a device."""
    import triflux as tf
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a call the spec refuses"))
    for mode in ("nearest", "bilinear"):
        with pytest.raises(ShapeError, match=match):
            ops.upsample(tf.tensor(np.zeros((1, 1, 3, 3), np.float32)), mode=mode, **kw)


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


@needs_kernels
@pytest.mark.parametrize("name,align_corners", [(NEAREST, None), (BILINEAR, False), (BILINEAR, True)])
def test_kernel_index_rules_match_reference(name, align_corners):
    # one axis, several sides to sizes and factors below, at and above them: integer-valued
    # gradients make every misplaced or missed contribution visible
    extra = {} if align_corners is None else {"align_corners": align_corners}
    for n in (1, 2, 3, 5, 8):
        x = 2.0 ** np.arange(n, dtype=np.float64).reshape(1, 1, 1, n)
        for a in [dict(size=(1, m)) for m in (1, 2, 3, 4, 6, 7, 9, 11, 16, 19)] + \
                [dict(scale=(1.0, f)) for f in (0.6, 1.2, 1.7, 2.5, 10 / 3, 7.0) if int(n * f) >= 1]:
            y = call(ref, name, "forward", x, **a, **extra)
            g = np.arange(1.0, y.size + 1).reshape(y.shape)
            ky = call(ku, name, "forward", _tensor(x, "float64"), **a, **extra)
            kdx, = call(ku, name, "backward", _tensor(g, "float64"), ky, _tensor(x, "float64"), **a, **extra)
            np.testing.assert_allclose(_np(ky), y, rtol=1e-13, err_msg=f"{name} n={n} {a} {extra}")
            np.testing.assert_allclose(_np(kdx), call(ref, name, "backward", g, y, x, **a, **extra)[0],
                                       rtol=1e-13, err_msg=f"{name} backward n={n} {a} {extra}")


@needs_kernels
@pytest.mark.parametrize("name,attrs", [CASES[0], CASES[3], CASES[8], CASES[13]])
def test_kernel_reads_views_in_place(name, attrs):
    x = rnd((2, 3, 5, 4), 2)
    g = rnd(out_shape(x.shape, **attrs), 3)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float32").permute(0, 3, 1, 2)
    gt = _tensor(np.repeat(g, 2, axis=3), "float32")[..., ::2]
    assert not xt.is_contiguous() and not gt.is_contiguous()
    _kernel_vs_torch(name, attrs, x, g, "float32", xt=xt, gt=gt)


@needs_kernels
def test_kernel_nan_propagates_as_torch():
    x = rnd((1, 2, 4, 5), 3)
    x[0, 0, 1, 2] = np.nan
    for name, attrs in CASES:
        y = call(ku, name, "forward", _tensor(x, "float32"), **attrs)
        np.testing.assert_array_equal(np.isnan(_np(y)), np.isnan(call(ref, name, "forward", x, **attrs)),
                                      err_msg=f"{name} {attrs}")


@needs_kernels
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_kernel_empty(shape):
    xt = _tensor(np.zeros(shape), "float32")
    for name, attrs in CASES[:2] + CASES[7:9]:
        y = call(ku, name, "forward", xt, **attrs)
        assert tuple(y.shape) == out_shape(shape, **attrs)
        dx, = call(ku, name, "backward", y, y, xt, **attrs)
        assert tuple(dx.shape) == shape


@needs_kernels
def test_kernel_errors():
    xt = _tensor(np.zeros((1, 1, 3, 3)), "float32")
    with pytest.raises(ShapeError, match="exactly one of size"):
        ku.upsample_bilinear2d_forward(xt, size=(2, 2), scale=(2, 2))
    with pytest.raises(ShapeError, match="NCHW"):
        ku.upsample_nearest2d_forward(xt[0], scale=(2, 2))
    with pytest.raises(ShapeError, match="gradient"):
        ku.upsample_nearest2d_backward(xt, None, xt, scale=(2, 2))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    x = rnd((2, 3, 5, 4), 2)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float16").permute(0, 3, 1, 2)

    def run():
        for name, attrs in CASES:
            y = call(ku, name, "forward", xt, **attrs)
            call(ku, name, "backward", y, y, xt, **attrs)

    assert_torch_only_moves_memory(run, "the upsample kernels")
