"""The pad family's spec: the geometry of ``pad`` (NNlib's pad_constant,
pad_reflect, pad_repeat, pad_symmetric, pad_circular; torch's ``F.pad``) on
an array of any rank, checked once.

Attributes:

* ``padding = (lo_0, hi_0, lo_1, hi_1, ..., lo_{R-1}, hi_{R-1})``: one pair
  of ints per axis of x (R = x.ndim >= 1), in axis order (the first pair
  pads axis 0). Axis k of n inputs becomes ``m = lo + n + hi`` outputs. A
  negative pad crops, as in torch's F.pad (below). (torch's F.pad lists
  pairs from the *last* axis backwards and may omit leading axes;
  ``triflux.ops.pad`` converts.)
* ``mode``: "constant", "reflect", "replicate", "symmetric" or "circular";
* ``value``: the fill of mode "constant" (any float: 0, negative, inf, NaN);
  the other modes take none (value 0).

Along one axis, output position p in [0, m) reads input position
``src(p)`` of i = p - lo (i itself inside, 0 <= i < n)::

    constant   : x[i] if 0 <= i < n, else value
    reflect    : src = -i            (i < 0)     mirror without the edge:  c b | a b c d | c b
                       2(n-1) - i    (i >= n)
    symmetric  : src = -1 - i        (i < 0)     mirror with the edge:     b a | a b c d | d c
                       2n - 1 - i    (i >= n)
    replicate  : src = 0             (i < 0)     the edge repeated:        a a | a b c d | d d
                       n - 1         (i >= n)
    circular   : src = i + n         (i < 0)     wrap around:              c d | a b c d | a b
                       i - n         (i >= n)

and the padded array is y[p_0, ..., p_{R-1}] = x[src_0(p_0), ..., src_{R-1}(p_{R-1})]
(constant: the value wherever some axis is outside). Each rule reflects or
wraps once, which is what the limits below guarantee.

Negative pads, torch's semantics exactly: constant, reflect, symmetric and
replicate apply the rules above as they stand (i = p - lo with lo < 0
starts inside x: the front is cropped, and a reflection or an edge still
refers to x's own ends: reflect (-1, 3) of [a b c d] is [b c d c b a]);
circular crops first (x[max(-lo, 0) : n - max(-hi, 0)], of n' elements)
and then wraps the cropped array by (max(lo, 0), max(hi, 0)), as torch's
circular padding does. Each axis keeps ``m >= 0`` elements.

Limits per axis (each an error naming the axis, its size, the pad, the
limit and the fix; a pad of 0 is always allowed, so any axis may be left
alone, empty ones included):

    constant   : any pad; a crop of at most n in all (max(-lo, 0) + max(-hi, 0) <= n)
    reflect    : lo, hi <= n - 1   (torch's rule, NNlib's too: the edge is not repeated,
                                    so n - 1 positions are there to mirror)
    symmetric  : lo, hi <= n       (NNlib's pad_symmetric, NumPy's mode="symmetric")
    circular   : a crop of at most n, then lo, hi <= n'   (torch's rule, NNlib's too:
                                    wrap around at most once)
    replicate  : n >= 1            (any pad; an empty axis has no edge to repeat)

NNlib (which has no negative pads) and torch agree on these limits; where
they differ triflux takes the per-axis rule: torch's reflect and replicate
kernels refuse any empty non-batch axis, padded or not ("other non-zero
dimensions"), and accept only the last 1-3 axes of 2-D to 5-D inputs;
NNlib's pad_repeat indexes the edge even for a pad of 0 (an error on an
empty axis). Here each axis is checked on its own, so an empty axis with
pads of 0 is fine in every mode (the output is empty along it), and any
rank works; an axis cropped to nothing (m = 0) is allowed too, where torch's
reflect and replicate refuse an empty output. NumPy's np.pad "reflect",
"symmetric" and "wrap" go further (they reflect or wrap repeatedly for pads
beyond the limits); triflux refuses those, as torch and NNlib do, since a
pad that large is almost always a mistake and the gradient rule of a single
reflection (at most three outputs per input, below) would not hold.

The backward: an input element's gradient is the sum of the output
gradients of every output element that copied it; along one axis, input i
is read by output lo + i (if 0 <= lo + i < m) and, in the modes that mirror
or wrap, by at most one position in each pad (replicate: the edges by every
pad position); in every case only positions p with 0 <= p < m count:

    constant   : lo + i
    reflect    : lo + i;  lo - i (if i >= 1);  lo + 2(n-1) - i (if i <= n - 2)
    symmetric  : lo + i;  lo - 1 - i;  lo + 2n - 1 - i
    circular   : lo + i;  lo + i - n;  lo + i + n   (in the cropped array's terms)
    replicate  : lo + i;  0..lo-1 (if i == 0);  lo+n..m-1 (if i == n - 1)

so the R-d backward folds the output gradient one padded axis at a time.
"""
import math
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral, Real

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ArgumentError, ShapeError

