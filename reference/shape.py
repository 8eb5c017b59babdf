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

The checks and the index helpers (``normalise_index``, ``index_region``) are
the family's spec, ``triflux.specs.shape``, shared with the Triton kernels, so
both sides agree on what an index means.
"""
import operator

import numpy as np

from triflux.specs.shape import (broadcast_check, check_concat, index_region, normalise_index,  # noqa: F401
                                 normalise_perm, resolve_shape)

from ._util import unbroadcast


# --- NumPy's own index ----------------------------------------------------------------

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
