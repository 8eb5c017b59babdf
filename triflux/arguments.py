"""Checking and normalising the arguments users give to layers and
operations, one helper per kind of argument: a size (``int_arg``), an int or
a pair of ints (``pair_arg``), one int per spatial axis (``ntuple_arg``),
a padding of any spatial rank (``spatial_pad_arg``), a shape (``shape_arg``), a padding
(``pad_arg``), a probability
(``probability_arg``), a flag (``flag_arg``), a parameter dtype (``float_dtype``), an
input's element type (``is_real``, ``not_real``), one axis or several
(``normalize_axis``, ``normalize_axes``), and the hint for an input in Flux's
layout (``flux_layout_hint``).

Each takes ``who``, the layer or function being called, as it should appear
in the message (``"Conv"``, ``"`softmax`"``), and ``name``, the argument's
name, so a bad value raises an error that names both, says what was expected
and shows what was given. Sizes and paddings raise ShapeError, element types
DTypeError, the rest ArgumentError.
"""
import numbers

import numpy as np

from . import dtypes as _dt
from .errors import ArgumentError, DTypeError, ShapeError


def is_int(v):
    """Whether ``v`` is an integer, Python's or NumPy's (a bool is not)."""
    return type(v) is int or isinstance(v, (np.integer, numbers.Integral)) and not isinstance(v, bool)


def _given(v):
    """``v`` as a message shows it: its repr and, where it could mislead, its type."""
    return repr(v) if type(v) is int else f"{v!r} ({type(v).__name__})"


def _kind(low):
    return {0: "non-negative", 1: "positive"}.get(low, f">= {low}")


def int_arg(v, who, name, low=1):
    """``v`` as an int >= ``low`` (1: a positive size, 0: a size that may be
    empty). Floats (even 2.0), strings, bools and None are refused."""
    if not is_int(v) or v < low:
        raise ShapeError(f"{who}: {name} must be a {_kind(low)} int, got {_given(v)}")
    return int(v)


def pair_arg(v, who, name, low=1):
    """``v`` as a pair of ints >= ``low``: 3 -> (3, 3); (2, 3) stays."""
    if type(v) is tuple and len(v) == 2 and type(v[0]) is int is type(v[1]) and min(v) >= low:
        return v                                 # the common case, checked fast: layers call this per call
    vals = (v, v) if is_int(v) else tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(vals) != 2 or not all(is_int(a) and a >= low for a in vals):
        raise ShapeError(f"{who}: {name} must be a {_kind(low)} int or 2 of them, got {_given(v)}")
    return (int(vals[0]), int(vals[1]))


def shape_arg(shape, who, name="shape"):
    """``shape`` (an int or a tuple or list of ints) as a tuple of ints;
    the sizes' range is the caller's to check (reshape takes one -1)."""
    dims = (shape,) if is_int(shape) else tuple(shape) if isinstance(shape, (tuple, list)) else None
    if dims is None or not all(type(d) is int or is_int(d) for d in dims):
        raise ShapeError(f"{who}: {name} must be an int or a tuple of ints, got {_given(shape)}")
    return tuple(int(d) for d in dims)


def pad_arg(pad, who, name="pad", words=("valid",)):
    """``pad`` as (top, bottom, left, right) of non-negative ints, from an
    int, (h, w) or the four; the word "valid" is no padding. ``words`` lists
    the words ``who`` takes (for the message: a word other than "valid",
    such as Conv's "same", is resolved by the layer before this)."""
    if type(pad) is tuple and len(pad) == 4 and all(type(p) is int and p >= 0 for p in pad):
        return pad
    if isinstance(pad, str) and pad.lower() == "valid" and "valid" in words:
        return (0, 0, 0, 0)
    sides = (pad,) if is_int(pad) else tuple(pad) if isinstance(pad, (tuple, list)) else ()
    if len(sides) not in (1, 2, 4) or not all(is_int(p) and p >= 0 for p in sides):
        spelled = " or ".join(f'"{w}"' for w in words)
        raise ShapeError(f"{who}: {name} must be a non-negative int, (h, w) or (top, bottom, left, right)"
                         f"{', or ' + spelled if spelled else ''}; got {_given(pad)}")
    sides = tuple(int(p) for p in sides)
    if len(sides) == 1:
        return sides * 4
    if len(sides) == 2:
        return (sides[0], sides[0], sides[1], sides[1])
    return sides


def ntuple_arg(v, n, who, name, low=1):
    """``v`` as ``n`` ints >= ``low``, one per spatial axis: an int repeats
    (3 -> (3, 3, 3) for n = 3), a tuple or list must have ``n`` entries."""
    if type(v) is tuple and len(v) == n and all(type(a) is int and a >= low for a in v):
        return v                                 # the common case, checked fast
    vals = (v,) * n if is_int(v) else tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(vals) != n or not all(is_int(a) and a >= low for a in vals):
        raise ShapeError(f"{who}: {name} must be a {_kind(low)} int or {n} of them, got {_given(v)} "
                         f"({n} = one per spatial axis)")
    return tuple(int(a) for a in vals)


#: how a padding's per-axis and flat forms are spelled in messages, by spatial rank
_PAD_FORMS = {1: ("(l,)", "(lo, hi)"), 2: ("(h, w)", "(top, bottom, left, right)"),
              3: ("(d, h, w)", "(front, back, top, bottom, left, right)")}


