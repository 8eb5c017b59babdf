"""Element types. A triflux dtype *is* a NumPy dtype.

bfloat16 has no NumPy dtype of its own; the ``ml_dtypes`` package (the one
JAX uses) provides it. It is imported only when bfloat16 is asked for, so the
CPU path needs nothing but NumPy.
"""
import numpy as np

from .errors import DTypeError

float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

DEFAULT_FLOAT = float32


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - exercised in the no-extras venv test
        raise DTypeError(
            "bfloat16 needs the `ml_dtypes` package (NumPy has no bfloat16): "
            "`pip install ml_dtypes` or `pip install triflux[gpu]`") from None
    return np.dtype(ml_dtypes.bfloat16)


def __getattr__(name):  # module attribute `bfloat16`, resolved lazily
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(name)


_NAMES = {"float16": "float16", "half": "float16", "f16": "float16",
          "float32": "float32", "float": "float32", "f32": "float32",
          "float64": "float64", "double": "float64", "f64": "float64",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def as_dtype(d):
    """Normalise ``d`` (a NumPy dtype or type, a name, a torch dtype, a Python
    type) to a NumPy dtype."""
    if isinstance(d, np.dtype):
        return d
    if d is None:
        return DEFAULT_FLOAT
    if d is float:
        return float64
    if isinstance(d, str):
        name = _NAMES.get(d, d)
        if name == "bfloat16":
            return _bfloat16()
        try:
            return np.dtype(name)
        except TypeError:
            raise DTypeError(f"unknown dtype {d!r}; use one of float32, float64, "
                             "float16, bfloat16, int32, int64, bool") from None
    mod = type(d).__module__
    if mod.startswith("torch"):
        return from_torch(d)
    try:
        return np.dtype(d)
    except TypeError:
        raise DTypeError(f"unknown dtype {d!r}") from None


def is_floating(d):
    d = d if isinstance(d, np.dtype) else as_dtype(d)
    return d.kind == "f" or d.kind == "V" and d.name == "bfloat16"


_FLOATING = {}


def holds_floats(storage_dtype):
    """:func:`is_floating` of a storage's dtype (NumPy's or torch's: a Tensor's
    ``_data.dtype``), remembered per dtype: a training step asks it of every
    parameter."""
    found = _FLOATING.get(storage_dtype)
    if found is None:
        found = _FLOATING[storage_dtype] = is_floating(storage_dtype)
    return found


def is_bfloat16(d):
    return d.kind == "V" and d.name == "bfloat16"


def largest(d):
    """The largest finite number of the floating dtype ``d``, as a float."""
    d = as_dtype(d)
    if is_bfloat16(d):
        import ml_dtypes
        return float(ml_dtypes.finfo(d).max)
    return float(np.finfo(d).max)


def compute_dtype(dtype):
    """The dtype arithmetic on ``dtype`` data runs (and accumulates) in:
    float32 for the 16-bit floats (float16, bfloat16), ``dtype`` itself for
    everything else (float32, float64, integers, booleans)."""
    dtype = as_dtype(dtype)
    return float32 if dtype.itemsize == 2 and is_floating(dtype) else dtype


_TORCH = {}


def _torch_table():
    if not _TORCH:
        import torch
        pairs = [(float16, torch.float16), (float32, torch.float32), (float64, torch.float64),
                 (int8, torch.int8), (int16, torch.int16), (int32, torch.int32),
                 (int64, torch.int64), (uint8, torch.uint8), (bool_, torch.bool)]
        try:
            pairs.append((_bfloat16(), torch.bfloat16))
        except DTypeError:
            pass
        for npd, td in pairs:
            _TORCH[npd] = td
            _TORCH[td] = npd
    return _TORCH


def to_torch(d):
    """The torch dtype for NumPy dtype ``d``."""
    try:
        return _torch_table()[as_dtype(d)]
    except KeyError:
        raise DTypeError(f"dtype {d} has no device (torch) equivalent; "
                         "use float32, float16, bfloat16, float64, an integer or bool") from None


def from_torch(td):
    """The NumPy dtype for torch dtype ``td``."""
    try:
        return _torch_table()[td]
    except KeyError:
        raise DTypeError(f"torch dtype {td} is not supported by triflux") from None
