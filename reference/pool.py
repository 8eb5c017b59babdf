"""Pooling, NumPy reference (forward and backward).

Arrays are batch-first NCHW: ``x`` has shape (N, C, H, W) and every
primitive works on the last two (spatial) axes, independently per (n, c).

Pooling with fixed windows (``maxpool2d``, ``meanpool2d``: ``window``,
``stride``, ``padding``, ``dilation`` for max pooling, ``ceil_mode``) and
adaptive pooling (``adaptive_maxpool2d``, ``adaptive_meanpool2d``) to
``size = (Ho, Wo)``. Which input pixels each output's window reads, and the
checks of the attributes, are the family's spec (``triflux.specs.pool``,
whose docstring has the rules, torch's); every window holds at least one
input pixel, so a maximum or a mean is always over real pixels.

Maxima: NaN propagates. The backward sends each output's gradient to the one
input pixel its maximum came from, by torch's rule: the first maximal pixel
in row-major window order, or, in a window holding NaN, the last NaN;
padding is never chosen.

Half-precision inputs (float16, bfloat16) accumulate in float32 and are
rounded once; results come in the input's dtype. The machinery (a map along
one axis, applied to the rows and to the columns) is
``triflux.reference._separable``.
"""
from functools import lru_cache

import numpy as np

from ..specs.pool import adaptive_pool2d_spec, pool2d_spec
from ._threads import in_parallel, slices_per_thread
from ._separable import AxisMap
from ._util import zeroed_where


@lru_cache(maxsize=1024)
def _windows(axis):
    """The :class:`AxisMap` of the windows of a spec's :class:`PoolAxis`
    (cached with it: the map caches its inverse tables)."""
    return AxisMap(axis.size, axis.index, axis.real)


def _maps(spec):
    return _windows(spec.rows), _windows(spec.cols)


@lru_cache(maxsize=1024)
def _tile(axis):
    """k if the windows of a :class:`PoolAxis` are consecutive tiles of k
    positions (output i reads i*k ... i*k + k - 1: no padding, no overlap), else 0."""
    k = axis.taps
    tiles = bool(axis.real.all()) and np.array_equal(axis.index, np.arange(axis.out * k).reshape(axis.out, k))
    return k if tiles else 0


# --- shared forward/backward bodies --------------------------------------------------------------

def _max_forward(x, spec):
    """y[n, c, i, j] = max over the window (rows i) x (cols j) of x: the
    running maximum of the kh*kw taps (strided views of x) where the windows
    tile the input, else the column maxima, then the row maxima."""
    kh, kw = _tile(spec.rows), _tile(spec.cols)
    if not (kh and kw):
        rows, cols = _maps(spec)
        return rows.max(cols.max(x, 3), 2)
    N, C = x.shape[:2]
    Ho, Wo = spec.rows.out, spec.cols.out
    taps = x[:, :, :Ho * kh, :Wo * kw].reshape(N, C, Ho, kh, Wo, kw)
    y = taps[:, :, :, 0, :, 0].copy()
    for a in range(kh):
        for b in range(kw):
            if a or b:
                np.maximum(y, taps[:, :, :, a, :, b], out=y)         # (NaN propagates)
    return y


