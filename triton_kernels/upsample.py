"""Upsampling by interpolation (nearest, linear / bilinear / trilinear) and
pixel shuffling, Triton kernels (forward and backward), for 1, 2 and 3
spatial axes.

Tensors ``(N, C, *spatial)`` are read through their strides; outputs are
new dense tensors in the input's dtype. Semantics are those of
``triflux.reference.upsample``; attributes, output sizes and the index rules
are the family's spec (``triflux.specs.upsample``), which the reference
builds too, so both sides accept and refuse the same attributes.

Every rank runs the same kernels on a canonical 3-d geometry (D, H, W): an
input of R < 3 spatial axes gets size-1 leading axes (stride 0), whose rule
is ABSENT (one tap, no weight: for linear, no ``1 * v + 0 * v``, which would
turn an infinity into NaN where torch has no axis at all), so a 2-d launch
folds the depth arithmetic away (an ABSENT rule is a constexpr, and Triton
specializes the integer 1 of the depth sides).

The source index of an output position is computed in the kernel by the
spec's rule (per axis a constexpr ``RULE`` and the ratio r, passed as its bit
pattern so that a float64 ratio reaches a float64 kernel exactly):

* nearest, 2-d: NEAREST_COPY (m == n, and ABSENT axes), NEAREST_HALVE
  (m == 2n), NEAREST_SCALE (min(floor(float32(d) * r), n - 1) in float32 for
  every dtype, as torch); 1-d and 3-d: NEAREST_GENERIC
  (min(floor(float32(d * r)), n - 1), d * r in float32, float64 for float64
  data, as torch's generic kernel);
* linear: LINEAR_COPY (m == n), LINEAR_FIRST (position 0: align_corners
  with one output or one input), LINEAR_ALIGN_CORNERS (s = d * r),
  LINEAR_HALF_PIXEL (s = max((d + 0.5) * r - 0.5, 0)), LINEAR_ABSENT; then
  i0 = min(floor(float32(s)), n - 1), i1 = min(i0 + 1, n - 1),
  lam = clip(s - i0, 0, 1), in float32 (float64 for float64 data).

Forwards gather (1 load per output for nearest, 2^R for linear, the axes
combined innermost first as the reference's separable passes). Backwards
gather too, one real axis at a time (along W into a scratch tensor in the
compute dtype, then along H, then along D, as the reference): per input
position p, over the output positions d that read it, a run of consecutive
d starting near (p * m) // n, whose offset and length (``first``, and
``COUNT``, a constexpr, per axis) the host takes from the spec's index
tables, with one position of slack on each side for the rounding of the
kernel's own index arithmetic; each candidate is checked with the forward's
rule and weighted with its weight, so no atomics and a deterministic result.

Pixel shuffle and unshuffle are one gather kernel (``_shuffle_kernel``):
each output element computes the input element it is a copy of (the spec's
index map); the backward of one is the other's forward on the gradient.

Indices are int32 where every offset of the launch fits (int64 beyond, and in
the interpreter), so the per-element divisions stay 32-bit on a GPU.
"""
from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from . import launch, numerics
from .indexing import split_ncdhw
from .numerics import store_value
from ..errors import ShapeError
from ..specs.upsample import pixel_shuffle_spec, upsample_spec

#: the RULE of a nearest axis
NEAREST_COPY = tl.constexpr(0)
NEAREST_HALVE = tl.constexpr(1)
NEAREST_SCALE = tl.constexpr(2)
NEAREST_GENERIC = tl.constexpr(3)
#: the RULE of a linear axis
LINEAR_COPY = tl.constexpr(0)
LINEAR_FIRST = tl.constexpr(1)
LINEAR_ALIGN_CORNERS = tl.constexpr(2)
LINEAR_HALF_PIXEL = tl.constexpr(3)
LINEAR_ABSENT = tl.constexpr(4)


def _block(n):
    return launch.block_for(n, 256)


