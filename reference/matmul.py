"""Matrix products, NumPy reference (forward and backward).

``matmul`` follows NumPy's ``@``:

* 1-D @ 1-D: the inner product, a 0-d array;
* 2-D @ 1-D, 1-D @ 2-D: matrix-vector and vector-matrix products (the vector
  is promoted to a one-row / one-column matrix and that axis dropped again);
* N-D: a stack of matrices in the last two axes, the leading (batch) axes
  broadcast against each other: ``(2, 1, 5, 3) @ (4, 3, 7) -> (2, 4, 5, 7)``.
"""
import math

import numpy as np

from ..errors import DTypeError, ShapeError
from ._util import in_compute_dtype, unbroadcast


def _check(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul needs arrays of at least one dimension, got shapes "
                         f"{a.shape} and {b.shape}; use `*` to scale by a scalar")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul of {a.dtype} and {b.dtype}: convert one of them "
                         "first (e.g. `f32(x)`) so both have the same dtype")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k_a != k_b:
        raise ShapeError(f"matmul of shapes {a.shape} and {b.shape}: the inner sizes "
                         f"differ ({k_a} != {k_b})")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul of shapes {a.shape} and {b.shape}: the batch axes "
                         f"{a.shape[:-2]} and {b.shape[:-2]} do not broadcast") from None


def matmul_forward(a, b):
    """C = A @ B.

    For matrices, ``C[i, j] = sum_k A[i, k] * B[k, j]``; vectors are promoted
    to a row (left operand) or a column (right operand) and batch axes
    broadcast, as in ``numpy.matmul``. The result has the inputs' dtype;
    float16/bfloat16 products are summed in float32 and rounded once.
    """
    _check(a, b)
    ac, bc = in_compute_dtype(a, b)
    return np.asarray(np.matmul(ac, bc)).astype(a.dtype, copy=False)


def _mT(x):
    """x^T: the last two axes swapped (batch axes stay where they are)."""
    return np.swapaxes(x, -1, -2)


def _stacked_product(p, q):
    """``sum_b p[b] @ q[b]`` over the common batch axes of the stacks ``p``
    (..., M, K) and ``q`` (..., K, N), as ONE matrix product of the matrices
    laid side by side and stacked on top of each other:

        [p[1] p[2] ...] @ [q[1]; q[2]; ...]        (M, B*K) @ (B*K, N)

    One long sum per entry instead of B short products summed afterwards."""
    M, K, N = p.shape[-2], p.shape[-1], q.shape[-1]
    batch = math.prod(p.shape[:-2])
    side_by_side = np.moveaxis(p, -2, 0).reshape(M, batch * K)
    on_top = q.reshape(batch * K, N)
    return side_by_side @ on_top


def _adjoint(p, q, x):
    """dX = p @ q summed over the batch axes that ``x`` (an operand of the
    forward product) was broadcast along, in ``x``'s dtype.

    A matrix ``x`` (a 2-D weight against a stack) gets its gradient as one
    product over the whole stack (:func:`_stacked_product`); a transposed
    matrix (such as Dense's ``weight.T``) as ``(sum_b q[b]^T @ p[b]^T)^T``,
    so the gradient has its parameter's memory layout and the optimiser's
    elementwise updates run on dense memory. A stack is a batched product,
    then the sum over its broadcast axes (``unbroadcast``)."""
    if x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
        dx = _stacked_product(_mT(q), _mT(p)).T
    elif x.ndim == 2:
        dx = _stacked_product(p, q)
    else:
        dx = unbroadcast(np.matmul(p, q), x.shape)
    return dx.astype(x.dtype, copy=False)


def matmul_backward(grad, out, a, b, needs=(True, True)):
    """Adjoint of C = A @ B, with G = dL/dC:

        dA = G @ B^T,    dB = A^T @ G

    (``^T`` swaps the last two axes). A vector operand is first promoted to a
    matrix (``a`` to ``(1, K)``, ``b`` to ``(K, 1)``) and G gets the matching
    size-1 axes; batch axes that broadcasting added or stretched are summed
    away, so each gradient has its input's shape: for a matrix B against a
    stack A, ``dB = sum_b A[b]^T @ G[b]``. Products and sums run in float32
    for float16/bfloat16 and are rounded once.
    ``needs`` says which of (dA, dB) to compute; the other is ``None``.
    """
    a2 = a[None, :] if a.ndim == 1 else a            # (..., M, K)
    b2 = b[:, None] if b.ndim == 1 else b            # (..., K, N)
    g2 = np.asarray(grad)
    if a.ndim == 1:                                  # put back the M axis
        g2 = np.expand_dims(g2, g2.ndim - (0 if b.ndim == 1 else 1))
    if b.ndim == 1:                                  # put back the N axis
        g2 = g2[..., None]
    ac, bc, gc = in_compute_dtype(a2, b2, g2)
    da = db = None
    if needs[0]:
        da = _adjoint(gc, _mT(bc), a2).reshape(a.shape)
    if needs[1]:
        db = _adjoint(_mT(ac), gc, b2).reshape(b.shape)
    return da, db
