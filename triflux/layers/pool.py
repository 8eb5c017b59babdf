"""Pooling layers."""
from .. import ops
from ..errors import ShapeError
from .base import Layer, layer_name


class GlobalMeanPool(Layer):
    """The mean over every spatial axis: ``(N, C, H, W) -> (N, C, 1, 1)``
    (Flux's ``(W, H, C, N) -> (1, 1, C, N)``, the same memory order)."""

    def __call__(self, x):
        x = ops.as_tensor(x)
        if x.ndim < 3:
            raise ShapeError(f"GlobalMeanPool() expects (N, C, spatial...) input, got shape {x.shape}")
        return ops.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


class MaxPool(Layer):
    """The maximum over each ``window`` (stride = window by default)."""

    def __init__(self, window, *, stride=None, pad=0):
        self.window = ops.pair(window, "window")
        self.stride = ops.pair(stride, "stride") if stride is not None else self.window
        self.pad = ops.quad(pad)

    def __call__(self, x):
        x = ops.as_tensor(x)
        if x.ndim != 4:
            raise ShapeError(f"{layer_name(self)} expects a 4-d (N, C, H, W) input, got shape {x.shape}")
        return ops.maxpool2d(x, self.window, self.stride, self.pad)

    def _signature(self):
        s = f"{self.window}"
        if self.stride != self.window:
            s += f", stride={self.stride}"
        if any(self.pad):
            s += f", pad={self.pad}"
        return s


class MeanPool(MaxPool):
    """The mean over each ``window`` (padding counts as zeros)."""

    def __call__(self, x):
        x = ops.as_tensor(x)
        if x.ndim != 4:
            raise ShapeError(f"{layer_name(self)} expects a 4-d (N, C, H, W) input, got shape {x.shape}")
        return ops.meanpool2d(x, self.window, self.stride, self.pad)


class Upsample(Layer):
    """Upsampling by an integer ``scale``, ``mode="nearest"`` or
    ``"bilinear"`` (PyTorch's align_corners=False)."""

    def __init__(self, scale=2, mode="nearest"):
        if mode not in ("nearest", "bilinear"):
            raise ValueError(f"Upsample mode must be 'nearest' or 'bilinear', got {mode!r}")
        self.scale = ops.pair(scale, "scale")
        self.mode = mode

    def __call__(self, x):
        x = ops.as_tensor(x)
        if x.ndim != 4:
            raise ShapeError(f"{layer_name(self)} expects a 4-d (N, C, H, W) input, got shape {x.shape}")
        return ops.upsample(x, self.scale, self.mode)

    def _signature(self):
        return f":{self.mode}, scale={self.scale[0] if self.scale[0] == self.scale[1] else self.scale}"
