"""Matrix products, NumPy reference (forward and backward).

``matmul`` follows NumPy's ``@``:

* 1-D @ 1-D: the inner product, a 0-d array;
* 2-D @ 1-D, 1-D @ 2-D: matrix-vector and vector-matrix products (the vector
  is promoted to a one-row / one-column matrix and that axis dropped again);
* N-D: a stack of matrices in the last two axes, the leading (batch) axes
  broadcast against each other: ``(2, 1, 5, 3) @ (4, 3, 7) -> (2, 4, 5, 7)``.
"""
import numpy as np

from ..errors import DTypeError, ShapeError
from ._util import unbroadcast


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
    broadcast, as in ``numpy.matmul``. The result has the inputs' dtype.
    """
    _check(a, b)
    return np.asarray(np.matmul(a, b)).astype(a.dtype, copy=False)


def _product_like(x, p, q):
    """``p @ q`` in ``x``'s dtype and, for a transposed matrix ``x`` (such as
    Dense's ``weight.T``), in its memory layout: ``(q^T @ p^T)^T``. The
    gradient then has its parameter's layout, and the optimiser's
    elementwise updates run on dense memory."""
    if x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
        return np.matmul(q.T, p.T).T.astype(x.dtype, copy=False)
    return np.matmul(p, q).astype(x.dtype, copy=False)


def matmul_backward(grad, out, a, b, needs=(True, True)):
    """Adjoint of C = A @ B, with G = dL/dC:

        dA = G @ B^T,    dB = A^T @ G

    (``^T`` swaps the last two axes). A vector operand is first promoted to a
    matrix (``a`` to ``(1, K)``, ``b`` to ``(K, 1)``) and G gets the matching
    size-1 axes; batch axes that broadcasting added or stretched are summed
    away (``unbroadcast``), so each gradient has its input's shape.
    ``needs`` says which of (dA, dB) to compute; the other is ``None``.
    """
    a2 = a[None, :] if a.ndim == 1 else a            # (..., M, K)
    b2 = b[:, None] if b.ndim == 1 else b            # (..., K, N)
    g2 = np.asarray(grad)
    if a.ndim == 1:                                  # put back the M axis
        g2 = np.expand_dims(g2, g2.ndim - (0 if b.ndim == 1 else 1))
    if b.ndim == 1:                                  # put back the N axis
        g2 = g2[..., None]
    da = db = None
    if needs[0]:
        da = unbroadcast(_product_like(a2, g2, np.swapaxes(b2, -1, -2)), a2.shape).reshape(a.shape)
    if needs[1]:
        db = unbroadcast(_product_like(b2, np.swapaxes(a2, -1, -2), g2), b2.shape).reshape(b.shape)
    return da, db
