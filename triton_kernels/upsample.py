"""Upsampling by interpolation (nearest, bilinear), Triton kernels (forward
and backward).

NCHW tensors read through their strides; outputs are new dense tensors in
the input's dtype. Semantics, attributes and output sizes are those of
``triflux.reference.upsample`` (its size and index rules; the host side
uses its functions, so both sides accept and refuse the same attributes).

The source index of an output position is computed in the kernel by the
reference's rule (per axis a constexpr ``RULE`` and the ratio r, passed as
its bit pattern so that a float64 ratio reaches a float64 kernel exactly):

* nearest: RULE 0 copies (m == n), 1 halves (m == 2n), 2 computes
  min(floor(float32(d) * r), n - 1) in float32 for every dtype, as torch;
* bilinear: RULE 0 copies (m == n), 1 reads position 0 (align_corners with
  one output or one input), 2 scales (align_corners: s = d * r), 3 the half-pixel rule
  s = max((d + 0.5) * r - 0.5, 0); then i0 = min(floor(float32(s)), n - 1),
  i1 = min(i0 + 1, n - 1), lam = clip(s - i0, 0, 1), in float32 (float64
  for float64 data).

Forwards gather (1 or 4 loads per output). Backwards gather too, one axis
at a time (along W into a scratch tensor in the compute dtype, then along H,
as the reference): per input position p, over the output positions d that
read it, a run of consecutive d starting near (p * m) // n, whose offset and
length (``first``, and ``COUNT``, a constexpr, per axis) the host takes
from the reference's index tables, with one position of slack on each side
for the rounding of the kernel's own index arithmetic; each candidate is
checked with the forward's rule and weighted with its weight, so no atomics
and a deterministic result.
"""
from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from . import common
from .common import split_nchw, store_value
from ..errors import ShapeError


def _check(x, what):
    if x.dim() != 4:
        raise ShapeError(f"{what} expects an NCHW tensor of 4 dimensions, got shape {tuple(x.shape)}")


def _block(n):
    return common.block_for(n, 256)


@triton.jit
def _nearest_src(d, n, RULE: tl.constexpr, r_bits):
    """The nearest rule's source position of output positions ``d``."""
    if RULE == 0:
        src = d
    elif RULE == 1:
        src = d // 2
    else:
        r = r_bits.to(tl.float32, bitcast=True)
        src = (d.to(tl.float32) * r).to(tl.int64)           # >= 0: truncation is floor
        src = tl.where(src < n - 1, src, n - 1)
    return src


@triton.jit
def _linear_src(d, n, RULE: tl.constexpr, r_bits, CT: tl.constexpr):
    """(i0, i1, lam) of the bilinear rule for output positions ``d``."""
    if RULE == 0:
        i0 = d
        i1 = d
        lam = tl.zeros(d.shape, CT)
    elif RULE == 1:
        i0 = d * 0
        i1 = tl.where(i0 + 1 < n - 1, i0 + 1, n - 1)
        lam = tl.zeros(d.shape, CT)
    else:
        r = r_bits.to(tl.float64, bitcast=True).to(CT)
        if RULE == 2:
            s = d.to(CT) * r
        else:
            s = (d.to(CT) + 0.5) * r - 0.5
            s = tl.where(s < 0.0, 0.0, s)
        i0 = s.to(tl.float32).to(tl.int64)                   # torch: floorf(float(s)), s >= 0
        i0 = tl.where(i0 < n - 1, i0, n - 1)
        i1 = tl.where(i0 + 1 < n - 1, i0 + 1, n - 1)
        lam = s - i0.to(CT)
        lam = tl.where(lam < 0.0, 0.0, tl.where(lam > 1.0, 1.0, lam))
    return i0, i1, lam


