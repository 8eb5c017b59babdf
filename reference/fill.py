"""Fills: arrays made from nothing but attributes (shape, dtype, a value or
a seed). No tensor inputs, not differentiable. The ``device`` attribute says
where the kernels allocate; the CPU reference ignores it.

Random fills are reproducible: the same ``(shape, dtype, seed)`` gives the
same array. The reference draws with NumPy's ``default_rng(seed)`` (PCG64),
the kernels with Triton's counter-based Philox, so the two sides agree in
distribution, not value by value. For float16 and bfloat16 the numbers are
drawn in float32 and rounded.
"""
import operator

import numpy as np

from triflux.dtypes import as_dtype, is_floating
from triflux.errors import DTypeError

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


def _draw_dtype(d):
    """NumPy draws float64 for float64 and float32 for everything else."""
    return np.float64 if d == np.float64 else np.float32


def fill_forward(*, shape, value, dtype, device=None):
    """``y[i] = value`` for every index ``i`` of ``shape``, in ``dtype``."""
    return np.full(check_shape(shape), value, dtype=as_dtype(dtype))


def rand_uniform_forward(*, shape, dtype, seed, device=None):
    """``y[i] ~ U[0, 1)`` independently: mean 1/2, variance 1/12.

    Drawn in float32 (float64 for float64) and clamped to the largest number
    below 1 in ``dtype`` before rounding, so 1 never appears.
    """
    d = random_dtype(dtype)
    rng = np.random.default_rng(check_seed(seed))
    u = rng.random(check_shape(shape), dtype=_draw_dtype(d))
    return np.minimum(u, below_one(d)).astype(d)


def rand_normal_forward(*, shape, dtype, seed, device=None):
    """``y[i] ~ N(0, 1)`` independently: mean 0, variance 1.

    Drawn in float32 (float64 for float64), then rounded to ``dtype``.
    """
    d = random_dtype(dtype)
    rng = np.random.default_rng(check_seed(seed))
    return rng.standard_normal(check_shape(shape), dtype=_draw_dtype(d)).astype(d)
