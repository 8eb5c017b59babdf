"""Pooling, NumPy reference (forward and backward).

Arrays are batch-first NCHW: ``x`` has shape (N, C, H, W) and every
primitive works on the last two (spatial) axes, independently per (n, c).

Pooling with fixed windows (``maxpool2d``, ``meanpool2d``); attributes:

* ``window = (kh, kw)``, ``stride = (sh, sw)``, ``dilation = (dh, dw)``
  (max pooling only): positive ints. The window of output (i, j) reads the
  input pixels

      (i*sh - top + a*dh,  j*sw - left + b*dw)   for 0 <= a < kh, 0 <= b < kw,

  scanned row-major (a, then b); positions outside the input are padding.
* ``padding = (top, bottom, left, right)``: non-negative, each smaller than
  the window's extent ``eh = dh*(kh - 1) + 1`` (``ew`` likewise) along its axis.
* ``ceil_mode``: the output size along an axis of length n, with pads lo, hi,
  extent e and stride s, is (torch's rule)

      floor mode:  n_out = floor((n + lo + hi - e) / s) + 1
      ceil mode:   n_out = ceil((n + lo + hi - e) / s) + 1, less one if that
                   last window would start at or past n + lo (in the padded
                   input: inside the bottom/right padding)

  so ceil mode adds the partial window at the end (it reads past the
  bottom/right padding, which counts as padding too).
* every window must hold at least one input pixel (only a dilated window
  can miss them all, stepping over a small input; an error names the fix),
  so a maximum or a mean is always over real pixels.

Adaptive pooling (``adaptive_maxpool2d``, ``adaptive_meanpool2d``) to
``size = (Ho, Wo)``: along an axis of length n to n_out outputs, output i
reads the input positions ``floor(i*n/n_out) <= p < ceil((i+1)*n/n_out)``
(torch's windows: they cover the input, overlap by at most one position
when n_out does not divide n, and repeat positions when n_out > n).

Maxima: NaN propagates. The backward sends each output's gradient to the one
input pixel its maximum came from, by torch's rule: the first maximal pixel
in row-major window order, or, in a window holding NaN, the last NaN;
padding is never chosen.

Half-precision inputs (float16, bfloat16) accumulate in float32 and are
rounded once; results come in the input's dtype. The machinery (a map along
one axis, applied to the rows and to the columns) is
``triflux.reference._separable``.
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ShapeError
from ._separable import AxisMap
from ._util import compute_dtype


# --- geometry ------------------------------------------------------------------------------------

def _ints(v, n, name, low):
    v = tuple(int(a) for a in v)
    if len(v) != n or min(v) < low:
        kind = "positive" if low == 1 else "non-negative"
        raise ShapeError(f"{name} must be {n} {kind} ints, got {v}")
    return v


def _check_x(x, what):
    if np.ndim(x) != 4:
        raise ShapeError(f"{what} expects an NCHW array of 4 dimensions, got shape {np.shape(x)}")


@dataclass(frozen=True, eq=False)
class PoolAxis:
    """One spatial axis of a pooling: ``out`` outputs, the row (or column)
    windows as an :class:`AxisMap`, and per output the number of its taps
    inside the padded input (``padded_count``, the divisor of a mean that
    counts padding) and inside the input (``real_count``)."""
    out: int
    windows: AxisMap
    padded_count: np.ndarray
    real_count: np.ndarray


@lru_cache(maxsize=512)
def pool_axis(n, k, s, lo, hi, d, ceil_mode, name="height"):
    """The :class:`PoolAxis` of input length n, window k, stride s, pads
    (lo, hi), dilation d; raises ShapeError when no window fits, or when a
    window reads only padding."""
    if n < 1:
        raise ShapeError(f"pooling needs a non-empty input {name}, got {n}")
    extent = d * (k - 1) + 1
    span = n + lo + hi - extent
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + lo:
        out -= 1                               # the last window would start inside the bottom/right padding
    if out < 1:
        raise ShapeError(f"the window's {name} extent {extent} (window {k}, dilation {d}) is larger than the "
                         f"padded input {name} {n + lo + hi} (input {n} + padding {lo} + {hi}); "
                         "use a smaller window or pad the input")
    index = np.arange(out)[:, None] * s - lo + np.arange(k)[None, :] * d
    real = (index >= 0) & (index < n)
    empty = np.flatnonzero(~real.any(axis=1))
    if empty.size:                             # only with dilation (torch's result is undefined there)
        raise ShapeError(f"along the {name}, window {int(empty[0])} of {out} reads only padding (input {name} {n}, "
                         f"window {k}, stride {s}, padding ({lo}, {hi}), dilation {d}): a dilated window steps over "
                         "the input; use less padding or a smaller dilation")
    padded = ((index >= -lo) & (index < n + hi)).sum(axis=1)
    return PoolAxis(out, AxisMap(n, index, real), padded, real.sum(axis=1))


@dataclass(frozen=True, eq=False)
class PoolGeometry:
    """The geometry of a pooling of an NCHW array: attributes as given
    (normalised to tuples) and the two :class:`PoolAxis`."""
    window: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    ceil_mode: bool
    rows: PoolAxis
    cols: PoolAxis

    @property
    def out_size(self):
        return (self.rows.out, self.cols.out)

    def divisor(self, count_include_pad):
        """(Ho, Wo): the number of taps a mean divides by, torch's rule: the
        window's taps inside the padded input (count_include_pad), or inside
        the input only (a ceil-mode window's taps past the padding never count)."""
        if count_include_pad:
            return np.outer(self.rows.padded_count, self.cols.padded_count)
        return np.outer(self.rows.real_count, self.cols.real_count)


def pool_geometry(shape, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """The :class:`PoolGeometry` of a pooling of an NCHW array of ``shape``;
    raises ShapeError (saying what to change) on bad attributes."""
    kh, kw = _ints(window, 2, "window", 1)
    sh, sw = _ints(stride, 2, "stride", 1)
    dh, dw = _ints(dilation, 2, "dilation", 1)
    pt, pb, pl, pr = _ints(padding, 4, "padding (top, bottom, left, right)", 0)
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if max(pt, pb) >= eh or max(pl, pr) >= ew:
        raise ShapeError(f"padding {(pt, pb, pl, pr)} must be smaller than the window {(kh, kw)} along each axis "
                         f"(its extent {(eh, ew)} with dilation {(dh, dw)})")
    rows = pool_axis(int(shape[2]), kh, sh, pt, pb, dh, bool(ceil_mode), "height")
    cols = pool_axis(int(shape[3]), kw, sw, pl, pr, dw, bool(ceil_mode), "width")
    return PoolGeometry((kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw), bool(ceil_mode), rows, cols)


def adaptive_bounds(n, n_out):
    """(start, end) of the n_out adaptive windows over n positions:
    start = floor(i*n/n_out), end = ceil((i+1)*n/n_out)."""
    i = np.arange(n_out)
    return (i * n) // n_out, -((-(i + 1) * n) // n_out)


@lru_cache(maxsize=512)
def adaptive_axis(n, n_out, name="height"):
    """The :class:`AxisMap` of the adaptive windows from n to n_out positions."""
    if n < 1 or n_out < 1:
        raise ShapeError(f"adaptive pooling needs a positive input and output {name}, got {n} -> {n_out}")
    start, end = adaptive_bounds(n, n_out)
    k = int((end - start).max())
    index = start[:, None] + np.arange(k)[None, :]
    return AxisMap(n, index, index < end[:, None])


def adaptive_geometry(shape, size):
    """The row and column maps of an adaptive pooling of ``shape`` to ``size``."""
    Ho, Wo = _ints(size, 2, "size", 1)
    return adaptive_axis(int(shape[2]), Ho, "height"), adaptive_axis(int(shape[3]), Wo, "width")


# --- shared forward/backward bodies --------------------------------------------------------------

def _max_forward(x, rows, cols):
    """y[n, c, i, j] = max over the window (rows i) x (cols j) of x: the column maxima, then the row maxima."""
    return rows.max(cols.max(x, 3), 2)


def _max_backward(grad, x, rows, cols):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows (i, j) whose
    maximum came from (p, q) (torch's rule, see the module docstring).

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


def _mean_forward(x, rows, cols, divisor):
    """y = (window sums) / divisor, summed in the compute dtype and rounded once."""
    acc = compute_dtype(x.dtype)
    s = rows.sum(cols.sum(x, 3, acc), 2, acc)
    s /= divisor.astype(acc)
    return s.astype(x.dtype, copy=False)


def _mean_backward(grad, x, rows, cols, divisor):
    """dx[p, q] = sum over the windows (i, j) holding (p, q) of g[i, j] / divisor[i, j]."""
    acc = compute_dtype(x.dtype)
    g = np.asarray(grad).astype(acc) / divisor.astype(acc)
    return rows.adjoint(cols.adjoint(g, 3, acc), 2, acc).astype(x.dtype, copy=False)


# --- max pooling ---------------------------------------------------------------------------------

def maxpool2d_forward(x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """y[n, c, i, j] = max_{0<=a<kh, 0<=b<kw} x[n, c, i*sh - top + a*dh, j*sw - left + b*dw]

    over the positions inside the input (padding never wins); NaN propagates."""
    _check_x(x, "maxpool2d")
    geo = pool_geometry(x.shape, window, stride, padding, dilation, ceil_mode)
    return _max_forward(x, geo.rows.windows, geo.cols.windows)


def maxpool2d_backward(grad, out, x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows (i, j) whose maximum came from (p, q):
    the first maximal pixel in row-major window order, or the last NaN (torch's rule)."""
    _check_x(x, "maxpool2d")
    geo = pool_geometry(x.shape, window, stride, padding, dilation, ceil_mode)
    return (_max_backward(grad, x, geo.rows.windows, geo.cols.windows),)


# --- mean pooling --------------------------------------------------------------------------------

def meanpool2d_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """y[n, c, i, j] = (1 / D[i, j]) * sum_{a, b} x[n, c, i*sh - top + a, j*sw - left + b]

    over the positions inside the input (padding adds zeros). The divisor
    D[i, j] counts the window's positions inside the padded input
    (``count_include_pad``, kh*kw except for a ceil-mode window that reaches
    past the bottom/right padding) or inside the input only."""
    _check_x(x, "meanpool2d")
    geo = pool_geometry(x.shape, window, stride, padding, (1, 1), ceil_mode)
    return _mean_forward(x, geo.rows.windows, geo.cols.windows, geo.divisor(count_include_pad))


def meanpool2d_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """dx[n, c, p, q] = sum over the windows (i, j) holding (p, q) of g[n, c, i, j] / D[i, j]

    (the adjoint of the forward; what lands on padding is dropped)."""
    _check_x(x, "meanpool2d")
    geo = pool_geometry(x.shape, window, stride, padding, (1, 1), ceil_mode)
    return (_mean_backward(grad, x, geo.rows.windows, geo.cols.windows, geo.divisor(count_include_pad)),)


# --- adaptive pooling ----------------------------------------------------------------------------

def adaptive_maxpool2d_forward(x, size):
    """y[n, c, i, j] = max of x[n, c, p, q] over hs(i) <= p < he(i), ws(j) <= q < we(j),

    hs(i) = floor(i*H/Ho), he(i) = ceil((i+1)*H/Ho) (likewise along W); NaN propagates."""
    _check_x(x, "adaptive_maxpool2d")
    rows, cols = adaptive_geometry(x.shape, size)
    return _max_forward(x, rows, cols)


def adaptive_maxpool2d_backward(grad, out, x, size):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over the windows whose maximum came from (p, q)
    (the first maximal pixel in row-major order, or the last NaN: torch's rule)."""
    _check_x(x, "adaptive_maxpool2d")
    rows, cols = adaptive_geometry(x.shape, size)
    return (_max_backward(grad, x, rows, cols),)


def adaptive_meanpool2d_forward(x, size):
    """y[n, c, i, j] = mean of x[n, c, p, q] over the window (i, j) of adaptive_maxpool2d_forward,

    dividing by its size (he(i) - hs(i)) * (we(j) - ws(j))."""
    _check_x(x, "adaptive_meanpool2d")
    rows, cols = adaptive_geometry(x.shape, size)
    return _mean_forward(x, rows, cols, _window_sizes(rows, cols))


def adaptive_meanpool2d_backward(grad, out, x, size):
    """dx[n, c, p, q] = sum over the windows (i, j) holding (p, q) of g[n, c, i, j] / (window (i, j)'s size)."""
    _check_x(x, "adaptive_meanpool2d")
    rows, cols = adaptive_geometry(x.shape, size)
    return (_mean_backward(grad, x, rows, cols, _window_sizes(rows, cols)),)


def _window_sizes(rows, cols):
    return np.outer(rows.valid.sum(axis=1), cols.valid.sum(axis=1))
