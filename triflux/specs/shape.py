"""The shape family's spec: what reshape, transpose, getitem (basic
indexing), concat and broadcast_to accept, and the region an index selects,
in plain Python shared by the reference and the kernels, so both sides agree
on what an index means (and a bug in it cannot hide from the kernel-vs-
reference check as it could were the kernels to import the reference).
"""
import operator

import numpy as np

from ..errors import ShapeError

__all__ = ["normalise_axis", "normalise_perm", "resolve_shape", "broadcast_check", "normalise_index",
           "index_region", "check_concat"]


def normalise_axis(axis, ndim):
    """``axis`` in ``range(ndim)`` (negative axes count from the end)."""
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of range for a {ndim}-d array")
    return axis % ndim


def normalise_perm(axes, ndim):
    """``axes`` as a tuple permutation of ``range(ndim)``; ``None`` reverses."""
    if axes is None:
        return tuple(reversed(range(ndim)))
    axes = tuple(normalise_axis(a, ndim) for a in axes)
    if sorted(axes) != list(range(ndim)):
        raise ShapeError(f"transpose axes {axes} are not a permutation of the {ndim} axes")
    return axes


def resolve_shape(shape, size):
    """``shape`` with a ``-1`` entry (at most one) replaced so that the
    product is ``size``; raises :class:`ShapeError` when impossible."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(operator.index(s) for s in shape)
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise ShapeError(f"cannot reshape to {shape}: negative side")
            known *= s
    holes = shape.count(-1)
    if holes > 1:
        raise ShapeError(f"cannot reshape to {shape}: only one side may be -1")
    if holes == 1:
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape an array of {size} elements to {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif known != size:
        raise ShapeError(f"cannot reshape an array of {size} elements to {shape}")
    return shape


def broadcast_check(shape, target):
    """Raise :class:`ShapeError` unless ``shape`` broadcasts to ``target``
    (NumPy's rule: align on the right; each side equal or 1)."""
    target = tuple(operator.index(t) for t in target)
    ok = len(shape) <= len(target) and all(t >= 0 for t in target) and all(
        s == t or s == 1 for s, t in zip(reversed(shape), reversed(target)))
    if not ok:
        raise ShapeError(f"cannot broadcast an array of shape {tuple(shape)} to {target}")
    return target


def normalise_index(index, shape):
    """Resolve a basic index against ``shape``.

    ``index`` is a tuple of ints, slices, ``None`` (``np.newaxis``) and at most
    one ``Ellipsis``; a single item may be given bare. Returns a list of items,
    one per output or consumed axis, in order:

    * ``("int", i)``: axis consumed at position ``i`` (``0 <= i < side``);
    * ``("slice", start, step, length)``: the positions ``start + k*step``,
      ``k < length`` (``step`` may be negative, as in NumPy);
    * ``("new",)``: a new axis of length 1.

    Axes the index does not mention are taken whole, as NumPy does.
    """
    if not isinstance(index, tuple):
        index = (index,)
    for item in index:
        if item is None or item is Ellipsis or isinstance(item, slice):
            continue
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise TypeError(
                f"only basic indexing is supported (ints, slices, None, ...), got {item!r}; "
                "boolean and array indices are not primitives of triflux")
    n_ellipsis = sum(item is Ellipsis for item in index)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for item in index if item is not None and item is not Ellipsis)
    if consumed > len(shape):
        raise IndexError(f"too many indices: {consumed} for an array of {len(shape)} dimensions")
    fill = (slice(None),) * (len(shape) - consumed)
    if n_ellipsis:
        at = index.index(Ellipsis)
        index = index[:at] + fill + index[at + 1:]
    else:
        index = index + fill

    items, axis = [], 0
    for item in index:
        if item is None:
            items.append(("new",))
            continue
        side = shape[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(side)  # ValueError for step 0, as in Python
            items.append(("slice", start, step, len(range(start, stop, step))))
        else:
            i = operator.index(item)
            if not -side <= i < side:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {side}")
            items.append(("int", i % side))
        axis += 1
    return items


def index_region(items, strides):
    """(shape, strides, offset) of the region ``items`` selects in an array
    with element ``strides``: the region's element ``(k0, k1, ...)`` lives at
    ``offset + sum(k * stride)``. Strides are negative for negative steps."""
    shape, out_strides, offset, axis = [], [], 0, 0
    for item in items:
        if item[0] == "new":
            shape.append(1)
            out_strides.append(0)
            continue
        stride = strides[axis]
        axis += 1
        if item[0] == "int":
            offset += item[1] * stride
        else:
            _, start, step, length = item
            shape.append(length)
            out_strides.append(step * stride)
            if length:
                offset += start * stride
    return tuple(shape), tuple(out_strides), offset


def check_concat(xs, axis):
    """The axis (normalised) along which the arrays ``xs`` concatenate,
    checked: at least one array, not zero-dimensional, every other side equal."""
    if not xs:
        raise ShapeError("concat needs at least one array")
    ndim = xs[0].ndim
    if ndim == 0:
        raise ShapeError("zero-dimensional arrays cannot be concatenated")
    axis = normalise_axis(axis, ndim)
    first = xs[0].shape
    for x in xs[1:]:
        if x.ndim != ndim or any(a != b for k, (a, b) in enumerate(zip(first, x.shape)) if k != axis):
            raise ShapeError(f"concat along axis {axis}: shapes {[tuple(x.shape) for x in xs]} "
                             "must agree on every other axis")
    return axis
