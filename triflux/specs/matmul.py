"""The matmul spec: NumPy's ``a @ b`` for two operand shapes.

Vectors are promoted to matrices, ``a`` (K,) to a row (1, K) and ``b`` (K,)
to a column (K, 1); the batch axes (all but the last two) broadcast; the
promoted axes are dropped from the result again:

    (K,) @ (K,) -> ()          (M, K) @ (K,) -> (M,)         (K,) @ (K, N) -> (N,)
    (2, 1, M, K) @ (4, K, N) -> (2, 4, M, N)

dense_bias_act is a Dense layer's forward as one primitive, y = act(x @ w^T
+ b) on the last axis of x: ``x`` (..., K) with any leading axes (none
included), ``w`` (O, K) in torch's Linear layout, ``b`` (O,), ``y`` (..., O);
its spec sees x as one (rows, K) matrix, rows the product of the leading
axes.
"""
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..arguments import flux_layout_hint
from ..dtypes import as_dtype, compute_dtype
from ..errors import DTypeError, ShapeError
from ..primitives import REGISTRY
from . import cached_on_arguments

#: the activations dense_bias_act applies in its epilogue: those whose
#: derivative is a function of the output y alone (declared with the primitive)
FUSABLE_ACTIVATIONS = REGISTRY["dense_bias_act"].fusable_activations


@dataclass(frozen=True)
class MatmulSpec:
    """The geometry of ``a @ b`` (see the module docstring)."""
    dtype: object            #: the operands' (common) NumPy dtype
    compute_dtype: object    #: the dtype products and sums run in
    a_matrix: tuple          #: ``a``'s shape promoted to (..., M, K)
    b_matrix: tuple          #: ``b``'s shape promoted to (..., K, N)
    batch: tuple             #: the broadcast batch shape
    m: int
    k: int
    n: int
    out_shape: tuple         #: the result's shape (promoted axes dropped)

    @property
    def out_matrix(self):
        """The result with the promoted axes kept: batch + (M, N)."""
        return self.batch + (self.m, self.n)

    @property
    def batch_size(self):
        """The number of matrix products (the batch shape's size)."""
        size = 1
        for s in self.batch:
            size *= s
        return size


def _broadcast_batch(a_batch, b_batch):
    """The broadcast of two batch shapes, or None where they do not broadcast."""
    nd = max(len(a_batch), len(b_batch))
    a_batch = (1,) * (nd - len(a_batch)) + tuple(a_batch)
    b_batch = (1,) * (nd - len(b_batch)) + tuple(b_batch)
    out = []
    for x, y in zip(a_batch, b_batch):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def matmul_spec(a_shape, b_shape, a_dtype, b_dtype):
    """The spec of ``a @ b`` for operands of these shapes and dtypes (NumPy or
    torch dtypes); raises ShapeError or DTypeError when they do not fit."""
    a_shape, b_shape = tuple(int(s) for s in a_shape), tuple(int(s) for s in b_shape)
    a_dtype, b_dtype = as_dtype(a_dtype), as_dtype(b_dtype)
    if not a_shape or not b_shape:
        raise ShapeError(f"`matmul` needs tensors of at least one dimension, got shapes "
                         f"{a_shape} and {b_shape}; use `*` to scale by a scalar")
    if a_dtype != b_dtype:
        raise DTypeError(f"`matmul` of {a_dtype} and {b_dtype}: convert one of them "
                         "first (e.g. `f32(x)`) so both have the same dtype")
    a_matrix = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b_matrix = b_shape + (1,) if len(b_shape) == 1 else b_shape
    (m, k), (k_b, n) = a_matrix[-2:], b_matrix[-2:]
    if k != k_b:
        raise ShapeError(f"`matmul` of shapes {a_shape} and {b_shape}: the inner sizes differ "
                         f"({k} columns of the first, {k_b} rows of the second)")
    batch = _broadcast_batch(a_shape[:-2], b_shape[:-2])
    if batch is None:
        raise ShapeError(f"`matmul` of shapes {a_shape} and {b_shape}: the batch axes "
                         f"{a_shape[:-2]} and {b_shape[:-2]} do not broadcast")
    out_shape = batch + ((m,) if len(a_shape) > 1 else ()) + ((n,) if len(b_shape) > 1 else ())
    return MatmulSpec(dtype=a_dtype, compute_dtype=compute_dtype(a_dtype), a_matrix=a_matrix,
                      b_matrix=b_matrix, batch=batch, m=m, k=k, n=n, out_shape=out_shape)


