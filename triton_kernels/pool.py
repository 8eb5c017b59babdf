"""Pooling and upsampling, Triton kernels (forward and backward).

NCHW tensors, read through their strides (any view works without a copy);
outputs are new dense tensors in the input's dtype. Arithmetic is in float32
(float64 for float64). Semantics, attributes and output sizes are those of
``triflux.reference.pool`` (see its docstrings).

Every kernel is a "gather": one program computes a tile of BLOCK elements of
its result (flattened row-major), each element looping over the few values
it depends on (statically unrolled loops: window, stride and scale are
constexpr). No atomics, so every result is deterministic:

* forwards: one program per tile of output pixels, looping over the window
  (pools) or the 1 / 4 source pixels (nearest / bilinear);
* ``maxpool2d`` backward: per input pixel, the at most ceil(kh/sh) x
  ceil(kw/sw) windows that cover it; for each, the window's argmax is
  recomputed from ``x`` (first maximal element in row-major window scan
  order, torch's tie rule; padding never wins; NaN counts as maximal) and the
  window's gradient is taken when the argmax is this pixel. Cost: kh*kw loads
  per covering window (a faster version would save the argmax indices in the
  forward, which the registry's (grad, out, x) signature does not carry);
* ``meanpool2d`` backward: per input pixel, the sum of g / (kh*kw) over the
  covering windows;
* ``upsample_nearest2d`` backward: per input pixel, the sum of its sh x sw
  block of the gradient;
* ``upsample_bilinear2d`` backward: per input pixel (p, q), the output rows
  i in [sh*(p-1), sh*(p+2)) and columns j in [sw*(q-1), sw*(q+2)) (a superset
  of those that interpolate from it), each weighted by the interpolation
  weight recomputed exactly as in the forward (zero for the ones that do not
  read (p, q)).
"""
import triton
import triton.language as tl

from . import common
from .common import store_value
from ..errors import ShapeError


def _geometry(x, window, stride, padding):
    from ..reference.pool import pool_geometry
    if x.dim() != 4:
        raise ShapeError(f"pooling expects an NCHW tensor of 4 dimensions, got shape {tuple(x.shape)}")
    return pool_geometry(tuple(x.shape), window, stride, padding)


def _scale(x, scale):
    from ..reference.pool import _pair
    if x.dim() != 4:
        raise ShapeError(f"upsampling expects an NCHW tensor of 4 dimensions, got shape {tuple(x.shape)}")
    return _pair(scale, "scale")


def _block(n):
    return common.block_for(n, 256)


@triton.jit
def _split(lin, C, H, W):
    """(n, c, h, w) of the row-major linear index ``lin`` into (N, C, H, W)."""
    w = lin % W
    r = lin // W
    h = r % H
    r = r // H
    c = r % C
    n = r // C
    return n, c, h, w


# --- pooling ----------------------------------------------------------------------------------

