"""Upsampling (and downsampling) by interpolation, NumPy reference (forward
and backward): torch's ``F.interpolate`` with modes "nearest" and "bilinear".

Arrays are batch-first NCHW; both primitives work on the last two axes.
Attributes, exactly one of:

* ``size = (Ho, Wo)``: the output's spatial size (positive ints);
* ``scale = (sh, sw)``: positive scale factors (ints or floats); the output
  size is ``Ho = floor(H * sh)``, ``Wo = floor(W * sw)`` (must be >= 1).

and, for bilinear only, ``align_corners`` (default False).

Along one axis of n inputs and m outputs, output position d reads:

nearest (torch's "nearest", computed in float32 as torch does for every dtype)::

    src(d) = d                                    if m == n
             floor(d / 2)                         if m == 2 n
             min(floor(float32(d) * r), n - 1)    otherwise, with the float32 ratio
             r = float32(1 / scale)  (scale given)  or  float32(n) / float32(m)  (size given)

bilinear (computed in float64 for float64 data, float32 otherwise, as torch)::

    s(d) = d * (n - 1) / (m - 1)                      align_corners (0 when m == 1)
           max((d + 0.5) * r - 0.5, 0)                otherwise, r = 1 / scale or n / m
    i0 = min(floor(float32(s)), n - 1),  i1 = min(i0 + 1, n - 1),  lam = clip(s - i0, 0, 1)
    out[d] = (1 - lam) * in[i0] + lam * in[i1]

    except when m == n: then out[d] = in[d] (i0 = i1 = d, lam = 0), whatever the scale.

Both taps are always used (a weight of 0 times NaN or infinity gives NaN,
as in torch). The 2-d operation applies the 1-d map along W, then along H;
the backward is the adjoint (for each input position, the sum of the
gradients of the outputs that read it, times their weights). Sums run in
float32 for float16/bfloat16 and are rounded once.
"""
from functools import lru_cache

import numpy as np

from ..errors import ShapeError
from ._separable import AxisMap
from ._util import compute_dtype


def _check_x(x, what):
    if np.ndim(x) != 4:
        raise ShapeError(f"{what} expects an NCHW array of 4 dimensions, got shape {np.shape(x)}")


def _pair(v, name):
    if v is None:
        return None
    v = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(v) != 2:
        raise ShapeError(f"{name} must be a number or a pair, got {v}")
    return v


def upsample_size(shape, size=None, scale=None):
    """((Ho, Wo), (sh, sw) or None) of an upsampling of an NCHW array of
    ``shape``; raises ShapeError on bad attributes."""
    size, scale = _pair(size, "size"), _pair(scale, "scale")
    if (size is None) == (scale is None):
        raise ShapeError("upsampling needs exactly one of size (the output's (H, W)) and scale (the factors), "
                         f"got size={size}, scale={scale}")
    H, W = int(shape[2]), int(shape[3])
    if scale is not None:
        scale = tuple(float(s) for s in scale)
        if not all(np.isfinite(s) and s > 0 for s in scale):
            raise ShapeError(f"upsampling scale factors must be positive, got {scale}")
        out = (int(np.floor(H * scale[0])), int(np.floor(W * scale[1])))
    else:
        if any(int(s) != s for s in size):
            raise ShapeError(f"upsampling size must be two ints, got {size}")
        out = (int(size[0]), int(size[1]))
    if min(H, W) < 1 or min(out) < 1:
        raise ShapeError(f"upsampling needs input and output sizes greater than 0, got input (H, W) = {(H, W)}, "
                         f"output {out}" + (f" (= floor(input x scale {scale}))" if scale is not None else ""))
    return out, scale


@lru_cache(maxsize=512)
def nearest_source(n, m, scale=None):
    """src(d) for the m output positions (see the module docstring)."""
    d = np.arange(m)
    if m == n:
        return d
    if m == 2 * n:
        return d // 2
    r = np.float32(1.0 / scale) if scale is not None else np.float32(n) / np.float32(m)
    return np.minimum(np.floor(d.astype(np.float32) * r).astype(np.int64), n - 1)


