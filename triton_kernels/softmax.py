"""Softmax family, Triton kernels (forward and backward).

Every function works on "rows": the 1-d slices of ``x`` along ``axis``. A
row is read through ``x``'s strides (its position from the other axes via
``nd_offset``, its elements ``stride(axis)`` apart), so any axis of any view
works without a copy. One fused kernel per direction:

* forward (MODE 0 softmax, 1 logsoftmax, 2 logsumexp): a row that fits one
  chunk of BL elements is loaded once; a longer row is swept with an online
  maximum and rescaled sum (``s = s * exp(m_old - m_new) + sum(exp(x - m_new))``),
  then a second sweep writes the normalised values;
* backward: ``sum(g * y)`` (softmax) or ``sum(g)`` (logsoftmax) over the row,
  then ``dx``; logsumexp's ``dx = g * exp(x - y)`` recomputes ``x - y`` as
  ``(x - m) - log(s)`` (one more sweep) instead of reading the stored ``y``,
  whose rounding (half an ulp of ``|y|``, large for logits of 1e4) ``exp``
  would amplify.

Stability: the row maximum is subtracted before every ``exp``; ``-inf``
entries (masking) contribute 0; a row that is all ``-inf`` is shifted by 0
instead of ``-inf`` (no ``-inf - -inf``), which gives torch's results: NaN
from softmax/logsoftmax (0/0) and ``-inf`` from logsumexp. A row holding
``+inf`` gives NaN from softmax/logsoftmax (``inf - inf``) and ``+inf`` from
logsumexp (shifted by 0, as torch), and a row holding NaN gives NaN (the row
maximum propagates NaN on a GPU too: :func:`common.max_along`). Arithmetic is in
float32 (float64 for float64).
"""
import triton
import triton.language as tl

from . import common
from .common import store_value
from ..errors import DTypeError, ShapeError

_SOFTMAX, _LOGSOFTMAX, _LOGSUMEXP = 0, 1, 2

#: longest row chunk held at once; longer rows take the two-sweep path
INTERP_MAX_BLOCK_L = 1 << 14
GPU_MAX_BLOCK_L = 4096


@triton.jit
def _shift(m, LSE: tl.constexpr):
    """What a row is shifted by before exp: its maximum m, but 0 where m is
    -inf (exp(-inf - 0) = 0, not exp(NaN)); for logsumexp (LSE) also 0 where m
    is +inf, so that the row's result is log(inf) = inf, as torch's."""
    if LSE:
        return tl.where((m == float("inf")) | (m == -float("inf")), 0.0, m)
    else:
        return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _online_max_sum(x, xr, cols, L, sxl, LSE: tl.constexpr, CT: tl.constexpr, BR: tl.constexpr,
                    BL: tl.constexpr):
    """One sweep over the rows in chunks of BL: the running maximum m, its
    shift (see _shift) and the sum s of exp(x - shift), rescaled by
    exp(shift_old - shift_new) whenever the shift changes (s stays 0 while the
    row has been all -inf: 0 * exp(0 - shift_new) could be 0 * inf). Returns (shift, s)."""
    m = tl.full((BR,), -float("inf"), CT)
    shift = tl.zeros((BR,), CT)
    s = tl.zeros((BR,), CT)
    for start in range(0, L, BL):
        c = start + cols
        v = tl.load(x + xr + c * sxl, mask=c < L, other=-float("inf")).to(CT)
        m_new = common.maximum(m, common.max_along(v, 1))
        new_shift = _shift(m_new, LSE)
        rescaled = tl.where(m == -float("inf"), 0.0, s * tl.exp(shift - new_shift))
        s = rescaled + tl.sum(tl.exp(v - new_shift[:, None]), axis=1)
        m = m_new
        shift = new_shift
    return shift, s


