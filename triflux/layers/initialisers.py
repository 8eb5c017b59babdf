"""Initial values of parameters (Flux's ``glorot_uniform``, ``glorot_normal``),
drawn on the CPU from triflux's seeded stream so every device starts equal."""
import math

import numpy as np

from .. import dtypes as _dt
from ..constructors import next_seed
from ..tensor import Tensor


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
