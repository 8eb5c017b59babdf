"""Initial values of parameters (Flux's ``glorot_uniform``, ``glorot_normal``),
drawn on the CPU from triflux's seeded stream so every device starts equal,
and ``owned_parameter``: a user's initial value as a layer's own copy."""
import math

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..arguments import is_real, not_real
from ..constructors import next_seed
from ..errors import ArgumentError, DTypeError, ShapeError
from ..tensor import Tensor, tensor, transfer


def glorot_uniform(*shape, gain=1.0, fan_in=None, fan_out=None, dtype=_dt.float32):
    """Uniform on ±gain·√(6 / (fan_in + fan_out)) (Flux's default), drawn on
    the CPU from triflux's seeded stream so every device starts equal."""
    fan_out = shape[0] if fan_out is None else fan_out
    fan_in = (shape[1] if len(shape) > 1 else 1) * int(np.prod(shape[2:])) if fan_in is None else fan_in
    scale = gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
    rng = np.random.default_rng(next_seed())
    return Tensor._from_numpy(((rng.random(shape) * 2 - 1) * scale).astype(dtype))


def glorot_normal(*shape, gain=1.0, dtype=_dt.float32):
    """Normal with standard deviation gain·√(2 / (fan_in + fan_out))."""
    fan_out, fan_in = shape[0], (shape[1] if len(shape) > 1 else 1) * int(np.prod(shape[2:]))
    std = gain * math.sqrt(2.0 / max(fan_in + fan_out, 1))
    rng = np.random.default_rng(next_seed())
    return Tensor._from_numpy((rng.standard_normal(shape) * std).astype(dtype))


def owned_parameter(value, shape, dtype, who, name):
    """A layer's parameter from a value the user gave (an array, nested
    lists, a Tensor, or what their ``init`` function returned): a copy, so
    training never writes into the user's array, of ``shape`` and the
    layer's floating ``dtype``; real numbers only."""
    if isinstance(value, Tensor):
        t = transfer(Tensor._from_numpy(value.numpy()), value._device)   # a copy on the same device
    else:
        try:
            t = tensor(value)                                                # a copy
        except DTypeError:
            raise ArgumentError(f"{who}: the {name} must be an array of numbers, got {type(value).__name__} "
                                f"{value!r:.60}") from None
    if not is_real(t.dtype):
        raise not_real(t.dtype, who, f"a {name}")
    if t.shape != tuple(shape):
        raise ShapeError(f"{who}: {name} must have shape {tuple(shape)}, got {t.shape}")
    return ops.cast(t, dtype)


def initial_weight(init, shape, dtype, who, **fans):
    """The weight ``init`` draws for ``shape``: Glorot's functions get
    ``fans`` (the layer's fan_in/fan_out, when not the shape's) and the
    dtype; any other callable is called as ``init(*shape)`` and its result
    copied (:func:`owned_parameter`)."""
    if init is glorot_uniform:
        return init(*shape, dtype=dtype, **fans)
    if init is glorot_normal:
        return init(*shape, dtype=dtype)
    if not callable(init):
        raise ArgumentError(f"{who}: init must be a function of the weight's shape, e.g. `lambda *shape: "
                            f"w` or glorot_uniform, got {init!r:.60}")
    return owned_parameter(init(*shape), shape, dtype, who, "weight")
