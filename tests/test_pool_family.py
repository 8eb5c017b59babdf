"""maxpool2d / meanpool2d / upsample_nearest2d / upsample_bilinear2d: the cases
the generic property suite does not pin down.

The fixed configurations a UNET uses (2x2 stride 2 pooling, 3x3 stride 1
padding 1, scale 2 nearest and bilinear upsampling) against torch, forward
and gradient, in every float dtype; max-pool ties (the gradient goes to the
first maximal element in window scan order, as torch) including overlapping
windows and all -inf windows next to padding; NaN propagation; empty batch
and channel dims; channels-last and strided views read in place; attribute
errors; and torch doing nothing but allocate and make views.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import ShapeError
from triflux.reference import pool as ref

torch = pytest.importorskip("torch")
F = torch.nn.functional

GPU = backend.functional("CUDA")
needs_kernels = pytest.mark.skipif(
    not GPU, reason="no functional GPU backend (set TRITON_INTERPRET=1 to use the interpreter)")

if GPU:
    from torch_ops import assert_torch_only_moves_memory
    from triflux.triton_kernels import common
    from triflux.triton_kernels import pool as kp
    DEVICE = "cpu" if common.INTERPRET else "cuda"

UNET = [
    ("maxpool2d", dict(window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),
    ("maxpool2d", dict(window=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1))),
    ("meanpool2d", dict(window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),
    ("meanpool2d", dict(window=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1))),
    ("upsample_nearest2d", dict(scale=(2, 2))),
    ("upsample_bilinear2d", dict(scale=(2, 2))),
]
ODD = [
    ("maxpool2d", dict(window=(3, 2), stride=(2, 3), padding=(2, 0, 1, 0))),
    ("meanpool2d", dict(window=(2, 3), stride=(3, 1), padding=(0, 1, 2, 1))),
    ("upsample_nearest2d", dict(scale=(3, 1))),
    ("upsample_bilinear2d", dict(scale=(1, 3))),
    ("upsample_bilinear2d", dict(scale=(3, 2))),
]
TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def torch_pool(name, x, window=None, stride=None, padding=None, scale=None):
    """torch's own functional ops, asymmetric padding applied with F.pad."""
    if name in ("maxpool2d", "meanpool2d"):
        pt, pb, pl, pr = padding
        if name == "maxpool2d":
            return F.max_pool2d(F.pad(x, (pl, pr, pt, pb), value=-float("inf")), window, stride)
        return F.avg_pool2d(F.pad(x, (pl, pr, pt, pb), value=0.0), window, stride)
    mode = "nearest" if name == "upsample_nearest2d" else "bilinear"
    extra = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(x, scale_factor=tuple(float(s) for s in scale), mode=mode, **extra)


def torch_both(name, x, g, **attrs):
    tx = torch.from_numpy(np.array(x, dtype=np.float64)).requires_grad_()
    ty = torch_pool(name, tx, **attrs)
    ty.backward(torch.from_numpy(np.array(g, dtype=np.float64)))
    return ty.detach().numpy(), tx.grad.numpy()


def out_shape(name, x_shape, **attrs):
    if name in ("maxpool2d", "meanpool2d"):
        return x_shape[:2] + ref.pool_geometry(x_shape, **attrs)[3]
    return x_shape[:2] + (x_shape[2] * attrs["scale"][0], x_shape[3] * attrs["scale"][1])


def rnd(shape, seed):
    return np.random.default_rng(seed).uniform(-3, 3, shape)


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# --- reference (CPU) --------------------------------------------------------------------------

@pytest.mark.parametrize("name,attrs", UNET + ODD)
def test_reference_matches_torch(name, attrs):
    x = rnd((2, 3, 8, 7), 0)
    g = rnd(out_shape(name, x.shape, **attrs), 1)
    ty, tdx = torch_both(name, x, g, **attrs)
    y = getattr(ref, name + "_forward")(x, **attrs)
    dx, = getattr(ref, name + "_backward")(g, y, x, **attrs)
    assert y.shape == ty.shape and dx.shape == x.shape
    assert rel(y, ty) < 1e-12 and rel(dx, tdx) < 1e-12


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reference_keeps_dtype(dtype):
    x = rnd((1, 2, 5, 5), 0).astype(dtype)
    for name, attrs in UNET:
        y = getattr(ref, name + "_forward")(x, **attrs)
        dx, = getattr(ref, name + "_backward")(np.ones(y.shape, dtype), y, x, **attrs)
        assert y.dtype == x.dtype and dx.dtype == x.dtype