#: the padding modes
MODES = ("constant", "reflect", "replicate", "symmetric", "circular")

#: what each mode allows, for the error messages
_LIMIT_TEXT = {
    "reflect": "smaller than the axis (reflection leaves out the edge, so an axis of n elements can mirror at "
               "most n - 1)",
    "symmetric": "at most the axis' size (a symmetric reflection copies each element at most once per side)",
    "circular": "at most the axis' size (the padding wraps around at most once)",
}
_FIX = {
    "reflect": "mode='symmetric' (pads up to the size) or 'replicate' (any pad)",
    "symmetric": "mode='replicate' (any pad)",
    "circular": "mode='replicate' (any pad)",
}


def pad_limit(mode, n):
    """The largest pad mode ``mode`` allows on an axis of ``n`` elements
    (None: any), per the module docstring; a pad of 0 is always allowed.
    (Circular: of the axis after any crop, n - max(-lo, 0) - max(-hi, 0).)"""
    if mode == "constant":
        return None
    if mode == "replicate":
        return None if n >= 1 else 0
    if mode == "reflect":
        return max(n - 1, 0)
    return n                                   # symmetric, circular


@dataclass(frozen=True, eq=False)
class PadAxis:
    """One axis: ``size`` inputs (n) padded by ``lo`` and ``hi`` to
    ``out = lo + size + hi`` outputs. The rule reads the ``window`` elements
    of x from ``start`` on, padded by ``before`` and ``after``: x itself and
    (lo, hi), but in mode circular the crop of negative pads (start =
    max(-lo, 0), window = n - start - max(-hi, 0), before = max(lo, 0),
    after = max(hi, 0)). ``source[p]`` is the input position output p copies
    (the module docstring's src), -1 for a constant pad; a read-only array."""
    size: int
    lo: int
    hi: int
    mode: str
    start: int
    window: int
    before: int
    after: int
    source: np.ndarray

    @property
    def out(self):
        return self.lo + self.size + self.hi

    @property
    def padded(self):
        """Whether this axis is padded (or cropped) at all."""
        return self.lo != 0 or self.hi != 0

    @property
    def copied(self):
        """(first, end): the output positions p in [first, end) that copy x
        itself, x[p - lo] (the rest is padding)."""
        first = min(max(self.lo, 0), self.out)
        return first, max(first, min(self.lo + self.size, self.out))


@lru_cache(maxsize=1024)
def pad_axis(n, lo, hi, mode):
    """The :class:`PadAxis` of an axis of ``n`` elements padded by (lo, hi)
    in ``mode`` (the pads already checked against the limits)."""
    start, window, before, after = 0, n, lo, hi
    if mode == "circular":
        start, before, after = max(-lo, 0), max(lo, 0), max(hi, 0)
        window = n - start - max(-hi, 0)
    m = window + before + after
    i = np.arange(m, dtype=np.int64) - before
    w = window
    below, above = i < 0, i >= w
    if mode == "constant":
        src = np.where(below | above, -1, i)
    elif mode == "reflect":
        src = np.where(below, -i, np.where(above, 2 * (w - 1) - i, i))
    elif mode == "symmetric":
        src = np.where(below, -1 - i, np.where(above, 2 * w - 1 - i, i))
    elif mode == "replicate":
        src = np.clip(i, 0, max(w - 1, 0))
    else:                                      # circular, in the cropped window
        src = np.where(below, i + w, np.where(above, i - w, i)) + start
    src.flags.writeable = False
    return PadAxis(n, lo, hi, mode, start, window, before, after, src)


@dataclass(frozen=True, eq=False)
class PadSpec:
    """A padding of an array of ``x_shape`` and ``dtype``: the attributes
    normalised (``padding`` the flat tuple of ints, ``value`` a float, 0.0
    outside mode "constant"), the output shape and one :class:`PadAxis`
    per axis."""
    x_shape: tuple
    dtype: np.dtype
    compute_dtype: np.dtype
    padding: tuple
    mode: str
    value: float
    out_shape: tuple
    axes: tuple

    @property
    def rank(self):
        """The number of axes of x (every one may be padded)."""
        return len(self.x_shape)

    @property
    def pairs(self):
        """((lo_0, hi_0), ..., (lo_{R-1}, hi_{R-1}))."""
        return tuple((a.lo, a.hi) for a in self.axes)

    @property
    def padded_axes(self):
        """The axes with a non-zero pad, in order."""
        return tuple(k for k, a in enumerate(self.axes) if a.padded)


