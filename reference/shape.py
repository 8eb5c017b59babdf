"""Shape and layout primitives: reshape, transpose, getitem (basic indexing),
concat, broadcast_to, contiguous.

None of these computes anything: each moves values around. So each adjoint
moves the incoming gradient ``g`` back to where its values came from:

* a one-to-one relabelling of elements (reshape, transpose, contiguous) is
  undone by the inverse relabelling;
* selecting a region (getitem, a slab of concat) is undone by writing ``g``
  into that region of zeros;
* copying one element to many places (broadcast_to) is undone by summing the
  copies.

The index helpers (:func:`normalise_index`, :func:`index_region`) are plain
Python and are shared with the Triton kernels, so both sides agree on what an
index means.
"""
import operator

import numpy as np

from triflux.errors import ShapeError

from ._util import unbroadcast


# --- helpers shared with the kernels --------------------------------------------------

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


def as_numpy_index(items):
    """The tuple NumPy indexes with for normalised ``items``."""
    out = []
    for item in items:
        if item[0] == "new":
            out.append(None)
        elif item[0] == "int":
            out.append(item[1])
        else:
            _, start, step, length = item
            stop = start + length * step
            if length == 0:
                out.append(slice(0, 0))
            else:
                out.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(out)


# --- reshape -------------------------------------------------------------------------------

def reshape_forward(x, *, shape):
    """``y = reshape(x, shape)``: the same elements in row-major order,
    regrouped into ``shape`` (one side may be -1). A view when the layout
    allows, else a copy.

    Backward: ``dx = reshape(g, x.shape)``.
    """
    return np.reshape(x, resolve_shape(shape, x.size))


def reshape_backward(g, out, x, *, shape):
    """``dx = reshape(g, x.shape)``: undo the regrouping."""
    return (np.reshape(g, x.shape),)


# --- transpose -----------------------------------------------------------------------------

def transpose_forward(x, *, axes):
    """``y[i_0, ..., i_{n-1}] = x[j]`` with ``j[axes[k]] = i_k``: axis ``k``
    of ``y`` is axis ``axes[k]`` of ``x``. A view.

    Backward: ``dx = transpose(g, argsort(axes))`` (the inverse permutation).
    """
    return np.transpose(x, normalise_perm(axes, x.ndim))


def transpose_backward(g, out, x, *, axes):
    """``dx = transpose(g, argsort(axes))``: the inverse permutation."""
    return (np.transpose(g, np.argsort(normalise_perm(axes, x.ndim))),)


# --- getitem -------------------------------------------------------------------------------

def getitem_forward(x, *, index):
    """``y = x[index]`` with NumPy basic indexing: ints drop an axis (negative
    ints count from the end), slices keep it (any step, negative included),
    ``None`` inserts an axis of length 1, ``...`` stands for the axes not
    mentioned.

    Backward: ``dx = zeros(x.shape); dx[index] = g`` (basic indexing never
    selects an element twice, so assignment is the adjoint).
    """
    return np.asarray(x[as_numpy_index(normalise_index(index, x.shape))])   # an int index gives a 0-d array


def getitem_backward(g, out, x, *, index):
    """``dx = zeros(x.shape)`` with ``dx[index] = g``: each selected element
    receives its gradient, the rest receive 0."""
    dx = np.zeros(x.shape, dtype=x.dtype)
    dx[as_numpy_index(normalise_index(index, x.shape))] = g
    return (dx,)


# --- concat --------------------------------------------------------------------------------

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


def concat_forward(*xs, axis):
    """``y = [x_1 | x_2 | ... ]`` along ``axis``: ``x_k`` fills the slab
    ``offset_k <= i_axis < offset_k + x_k.shape[axis]`` of ``y``, where
    ``offset_k`` is the sum of the earlier inputs' sides along ``axis``.

    Backward: ``dx_k = g[..., offset_k : offset_k + x_k.shape[axis], ...]``
    (the slab of ``g`` each input filled).
    """
    axis = check_concat(xs, axis)
    return np.concatenate(xs, axis=axis)


def concat_backward(g, out, *xs, axis):
    """``dx_k = g[..., offset_k : offset_k + x_k.shape[axis], ...]``: each input
    gets the slab of ``g`` it filled."""
    axis = check_concat(xs, axis)
    grads, start = [], 0
    for x in xs:
        size = x.shape[axis]
        grads.append(g[(slice(None),) * axis + (slice(start, start + size),)])
        start += size
    return tuple(grads)


# --- broadcast_to --------------------------------------------------------------------------

def broadcast_to_forward(x, *, shape):
    """``y = broadcast_to(x, shape)`` (NumPy's rule): ``x`` is aligned on the
    right; a side of 1 repeats along the target side, and missing leading
    axes repeat the whole of ``x``. A read-only view.

    Backward: ``dx = unbroadcast(g, x.shape)``: ``g`` summed over the leading
    axes and over each axis where ``x`` had side 1.
    """
    return np.broadcast_to(x, broadcast_check(x.shape, shape))


def broadcast_to_backward(g, out, x, *, shape):
    """``dx = unbroadcast(g, x.shape)``: the copies of each element of ``x``
    are summed (over the added leading axes and the stretched axes of side 1)."""
    return (unbroadcast(g, x.shape),)


# --- contiguous ----------------------------------------------------------------------------

def contiguous_forward(x):
    """``y = x`` as a dense row-major array (a copy only when ``x`` is not
    already one). The values do not change.

    Backward: ``dx = g``.
    """
    return np.asarray(x, order="C")


def contiguous_backward(g, out, x):
    """``dx = g``: the values did not change."""
    return (g,)
