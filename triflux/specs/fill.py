"""The fill family's spec: the attributes of fill, rand_uniform and
rand_normal (a shape, a seed, a floating dtype) checked once, and the
largest number below 1 a uniform draw is clamped to, shared by the reference
and the kernels.
"""
import operator

import numpy as np

from ..dtypes import as_dtype, is_floating
from ..errors import DTypeError

__all__ = ["MAX_SEED", "check_seed", "check_shape", "random_dtype", "below_one"]

#: seeds are integers in [0, 2**63)
MAX_SEED = 2 ** 63


def check_seed(seed):
    """``seed`` as a Python int, or a ValueError that says what is allowed."""
    try:
        s = operator.index(seed)
    except TypeError:
        raise TypeError(f"seed must be an integer, got {seed!r}") from None
    if not 0 <= s < MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {s}")
    return s


def check_shape(shape):
    """``shape`` as a tuple of non-negative ints (a bare int is a 1-d shape)."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative side in shape {shape}")
    return shape


def random_dtype(dtype):
    """``dtype`` as a NumPy dtype, which must be floating for random fills."""
    d = as_dtype(dtype)
    if not is_floating(d):
        raise DTypeError(f"random fills make floating-point arrays; got dtype {d}")
    return d


def below_one(dtype):
    """The largest number below 1 in ``dtype``: uniform draws are clamped to
    it so that rounding to a short float never produces 1."""
    d = as_dtype(dtype)
    if d == np.float64:
        return np.nextafter(1.0, 0.0)
    mantissa = {"float32": 23, "float16": 10, "bfloat16": 7}[d.name]
    return 1.0 - 2.0 ** -(mantissa + 1)
