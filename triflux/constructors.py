"""Tensors made from a shape (``zeros``, ``ones``, ``full``, ``rand``,
``randn``, ``zeros_like``, ``ones_like``), filled on the device itself, and
triflux's seeded stream of random numbers (``seed``), from which random
fills, initialisers and dropout draw their seeds."""
import math
import numbers

import numpy as np

from . import dtypes as _dt
from . import memory, recording
from .arguments import int_arg, is_int
from .devices import as_device
from .dispatch import create
from .errors import ArgumentError, DTypeError, OutOfMemoryError, ShapeError
from .primitives import REGISTRY
from .tensor import Tensor

_SEED = {"rng": np.random.default_rng()}


def seed(s):
    """Seed triflux's random numbers (``rand``, ``randn``, initialisers,
    dropout) on every device."""
    _SEED["rng"] = np.random.default_rng(s)


def next_seed():
    """A fresh 31-bit seed for one random fill, from triflux's seeded stream."""
    value = int(_SEED["rng"].integers(0, 2**31 - 1))
    if recording.ACTIVE is not None:
        recording.note_seed(value)
    return value


def fill(shape, value, dtype=_dt.float32, device=None):
    """A Tensor of ``shape`` with every element ``value``."""
    dtype = _dt.as_dtype(dtype)
    return _allocating(REGISTRY["fill"], as_device(device), {"shape": tuple(shape), "value": value, "dtype": dtype})


def random(name, shape, dtype, device, seed=None):
    """A Tensor drawn by the random fill primitive ``name`` ("rand_uniform",
    "rand_normal"), from ``seed`` or the next seed of triflux's stream."""
    dtype = _dt.as_dtype(dtype)
    if not _dt.is_floating(dtype):
        raise DTypeError(f"random numbers are floating point; got dtype {dtype}")
    return _allocating(REGISTRY[name], device, {"shape": tuple(shape), "dtype": dtype,
                                                "seed": next_seed() if seed is None else int(seed)})


def _allocating(prim, device, attrs):
    """``create(prim, device, attrs)``; the host running out of memory (the
    CPU device's NumPy) is triflux's ``OutOfMemoryError`` as on a GPU."""
    try:
        return create(prim, device, attrs)
    except OutOfMemoryError:
        raise
    except MemoryError as e:
        raise memory.out_of_memory(e, attrs["shape"], attrs["dtype"], device) from None


def _shape_args(shape, who):
    """``shape`` (the sizes given one by one, or one tuple/list of them) as
    a tuple of ints >= 0; anything else is a ShapeError naming ``who``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int_arg(s, f"`{who}`", f"every size (in shape {shape!r})", low=0) for s in shape)


def _fill_value(value, dtype):
    """``value`` as a Python number that ``dtype`` holds exactly as given
    (integers and bools in range, no fraction for them; floats within the
    dtype's finite range, or inf/NaN); every device then fills the same."""
    if isinstance(value, (Tensor, np.ndarray)):
        if value.size != 1:
            raise ArgumentError(f"`full`: the fill value must be one number, got a {type(value).__name__} of shape "
                            f"{value.shape}")
        value = value.item()
    if isinstance(value, np.generic):        # np.float32(2), np.bool_(True): the Python number
        value = value.item()
    if not isinstance(value, numbers.Number):
        raise ArgumentError(f"`full`: the fill value must be a number, got {value!r} ({type(value).__name__})")
    if dtype.kind == "c":
        return value
    if isinstance(value, complex):
        raise DTypeError(f"`full`: the fill value {value!r} is complex, but dtype {dtype} holds real numbers")
    if dtype.kind in "biu":
        lo, hi = (0, 1) if dtype.kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
        whole = math.isfinite(value) and value == int(value)
        if not (whole and lo <= value <= hi):
            what = "0/1 or False/True" if dtype.kind == "b" else f"whole numbers from {lo} to {hi}"
            raise DTypeError(f"`full`: the fill value {value!r} does not fit dtype {dtype}, which holds {what}; "
                             "give a value in range, or a wider dtype")
        return bool(value) if dtype.kind == "b" else int(value)
    largest = _dt.largest(dtype)
    if math.isfinite(value) and abs(value) > largest:
        raise DTypeError(f"`full`: the fill value {value!r} is beyond the largest {dtype} ({largest:.6g}) and "
                         "would become inf; give a value in range (or inf itself), or a wider dtype")
    return value


def full(shape, value, dtype=_dt.float32, device=None):
    """A Tensor of ``shape`` (an int or a tuple of ints) with every element
    ``value`` (a number that ``dtype`` holds: an integer dtype takes whole
    numbers in its range, bool takes 0/1, a float dtype anything up to its
    largest finite number, inf and NaN), on ``device``."""
    if not (is_int(shape) or isinstance(shape, (tuple, list))):
        raise ShapeError(f"`full`: the shape must be an int or a tuple of ints, got {shape!r} "
                         f"({type(shape).__name__})")
    shape = _shape_args((shape,), "full")
    dtype = _dt.as_dtype(dtype)
    return fill(shape, _fill_value(value, dtype), dtype, device)


def zeros(*shape, dtype=_dt.float32, device=None):
    """A Tensor of zeros: ``zeros(2, 3)`` or ``zeros((2, 3))``."""
    return fill(_shape_args(shape, "zeros"), 0, dtype, device)


def ones(*shape, dtype=_dt.float32, device=None):
    """A Tensor of ones: ``ones(2, 3)`` or ``ones((2, 3))``."""
    return fill(_shape_args(shape, "ones"), 1, dtype, device)


def rand(*shape, dtype=_dt.float32, device=None, seed=None):
    """Uniform on [0, 1), drawn on the device itself."""
    return random("rand_uniform", _shape_args(shape, "rand"), dtype, as_device(device), seed)


def randn(*shape, dtype=_dt.float32, device=None, seed=None):
    """Standard normal, drawn on the device itself."""
    return random("rand_normal", _shape_args(shape, "randn"), dtype, as_device(device), seed)


def empty_like(x):
    """A new Tensor of ``x``'s shape, dtype and device whose values are
    undefined: memory for a kernel to write every element of (no launch
    fills it). Running out of memory is an ``OutOfMemoryError``."""
    data = x._data
    try:
        fresh = np.empty_like(data) if x._device.is_cpu else data.new_empty(data.shape)
        if recording.ACTIVE is not None and not x._device.is_cpu:
            recording.note_allocation(fresh)
    except Exception as e:
        if memory.is_out_of_memory(e):
            raise memory.out_of_memory(e, data.shape, data.dtype,
                                       x._device if x._device.is_cpu else data.device) from None
        raise
    return Tensor._make(fresh, x._device)


def zeros_like(x):
    return fill(x.shape, 0, x.dtype, x.device)


def ones_like(x):
    return fill(x.shape, 1, x.dtype, x.device)