def _max_backward(grad, out, x, spec):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows (i, j) whose
    maximum came from (p, q) (torch's rule, see the module docstring)."""
    kh, kw = _tile(spec.rows), _tile(spec.cols)
    if kh and kw and not np.isnan(out).any():
        return _max_backward_tiled(grad, out, x, kh, kw)
    return _max_backward_separable(grad, x, *_maps(spec))


def _max_backward_tiled(grad, y, x, kh, kw):
    """The backward when the windows tile the input and no maximum is NaN:
    window (i, j)'s tap (a, b) is x[n, c, i*kh + a, j*kw + b], and the first
    tap in row-major order that equals the window's maximum y[n, c, i, j]
    takes g[n, c, i, j] (one comparison per tap, no index arithmetic, the
    gradient or 0 written by ``zeroed_where``; the samples split over the
    threads)."""
    N, C, Ho, Wo = y.shape
    H, W = Ho * kh, Wo * kw
    dx = np.empty(x.shape, dtype=x.dtype)
    g = np.asarray(grad).astype(x.dtype, copy=False)

    def samples(s):
        taps = x[s, :, :H, :W].reshape(s.stop - s.start, C, Ho, kh, Wo, kw)
        tiled = (H, W) == x.shape[2:]                      # then dx[s] is a view of the taps' shape
        dtaps = dx[s].reshape(taps.shape) if tiled else np.empty(taps.shape, dtype=x.dtype)
        open_ = np.ones(y[s].shape, dtype=bool)            # windows whose maximum is not found yet
        for a in range(kh):
            for b in range(kw):
                hit = np.equal(taps[:, :, :, a, :, b], y[s])
                hit &= open_
                missed = ~hit
                open_ &= missed
                zeroed_where(g[s], missed, out=dtaps[:, :, :, a, :, b])
        if not tiled:                                      # rows/columns past the last window get 0
            dx[s] = 0
            dx[s, :, :H, :W] = dtaps.reshape(s.stop - s.start, C, H, W)
    in_parallel(samples, slices_per_thread(N, x.size))
    return dx


def _max_backward_separable(grad, x, rows, cols):
    """:func:`_max_backward` for any windows.

    The row-major rule is separable: the maximum of each row's part of a
    window and its column (the first maximal one, or the last NaN), then,
    over the window's rows, the first row whose part attains the maximum
    (or the last row holding NaN) with that row's column."""
    N, C, H, W = x.shape
    row_max, col_of = cols.argmax(x, 3)                      # (N, C, H, Wo)
    _, row = rows.argmax(row_max, 2)                         # (N, C, Ho, Wo)
    col = np.take_along_axis(col_of, row, axis=2)
    plane = np.arange(N * C).reshape(N, C, 1, 1) * (H * W)   # offset of image (n, c) in dx
    where = (plane + row * W + col).ravel()
    g = np.asarray(grad, dtype=np.float64).ravel()
    dx = np.bincount(where, weights=g, minlength=N * C * H * W)   # sums in float64, one rounding
    return dx.reshape(x.shape).astype(x.dtype)


def _mean_forward(x, rows, cols, divisor, acc):
    """y = (window sums) / divisor, summed in ``acc`` (the compute dtype) and rounded once."""
    s = rows.sum(cols.sum(x, 3, acc), 2, acc)
    s /= divisor.astype(acc)
    return s.astype(x.dtype, copy=False)


def _mean_backward(grad, x, rows, cols, divisor, acc):
    """dx[p, q] = sum over the windows (i, j) holding (p, q) of g[i, j] / divisor[i, j]."""
    g = np.asarray(grad).astype(acc) / divisor.astype(acc)
    return rows.adjoint(cols.adjoint(g, 3, acc), 2, acc).astype(x.dtype, copy=False)


# --- max pooling ---------------------------------------------------------------------------------

def maxpool2d_forward(x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """y[n, c, i, j] = max_{0<=a<kh, 0<=b<kw} x[n, c, i*sh - top + a*dh, j*sw - left + b*dw]

    over the positions inside the input (padding never wins); NaN propagates."""
    spec = pool2d_spec("maxpool2d", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode)
    return _max_forward(x, spec)


def maxpool2d_backward(grad, out, x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows (i, j) whose maximum came from (p, q):
    the first maximal pixel in row-major window order, or the last NaN (torch's rule)."""
    spec = pool2d_spec("maxpool2d", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode)
    return (_max_backward(grad, out, x, spec),)


# --- mean pooling --------------------------------------------------------------------------------

def meanpool2d_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """y[n, c, i, j] = (1 / D[i, j]) * sum_{a, b} x[n, c, i*sh - top + a, j*sw - left + b]

    over the positions inside the input (padding adds zeros). The divisor
    D[i, j] counts the window's positions inside the padded input
    (``count_include_pad``, kh*kw except for a ceil-mode window that reaches
    past the bottom/right padding) or inside the input only."""
    spec = pool2d_spec("meanpool2d", np.shape(x), x.dtype, window, stride, padding, (1, 1), ceil_mode)
    return _mean_forward(x, *_maps(spec), spec.divisor(count_include_pad), spec.compute_dtype)


def meanpool2d_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """dx[n, c, p, q] = sum over the windows (i, j) holding (p, q) of g[n, c, i, j] / D[i, j]

    (the adjoint of the forward; what lands on padding is dropped)."""
    spec = pool2d_spec("meanpool2d", np.shape(x), x.dtype, window, stride, padding, (1, 1), ceil_mode)
    return (_mean_backward(grad, x, *_maps(spec), spec.divisor(count_include_pad), spec.compute_dtype),)


# --- adaptive pooling ----------------------------------------------------------------------------

def adaptive_maxpool2d_forward(x, size):
    """y[n, c, i, j] = max of x[n, c, p, q] over hs(i) <= p < he(i), ws(j) <= q < we(j),

    hs(i) = floor(i*H/Ho), he(i) = ceil((i+1)*H/Ho) (likewise along W); NaN propagates."""
    spec = adaptive_pool2d_spec("adaptive_maxpool2d", np.shape(x), x.dtype, size)
    return _max_forward(x, spec)


def adaptive_maxpool2d_backward(grad, out, x, size):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows whose maximum came from (p, q)
    (the first maximal pixel in row-major order, or the last NaN: torch's rule)."""
    spec = adaptive_pool2d_spec("adaptive_maxpool2d", np.shape(x), x.dtype, size)
    return (_max_backward(grad, out, x, spec),)


def adaptive_meanpool2d_forward(x, size):
    """y[n, c, i, j] = mean of x[n, c, p, q] over the window (i, j) of adaptive_maxpool2d_forward,

    dividing by its size (he(i) - hs(i)) * (we(j) - ws(j))."""
    spec = adaptive_pool2d_spec("adaptive_meanpool2d", np.shape(x), x.dtype, size)
    return _mean_forward(x, *_maps(spec), spec.divisor(), spec.compute_dtype)


def adaptive_meanpool2d_backward(grad, out, x, size):
    """dx[n, c, p, q] = sum over the windows (i, j) holding (p, q) of g[n, c, i, j] / (window (i, j)'s size)."""
    spec = adaptive_pool2d_spec("adaptive_meanpool2d", np.shape(x), x.dtype, size)
    return (_mean_backward(grad, x, *_maps(spec), spec.divisor(), spec.compute_dtype),)