@triton.jit
def _pool_fwd_kernel(x, y, total, C, H, W, Ho, Wo,
                     sxn, sxc, sxh, sxw,
                     KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                     PT: tl.constexpr, PL: tl.constexpr, IS_MAX: tl.constexpr,
                     CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, i, j = _split(lin, C, Ho, Wo)
    base = n * sxn + c * sxc
    h0 = i * SH - PT
    w0 = j * SW - PL
    if IS_MAX:
        acc = tl.full((BLOCK,), -float("inf"), CT)
        found = tl.zeros((BLOCK,), tl.int1)
    else:
        acc = tl.zeros((BLOCK,), CT)
    for a in tl.static_range(KH):
        for b in tl.static_range(KW):
            h = h0 + a
            w = w0 + b
            ok = mask & (h >= 0) & (h < H) & (w >= 0) & (w < W)
            v = tl.load(x + base + h * sxh + w * sxw, mask=ok, other=0.0).to(CT)
            if IS_MAX:
                # first real element, then strictly greater, or the first NaN
                take = ok & ((~found) | (v > acc) | ((v != v) & (acc == acc)))
                acc = tl.where(take, v, acc)
                found = found | ok
            else:
                acc += v
    if not IS_MAX:
        acc = acc / (KH * KW)
    tl.store(y + lin, store_value(acc, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _pool_bwd_kernel(g, x, dx, total, C, H, W, Ho, Wo,
                     sgn, sgc, sgh, sgw, sxn, sxc, sxh, sxw,
                     KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                     PT: tl.constexpr, PL: tl.constexpr, IS_MAX: tl.constexpr,
                     CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, p, q = _split(lin, C, H, W)
    gbase = n * sgn + c * sgc
    xbase = n * sxn + c * sxc
    acc = tl.zeros((BLOCK,), CT)
    # windows i covering row p: i*SH - PT <= p < i*SH - PT + KH, i.e. i <= (p+PT)//SH, at most ceil(KH/SH) of them
    for da in tl.static_range((KH + SH - 1) // SH):
        i = (p + PT) // SH - da
        a_me = p + PT - i * SH                     # p's row inside window i
        for db in tl.static_range((KW + SW - 1) // SW):
            j = (q + PL) // SW - db
            b_me = q + PL - j * SW
            cover = mask & (i >= 0) & (i < Ho) & (j >= 0) & (j < Wo) & (a_me < KH) & (b_me < KW)
            gv = tl.load(g + gbase + i * sgh + j * sgw, mask=cover, other=0.0).to(CT)
            if IS_MAX:
                # recompute window (i, j)'s argmax: first maximal element in scan order
                best = tl.full((BLOCK,), -float("inf"), CT)
                found = tl.zeros((BLOCK,), tl.int1)
                arg = tl.full((BLOCK,), -1, tl.int32)
                for a in tl.static_range(KH):
                    for b in tl.static_range(KW):
                        h = i * SH - PT + a
                        w = j * SW - PL + b
                        ok = cover & (h >= 0) & (h < H) & (w >= 0) & (w < W)
                        v = tl.load(x + xbase + h * sxh + w * sxw, mask=ok, other=0.0).to(CT)
                        take = ok & ((~found) | (v > best) | ((v != v) & (best == best)))
                        best = tl.where(take, v, best)
                        arg = tl.where(take, a * KW + b, arg)
                        found = found | ok
                hit = cover & (arg == (a_me * KW + b_me).to(tl.int32))
                acc += tl.where(hit, gv, 0.0)
            else:
                acc += gv
    if not IS_MAX:
        acc = acc / (KH * KW)
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _pool_forward(x, window, stride, padding, is_max):
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (Ho, Wo) = _geometry(x, window, stride, padding)
    N, C, H, W = x.shape
    y = common.empty((N, C, Ho, Wo), x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    common.launch(_pool_fwd_kernel, (common.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PL=pl, IS_MAX=is_max,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return y


def _pool_backward(grad, x, window, stride, padding, is_max):
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (Ho, Wo) = _geometry(x, window, stride, padding)
    N, C, H, W = x.shape
    if tuple(grad.shape) != (N, C, Ho, Wo):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {(N, C, Ho, Wo)}")
    dx = common.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    if Ho * Wo == 0:  # pragma: no cover - pool_geometry guarantees Ho, Wo >= 1
        return common.full(x.shape, 0.0, x.dtype, x.device)
    block = _block(total)
    common.launch(_pool_bwd_kernel, (common.cdiv(total, block),), grad, x, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), *x.stride(), KH=kh, KW=kw, SH=sh, SW=sw, PT=pt, PL=pl,
                  IS_MAX=is_max, CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return dx


def maxpool2d_forward(x, window, stride, padding):
    return _pool_forward(x, window, stride, padding, True)


def maxpool2d_backward(grad, out, x, window, stride, padding):
    """Ties: the gradient goes to the first maximal element of each window in
    row-major scan order (torch's argmax), recomputed from ``x``."""
    return (_pool_backward(grad, x, window, stride, padding, True),)


def meanpool2d_forward(x, window, stride, padding):
    return _pool_forward(x, window, stride, padding, False)


def meanpool2d_backward(grad, out, x, window, stride, padding):
    return (_pool_backward(grad, x, window, stride, padding, False),)


# --- upsampling -------------------------------------------------------------------------------

@triton.jit
def _bilinear_src(d, size, S: tl.constexpr, CT: tl.constexpr):
    """Source rows (i0, i1) and weight lam of output positions d (align_corners=False):
    s = max((d + 0.5) / S - 0.5, 0), i0 = floor(s), i1 = min(i0 + 1, size - 1), lam = s - i0."""
    s = (d.to(CT) + 0.5) / S - 0.5
    s = tl.maximum(s, 0.0)
    i0 = s.to(tl.int64)                            # s >= 0: truncation is floor
    i1 = tl.minimum(i0 + 1, size - 1)
    lam = s - i0.to(CT)
    return i0, i1, lam


@triton.jit
def _upsample_fwd_kernel(x, y, total, C, H, W, Ho, Wo, sxn, sxc, sxh, sxw,
                         SH: tl.constexpr, SW: tl.constexpr, BILINEAR: tl.constexpr,
                         CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, i, j = _split(lin, C, Ho, Wo)
    base = x + n * sxn + c * sxc
    if BILINEAR:
        h0, h1, lh = _bilinear_src(i, H, SH, CT)
        w0, w1, lw = _bilinear_src(j, W, SW, CT)
        v00 = tl.load(base + h0 * sxh + w0 * sxw, mask=mask, other=0.0).to(CT)
        v01 = tl.load(base + h0 * sxh + w1 * sxw, mask=mask, other=0.0).to(CT)
        v10 = tl.load(base + h1 * sxh + w0 * sxw, mask=mask, other=0.0).to(CT)
        v11 = tl.load(base + h1 * sxh + w1 * sxw, mask=mask, other=0.0).to(CT)
        v = (1.0 - lh) * ((1.0 - lw) * v00 + lw * v01) + lh * ((1.0 - lw) * v10 + lw * v11)
    else:
        v = tl.load(base + (i // SH) * sxh + (j // SW) * sxw, mask=mask, other=0.0).to(CT)
    tl.store(y + lin, store_value(v, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _upsample_bwd_kernel(g, dx, total, C, H, W, Ho, Wo, sgn, sgc, sgh, sgw,
                         SH: tl.constexpr, SW: tl.constexpr, BILINEAR: tl.constexpr,
                         CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < total
    n, c, p, q = _split(lin, C, H, W)
    base = g + n * sgn + c * sgc
    acc = tl.zeros((BLOCK,), CT)
    if BILINEAR:
        for di in tl.static_range(3 * SH):
            i = SH * (p - 1) + di
            h0, h1, lh = _bilinear_src(i, H, SH, CT)
            wh = tl.where(h0 == p, 1.0 - lh, 0.0) + tl.where(h1 == p, lh, 0.0)
            okh = mask & (i >= 0) & (i < Ho)
            for dj in tl.static_range(3 * SW):
                j = SW * (q - 1) + dj
                w0, w1, lw = _bilinear_src(j, W, SW, CT)
                ww = tl.where(w0 == q, 1.0 - lw, 0.0) + tl.where(w1 == q, lw, 0.0)
                ok = okh & (j >= 0) & (j < Wo) & (wh != 0.0) & (ww != 0.0)
                gv = tl.load(base + i * sgh + j * sgw, mask=ok, other=0.0).to(CT)
                acc += tl.where(ok, wh * ww * gv, 0.0)
    else:
        for a in tl.static_range(SH):
            for b in tl.static_range(SW):
                gv = tl.load(base + (p * SH + a) * sgh + (q * SW + b) * sgw, mask=mask, other=0.0).to(CT)
                acc += gv
    tl.store(dx + lin, store_value(acc, dx.dtype.element_ty, INTERP), mask=mask)


def _upsample_forward(x, scale, bilinear):
    sh, sw = _scale(x, scale)
    N, C, H, W = x.shape
    Ho, Wo = H * sh, W * sw
    y = common.empty((N, C, Ho, Wo), x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    block = _block(total)
    common.launch(_upsample_fwd_kernel, (common.cdiv(total, block),), x, y, total, C, H, W, Ho, Wo,
                  *x.stride(), SH=sh, SW=sw, BILINEAR=bilinear,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return y


def _upsample_backward(grad, x, scale, bilinear):
    sh, sw = _scale(x, scale)
    N, C, H, W = x.shape
    Ho, Wo = H * sh, W * sw
    if tuple(grad.shape) != (N, C, Ho, Wo):
        raise ShapeError(f"gradient of shape {tuple(grad.shape)}, expected {(N, C, Ho, Wo)}")
    dx = common.empty(x.shape, x.dtype, x.device)
    total = dx.numel()
    if total == 0:
        return dx
    block = _block(total)
    common.launch(_upsample_bwd_kernel, (common.cdiv(total, block),), grad, dx, total, C, H, W, Ho, Wo,
                  *grad.stride(), SH=sh, SW=sw, BILINEAR=bilinear,
                  CT=common.compute_type(x.dtype), INTERP=common.INTERPRET, BLOCK=block)
    return dx


def upsample_nearest2d_forward(x, scale):
    return _upsample_forward(x, scale, False)


def upsample_nearest2d_backward(grad, out, x, scale):
    return (_upsample_backward(grad, x, scale, False),)


def upsample_bilinear2d_forward(x, scale):
    return _upsample_forward(x, scale, True)


def upsample_bilinear2d_backward(grad, out, x, scale):
    return (_upsample_backward(grad, x, scale, True),)
