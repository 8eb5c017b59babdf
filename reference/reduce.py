"""Reductions, NumPy reference: ``sum``, ``mean``, ``max`` over a tuple of
axes (``axis``: sorted non-negative ints; ``()`` reduces nothing), with
``keepdims``.

Semantics are NumPy's: the sum over an empty axis is 0, the mean NaN; sums of
integers and booleans are int64 and their means float64. float16/bfloat16
accumulate in float32 and float32 in float32 (NumPy's pairwise summation);
the result is rounded once to the input dtype. ``max`` needs a non-empty
axis and propagates NaN; its gradient is shared equally among tied maxima
(``torch.amax``).
"""
import numpy as np

from triflux.dtypes import is_floating
from triflux.errors import ShapeError

from ._util import compute_dtype


def _is_float(a):
    return a.dtype.kind == "f" or a.dtype.kind == "V" and a.dtype.name == "bfloat16"


def _axis(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted({a % ndim if ndim else a for a in axis}))


def _acc(dtype):
    """The dtype sums accumulate in."""
    if is_floating(dtype):
        return compute_dtype(dtype)  # float32 for float16/bfloat16
    return np.dtype(np.int64)  # integers and booleans, as NumPy on Linux


def _count(shape, axis):
    n = 1
    for a in axis:
        n *= shape[a]
    return n


def _keep(t, axis, ndim):
    """A reduction result with the reduced axes back as size-1 axes."""
    t = np.asarray(t)
    return t if t.ndim == ndim else np.expand_dims(t, axis)


def sum_forward(x, axis=None, keepdims=False):
    """y = sum over ``axis`` of x"""
    x = np.asarray(x)
    axis = _axis(axis, x.ndim)
    acc = _acc(x.dtype)
    y = np.sum(x, axis=axis, keepdims=keepdims, dtype=acc)
    return np.asarray(y).astype(x.dtype if _is_float(x) else acc, copy=False)


def sum_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g broadcast back over the reduced axes"""
    x = np.asarray(x)
    if not _is_float(x):
        return (None,)
    axis = _axis(axis, x.ndim)
    g = _keep(grad, axis, x.ndim)
    return (np.broadcast_to(g, x.shape).astype(x.dtype),)


def mean_forward(x, axis=None, keepdims=False):
    """y = (sum over ``axis`` of x) / N, N the number of reduced entries
    (0 / 0 = NaN for an empty axis)"""
    x = np.asarray(x)
    axis = _axis(axis, x.ndim)
    acc = _acc(x.dtype) if _is_float(x) else np.dtype(np.float64)
    n = _count(x.shape, axis)
    with np.errstate(invalid="ignore"):
        y = np.sum(x, axis=axis, keepdims=keepdims, dtype=acc) / acc.type(n)
    return np.asarray(y).astype(x.dtype if _is_float(x) else acc, copy=False)


def mean_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g / N broadcast back over the reduced axes"""
    x = np.asarray(x)
    if not _is_float(x):
        return (None,)
    axis = _axis(axis, x.ndim)
    n = _count(x.shape, axis)
    g = _keep(grad, axis, x.ndim).astype(_acc(x.dtype))
    return (np.broadcast_to(g / n, x.shape).astype(x.dtype),)


def max_forward(x, axis=None, keepdims=False):
    """y = max over ``axis`` of x (NaN if any entry is NaN)"""
    x = np.asarray(x)
    axis = _axis(axis, x.ndim)
    if _count(x.shape, axis) == 0:
        raise ShapeError(f"max over an empty axis (shape {x.shape}, axis {axis}) has no value")
    return np.asarray(np.max(x, axis=axis, keepdims=keepdims))


def max_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g [x == y] / k, k the number of entries equal to the maximum:
    tied maxima share the gradient equally. Computed as (g / k) [x == y], as
    torch.amax does: where the maximum is NaN (k = 0), every entry gets NaN.
    Over no axes the max is the identity: dx = g (NaN entries included)."""
    x = np.asarray(x)
    if not _is_float(x):
        return (None,)
    axis = _axis(axis, x.ndim)
    if not axis:
        return (np.asarray(grad).astype(x.dtype).reshape(x.shape),)
    acc = _acc(x.dtype)
    y = _keep(out, axis, x.ndim)
    g = _keep(grad, axis, x.ndim).astype(acc)
    is_max = x == y
    k = np.sum(is_max, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = np.asarray((g / k) * is_max)         # (0-d operands give a NumPy scalar)
    return (dx.astype(x.dtype),)
