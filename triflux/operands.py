"""What an operation does to its operands before it runs: ``cast`` (the one
dtype conversion, differentiable between floating types), ``floating``
(an operand that must be floating: integers and bools become float32,
complex numbers and strings are refused) and ``promote`` (two operands to
their common dtype, as NumPy's, except that integers meeting floats take the
float's type). ``triflux.ops`` and ``triflux.spatial`` build on them."""
import numpy as np

from . import dtypes as _dt
from .arguments import is_real, not_real
from .dispatch import apply
from .errors import DTypeError
from .primitives import REGISTRY
from .tensor import as_tensor

__all__ = ["cast", "floating", "promote"]


def cast(x, dtype):
    """``x`` converted to ``dtype`` (differentiable between floating types)."""
    x = as_tensor(x)
    dtype = _dt.as_dtype(dtype)
    if x.dtype == dtype:
        return x
    if not is_real(x.dtype):
        raise not_real(x.dtype, "`cast`", "a tensor")
    if not is_real(dtype):
        raise DTypeError(f"`cast`: triflux tensors hold real numbers (floats, ints, bools), not {dtype}")
    return apply(REGISTRY["cast"], (x,), {"dtype": dtype}, "cast",
                 record=_dt.is_floating(dtype) and _dt.is_floating(x.dtype))


def floating(x, name):
    """``x`` as a Tensor of a floating type for the function ``name``: ints
    and bools converted to float32, other kinds refused with a DTypeError."""
    x = as_tensor(x)
    if not _dt.is_floating(x.dtype):
        if not is_real(x.dtype):
            raise not_real(x.dtype, f"`{name}`")
        x = cast(x, _dt.DEFAULT_FLOAT)
    return x


def promote(a, b):
    """``a`` and ``b`` in their common dtype (integers meeting floats take the
    float's type: int64 * float32 stays float32)."""
    if a.dtype == b.dtype:
        return a, b
    fa, fb = _dt.is_floating(a.dtype), _dt.is_floating(b.dtype)
    dt = a.dtype if fa and not fb else b.dtype if fb and not fa else np.promote_types(a.dtype, b.dtype)
    return cast(a, dt), cast(b, dt)