@triton.jit
def _upsample_fwd_kernel(x, y, total, C, H, W, Ho, Wo, sxn, sxc, sxh, sxw, rh_bits, rw_bits,
                         RULE_H: tl.constexpr, RULE_W: tl.constexpr, BILINEAR: tl.constexpr,
                         CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, i, j = split_nchw(lin, C, Ho, Wo)
    base = x + n * sxn + c * sxc
    if BILINEAR:
        h0, h1, lh = _linear_src(i, H, RULE_H, rh_bits, CT)
        w0, w1, lw = _linear_src(j, W, RULE_W, rw_bits, CT)
        v00 = tl.load(base + h0 * sxh + w0 * sxw, mask=mask, other=0.0).to(CT)
        v01 = tl.load(base + h0 * sxh + w1 * sxw, mask=mask, other=0.0).to(CT)
        v10 = tl.load(base + h1 * sxh + w0 * sxw, mask=mask, other=0.0).to(CT)
        v11 = tl.load(base + h1 * sxh + w1 * sxw, mask=mask, other=0.0).to(CT)
        v = (1.0 - lh) * ((1.0 - lw) * v00 + lw * v01) + lh * ((1.0 - lw) * v10 + lw * v11)
    else:
        h = _nearest_src(i, H, RULE_H, rh_bits)
        w = _nearest_src(j, W, RULE_W, rw_bits)
        v = tl.load(base + h * sxh + w * sxw, mask=mask, other=0.0).to(CT)
    tl.store(y + lin, store_value(v, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _tap_weight(d, p, n, RULE: tl.constexpr, r_bits, BILINEAR: tl.constexpr, CT: tl.constexpr):
    """(whether output position d reads input position p, with what weight)."""
    if BILINEAR:
        i0, i1, lam = _linear_src(d, n, RULE, r_bits, CT)
        reads = (i0 == p) | (i1 == p)
        weight = tl.where(i0 == p, 1.0 - lam, 0.0) + tl.where(i1 == p, lam, 0.0)
    else:
        reads = _nearest_src(d, n, RULE, r_bits) == p
        weight = tl.where(reads, 1.0, 0.0).to(CT)
    return reads, weight


@triton.jit
def _adjoint_kernel(src, dst, total, C, R, Q, ssn, ssc, ssr, ssq, n_in, n_out, r_bits, first,
                    COUNT: tl.constexpr, RULE: tl.constexpr, ALONG_W: tl.constexpr, BILINEAR: tl.constexpr,
                    CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """The backward along one axis: dst[n, c, r, q] (dense, (N, C, R, Q)) is
    the sum over the output positions d that read input position p (q along
    W, r along H) of weight(d, p) * src[..., d, ...], src read through its
    strides; the candidates d run from (p * n_out) // n_in + first, COUNT of
    them, each checked with the forward's rule."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, r, q = split_nchw(lin, C, R, Q)
    if ALONG_W:
        p = q
    else:
        p = r
    start = (p * n_out) // n_in + first
    base = src + n * ssn + c * ssc
    acc = tl.zeros((BLOCK,), CT)
    for t in range(0, COUNT):
        d = start + t
        ok = mask & (d >= 0) & (d < n_out)
        reads, weight = _tap_weight(tl.where(ok, d, 0), p, n_in, RULE, r_bits, BILINEAR, CT)
        ok = ok & reads
        if ALONG_W:
            v = tl.load(base + r * ssr + d * ssq, mask=ok, other=0.0).to(CT)
        else:
            v = tl.load(base + d * ssr + q * ssq, mask=ok, other=0.0).to(CT)
        acc += tl.where(ok, weight * v, 0.0)
    tl.store(dst + lin, store_value(acc, dst.dtype.element_ty, INTERP), mask=mask)


# --- host side -----------------------------------------------------------------------------------

def _float32_bits(r):
    return int(np.float32(r).view(np.int32))


def _float64_bits(r):
    return int(np.float64(r).view(np.int64))


@lru_cache(maxsize=512)
def _axis(n, m, scale, bilinear, align_corners, ct):
    """(RULE, ratio bits, first, count) of one axis: the rule and ratio of the
    kernel's index computation, and the run of output positions the backward
    checks for input position p: from (p * m) // n + first, count of them."""
    from ..reference import upsample as ref
    if bilinear:
        i0, _, _ = ref.linear_source(n, m, scale, align_corners, ct)
        reach = 1                                               # i1 = i0 + 1 reads p when i0 = p - 1
        if m == n:
            rule, bits = 0, 0
        elif align_corners and (m == 1 or n == 1):
            rule, bits = 1, 0                                   # r = 0: every output reads position 0
        elif align_corners:
            rule, bits = 2, _float64_bits(np.dtype(ct).type(n - 1) / np.dtype(ct).type(m - 1))
        else:
            t = np.dtype(ct).type
            rule, bits = 3, _float64_bits(t(1.0 / scale) if scale is not None else t(n) / t(m))
    else:
        i0 = ref.nearest_source(n, m, scale)
        reach = 0
        if m == n:
            rule, bits = 0, 0
        elif m == 2 * n:
            rule, bits = 1, 0
        else:
            rule = 2
            bits = _float32_bits(1.0 / scale if scale is not None else np.float32(n) / np.float32(m))
    p = np.arange(n)
    lo = np.searchsorted(i0, p - reach - 1, side="left")      # one position of slack each side
    hi = np.searchsorted(i0, p + 1, side="right")
    base = (p * m) // n
    first = int((lo - base).min())
    return rule, bits, first, int((hi - base).max()) - first


def _setup(x, size, scale, bilinear, align_corners):
    from ..reference.upsample import upsample_size
    _check(x, "upsampling")
    (Ho, Wo), sc = upsample_size(tuple(x.shape), size, scale)
    H, W = x.shape[2], x.shape[3]
    sh, sw = sc if sc is not None else (None, None)
    ct = np.dtype(np.float64) if x.dtype == torch.float64 else np.dtype(np.float32)
    return (Ho, Wo), _axis(H, Ho, sh, bilinear, bool(align_corners), ct), \
        _axis(W, Wo, sw, bilinear, bool(align_corners), ct)


def _forward(x, size, scale, bilinear, align_corners=False):
    (Ho, Wo), ah, aw = _setup(x, size, scale, bilinear, align_corners)
    N, C, H, W = x.shape
    y = common.empty((N, C, Ho, Wo), x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    common.launch(_upsample_fwd_kernel, (common.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), ah[1], aw[1], RULE_H=ah[0], RULE_W=aw[0], BILINEAR=bilinear,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return y


def _backward(grad, x, size, scale, bilinear, align_corners=False):
    """Along W into a scratch tensor in the compute dtype, then along H."""
    (Ho, Wo), ah, aw = _setup(x, size, scale, bilinear, align_corners)
    N, C, H, W = x.shape
    if tuple(grad.shape) != (N, C, Ho, Wo):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {(N, C, Ho, Wo)}")
    dx = common.empty(x.shape, x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    ct = common.compute_type(x.dtype)
    rows = common.empty((N, C, Ho, W), torch.float64 if x.dtype == torch.float64 else torch.float32, x.device)
    for src, dst, (rule, bits, first, count), n_in, n_out, along_w in (
            (grad, rows, aw, W, Wo, True), (rows, dx, ah, H, Ho, False)):
        total = dst.numel()
        block = _block(total)
        common.launch(_adjoint_kernel, (common.cdiv(total, block),), src, dst, total, C, dst.shape[2],
                      dst.shape[3], *src.stride(), n_in, n_out, bits, first, COUNT=count, RULE=rule,
                      ALONG_W=along_w, BILINEAR=bilinear, CT=ct, INTERP=common.INTERPRET, BLOCK=block)
    return dx


def upsample_nearest2d_forward(x, size=None, scale=None):
    return _forward(x, size, scale, False)


def upsample_nearest2d_backward(grad, out, x, size=None, scale=None):
    return (_backward(grad, x, size, scale, False),)


def upsample_bilinear2d_forward(x, size=None, scale=None, align_corners=False):
    return _forward(x, size, scale, True, align_corners)


def upsample_bilinear2d_backward(grad, out, x, size=None, scale=None, align_corners=False):
    return (_backward(grad, x, size, scale, True, align_corners),)
