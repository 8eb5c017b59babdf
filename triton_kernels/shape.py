"""Shape and layout primitives on the device (mirrors ``reference/shape.py``).

Wherever torch can express the result as a view (metadata only: view,
permute, expand, as_strided) that is what we return. Where it cannot, values
move with ``copy.copy_into``, the strided copy kernel, which also accepts
negative strides (``x[::-1]``) and element offsets.
"""
from triflux.specs.shape import (broadcast_check, check_concat, index_region, normalise_index, normalise_perm,
                                 resolve_shape)

from . import copy, launch
from .reduce import unbroadcast


def _reshape(t, shape):
    """``t`` viewed as ``shape``; a dense copy first when no view exists."""
    try:
        return t.view(shape)
    except RuntimeError:  # the layout cannot be regrouped without moving data
        return copy.contiguous(t).view(shape)


# --- reshape -------------------------------------------------------------------------------

def reshape_forward(x, *, shape):
    return _reshape(x, resolve_shape(shape, x.numel()))


def reshape_backward(g, out, x, *, shape):
    return (_reshape(g, tuple(x.shape)),)


# --- transpose -----------------------------------------------------------------------------

def transpose_forward(x, *, axes):
    return x.permute(normalise_perm(axes, x.dim()))


def transpose_backward(g, out, x, *, axes):
    axes = normalise_perm(axes, x.dim())
    inverse = [0] * len(axes)
    for k, a in enumerate(axes):
        inverse[a] = k
    return (g.permute(inverse),)


# --- getitem -------------------------------------------------------------------------------

def getitem_forward(x, *, index):
    items = normalise_index(index, tuple(x.shape))
    shape, strides, offset = index_region(items, x.stride())
    if any(s == 0 for s in shape):
        return launch.empty(shape, x.dtype, x.device)
    if all(st >= 0 for st in strides):  # expressible as a torch view
        return x.as_strided(shape, strides, x.storage_offset() + offset)
    # negative steps: torch has no negative strides, so copy the region densely
    out = launch.empty(shape, x.dtype, x.device)
    return copy.copy_into(out, x, src_strides=strides, src_offset=offset, shape=shape)


def getitem_backward(g, out, x, *, index):
    dx = copy.full(tuple(x.shape), 0.0, x.dtype, x.device)
    items = normalise_index(index, tuple(x.shape))
    shape, strides, offset = index_region(items, dx.stride())
    copy.copy_into(dx, g, dst_strides=strides, dst_offset=offset, shape=shape)
    return (dx,)


# --- concat --------------------------------------------------------------------------------

def _slab(t, axis, start, size):
    """The view of ``t`` at ``start:start + size`` along ``axis``."""
    return t.narrow(axis, start, size)


def concat_forward(*xs, axis):
    axis = check_concat(xs, axis)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    out = launch.empty(shape, xs[0].dtype, xs[0].device)
    start = 0
    for x in xs:
        size = x.shape[axis]
        copy.copy_into(_slab(out, axis, start, size), x)
        start += size
    return out


def concat_backward(g, out, *xs, axis):
    axis = check_concat(xs, axis)
    grads, start = [], 0
    for x in xs:
        size = x.shape[axis]
        grads.append(_slab(g, axis, start, size))
        start += size
    return tuple(grads)


# --- broadcast_to --------------------------------------------------------------------------

def broadcast_to_forward(x, *, shape):
    return x.expand(broadcast_check(tuple(x.shape), shape))


def broadcast_to_backward(g, out, x, *, shape):
    return (unbroadcast(g, tuple(x.shape)),)


# --- contiguous ----------------------------------------------------------------------------

def contiguous_forward(x):
    return copy.contiguous(x)


def contiguous_backward(g, out, x):
    return (g,)