@lru_cache(maxsize=512)
def linear_source(n, m, scale, align_corners, dtype):
    """(i0, i1, lam) for the m output positions, computed in ``dtype`` (see the module docstring)."""
    d = np.arange(m)
    if m == n:
        return d, d, np.zeros(m, dtype=dtype)
    ct = np.dtype(dtype).type
    if align_corners:
        r = ct(n - 1) / ct(m - 1) if m > 1 else ct(0)
        s = d.astype(ct) * r
    else:
        r = ct(1.0 / scale) if scale is not None else ct(n) / ct(m)
        s = np.maximum((d.astype(ct) + ct(0.5)) * r - ct(0.5), ct(0))
    # torch floors the index rounded to float32 (floorf) and clamps lam to [0, 1]
    i0 = np.minimum(np.floor(s.astype(np.float32)).astype(np.int64), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    return i0, i1, np.clip(s - i0.astype(ct), ct(0), ct(1))


@lru_cache(maxsize=512)
def _nearest_map(n, m, scale):
    src = nearest_source(n, m, scale)
    return AxisMap(n, src[:, None], np.ones((m, 1), bool))


@lru_cache(maxsize=512)
def _linear_map(n, m, scale, align_corners, dtype):
    i0, i1, lam = linear_source(n, m, scale, align_corners, dtype)
    weight = np.stack([1 - lam, lam], axis=1)
    return AxisMap(n, np.stack([i0, i1], axis=1), np.ones((m, 2), bool), weight)


def _maps(x, size, scale, bilinear, align_corners=False):
    (Ho, Wo), sc = upsample_size(x.shape, size, scale)
    H, W = x.shape[2:]
    sh, sw = sc if sc is not None else (None, None)
    if bilinear:
        ct = compute_dtype(x.dtype)
        return _linear_map(H, Ho, sh, bool(align_corners), ct), _linear_map(W, Wo, sw, bool(align_corners), ct)
    return _nearest_map(H, Ho, sh), _nearest_map(W, Wo, sw)


# --- nearest -------------------------------------------------------------------------------------

def upsample_nearest2d_forward(x, size=None, scale=None):
    """y[n, c, i, j] = x[n, c, src_h(i), src_w(j)]  (src: the module docstring's nearest rule)."""
    _check_x(x, "upsample_nearest2d")
    rows, cols = _maps(x, size, scale, False)
    return np.take(np.take(x, cols.index[:, 0], axis=3), rows.index[:, 0], axis=2)


def upsample_nearest2d_backward(grad, out, x, size=None, scale=None):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over src_h(i) = p, src_w(j) = q

    (each input pixel's gradient is the sum over the output pixels copied from it)."""
    _check_x(x, "upsample_nearest2d")
    rows, cols = _maps(x, size, scale, False)
    acc = compute_dtype(x.dtype)
    return (rows.adjoint(cols.adjoint(np.asarray(grad), 3, acc), 2, acc).astype(x.dtype, copy=False),)


# --- bilinear ------------------------------------------------------------------------------------

def upsample_bilinear2d_forward(x, size=None, scale=None, align_corners=False):
    """y[n, c, i, j] = sum_{p in {h0, h1}, q in {w0, w1}} a_i(p) b_j(q) x[n, c, p, q]

    with (h0, h1, lh) the bilinear rule at output row i, a_i(h0) = 1 - lh,
    a_i(h1) = lh (added when h0 == h1), and b_j likewise along W."""
    _check_x(x, "upsample_bilinear2d")
    rows, cols = _maps(x, size, scale, True, align_corners)
    acc = compute_dtype(x.dtype)
    return rows.sum(cols.sum(x, 3, acc), 2, acc).astype(x.dtype, copy=False)


def upsample_bilinear2d_backward(grad, out, x, size=None, scale=None, align_corners=False):
    """dx[n, c, p, q] = sum_{i, j} a_i(p) b_j(q) g[n, c, i, j]  (the adjoint of the forward)."""
    _check_x(x, "upsample_bilinear2d")
    rows, cols = _maps(x, size, scale, True, align_corners)
    acc = compute_dtype(x.dtype)
    return (rows.adjoint(cols.adjoint(np.asarray(grad), 3, acc), 2, acc).astype(x.dtype, copy=False),)
