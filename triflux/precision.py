"""Converting the floating arrays of any structure: ``f32``, ``f64``,
``f16``, ``bf16`` (Flux's names). Integer and bool arrays are kept, so
labels and masks survive a precision change. A ``DataLoader`` becomes the
same loader (shuffling, batch size, device) over converted data."""
from . import dtypes as _dt
from . import ops
from .data import DataLoader
from .functor import fmap
from .tensor import Tensor


def _convert(x, dtype):
    if isinstance(x, DataLoader):   # the same loader over converted data (and container batches)
        return x._converted(lambda d: _convert(d, dtype))

    def leaf(a):
        if isinstance(a, Tensor):
            return ops.cast(a, dtype) if _dt.is_floating(a.dtype) else a
        return a.astype(dtype) if _dt.is_floating(a.dtype) else a
    return fmap(leaf, x)


def f32(x):
    """``x`` with every floating array in float32."""
    return _convert(x, _dt.float32)


def f64(x):
    """``x`` with every floating array in float64."""
    return _convert(x, _dt.float64)


def f16(x):
    """``x`` with every floating array in float16."""
    return _convert(x, _dt.float16)


def bf16(x):
    """``x`` with every floating array in bfloat16 (needs ``ml_dtypes``)."""
    return _convert(x, _dt.as_dtype("bfloat16"))
