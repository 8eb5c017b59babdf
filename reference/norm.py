"""Normalisation family, NumPy reference: batch normalisation.

``x`` has shape (N, C, ...): a batch of N samples with C channels and any
number of trailing spatial axes (none included: (N, C)). Statistics are per
channel ``c``, over the batch axis and every spatial position: M = N * prod(spatial)
values per channel. ``gamma``, ``beta`` (and for ``batchnorm_test`` the given
``mean``, ``var``) have shape (C,).

The running-statistics update (momentum, unbiased variance) is the layer's
job; these functions only normalise. float16/bfloat16 compute in float32 and
round once at the end (a sum over N*H*W half-precision values would
overflow or lose the small terms); float32 and float64 stay as they are.
"""
import numpy as np

from ..errors import ShapeError
from ._util import in_compute_dtype


def _check(x, *per_channel):
    if x.ndim < 2:
        raise ShapeError(f"batch norm needs x of shape (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for v in per_channel:
        if np.shape(v) != (c,):
            raise ShapeError(f"batch norm: per-channel parameters must have shape ({c},), "
                             f"got {np.shape(v)} for x of shape {x.shape}")


def _axes(x):
    """The axes statistics are taken over: 0 and every spatial axis."""
    return (0,) + tuple(range(2, x.ndim))


def _per_channel(v, x):
    """A (C,) array shaped (1, C, 1, ...) to broadcast against x."""
    return np.reshape(v, (1, -1) + (1,) * (x.ndim - 2))


def _batch_stats(x):
    """Per-channel mean and biased variance over N and spatial positions
    (keepdims). With no values per channel (N = 0), mean 0 and variance 0."""
    axes = _axes(x)
    m = x.size // max(x.shape[1], 1) if x.shape[1] else 0
    if m == 0:
        z = np.zeros(_per_channel(np.zeros(x.shape[1], x.dtype), x).shape, x.dtype)
        return z, z
    mean = np.mean(x, axis=axes, keepdims=True)
    # one refinement: the rounding of the first mean (u |mean|) would otherwise
    # dominate x - mean when the spread is small next to the mean (x ~ 50 +- 1)
    mean = mean + np.mean(x - mean, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    return mean, var


def batchnorm_train_forward(x, gamma, beta, eps=1e-5):
    """y = gamma * xhat + beta,   xhat = (x - mu) / sqrt(s2 + eps),

    mu_c = mean of x[:, c, ...],  s2_c = mean of (x[:, c, ...] - mu_c)^2 (biased).
    """
    _check(x, gamma, beta)
    dtype = x.dtype
    x, gamma, beta = in_compute_dtype(x, gamma, beta)
    mean, var = _batch_stats(x)
    xhat = (x - mean) / np.sqrt(var + x.dtype.type(eps))
    return (_per_channel(gamma, x) * xhat + _per_channel(beta, x)).astype(dtype)


def batchnorm_train_backward(grad, out, x, gamma, beta, eps=1e-5):
    """With M values per channel, istd = 1 / sqrt(s2 + eps) and g = dL/dy:

    dbeta_c  = sum g,            dgamma_c = sum g * xhat   (sums over N and space)
    dx       = gamma * istd / M * (M g - dbeta - xhat * dgamma)

    (dx includes the paths through mu and s2.) ``out`` is not used: xhat is
    recomputed from x.
    """
    _check(x, gamma, beta)
    dtypes = x.dtype, np.asarray(gamma).dtype, np.asarray(beta).dtype
    x, gamma, beta, g = in_compute_dtype(x, gamma, beta, grad)
    axes = _axes(x)
    mean, var = _batch_stats(x)
    istd = 1 / np.sqrt(var + x.dtype.type(eps))
    xhat = (x - mean) * istd
    dbeta = np.sum(g, axis=axes)
    dgamma = np.sum(g * xhat, axis=axes)
    m = x.size // x.shape[1] if x.shape[1] else 0
    if m == 0:
        dx = np.zeros_like(x)
    else:
        dx = _per_channel(gamma, x) * istd / m * (
            m * g - _per_channel(dbeta, x) - xhat * _per_channel(dgamma, x))
    return dx.astype(dtypes[0]), dgamma.astype(dtypes[1]), dbeta.astype(dtypes[2])


def batchnorm_test_forward(x, gamma, beta, mean, var, eps=1e-5):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta, with the given (running)
    per-channel ``mean`` and ``var``."""
    _check(x, gamma, beta, mean, var)
    dtype = x.dtype
    x, gamma, beta, mean, var = in_compute_dtype(x, gamma, beta, mean, var)
    istd = 1 / np.sqrt(_per_channel(var, x) + x.dtype.type(eps))
    y = _per_channel(gamma, x) * (x - _per_channel(mean, x)) * istd + _per_channel(beta, x)
    return y.astype(dtype)


def batchnorm_test_backward(grad, out, x, gamma, beta, mean, var, eps=1e-5):
    """istd = 1 / sqrt(var + eps):

    dx = g * gamma * istd,   dgamma_c = sum g * (x - mean) * istd,   dbeta_c = sum g;
    no gradient (None) for the statistics ``mean`` and ``var``.
    """
    _check(x, gamma, beta, mean, var)
    dtypes = x.dtype, np.asarray(gamma).dtype, np.asarray(beta).dtype
    x, gamma, beta, mean, var, g = in_compute_dtype(x, gamma, beta, mean, var, grad)
    axes = _axes(x)
    istd = 1 / np.sqrt(_per_channel(var, x) + x.dtype.type(eps))
    dx = g * _per_channel(gamma, x) * istd
    dgamma = np.sum(g * (x - _per_channel(mean, x)) * istd, axis=axes)
    dbeta = np.sum(g, axis=axes)
    return dx.astype(dtypes[0]), dgamma.astype(dtypes[1]), dbeta.astype(dtypes[2]), None, None
