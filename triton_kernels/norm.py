"""Normalisation family, Triton kernels: batch normalisation.

``x`` (N, C, ...) is read as a dense (N, C, S) array (S = prod(spatial); a
non-contiguous ``x`` or gradient is first made dense by ``copy.contiguous``).
One program per channel, one launch per direction:

* ``batchnorm_train`` forward: sweep 1 sums x (mean), sweep 2 sums
  d = x - mean and d^2 (the corrected two-pass variance; the mean is kept as
  mean + sum(d)/M so its float32 rounding does not show in x - mean), sweep 3
  writes y = gamma * xhat + beta;
* ``batchnorm_train`` backward: sweeps 1-2 recompute mean and istd, sweep 3
  sums g and g * xhat (dbeta, dgamma), sweep 4 writes
  dx = gamma * istd / M * (M g - dbeta - xhat * dgamma);
* ``batchnorm_test``: forward and backward are elementwise with per-channel
  constants (one sweep; the backward also sums g and g * xhat per channel).

Arithmetic in float32 (float64 for float64). Per-channel vectors (gamma,
beta, mean, var) are read through their stride. A faster GPU version for
large N*S with few channels would split each channel's sweep over several
programs (partial sums in a (C, P) buffer, then a finishing pass).
"""
import numpy as np
import triton
import triton.language as tl

from . import copy, launch, numerics
from .numerics import store_value
from ..specs.norm import batchnorm_spec


@triton.jit
def _channel_offsets(i, c, C, S):
    """Element offsets of the values ``i`` (0 <= i < M = N * S) of channel ``c``
    in a dense (N, C, S) array: value i is sample i // S, position i % S."""
    n = i // S
    return (n * C + c) * S + (i - n * S)


