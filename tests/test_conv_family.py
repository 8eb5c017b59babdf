"""conv family: fixed configurations against torch, beyond the property suite.

Forward and both gradients of conv2d and conv_transpose2d, reference (float64)
and kernels (float32, float16, float64; the interpreter without a GPU), on
named configurations: 'same' padding, stride 2, groups 2, dilation 2,
asymmetric padding, output_padding, an empty batch, transposed/strided
inputs. Also: the asymmetric-padding oracle of conv_transpose2d equals torch's
own padding where that is symmetric, error messages, and torch doing nothing
but allocate and make views in the kernels.
"""
import numpy as np
import pytest

from triflux import backend
from triflux.errors import DTypeError, ShapeError
from triflux.reference import conv as ref

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from triflux.testing import conv as oracle  # noqa: E402

CONV2D = {
    "same3x3": ((2, 3, 7, 6), (4, 3, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "same5x3": ((1, 2, 6, 5), (3, 2, 5, 3), dict(stride=(1, 1), padding=(2, 2, 1, 1), dilation=(1, 1), groups=1)),
    "stride2": ((2, 2, 9, 8), (3, 2, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "groups2": ((2, 4, 5, 6), (6, 2, 3, 2), dict(stride=(1, 2), padding=(1, 0, 0, 1), dilation=(1, 1), groups=2)),
    "dilation2": ((1, 2, 9, 9), (2, 2, 3, 3), dict(stride=(1, 1), padding=(2, 2, 2, 2), dilation=(2, 2), groups=1)),
    "asymmetric": ((2, 1, 5, 7), (2, 1, 2, 3), dict(stride=(2, 1), padding=(0, 2, 1, 0), dilation=(2, 1), groups=1)),
    "empty_batch": ((0, 2, 5, 5), (2, 2, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "1x1": ((2, 3, 4, 4), (5, 3, 1, 1), dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)),
}

CONV_T = {
    "same3x3": ((2, 3, 5, 6), (3, 4, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), output_padding=(0, 0), dilation=(1, 1), groups=1)),
    "stride2_up": ((2, 2, 4, 5), (2, 3, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), output_padding=(1, 1), dilation=(1, 1), groups=1)),
    "stride2_k2": ((1, 2, 4, 4), (2, 2, 2, 2), dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0), dilation=(1, 1), groups=1)),
    "groups2": ((2, 4, 4, 3), (4, 1, 3, 2), dict(stride=(2, 1), padding=(1, 0, 0, 1), output_padding=(1, 0), dilation=(1, 1), groups=2)),
    "dilation2": ((1, 2, 4, 4), (2, 2, 3, 3), dict(stride=(1, 2), padding=(2, 1, 0, 2), output_padding=(0, 1), dilation=(2, 2), groups=1)),
    "empty_batch": ((0, 2, 4, 4), (2, 3, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), output_padding=(1, 1), dilation=(1, 1), groups=1)),
}

OPS = {"conv2d": (CONV2D, oracle.conv2d_torch), "conv_transpose2d": (CONV_T, oracle.conv_transpose2d_torch)}
CASES = [(op, name) for op, (table, _) in OPS.items() for name in table]


def _rand(shape, seed):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def _torch_all(op, x, w, g, attrs, dtype=torch.float64):
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    wt = torch.tensor(w, dtype=dtype, requires_grad=True)
    y = OPS[op][1](xt, wt, **attrs)
    y.backward(torch.tensor(g, dtype=dtype))
    return y.detach().double().numpy(), xt.grad.double().numpy(), wt.grad.double().numpy()


def _problem(op, name):
    table = OPS[op][0]
    xs, ws, attrs = table[name]
    x, w = _rand(xs, 1), _rand(ws, 2)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    g = _rand(y.shape, 3)
    return x, w, g, attrs


def _close(actual, expected, tol, what):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.size == 0:
        return
    err = np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("op,name", CASES)
def test_reference_matches_torch(op, name):
    x, w, g, attrs = _problem(op, name)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    dx, dw = getattr(ref, f"{op}_backward")(g, y, x, w, **attrs)
    ty, tdx, tdw = _torch_all(op, x, w, g, attrs)
    for a, e, what in ((y, ty, "y"), (dx, tdx, "dx"), (dw, tdw, "dw")):
        _close(a, e, 1e-12, f"{op} {name} reference {what}")
        assert np.asarray(a).dtype == np.float64


def test_reference_keeps_dtype():
    x, w, g, attrs = _problem("conv2d", "groups2")
    for dt in (np.float32, np.float16):
        y = ref.conv2d_forward(x.astype(dt), w.astype(dt), **attrs)
        dx, dw = ref.conv2d_backward(g.astype(dt), y, x.astype(dt), w.astype(dt), **attrs)
        assert y.dtype == dx.dtype == dw.dtype == dt