def test_reference_max_ties_first_in_scan_order():
    # overlapping 3x3 windows over a constant image: every window sends its gradient
    # to its first real pixel (row-major scan), exactly as torch
    x = np.ones((1, 1, 5, 6))
    attrs = dict(window=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1))
    g = np.arange(30, dtype=np.float64).reshape(1, 1, 5, 6)
    ty, tdx = torch_both("maxpool2d", x, g, **attrs)
    # torch's own symmetric padding also starts the scan at the first real pixel
    tx = torch.ones((1, 1, 5, 6), dtype=torch.float64, requires_grad=True)
    F.max_pool2d(tx, 3, 1, padding=1).backward(torch.from_numpy(g))
    dx, = ref.maxpool2d_backward(g, ty, x, **attrs)
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    # F.pad with -inf then pool: same on finite data (the padding never ties)
    np.testing.assert_array_equal(dx, tdx)


def test_reference_all_minus_inf_window_goes_to_first_real_pixel():
    x = np.full((1, 1, 3, 3), -np.inf)
    g = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    tx = torch.from_numpy(x.copy()).requires_grad_()
    F.max_pool2d(tx, 3, 1, padding=1).backward(torch.from_numpy(g))
    y = ref.maxpool2d_forward(x, (3, 3), (1, 1), (1, 1, 1, 1))
    assert np.all(y == -np.inf)
    dx, = ref.maxpool2d_backward(g, y, x, (3, 3), (1, 1), (1, 1, 1, 1))
    np.testing.assert_array_equal(dx, tx.grad.numpy())


def test_reference_nan_propagates():
    x = rnd((1, 1, 4, 4), 0)
    x[0, 0, 1, 2] = np.nan
    y = ref.maxpool2d_forward(x, (2, 2), (2, 2), (0, 0, 0, 0))
    ty = F.max_pool2d(torch.from_numpy(x), 2, 2).numpy()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ty))
    dx, = ref.maxpool2d_backward(np.ones(y.shape), y, x, (2, 2), (2, 2), (0, 0, 0, 0))
    assert dx[0, 0, 1, 2] == 1 and dx[0, 0, :2, 2:].sum() == 1


@pytest.mark.parametrize("name,attrs", UNET)
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_reference_empty(name, attrs, shape):
    x = np.zeros(shape)
    y = getattr(ref, name + "_forward")(x, **attrs)
    assert y.shape == out_shape(name, shape, **attrs)
    dx, = getattr(ref, name + "_backward")(np.zeros(y.shape), y, x, **attrs)
    assert dx.shape == shape


@pytest.mark.parametrize("attrs,match", [
    (dict(window=(2, 2), stride=(2, 2), padding=(2, 0, 0, 0)), "smaller than the window"),
    (dict(window=(5, 2), stride=(1, 1), padding=(0, 0, 0, 0)), "larger than the padded input"),
    (dict(window=(0, 2), stride=(1, 1), padding=(0, 0, 0, 0)), "window"),
    (dict(window=(2, 2), stride=(1, 0), padding=(0, 0, 0, 0)), "stride"),
    (dict(window=(2, 2), stride=(1, 1), padding=(0, 0, 0)), "padding"),
])
def test_reference_errors(attrs, match):
    with pytest.raises(ShapeError, match=match):
        ref.maxpool2d_forward(np.zeros((1, 1, 3, 3)), **attrs)
    with pytest.raises(ShapeError, match=match):
        ref.meanpool2d_forward(np.zeros((1, 1, 3, 3)), **attrs)


def test_reference_errors_rank_and_scale():
    with pytest.raises(ShapeError, match="NCHW"):
        ref.maxpool2d_forward(np.zeros((3, 3)), (2, 2), (2, 2), (0, 0, 0, 0))
    with pytest.raises(ShapeError, match="scale"):
        ref.upsample_bilinear2d_forward(np.zeros((1, 1, 3, 3)), (0, 2))


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
    y = getattr(kp, name + "_forward")(xt, **attrs)
    dx, = getattr(kp, name + "_backward")(gt, y, xt, **attrs)
    assert tuple(y.shape) == ty.shape and y.dtype == xt.dtype and y.is_contiguous()
    assert tuple(dx.shape) == x.shape and dx.dtype == xt.dtype and dx.is_contiguous()
    assert rel(_np(y), ty) <= TOL[dtype], (name, attrs, dtype, "forward")
    assert rel(_np(dx), tdx) <= TOL[dtype], (name, attrs, dtype, "backward")
    return y, dx