@dataclass(frozen=True)
class DenseSpec:
    """The geometry of y = act(x @ w^T + b) (see the module docstring)."""
    dtype: object            #: the inputs' (common) NumPy dtype
    compute_dtype: object    #: the dtype products and sums run in
    rows: int                #: the product of x's leading axes: x is a (rows, K) matrix
    in_features: int         #: K
    out_features: int        #: O
    out_shape: tuple         #: x's leading axes + (O,)
    activation: str


@cached_on_arguments
def dense_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, activation="identity"):
    """The :class:`DenseSpec` of act(x @ w^T + b) for inputs of these shapes
    and dtypes (NumPy or torch dtypes); raises ValueError for an activation
    that is not one of FUSABLE_ACTIVATIONS, ShapeError or DTypeError when the
    inputs do not fit."""
    return _dense_bias_act_spec(tuple(int(s) for s in x_shape), tuple(int(s) for s in w_shape),
                                tuple(int(s) for s in b_shape), as_dtype(x_dtype), as_dtype(w_dtype),
                                as_dtype(b_dtype), activation)


@functools.lru_cache(maxsize=1024)
def _dense_bias_act_spec(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, activation):
    if activation not in FUSABLE_ACTIVATIONS:
        raise ValueError(f"dense_bias_act: activation must be one of {FUSABLE_ACTIVATIONS} (those whose "
                         f"derivative follows from the output), got {activation!r}; apply other "
                         "activations after matmul(x, w.T) + b")
    if len(w_shape) != 2:
        raise ShapeError(f"dense_bias_act: w must be a matrix (out_features, in_features), got shape {w_shape}")
    out_features, in_features = w_shape
    if not x_shape or x_shape[-1] != in_features:
        raise ShapeError(f"dense_bias_act: w {w_shape} takes {in_features} features on x's last axis, but x has "
                         f"shape {x_shape}.{flux_layout_hint(x_shape, -1, in_features)}")
    if b_shape != (out_features,):
        raise ShapeError(f"dense_bias_act: the bias must have shape ({out_features},) (one entry per output "
                         f"feature, w's axis 0), got {b_shape}")
    if not x_dtype == w_dtype == b_dtype:
        raise DTypeError(f"dense_bias_act of x {x_dtype}, w {w_dtype} and b {b_dtype}: convert them to one "
                         "dtype first (e.g. `f32(x)`)")
    rows = 1
    for s in x_shape[:-1]:
        rows *= s
    return DenseSpec(dtype=x_dtype, compute_dtype=compute_dtype(x_dtype), rows=rows, in_features=in_features,
                     out_features=out_features, out_shape=x_shape[:-1] + (out_features,), activation=activation)


# --- floating-point operations (the registry's ``flops``, read by the kernel report) ------------

def _gradients_needed(direction, attrs):
    """How many of the two products' operands a backward computes (``needs``), else 1."""
    return sum(attrs.get("needs", (True, True))[:2]) if direction == "backward" else 1


def matmul_flops(name, direction, inputs, out_shape, attrs, largest):
    """2 M N K per batch element forward; as much for each operand's gradient backward."""
    a, b = inputs[0], inputs[1]
    m, n = (1 if len(a) == 1 else a[-2]), (1 if len(b) == 1 else b[-1])
    batch = math.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))
    return 2 * batch * m * n * a[-1] * _gradients_needed(direction, attrs)


def dense_bias_act_flops(name, direction, inputs, out_shape, attrs, largest):
    """x (..., K) times w (O, K)^T: 2 * rows * O * K, per gradient backward."""
    x, w = inputs[0], inputs[1]
    return 2 * math.prod(x[:-1]) * w[0] * w[1] * _gradients_needed(direction, attrs)
