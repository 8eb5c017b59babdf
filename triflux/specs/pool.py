"""The pool family's spec: the windows of maxpool2d, meanpool2d,
adaptive_maxpool2d and adaptive_meanpool2d on an NCHW input, checked once.

A 2-d window is the product of a window along the rows and one along the
columns, so the spec holds one :class:`PoolAxis` per spatial axis.

Fixed windows (maxpool2d, meanpool2d); attributes:

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

Adaptive windows to ``size = (Ho, Wo)``: along an axis of length n to n_out
outputs, output i reads the input positions

    floor(i*n/n_out) <= p < ceil((i+1)*n/n_out)

(torch's windows: they cover the input, overlap by at most one position
when n_out does not divide n, and repeat positions when n_out > n).
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ShapeError
from . import cached_on_arguments


@dataclass(frozen=True, eq=False)
class PoolAxis:
    """The windows along one spatial axis: ``size`` input positions to
    ``out`` outputs. Output i has ``taps`` taps (the longest window); tap a
    reads input position ``index[i, a]`` where ``real[i, a]`` (elsewhere it is
    padding, or lies past the end of a shorter adaptive window).
    ``padded_count[i]`` counts output i's taps inside the padded input (the
    divisor of a mean that counts padding), ``real_count[i]`` those inside
    the input; ``most_covering`` is the most windows that hold one input
    position. The arrays are read-only."""
    size: int
    out: int
    index: np.ndarray
    real: np.ndarray
    padded_count: np.ndarray
    real_count: np.ndarray
    most_covering: int

    @property
    def taps(self):
        return self.index.shape[1]


def _axis(size, index, real, padded_count):
    counts = np.bincount(index[real], minlength=size)
    arrays = (index, real, padded_count, real.sum(axis=1))
    for a in arrays:
        a.flags.writeable = False
    return PoolAxis(size, index.shape[0], *arrays, max(int(counts.max(initial=0)), 1))


@dataclass(frozen=True, eq=False)
class PoolSpec:
    """A pooling with fixed windows of an NCHW input of ``x_shape``: the
    attributes as given (normalised to tuples), the output shape and the
    windows along the rows and the columns."""
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    window: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    ceil_mode: bool
    rows: PoolAxis
    cols: PoolAxis

    def divisor(self, count_include_pad):
        """(Ho, Wo): the number of taps a mean divides by, torch's rule: the
        window's taps inside the padded input (count_include_pad), or inside
        the input only (a ceil-mode window's taps past the padding never count)."""
        if count_include_pad:
            return np.outer(self.rows.padded_count, self.cols.padded_count)
        return np.outer(self.rows.real_count, self.cols.real_count)


@dataclass(frozen=True, eq=False)
class AdaptivePoolSpec:
    """An adaptive pooling of an NCHW input of ``x_shape`` to ``size``: the
    output shape and the windows along the rows and the columns."""
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    size: tuple
    rows: PoolAxis
    cols: PoolAxis

    def divisor(self):
        """(Ho, Wo): the size of each window, the divisor of a mean."""
        return np.outer(self.rows.real_count, self.cols.real_count)


def _ints(v, n, name, low):
    v = tuple(int(a) for a in v)
    if len(v) != n or min(v) < low:
        kind = "positive" if low == 1 else "non-negative"
        raise ShapeError(f"{name} must be {n} {kind} ints, got {v}")
    return v


def _check_x(shape, op):
    if len(shape) != 4:
        raise ShapeError(f"{op} expects an NCHW array of 4 dimensions, got shape {shape}")


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
    return _axis(n, np.where(real, index, 0), real, padded)


@lru_cache(maxsize=1024)
def _pool2d_spec(op, x_shape, dtype, window, stride, padding, dilation, ceil_mode):
    _check_x(x_shape, op)
    kh, kw = _ints(window, 2, "window", 1)
    sh, sw = _ints(stride, 2, "stride", 1)
    dh, dw = _ints(dilation, 2, "dilation", 1)
    pt, pb, pl, pr = _ints(padding, 4, "padding (top, bottom, left, right)", 0)
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    if max(pt, pb) >= eh or max(pl, pr) >= ew:
        raise ShapeError(f"padding {(pt, pb, pl, pr)} must be smaller than the window {(kh, kw)} along each axis "
                         f"(its extent {(eh, ew)} with dilation {(dh, dw)})")
    rows = pool_axis(x_shape[2], kh, sh, pt, pb, dh, ceil_mode, "height")
    cols = pool_axis(x_shape[3], kw, sw, pl, pr, dw, ceil_mode, "width")
    return PoolSpec(x_shape, dtype, compute_dtype(dtype), x_shape[:2] + (rows.out, cols.out), (kh, kw), (sh, sw),
                    (pt, pb, pl, pr), (dh, dw), ceil_mode, rows, cols)


@cached_on_arguments
def pool2d_spec(op, x_shape, dtype, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """The :class:`PoolSpec` of the pooling ``op`` (maxpool2d, meanpool2d:
    dilation (1, 1)) of an NCHW input of ``x_shape`` and ``dtype`` (NumPy or torch);
    raises ShapeError (saying what to change) on bad attributes."""
    return _pool2d_spec(op, tuple(int(s) for s in x_shape), as_dtype(dtype), tuple(window), tuple(stride),
                        tuple(padding), tuple(dilation), bool(ceil_mode))


def adaptive_bounds(n, n_out):
    """(start, end) of the n_out adaptive windows over n positions:
    start = floor(i*n/n_out), end = ceil((i+1)*n/n_out)."""
    i = np.arange(n_out)
    return (i * n) // n_out, -((-(i + 1) * n) // n_out)


@lru_cache(maxsize=512)
def adaptive_axis(n, n_out, name="height"):
    """The :class:`PoolAxis` of the adaptive windows from n to n_out positions."""
    if n < 1 or n_out < 1:
        raise ShapeError(f"adaptive pooling needs a positive input and output {name}, got {n} -> {n_out}")
    start, end = adaptive_bounds(n, n_out)
    index = start[:, None] + np.arange(int((end - start).max()))[None, :]
    real = index < end[:, None]
    return _axis(n, np.where(real, index, 0), real, real.sum(axis=1))


@lru_cache(maxsize=1024)
def _adaptive_pool2d_spec(op, x_shape, dtype, size):
    _check_x(x_shape, op)
    Ho, Wo = _ints(size, 2, "size", 1)
    rows, cols = adaptive_axis(x_shape[2], Ho, "height"), adaptive_axis(x_shape[3], Wo, "width")
    return AdaptivePoolSpec(x_shape, dtype, compute_dtype(dtype), x_shape[:2] + (Ho, Wo), (Ho, Wo), rows, cols)


@cached_on_arguments
def adaptive_pool2d_spec(op, x_shape, dtype, size):
    """The :class:`AdaptivePoolSpec` of the adaptive pooling ``op``
    (adaptive_maxpool2d, adaptive_meanpool2d) of an NCHW input of
    ``x_shape`` and ``dtype`` (NumPy or torch) to ``size`` (Ho, Wo)."""
    return _adaptive_pool2d_spec(op, tuple(int(s) for s in x_shape), as_dtype(dtype), tuple(size))
