"""Dropout, NumPy reference.

y = x * m / (1 - p), with m[i] ~ Bernoulli(1 - p) independently: m[i] = 1 when
u[i] >= p for u = ``np.random.default_rng(seed).random(x.size)`` taken in
row-major order, so the mask is a function of (seed, linear index) only and
the backward redraws it from the seed (nothing is stored). p = 1 drops
everything (y = 0, no division by zero); p = 0 is the identity. The mask
multiplies, as in torch: a dropped NaN or infinity gives NaN (x * 0).

The Triton kernel draws its mask with Triton's Philox generator
(``tl.rand(seed, i)``): the two sides' masks have the same distribution but
are not the same numbers.
"""
import numpy as np

from triflux.specs.dropout import check_p, keep_scale
from triflux.specs.fill import check_seed


def dropout_mask(shape, p, seed):
    """m (float64 0/1 array of ``shape``): 1 where the element is kept."""
    p = check_p(p)
    n = int(np.prod(shape, dtype=np.int64))
    u = np.random.default_rng(check_seed(seed)).random(n).reshape(shape)
    return (u >= p).astype(np.float64)


def dropout_forward(x, p, seed):
    """y = x * m / (1 - p),   m ~ Bernoulli(1 - p) from ``seed``."""
    x = np.asarray(x)
    p = check_p(p)
    keep = dropout_mask(x.shape, p, seed).astype(bool)
    with np.errstate(invalid="ignore"):
        return (x * np.where(keep, x.dtype.type(keep_scale(p)), x.dtype.type(0))).astype(x.dtype)


def dropout_backward(grad, out, x, p, seed):
    """dx = g * m / (1 - p), the mask m redrawn from ``seed``."""
    x = np.asarray(x)
    p = check_p(p)
    g = np.asarray(grad, dtype=x.dtype)
    keep = dropout_mask(x.shape, p, seed).astype(bool)
    with np.errstate(invalid="ignore"):
        return ((g * np.where(keep, x.dtype.type(keep_scale(p)), x.dtype.type(0))).astype(x.dtype),)
