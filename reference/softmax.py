"""Softmax family, NumPy reference (forward and backward).

All three work along one ``axis`` of an array of any rank and are
numerically stable: the row maximum ``m`` is subtracted before ``exp``, so
logits of +-1e4 give exact results. ``-inf`` entries are allowed (masking):
they get probability 0. A row that is entirely ``-inf`` has no distribution;
as in torch, ``softmax``/``logsoftmax`` give NaN there and ``logsumexp``
gives ``-inf``. float16/bfloat16 compute in float32 and round once (the
row sums included), as the kernels do. A row holding ``+inf`` gives NaN from ``softmax``/``logsoftmax``
(``inf - inf``) and ``+inf`` from ``logsumexp``; a row holding NaN gives NaN.
"""
import numpy as np

from ..specs.softmax import softmax_spec
from ._util import in_compute_dtype


def _row_max(x, axis, infinite_to_zero=False):
    """max(x) along ``axis`` (keepdims), with -inf rows shifted by 0 instead of
    -inf so that the all -inf row yields exp(-inf) = 0, not NaN; with
    ``infinite_to_zero`` +inf rows too (logsumexp: log(sum exp(x)) = inf, as torch)."""
    m = np.max(x, axis=axis, keepdims=True)
    shift_by_zero = np.isinf(m) if infinite_to_zero else np.isneginf(m)
    return np.where(shift_by_zero, np.zeros_like(m), m)


def softmax_forward(x, axis):
    """y_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j  (along ``axis``)."""
    axis = softmax_spec("softmax", x.shape, x.dtype, axis).axis
    if x.shape[axis] == 0:
        return x.copy()
    xc, = in_compute_dtype(x)
    e = np.exp(xc - _row_max(xc, axis))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def softmax_backward(grad, out, x, axis):
    """With y = softmax(x) and g = dL/dy:   dx = y * (g - sum_j g_j y_j)."""
    axis = softmax_spec("softmax", x.shape, x.dtype, axis).axis
    y, g = in_compute_dtype(out, grad)
    return ((y * (g - (g * y).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False),)


def logsoftmax_forward(x, axis):
    """y_i = x_i - m - log(sum_j exp(x_j - m)),   m = max_j x_j."""
    axis = softmax_spec("logsoftmax", x.shape, x.dtype, axis).axis
    if x.shape[axis] == 0:
        return x.copy()
    xc, = in_compute_dtype(x)
    shifted = xc - _row_max(xc, axis)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)


def logsoftmax_backward(grad, out, x, axis):
    """With y = logsoftmax(x) and g = dL/dy:   dx = g - exp(y) * sum_j g_j."""
    axis = softmax_spec("logsoftmax", x.shape, x.dtype, axis).axis
    y, g = in_compute_dtype(out, grad)
    return ((g - np.exp(y) * g.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False),)


def logsumexp_forward(x, axis, keepdims=False):
    """y = m + log(sum_j exp(x_j - m)),   m = max_j x_j  (an empty row gives -inf)."""
    spec = softmax_spec("logsumexp", x.shape, x.dtype, axis, keepdims)
    axis = spec.axis
    if spec.row_length == 0:
        return np.full(spec.out_shape, -np.inf, dtype=x.dtype)
    xc, = in_compute_dtype(x)
    m = _row_max(xc, axis, infinite_to_zero=True)
    y = (m + np.log(np.exp(xc - m).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)
    return y.reshape(spec.out_shape)


def logsumexp_backward(grad, out, x, axis, keepdims=False):
    """With y = logsumexp(x) and g = dL/dy:   dx_i = g * exp(x_i - y)
    (g and y broadcast along ``axis``): the softmax of x, scaled by g."""
    axis = softmax_spec("logsumexp", x.shape, x.dtype, axis, keepdims).axis
    xc, g, y = in_compute_dtype(x, grad, out)
    if not keepdims:
        g, y = np.expand_dims(g, axis), np.expand_dims(y, axis)
    return ((g * np.exp(xc - y)).astype(x.dtype, copy=False),)
