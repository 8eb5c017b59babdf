"""Activation functions (NNlib's names). Each takes a Tensor on any device
and is built from registered primitives, so it differentiates everywhere.

Layers take an activation as a function (``Dense(3, 2, relu)``) or by name
(``Dense(3, 2, activation="relu")``, as Keras users write): ``as_activation``
looks a name up in ``BY_NAME``, which holds every function here under its
NNlib name and the Keras/PyTorch spellings "linear", "leaky_relu" and "silu".
The math of each is in its primitive's reference, ``reference/elementwise.py``.
"""
from . import ops
from .arguments import is_int
from .errors import ArgumentError
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
    """tanh(x) = (exp(x) − exp(−x)) / (exp(x) + exp(−x))"""
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


def class_axis(x, dims, who="softmax"):
    """The class axis: ``dims`` if given (an int; negative counts from the
    end), else 1 for batched input ``(N, C, ...)`` and 0 for one unbatched
    vector."""
    if dims is not None:
        if not is_int(dims):
            raise ArgumentError(f"`{who}`: dims must be an int, the class axis (1 for (N, C, ...) input), "
                                f"got {dims!r}")
        return dims
    return 1 if x.ndim >= 2 else 0


def softmax(x, dims=None):
    """exp(x) / Σ exp(x) along the class axis ``dims`` (by default 1 for
    (N, C, ...) input, 0 for one vector): ``softmax(logits)`` gives each
    sample's class probabilities. Math: reference/softmax.py ``softmax_forward``."""
    x = as_tensor(x)
    return ops.softmax(x, class_axis(x, dims, "softmax"))


def logsoftmax(x, dims=None):
    """x − log Σ exp(x) along the class axis ``dims`` (as ``softmax``), the
    stable log of ``softmax(x)``. Math: reference/softmax.py."""
    x = as_tensor(x)
    return ops.logsoftmax(x, class_axis(x, dims, "logsoftmax"))


def logsumexp(x, dims=None, keepdims=False):
    """log Σ exp(x) along the class axis ``dims`` (as ``softmax``), without
    overflow; ``keepdims`` keeps that axis as size 1. Math: reference/softmax.py."""
    x = as_tensor(x)
    return ops.logsumexp(x, class_axis(x, dims, "logsumexp"), keepdims)


ACTIVATIONS = (identity, relu, sigmoid, tanh, leakyrelu, elu, gelu, gelu_erf, swish, softplus, softmax,
               logsoftmax)

#: every activation by its name, and the Keras/PyTorch spellings of the same functions
BY_NAME = dict({f.__name__: f for f in ACTIVATIONS}, σ=sigmoid, linear=identity, leaky_relu=leakyrelu,
               silu=swish)


def as_activation(f, who, name="activation"):
    """The activation ``who`` (a layer) was given as ``name``: a function
    stays (any callable), a name is looked up in ``BY_NAME`` ("relu",
    "sigmoid", Keras's "linear", ...), and None is ``identity`` (Keras's "no
    activation"); anything else is an ArgumentError listing the names."""
    if f is None:
        return identity
    if isinstance(f, str):
        found = BY_NAME.get(f) or BY_NAME.get(f.lower())
        if found is not None:
            return found
    elif callable(f):
        return f
    raise ArgumentError(f"{who}: {name} must be a function (e.g. relu) or the name of one of triflux's "
                        f"activations ({', '.join(sorted(BY_NAME))}), got {f!r}")
