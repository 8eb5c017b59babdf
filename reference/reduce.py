"""Reductions, NumPy reference: ``sum``, ``mean``, ``max`` over a tuple of
axes (``axis``: sorted non-negative ints; ``()`` reduces nothing), with
``keepdims``; the geometry and dtypes are ``triflux.specs.reduce``'s.

Semantics are NumPy's: the sum over an empty axis is 0, the mean NaN; sums of
integers and booleans are int64 and their means float64. float16/bfloat16
accumulate in float32 and float32 in float32 (NumPy's pairwise summation);
the result is rounded once to the input dtype. ``max`` needs a non-empty
axis and propagates NaN; its gradient is shared equally among tied maxima
(``torch.amax``).
"""
import numpy as np

from triflux.dtypes import is_floating
from triflux.specs.reduce import reduce_spec


def sum_forward(x, axis=None, keepdims=False):
    """y = sum over ``axis`` of x"""
    x = np.asarray(x)
    spec = reduce_spec("sum", x.shape, x.dtype, axis, keepdims)
    y = np.sum(x, axis=spec.axes, keepdims=keepdims, dtype=spec.compute_dtype)
    return np.asarray(y).astype(spec.out_dtype, copy=False)


def sum_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g broadcast back over the reduced axes"""
    x = np.asarray(x)
    if not is_floating(x.dtype):
        return (None,)
    spec = reduce_spec("sum", x.shape, x.dtype, axis, keepdims)
    g = np.asarray(grad).reshape(spec.keepdims_shape)
    return (np.broadcast_to(g, x.shape).astype(x.dtype),)


def mean_forward(x, axis=None, keepdims=False):
    """y = (sum over ``axis`` of x) / N, N the number of reduced entries
    (0 / 0 = NaN for an empty axis)"""
    x = np.asarray(x)
    spec = reduce_spec("mean", x.shape, x.dtype, axis, keepdims)
    acc = spec.compute_dtype
    with np.errstate(invalid="ignore"):
        y = np.sum(x, axis=spec.axes, keepdims=keepdims, dtype=acc) / acc.type(spec.count)
    return np.asarray(y).astype(spec.out_dtype, copy=False)


def mean_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g / N broadcast back over the reduced axes"""
    x = np.asarray(x)
    if not is_floating(x.dtype):
        return (None,)
    spec = reduce_spec("mean", x.shape, x.dtype, axis, keepdims)
    g = np.asarray(grad).reshape(spec.keepdims_shape).astype(spec.compute_dtype)
    return (np.broadcast_to(g / spec.count, x.shape).astype(x.dtype),)


def max_forward(x, axis=None, keepdims=False):
    """y = max over ``axis`` of x (NaN if any entry is NaN)"""
    x = np.asarray(x)
    spec = reduce_spec("max", x.shape, x.dtype, axis, keepdims)
    return np.asarray(np.max(x, axis=spec.axes, keepdims=keepdims))


def max_backward(grad, out, x, axis=None, keepdims=False):
    """dx = g [x == y] / k, k the number of entries equal to the maximum:
    tied maxima share the gradient equally. Computed as (g / k) [x == y], as
    torch.amax does: where the maximum is NaN (k = 0), every entry gets NaN.
    Over no axes the max is the identity: dx = g (NaN entries included)."""
    x = np.asarray(x)
    if not is_floating(x.dtype):
        return (None,)
    spec = reduce_spec("max", x.shape, x.dtype, axis, keepdims)
    if not spec.axes:
        return (np.asarray(grad).astype(x.dtype).reshape(x.shape),)
    y = np.asarray(out).reshape(spec.keepdims_shape)
    g = np.asarray(grad).reshape(spec.keepdims_shape).astype(spec.compute_dtype)
    is_max = x == y
    k = np.sum(is_max, axis=spec.axes, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = np.asarray((g / k) * is_max)         # (0-d operands give a NumPy scalar)
    return (dx.astype(x.dtype),)
