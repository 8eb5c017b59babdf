"""Tensors made from a shape (``zeros``, ``ones``, ``full``, ``rand``,
``randn``, ``zeros_like``, ``ones_like``), filled on the device itself, and
triflux's seeded stream of random numbers (``seed``), from which random
fills, initialisers and dropout draw their seeds."""
import numpy as np

from . import dtypes as _dt
from .devices import as_device
from .dispatch import create
from .errors import DTypeError, ShapeError
from .primitives import REGISTRY

_SEED = {"rng": np.random.default_rng()}


def seed(s):
    """Seed triflux's random numbers (``rand``, ``randn``, initialisers,
    dropout) on every device."""
    _SEED["rng"] = np.random.default_rng(s)


def next_seed():
    """A fresh 31-bit seed for one random fill, from triflux's seeded stream."""
    return int(_SEED["rng"].integers(0, 2**31 - 1))


def fill(shape, value, dtype=_dt.float32, device=None):
    """A Tensor of ``shape`` with every element ``value``."""
    return create(REGISTRY["fill"], as_device(device),
                  {"shape": tuple(shape), "value": value, "dtype": _dt.as_dtype(dtype)})


def random(name, shape, dtype, device, seed=None):
    """A Tensor drawn by the random fill primitive ``name`` ("rand_uniform",
    "rand_normal"), from ``seed`` or the next seed of triflux's stream."""
    dtype = _dt.as_dtype(dtype)
    if not _dt.is_floating(dtype):
        raise DTypeError(f"random numbers are floating point; got dtype {dtype}")
    return create(REGISTRY[name], device, {"shape": tuple(shape), "dtype": dtype,
                                           "seed": next_seed() if seed is None else int(seed)})


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ShapeError(f"negative dimension in shape {shape}")
    return shape


def full(shape, value, dtype=_dt.float32, device=None):
    return fill(_shape_args((shape,) if isinstance(shape, int) else (tuple(shape),)), value, dtype, device)


def zeros(*shape, dtype=_dt.float32, device=None):
    return fill(_shape_args(shape), 0, dtype, device)


def ones(*shape, dtype=_dt.float32, device=None):
    return fill(_shape_args(shape), 1, dtype, device)


def rand(*shape, dtype=_dt.float32, device=None, seed=None):
    """Uniform on [0, 1), drawn on the device itself."""
    return random("rand_uniform", _shape_args(shape), dtype, as_device(device), seed)


def randn(*shape, dtype=_dt.float32, device=None, seed=None):
    """Standard normal, drawn on the device itself."""
    return random("rand_normal", _shape_args(shape), dtype, as_device(device), seed)


def zeros_like(x):
    return fill(x.shape, 0, x.dtype, x.device)


def ones_like(x):
    return fill(x.shape, 1, x.dtype, x.device)
