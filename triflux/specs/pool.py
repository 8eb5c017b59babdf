"""The pool family's spec: the windows of maxpool, meanpool, lpnormpool,
adaptive_maxpool and adaptive_meanpool on an input ``(N, C, *spatial)`` with
R = 1, 2 or 3 spatial axes, checked once.

An R-d window is the product of one window along each spatial axis, so the
spec holds one :class:`PoolAxis` per axis (``spec.axes``, in axis order) and
its rank ``spec.rank = R``; ops, the reference and the kernels all read it.

Fixed windows (maxpool, meanpool, lpnormpool); attributes, each a tuple of R
entries (``padding`` 2R):

* ``window = k``, ``stride = s``, ``dilation = d`` (maxpool and lpnormpool;
  meanpool's is 1): positive ints. With multi-indices i (the output) and
  t (the tap, 0 <= t < k, all in Z^R), the window of output i reads the input
  position

      q(i, t) = i*s - lo + t*d          (per axis, lo the low padding),

  taps scanned row-major (the last axis fastest); positions outside the
  input are padding.
* ``padding = (lo_0, hi_0, lo_1, hi_1, ...)``: non-negative, each side at
  most half the window's extent ``e = d*(k - 1) + 1`` along its axis,
  ``max(lo, hi) <= e // 2`` (torch's rule, "pad should be at most half of
  effective kernel size"; torch pads both sides alike, triflux each side on
  its own, as NNlib).
* ``ceil_mode``: the output size along an axis of length n, with pads lo, hi,
  extent e and stride s, is (torch's rule)

      floor mode:  n_out = floor((n + lo + hi - e) / s) + 1
      ceil mode:   n_out = ceil((n + lo + hi - e) / s) + 1, less one if that
                   last window would start at or past n + lo (in the padded
                   input: inside the high padding)

  so ceil mode adds the partial window at the end (it reads past the high
  padding, which counts as padding too).
* every window must hold at least one input position (only a dilated window
  can miss them all, stepping over a small input; an error names the fix),
  so a maximum or a mean is always over real values.
* lpnormpool's ``p``: a positive number (``inf`` included: the maximum of |x|).

Adaptive windows to ``size`` (R positive ints): along an axis of length n to
n_out outputs, output i reads the input positions

    floor(i*n/n_out) <= q < ceil((i+1)*n/n_out)

(torch's windows: they cover the input, overlap by at most one position
when n_out does not divide n, and repeat positions when n_out > n; torch
allows any output size, larger than the input too, and so does triflux).
"""
import functools
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ArgumentError, ShapeError
from . import cached_on_arguments

#: the registered names, by the names the same primitives had as 2-D ones
PRIMITIVE = {"maxpool2d": "maxpool", "meanpool2d": "meanpool", "adaptive_maxpool2d": "adaptive_maxpool",
             "adaptive_meanpool2d": "adaptive_meanpool"}
#: the spatial axes' names by rank, for messages
AXIS_NAMES = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
_LAYOUT = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


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


def outer(vectors):
    """The R-d outer product v_0[i_0] * v_1[i_1] * ... of R vectors (float64)."""
    return functools.reduce(np.multiply.outer, [np.asarray(v, dtype=np.float64) for v in vectors])


@dataclass(frozen=True, eq=False)
class PoolSpec:
    """A pooling with fixed windows of an input ``(N, C, *spatial)`` of
    ``x_shape``: the attributes (normalised to tuples), the output shape and
    the windows along each spatial axis (``axes``)."""
    name: str
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    window: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    ceil_mode: bool
    axes: tuple
    p: float = None

    @property
    def rank(self):
        return len(self.axes)

    def divisor(self, count_include_pad):
        """The R-d array (output sides) of the taps a mean divides by, torch's
        rule: the window's taps inside the padded input (count_include_pad),
        or inside the input only (a ceil-mode window's taps past the padding
        never count)."""
        return outer([a.padded_count if count_include_pad else a.real_count for a in self.axes])

    def lp_scale(self):
        """The R-d array prod(k) / (taps inside the padded input) by which
        lpnormpool multiplies a window's sum of x^p: 1 except for a ceil-mode
        window reaching past the high padding (torch computes lp_pool as
        avg_pool(x^p) * prod(k), and avg_pool divides such a window by its
        taps inside the padded input only)."""
        return math.prod(self.window) / self.divisor(True)


@dataclass(frozen=True, eq=False)
class AdaptivePoolSpec:
    """An adaptive pooling of an input ``(N, C, *spatial)`` of ``x_shape`` to
    ``size``: the output shape and the windows along each spatial axis."""
    name: str
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    out_shape: tuple
    size: tuple
    axes: tuple

    @property
    def rank(self):
        return len(self.axes)

    def divisor(self):
        """The R-d array of the size of each window, the divisor of a mean."""
        return outer([a.real_count for a in self.axes])


def _ints(name, v, n, what, low, hint=""):
    try:
        v = tuple(int(a) for a in v)
    except (TypeError, ValueError):
        raise ShapeError(f"`{name}`: {what} must be {n} ints{hint}, got {v!r}") from None
    if len(v) != n or (v and min(v) < low):
        kind = "positive" if low == 1 else "non-negative"
        raise ShapeError(f"`{name}`: {what} must be {n} {kind} ints{hint}, got {v}")
    return v


