"""The activations a primitive applies in its own kernel (the registry's
``fusable_activations``: identity, relu, sigmoid, tanh), and their
derivatives written in the output y = act(z), which is all a fused
primitive's backward keeps."""
import numpy as np

from ._util import zeroed_where


def activate(z, activation, out=None):
    """act(z): identity z; relu max(z, 0); sigmoid 1 / (1 + exp(-z)); tanh
    (written into ``out`` when given, and returned)."""
    if activation == "relu":
        return np.maximum(z, 0, out=out)          # (NaN stays NaN, as torch.relu)
    if activation == "tanh":
        return np.tanh(z, out=out)
    if activation == "sigmoid":
        e = np.exp(-np.abs(z))          # <= 1: no overflow for large |z|
        z = np.where(z >= 0, 1 / (1 + e), e / (1 + e))
    if out is None:
        return z
    out[...] = z
    return out


def through_activation(grad, out, activation):
    """dL/dz = dL/dy * act'(z) for y = act(z), from the output ``out``, with
    act'(z) written in y: identity 1; relu [not y <= 0] (relu'(0) = 0 and 1
    at NaN, as torch's threshold_backward; a select, not a product, so an
    infinite dL/dy still gives 0 where y <= 0); sigmoid y (1 - y); tanh 1 - y^2."""
    if activation == "relu":
        return zeroed_where(grad, out <= 0)
    if activation == "sigmoid":
        return grad * (out * (1 - out))
    if activation == "tanh":
        return grad * (1 - out * out)
    return grad
