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

from triflux.dtypes import as_dtype
from triflux.specs.fill import MAX_SEED, below_one, check_seed, check_shape, random_dtype  # noqa: F401

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
