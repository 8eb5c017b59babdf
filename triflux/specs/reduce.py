"""The reduction spec: ``sum``, ``mean`` and ``max`` of ``x`` over a set of axes.

The reduced axes are the *columns*, the kept axes the *rows* of a logical
(M, N) matrix: M = the size of the kept axes, N = the number of entries each
result sums (its count). The result has the kept axes, and the reduced ones
as size 1 with ``keepdims``.

Dtypes are NumPy's: floats give their own dtype (float16/bfloat16 accumulate
in float32); the sum of integers or booleans is int64, their mean float64;
``max`` keeps the dtype and needs a non-empty set of entries.
"""
import functools
import math
from dataclasses import dataclass

from ..arguments import normalize_axes
from ..dtypes import as_dtype, compute_dtype, float64, int64, is_floating
from ..errors import ShapeError


@dataclass(frozen=True)
class ReductionSpec:
    """The geometry and dtypes of a reduction (see the module docstring)."""
    x_shape: tuple
    axes: tuple              #: the reduced axes, sorted, non-negative
    keepdims: bool
    dtype: object            #: x's NumPy dtype
    out_dtype: object        #: the result's dtype
    compute_dtype: object    #: the dtype sums accumulate in (max: the values' own)

    # the derived sizes below are cached: kernels read them on every launch

    @functools.cached_property
    def kept_axes(self):
        return tuple(d for d in range(len(self.x_shape)) if d not in self.axes)

    @functools.cached_property
    def rows(self):
        """M: the number of results."""
        return math.prod(self.x_shape[d] for d in self.kept_axes)

    @functools.cached_property
    def count(self):
        """N: the entries each result reduces."""
        return math.prod(self.x_shape[d] for d in self.axes)

    @functools.cached_property
    def keepdims_shape(self):
        """x's shape with the reduced axes as 1s."""
        return tuple(1 if d in self.axes else s for d, s in enumerate(self.x_shape))

    @functools.cached_property
    def out_shape(self):
        return self.keepdims_shape if self.keepdims else tuple(self.x_shape[d] for d in self.kept_axes)


def reduce_spec(primitive, x_shape, dtype, axis=None, keepdims=False):
    """The spec of ``primitive`` ("sum", "mean" or "max") of ``x`` over
    ``axis`` (None for every axis, an int or several; negative counts from the
    end); raises ShapeError for an axis out of range and for the maximum of
    nothing."""
    if isinstance(axis, list):
        axis = tuple(axis)       # hashable, for the cache (other kinds are checked by normalize_axes)
    return _reduction_spec(primitive, tuple(x_shape), dtype, axis, bool(keepdims))


@functools.lru_cache(maxsize=1024)
def _reduction_spec(primitive, x_shape, dtype, axis, keepdims):
    x_shape = tuple(int(s) for s in x_shape)
    axes = normalize_axes(axis, len(x_shape), primitive)
    dtype = as_dtype(dtype)
    if is_floating(dtype):
        out_dtype, acc = dtype, compute_dtype(dtype)
    elif primitive == "max":
        out_dtype, acc = dtype, dtype
    else:                    # integers and booleans, as NumPy on Linux
        out_dtype = acc = int64 if primitive == "sum" else float64
    spec = ReductionSpec(x_shape=x_shape, axes=axes, keepdims=keepdims, dtype=dtype, out_dtype=out_dtype,
                         compute_dtype=acc)
    if primitive == "max" and spec.count == 0:
        raise ShapeError(f"`max` over an empty axis (shape {x_shape}, axis {axes}): "
                         "the maximum of nothing is undefined")
    return spec
