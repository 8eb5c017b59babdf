"""Activation functions (NNlib's names). Each takes a Tensor on any device
and is built from registered primitives, so it differentiates everywhere."""
from . import ops
from .tensor import as_tensor


def identity(x):
    """``x`` unchanged."""
    return x


def relu(x):
    """max(x, 0)"""
    return ops.relu(x)


def sigmoid(x):
    """σ(x) = 1 / (1 + exp(-x))"""
    return ops.sigmoid(x)


σ = sigmoid


def tanh(x):
    return ops.tanh(x)


def leakyrelu(x, a=0.01):
    """x for x > 0, a·x otherwise"""
    return ops.leakyrelu(x, a)


def elu(x, alpha=1.0):
    """x for x > 0, α(exp(x) − 1) otherwise"""
    return ops.elu(x, alpha)


def gelu(x):
    """The tanh approximation, as NNlib's ``gelu``:
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))"""
    return ops.gelu(x)


def gelu_erf(x):
    """The exact GELU, as NNlib's ``gelu_erf`` (torch's ``GELU()``):
    x·Φ(x) = 0.5·x·(1 + erf(x/√2)), Φ the standard normal CDF"""
    return ops.gelu_erf(x)


def swish(x):
    """x·σ(x)"""
    return ops.swish(x)


def softplus(x):
    """log(1 + exp(x))"""
    return ops.softplus(x)


def class_axis(x, dims):
    """The class axis: ``dims`` if given, else 1 for batched input
    ``(N, C, ...)`` and 0 for one unbatched vector."""
    if dims is not None:
        return dims
    return 1 if x.ndim >= 2 else 0


def softmax(x, dims=None):
    """exp(x) / Σ exp(x) along the class axis (``dims``; 1 for (N, C, ...))."""
    x = as_tensor(x)
    return ops.softmax(x, class_axis(x, dims))


def logsoftmax(x, dims=None):
    """x − log Σ exp(x) along the class axis (``dims``; 1 for (N, C, ...))."""
    x = as_tensor(x)
    return ops.logsoftmax(x, class_axis(x, dims))


def logsumexp(x, dims=None, keepdims=False):
    x = as_tensor(x)
    return ops.logsumexp(x, class_axis(x, dims), keepdims)


ACTIVATIONS = (identity, relu, sigmoid, tanh, leakyrelu, elu, gelu, gelu_erf, swish, softplus, softmax,
               logsoftmax)
