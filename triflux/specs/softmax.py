"""The softmax spec: the rows of ``softmax``, ``logsoftmax`` and ``logsumexp``.

All three work along one ``axis`` of an array of at least one dimension: a
*row* is the 1-d slice along that axis, of length L; the other axes (the
*outer* shape) count R rows. ``logsumexp`` gives one value per row (the axis
kept as size 1 with ``keepdims``, dropped without).
"""
import functools
import math
from dataclasses import dataclass

from ..arguments import normalize_axis
from ..dtypes import as_dtype, compute_dtype
from ..errors import ShapeError


@dataclass(frozen=True)
class SoftmaxSpec:
    """The rows of a softmax-family primitive (see the module docstring)."""
    x_shape: tuple
    axis: int                #: the (non-negative) axis along the rows
    dtype: object            #: x's NumPy dtype
    compute_dtype: object    #: the dtype the row sums run in
    out_shape: tuple         #: x's shape, or logsumexp's reduced shape

    @property
    def outer_shape(self):
        """x's shape without the row axis."""
        return self.x_shape[:self.axis] + self.x_shape[self.axis + 1:]

    @property
    def rows(self):
        """R: the number of rows."""
        return math.prod(self.outer_shape)

    @property
    def row_length(self):
        """L: the entries per row."""
        return self.x_shape[self.axis]


def softmax_spec(primitive, x_shape, dtype, axis, keepdims=False):
    """The spec of ``primitive`` ("softmax", "logsoftmax" or "logsumexp") on
    ``x`` along ``axis`` (an int, or a tuple or list of one; negative counts
    from the end); raises ShapeError for an axis that is not one axis of ``x``."""
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise ShapeError(f"`{primitive}`: the softmax family works along one axis, got axis={axis}")
        axis = axis[0]
    return _softmax_spec(primitive, tuple(x_shape), dtype, axis, bool(keepdims))


@functools.lru_cache(maxsize=1024)
def _softmax_spec(primitive, x_shape, dtype, axis, keepdims):
    x_shape = tuple(int(s) for s in x_shape)
    if not x_shape:
        raise ShapeError(f"`{primitive}`: the softmax family needs a tensor of at least one dimension")
    axis = normalize_axis(axis, len(x_shape), primitive)
    out_shape = x_shape
    if primitive == "logsumexp":
        out_shape = x_shape[:axis] + ((1,) if keepdims else ()) + x_shape[axis + 1:]
    dtype = as_dtype(dtype)
    return SoftmaxSpec(x_shape=x_shape, axis=axis, dtype=dtype, compute_dtype=compute_dtype(dtype),
                       out_shape=out_shape)
