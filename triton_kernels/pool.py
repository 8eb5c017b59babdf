"""Pooling, Triton kernels (forward and backward).

NCHW tensors, read through their strides (any view works without a copy);
outputs are new dense tensors in the input's dtype. Arithmetic is in float32
(float64 for float64). Semantics are those of ``triflux.reference.pool``;
attributes, output sizes and error messages are the family's spec
(``triflux.specs.pool``), which the reference builds too, so both sides
accept and refuse the same attributes.

Every kernel is a "gather": one program computes a tile of BLOCK_SIZE elements of
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

from . import launch, numerics
from .indexing import split_nchw
from .numerics import store_value
from ..errors import ShapeError
from ..specs.pool import adaptive_pool2d_spec, pool2d_spec


def _check_grad(grad, shape):
    if tuple(grad.shape) != tuple(shape):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {tuple(shape)}")


def _block(n):
    return launch.block_for(n, 256)


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
def _pool_fwd_kernel(x, y, total, channels, in_height, in_width, out_height, out_width,
                     x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                     WINDOW_HEIGHT: tl.constexpr, WINDOW_WIDTH: tl.constexpr,
                     STRIDE_HEIGHT: tl.constexpr, STRIDE_WIDTH: tl.constexpr,
                     PAD_TOP: tl.constexpr, PAD_BOTTOM: tl.constexpr, PAD_LEFT: tl.constexpr, PAD_RIGHT: tl.constexpr,
                     DILATION_HEIGHT: tl.constexpr, DILATION_WIDTH: tl.constexpr,
                     IS_MAX: tl.constexpr, WRITE_ARGMAX: tl.constexpr, COUNT_PAD: tl.constexpr,
                     COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[n, c, i, j] = the maximum (IS_MAX; its input pixel h*in_width + w with
    WRITE_ARGMAX) or the mean of the window of output (i, j), for the
    row-major output elements of this program."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, i, j = split_nchw(lin, channels, out_height, out_width)
    base = n * x_batch_stride + c * x_channel_stride
    h0 = i * STRIDE_HEIGHT - PAD_TOP                # the window's top-left tap
    w0 = j * STRIDE_WIDTH - PAD_LEFT
    best = tl.full((BLOCK_SIZE,), -float("inf"), COMPUTE_TYPE)
    arg = tl.full((BLOCK_SIZE,), -1, tl.int32)
    found = tl.zeros((BLOCK_SIZE,), tl.int1)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for a in tl.static_range(WINDOW_HEIGHT):
        for b in tl.static_range(WINDOW_WIDTH):
            h = h0 + a * DILATION_HEIGHT
            w = w0 + b * DILATION_WIDTH
            ok = mask & (h >= 0) & (h < in_height) & (w >= 0) & (w < in_width)
            v = tl.load(x + base + h * x_height_stride + w * x_width_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
            if IS_MAX:
                best, arg, found = _max_step(v, (h * in_width + w).to(tl.int32), ok, best, arg, found)
            else:
                acc += v
    if IS_MAX:
        _store_max(y, lin, best, arg, mask, WRITE_ARGMAX, INTERP)
    else:
        divisor = _divisor(h0, w0, in_height, in_width, WINDOW_HEIGHT, WINDOW_WIDTH, PAD_BOTTOM, PAD_RIGHT, COUNT_PAD)
        tl.store(y + lin, store_value(acc / divisor.to(COMPUTE_TYPE), y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _divisor(h0, w0, in_height, in_width, WINDOW_HEIGHT: tl.constexpr, WINDOW_WIDTH: tl.constexpr,
             PAD_BOTTOM: tl.constexpr, PAD_RIGHT: tl.constexpr, COUNT_PAD: tl.constexpr):
    """The taps of the window at (h0, w0) inside the padded input (COUNT_PAD)
    or inside the input (torch's avg_pool2d divisor)."""
    h1 = h0 + WINDOW_HEIGHT
    w1 = w0 + WINDOW_WIDTH
    if COUNT_PAD:
        rows = tl.where(h1 < in_height + PAD_BOTTOM, h1, in_height + PAD_BOTTOM) - h0
        cols = tl.where(w1 < in_width + PAD_RIGHT, w1, in_width + PAD_RIGHT) - w0
    else:
        rows = tl.where(h1 < in_height, h1, in_height) - tl.where(h0 > 0, h0, 0)
        cols = tl.where(w1 < in_width, w1, in_width) - tl.where(w0 > 0, w0, 0)
    return rows * cols


@triton.jit
def _pool_bwd_kernel(g, argmax, dx, total, channels, in_height, in_width, out_height, out_width,
                     g_batch_stride, g_channel_stride, g_height_stride, g_width_stride,
                     WINDOW_HEIGHT: tl.constexpr, WINDOW_WIDTH: tl.constexpr,
                     STRIDE_HEIGHT: tl.constexpr, STRIDE_WIDTH: tl.constexpr,
                     PAD_TOP: tl.constexpr, PAD_BOTTOM: tl.constexpr, PAD_LEFT: tl.constexpr, PAD_RIGHT: tl.constexpr,
                     DILATION_HEIGHT: tl.constexpr, DILATION_WIDTH: tl.constexpr, IS_MAX: tl.constexpr,
                     COUNT_PAD: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    """dx per input pixel (p, q): over the windows (i, j) that cover it, the
    gradient if the window's ``argmax`` (dense (N, C, Ho, Wo)) is (p, q) (max),
    or g / divisor (mean)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, p, q = split_nchw(lin, channels, in_height, in_width)
    g_image = n * g_batch_stride + c * g_channel_stride
    argmax_image = (n * channels + c) * out_height * out_width
    me = (p * in_width + q).to(tl.int32)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    # window i covers row p when p = i*STRIDE_HEIGHT - PAD_TOP + a*DILATION_HEIGHT for a tap
    # 0 <= a < WINDOW_HEIGHT: i <= (p + PAD_TOP) // STRIDE_HEIGHT, and at most
    # ceil(extent / STRIDE_HEIGHT) of them (extent = DILATION_HEIGHT*(WINDOW_HEIGHT - 1) + 1)
    for da in tl.static_range((DILATION_HEIGHT * (WINDOW_HEIGHT - 1) + STRIDE_HEIGHT) // STRIDE_HEIGHT):
        i = (p + PAD_TOP) // STRIDE_HEIGHT - da
        off_h = p + PAD_TOP - i * STRIDE_HEIGHT            # p's offset inside window i
        cover_h = ((i >= 0) & (i < out_height) & (off_h < DILATION_HEIGHT * (WINDOW_HEIGHT - 1) + 1)
                   & (off_h % DILATION_HEIGHT == 0))
        for db in tl.static_range((DILATION_WIDTH * (WINDOW_WIDTH - 1) + STRIDE_WIDTH) // STRIDE_WIDTH):
            j = (q + PAD_LEFT) // STRIDE_WIDTH - db
            off_w = q + PAD_LEFT - j * STRIDE_WIDTH
            cover = (mask & cover_h & (j >= 0) & (j < out_width) & (off_w < DILATION_WIDTH * (WINDOW_WIDTH - 1) + 1)
                     & (off_w % DILATION_WIDTH == 0))
            gv = tl.load(g + g_image + i * g_height_stride + j * g_width_stride, mask=cover, other=0.0)
            gv = gv.to(COMPUTE_TYPE)
            if IS_MAX:
                won = tl.load(argmax + argmax_image + i * out_width + j, mask=cover, other=-1) == me
                acc += tl.where(cover & won, gv, 0.0)
            else:
                d = _divisor(i * STRIDE_HEIGHT - PAD_TOP, j * STRIDE_WIDTH - PAD_LEFT, in_height, in_width,
                             WINDOW_HEIGHT, WINDOW_WIDTH, PAD_BOTTOM, PAD_RIGHT, COUNT_PAD).to(COMPUTE_TYPE)
                acc += tl.where(cover, gv / d, 0.0)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _pool_meta(spec, is_max, count_include_pad, x):
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = spec.window, spec.stride, spec.padding, spec.dilation
    return dict(WINDOW_HEIGHT=kh, WINDOW_WIDTH=kw, STRIDE_HEIGHT=sh, STRIDE_WIDTH=sw,
                PAD_TOP=pt, PAD_BOTTOM=pb, PAD_LEFT=pl, PAD_RIGHT=pr, DILATION_HEIGHT=dh, DILATION_WIDTH=dw,
                IS_MAX=is_max, COUNT_PAD=bool(count_include_pad), COMPUTE_TYPE=numerics.compute_type(x.dtype),
                INTERP=launch.INTERPRET)


def _pool_forward(x, spec, is_max, count_include_pad=True, argmax=False):
    N, C, H, W = x.shape
    Ho, Wo = spec.out_shape[2:]
    y = launch.empty(spec.out_shape, torch.int32 if argmax else x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    launch.launch(_pool_fwd_kernel, (launch.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo, *x.stride(),
                  WRITE_ARGMAX=argmax, BLOCK_SIZE=block, **_pool_meta(spec, is_max, count_include_pad, x))
    return y


def _pool_backward(grad, x, spec, is_max, count_include_pad=True):
    N, C, H, W = x.shape
    Ho, Wo = spec.out_shape[2:]
    _check_grad(grad, spec.out_shape)
    dx = launch.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    argmax = _pool_forward(x, spec, True, argmax=True) if is_max else dx     # (dx: an unused placeholder)
    block = _block(total)
    launch.launch(_pool_bwd_kernel, (launch.cdiv(total, block),), grad, argmax, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), BLOCK_SIZE=block, **_pool_meta(spec, is_max, count_include_pad, x))
    return dx


def maxpool2d_forward(x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    spec = pool2d_spec("maxpool2d", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode)
    return _pool_forward(x, spec, True)


def maxpool2d_backward(grad, out, x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """The gradient goes to each window's argmax (torch's rule), found again from ``x``."""
    spec = pool2d_spec("maxpool2d", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode)
    return (_pool_backward(grad, x, spec, True),)


def meanpool2d_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    spec = pool2d_spec("meanpool2d", x.shape, x.dtype, window, stride, padding, (1, 1), ceil_mode)
    return _pool_forward(x, spec, False, count_include_pad)


def meanpool2d_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    spec = pool2d_spec("meanpool2d", x.shape, x.dtype, window, stride, padding, (1, 1), ceil_mode)
    return (_pool_backward(grad, x, spec, False, count_include_pad),)


# --- adaptive windows ----------------------------------------------------------------------------

@triton.jit
def _adaptive_bounds(i, n, n_out):
    """[start, end) of adaptive window i: floor(i*n/n_out), ceil((i+1)*n/n_out)."""
    return (i * n) // n_out, ((i + 1) * n + n_out - 1) // n_out


@triton.jit
def _adaptive_fwd_kernel(x, y, total, channels, in_height, in_width, out_height, out_width,
                         x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                         LONGEST_HEIGHT: tl.constexpr, LONGEST_WIDTH: tl.constexpr, IS_MAX: tl.constexpr,
                         WRITE_ARGMAX: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr):
    """y[n, c, i, j] = the maximum (IS_MAX; its input pixel with WRITE_ARGMAX)
    or the mean of adaptive window (i, j), scanning up to the longest window
    (LONGEST_HEIGHT x LONGEST_WIDTH)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, i, j = split_nchw(lin, channels, out_height, out_width)
    base = n * x_batch_stride + c * x_channel_stride
    hs, he = _adaptive_bounds(i, in_height, out_height)
    ws, we = _adaptive_bounds(j, in_width, out_width)
    best = tl.full((BLOCK_SIZE,), -float("inf"), COMPUTE_TYPE)
    arg = tl.full((BLOCK_SIZE,), -1, tl.int32)
    found = tl.zeros((BLOCK_SIZE,), tl.int1)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for a in range(0, LONGEST_HEIGHT):
        h = hs + a
        for b in range(0, LONGEST_WIDTH):
            w = ws + b
            ok = mask & (h < he) & (w < we)
            v = tl.load(x + base + h * x_height_stride + w * x_width_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
            if IS_MAX:
                best, arg, found = _max_step(v, (h * in_width + w).to(tl.int32), ok, best, arg, found)
            else:
                acc += v
    if IS_MAX:
        _store_max(y, lin, best, arg, mask, WRITE_ARGMAX, INTERP)
    else:
        size = ((he - hs) * (we - ws)).to(COMPUTE_TYPE)
        tl.store(y + lin, store_value(acc / size, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _adaptive_bwd_kernel(g, argmax, dx, total, channels, in_height, in_width, out_height, out_width,
                         g_batch_stride, g_channel_stride, g_height_stride, g_width_stride,
                         MOST_HEIGHT: tl.constexpr, MOST_WIDTH: tl.constexpr, IS_MAX: tl.constexpr,
                         COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx per input pixel (p, q): over the windows that hold it (rows i from
    floor(p*Ho/H) to floor(((p+1)*Ho - 1)/H), at most MOST_HEIGHT of them;
    columns likewise), the gradient if the window's argmax is (p, q) (max),
    or g / (window size) (mean)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, p, q = split_nchw(lin, channels, in_height, in_width)
    g_image = n * g_batch_stride + c * g_channel_stride
    argmax_image = (n * channels + c) * out_height * out_width
    me = (p * in_width + q).to(tl.int32)
    first_i = (p * out_height) // in_height
    last_i = ((p + 1) * out_height - 1) // in_height
    first_j = (q * out_width) // in_width
    last_j = ((q + 1) * out_width - 1) // in_width
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for di in range(0, MOST_HEIGHT):
        i = first_i + di
        hs, he = _adaptive_bounds(i, in_height, out_height)
        for dj in range(0, MOST_WIDTH):
            j = first_j + dj
            cover = mask & (i <= last_i) & (j <= last_j)
            gv = tl.load(g + g_image + i * g_height_stride + j * g_width_stride, mask=cover, other=0.0)
            gv = gv.to(COMPUTE_TYPE)
            if IS_MAX:
                won = tl.load(argmax + argmax_image + i * out_width + j, mask=cover, other=-1) == me
                acc += tl.where(cover & won, gv, 0.0)
            else:
                ws, we = _adaptive_bounds(j, in_width, out_width)
                acc += tl.where(cover, gv / ((he - hs) * (we - ws)).to(COMPUTE_TYPE), 0.0)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _adaptive_forward(x, spec, is_max, argmax=False):
    N, C, H, W = x.shape
    Ho, Wo = spec.size
    y = launch.empty(spec.out_shape, torch.int32 if argmax else x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    launch.launch(_adaptive_fwd_kernel, (launch.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), LONGEST_HEIGHT=spec.rows.taps, LONGEST_WIDTH=spec.cols.taps, IS_MAX=is_max,
                  WRITE_ARGMAX=argmax, COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET,
                  BLOCK_SIZE=block)
    return y


def _adaptive_backward(grad, x, spec, is_max):
    N, C, H, W = x.shape
    Ho, Wo = spec.size
    _check_grad(grad, spec.out_shape)
    dx = launch.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    argmax = _adaptive_forward(x, spec, True, argmax=True) if is_max else dx   # (dx: an unused placeholder)
    block = _block(total)
    launch.launch(_adaptive_bwd_kernel, (launch.cdiv(total, block),), grad, argmax, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), MOST_HEIGHT=spec.rows.most_covering, MOST_WIDTH=spec.cols.most_covering,
                  IS_MAX=is_max, COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET,
                  BLOCK_SIZE=block)
    return dx


def adaptive_maxpool2d_forward(x, size):
    return _adaptive_forward(x, adaptive_pool2d_spec("adaptive_maxpool2d", x.shape, x.dtype, size), True)


def adaptive_maxpool2d_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, adaptive_pool2d_spec("adaptive_maxpool2d", x.shape, x.dtype, size), True),)


def adaptive_meanpool2d_forward(x, size):
    return _adaptive_forward(x, adaptive_pool2d_spec("adaptive_meanpool2d", x.shape, x.dtype, size), False)


def adaptive_meanpool2d_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, adaptive_pool2d_spec("adaptive_meanpool2d", x.shape, x.dtype, size),
                               False),)
