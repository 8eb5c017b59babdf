"""Normalising the arguments users give to operations and layers: an int or
a pair of ints (``pair``), a padding (``quad``), one axis or several
(``normalize_axis``, ``normalize_axes``)."""
import operator

import numpy as np

from .errors import ShapeError


def pair(v, name="value"):
    """``v`` as a pair of ints: 3 -> (3, 3); (2, 3) stays."""
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    v = tuple(int(e) for e in v)
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v}")
    return v


def quad(pad, name="pad"):
    """Padding as (top, bottom, left, right): an int, (h, w) or the four."""
    if isinstance(pad, (int, np.integer)):
        return (int(pad),) * 4
    pad = tuple(int(p) for p in pad)
    if len(pad) == 2:
        return (pad[0], pad[0], pad[1], pad[1])
    if len(pad) == 4:
        return pad
    raise ValueError(f"{name} must be an int, (h, w) or (top, bottom, left, right), got {pad}")


def normalize_axes(axis, ndim, opname):
    """``axis`` (None for all, an int or several) as a sorted tuple of
    non-negative axes of an ``ndim``-d tensor."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"`{opname}`: axis {a} is out of range for a {ndim}-d tensor")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def normalize_axis(axis, ndim, opname):
    """One axis of an ``ndim``-d tensor, non-negative."""
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise ShapeError(f"`{opname}`: axis {a} is out of range for a {ndim}-d tensor")
    return a % ndim