def _index_type(block, *tensors, reach=0):
    """int32 where every element offset of ``tensors`` (shape, strides), a
    block's overhang and ``reach`` (another product the kernel forms) fit in
    31 bits; int64 beyond, and in the interpreter (which checks each 32-bit
    integer operation for overflow, op by op: several times slower)."""
    if launch.INTERPRET:
        return tl.int64
    reach = max([reach] + [sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0) + 1
                           for t in tensors])
    return tl.int32 if reach + 2 * block < 2 ** 31 else tl.int64


@triton.jit
def _nearest_src(d, n, RULE: tl.constexpr, ratio_bits, COMPUTE_TYPE: tl.constexpr):
    """The nearest rule's source position of output positions ``d``."""
    if RULE == NEAREST_COPY:
        src = d
    elif RULE == NEAREST_HALVE:
        src = d // 2
    elif RULE == NEAREST_SCALE:
        r = ratio_bits.to(tl.float32, bitcast=True)
        src = (d.to(tl.float32) * r).to(d.dtype)             # >= 0: truncation is floor
        src = tl.where(src < n - 1, src, n - 1)
    else:
        r = ratio_bits.to(tl.float64, bitcast=True).to(COMPUTE_TYPE)
        src = (d.to(COMPUTE_TYPE) * r).to(tl.float32).to(d.dtype)   # torch: floorf(d * r)
        src = tl.where(src < n - 1, src, n - 1)
    return src


@triton.jit
def _linear_src(d, n, RULE: tl.constexpr, ratio_bits, COMPUTE_TYPE: tl.constexpr):
    """(i0, i1, lam) of the linear rule for output positions ``d``."""
    if RULE == LINEAR_COPY or RULE == LINEAR_ABSENT:
        i0 = d
        i1 = d
        lam = tl.zeros(d.shape, COMPUTE_TYPE)
    elif RULE == LINEAR_FIRST:
        i0 = d * 0
        i1 = tl.where(i0 + 1 < n - 1, i0 + 1, n - 1)
        lam = tl.zeros(d.shape, COMPUTE_TYPE)
    else:
        r = ratio_bits.to(tl.float64, bitcast=True).to(COMPUTE_TYPE)
        if RULE == LINEAR_ALIGN_CORNERS:
            s = d.to(COMPUTE_TYPE) * r
        else:
            s = (d.to(COMPUTE_TYPE) + 0.5) * r - 0.5
            s = tl.where(s < 0.0, 0.0, s)
        i0 = s.to(tl.float32).to(d.dtype)                    # torch: floorf(float(s)), s >= 0
        i0 = tl.where(i0 < n - 1, i0, n - 1)
        i1 = tl.where(i0 + 1 < n - 1, i0 + 1, n - 1)
        lam = s - i0.to(COMPUTE_TYPE)
        lam = tl.where(lam < 0.0, 0.0, tl.where(lam > 1.0, 1.0, lam))
    return i0, i1, lam


