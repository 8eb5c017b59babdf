"""Matrix products, NumPy reference (forward and backward).

``matmul`` follows NumPy's ``@``:

* 1-D @ 1-D: the inner product, a 0-d array;
* 2-D @ 1-D, 1-D @ 2-D: matrix-vector and vector-matrix products (the vector
  is promoted to a one-row / one-column matrix and that axis dropped again);
* N-D: a stack of matrices in the last two axes, the leading (batch) axes
  broadcast against each other: ``(2, 1, 5, 3) @ (4, 3, 7) -> (2, 4, 5, 7)``.

``dense_bias_act`` is a Dense layer's forward as one primitive, act(x @ w^T
+ b), its backward one pass through the activation and three sums over the
rows of x (``triflux.specs.matmul``): where matmul, the bias add and the
activation would each keep their own output and pass over it again. Its
products are ``np.dot``'s: NumPy's ``@`` multiplies a product with one term
per entry (K = 1, such as dx of a ``Dense(h => 1)`` head) in a plain loop,
6x slower than BLAS (np.dot is BLAS's equal on the others).
"""
import math

import numpy as np

from ..specs.matmul import dense_bias_act_spec, matmul_spec
from ._activation import activate, through_activation
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


# --- Dense: the product, the bias and the activation fused (one primitive) -------------------

def dense_bias_act_forward(x, w, b, activation="identity"):
    """y = act(x @ w^T + b) on the last axis of x (a Dense layer's forward):

        y[..., o] = act(z[..., o]),   z[..., o] = sum_k x[..., k] w[o, k] + b[o]

    for ``x`` (..., K), ``w`` (O, K), ``b`` (O,), with act one of the declared
    fusable activations, identity, relu (max(z, 0)), sigmoid (1 / (1 +
    exp(-z))) and tanh: those whose derivative is a function of y alone, so
    the backward needs only the output. The leading axes of x are one axis
    of rows for the product; the bias and the activation are applied in
    place on its result. Computed in float32 for half-precision inputs and
    rounded once; output (..., O) in x's dtype."""
    spec = dense_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                               activation)
    xc, wc, bc = in_compute_dtype(x, w, b)
    z = np.dot(xc.reshape(spec.rows, spec.in_features), wc.T)
    z += bc
    return activate(z, activation, out=z).reshape(spec.out_shape).astype(x.dtype, copy=False)


def dense_bias_act_backward(grad, out, x, w, b, activation="identity", needs=(True, True, True)):
    """Adjoint of y = act(x @ w^T + b) with G = dL/dy, from the output y
    (``needs``: which of (dx, dw, db) to compute; the others are None); the
    sums over ``...`` run over every leading axis of x:

        gz[..., o] = G[..., o] act'(y[..., o])
                     (identity: 1; relu: [not y <= 0]; sigmoid: y (1 - y); tanh: 1 - y^2)
        dx[..., k] = sum_o gz[..., o] w[o, k]            (gz @ w)
        dw[o, k]   = sum_... gz[..., o] x[..., k]        (gz^T @ x: one product over all rows)
        db[o]      = sum_... gz[..., o]

    Products and sums run in float32 for float16/bfloat16 and are rounded once."""
    spec = dense_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                               activation)
    xc, wc, g, y = in_compute_dtype(x, w, grad, out)
    rows, K, O = spec.rows, spec.in_features, spec.out_features
    gz = through_activation(np.reshape(g, (rows, O)), np.reshape(y, (rows, O)), activation)
    dx = np.dot(gz, wc).reshape(np.shape(x)).astype(x.dtype, copy=False) if needs[0] else None
    dw = np.dot(gz.T, xc.reshape(rows, K)).astype(w.dtype, copy=False) if needs[1] else None
    db = gz.sum(axis=0).astype(np.asarray(b).dtype, copy=False) if needs[2] else None
    return dx, dw, db
