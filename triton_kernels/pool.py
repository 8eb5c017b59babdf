"""Pooling, Triton kernels (forward and backward).

NCHW tensors, read through their strides (any view works without a copy);
outputs are new dense tensors in the input's dtype. Arithmetic is in float32
(float64 for float64). Semantics, attributes, output sizes and error messages
are those of ``triflux.reference.pool`` (its geometry objects are used here
too, so both sides accept and refuse the same attributes).

Every kernel is a "gather": one program computes a tile of BLOCK elements of
its result (flattened row-major), each element looping over the few values it
depends on. No atomics, so every result is deterministic:

* forwards: one element per output pixel, looping over its window (fixed
  windows: statically unrolled, window, stride, padding and dilation are
  constexpr; adaptive windows: loops up to the longest window, a constexpr).
  Maxima scan the window row-major and take the first real pixel, then any
  greater value or any NaN (torch's rule), with comparisons and selects: no
  min/max instruction, so NaN propagates on every GPU as in the interpreter;
* max-pool backwards, in two launches: the forward kernel again, storing each
  window's argmax (the input pixel its maximum came from, ``h * W + w``) in
  an int32 scratch tensor; then per input pixel the sum of the gradients of
  the covering windows whose argmax is that pixel. (Recomputing each covering
  window's argmax per input pixel would cost kh*kw loads per window, and for
  an adaptive window as large as the input, H*W per pixel);
* mean-pool backwards: per input pixel, the sum of g / divisor over the
  windows that cover it.
"""
import torch
import triton
import triton.language as tl

from . import common
from .common import split_nchw, store_value
from ..errors import ShapeError


def _check(x, what):
    if x.dim() != 4:
        raise ShapeError(f"{what} expects an NCHW tensor of 4 dimensions, got shape {tuple(x.shape)}")


def _geometry(x, window, stride, padding, dilation, ceil_mode):
    from ..reference.pool import pool_geometry
    _check(x, "pooling")
    return pool_geometry(tuple(x.shape), window, stride, padding, dilation, ceil_mode)


def _adaptive(x, size):
    from ..reference.pool import adaptive_geometry
    _check(x, "adaptive pooling")
    return adaptive_geometry(tuple(x.shape), size)


def _check_grad(grad, shape):
    if tuple(grad.shape) != tuple(shape):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {tuple(shape)}")


def _block(n):
    return common.block_for(n, 256)


@triton.jit
def _max_step(v, here, ok, best, arg, found):
    """One step of torch's window scan: a real value ``v`` (at input pixel
    ``here``) is taken if it is the first real one, greater than the best so
    far, or NaN (so the last NaN wins and NaN propagates)."""
    take = ok & ((~found) | (v > best) | (v != v))
    best = tl.where(take, v, best)
    arg = tl.where(take, here, arg)
    return best, arg, found | ok


@triton.jit
def _store_max(y, lin, best, arg, mask, WRITE_ARGMAX: tl.constexpr, INTERP: tl.constexpr):
    if WRITE_ARGMAX:
        tl.store(y + lin, arg, mask=mask)
    else:
        tl.store(y + lin, store_value(best, y.dtype.element_ty, INTERP), mask=mask)


# --- fixed windows -------------------------------------------------------------------------------