@needs_kernels
@pytest.mark.parametrize("name,attrs,dtype",
                         [(n, a, d) for n, a in UNET for d in ("float32", "float64", "float16", "bfloat16")]
                         + [(n, a, "float16") for n, a in ODD])
def test_kernel_matches_torch(name, attrs, dtype):
    x = rnd((2, 3, 8, 7), 0)
    g = rnd(out_shape(name, x.shape, **attrs), 1)
    _kernel_vs_torch(name, attrs, x, g, dtype)


@needs_kernels
@pytest.mark.parametrize("name,attrs", UNET + ODD)
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
@pytest.mark.parametrize("attrs", [dict(window=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1)),
                                   dict(window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0)),
                                   dict(window=(3, 2), stride=(2, 1), padding=(0, 2, 1, 1))])
def test_kernel_max_ties(attrs):
    x = np.random.default_rng(4).choice([-1.0, 0.0, 1.0], size=(2, 2, 7, 6))
    x[0, 0] = 1.0                                  # one image entirely tied
    g = np.random.default_rng(5).integers(-4, 5, out_shape("maxpool2d", x.shape, **attrs)) * 1.0
    y, dx = _kernel_vs_torch("maxpool2d", attrs, x, g, "float32")
    rdx, = ref.maxpool2d_backward(g, _np(y), x, **attrs)
    np.testing.assert_array_equal(_np(dx), rdx)     # integer gradients: exact


@needs_kernels
def test_kernel_all_minus_inf_and_nan():
    x = np.full((1, 1, 3, 3), -np.inf)
    g = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    attrs = dict(window=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1))
    xt = _tensor(x, "float32")
    y = kp.maxpool2d_forward(xt, **attrs)
    dx, = kp.maxpool2d_backward(_tensor(g, "float32"), y, xt, **attrs)
    np.testing.assert_array_equal(_np(dx), ref.maxpool2d_backward(g, _np(y), x, **attrs)[0])
    x = rnd((1, 1, 4, 4), 0)
    x[0, 0, 1, 2] = np.nan
    attrs = dict(window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))
    xt = _tensor(x, "float32")
    y = kp.maxpool2d_forward(xt, **attrs)
    np.testing.assert_array_equal(np.isnan(_np(y)), np.isnan(ref.maxpool2d_forward(x, **attrs)))
    dx, = kp.maxpool2d_backward(_tensor(np.ones((1, 1, 2, 2)), "float32"), y, xt, **attrs)
    np.testing.assert_array_equal(_np(dx), ref.maxpool2d_backward(np.ones((1, 1, 2, 2)), None, x, **attrs)[0])


@needs_kernels
@pytest.mark.parametrize("name,attrs", UNET)
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_kernel_empty(name, attrs, shape):
    xt = _tensor(np.zeros(shape), "float32")
    y = getattr(kp, name + "_forward")(xt, **attrs)
    assert tuple(y.shape) == out_shape(name, shape, **attrs)
    dx, = getattr(kp, name + "_backward")(y, y, xt, **attrs)
    assert tuple(dx.shape) == shape


@needs_kernels
def test_kernel_errors():
    xt = _tensor(np.zeros((1, 1, 3, 3)), "float32")
    with pytest.raises(ShapeError, match="smaller than the window"):
        kp.maxpool2d_forward(xt, (2, 2), (2, 2), (0, 0, 2, 0))
    with pytest.raises(ShapeError, match="NCHW"):
        kp.upsample_nearest2d_forward(xt[0], (2, 2))
    with pytest.raises(ShapeError, match="gradient"):
        kp.meanpool2d_backward(xt, None, xt, (2, 2), (2, 2), (0, 0, 0, 0))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    x = rnd((2, 3, 7, 9), 2)
    xt = _tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), "float16").permute(0, 3, 1, 2)
    assert not xt.is_contiguous()

    def run():
        for name, attrs in UNET:
            y = getattr(kp, name + "_forward")(xt, **attrs)
            getattr(kp, name + "_backward")(y, y, xt, **attrs)

    assert_torch_only_moves_memory(run, "the pool kernels")