def spatial_pad_arg(pad, rank, who, name="pad", words=("valid",), low=0):
    """``pad`` as the flat ``(lo_0, hi_0, lo_1, hi_1, ...)`` of non-negative
    ints over ``rank`` spatial axes in axis order, from an int (every side),
    ``rank`` ints (both sides of each axis), the flat ``2*rank`` ints, or
    ``rank`` pairs ``(lo, hi)``; the word "valid" is no padding. For rank 2
    the flat form is (top, bottom, left, right), as :func:`pad_arg` gives.
    ``low``: the smallest side allowed (None: any, a negative side crops)."""
    if type(pad) is tuple and len(pad) == 2 * rank and all(type(p) is int and (low is None or p >= low) for p in pad):
        return pad
    if isinstance(pad, str) and pad.lower() == "valid" and "valid" in words:
        return (0,) * (2 * rank)
    sides = None
    if is_int(pad):
        sides = (pad,) * (2 * rank)
    elif isinstance(pad, (tuple, list)):
        items = tuple(pad)
        if items and all(isinstance(p, (tuple, list)) for p in items):
            if len(items) == rank and all(len(p) == 2 for p in items):
                sides = tuple(v for p in items for v in p)
        elif len(items) == rank:
            sides = tuple(v for p in items for v in (p, p))
        elif len(items) == 2 * rank:
            sides = items
    if sides is None or not all(is_int(p) and (low is None or p >= low) for p in sides):
        spelled = " or ".join(f'"{w}"' for w in words)
        per_axis, flat = _PAD_FORMS.get(rank, (f"{rank} of them", f"{2 * rank} of them"))
        raise ShapeError(f"{who}: {name} must be {'a ' + _kind(low) if low is not None else 'an'} int, {per_axis} or {flat}"
                         f"{', or ' + spelled if spelled else ''}; got {_given(pad)} (for {rank} spatial "
                         f"ax{'is' if rank == 1 else 'es'}; {rank} (lo, hi) pairs work too)")
    return tuple(int(p) for p in sides)


def probability_arg(p, who, name="p"):
    """``p`` as a float in [0, 1]."""
    if not (isinstance(p, numbers.Real) and not isinstance(p, (bool, np.bool_)) and 0 <= p <= 1):
        raise ArgumentError(f"{who}: {name} must be a probability, a number in [0, 1], got {_given(p)}")
    return float(p)


def flag_arg(v, who, name):
    """``v`` as a bool; only True and False (NumPy's too) are flags."""
    if not isinstance(v, (bool, np.bool_)):
        raise ArgumentError(f"{who}: {name} must be True or False, got {_given(v)}")
    return bool(v)


def float_dtype(dtype, who):
    """``dtype`` (any spelling ``dtypes.as_dtype`` takes) as the NumPy dtype
    of a layer's parameters: a floating type, since integer and bool
    parameters cannot learn."""
    d = _dt.as_dtype(dtype)
    if not _dt.is_floating(d):
        raise DTypeError(f"{who}: dtype={d} cannot hold trainable parameters (their updates would round away); "
                         "use a floating type: float32 (the default), float64, float16 or bfloat16")
    return d


def is_real(dtype):
    """Whether ``dtype`` holds real numbers: floats (bfloat16 too), ints, bools."""
    return dtype.kind in "fiub" or _dt.is_bfloat16(dtype)


def not_real(dtype, who, what="an input"):
    """The DTypeError for ``what`` given to ``who`` whose ``dtype`` is not
    :func:`is_real` (complex numbers, strings, objects)."""
    if dtype.kind == "c":
        fix = ("triflux computes with real numbers and will not drop the imaginary part: pass "
               "`np.real(x)` or `np.abs(x)`")
    else:
        fix = "convert the data to numbers first, e.g. `np.asarray(x, dtype=np.float32)`"
    return DTypeError(f"{who} got {what} of dtype {dtype}; {fix}")


def normalize_axes(axis, ndim, opname):
    """``axis`` (None for all, an int or several) as a sorted tuple of
    non-negative axes of an ``ndim``-d tensor."""
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted({normalize_axis(a, ndim, opname) for a in axes}))


def normalize_axis(axis, ndim, opname):
    """One axis of an ``ndim``-d tensor, non-negative."""
    if not is_int(axis):
        raise ArgumentError(f"`{opname}`: an axis must be an int (0-based; negative counts from the end), "
                            f"got {_given(axis)}")
    if not -ndim <= axis < ndim:
        raise ShapeError(f"`{opname}`: axis {axis} is out of range for a {ndim}-d tensor")
    return int(axis) % ndim


def flux_layout_hint(shape, axis, expected):
    """When an input of ``shape`` lacks ``expected`` entries on ``axis`` but
    would have them with its axes reversed (Flux's column-major layout read
    as written: (W, H, C, N) for (N, C, H, W), (features, N) for (N,
    features)), a sentence giving the transpose that fixes it; else ""."""
    n = len(shape)
    if n < 2 or shape[::-1][axis] != expected or shape[axis] == expected:
        return ""
    flux = {2: "(features, N)", 3: "(features, L, N)", 4: "(W, H, C, N)", 5: "(W, H, D, C, N)"}.get(n, "column-major")
    ours = {2: "(N, features)", 3: "(N, L, features)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}.get(n, "batch-first")
    fix = "x.T" if n == 2 else f"x.transpose({', '.join(str(a) for a in range(n - 1, -1, -1))})"
    return (f" The shape looks like Flux's {flux} layout; triflux takes {ours}, batch first: pass `{fix}` "
            "(a Tensor or a NumPy array).")

