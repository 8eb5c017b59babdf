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

from ..specs.matmul import matmul_spec
from ._util import in_compute_dtype, unbroadcast


def matmul_forward(a, b):
    """C = A @ B.

    For matrices, ``C[i, j] = sum_k A[i, k] * B[k, j]``; vectors are promoted
    to a row (left operand) or a column (right operand) and batch axes
    broadcast, as in ``numpy.matmul`` (``triflux.specs.matmul``). The result
    has the inputs' dtype; float16/bfloat16 products are summed in float32
    and rounded once.
    """
    matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
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
    spec = matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
    a2 = a.reshape(spec.a_matrix)                    # (..., M, K)
    b2 = b.reshape(spec.b_matrix)                    # (..., K, N)
    g2 = np.asarray(grad).reshape(spec.out_matrix)   # the promoted axes put back
    ac, bc, gc = in_compute_dtype(a2, b2, g2)
    da = db = None
    if needs[0]:
        da = _adjoint(gc, _mT(bc), a2).reshape(a.shape)
    if needs[1]:
        db = _adjoint(_mT(ac), gc, b2).reshape(b.shape)
    return da, db