def _rank(name, x_shape, rank, what, given):
    """Check that ``x_shape`` is ``(N, C, *spatial)`` with ``rank`` spatial axes."""
    if not 1 <= rank <= 3:
        raise ShapeError(f"`{name}`: {what} must have 1, 2 or 3 entries (one per spatial axis), got {given}")
    if len(x_shape) != rank + 2:
        have = len(x_shape) - 2
        fix = (f"give {have} entries (one per spatial axis of the input)" if 1 <= have <= 3
               else f"pass an input {_LAYOUT[rank]}")
        raise ShapeError(f"`{name}`: {what} {given} has {rank} entries, so it pools an input {_LAYOUT[rank]} of "
                         f"{rank + 2} dims, but the input has shape {tuple(x_shape)} ({len(x_shape)} dims); {fix}")


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
        out -= 1                               # the last window would start inside the high padding
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


def _check_p(name, p):
    if name != "lpnormpool":
        if p is not None:
            raise ArgumentError(f"`{name}` takes no p (only lpnormpool does), got p={p!r}")
        return None
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not p > 0:
        raise ArgumentError(f"`lpnormpool`: p must be a positive number (inf: the maximum of |x|), got {p!r}")
    return float(p)


@lru_cache(maxsize=1024)
def _pool_spec(name, x_shape, dtype, window, stride, padding, dilation, ceil_mode, p):
    R = len(window)
    _rank(name, x_shape, R, "the window", window)
    window = _ints(name, window, R, "the window", 1)
    stride = _ints(name, stride, R, "stride", 1, " (one per spatial axis)")
    dilation = (1,) * R if dilation is None else _ints(name, dilation, R, "dilation", 1, " (one per spatial axis)")
    padding = _ints(name, padding, 2 * R, "padding", 0,
                    f" (lo, hi) per spatial axis, flat: {2 * R} entries for {R} axes")
    p = _check_p(name, p)
    names = AXIS_NAMES[R]
    extents = tuple(d * (k - 1) + 1 for k, d in zip(window, dilation))
    for a, e in enumerate(extents):
        lo, hi = padding[2 * a], padding[2 * a + 1]
        if max(lo, hi) > e // 2:
            raise ShapeError(f"`{name}`: padding {padding} has ({lo}, {hi}) along the {names[a]}, more than half the "
                             f"window's extent {e} there (window {window[a]}, dilation {dilation[a]}): each side "
                             f"must be at most {e // 2} (torch's rule); use smaller padding, smaller than the window")
    axes = tuple(pool_axis(x_shape[2 + a], window[a], stride[a], padding[2 * a], padding[2 * a + 1], dilation[a],
                           ceil_mode, names[a]) for a in range(R))
    return PoolSpec(name, x_shape, dtype, compute_dtype(dtype), x_shape[:2] + tuple(a.out for a in axes), window,
                    stride, padding, dilation, ceil_mode, axes, p)


def _tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else v


@cached_on_arguments
def pool_spec(name, x_shape, dtype, window, stride, padding, dilation=None, ceil_mode=False, p=None):
    """The :class:`PoolSpec` of the pooling ``name`` (maxpool, meanpool:
    no dilation, lpnormpool: with ``p``) of an input ``(N, C, *spatial)`` of
    ``x_shape`` and ``dtype`` (NumPy or torch); the window's length sets the
    rank R. Raises ShapeError (naming the primitive, what it expected, what it
    got, and what to change) on attributes that do not fit."""
    window = _tuple(window)
    if not isinstance(window, tuple):
        raise ShapeError(f"`{name}`: the window must be a tuple of 1, 2 or 3 ints, got {window!r}")
    return _pool_spec(name, tuple(int(s) for s in x_shape), as_dtype(dtype), window, _tuple(stride),
                      _tuple(padding), _tuple(dilation), bool(ceil_mode), p)


def pool2d_spec(op, x_shape, dtype, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    """:func:`pool_spec` of an (N, C, H, W) input under the 2-D names
    (maxpool2d, meanpool2d) too."""
    return pool_spec(PRIMITIVE.get(op, op), x_shape, dtype, window, stride, padding, dilation, ceil_mode)


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
def _adaptive_pool_spec(name, x_shape, dtype, size):
    R = len(size)
    _rank(name, x_shape, R, "the output size", size)
    size = _ints(name, size, R, "the output size", 1, " (one per spatial axis)")
    names = AXIS_NAMES[R]
    axes = tuple(adaptive_axis(x_shape[2 + a], size[a], names[a]) for a in range(R))
    return AdaptivePoolSpec(name, x_shape, dtype, compute_dtype(dtype), x_shape[:2] + size, size, axes)


@cached_on_arguments
def adaptive_pool_spec(name, x_shape, dtype, size):
    """The :class:`AdaptivePoolSpec` of the adaptive pooling ``name``
    (adaptive_maxpool, adaptive_meanpool) of an input ``(N, C, *spatial)`` of
    ``x_shape`` and ``dtype`` (NumPy or torch) to ``size`` (R sides)."""
    size = _tuple(size)
    if not isinstance(size, tuple):
        raise ShapeError(f"`{name}`: the output size must be a tuple of 1, 2 or 3 ints, got {size!r}")
    return _adaptive_pool_spec(name, tuple(int(s) for s in x_shape), as_dtype(dtype), size)


def adaptive_pool2d_spec(op, x_shape, dtype, size):
    """:func:`adaptive_pool_spec` under the 2-D names (adaptive_maxpool2d, ...) too."""
    return adaptive_pool_spec(PRIMITIVE.get(op, op), x_shape, dtype, size)


# --- floating-point operations (the registry's ``flops``, read by the kernel report) ------------

def pool_flops(name, direction, inputs, out_shape, attrs, largest):
    """A compare or add per tap of every window, any rank (adaptive pools: about
    one per element); lpnormpool's taps also take x^p (exp2(p log2|x|), ~4)."""
    per_tap = 5 if name == "lpnormpool" and attrs.get("p") != float("inf") else 1
    return largest * math.prod(attrs.get("window", (1,))) * per_tap
