"""Pooling, Triton kernels (forward and backward), any spatial rank.

Tensors ``(N, C, *spatial)`` with R = 1, 2 or 3 spatial axes, read through
their strides (any view works without a copy); outputs are new dense tensors
in the input's dtype. Arithmetic is in float32 (float64 for float64).
Semantics are those of ``triflux.reference.pool``; attributes, output sizes
and error messages are the family's spec (``triflux.specs.pool``), which the
reference builds too, so both sides accept and refuse the same attributes.

One geometry serves every rank: the canonical 3-d one (D, H, W). An input of
R < 3 spatial axes is lifted by size-1 leading axes (window, stride and
dilation 1, no padding, stride 0), free: Triton specialises integer
arguments equal to 1 and the window, stride, padding and dilation are
constexpr, so a 2-d launch compiles the depth arithmetic away (a 1-d launch
the height's too).

Every kernel is a "gather": one program computes a tile of BLOCK_SIZE elements of
its result (flattened row-major), each element looping over the few values it
depends on. No atomics, so every result is deterministic:

* forwards: one element per output element, looping over its window (fixed
  windows: statically unrolled; adaptive windows: loops up to the longest
  window, a constexpr). Maxima scan the window row-major and take the first
  real value, then any greater value or any NaN (torch's rule), with
  comparisons and selects: no min/max instruction, so NaN propagates on every
  GPU as in the interpreter. Lp-norm pooling sums x^p (IEEE pow with a
  constexpr exponent: products for p = 1, 2, 3, else exp2(p log2|x|) with
  the sign rules of pow) and takes the 1/p-th power; p = inf is the maximum
  of |x|;
* max-pool backwards (and p = inf), in two launches: the forward kernel
  again, storing each window's argmax (the input element its maximum came
  from, ``(d * H + h) * W + w``) in an int32 scratch tensor; then per input
  element the sum of the gradients of the covering windows whose argmax is
  that element. (Recomputing each covering window's argmax per input
  element would cost prod(k) loads per window, and for an adaptive window
  as large as the input, its whole size per element.) Windows that do not
  overlap (stride at least the dilated window) are the exception: each input
  element lies in one window at most, whose argmax the backward recomputes by
  the forward's scan (its prod(k) loads fall on the cache lines its
  neighbours load), in one launch that reads x once and writes no scratch;
* Lp-norm backwards, in two launches: the forward kernel again, storing
  each window's weight w = g S u^(1/p - 1) sign(u)^2 (0 where u = 0; the
  reference's docstring has the math) in a scratch tensor of the compute
  type; then per input element x^(p-1) times the sum of the covering
  windows' weights;
* mean-pool backwards: per input element, the sum of g / divisor over the
  windows that cover it.
"""
import functools
import math

import torch
import triton
import triton.language as tl

from . import launch, numerics
from .indexing import split_ncdhw
from .numerics import store_value
from ..errors import ShapeError
from ..specs.pool import adaptive_pool_spec, pool_spec

#: the kernels' modes (a constexpr)
MAX, MEAN, LP, MAX_ABS = 0, 1, 2, 3
#: what a forward launch writes: the result, each window's argmax, or each window's Lp weight
VALUE, ARGMAX, LP_WEIGHT = 0, 1, 2


def _check_grad(grad, shape):
    if tuple(grad.shape) != tuple(shape):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {tuple(shape)}")


def _block(n):
    return launch.block_for(n, 256)


def _lift(t_shape, t_stride, R):
    """The (D, H, W) sides and the five strides of a tensor (N, C, *spatial)
    lifted to 3 spatial axes (size 1, stride 0 in front)."""
    pad = 3 - R
    return (1,) * pad + tuple(t_shape[2:]), tuple(t_stride[:2]) + (0,) * pad + tuple(t_stride[2:])


def _power_kind(e):
    """0: ``e`` is not an integer, 1: an odd integer, 2: an even one (pow's sign rules)."""
    if e != math.floor(e):
        return 0
    return 1 if int(e) % 2 else 2


