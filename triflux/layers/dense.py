"""Dense: the fully connected layer."""
import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..activations import identity
from ..devices import as_device
from ..errors import ShapeError
from ..show import fname
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer
from .initialisers import glorot_normal, glorot_uniform
from .inputs import check_input

__all__ = ["Dense"]


def _param(value, shape, name, layer_name):
    t = as_tensor(value)
    if t.shape != tuple(shape):
        raise ShapeError(f"{layer_name}: {name} must have shape {tuple(shape)}, got {t.shape}")
    return t


class Dense(Layer):
    """``y = activation(x @ weight.T + bias)`` on the last axis of ``x``.

    ``weight`` has PyTorch's layout ``(out_features, in_features)``; inputs
    are ``(..., in_features)``, batch first (Flux's ``(in, N)`` in the same
    memory order). ``Dense(10, 5, relu)`` is Flux's ``Dense(10 => 5, relu)``.
    """

    def __init__(self, in_features, out_features=None, activation=identity, *, bias=True,
                 init=glorot_uniform, dtype=_dt.float32, device=None):
        if out_features is None and isinstance(in_features, tuple):
            in_features, out_features = in_features
        in_features, out_features = int(in_features), int(out_features)
        if in_features < 0 or out_features < 0:
            raise ShapeError(f"Dense sizes must be non-negative, got {in_features} => {out_features}")
        dtype = _dt.as_dtype(dtype)
        w = init(out_features, in_features, dtype=dtype) if init in (glorot_uniform, glorot_normal) \
            else _param(init(out_features, in_features), (out_features, in_features), "weight", "Dense")
        self.weight = ops.cast(w, dtype)
        if bias is True:
            self.bias = Tensor._from_numpy(np.zeros(out_features, dtype=dtype))
        elif bias is False or bias is None:
            self.bias = None
        else:
            self.bias = _param(bias, (out_features,), "bias", "Dense")
        self.activation = activation
        if device is not None:
            dev = as_device(device)
            self.weight = transfer(self.weight, dev)
            if self.bias is not None:
                self.bias = transfer(self.bias, dev)

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def __call__(self, x):
        x = check_input(self, x, self.weight, expected=self.in_features)
        y = ops.matmul(x, self.weight.T)
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def _signature(self):
        s = f"{self.in_features} => {self.out_features}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if self.bias is None:
            s += "; bias=false"
        return s