@triton.jit
def _channel_stats(x, c, C, S, M, eps_hi, eps_lo, COMPUTE_TYPE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Statistics of channel c (M >= 1) as (mean, dmean, istd): the mean is
    mean + dmean, kept as two numbers (xhat = ((x - mean) - dmean) * istd) so
    that its rounding does not show in x - mean (all-equal or nearly equal x,
    large offsets). Sweep 1: mean = sum(x) / M. Sweep 2 (corrected two-pass):
    d = x - mean, dmean = sum(d) / M, var = (sum(d^2) - sum(d) dmean) / M."""
    block = tl.arange(0, BLOCK_SIZE)
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        acc += tl.load(x + _channel_offsets(i, c, C, S), mask=i < M, other=0.0).to(COMPUTE_TYPE)
    mean = tl.sum(acc, axis=0) / M
    acc = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    acc2 = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        xi = tl.load(x + _channel_offsets(i, c, C, S), mask=i < M, other=0.0).to(COMPUTE_TYPE)
        d = tl.where(i < M, xi - mean, 0.0)
        acc += d
        acc2 += d * d
    sum_d = tl.sum(acc, axis=0)
    dmean = sum_d / M
    var = numerics.maximum((tl.sum(acc2, axis=0) - sum_d * dmean) / M, 0.0)   # (NaN stays NaN)
    istd = 1.0 / tl.sqrt(var + eps_hi + eps_lo)
    return mean, dmean, istd


@triton.jit
def _batchnorm_train_forward_kernel(x, gamma, gamma_stride, beta, beta_stride, y, C, S, M, eps_hi, eps_lo,
                                    COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y = gamma * xhat + beta for channel c = program_id(0), with the batch's statistics."""
    c = tl.program_id(0).to(tl.int64)
    mean, dmean, istd = _channel_stats(x, c, C, S, M, eps_hi, eps_lo, COMPUTE_TYPE, BLOCK_SIZE)
    gamma_c = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE)
    beta_c = tl.load(beta + c * beta_stride).to(COMPUTE_TYPE)
    block = tl.arange(0, BLOCK_SIZE)
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        offsets = _channel_offsets(i, c, C, S)
        v = tl.load(x + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        out = gamma_c * (((v - mean) - dmean) * istd) + beta_c
        tl.store(y + offsets, store_value(out, y.dtype.element_ty, INTERP), mask=i < M)


@triton.jit
def _batchnorm_train_backward_kernel(grad, x, gamma, gamma_stride, dx, dgamma, dgamma_stride, dbeta, dbeta_stride,
                                     C, S, M, eps_hi, eps_lo,
                                     COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dx, dgamma[c], dbeta[c] for channel c = program_id(0) (the reference has the formulas)."""
    c = tl.program_id(0).to(tl.int64)
    mean, dmean, istd = _channel_stats(x, c, C, S, M, eps_hi, eps_lo, COMPUTE_TYPE, BLOCK_SIZE)
    block = tl.arange(0, BLOCK_SIZE)
    sum_g = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    sum_gx = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        offsets = _channel_offsets(i, c, C, S)
        v = tl.load(x + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        g = tl.load(grad + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        sum_g += g
        sum_gx += g * (((v - mean) - dmean) * istd)
    db = tl.sum(sum_g, axis=0)
    dg = tl.sum(sum_gx, axis=0)
    tl.store(dbeta + c * dbeta_stride, store_value(db, dbeta.dtype.element_ty, INTERP))
    tl.store(dgamma + c * dgamma_stride, store_value(dg, dgamma.dtype.element_ty, INTERP))
    k = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE) * istd / M
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        offsets = _channel_offsets(i, c, C, S)
        v = tl.load(x + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        g = tl.load(grad + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        out = k * (M * g - db - (((v - mean) - dmean) * istd) * dg)
        tl.store(dx + offsets, store_value(out, dx.dtype.element_ty, INTERP), mask=i < M)


@triton.jit
def _batchnorm_test_kernel(x, grad, gamma, gamma_stride, beta, beta_stride, mean, mean_stride, var, var_stride,
                           y, dgamma, dgamma_stride, dbeta, dbeta_stride,
                           C, S, M, eps_hi, eps_lo, BACKWARD: tl.constexpr,
                           COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Forward: y = gamma * (x - mean) * istd + beta. Backward (BACKWARD): y
    receives dx = g * gamma * istd, and dgamma, dbeta the per-channel sums."""
    c = tl.program_id(0).to(tl.int64)
    gamma_c = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE)
    mean_c = tl.load(mean + c * mean_stride).to(COMPUTE_TYPE)
    istd = 1.0 / tl.sqrt(tl.load(var + c * var_stride).to(COMPUTE_TYPE) + eps_hi + eps_lo)
    block = tl.arange(0, BLOCK_SIZE)
    sum_g = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    sum_gx = tl.zeros((BLOCK_SIZE,), COMPUTE_TYPE)
    if not BACKWARD:
        beta_c = tl.load(beta + c * beta_stride).to(COMPUTE_TYPE)
    for start in range(0, M, BLOCK_SIZE):
        i = start + block
        offsets = _channel_offsets(i, c, C, S)
        v = tl.load(x + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
        if BACKWARD:
            g = tl.load(grad + offsets, mask=i < M, other=0.0).to(COMPUTE_TYPE)
            sum_g += g
            sum_gx += g * ((v - mean_c) * istd)
            out = g * gamma_c * istd
        else:
            out = gamma_c * ((v - mean_c) * istd) + beta_c
        tl.store(y + offsets, store_value(out, y.dtype.element_ty, INTERP), mask=i < M)
    if BACKWARD:
        tl.store(dbeta + c * dbeta_stride, store_value(tl.sum(sum_g, axis=0), dbeta.dtype.element_ty, INTERP))
        tl.store(dgamma + c * dgamma_stride, store_value(tl.sum(sum_gx, axis=0), dgamma.dtype.element_ty, INTERP))


# --- host side -------------------------------------------------------------------------

def _spec(x, per_channel, eps):
    """The batch-norm spec of the tensor ``x`` and its per-channel vectors."""
    return batchnorm_spec(x.shape, tuple(v.shape for v in per_channel), x.dtype, eps)


def _launch_options(spec, x):
    """Arguments shared by every launch: the sizes C, S, M, eps as two
    float32 scalars (hi, lo) with hi + lo = eps to ~2^-48 relative (Triton
    passes Python floats as float32, and a float64 kernel must not add a
    float32-rounded eps: it adds them one after the other to a value of its
    compute type), and the constexprs."""
    eps_hi = float(np.float32(spec.eps))
    eps_lo = float(np.float32(spec.eps - eps_hi))
    M = spec.values_per_channel
    block = min(launch.next_pow2(max(M, 1)), 1 << 16) if launch.INTERPRET else 1024
    return ((spec.channels, spec.spatial_size, M, eps_hi, eps_lo),
            dict(COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET, BLOCK_SIZE=block))


def _empty_channel_grads(spec, dx, gamma, beta):
    """The backward's results where there is nothing to launch: no channels
    (empty gradients) or no values per channel (zero gradients)."""
    if spec.channels == 0:
        return (dx, launch.empty(gamma.shape, gamma.dtype, gamma.device),
                launch.empty(beta.shape, beta.dtype, beta.device))
    return (dx, copy.full(gamma.shape, 0.0, gamma.dtype, gamma.device),
            copy.full(beta.shape, 0.0, beta.dtype, beta.device))


def batchnorm_train_forward(x, gamma, beta, eps=1e-5):
    spec = _spec(x, (gamma, beta), eps)
    x = copy.contiguous(x)
    y = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return y
    sizes, options = _launch_options(spec, x)
    launch.launch(_batchnorm_train_forward_kernel, (spec.channels,), x, gamma, gamma.stride(0),
                  beta, beta.stride(0), y, *sizes, **options)
    return y


def batchnorm_train_backward(grad, out, x, gamma, beta, eps=1e-5):
    spec = _spec(x, (gamma, beta), eps)
    x = copy.contiguous(x)
    dx = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return _empty_channel_grads(spec, dx, gamma, beta)
    grad = copy.contiguous(grad)
    dgamma = launch.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = launch.empty(beta.shape, beta.dtype, beta.device)
    sizes, options = _launch_options(spec, x)
    launch.launch(_batchnorm_train_backward_kernel, (spec.channels,), grad, x, gamma, gamma.stride(0),
                  dx, dgamma, 1, dbeta, 1, *sizes, **options)
    return dx, dgamma, dbeta


def batchnorm_test_forward(x, gamma, beta, mean, var, eps=1e-5):
    spec = _spec(x, (gamma, beta, mean, var), eps)
    x = copy.contiguous(x)
    y = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return y
    sizes, options = _launch_options(spec, x)
    launch.launch(_batchnorm_test_kernel, (spec.channels,), x, x, gamma, gamma.stride(0), beta, beta.stride(0),
                  mean, mean.stride(0), var, var.stride(0), y, y, 0, y, 0, *sizes, BACKWARD=False, **options)
    return y


def batchnorm_test_backward(grad, out, x, gamma, beta, mean, var, eps=1e-5):
    spec = _spec(x, (gamma, beta, mean, var), eps)
    x = copy.contiguous(x)
    dx = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return _empty_channel_grads(spec, dx, gamma, beta) + (None, None)
    grad = copy.contiguous(grad)
    dgamma = launch.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = launch.empty(beta.shape, beta.dtype, beta.device)
    sizes, options = _launch_options(spec, x)
    launch.launch(_batchnorm_test_kernel, (spec.channels,), x, grad, gamma, gamma.stride(0), beta, beta.stride(0),
                  mean, mean.stride(0), var, var.stride(0), dx, dgamma, 1, dbeta, 1, *sizes,
                  BACKWARD=True, **options)
    return dx, dgamma, dbeta, None, None