# --- shared device functions -----------------------------------------------------------------

@triton.jit
def _pow(v, E: tl.constexpr, KIND: tl.constexpr):
    """v^E for a constant exponent E, IEEE pow's (NumPy's and torch's) values:
    KIND says whether E is not an integer (0: a negative v gives NaN, -inf
    gives |v|^E), an odd integer (1: the sign of v) or an even one (2)."""
    if E == 0.0:
        return tl.zeros_like(v) + 1.0
    elif E == 1.0:
        return v
    elif E == 2.0:
        return v * v
    elif E == 3.0:
        return v * v * v
    else:
        e = tl.full((1,), E, v.dtype)
        m = tl.exp2(e * tl.log2(tl.abs(v)))
        if KIND == 1:
            return tl.where(v < 0, -m, m)
        elif KIND == 2:
            return m
        else:
            return tl.where(v < 0, tl.where(v == -float("inf"), m, float("nan")), m)


@triton.jit
def _max_step(v, here, ok, best, arg, found):
    """One step of torch's window scan: a real value ``v`` (at input element
    ``here``) is taken if it is the first real one, greater than the best so
    far, or NaN (so the last NaN wins and NaN propagates)."""
    take = ok & ((~found) | (v > best) | (v != v))
    best = tl.where(take, v, best)
    arg = tl.where(take, here, arg)
    return best, arg, found | ok


@triton.jit
def _window_argmax(x, image, i, j, l, ok, in_depth, in_height, in_width, x_depth_stride, x_height_stride,
                   x_width_stride, WINDOW_D: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr,
                   STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
                   PAD_D: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
                   DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr, ABS: tl.constexpr,
                   COMPUTE_TYPE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The input element ``(d * H + h) * W + w`` the maximum (of |x| with ABS) of window
    (i, j, l) comes from, where ``ok``: the forward's scan (:func:`_max_step`, the same
    order), -1 where the window has no real value."""
    best = tl.full((BLOCK_SIZE,), -float("inf"), COMPUTE_TYPE)
    arg = tl.full((BLOCK_SIZE,), -1, tl.int32)
    found = tl.zeros((BLOCK_SIZE,), tl.int1)
    for a in tl.static_range(WINDOW_D):
        d = i * STRIDE_D - PAD_D + a * DIL_D
        ok_d = ok & (d >= 0) & (d < in_depth)
        for b in tl.static_range(WINDOW_H):
            h = j * STRIDE_H - PAD_H + b * DIL_H
            ok_h = ok_d & (h >= 0) & (h < in_height)
            row = (d * in_height + h) * in_width
            for e in tl.static_range(WINDOW_W):
                w = l * STRIDE_W - PAD_W + e * DIL_W
                ok_w = ok_h & (w >= 0) & (w < in_width)
                v = tl.load(x + image + d * x_depth_stride + h * x_height_stride + w * x_width_stride, mask=ok_w,
                            other=0.0).to(COMPUTE_TYPE)
                if ABS:
                    v = tl.abs(v)
                best, arg, found = _max_step(v, (row + w).to(tl.int32), ok_w, best, arg, found)
    return arg


@triton.jit
def _taps_inside(i0, n, K: tl.constexpr, DIL: tl.constexpr, PAD_HI: tl.constexpr, COUNT_PAD: tl.constexpr):
    """The taps of the window starting at ``i0`` along an axis of length
    ``n`` inside the padded input (COUNT_PAD; any dilation) or inside the
    input (dilation 1): torch's avg_pool divisor along that axis."""
    if COUNT_PAD:
        inside = (n + PAD_HI - i0 + DIL - 1) // DIL          # (the window starts inside the padded input)
        return tl.where(inside < K, inside, K)
    else:
        i1 = i0 + K
        return tl.where(i1 < n, i1, n) - tl.where(i0 > 0, i0, 0)


# --- fixed windows -------------------------------------------------------------------------------