def _padding_ints(padding, rank):
    if isinstance(padding, (str, bytes)) or not hasattr(padding, "__len__"):
        raise ShapeError(f"pad: padding must be a tuple of {2 * rank} ints (lo, hi) per axis of x, in axis order "
                         f"(lo_0, hi_0, lo_1, hi_1, ...), got {padding!r}")
    padding = tuple(padding)
    if len(padding) != 2 * rank:
        raise ShapeError(f"pad: padding has {len(padding)} entries, but x has {rank} axes, so it needs "
                         f"{2 * rank} = 2 x {rank}: (lo, hi) per axis in axis order (lo_0, hi_0, lo_1, hi_1, ...); "
                         f"got {padding}. Give a pair (0, 0) for each axis to leave alone")
    bad = [p for p in padding if isinstance(p, bool) or not isinstance(p, Integral)]
    if bad:
        raise ShapeError(f"pad: padding must hold ints, got {padding} (the entry {bad[0]!r} is a "
                         f"{type(bad[0]).__name__})")
    return tuple(int(p) for p in padding)


def _check_axis(k, n, lo, hi, mode, x_shape):
    """Raise the ShapeError of the module docstring's limits for axis k."""
    where = f"axis {k} of x (shape {x_shape}) has size {n} and padding (lo, hi) = ({lo}, {hi})"
    crop = max(-lo, 0) + max(-hi, 0)
    if n + lo + hi < 0 or (mode in ("constant", "circular") and crop > n):
        raise ShapeError(f"pad: negative pads crop, but {where}: that crops {crop} of its {n} elements"
                         f"{'' if mode in ('constant', 'circular') else f' and leaves {n + lo + hi}'}; "
                         f"crop at most {n} in all")
    if mode == "replicate" and n == 0 and (lo or hi):
        raise ShapeError(f"pad: mode='replicate' repeats the edge of each axis, but axis {k} of x (shape "
                         f"{x_shape}) is empty (size 0) and padded by ({lo}, {hi}): there is no edge to "
                         "repeat; pad that axis by (0, 0) or use mode='constant'")
    size = n - crop if mode == "circular" else n
    limit = pad_limit(mode, size)
    if limit is not None and max(lo, hi) > limit:
        cropped = f" (cropped to {size} by the negative pad)" if mode == "circular" and crop else ""
        raise ShapeError(f"pad: mode={mode!r} needs each pad {_LIMIT_TEXT[mode]}, but {where}{cropped}: "
                         f"its limit is {limit}; pad that axis by at most {limit}, or use {_FIX[mode]}")


def _pad_spec(x_shape, dtype, padding, mode, value):
    if mode not in MODES:
        raise ArgumentError(f"pad: mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentError(f"pad: value must be a number (the fill of mode 'constant'), got {value!r}")
    value = float(value)
    if mode != "constant" and value != 0:
        raise ArgumentError(f"pad: value applies to mode='constant' only, but mode is {mode!r} and value "
                            f"{value!r}; drop the value or use mode='constant'")
    if mode != "constant":
        value = 0.0
    rank = len(x_shape)
    if rank == 0:
        raise ShapeError("pad: x must have at least one axis, got a 0-d array (there is nothing to pad); "
                         "reshape it to (1,) first")
    padding = _padding_ints(padding, rank)
    axes = []
    for k, n in enumerate(x_shape):
        lo, hi = padding[2 * k], padding[2 * k + 1]
        _check_axis(k, n, lo, hi, mode, x_shape)
        axes.append(pad_axis(n, lo, hi, mode))
    out = tuple(a.out for a in axes)
    return PadSpec(x_shape, dtype, compute_dtype(dtype), padding, mode, value, out, tuple(axes))


def _hashable(v):
    return tuple(v) if isinstance(v, (list, np.ndarray)) else v


def _build(x_shape, dtype, padding, mode, value):
    value = 0.0 if value is None else value
    return _pad_spec(tuple(int(s) for s in x_shape), as_dtype(dtype), _hashable(padding), mode, value)


@lru_cache(maxsize=1024)
def _cached(x_shape, dtype, padding, mode, value, kinds):
    return _build(x_shape, dtype, padding, mode, value)


def _kinds(padding, value):
    """What the cache key adds to the arguments: the types of the pads and
    of the value, and the value's sign. Equal arguments may differ in what
    they ask for: 1.0 == 1 == True (a float pad or a bool value is refused),
    and -0.0 == 0.0 (it fills differently)."""
    try:
        sign = math.copysign(1.0, float(value))
    except (TypeError, ValueError):
        sign = 1.0
    types = tuple(map(type, padding)) if isinstance(padding, tuple) else type(padding)
    return types, type(value), sign


def pad_spec(x_shape, dtype, padding, mode="constant", value=0.0):
    """The :class:`PadSpec` of padding an array of ``x_shape`` and ``dtype``
    (NumPy or torch) by ``padding`` (lo, hi per axis, flat) in ``mode``, with
    ``value`` (mode "constant"); raises ShapeError (a padding that does not
    fit x: the axis, its size, the pad, the mode's limit and the fix) or
    ArgumentError (an unknown mode, a value outside mode "constant").
    Cached on the arguments as given (the value's sign too)."""
    try:
        hash((x_shape, dtype, padding, mode, value))
    except TypeError:                        # an unhashable argument (a list): not cached
        return _build(x_shape, dtype, padding, mode, value)
    return _cached(x_shape, dtype, padding, mode, value, _kinds(padding, value))
