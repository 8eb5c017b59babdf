"""Upsampling by interpolation (nearest, bilinear), Triton kernels (forward
and backward).

NCHW tensors read through their strides; outputs are new dense tensors in
the input's dtype. Semantics are those of ``triflux.reference.upsample``;
attributes, output sizes and the index rules are the family's spec
(``triflux.specs.upsample``), which the reference builds too, so both sides
accept and refuse the same attributes.

The source index of an output position is computed in the kernel by the
spec's rule (per axis a constexpr ``RULE`` and the ratio r, passed as its bit
pattern so that a float64 ratio reaches a float64 kernel exactly):

* nearest: NEAREST_COPY (m == n), NEAREST_HALVE (m == 2n), NEAREST_SCALE
  (min(floor(float32(d) * r), n - 1) in float32 for every dtype, as torch);
* bilinear: LINEAR_COPY (m == n), LINEAR_FIRST (position 0: align_corners
  with one output or one input), LINEAR_ALIGN_CORNERS (s = d * r),
  LINEAR_HALF_PIXEL (s = max((d + 0.5) * r - 0.5, 0)); then
  i0 = min(floor(float32(s)), n - 1), i1 = min(i0 + 1, n - 1),
  lam = clip(s - i0, 0, 1), in float32 (float64 for float64 data).

Forwards gather (1 or 4 loads per output). Backwards gather too, one axis
at a time (along W into a scratch tensor in the compute dtype, then along H,
as the reference): per input position p, over the output positions d that
read it, a run of consecutive d starting near (p * m) // n, whose offset and
length (``first``, and ``COUNT``, a constexpr, per axis) the host takes
from the spec's index tables, with one position of slack on each side for
the rounding of the kernel's own index arithmetic; each candidate is checked
with the forward's rule and weighted with its weight, so no atomics and a
deterministic result.
"""
from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from . import launch, numerics
from .indexing import split_nchw
from .numerics import store_value
from ..errors import ShapeError
from ..specs.upsample import upsample2d_spec

#: the RULE of a nearest axis
NEAREST_COPY = tl.constexpr(0)
NEAREST_HALVE = tl.constexpr(1)
NEAREST_SCALE = tl.constexpr(2)
#: the RULE of a bilinear axis
LINEAR_COPY = tl.constexpr(0)
LINEAR_FIRST = tl.constexpr(1)
LINEAR_ALIGN_CORNERS = tl.constexpr(2)
LINEAR_HALF_PIXEL = tl.constexpr(3)


def _block(n):
    return launch.block_for(n, 256)


@triton.jit
def _nearest_src(d, n, RULE: tl.constexpr, ratio_bits):
    """The nearest rule's source position of output positions ``d``."""
    if RULE == NEAREST_COPY:
        src = d
    elif RULE == NEAREST_HALVE:
        src = d // 2
    else:
        r = ratio_bits.to(tl.float32, bitcast=True)
        src = (d.to(tl.float32) * r).to(tl.int64)           # >= 0: truncation is floor
        src = tl.where(src < n - 1, src, n - 1)
    return src


@triton.jit
def _linear_src(d, n, RULE: tl.constexpr, ratio_bits, COMPUTE_TYPE: tl.constexpr):
    """(i0, i1, lam) of the bilinear rule for output positions ``d``."""
    if RULE == LINEAR_COPY:
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
        i0 = s.to(tl.float32).to(tl.int64)                   # torch: floorf(float(s)), s >= 0
        i0 = tl.where(i0 < n - 1, i0, n - 1)
        i1 = tl.where(i0 + 1 < n - 1, i0 + 1, n - 1)
        lam = s - i0.to(COMPUTE_TYPE)
        lam = tl.where(lam < 0.0, 0.0, tl.where(lam > 1.0, 1.0, lam))
    return i0, i1, lam


