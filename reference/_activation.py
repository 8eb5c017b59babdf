"""The activations a primitive applies in its own kernel (the registry's
``fusable_activations``: identity, relu, sigmoid, tanh), and their
derivatives written in the output y = act(z), which is all a fused
primitive's backward keeps."""
import numpy as np


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


def activation_derivative(y, activation):
    """act'(z) written in y = act(z): identity 1; relu [not y <= 0] (relu'(0) = 0
    and 1 at NaN, as torch's threshold_backward); sigmoid y (1 - y); tanh 1 - y^2."""
    if activation == "relu":
        return (~(y <= 0)).astype(y.dtype)
    if activation == "sigmoid":
        return y * (1 - y)
    if activation == "tanh":
        return 1 - y * y
    return np.ones_like(y)


def through_activation(grad, out, activation):
    """dL/dz = dL/dy * act'(z) for y = act(z), from the output ``out``."""
    if activation == "identity":
        return grad
    return grad * activation_derivative(out, activation)
