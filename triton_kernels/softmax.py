"""Softmax family, Triton kernels (forward and backward).

Every function works on "rows": the 1-d slices of ``x`` along ``axis``. A
row is read through ``x``'s strides (its position from the other axes via
``nd_offset``, its elements ``stride(axis)`` apart), so any axis of any view
works without a copy. One fused kernel per direction:

* forward (MODE: SOFTMAX, LOGSOFTMAX or LOGSUMEXP): a row that fits one
  chunk of BLOCK_SIZE_L elements is loaded once; a longer row is swept with an online
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
maximum propagates NaN on a GPU too: :func:`numerics.max_along`). Arithmetic is in
float32 (float64 for float64).
"""
import triton
import triton.language as tl

from . import copy, indexing, launch, numerics
from .numerics import store_value
from ..errors import DTypeError
from ..specs.softmax import softmax_spec

#: the primitive a kernel computes (constexpr MODE)
SOFTMAX = tl.constexpr(0)
LOGSOFTMAX = tl.constexpr(1)
LOGSUMEXP = tl.constexpr(2)
_MODES = {"softmax": SOFTMAX, "logsoftmax": LOGSOFTMAX, "logsumexp": LOGSUMEXP}

#: longest row chunk held at once; longer rows take the two-sweep path
INTERP_MAX_BLOCK_L = 1 << 14
GPU_MAX_BLOCK_L = 4096


@triton.jit
def _shift(m, MODE: tl.constexpr):
    """What a row is shifted by before exp: its maximum m, but 0 where m is
    -inf (exp(-inf - 0) = 0, not exp(NaN)); for LOGSUMEXP also 0 where m is
    +inf, so that the row's result is log(inf) = inf, as torch's."""
    if MODE == LOGSUMEXP:
        return tl.where((m == float("inf")) | (m == -float("inf")), 0.0, m)
    else:
        return tl.where(m == -float("inf"), 0.0, m)


@triton.jit
def _online_max_sum(x, x_rows, cols, L, x_axis_stride, MODE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                    BLOCK_SIZE_ROWS: tl.constexpr, BLOCK_SIZE_L: tl.constexpr):
    """One sweep over the rows in chunks of BLOCK_SIZE_L: the running maximum
    m, its shift (see _shift) and the sum s of exp(x - shift), rescaled by
    exp(shift_old - shift_new) whenever the shift changes (s stays 0 while the
    row has been all -inf: 0 * exp(0 - shift_new) could be 0 * inf). Returns (shift, s)."""
    m = tl.full((BLOCK_SIZE_ROWS,), -float("inf"), COMPUTE_TYPE)
    shift = tl.zeros((BLOCK_SIZE_ROWS,), COMPUTE_TYPE)
    s = tl.zeros((BLOCK_SIZE_ROWS,), COMPUTE_TYPE)
    for start in range(0, L, BLOCK_SIZE_L):
        c = start + cols
        v = tl.load(x + x_rows + c * x_axis_stride, mask=c < L, other=-float("inf")).to(COMPUTE_TYPE)
        m_new = numerics.maximum(m, numerics.max_along(v, 1))
        new_shift = _shift(m_new, MODE)
        rescaled = tl.where(m == -float("inf"), 0.0, s * tl.exp(shift - new_shift))
        s = rescaled + tl.sum(tl.exp(v - new_shift[:, None]), axis=1)
        m = m_new
        shift = new_shift
    return shift, s