@triton.jit
def _pool_fwd_kernel(x, y, g, total, channels, in_depth, in_height, in_width, out_depth, out_height, out_width,
                     x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                     g_batch_stride, g_channel_stride, g_depth_stride, g_height_stride, g_width_stride,
                     WINDOW_D: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr,
                     STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
                     PAD_D: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
                     PAD_D_HI: tl.constexpr, PAD_H_HI: tl.constexpr, PAD_W_HI: tl.constexpr,
                     DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
                     MODE: tl.constexpr, WRITE: tl.constexpr, COUNT_PAD: tl.constexpr,
                     P: tl.constexpr, P_KIND: tl.constexpr, ROOT: tl.constexpr, ROOT_KIND: tl.constexpr,
                     WEIGHT_POWER: tl.constexpr, WEIGHT_KIND: tl.constexpr,
                     COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[n, c, i] for the row-major output elements of this program: the
    maximum (MODE MAX; of |x|: MAX_ABS), the mean (MEAN) or the Lp norm (LP,
    x^P summed, the ROOT = 1/P-th power) of the window of output i; with
    WRITE ARGMAX the input element a maximum came from, with WRITE LP_WEIGHT
    the window's weight g S u^(WEIGHT_POWER) sign(u)^2 of the Lp backward."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, i, j, l = split_ncdhw(lin, channels, out_depth, out_height, out_width)
    base = n * x_batch_stride + c * x_channel_stride
    d0 = i * STRIDE_D - PAD_D                 # the window's first tap
    h0 = j * STRIDE_H - PAD_H
    w0 = l * STRIDE_W - PAD_W
    best = tl.full((BLOCK_SIZE,), -float("inf"), COMPUTE_TYPE)
    arg = tl.full((BLOCK_SIZE,), -1, tl.int32)
    found = tl.zeros((BLOCK_SIZE,), tl.int1)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for a in tl.static_range(WINDOW_D):
        d = d0 + a * DIL_D
        ok_d = mask & (d >= 0) & (d < in_depth)
        at_d = base + d * x_depth_stride
        for b in tl.static_range(WINDOW_H):
            h = h0 + b * DIL_H
            ok_h = ok_d & (h >= 0) & (h < in_height)
            at_h = at_d + h * x_height_stride
            row = (d * in_height + h) * in_width
            for e in tl.static_range(WINDOW_W):
                w = w0 + e * DIL_W
                ok = ok_h & (w >= 0) & (w < in_width)
                v = tl.load(x + at_h + w * x_width_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
                if MODE == 0 or MODE == 3:
                    if MODE == 3:
                        v = tl.abs(v)
                    best, arg, found = _max_step(v, (row + w).to(tl.int32), ok, best, arg, found)
                elif MODE == 1:
                    acc += v
                else:
                    acc += tl.where(ok, _pow(v, P, P_KIND), 0.0)
    if MODE == 0 or MODE == 3:
        if WRITE == 1:
            tl.store(y + lin, arg, mask=mask)
        else:
            tl.store(y + lin, store_value(best, y.dtype.element_ty, INTERP), mask=mask)
    else:
        divisor = (_taps_inside(d0, in_depth, WINDOW_D, DIL_D, PAD_D_HI, COUNT_PAD)
                   * _taps_inside(h0, in_height, WINDOW_H, DIL_H, PAD_H_HI, COUNT_PAD)
                   * _taps_inside(w0, in_width, WINDOW_W, DIL_W, PAD_W_HI, COUNT_PAD)).to(COMPUTE_TYPE)
        if MODE == 1:
            tl.store(y + lin, store_value(acc / divisor, y.dtype.element_ty, INTERP), mask=mask)
        else:
            scale = (WINDOW_D * WINDOW_H * WINDOW_W) / divisor        # 1 but for a ceil-mode window
            u = acc * scale
            if WRITE == 2:
                gv = tl.load(g + n * g_batch_stride + c * g_channel_stride + i * g_depth_stride
                             + j * g_height_stride + l * g_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
                sign = tl.where(u > 0, 1.0, tl.where(u < 0, -1.0, 0.0)).to(COMPUTE_TYPE)   # 0 at 0 and NaN
                wt = gv * scale * _pow(u, WEIGHT_POWER, WEIGHT_KIND) * sign
                wt = tl.where(u == 0, 0.0, wt) * sign
                tl.store(y + lin, wt, mask=mask)
            else:
                tl.store(y + lin, store_value(_pow(u, ROOT, ROOT_KIND), y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _pool_bwd_kernel(g, scratch, x, dx, total, channels, in_depth, in_height, in_width,
                     out_depth, out_height, out_width,
                     g_batch_stride, g_channel_stride, g_depth_stride, g_height_stride, g_width_stride,
                     x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                     WINDOW_D: tl.constexpr, WINDOW_H: tl.constexpr, WINDOW_W: tl.constexpr,
                     STRIDE_D: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
                     PAD_D: tl.constexpr, PAD_H: tl.constexpr, PAD_W: tl.constexpr,
                     PAD_D_HI: tl.constexpr, PAD_H_HI: tl.constexpr, PAD_W_HI: tl.constexpr,
                     DIL_D: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
                     MODE: tl.constexpr, COUNT_PAD: tl.constexpr, GRAD_POWER: tl.constexpr,
                     GRAD_KIND: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, RECOMPUTE: tl.constexpr):
    """dx per input element q: over the windows i that cover it, the
    gradient if the window's argmax (``scratch``, dense (N, C, *out); with
    RECOMPUTE, windows that do not overlap, found here from x by the forward's
    scan) is q (MAX; times sign(x[q]) for MAX_ABS), g / divisor (MEAN), or the
    window's weight (``scratch``; LP: the sum then times x[q]^GRAD_POWER)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, p, q, r = split_ncdhw(lin, channels, in_depth, in_height, in_width)
    g_image = n * g_batch_stride + c * g_channel_stride
    x_image = n * x_batch_stride + c * x_channel_stride
    scratch_image = (n * channels + c) * out_depth * out_height * out_width
    me = ((p * in_height + q) * in_width + r).to(tl.int32)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    # window i covers position p along an axis when p = i*STRIDE - PAD + a*DIL for a tap
    # 0 <= a < WINDOW: i <= (p + PAD) // STRIDE, and at most ceil(extent / STRIDE) of them
    # (extent = DIL*(WINDOW - 1) + 1)
    for da in tl.static_range((DIL_D * (WINDOW_D - 1) + STRIDE_D) // STRIDE_D):
        i = (p + PAD_D) // STRIDE_D - da
        off_d = p + PAD_D - i * STRIDE_D                      # p's offset inside window i
        cover_d = mask & (i >= 0) & (i < out_depth) & (off_d < DIL_D * (WINDOW_D - 1) + 1) & (off_d % DIL_D == 0)
        g_d = g_image + i * g_depth_stride
        if MODE == 1:
            count_d = _taps_inside(i * STRIDE_D - PAD_D, in_depth, WINDOW_D, 1, PAD_D_HI, COUNT_PAD)
        for db in tl.static_range((DIL_H * (WINDOW_H - 1) + STRIDE_H) // STRIDE_H):
            j = (q + PAD_H) // STRIDE_H - db
            off_h = q + PAD_H - j * STRIDE_H
            cover_h = (cover_d & (j >= 0) & (j < out_height) & (off_h < DIL_H * (WINDOW_H - 1) + 1)
                       & (off_h % DIL_H == 0))
            g_h = g_d + j * g_height_stride
            row = scratch_image + (i * out_height + j) * out_width
            if MODE == 1:
                count_h = (count_d * _taps_inside(j * STRIDE_H - PAD_H, in_height, WINDOW_H, 1, PAD_H_HI,
                                                  COUNT_PAD)).to(COMPUTE_TYPE)
            for dc in tl.static_range((DIL_W * (WINDOW_W - 1) + STRIDE_W) // STRIDE_W):
                l = (r + PAD_W) // STRIDE_W - dc
                off_w = r + PAD_W - l * STRIDE_W
                cover = (cover_h & (l >= 0) & (l < out_width) & (off_w < DIL_W * (WINDOW_W - 1) + 1)
                         & (off_w % DIL_W == 0))
                if MODE == 2:
                    acc += tl.load(scratch + row + l, mask=cover, other=0.0)
                else:
                    gv = tl.load(g + g_h + l * g_width_stride, mask=cover, other=0.0).to(COMPUTE_TYPE)
                    if MODE == 1:
                        divisor = count_h * _taps_inside(l * STRIDE_W - PAD_W, in_width, WINDOW_W, 1, PAD_W_HI,
                                                         COUNT_PAD).to(COMPUTE_TYPE)
                        acc += tl.where(cover, gv / divisor, 0.0)
                    else:
                        if RECOMPUTE:
                            arg = _window_argmax(x, x_image, i, j, l, cover, in_depth, in_height, in_width,
                                                 x_depth_stride, x_height_stride, x_width_stride, WINDOW_D,
                                                 WINDOW_H, WINDOW_W, STRIDE_D, STRIDE_H, STRIDE_W, PAD_D, PAD_H,
                                                 PAD_W, DIL_D, DIL_H, DIL_W, MODE == 3, COMPUTE_TYPE, BLOCK_SIZE)
                        else:
                            arg = tl.load(scratch + row + l, mask=cover, other=-1)
                        acc += tl.where(cover & (arg == me), gv, 0.0)
    if MODE == 2 or MODE == 3:
        xv = tl.load(x + x_image + p * x_depth_stride + q * x_height_stride + r * x_width_stride, mask=mask,
                     other=0.0).to(COMPUTE_TYPE)
        if MODE == 2:
            acc = acc * _pow(xv, GRAD_POWER, GRAD_KIND)
        else:
            acc = acc * tl.where(xv > 0, 1.0, tl.where(xv < 0, -1.0, 0.0)).to(COMPUTE_TYPE)   # sign(NaN) = 0
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _meta(spec, mode, count_include_pad, x):
    """The constexprs of a pooling launch and the power p (made once per spec, mode and dtype)."""
    return _meta_of(spec, mode, bool(count_include_pad), x.dtype, launch.INTERPRET)


@functools.lru_cache(maxsize=1024)
def _meta_of(spec, mode, count_include_pad, dtype, interpret):
    R = spec.rank
    lift = 3 - R
    window = (1,) * lift + spec.window
    stride = (1,) * lift + spec.stride
    dilation = (1,) * lift + spec.dilation
    lo = (0,) * lift + spec.padding[0::2]
    hi = (0,) * lift + spec.padding[1::2]
    p = spec.p if spec.p is not None and spec.p != math.inf else 1.0
    return dict(WINDOW_D=window[0], WINDOW_H=window[1], WINDOW_W=window[2],
                STRIDE_D=stride[0], STRIDE_H=stride[1], STRIDE_W=stride[2],
                PAD_D=lo[0], PAD_H=lo[1], PAD_W=lo[2], PAD_D_HI=hi[0], PAD_H_HI=hi[1], PAD_W_HI=hi[2],
                DIL_D=dilation[0], DIL_H=dilation[1], DIL_W=dilation[2], MODE=mode,
                COUNT_PAD=count_include_pad or mode == LP,
                COMPUTE_TYPE=numerics.compute_type(dtype), INTERP=interpret), p


def _pool_forward(x, spec, mode, count_include_pad=True, write=VALUE, grad=None):
    y_dtype = x.dtype if write == VALUE else torch.int32 if write == ARGMAX else _compute_torch_dtype(x.dtype)
    y = launch.empty(spec.out_shape, y_dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    sides, x_strides = _lift(x.shape, x.stride(), spec.rank)
    out_sides, _ = _lift(spec.out_shape, y.stride(), spec.rank)
    g = x if grad is None else grad
    _, g_strides = _lift(g.shape, g.stride(), spec.rank)
    block = _block(total)
    launch.launch(_pool_fwd_kernel, (launch.cdiv(total, block),), x, y, g, total, x.shape[1], *sides, *out_sides,
                  *x_strides, *g_strides, BLOCK_SIZE=block,
                  **_forward_meta(spec, mode, bool(count_include_pad), x.dtype, write, launch.INTERPRET))
    return y


@functools.lru_cache(maxsize=1024)
def _forward_meta(spec, mode, count_include_pad, dtype, write, interpret):
    """The constexprs of a forward pooling launch writing ``write``, once per spec, mode and dtype."""
    meta, p = _meta_of(spec, mode, count_include_pad, dtype, interpret)
    return dict(meta, WRITE=write, P=p, P_KIND=_power_kind(p), ROOT=1.0 / p, ROOT_KIND=_power_kind(1.0 / p),
                WEIGHT_POWER=1.0 / p - 1.0, WEIGHT_KIND=_power_kind(1.0 / p - 1.0))


def _compute_torch_dtype(dtype):
    """The torch dtype of the compute type: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pool_backward(grad, x, spec, mode, count_include_pad=True):
    _check_grad(grad, spec.out_shape)
    dx = launch.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    # windows that do not overlap (a UNet's 2 x 2 max-pool): the backward finds each window's
    # argmax itself, in one launch and one pass over x, with no scratch
    recompute = mode in (MAX, MAX_ABS) and _windows_apart(spec)
    if mode in (MAX, MAX_ABS) and not recompute:
        scratch = _pool_forward(x, spec, mode, write=ARGMAX)
    elif mode == LP:
        scratch = _pool_forward(x, spec, mode, write=LP_WEIGHT, grad=grad)
    else:
        scratch = dx                                            # (unused)
    sides, x_strides = _lift(x.shape, x.stride(), spec.rank)
    out_sides, g_strides = _lift(grad.shape, grad.stride(), spec.rank)
    meta, p = _meta(spec, mode, count_include_pad, x)
    block = _block(total)
    # x is read for LP, MAX_ABS and a recomputed argmax only: the others pass dx in its place (not loaded)
    x_read = x if mode in (LP, MAX_ABS) or recompute else dx
    launch.launch(_pool_bwd_kernel, (launch.cdiv(total, block),), grad, scratch, x_read, dx, total, x.shape[1],
                  *sides, *out_sides, *g_strides, *x_strides, GRAD_POWER=p - 1.0, GRAD_KIND=_power_kind(p - 1.0),
                  BLOCK_SIZE=block, RECOMPUTE=recompute, **meta)
    return dx


def _windows_apart(spec):
    """Whether no two windows share an input element: the stride at least the dilated window on every axis."""
    return all(s >= d * (k - 1) + 1 for k, s, d in zip(spec.window, spec.stride, spec.dilation))


def maxpool_forward(x, window, stride, padding, dilation=None, ceil_mode=False):
    spec = pool_spec("maxpool", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode)
    return _pool_forward(x, spec, MAX)


def maxpool_backward(grad, out, x, window, stride, padding, dilation=None, ceil_mode=False):
    """The gradient goes to each window's argmax (torch's rule), found again from ``x``."""
    spec = pool_spec("maxpool", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode)
    return (_pool_backward(grad, x, spec, MAX),)


def meanpool_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    spec = pool_spec("meanpool", x.shape, x.dtype, window, stride, padding, None, ceil_mode)
    return _pool_forward(x, spec, MEAN, count_include_pad)


def meanpool_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    spec = pool_spec("meanpool", x.shape, x.dtype, window, stride, padding, None, ceil_mode)
    return (_pool_backward(grad, x, spec, MEAN, count_include_pad),)


def lpnormpool_forward(x, p, window, stride, padding, dilation=None, ceil_mode=False):
    spec = pool_spec("lpnormpool", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode, p)
    return _pool_forward(x, spec, MAX_ABS if spec.p == math.inf else LP)


def lpnormpool_backward(grad, out, x, p, window, stride, padding, dilation=None, ceil_mode=False):
    """The window sums are found again from ``x`` (in the compute type, not
    from the rounded output)."""
    spec = pool_spec("lpnormpool", x.shape, x.dtype, window, stride, padding, dilation, ceil_mode, p)
    return (_pool_backward(grad, x, spec, MAX_ABS if spec.p == math.inf else LP),)


# --- adaptive windows ----------------------------------------------------------------------------

@triton.jit
def _adaptive_bounds(i, n, n_out):
    """[start, end) of adaptive window i: floor(i*n/n_out), ceil((i+1)*n/n_out)."""
    return (i * n) // n_out, ((i + 1) * n + n_out - 1) // n_out


@triton.jit
def _adaptive_fwd_kernel(x, y, total, channels, in_depth, in_height, in_width, out_depth, out_height, out_width,
                         x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                         LONGEST_D: tl.constexpr, LONGEST_H: tl.constexpr, LONGEST_W: tl.constexpr,
                         IS_MAX: tl.constexpr, WRITE_ARGMAX: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                         INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[n, c, i] = the maximum (IS_MAX; its input element with WRITE_ARGMAX)
    or the mean of adaptive window i, scanning up to the longest window
    (LONGEST_D x LONGEST_H x LONGEST_W)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, i, j, l = split_ncdhw(lin, channels, out_depth, out_height, out_width)
    base = n * x_batch_stride + c * x_channel_stride
    ds, de = _adaptive_bounds(i, in_depth, out_depth)
    hs, he = _adaptive_bounds(j, in_height, out_height)
    ws, we = _adaptive_bounds(l, in_width, out_width)
    best = tl.full((BLOCK_SIZE,), -float("inf"), COMPUTE_TYPE)
    arg = tl.full((BLOCK_SIZE,), -1, tl.int32)
    found = tl.zeros((BLOCK_SIZE,), tl.int1)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for a in range(0, LONGEST_D):
        d = ds + a
        ok_d = mask & (d < de)
        at_d = base + d * x_depth_stride
        for b in range(0, LONGEST_H):
            h = hs + b
            ok_h = ok_d & (h < he)
            at_h = at_d + h * x_height_stride
            row = (d * in_height + h) * in_width
            for e in range(0, LONGEST_W):
                w = ws + e
                ok = ok_h & (w < we)
                v = tl.load(x + at_h + w * x_width_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
                if IS_MAX:
                    best, arg, found = _max_step(v, (row + w).to(tl.int32), ok, best, arg, found)
                else:
                    acc += v
    if IS_MAX:
        if WRITE_ARGMAX:
            tl.store(y + lin, arg, mask=mask)
        else:
            tl.store(y + lin, store_value(best, y.dtype.element_ty, INTERP), mask=mask)
    else:
        size = ((de - ds) * (he - hs) * (we - ws)).to(COMPUTE_TYPE)
        tl.store(y + lin, store_value(acc / size, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _adaptive_bwd_kernel(g, argmax, dx, total, channels, in_depth, in_height, in_width,
                         out_depth, out_height, out_width,
                         g_batch_stride, g_channel_stride, g_depth_stride, g_height_stride, g_width_stride,
                         MOST_D: tl.constexpr, MOST_H: tl.constexpr, MOST_W: tl.constexpr, IS_MAX: tl.constexpr,
                         COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx per input element (p, q, r): over the windows that hold it (along
    the depth, i from floor(p*Do/D) to floor(((p+1)*Do - 1)/D), at most MOST_D
    of them; likewise along the height and the width), the gradient if the
    window's argmax is (p, q, r) (max), or g / (window size) (mean)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, p, q, r = split_ncdhw(lin, channels, in_depth, in_height, in_width)
    g_image = n * g_batch_stride + c * g_channel_stride
    argmax_image = (n * channels + c) * out_depth * out_height * out_width
    me = ((p * in_height + q) * in_width + r).to(tl.int32)
    first_i = (p * out_depth) // in_depth
    last_i = ((p + 1) * out_depth - 1) // in_depth
    first_j = (q * out_height) // in_height
    last_j = ((q + 1) * out_height - 1) // in_height
    first_l = (r * out_width) // in_width
    last_l = ((r + 1) * out_width - 1) // in_width
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for di in range(0, MOST_D):
        i = first_i + di
        cover_d = mask & (i <= last_i)
        g_d = g_image + i * g_depth_stride
        if not IS_MAX:
            ds, de = _adaptive_bounds(i, in_depth, out_depth)
        for dj in range(0, MOST_H):
            j = first_j + dj
            cover_h = cover_d & (j <= last_j)
            g_h = g_d + j * g_height_stride
            row = argmax_image + (i * out_height + j) * out_width
            if not IS_MAX:
                hs, he = _adaptive_bounds(j, in_height, out_height)
                size_h = ((de - ds) * (he - hs)).to(COMPUTE_TYPE)
            for dl in range(0, MOST_W):
                l = first_l + dl
                cover = cover_h & (l <= last_l)
                gv = tl.load(g + g_h + l * g_width_stride, mask=cover, other=0.0).to(COMPUTE_TYPE)
                if IS_MAX:
                    won = tl.load(argmax + row + l, mask=cover, other=-1) == me
                    acc += tl.where(cover & won, gv, 0.0)
                else:
                    ws, we = _adaptive_bounds(l, in_width, out_width)
                    acc += tl.where(cover, gv / (size_h * (we - ws).to(COMPUTE_TYPE)), 0.0)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _lifted(axes):
    return (None,) * (3 - len(axes)) + tuple(axes)


def _adaptive_forward(x, spec, is_max, argmax=False):
    y = launch.empty(spec.out_shape, torch.int32 if argmax else x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    sides, x_strides = _lift(x.shape, x.stride(), spec.rank)
    out_sides, _ = _lift(spec.out_shape, y.stride(), spec.rank)
    longest = [1 if a is None else a.taps for a in _lifted(spec.axes)]
    block = _block(total)
    launch.launch(_adaptive_fwd_kernel, (launch.cdiv(total, block),), x, y, total, x.shape[1], *sides, *out_sides,
                  *x_strides, LONGEST_D=longest[0], LONGEST_H=longest[1], LONGEST_W=longest[2], IS_MAX=is_max,
                  WRITE_ARGMAX=argmax, COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET,
                  BLOCK_SIZE=block)
    return y


def _adaptive_backward(grad, x, spec, is_max):
    _check_grad(grad, spec.out_shape)
    dx = launch.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    argmax = _adaptive_forward(x, spec, True, argmax=True) if is_max else dx   # (dx: an unused placeholder)
    sides, _ = _lift(x.shape, x.stride(), spec.rank)
    out_sides, g_strides = _lift(grad.shape, grad.stride(), spec.rank)
    most = [1 if a is None else a.most_covering for a in _lifted(spec.axes)]
    block = _block(total)
    launch.launch(_adaptive_bwd_kernel, (launch.cdiv(total, block),), grad, argmax, dx, total, x.shape[1], *sides,
                  *out_sides, *g_strides, MOST_D=most[0], MOST_H=most[1], MOST_W=most[2], IS_MAX=is_max,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return dx


def adaptive_maxpool_forward(x, size):
    return _adaptive_forward(x, adaptive_pool_spec("adaptive_maxpool", x.shape, x.dtype, size), True)


def adaptive_maxpool_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, adaptive_pool_spec("adaptive_maxpool", x.shape, x.dtype, size), True),)


def adaptive_meanpool_forward(x, size):
    return _adaptive_forward(x, adaptive_pool_spec("adaptive_meanpool", x.shape, x.dtype, size), False)


def adaptive_meanpool_backward(grad, out, x, size):
    return (_adaptive_backward(grad, x, adaptive_pool_spec("adaptive_meanpool", x.shape, x.dtype, size), False),)
