"""Pooling and upsampling, NumPy reference (forward and backward).

Arrays are batch-first NCHW: ``x`` has shape (N, C, H, W) and every
primitive works on the last two (spatial) axes, independently per (n, c).

Attributes (Python ints / tuples):

* ``window = (kh, kw)``, ``stride = (sh, sw)``: positive;
* ``padding = (top, bottom, left, right)``: non-negative, each smaller than
  the window along its axis (so every window holds at least one real pixel);
* ``scale = (sh, sw)``: positive integer upsampling factors.

Pooling output size: ``Ho = (H + top + bottom - kh) // sh + 1`` (likewise
``Wo``); output pixel (i, j) reads the window whose top-left corner is input
pixel ``(i*sh - top, j*sw - left)``. Upsampling output size: ``(H*sh, W*sw)``.

Half-precision inputs (float16, bfloat16) accumulate in float32; the results
are returned in the input's dtype.
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import ShapeError


# --- helpers ------------------------------------------------------------------------------------

def _acc(dtype):
    """The dtype sums are formed in: float32 for 2-byte floats, else the dtype itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize == 2 else dtype


def _pair(v, name):
    v = tuple(int(a) for a in v)
    if len(v) != 2 or min(v) < 1:
        raise ShapeError(f"{name} must be two positive ints, got {v}")
    return v


def _check_x(x, what):
    if np.ndim(x) != 4:
        raise ShapeError(f"{what} expects an NCHW array of 4 dimensions, got shape {np.shape(x)}")


def pool_geometry(shape, window, stride, padding):
    """(kh, kw), (sh, sw), (pt, pb, pl, pr), (Ho, Wo) for a pooling of an
    NCHW array of ``shape``; raises ShapeError on bad attributes."""
    kh, kw = _pair(window, "window")
    sh, sw = _pair(stride, "stride")
    pad = tuple(int(p) for p in padding)
    if len(pad) != 4 or min(pad) < 0:
        raise ShapeError(f"padding must be four non-negative ints (top, bottom, left, right), got {pad}")
    pt, pb, pl, pr = pad
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        raise ShapeError(f"padding {pad} must be smaller than the window {(kh, kw)} along each axis")
    H, W = shape[2], shape[3]
    if H + pt + pb < kh or W + pl + pr < kw:
        raise ShapeError(f"the window {(kh, kw)} is larger than the padded input "
                         f"{(H + pt + pb, W + pl + pr)}")
    Ho = (H + pt + pb - kh) // sh + 1
    Wo = (W + pl + pr - kw) // sw + 1
    return (kh, kw), (sh, sw), (pt, pb, pl, pr), (Ho, Wo)


def _windows(xp, window, stride, out_hw):
    """The pooling windows of the padded array ``xp``: shape (N, C, Ho, Wo, kh, kw)."""
    (kh, kw), (sh, sw), (Ho, Wo) = window, stride, out_hw
    return sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :Ho, :Wo]


def _pad(x, padding, value):
    pt, pb, pl, pr = padding
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=value)


def _scatter_windows(contrib, x_shape, window, stride, padding, dtype):
    """The adjoint of ``_windows`` (after padding): sums the per-window
    contributions ``contrib`` (N, C, Ho, Wo, kh, kw) back onto the input
    pixels they came from, then drops the padding:

        gp[i*sh + a, j*sw + b] += contrib[i, j, a, b]   for every (i, j, a, b)

    vectorised over (i, j), one step per window offset (a, b): for a fixed
    offset distinct windows hit distinct pixels, so a plain ``+=`` is exact."""
    (kh, kw), (sh, sw) = window, stride
    pt, pb, pl, pr = padding
    N, C, H, W = x_shape
    Ho, Wo = contrib.shape[2], contrib.shape[3]
    gp = np.zeros((N, C, H + pt + pb, W + pl + pr), dtype=dtype)
    rows = np.arange(Ho) * sh
    cols = np.arange(Wo) * sw
    for a in range(kh):
        for b in range(kw):
            # distinct windows at a fixed offset (a, b) hit distinct pixels: a plain += is exact
            gp[:, :, (rows + a)[:, None], (cols + b)[None, :]] += contrib[:, :, :, :, a, b]
    return gp[:, :, pt:pt + H, pl:pl + W]


# --- max pooling --------------------------------------------------------------------------------