@triton.jit
def _softmax_forward_kernel(x, y, R, L,
                            outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                            x_outer_stride0, x_outer_stride1, x_outer_stride2,
                            x_outer_stride3, x_outer_stride4, x_outer_stride5,
                            y_outer_stride0, y_outer_stride1, y_outer_stride2,
                            y_outer_stride3, y_outer_stride4, y_outer_stride5,
                            x_axis_stride, y_axis_stride,
                            MODE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                            BLOCK_SIZE_ROWS: tl.constexpr, BLOCK_SIZE_L: tl.constexpr,
                            SINGLE_CHUNK: tl.constexpr, INTERP: tl.constexpr):
    """BLOCK_SIZE_ROWS rows per program: softmax, logsoftmax or logsumexp
    (MODE) of x's R rows of length L into y (logsumexp: one value per row).
    A row's position comes from the outer (merged) axes, its entries are
    ``*_axis_stride`` apart."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_ROWS + tl.arange(0, BLOCK_SIZE_ROWS)
    rows_mask = rows < R
    rows = tl.minimum(rows, R - 1)               # padding rows reread the last row
    x_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                x_outer_stride0, x_outer_stride1, x_outer_stride2,
                                x_outer_stride3, x_outer_stride4, x_outer_stride5)[:, None]
    y_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                y_outer_stride0, y_outer_stride1, y_outer_stride2,
                                y_outer_stride3, y_outer_stride4, y_outer_stride5)
    cols = tl.arange(0, BLOCK_SIZE_L).to(tl.int64)[None, :]

    if SINGLE_CHUNK:
        cols_mask = cols < L
        v = tl.load(x + x_rows + cols * x_axis_stride, mask=cols_mask, other=-float("inf")).to(COMPUTE_TYPE)
        m = _shift(numerics.max_along(v, 1), MODE)
        e = tl.exp(v - m[:, None])
        s = tl.sum(e, axis=1)
        if MODE == LOGSUMEXP:
            tl.store(y + y_rows, store_value(m + tl.log(s), y.dtype.element_ty, INTERP), mask=rows_mask)
        else:
            if MODE == SOFTMAX:
                out = e / s[:, None]
            else:
                out = (v - m[:, None]) - tl.log(s)[:, None]
            tl.store(y + y_rows[:, None] + cols * y_axis_stride, store_value(out, y.dtype.element_ty, INTERP),
                     mask=rows_mask[:, None] & cols_mask)
    else:
        m, s = _online_max_sum(x, x_rows, cols, L, x_axis_stride, MODE, COMPUTE_TYPE, BLOCK_SIZE_ROWS, BLOCK_SIZE_L)
        log_s = tl.log(s)
        if MODE == LOGSUMEXP:
            tl.store(y + y_rows, store_value(m + log_s, y.dtype.element_ty, INTERP), mask=rows_mask)
        else:
            # sweep 2: normalise
            for start in range(0, L, BLOCK_SIZE_L):
                c = start + cols
                cols_mask = c < L
                v = tl.load(x + x_rows + c * x_axis_stride, mask=cols_mask, other=-float("inf")).to(COMPUTE_TYPE)
                if MODE == SOFTMAX:
                    out = tl.exp(v - m[:, None]) / s[:, None]
                else:
                    out = (v - m[:, None]) - log_s[:, None]
                tl.store(y + y_rows[:, None] + c * y_axis_stride, store_value(out, y.dtype.element_ty, INTERP),
                         mask=rows_mask[:, None] & cols_mask)


@triton.jit
def _softmax_backward_kernel(grad, y, x, dx, R, L,
                             outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                             grad_outer_stride0, grad_outer_stride1, grad_outer_stride2,
                             grad_outer_stride3, grad_outer_stride4, grad_outer_stride5,
                             y_outer_stride0, y_outer_stride1, y_outer_stride2,
                             y_outer_stride3, y_outer_stride4, y_outer_stride5,
                             x_outer_stride0, x_outer_stride1, x_outer_stride2,
                             x_outer_stride3, x_outer_stride4, x_outer_stride5,
                             dx_outer_stride0, dx_outer_stride1, dx_outer_stride2,
                             dx_outer_stride3, dx_outer_stride4, dx_outer_stride5,
                             grad_axis_stride, y_axis_stride, x_axis_stride, dx_axis_stride,
                             MODE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                             BLOCK_SIZE_ROWS: tl.constexpr, BLOCK_SIZE_L: tl.constexpr,
                             SINGLE_CHUNK: tl.constexpr, INTERP: tl.constexpr):
    """BLOCK_SIZE_ROWS rows per program: dx from the output gradient, the
    forward output y and the input x (softmax and logsoftmax use grad and y;
    logsumexp grad and x)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_ROWS + tl.arange(0, BLOCK_SIZE_ROWS)
    rows_mask = rows < R
    rows = tl.minimum(rows, R - 1)
    grad_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                   grad_outer_stride0, grad_outer_stride1, grad_outer_stride2,
                                   grad_outer_stride3, grad_outer_stride4, grad_outer_stride5)[:, None]
    dx_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                 dx_outer_stride0, dx_outer_stride1, dx_outer_stride2,
                                 dx_outer_stride3, dx_outer_stride4, dx_outer_stride5)[:, None]
    cols = tl.arange(0, BLOCK_SIZE_L).to(tl.int64)[None, :]

    if MODE == LOGSUMEXP:
        # logsumexp: dx = g * exp(x - y), g and y one value per row. x - y is
        # recomputed as (x - m) - log(s) rather than read: the stored y is off
        # by up to half an ulp of |y| (5e-4 at |y| = 1e4 in float32, 32 in
        # bfloat16), and exp(x - y) would turn that into a relative error as big
        x_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                    x_outer_stride0, x_outer_stride1, x_outer_stride2,
                                    x_outer_stride3, x_outer_stride4, x_outer_stride5)[:, None]
        g = tl.load(grad + grad_rows).to(COMPUTE_TYPE)
        m, s = _online_max_sum(x, x_rows, cols, L, x_axis_stride, MODE, COMPUTE_TYPE, BLOCK_SIZE_ROWS, BLOCK_SIZE_L)
        m = m[:, None]
        log_s = tl.log(s)[:, None]
        for start in range(0, L, BLOCK_SIZE_L):
            c = start + cols
            cols_mask = c < L
            v = tl.load(x + x_rows + c * x_axis_stride, mask=cols_mask, other=-float("inf")).to(COMPUTE_TYPE)
            out = g * tl.exp((v - m) - log_s)
            tl.store(dx + dx_rows + c * dx_axis_stride, store_value(out, dx.dtype.element_ty, INTERP),
                     mask=rows_mask[:, None] & cols_mask)
    else:
        y_rows = indexing.nd_offset(rows, outer_size1, outer_size2, outer_size3, outer_size4, outer_size5,
                                    y_outer_stride0, y_outer_stride1, y_outer_stride2,
                                    y_outer_stride3, y_outer_stride4, y_outer_stride5)[:, None]
        if SINGLE_CHUNK:
            cols_mask = cols < L
            g = tl.load(grad + grad_rows + cols * grad_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
            yv = tl.load(y + y_rows + cols * y_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
            if MODE == SOFTMAX:
                out = yv * (g - tl.sum(g * yv, axis=1)[:, None])
            else:
                out = g - tl.exp(yv) * tl.sum(g, axis=1)[:, None]
            tl.store(dx + dx_rows + cols * dx_axis_stride, store_value(out, dx.dtype.element_ty, INTERP),
                     mask=rows_mask[:, None] & cols_mask)
        else:
            # sweep 1: the row sum
            acc = tl.zeros((BLOCK_SIZE_ROWS,), COMPUTE_TYPE)
            for start in range(0, L, BLOCK_SIZE_L):
                c = start + cols
                cols_mask = c < L
                g = tl.load(grad + grad_rows + c * grad_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
                if MODE == SOFTMAX:
                    yv = tl.load(y + y_rows + c * y_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
                    acc += tl.sum(g * yv, axis=1)
                else:
                    acc += tl.sum(g, axis=1)
            # sweep 2: dx
            for start in range(0, L, BLOCK_SIZE_L):
                c = start + cols
                cols_mask = c < L
                g = tl.load(grad + grad_rows + c * grad_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
                yv = tl.load(y + y_rows + c * y_axis_stride, mask=cols_mask, other=0.0).to(COMPUTE_TYPE)
                if MODE == SOFTMAX:
                    out = yv * (g - acc[:, None])
                else:
                    out = g - tl.exp(yv) * acc[:, None]
                tl.store(dx + dx_rows + c * dx_axis_stride, store_value(out, dx.dtype.element_ty, INTERP),
                         mask=rows_mask[:, None] & cols_mask)


# --- host side -------------------------------------------------------------------------

def _spec(primitive, x, axis, keepdims=False):
    """The softmax spec of the tensor ``x``; the kernels also need floating inputs."""
    spec = softmax_spec(primitive, x.shape, x.dtype, axis, keepdims)
    if not x.dtype.is_floating_point:
        raise DTypeError(f"softmax/logsoftmax/logsumexp need floating inputs, got {x.dtype}")
    return spec


def _row_strides(t, axis, reduced=False, keepdims=True):
    """(strides of the non-``axis`` axes, stride along ``axis``) of ``t``.
    A ``reduced`` tensor (logsumexp's output or its gradient) has one value
    per row: stride 0 along the axis, and no axis at all unless ``keepdims``."""
    if reduced and not keepdims:
        return list(t.stride()), 0
    st = [t.stride(i) for i in range(t.dim()) if i != axis]
    return st, (0 if reduced else t.stride(axis))


def _blocks(R, L):
    """(BLOCK_SIZE_ROWS, BLOCK_SIZE_L, single chunk?, num_warps), by hand."""
    p2 = launch.next_pow2
    if launch.INTERPRET:
        bl = min(p2(L), INTERP_MAX_BLOCK_L)
        br = max(1, min(p2(R), (1 << 16) // bl))
        warps = 4
    else:
        bl = min(p2(L), GPU_MAX_BLOCK_L)
        br = max(1, min(p2(R), 1024 // bl))
        warps = 4 if br * bl <= 2048 else 8
    return br, bl, L <= bl, warps


def _forward(primitive, x, axis, keepdims=True):
    spec = _spec(primitive, x, axis, keepdims)
    axis, R, L = spec.axis, spec.rows, spec.row_length
    reduced = primitive == "logsumexp"
    if reduced and L == 0:
        return copy.full(spec.out_shape, float("-inf"), x.dtype, x.device)
    y = launch.empty(spec.out_shape, x.dtype, x.device)
    if R == 0 or L == 0:
        return y
    x_strides, x_axis_stride = _row_strides(x, axis)
    y_strides, y_axis_stride = _row_strides(y, axis, reduced, keepdims)
    dims, (x_strides, y_strides) = indexing.merge_dims(spec.outer_shape, x_strides, y_strides)
    br, bl, single, warps = _blocks(R, L)
    launch.launch(_softmax_forward_kernel, (launch.cdiv(R, br),), x, y, R, L, *dims[1:], *x_strides, *y_strides,
                  x_axis_stride, y_axis_stride, MODE=_MODES[primitive].value,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  BLOCK_SIZE_ROWS=br, BLOCK_SIZE_L=bl, SINGLE_CHUNK=single, INTERP=launch.INTERPRET,
                  num_warps=warps)
    return y


def _backward(primitive, grad, out, x, axis, keepdims=True):
    spec = _spec(primitive, x, axis, keepdims)
    axis, R, L = spec.axis, spec.rows, spec.row_length
    dx = launch.empty(x.shape, x.dtype, x.device)
    if R == 0 or L == 0:
        return (dx,)
    reduced = primitive == "logsumexp"
    grad_strides, grad_axis_stride = _row_strides(grad, axis, reduced, keepdims)
    y_strides, y_axis_stride = _row_strides(out, axis, reduced, keepdims)
    x_strides, x_axis_stride = _row_strides(x, axis)
    dx_strides, dx_axis_stride = _row_strides(dx, axis)
    dims, (grad_strides, y_strides, x_strides, dx_strides) = indexing.merge_dims(
        spec.outer_shape, grad_strides, y_strides, x_strides, dx_strides)
    br, bl, single, warps = _blocks(R, L)
    launch.launch(_softmax_backward_kernel, (launch.cdiv(R, br),), grad, out, x, dx, R, L,
                  *dims[1:], *grad_strides, *y_strides, *x_strides, *dx_strides,
                  grad_axis_stride, y_axis_stride, x_axis_stride, dx_axis_stride,
                  MODE=_MODES[primitive].value, COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  BLOCK_SIZE_ROWS=br, BLOCK_SIZE_L=bl, SINGLE_CHUNK=single, INTERP=launch.INTERPRET,
                  num_warps=warps)
    return (dx,)


def softmax_forward(x, axis):
    """y_i = exp(x_i - m) / sum_j exp(x_j - m), m = max_j x_j, along ``axis``."""
    return _forward("softmax", x, axis)


def softmax_backward(grad, out, x, axis):
    """dx = y * (g - sum_j g_j y_j), y = softmax(x)."""
    return _backward("softmax", grad, out, x, axis)


def logsoftmax_forward(x, axis):
    """y_i = x_i - m - log(sum_j exp(x_j - m))."""
    return _forward("logsoftmax", x, axis)


def logsoftmax_backward(grad, out, x, axis):
    """dx = g - exp(y) * sum_j g_j, y = logsoftmax(x)."""
    return _backward("logsoftmax", grad, out, x, axis)


def logsumexp_forward(x, axis, keepdims=False):
    """y = m + log(sum_j exp(x_j - m)) (an empty row gives -inf)."""
    return _forward("logsumexp", x, axis, keepdims)


def logsumexp_backward(grad, out, x, axis, keepdims=False):
    """dx_i = g * exp(x_i - y), g and y broadcast along ``axis``."""
    return _backward("logsumexp", grad, out, x, axis, keepdims)
