"""Stateless layers (Flux's ``stateless.jl``): functions used as layers,
holding no parameters: ``flatten``."""
import numpy as np

from .. import ops
from ..errors import ShapeError
from ..tensor import as_tensor

__all__ = ["flatten", "Flatten"]


def flatten(x):
    """Keep the batch axis (the first), flatten the rest: ``(N, ...) -> (N, -1)``
    (Flux's ``flatten``, which keeps the last axis of ``(..., N)``)."""
    x = as_tensor(x)
    if x.ndim == 0:
        raise ShapeError("flatten needs a batch axis; got a 0-d tensor")
    return ops.reshape(x, (x.shape[0], -1 if x.shape[0] else int(np.prod(x.shape[1:]))))


def Flatten():
    """``flatten`` as a layer object (for symmetry with torch.nn.Flatten)."""
    return flatten