def maxpool2d_forward(x, window, stride, padding):
    """y[n, c, i, j] = max_{0<=a<kh, 0<=b<kw} xp[n, c, i*sh + a, j*sw + b]

    with ``xp`` = x padded by ``padding`` with -inf (padding never wins).
    NaN propagates (a window holding a NaN gives NaN)."""
    _check_x(x, "maxpool2d")
    win, st, pad, out_hw = pool_geometry(x.shape, window, stride, padding)
    xp = _pad(x, pad, -np.inf)
    w = _windows(xp, win, st, out_hw)
    if w.size == 0:
        return np.zeros(x.shape[:2] + out_hw, dtype=x.dtype)
    return np.max(w, axis=(4, 5)).astype(x.dtype, copy=False)


def maxpool2d_backward(grad, out, x, window, stride, padding):
    """dx[n, c, p, q] = sum over windows (i, j) whose argmax is (p, q) of g[n, c, i, j]

    The argmax of a window is the FIRST element, in row-major scan order of the
    window (a, then b), that equals the window's maximum (torch's choice; NaN
    counts as the maximum). Padding positions are never chosen, so a window
    whose real pixels are all -inf sends its gradient to its first real pixel.
    The maximum is recomputed from ``x`` (``out`` is not used)."""
    _check_x(x, "maxpool2d")
    win, st, pad, out_hw = pool_geometry(x.shape, window, stride, padding)
    kh, kw = win
    N, C = x.shape[:2]
    dtype = _acc(x.dtype)
    if x.size == 0 or N * C * out_hw[0] * out_hw[1] == 0:
        return (np.zeros(x.shape, dtype=x.dtype),)
    xp = _pad(x, pad, -np.inf)
    w = _windows(xp, win, st, out_hw).reshape(N, C, *out_hw, kh * kw)
    real = _windows(_pad(np.ones(x.shape, dtype=bool), pad, False), win, st, out_hw)
    real = real.reshape(N, C, *out_hw, kh * kw)
    m = np.max(w, axis=4, keepdims=True)
    is_max = real & ((w == m) | np.isnan(w))
    first = np.argmax(is_max, axis=4)                        # first True in scan order
    onehot = np.arange(kh * kw) == first[..., None]
    contrib = np.where(onehot, np.asarray(grad, dtype=dtype)[..., None], 0).astype(dtype)
    dx = _scatter_windows(contrib.reshape(N, C, *out_hw, kh, kw), x.shape, win, st, pad, dtype)
    return (dx.astype(x.dtype),)


# --- mean pooling -------------------------------------------------------------------------------

def meanpool2d_forward(x, window, stride, padding):
    """y[n, c, i, j] = (1 / (kh*kw)) * sum_{a, b} xp[n, c, i*sh + a, j*sw + b]

    with ``xp`` = x padded with zeros; the divisor is always the full window
    size kh*kw (torch's count_include_pad=True)."""
    _check_x(x, "meanpool2d")
    win, st, pad, out_hw = pool_geometry(x.shape, window, stride, padding)
    acc = _acc(x.dtype)
    xp = _pad(x.astype(acc), pad, 0)
    w = _windows(xp, win, st, out_hw)
    y = np.sum(w, axis=(4, 5)) / acc.type(win[0] * win[1])
    return y.astype(x.dtype)


def meanpool2d_backward(grad, out, x, window, stride, padding):
    """dx[n, c, p, q] = (1 / (kh*kw)) * sum over windows (i, j) covering (p, q) of g[n, c, i, j]

    (the adjoint of the forward: each output spreads g / (kh*kw) over its
    window; what lands on padding is dropped)."""
    _check_x(x, "meanpool2d")
    win, st, pad, out_hw = pool_geometry(x.shape, window, stride, padding)
    kh, kw = win
    acc = _acc(x.dtype)
    g = np.asarray(grad, dtype=acc) / acc.type(kh * kw)
    contrib = np.broadcast_to(g[..., None, None], g.shape + (kh, kw))
    dx = _scatter_windows(contrib, x.shape, win, st, pad, acc)
    return (dx.astype(x.dtype),)


# --- upsampling ---------------------------------------------------------------------------------

def nearest_source(size, scale):
    """src[d] = floor(d / scale) for the ``size * scale`` output positions d."""
    return np.arange(size * scale) // scale