@triton.jit
def _lerp(a_ptr, b_ptr, lam, mask, RULE: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """(1 - lam) * a + lam * b of the values at two pointers (both always
    read: 0 * NaN is NaN, as torch); the value at ``a_ptr`` for an ABSENT axis."""
    a = tl.load(a_ptr, mask=mask, other=0.0).to(COMPUTE_TYPE)
    if RULE == LINEAR_ABSENT:
        v = a
    else:
        b = tl.load(b_ptr, mask=mask, other=0.0).to(COMPUTE_TYPE)
        v = (1.0 - lam) * a + lam * b
    return v


@triton.jit
def _lerp_plane(plane, h0, h1, lh, w0, w1, lw, height_stride, width_stride, mask,
                RULE_HEIGHT: tl.constexpr, RULE_WIDTH: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """The bilinear value of an (H, W) plane: along W in rows h0 and h1, then along H."""
    row0 = plane + h0 * height_stride
    top = _lerp(row0 + w0 * width_stride, row0 + w1 * width_stride, lw, mask, RULE_WIDTH, COMPUTE_TYPE)
    if RULE_HEIGHT == LINEAR_ABSENT:
        v = top
    else:
        row1 = plane + h1 * height_stride
        bottom = _lerp(row1 + w0 * width_stride, row1 + w1 * width_stride, lw, mask, RULE_WIDTH, COMPUTE_TYPE)
        v = (1.0 - lh) * top + lh * bottom
    return v


@triton.jit
def _upsample_fwd_kernel(x, y, total, channels, in_depth, in_height, in_width, out_depth, out_height, out_width,
                         x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                         depth_ratio_bits, height_ratio_bits, width_ratio_bits,
                         RULE_DEPTH: tl.constexpr, RULE_HEIGHT: tl.constexpr, RULE_WIDTH: tl.constexpr,
                         LINEAR: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INDEX_TYPE: tl.constexpr,
                         INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[n, c, i, j, k] from the input elements the rules of the three axes
    name for output (i, j, k): one (nearest) or up to eight, weighted
    (LINEAR: two per axis that is not ABSENT)."""
    lin = tl.program_id(0).to(INDEX_TYPE) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(INDEX_TYPE)
    mask = lin < total
    n, c, i, j, k = split_ncdhw(lin, channels, out_depth, out_height, out_width)
    volume = x + n * x_batch_stride + c * x_channel_stride
    if LINEAR:
        d0, d1, ld = _linear_src(i, in_depth, RULE_DEPTH, depth_ratio_bits, COMPUTE_TYPE)
        h0, h1, lh = _linear_src(j, in_height, RULE_HEIGHT, height_ratio_bits, COMPUTE_TYPE)
        w0, w1, lw = _linear_src(k, in_width, RULE_WIDTH, width_ratio_bits, COMPUTE_TYPE)
        v = _lerp_plane(volume + d0 * x_depth_stride, h0, h1, lh, w0, w1, lw, x_height_stride, x_width_stride,
                        mask, RULE_HEIGHT, RULE_WIDTH, COMPUTE_TYPE)
        if RULE_DEPTH != LINEAR_ABSENT:
            back = _lerp_plane(volume + d1 * x_depth_stride, h0, h1, lh, w0, w1, lw, x_height_stride,
                               x_width_stride, mask, RULE_HEIGHT, RULE_WIDTH, COMPUTE_TYPE)
            v = (1.0 - ld) * v + ld * back
    else:
        d = _nearest_src(i, in_depth, RULE_DEPTH, depth_ratio_bits, COMPUTE_TYPE)
        h = _nearest_src(j, in_height, RULE_HEIGHT, height_ratio_bits, COMPUTE_TYPE)
        w = _nearest_src(k, in_width, RULE_WIDTH, width_ratio_bits, COMPUTE_TYPE)
        v = tl.load(volume + d * x_depth_stride + h * x_height_stride + w * x_width_stride, mask=mask,
                    other=0.0).to(COMPUTE_TYPE)
    tl.store(y + lin, store_value(v, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _tap_weight(d, p, n, RULE: tl.constexpr, ratio_bits, LINEAR: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """(whether output position d reads input position p, with what weight)."""
    if LINEAR:
        i0, i1, lam = _linear_src(d, n, RULE, ratio_bits, COMPUTE_TYPE)
        reads = (i0 == p) | (i1 == p)
        weight = tl.where(i0 == p, 1.0 - lam, 0.0) + tl.where(i1 == p, lam, 0.0)
    else:
        reads = _nearest_src(d, n, RULE, ratio_bits, COMPUTE_TYPE) == p
        weight = tl.where(reads, 1.0, 0.0).to(COMPUTE_TYPE)
    return reads, weight


@triton.jit
def _adjoint_kernel(src, dst, total, channels, size0, size1, size2,
                    src_batch_stride, src_channel_stride, src_stride0, src_stride1, src_stride2,
                    n_in, n_out, ratio_bits, first,
                    COUNT: tl.constexpr, RULE: tl.constexpr, AXIS: tl.constexpr, LINEAR: tl.constexpr,
                    COMPUTE_TYPE: tl.constexpr, INDEX_TYPE: tl.constexpr, INTERP: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr):
    """The backward along canonical axis AXIS (0: D, 1: H, 2: W):
    dst[n, c, q0, q1, q2] (dense, (N, C, size0, size1, size2)) is the sum
    over the output positions d that read input position p = q_AXIS of
    weight(d, p) * src[n, c, ..., d, ...] (d in place of q_AXIS), src read
    through its strides; the candidates d run from (p * n_out) // n_in + first,
    COUNT of them, each checked with the forward's rule."""
    lin = tl.program_id(0).to(INDEX_TYPE) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(INDEX_TYPE)
    mask = lin < total
    n, c, q0, q1, q2 = split_ncdhw(lin, channels, size0, size1, size2)
    base = src + n * src_batch_stride + c * src_channel_stride
    if AXIS == 0:
        p = q0
        base += q1 * src_stride1 + q2 * src_stride2
        axis_stride = src_stride0
    elif AXIS == 1:
        p = q1
        base += q0 * src_stride0 + q2 * src_stride2
        axis_stride = src_stride1
    else:
        p = q2
        base += q0 * src_stride0 + q1 * src_stride1
        axis_stride = src_stride2
    start = (p * n_out) // n_in + first
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for t in range(0, COUNT):
        d = start + t
        ok = mask & (d >= 0) & (d < n_out)
        reads, weight = _tap_weight(tl.where(ok, d, 0), p, n_in, RULE, ratio_bits, LINEAR, COMPUTE_TYPE)
        ok = ok & reads
        v = tl.load(base + d * axis_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
        acc += tl.where(ok, weight * v, 0.0)
    tl.store(dst + lin, store_value(acc, dst.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _shuffle_kernel(x, y, total, channels, size0, size1, size2, factor0, factor1, factor2,
                    x_batch_stride, x_channel_stride, x_stride0, x_stride1, x_stride2,
                    SHUFFLE: tl.constexpr, CONVERT: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                    INDEX_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """A copy by the pixel shuffle's index map, y dense (N, channels, size0, size1, size2);
    the factors are r along real axes and 1 along ABSENT ones (so r^R = factor0*factor1*factor2).
    SHUFFLE: y[n, c, r p0 + i0, ...] = x[n, c r^R + (i0 f1 + i1) f2 + i2, p0, ...];
    otherwise (unshuffle) y[n, c r^R + (i0 f1 + i1) f2 + i2, p0, ...] = x[n, c, r p0 + i0, ...].
    CONVERT: y's dtype is not x's (a gradient in another dtype than the input)."""
    lin = tl.program_id(0).to(INDEX_TYPE) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE).to(INDEX_TYPE)
    mask = lin < total
    n, c, q0, q1, q2 = split_ncdhw(lin, channels, size0, size1, size2)
    if SHUFFLE:
        p0 = q0 // factor0
        p1 = q1 // factor1
        p2 = q2 // factor2
        sub = ((q0 - p0 * factor0) * factor1 + (q1 - p1 * factor1)) * factor2 + (q2 - p2 * factor2)
        src_c = c * (factor0 * factor1 * factor2) + sub
        offset = n * x_batch_stride + src_c * x_channel_stride + p0 * x_stride0 + p1 * x_stride1 + p2 * x_stride2
    else:
        group = factor0 * factor1 * factor2
        src_c = c // group
        sub = c - src_c * group
        i2 = sub % factor2
        rest = sub // factor2
        i1 = rest % factor1
        i0 = rest // factor1
        offset = (n * x_batch_stride + src_c * x_channel_stride + (q0 * factor0 + i0) * x_stride0
                  + (q1 * factor1 + i1) * x_stride1 + (q2 * factor2 + i2) * x_stride2)
    v = tl.load(x + offset, mask=mask, other=0.0)
    if CONVERT:
        v = store_value(v.to(COMPUTE_TYPE), y.dtype.element_ty, INTERP)
    tl.store(y + lin, v, mask=mask)


# --- host side -----------------------------------------------------------------------------------

def _float32_bits(r):
    return int(np.float32(r).view(np.int32))


def _float64_bits(r):
    return int(np.float64(r).view(np.int64))


@lru_cache(maxsize=1024)
def _kernel_axis(axis):
    """(RULE, ratio bits, first, count) of a spec's :class:`UpsampleAxis`: the
    rule and ratio of the kernel's index computation, and the run of output
    positions the backward checks for input position p: from
    (p * m) // n + first, count of them."""
    n, m, scale = axis.size, axis.out, axis.scale
    if axis.linear:
        t = axis.compute_dtype.type
        reach = 1                                               # i1 = i0 + 1 reads p when i0 = p - 1
        if m == n:
            rule, bits = LINEAR_COPY.value, 0
        elif axis.align_corners and (m == 1 or n == 1):
            rule, bits = LINEAR_FIRST.value, 0                  # r = 0: every output reads position 0
        elif axis.align_corners:
            rule, bits = LINEAR_ALIGN_CORNERS.value, _float64_bits(t(n - 1) / t(m - 1))
        else:
            rule, bits = LINEAR_HALF_PIXEL.value, _float64_bits(t(1.0 / scale) if scale is not None else t(n) / t(m))
    elif not axis.special:
        reach, t = 0, axis.compute_dtype.type
        rule, bits = NEAREST_GENERIC.value, _float64_bits(t(1.0 / scale) if scale is not None else t(n) / t(m))
    else:
        reach = 0
        if m == n:
            rule, bits = NEAREST_COPY.value, 0
        elif m == 2 * n:
            rule, bits = NEAREST_HALVE.value, 0
        else:
            rule = NEAREST_SCALE.value
            bits = _float32_bits(1.0 / scale if scale is not None else np.float32(n) / np.float32(m))
    p = np.arange(n)
    lo = np.searchsorted(axis.i0, p - reach - 1, side="left")      # one position of slack each side
    hi = np.searchsorted(axis.i0, p + 1, side="right")
    base = (p * m) // n
    first = int((lo - base).min())
    return rule, bits, first, int((hi - base).max()) - first


#: (rule, ratio bits) of a lifted size-1 axis
_ABSENT = {True: (LINEAR_ABSENT.value, 0), False: (NEAREST_COPY.value, 0)}


def _canonical(shape, strides, rank):
    """A (N, C, *spatial) shape and strides lifted to 5 dims (N, C, D, H, W): size-1, stride-0 leading axes."""
    pad = 3 - rank
    return tuple(shape[:2]) + (1,) * pad + tuple(shape[2:]), tuple(strides[:2]) + (0,) * pad + tuple(strides[2:])


def _forward(x, spec):
    rank = spec.rank
    rules = [_ABSENT[spec.linear]] * (3 - rank) + [_kernel_axis(a)[:2] for a in spec.axes]
    y = launch.empty(spec.out_shape, x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    (N, C, D, H, W), strides = _canonical(x.shape, x.stride(), rank)
    _, _, Do, Ho, Wo = _canonical(spec.out_shape, (0,) * len(spec.out_shape), rank)[0]
    block = _block(total)
    launch.launch(_upsample_fwd_kernel, (launch.cdiv(total, block),), x, y, total, C, D, H, W, Do, Ho, Wo,
                  *strides, *(bits for _, bits in rules), RULE_DEPTH=rules[0][0], RULE_HEIGHT=rules[1][0],
                  RULE_WIDTH=rules[2][0], LINEAR=spec.linear, COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  INDEX_TYPE=_index_type(block, x, y), INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return y


def _backward(grad, x, spec):
    """One adjoint pass per spatial axis, the last first: the intermediate
    results in scratch tensors of the compute dtype, the last pass into dx."""
    if tuple(grad.shape) != spec.out_shape:
        raise ShapeError(f"{spec.name}: gradient of shape {tuple(grad.shape)}, expected {spec.out_shape}")
    dx = launch.empty(x.shape, x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    rank = spec.rank
    ct = numerics.compute_type(x.dtype)
    scratch_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    src = grad
    sides = list(spec.out_shape)
    for k in reversed(range(rank)):
        axis = spec.axes[k]
        sides[2 + k] = axis.size
        dst = dx if k == 0 else launch.empty(tuple(sides), scratch_dtype, x.device)
        rule, bits, first, count = _kernel_axis(axis)
        (_, C, S0, S1, S2), strides = _canonical(dst.shape, src.stride(), rank)
        total = dst.numel()
        block = _block(total)
        index_type = _index_type(block, src, dst, reach=axis.size * axis.out)
        launch.launch(_adjoint_kernel, (launch.cdiv(total, block),), src, dst, total, C, S0, S1, S2, *strides,
                      axis.size, axis.out, bits, first, COUNT=count, RULE=rule, AXIS=3 - rank + k,
                      LINEAR=spec.linear, COMPUTE_TYPE=ct, INDEX_TYPE=index_type, INTERP=launch.INTERPRET,
                      BLOCK_SIZE=block)
        src = dst
    return dx


def upsample_nearest_forward(x, size=None, scale=None):
    return _forward(x, upsample_spec("upsample_nearest", x.shape, x.dtype, size, scale))


def upsample_nearest_backward(grad, out, x, size=None, scale=None):
    return (_backward(grad, x, upsample_spec("upsample_nearest", x.shape, x.dtype, size, scale)),)


def upsample_linear_forward(x, size=None, scale=None, align_corners=False):
    return _forward(x, upsample_spec("upsample_linear", x.shape, x.dtype, size, scale, align_corners))


def upsample_linear_backward(grad, out, x, size=None, scale=None, align_corners=False):
    return (_backward(grad, x, upsample_spec("upsample_linear", x.shape, x.dtype, size, scale, align_corners)),)


# --- pixel shuffle -------------------------------------------------------------------------------------

def _shuffle(src, out_shape, factor, rank, shuffle, dtype=None):
    """The gather of ``_shuffle_kernel`` from ``src`` into a new dense tensor of ``out_shape``
    and ``dtype`` (default: src's)."""
    dtype = src.dtype if dtype is None else dtype
    y = launch.empty(out_shape, dtype, src.device)
    total = y.numel()
    if total == 0:
        return y
    (_, C, S0, S1, S2), _ = _canonical(out_shape, (0,) * len(out_shape), rank)
    _, strides = _canonical(src.shape, src.stride(), rank)
    factors = (1,) * (3 - rank) + (factor,) * rank
    block = _block(total)
    launch.launch(_shuffle_kernel, (launch.cdiv(total, block),), src, y, total, C, S0, S1, S2, *factors, *strides,
                  SHUFFLE=shuffle, CONVERT=dtype != src.dtype, COMPUTE_TYPE=numerics.compute_type(src.dtype),
                  INDEX_TYPE=_index_type(block, src, y), INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return y


def _grad_check(grad, spec):
    if tuple(grad.shape) != spec.out_shape:
        raise ShapeError(f"{spec.name}: gradient of shape {tuple(grad.shape)}, expected {spec.out_shape}")


def pixel_shuffle_forward(x, factor):
    spec = pixel_shuffle_spec("pixel_shuffle", x.shape, x.dtype, factor)
    return _shuffle(x, spec.out_shape, spec.factor, spec.rank, True)


def pixel_shuffle_backward(grad, out, x, factor):
    spec = pixel_shuffle_spec("pixel_shuffle", x.shape, x.dtype, factor)
    _grad_check(grad, spec)
    return (_shuffle(grad, spec.x_shape, spec.factor, spec.rank, False, x.dtype),)


def pixel_unshuffle_forward(x, factor):
    spec = pixel_shuffle_spec("pixel_unshuffle", x.shape, x.dtype, factor)
    return _shuffle(x, spec.out_shape, spec.factor, spec.rank, False)


def pixel_unshuffle_backward(grad, out, x, factor):
    spec = pixel_shuffle_spec("pixel_unshuffle", x.shape, x.dtype, factor)
    _grad_check(grad, spec)
    return (_shuffle(grad, spec.x_shape, spec.factor, spec.rank, True, x.dtype),)