@triton.jit
def _softmax_fwd_kernel(x, y, R, L,
                        D1, D2, D3, D4, D5,
                        X0, X1, X2, X3, X4, X5,
                        Y0, Y1, Y2, Y3, Y4, Y5,
                        sxl, syl,
                        MODE: tl.constexpr, CT: tl.constexpr,
                        BR: tl.constexpr, BL: tl.constexpr, SINGLE: tl.constexpr,
                        INTERP: tl.constexpr):
    """BR rows per program: softmax (MODE 0), logsoftmax (1) or logsumexp (2)
    of x's rows into y (logsumexp: one value per row)."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rmask = rows < R
    rows = tl.minimum(rows, R - 1)               # padding rows reread the last row
    xr = common.nd_offset(rows, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)[:, None]
    yr = common.nd_offset(rows, D1, D2, D3, D4, D5, Y0, Y1, Y2, Y3, Y4, Y5)
    cols = tl.arange(0, BL).to(tl.int64)[None, :]

    if SINGLE:
        cmask = cols < L
        v = tl.load(x + xr + cols * sxl, mask=cmask, other=-float("inf")).to(CT)
        m = _shift(common.max_along(v, 1), MODE == 2)
        e = tl.exp(v - m[:, None])
        s = tl.sum(e, axis=1)
        if MODE == 2:
            tl.store(y + yr, store_value(m + tl.log(s), y.dtype.element_ty, INTERP), mask=rmask)
        else:
            if MODE == 0:
                out = e / s[:, None]
            else:
                out = (v - m[:, None]) - tl.log(s)[:, None]
            tl.store(y + yr[:, None] + cols * syl, store_value(out, y.dtype.element_ty, INTERP),
                     mask=rmask[:, None] & cmask)
    else:
        m, s = _online_max_sum(x, xr, cols, L, sxl, MODE == 2, CT, BR, BL)   # sweep 1
        log_s = tl.log(s)
        if MODE == 2:
            tl.store(y + yr, store_value(m + log_s, y.dtype.element_ty, INTERP), mask=rmask)
        else:
            # sweep 2: normalise
            for start in range(0, L, BL):
                c = start + cols
                cmask = c < L
                v = tl.load(x + xr + c * sxl, mask=cmask, other=-float("inf")).to(CT)
                if MODE == 0:
                    out = tl.exp(v - m[:, None]) / s[:, None]
                else:
                    out = (v - m[:, None]) - log_s[:, None]
                tl.store(y + yr[:, None] + c * syl, store_value(out, y.dtype.element_ty, INTERP),
                         mask=rmask[:, None] & cmask)


@triton.jit
def _softmax_bwd_kernel(g, y, x, dx, R, L,
                        D1, D2, D3, D4, D5,
                        G0, G1, G2, G3, G4, G5,
                        Y0, Y1, Y2, Y3, Y4, Y5,
                        X0, X1, X2, X3, X4, X5,
                        O0, O1, O2, O3, O4, O5,
                        sgl, syl, sxl, sol,
                        MODE: tl.constexpr, CT: tl.constexpr,
                        BR: tl.constexpr, BL: tl.constexpr, SINGLE: tl.constexpr,
                        INTERP: tl.constexpr):
    """BR rows per program: dx from the output gradient g, the forward output
    y and the input x (softmax uses g, y; logsoftmax g, y; logsumexp g, x)."""
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rmask = rows < R
    rows = tl.minimum(rows, R - 1)
    gr = common.nd_offset(rows, D1, D2, D3, D4, D5, G0, G1, G2, G3, G4, G5)[:, None]
    orow = common.nd_offset(rows, D1, D2, D3, D4, D5, O0, O1, O2, O3, O4, O5)[:, None]
    cols = tl.arange(0, BL).to(tl.int64)[None, :]

    if MODE == 2:
        # logsumexp: dx = g * exp(x - y), g and y one value per row. x - y is
        # recomputed as (x - m) - log(s) rather than read: the stored y is off
        # by up to half an ulp of |y| (5e-4 at |y| = 1e4 in float32, 32 in
        # bfloat16), and exp(x - y) would turn that into a relative error as big
        xr = common.nd_offset(rows, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)[:, None]
        gv = tl.load(g + gr).to(CT)
        m, s = _online_max_sum(x, xr, cols, L, sxl, True, CT, BR, BL)
        m = m[:, None]
        log_s = tl.log(s)[:, None]
        for start in range(0, L, BL):
            c = start + cols
            cmask = c < L
            xv = tl.load(x + xr + c * sxl, mask=cmask, other=-float("inf")).to(CT)
            out = gv * tl.exp((xv - m) - log_s)
            tl.store(dx + orow + c * sol, store_value(out, dx.dtype.element_ty, INTERP),
                     mask=rmask[:, None] & cmask)
    else:
        yr = common.nd_offset(rows, D1, D2, D3, D4, D5, Y0, Y1, Y2, Y3, Y4, Y5)[:, None]
        if SINGLE:
            cmask = cols < L
            gv = tl.load(g + gr + cols * sgl, mask=cmask, other=0.0).to(CT)
            yv = tl.load(y + yr + cols * syl, mask=cmask, other=0.0).to(CT)
            if MODE == 0:
                out = yv * (gv - tl.sum(gv * yv, axis=1)[:, None])
            else:
                out = gv - tl.exp(yv) * tl.sum(gv, axis=1)[:, None]
            tl.store(dx + orow + cols * sol, store_value(out, dx.dtype.element_ty, INTERP),
                     mask=rmask[:, None] & cmask)
        else:
            # sweep 1: the row sum
            acc = tl.zeros((BR,), CT)
            for start in range(0, L, BL):
                c = start + cols
                cmask = c < L
                gv = tl.load(g + gr + c * sgl, mask=cmask, other=0.0).to(CT)
                if MODE == 0:
                    yv = tl.load(y + yr + c * syl, mask=cmask, other=0.0).to(CT)
                    acc += tl.sum(gv * yv, axis=1)
                else:
                    acc += tl.sum(gv, axis=1)
            # sweep 2: dx
            for start in range(0, L, BL):
                c = start + cols
                cmask = c < L
                gv = tl.load(g + gr + c * sgl, mask=cmask, other=0.0).to(CT)
                yv = tl.load(y + yr + c * syl, mask=cmask, other=0.0).to(CT)
                if MODE == 0:
                    out = yv * (gv - acc[:, None])
                else:
                    out = gv - tl.exp(yv) * acc[:, None]
                tl.store(dx + orow + c * sol, store_value(out, dx.dtype.element_ty, INTERP),
                         mask=rmask[:, None] & cmask)


# --- host side -------------------------------------------------------------------------

def _axis(x, axis):
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise ShapeError(f"the softmax family works along one axis, got axis={axis}")
        axis = axis[0]
    axis = int(axis)
    nd = x.dim()
    if nd == 0:
        raise ShapeError("the softmax family needs a tensor of at least one dimension")
    if not -nd <= axis < nd:
        raise ShapeError(f"axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"softmax/logsoftmax/logsumexp need floating inputs, got {x.dtype}")
    return axis % nd


def _row_strides(t, axis, reduced=False, keepdims=True):
    """(strides of the non-``axis`` axes, stride along ``axis``) of ``t``.
    A ``reduced`` tensor (logsumexp's output or its gradient) has one value
    per row: stride 0 along the axis, and no axis at all unless ``keepdims``."""
    if reduced and not keepdims:
        return list(t.stride()), 0
    st = [t.stride(i) for i in range(t.dim()) if i != axis]
    return st, (0 if reduced else t.stride(axis))


def _blocks(R, L):
    """(BR rows, BL elements per chunk, single chunk?, num_warps), by hand."""
    p2 = common.next_pow2
    if common.INTERPRET:
        bl = min(p2(L), INTERP_MAX_BLOCK_L)
        br = max(1, min(p2(R), (1 << 16) // bl))
        warps = 4
    else:
        bl = min(p2(L), GPU_MAX_BLOCK_L)
        br = max(1, min(p2(R), 1024 // bl))
        warps = 4 if br * bl <= 2048 else 8
    return br, bl, L <= bl, warps


def _outer(x, axis):
    outer = [s for i, s in enumerate(x.shape) if i != axis]
    R = 1
    for s in outer:
        R *= s
    return outer, R, x.shape[axis]


def _forward(x, axis, mode, keepdims=True):
    axis = _axis(x, axis)
    outer, R, L = _outer(x, axis)
    if mode == _LOGSUMEXP:
        shape = list(x.shape)
        if keepdims:
            shape[axis] = 1
        else:
            del shape[axis]
        if L == 0:
            return common.full(shape, float("-inf"), x.dtype, x.device)
        y = common.empty(shape, x.dtype, x.device)
    else:
        y = common.empty(x.shape, x.dtype, x.device)
    if R == 0 or L == 0:
        return y
    xs, sxl = _row_strides(x, axis)
    ys, syl = _row_strides(y, axis, reduced=mode == _LOGSUMEXP, keepdims=keepdims)
    dims, (xs, ys) = common.merge_dims(outer, xs, ys)
    br, bl, single, warps = _blocks(R, L)
    common.launch(_softmax_fwd_kernel, (common.cdiv(R, br),), x, y, R, L, *dims[1:], *xs, *ys,
                  sxl, syl, MODE=mode, CT=common.compute_type(x.dtype),
                  BR=br, BL=bl, SINGLE=single, INTERP=common.INTERPRET, num_warps=warps)
    return y


def _backward(grad, out, x, axis, mode, keepdims=True):
    axis = _axis(x, axis)
    outer, R, L = _outer(x, axis)
    dx = common.empty(x.shape, x.dtype, x.device)
    if R == 0 or L == 0:
        return (dx,)
    reduced = mode == _LOGSUMEXP
    gs, sgl = _row_strides(grad, axis, reduced, keepdims)
    ys, syl = _row_strides(out, axis, reduced, keepdims)
    xs, sxl = _row_strides(x, axis)
    os_, sol = _row_strides(dx, axis)
    dims, (gs, ys, xs, os_) = common.merge_dims(outer, gs, ys, xs, os_)
    br, bl, single, warps = _blocks(R, L)
    common.launch(_softmax_bwd_kernel, (common.cdiv(R, br),), grad, out, x, dx, R, L,
                  *dims[1:], *gs, *ys, *xs, *os_, sgl, syl, sxl, sol,
                  MODE=mode, CT=common.compute_type(x.dtype),
                  BR=br, BL=bl, SINGLE=single, INTERP=common.INTERPRET, num_warps=warps)
    return (dx,)


def softmax_forward(x, axis):
    """y_i = exp(x_i - m) / sum_j exp(x_j - m), m = max_j x_j, along ``axis``."""
    return _forward(x, axis, _SOFTMAX)


def softmax_backward(grad, out, x, axis):
    """dx = y * (g - sum_j g_j y_j), y = softmax(x)."""
    return _backward(grad, out, x, axis, _SOFTMAX)


def logsoftmax_forward(x, axis):
    """y_i = x_i - m - log(sum_j exp(x_j - m))."""
    return _forward(x, axis, _LOGSOFTMAX)


def logsoftmax_backward(grad, out, x, axis):
    """dx = g - exp(y) * sum_j g_j, y = logsoftmax(x)."""
    return _backward(grad, out, x, axis, _LOGSOFTMAX)


def logsumexp_forward(x, axis, keepdims=False):
    """y = m + log(sum_j exp(x_j - m)) (an empty row gives -inf)."""
    return _forward(x, axis, _LOGSUMEXP, keepdims)


def logsumexp_backward(grad, out, x, axis, keepdims=False):
    """dx_i = g * exp(x_i - y), g and y broadcast along ``axis``."""
    return _backward(grad, out, x, axis, _LOGSUMEXP, keepdims)
