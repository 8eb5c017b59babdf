"""Dense, Chain and flatten."""
import math
import warnings

import numpy as np

from .. import ops
from .. import dtypes as _dt
from ..activations import identity
from ..errors import DeviceMismatchError, ShapeError
from ..tensor import Tensor, next_seed, transfer, as_device
from .base import Layer, layer_name

_WARNED_F64 = set()


def _device_expr(dev):
    """Code that names ``dev`` as a function moving data there."""
    if dev.is_cpu:
        return "cpu"
    return f"{type(dev).__name__}({dev.idx})" if dev.idx is not None else type(dev).__name__ + "()"


def check_input(layer, x, like, *, axis=-1, expected=None, what="features"):
    """Make ``x`` fit ``layer``: a Tensor on the parameters' device, of their
    dtype (float64 converted with one warning per layer type, as Flux does),
    with ``expected`` entries on ``axis``. Errors name the layer, what was
    expected and what was received."""
    if not isinstance(x, Tensor):
        x = ops.as_tensor(np.asarray(x))
    if x._device is not like._device and x._device != like._device:
        raise DeviceMismatchError(
            f"{layer_name(layer)}: its parameters are on {like._device!r} but the input is on {x._device!r}. "
            f"Put both on one device: `x = {_device_expr(like._device)}(x)` (the input to the model's device) "
            f"or `model = {_device_expr(x._device)}(model)` (the model to the input's device).")
    if x.dtype != like.dtype:
        if x.dtype == _dt.float64 and like.dtype == _dt.float32:
            key = type(layer).__name__
            if key not in _WARNED_F64:
                _WARNED_F64.add(key)
                warnings.warn(
                    f"{layer_name(layer)} has float32 parameters but received float64 input; converting the input to "
                    "float32 (slow, and may hide a mistake). Convert data once with `f32(x)`, or the model "
                    "with `f64(model)` if you want float64.", stacklevel=3)
        x = ops.cast(x, like.dtype)
    if expected is not None:
        if x.ndim == 0 or x.shape[axis] != expected:
            raise ShapeError(f"{layer_name(layer)} expects {expected} {what} on axis {axis % max(x.ndim, 1) if x.ndim else axis} "
                             f"of its input, but got an input of shape {x.shape}")
    return x


def glorot_uniform(*shape, gain=1.0, fan_in=None, fan_out=None, dtype=_dt.float32):
    """Uniform on ±gain·√(6 / (fan_in + fan_out)) (Flux's default), drawn on
    the CPU from triflux's seeded stream so every device starts equal."""
    fan_out = shape[0] if fan_out is None else fan_out
    fan_in = (shape[1] if len(shape) > 1 else 1) * int(np.prod(shape[2:])) if fan_in is None else fan_in
    scale = gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
    rng = np.random.default_rng(next_seed())
    return Tensor._from_numpy(((rng.random(shape) * 2 - 1) * scale).astype(dtype))


def glorot_normal(*shape, gain=1.0, dtype=_dt.float32):
    fan_out, fan_in = shape[0], (shape[1] if len(shape) > 1 else 1) * int(np.prod(shape[2:]))
    std = gain * math.sqrt(2.0 / max(fan_in + fan_out, 1))
    rng = np.random.default_rng(next_seed())
    return Tensor._from_numpy((rng.standard_normal(shape) * std).astype(dtype))


def _param(value, shape, name, layer_name):
    t = ops.as_tensor(value)
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
        from ..show import fname
        s = f"{self.in_features} => {self.out_features}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if self.bias is None:
            s += "; bias=false"
        return s


class Chain(Layer):
    """Layers (or any functions) applied in order: ``Chain(l1, l2)(x) ==
    l2(l1(x))``. ``Chain(enc=..., dec=...)`` names them; ``chain[i]``
    indexes, slices give a sub-Chain."""

    def __init__(self, *layers, **named):
        if layers and named:
            raise TypeError("Chain takes layers either by position or by name, not both")
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        self.layers = dict(named) if named else list(layers)

    def _sequence(self):
        return list(self.layers.values()) if isinstance(self.layers, dict) else self.layers

    def __call__(self, x):
        for layer in self._sequence():
            x = layer(x)
        return x

    def __getitem__(self, i):
        if isinstance(self.layers, dict) and isinstance(i, str):
            return self.layers[i]
        seq = self._sequence()
        if isinstance(i, slice):
            return Chain(*seq[i])
        return seq[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self._sequence())


def flatten(x):
    """Keep the batch axis (the first), flatten the rest: ``(N, ...) -> (N, -1)``
    (Flux's ``flatten``, which keeps the last axis of ``(..., N)``)."""
    x = ops.as_tensor(x)
    if x.ndim == 0:
        raise ShapeError("flatten needs a batch axis; got a 0-d tensor")
    return ops.reshape(x, (x.shape[0], -1 if x.shape[0] else int(np.prod(x.shape[1:]))))


def Flatten():
    """``flatten`` as a layer object (for symmetry with torch.nn.Flatten)."""
    return flatten