def upsample_nearest2d_forward(x, scale):
    """y[n, c, i, j] = x[n, c, floor(i / sh), floor(j / sw)],  y: (N, C, H*sh, W*sw)."""
    _check_x(x, "upsample_nearest2d")
    sh, sw = _pair(scale, "scale")
    H, W = x.shape[2:]
    return x[:, :, nearest_source(H, sh)[:, None], nearest_source(W, sw)[None, :]]


def upsample_nearest2d_backward(grad, out, x, scale):
    """dx[n, c, p, q] = sum_{0<=a<sh, 0<=b<sw} g[n, c, p*sh + a, q*sw + b]

    (each input pixel was copied to an sh x sw block: its gradient is the
    block's sum)."""
    _check_x(x, "upsample_nearest2d")
    sh, sw = _pair(scale, "scale")
    N, C, H, W = x.shape
    acc = _acc(x.dtype)
    g = np.asarray(grad, dtype=acc).reshape(N, C, H, sh, W, sw)
    return (g.sum(axis=(3, 5)).astype(x.dtype),)


def bilinear_source(size, scale):
    """Per output position d (``size * scale`` of them) the two source indices
    and the weight of the second, with torch's align_corners=False:

        s   = max((d + 0.5) / scale - 0.5, 0)
        i0  = floor(s),  i1 = min(i0 + 1, size - 1),  lam = s - i0

    so that out[d] = (1 - lam) * in[i0] + lam * in[i1] (at the last rows
    i1 == i0 and the two weights add up to 1)."""
    d = np.arange(size * scale)
    s = np.maximum((d + 0.5) / scale - 0.5, 0.0)
    i0 = np.floor(s).astype(np.int64)
    i1 = np.minimum(i0 + 1, max(size - 1, 0))
    return i0, i1, s - i0


def _interp(x, axis, scale, dtype):
    """1-d linear interpolation of ``x`` along ``axis`` (a gather)."""
    i0, i1, lam = bilinear_source(x.shape[axis], scale)
    shape = [1] * x.ndim
    shape[axis] = -1
    lam = lam.astype(dtype).reshape(shape)
    return (1 - lam) * np.take(x, i0, axis=axis) + lam * np.take(x, i1, axis=axis)


def _interp_adjoint(g, axis, size, scale, dtype):
    """The adjoint of ``_interp``: out[i0[d]] += (1 - lam[d]) g[d], out[i1[d]] += lam[d] g[d]
    (a scatter-add along ``axis``)."""
    i0, i1, lam = bilinear_source(size, scale)
    gT = np.moveaxis(g, axis, 0)                                  # the axis first
    lam = lam.astype(dtype).reshape((-1,) + (1,) * (gT.ndim - 1))
    out = np.zeros((size,) + gT.shape[1:], dtype=dtype)
    np.add.at(out, i0, (1 - lam) * gT)
    np.add.at(out, i1, lam * gT)
    return np.moveaxis(out, 0, axis)


def upsample_bilinear2d_forward(x, scale):
    """Separable linear interpolation, rows then columns (align_corners=False):

        y[n, c, i, j] = sum_{p in {h0, h1}, q in {w0, w1}} a_i(p) b_j(q) x[n, c, p, q]

    with (h0, h1, lh) = bilinear_source(H, sh)[i], a_i(h0) = 1 - lh, a_i(h1) = lh,
    and b_j likewise along W."""
    _check_x(x, "upsample_bilinear2d")
    sh, sw = _pair(scale, "scale")
    acc = _acc(x.dtype)
    t = _interp(x.astype(acc), 2, sh, acc)
    return _interp(t, 3, sw, acc).astype(x.dtype)


def upsample_bilinear2d_backward(grad, out, x, scale):
    """The adjoint of the forward:

        dx[n, c, p, q] = sum_{i, j} a_i(p) b_j(q) g[n, c, i, j]

    computed as two scatter-adds (columns, then rows)."""
    _check_x(x, "upsample_bilinear2d")
    sh, sw = _pair(scale, "scale")
    N, C, H, W = x.shape
    acc = _acc(x.dtype)
    t = _interp_adjoint(np.asarray(grad, dtype=acc), 3, W, sw, acc)
    return (_interp_adjoint(t, 2, H, sh, acc).astype(x.dtype),)