@triton.jit
def _upsample_fwd_kernel(x, y, total, channels, in_height, in_width, out_height, out_width,
                         x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                         height_ratio_bits, width_ratio_bits,
                         RULE_HEIGHT: tl.constexpr, RULE_WIDTH: tl.constexpr, BILINEAR: tl.constexpr,
                         COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[n, c, i, j] from the input pixels the rules of the two axes name for
    output (i, j): one (nearest) or four, weighted (BILINEAR)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, i, j = split_nchw(lin, channels, out_height, out_width)
    image = x + n * x_batch_stride + c * x_channel_stride
    if BILINEAR:
        h0, h1, lh = _linear_src(i, in_height, RULE_HEIGHT, height_ratio_bits, COMPUTE_TYPE)
        w0, w1, lw = _linear_src(j, in_width, RULE_WIDTH, width_ratio_bits, COMPUTE_TYPE)
        v00 = tl.load(image + h0 * x_height_stride + w0 * x_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
        v01 = tl.load(image + h0 * x_height_stride + w1 * x_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
        v10 = tl.load(image + h1 * x_height_stride + w0 * x_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
        v11 = tl.load(image + h1 * x_height_stride + w1 * x_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
        v = (1.0 - lh) * ((1.0 - lw) * v00 + lw * v01) + lh * ((1.0 - lw) * v10 + lw * v11)
    else:
        h = _nearest_src(i, in_height, RULE_HEIGHT, height_ratio_bits)
        w = _nearest_src(j, in_width, RULE_WIDTH, width_ratio_bits)
        v = tl.load(image + h * x_height_stride + w * x_width_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
    tl.store(y + lin, store_value(v, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _tap_weight(d, p, n, RULE: tl.constexpr, ratio_bits, BILINEAR: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """(whether output position d reads input position p, with what weight)."""
    if BILINEAR:
        i0, i1, lam = _linear_src(d, n, RULE, ratio_bits, COMPUTE_TYPE)
        reads = (i0 == p) | (i1 == p)
        weight = tl.where(i0 == p, 1.0 - lam, 0.0) + tl.where(i1 == p, lam, 0.0)
    else:
        reads = _nearest_src(d, n, RULE, ratio_bits) == p
        weight = tl.where(reads, 1.0, 0.0).to(COMPUTE_TYPE)
    return reads, weight


@triton.jit
def _adjoint_kernel(src, dst, total, channels, rows, cols,
                    src_batch_stride, src_channel_stride, src_row_stride, src_col_stride,
                    n_in, n_out, ratio_bits, first,
                    COUNT: tl.constexpr, RULE: tl.constexpr, ALONG_WIDTH: tl.constexpr, BILINEAR: tl.constexpr,
                    COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The backward along one axis: dst[n, c, r, q] (dense, (N, C, rows, cols))
    is the sum over the output positions d that read input position p (q
    along the width, r along the height) of weight(d, p) * src[..., d, ...],
    src read through its strides; the candidates d run from
    (p * n_out) // n_in + first, COUNT of them, each checked with the forward's rule."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    n, c, r, q = split_nchw(lin, channels, rows, cols)
    if ALONG_WIDTH:
        p = q
    else:
        p = r
    start = (p * n_out) // n_in + first
    image = src + n * src_batch_stride + c * src_channel_stride
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for t in range(0, COUNT):
        d = start + t
        ok = mask & (d >= 0) & (d < n_out)
        reads, weight = _tap_weight(tl.where(ok, d, 0), p, n_in, RULE, ratio_bits, BILINEAR, COMPUTE_TYPE)
        ok = ok & reads
        if ALONG_WIDTH:
            v = tl.load(image + r * src_row_stride + d * src_col_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
        else:
            v = tl.load(image + d * src_row_stride + q * src_col_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
        acc += tl.where(ok, weight * v, 0.0)
    tl.store(dst + lin, store_value(acc, dst.dtype.element_ty, INTERP), mask=mask)


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
    if axis.bilinear:
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


def _spec(op, x, size, scale, align_corners=False):
    return upsample2d_spec(op, x.shape, x.dtype, size, scale, align_corners)


def _forward(x, spec):
    (rule_h, bits_h, _, _), (rule_w, bits_w, _, _) = _kernel_axis(spec.rows), _kernel_axis(spec.cols)
    N, C, H, W = x.shape
    Ho, Wo = spec.out_shape[2:]
    y = launch.empty(spec.out_shape, x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    launch.launch(_upsample_fwd_kernel, (launch.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), bits_h, bits_w, RULE_HEIGHT=rule_h, RULE_WIDTH=rule_w, BILINEAR=spec.bilinear,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return y


def _backward(grad, x, spec):
    """Along W into a scratch tensor in the compute dtype, then along H."""
    N, C, H, W = x.shape
    Ho, Wo = spec.out_shape[2:]
    if tuple(grad.shape) != spec.out_shape:
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {spec.out_shape}")
    dx = launch.empty(x.shape, x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    ct = numerics.compute_type(x.dtype)
    rows = launch.empty((N, C, Ho, W), torch.float64 if x.dtype == torch.float64 else torch.float32, x.device)
    for src, dst, axis, n_in, n_out, along_width in (
            (grad, rows, spec.cols, W, Wo, True), (rows, dx, spec.rows, H, Ho, False)):
        rule, bits, first, count = _kernel_axis(axis)
        total = dst.numel()
        block = _block(total)
        launch.launch(_adjoint_kernel, (launch.cdiv(total, block),), src, dst, total, C, dst.shape[2],
                      dst.shape[3], *src.stride(), n_in, n_out, bits, first, COUNT=count, RULE=rule,
                      ALONG_WIDTH=along_width, BILINEAR=spec.bilinear, COMPUTE_TYPE=ct, INTERP=launch.INTERPRET,
                      BLOCK_SIZE=block)
    return dx


def upsample_nearest2d_forward(x, size=None, scale=None):
    return _forward(x, _spec("upsample_nearest2d", x, size, scale))


def upsample_nearest2d_backward(grad, out, x, size=None, scale=None):
    return (_backward(grad, x, _spec("upsample_nearest2d", x, size, scale)),)


def upsample_bilinear2d_forward(x, size=None, scale=None, align_corners=False):
    return _forward(x, _spec("upsample_bilinear2d", x, size, scale, align_corners))


def upsample_bilinear2d_backward(grad, out, x, size=None, scale=None, align_corners=False):
    return (_backward(grad, x, _spec("upsample_bilinear2d", x, size, scale, align_corners)),)