def test_transpose_oracle_matches_torch_symmetric_padding():
    """The F.pad-cropping oracle equals torch's own padding/output_padding."""
    x, w = _rand((2, 2, 4, 5), 4), _rand((2, 3, 3, 3), 5)
    for s, p, op, d in (((2, 2), 1, (1, 1), (1, 1)), ((2, 1), 2, (1, 0), (2, 1)), ((1, 1), 1, (0, 0), (1, 1))):
        xt, wt = torch.tensor(x), torch.tensor(w)
        mine = oracle.conv_transpose2d_torch(xt, wt, stride=s, padding=(p, p, p, p), output_padding=op,
                                             dilation=d)
        theirs = F.conv_transpose2d(xt, wt, stride=s, padding=p, output_padding=op, dilation=d)
        assert torch.equal(mine, theirs)


def test_reference_errors():
    x, w = np.zeros((1, 4, 5, 5)), np.zeros((2, 3, 3, 3))
    with pytest.raises(ShapeError, match="groups=3"):
        ref.conv2d_forward(x, w, groups=3)
    with pytest.raises(ShapeError, match="input channels"):
        ref.conv2d_forward(x, w)
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        ref.conv2d_forward(np.zeros((1, 3, 2, 2)), np.zeros((2, 3, 3, 3)))
    with pytest.raises(DTypeError):
        ref.conv2d_forward(x.astype(np.float32), np.zeros((2, 4, 3, 3)))
    with pytest.raises(ShapeError, match="output_padding"):
        ref.conv_transpose2d_forward(np.zeros((1, 2, 3, 3)), np.zeros((2, 2, 3, 3)), stride=(1, 1),
                                     output_padding=(1, 0))


# --- kernels -------------------------------------------------------------------------------

needs_kernels = pytest.mark.skipif(not backend.functional("CUDA"),
                                   reason="no functional GPU backend (set TRITON_INTERPRET=1)")


def _kernels():
    from triflux.triton_kernels import common
    from triflux.triton_kernels import conv as kc
    return kc, ("cpu" if common.INTERPRET else "cuda")


def _layout(t, how):
    if how == "transposed":
        return t.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
    if how == "strided":
        wide = torch.empty(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("op,name", CASES)
def test_kernel_matches_torch(op, name, dtype):
    kc, dev = _kernels()
    x, w, g, attrs = _problem(op, name)
    # round the inputs to the dtype; the float64 torch result on those values is exact enough
    xr, wr, gr = (torch.tensor(a).to(dtype).double().numpy() for a in (x, w, g))
    ty, tdx, tdw = _torch_all(op, xr, wr, gr, attrs)
    layouts = {"same3x3": ("transposed", "strided"), "groups2": ("strided", "transposed")}.get(name, ("contiguous",) * 2)
    xt = _layout(torch.tensor(xr).to(dtype).to(dev), layouts[0])
    wt = _layout(torch.tensor(wr).to(dtype).to(dev), layouts[1])
    gt = _layout(torch.tensor(gr).to(dtype).to(dev), layouts[0])
    y = getattr(kc, f"{op}_forward")(xt, wt, **attrs)
    dx, dw = getattr(kc, f"{op}_backward")(gt, y, xt, wt, **attrs)
    for a, e, ref_t, what in ((y, ty, xt, "y"), (dx, tdx, xt, "dx"), (dw, tdw, wt, "dw")):
        assert a.dtype == dtype and a.is_contiguous()
        _close(a.detach().to("cpu").double().numpy(), e, TOL[dtype], f"{op} {name} {dtype} kernel {what}")


@needs_kernels
def test_kernel_errors():
    kc, dev = _kernels()
    x = torch.zeros((1, 4, 5, 5), device=dev)
    with pytest.raises(ShapeError, match="groups=3"):
        kc.conv2d_forward(x, torch.zeros((2, 3, 3, 3), device=dev), groups=3)
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        kc.conv2d_forward(torch.zeros((1, 4, 2, 2), device=dev), torch.zeros((2, 4, 3, 3), device=dev))
    with pytest.raises(DTypeError):
        kc.conv2d_forward(x, torch.zeros((2, 4, 3, 3), dtype=torch.float64, device=dev))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    from torch_ops import assert_torch_only_moves_memory
    kc, dev = _kernels()
    x = torch.tensor(_rand((2, 4, 5, 6), 0), dtype=torch.float32).to(dev)
    w = torch.tensor(_rand((4, 2, 3, 3), 1), dtype=torch.float32).to(dev)
    a = dict(stride=(2, 1), padding=(1, 1, 0, 2), dilation=(1, 1), groups=2)
    at = dict(stride=(2, 1), padding=(1, 1, 0, 2), output_padding=(1, 0), dilation=(1, 1), groups=2)

    def work():
        y = kc.conv2d_forward(x.transpose(2, 3).transpose(2, 3), w, **a)
        kc.conv2d_backward(y, y, x, w, **a)
        z = kc.conv_transpose2d_forward(x, w, **at)
        kc.conv_transpose2d_backward(z, z, x, w, **at)
    ops = assert_torch_only_moves_memory(work, "the conv kernels")
    assert "empty.memory_format" in ops
