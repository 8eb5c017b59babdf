"""Pooling layers."""
from .. import ops
from ..errors import ShapeError
from .base import Layer


class GlobalMeanPool(Layer):
    """The mean over every spatial axis: ``(N, C, H, W) -> (N, C, 1, 1)``
    (Flux's ``(W, H, C, N) -> (1, 1, C, N)``, the same memory order)."""

    def __call__(self, x):
        x = ops.as_tensor(x)
        if x.ndim < 3:
            raise ShapeError(f"GlobalMeanPool() expects (N, C, spatial...) input, got shape {x.shape}")
        return ops.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)