@triton.jit
def _pool_fwd_kernel(x, y, total, C, H, W, Ho, Wo,
                     sxn, sxc, sxh, sxw,
                     KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                     PT: tl.constexpr, PB: tl.constexpr, PL: tl.constexpr, PR: tl.constexpr,
                     DH: tl.constexpr, DW: tl.constexpr, IS_MAX: tl.constexpr, WRITE_ARGMAX: tl.constexpr,
                     COUNT_PAD: tl.constexpr, CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, i, j = split_nchw(lin, C, Ho, Wo)
    base = n * sxn + c * sxc
    h0 = i * SH - PT                               # the window's top-left tap
    w0 = j * SW - PL
    best = tl.full((BLOCK,), -float("inf"), CT)
    arg = tl.full((BLOCK,), -1, tl.int32)
    found = tl.zeros((BLOCK,), tl.int1)
    acc = tl.zeros((BLOCK,), CT)
    for a in tl.static_range(KH):
        for b in tl.static_range(KW):
            h = h0 + a * DH
            w = w0 + b * DW
            ok = mask & (h >= 0) & (h < H) & (w >= 0) & (w < W)
            v = tl.load(x + base + h * sxh + w * sxw, mask=ok, other=0.0).to(CT)
            if IS_MAX:
                best, arg, found = _max_step(v, (h * W + w).to(tl.int32), ok, best, arg, found)
            else:
                acc += v
    if IS_MAX:
        _store_max(y, lin, best, arg, mask, WRITE_ARGMAX, INTERP)
    else:
        tl.store(y + lin, store_value(acc / _divisor(h0, w0, H, W, KH, KW, PB, PR, COUNT_PAD).to(CT),
                                      y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _divisor(h0, w0, H, W, KH: tl.constexpr, KW: tl.constexpr, PB: tl.constexpr, PR: tl.constexpr,
             COUNT_PAD: tl.constexpr):
    """The taps of the window at (h0, w0) inside the padded input (COUNT_PAD)
    or inside the input (torch's avg_pool2d divisor)."""
    if COUNT_PAD:
        rows = tl.where(h0 + KH < H + PB, h0 + KH, H + PB) - h0
        cols = tl.where(w0 + KW < W + PR, w0 + KW, W + PR) - w0
    else:
        rows = tl.where(h0 + KH < H, h0 + KH, H) - tl.where(h0 > 0, h0, 0)
        cols = tl.where(w0 + KW < W, w0 + KW, W) - tl.where(w0 > 0, w0, 0)
    return rows * cols


@triton.jit
def _pool_bwd_kernel(g, idx, dx, total, C, H, W, Ho, Wo,
                     sgn, sgc, sgh, sgw,
                     KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                     PT: tl.constexpr, PB: tl.constexpr, PL: tl.constexpr, PR: tl.constexpr,
                     DH: tl.constexpr, DW: tl.constexpr, IS_MAX: tl.constexpr,
                     COUNT_PAD: tl.constexpr, CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """dx per input pixel (p, q): over the windows (i, j) that cover it, the
    gradient if the window's argmax ``idx`` is (p, q) (max), or g / divisor (mean)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, p, q = split_nchw(lin, C, H, W)
    gbase = n * sgn + c * sgc
    ibase = (n * C + c) * Ho * Wo
    me = (p * W + q).to(tl.int32)
    acc = tl.zeros((BLOCK,), CT)
    # window i covers row p when p = i*SH - PT + a*DH for a tap 0 <= a < KH: i <= (p + PT) // SH,
    # and at most ceil(extent / SH) of them
    for da in tl.static_range((DH * (KH - 1) + SH) // SH):
        i = (p + PT) // SH - da
        off_h = p + PT - i * SH                    # p's offset inside window i
        cover_h = (i >= 0) & (i < Ho) & (off_h < DH * (KH - 1) + 1) & (off_h % DH == 0)
        for db in tl.static_range((DW * (KW - 1) + SW) // SW):
            j = (q + PL) // SW - db
            off_w = q + PL - j * SW
            cover = mask & cover_h & (j >= 0) & (j < Wo) & (off_w < DW * (KW - 1) + 1) & (off_w % DW == 0)
            gv = tl.load(g + gbase + i * sgh + j * sgw, mask=cover, other=0.0).to(CT)
            if IS_MAX:
                won = tl.load(idx + ibase + i * Wo + j, mask=cover, other=-1) == me
                acc += tl.where(cover & won, gv, 0.0)
            else:
                d = _divisor(i * SH - PT, j * SW - PL, H, W, KH, KW, PB, PR, COUNT_PAD).to(CT)
                acc += tl.where(cover, gv / d, 0.0)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _pool_meta(geo, is_max, count_include_pad, x):
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = geo.window, geo.stride, geo.padding, geo.dilation
    return dict(KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PB=pb, PL=pl, PR=pr, DH=dh, DW=dw, IS_MAX=is_max,
                COUNT_PAD=bool(count_include_pad), CT=common.compute_type(x.dtype), INTERP=common.INTERPRET)


def _pool_forward(x, geo, is_max, count_include_pad=True, argmax=False):
    N, C, H, W = x.shape
    Ho, Wo = geo.out_size
    y = common.empty((N, C, Ho, Wo), torch.int32 if argmax else x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    common.launch(_pool_fwd_kernel, (common.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo, *x.stride(),
                  WRITE_ARGMAX=argmax, BLOCK=block, **_pool_meta(geo, is_max, count_include_pad, x))
    return y


def _pool_backward(grad, x, geo, is_max, count_include_pad=True):
    N, C, H, W = x.shape
    Ho, Wo = geo.out_size
    _check_grad(grad, (N, C, Ho, Wo))
    dx = common.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    idx = _pool_forward(x, geo, True, argmax=True) if is_max else dx     # (dx: an unused placeholder)
    block = _block(total)
    common.launch(_pool_bwd_kernel, (common.cdiv(total, block),), grad, idx, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), BLOCK=block, **_pool_meta(geo, is_max, count_include_pad, x))
    return dx


def maxpool2d_forward(x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    return _pool_forward(x, _geometry(x, window, stride, padding, dilation, ceil_mode), True)


def maxpool2d_backward(grad, out, x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """The gradient goes to each window's argmax (torch's rule), found again from ``x``."""
    return (_pool_backward(grad, x, _geometry(x, window, stride, padding, dilation, ceil_mode), True),)


def meanpool2d_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    return _pool_forward(x, _geometry(x, window, stride, padding, (1, 1), ceil_mode), False, count_include_pad)


def meanpool2d_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    return (_pool_backward(grad, x, _geometry(x, window, stride, padding, (1, 1), ceil_mode), False,
                           count_include_pad),)


# --- adaptive windows ----------------------------------------------------------------------------

@triton.jit
def _adaptive_bounds(i, n, n_out):
    """[start, end) of adaptive window i: floor(i*n/n_out), ceil((i+1)*n/n_out)."""
    return (i * n) // n_out, ((i + 1) * n + n_out - 1) // n_out


@triton.jit
def _adaptive_fwd_kernel(x, y, total, C, H, W, Ho, Wo, sxn, sxc, sxh, sxw,
                         LONGEST_H: tl.constexpr, LONGEST_W: tl.constexpr, IS_MAX: tl.constexpr, WRITE_ARGMAX: tl.constexpr, CT: tl.constexpr,
                         INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, i, j = split_nchw(lin, C, Ho, Wo)
    base = n * sxn + c * sxc
    hs, he = _adaptive_bounds(i, H, Ho)
    ws, we = _adaptive_bounds(j, W, Wo)
    best = tl.full((BLOCK,), -float("inf"), CT)
    arg = tl.full((BLOCK,), -1, tl.int32)
    found = tl.zeros((BLOCK,), tl.int1)
    acc = tl.zeros((BLOCK,), CT)
    for a in range(0, LONGEST_H):
        h = hs + a
        for b in range(0, LONGEST_W):
            w = ws + b
            ok = mask & (h < he) & (w < we)
            v = tl.load(x + base + h * sxh + w * sxw, mask=ok, other=0.0).to(CT)
            if IS_MAX:
                best, arg, found = _max_step(v, (h * W + w).to(tl.int32), ok, best, arg, found)
            else:
                acc += v
    if IS_MAX:
        _store_max(y, lin, best, arg, mask, WRITE_ARGMAX, INTERP)
    else:
        tl.store(y + lin, store_value(acc / ((he - hs) * (we - ws)).to(CT), y.dtype.element_ty, INTERP),
                 mask=mask)


@triton.jit
def _adaptive_bwd_kernel(g, idx, dx, total, C, H, W, Ho, Wo, sgn, sgc, sgh, sgw,
                         MOST_H: tl.constexpr, MOST_W: tl.constexpr, IS_MAX: tl.constexpr, CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """dx per input pixel (p, q): over the windows that hold it (rows i from
    floor(p*Ho/H) to floor(((p+1)*Ho - 1)/H), at most MOST_H of them;
    columns likewise), the gradient if the window's argmax is (p, q) (max),
    or g / (window size) (mean)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, p, q = split_nchw(lin, C, H, W)
    gbase = n * sgn + c * sgc
    ibase = (n * C + c) * Ho * Wo
    me = (p * W + q).to(tl.int32)
    first_i = (p * Ho) // H
    last_i = ((p + 1) * Ho - 1) // H
    first_j = (q * Wo) // W
    last_j = ((q + 1) * Wo - 1) // W
    acc = tl.zeros((BLOCK,), CT)
    for di in range(0, MOST_H):
        i = first_i + di
        hs, he = _adaptive_bounds(i, H, Ho)
        for dj in range(0, MOST_W):
            j = first_j + dj
            cover = mask & (i <= last_i) & (j <= last_j)
            gv = tl.load(g + gbase + i * sgh + j * sgw, mask=cover, other=0.0).to(CT)
            if IS_MAX:
                won = tl.load(idx + ibase + i * Wo + j, mask=cover, other=-1) == me
                acc += tl.where(cover & won, gv, 0.0)
            else:
                ws, we = _adaptive_bounds(j, W, Wo)
                acc += tl.where(cover, gv / ((he - hs) * (we - ws)).to(CT), 0.0)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _longest(axis_map):
    return int(axis_map.k)


def _most_covering(axis_map):
    """The most windows that hold one input position."""
    return int(axis_map.inverse()[0].shape[1])


def _adaptive_forward(x, size, is_max, argmax=False):
    rows, cols = _adaptive(x, size)
    N, C, H, W = x.shape
    Ho, Wo = rows.m, cols.m
    y = common.empty((N, C, Ho, Wo), torch.int32 if argmax else x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    common.launch(_adaptive_fwd_kernel, (common.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), LONGEST_H=_longest(rows), LONGEST_W=_longest(cols), IS_MAX=is_max, WRITE_ARGMAX=argmax,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return y


def _adaptive_backward(grad, x, size, is_max):
    rows, cols = _adaptive(x, size)
    N, C, H, W = x.shape
    Ho, Wo = rows.m, cols.m
    _check_grad(grad, (N, C, Ho, Wo))
    dx = common.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    idx = _adaptive_forward(x, size, True, argmax=True) if is_max else dx   # (dx: an unused placeholder)
    block = _block(total)
    common.launch(_adaptive_bwd_kernel, (common.cdiv(total, block),), grad, idx, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), MOST_H=_most_covering(rows), MOST_W=_most_covering(cols), IS_MAX=is_max,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return dx


def adaptive_maxpool2d_forward(x, size):
    return _adaptive_forward(x, size, True)


def adaptive_maxpool2d_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, size, True),)


def adaptive_meanpool2d_forward(x, size):
    return _adaptive_forward(x, size, False)


def adaptive_meanpool2d_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, size, False),)
