"""Normalisation family, Triton kernels: batch normalisation.

``x`` (N, C, ...) is read as a dense (N, C, S) array (S = prod(spatial); a
non-contiguous ``x`` or gradient is first made dense by ``common.contiguous``).
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
import triton
import triton.language as tl

from . import common
from .common import store_value
from ..errors import ShapeError


@triton.jit
def _channel_stats(x, c, C, S, M, eps_hi, eps_lo, CT: tl.constexpr, BLOCK: tl.constexpr):
    """Statistics of channel c (M >= 1) as (mean, dmean, istd): the mean is
    mean + dmean, kept as two numbers (xhat = ((x - mean) - dmean) * istd) so
    that its rounding does not show in x - mean (all-equal or nearly equal x,
    large offsets). Sweep 1: mean = sum(x) / M. Sweep 2 (corrected two-pass):
    d = x - mean, dmean = sum(d) / M, var = (sum(d^2) - sum(d) dmean) / M."""
    base = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), CT)
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        acc += tl.load(x + off, mask=i < M, other=0.0).to(CT)
    mean = tl.sum(acc, axis=0) / M
    acc = tl.zeros((BLOCK,), CT)
    acc2 = tl.zeros((BLOCK,), CT)
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        d = tl.where(i < M, tl.load(x + off, mask=i < M, other=0.0).to(CT) - mean, 0.0)
        acc += d
        acc2 += d * d
    sd = tl.sum(acc, axis=0)
    dmean = sd / M
    var = common.maximum((tl.sum(acc2, axis=0) - sd * dmean) / M, 0.0)   # (NaN stays NaN)
    istd = 1.0 / tl.sqrt(var + eps_hi + eps_lo)
    return mean, dmean, istd


@triton.jit
def _bn_train_fwd_kernel(x, gamma, sg, beta, sb, y, C, S, M, eps_hi, eps_lo,
                         CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    mean, dmean, istd = _channel_stats(x, c, C, S, M, eps_hi, eps_lo, CT, BLOCK)
    ga = tl.load(gamma + c * sg).to(CT)
    be = tl.load(beta + c * sb).to(CT)
    base = tl.arange(0, BLOCK)
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        v = tl.load(x + off, mask=i < M, other=0.0).to(CT)
        out = ga * (((v - mean) - dmean) * istd) + be
        tl.store(y + off, store_value(out, y.dtype.element_ty, INTERP), mask=i < M)


@triton.jit
def _bn_train_bwd_kernel(g, x, gamma, sg, dx, dgamma, sdg, dbeta, sdb, C, S, M, eps_hi, eps_lo,
                         CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    mean, dmean, istd = _channel_stats(x, c, C, S, M, eps_hi, eps_lo, CT, BLOCK)
    base = tl.arange(0, BLOCK)
    sum_g = tl.zeros((BLOCK,), CT)
    sum_gx = tl.zeros((BLOCK,), CT)
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        v = tl.load(x + off, mask=i < M, other=0.0).to(CT)
        gv = tl.load(g + off, mask=i < M, other=0.0).to(CT)
        sum_g += gv
        sum_gx += gv * (((v - mean) - dmean) * istd)
    db = tl.sum(sum_g, axis=0)
    dgm = tl.sum(sum_gx, axis=0)
    tl.store(dbeta + c * sdb, store_value(db, dbeta.dtype.element_ty, INTERP))
    tl.store(dgamma + c * sdg, store_value(dgm, dgamma.dtype.element_ty, INTERP))
    ga = tl.load(gamma + c * sg).to(CT)
    k = ga * istd / M
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        v = tl.load(x + off, mask=i < M, other=0.0).to(CT)
        gv = tl.load(g + off, mask=i < M, other=0.0).to(CT)
        out = k * (M * gv - db - (((v - mean) - dmean) * istd) * dgm)
        tl.store(dx + off, store_value(out, dx.dtype.element_ty, INTERP), mask=i < M)


@triton.jit
def _bn_test_kernel(x, g, gamma, sg, beta, sb, mean, sm, var, sv, y, dgamma, sdg, dbeta, sdb,
                    C, S, M, eps_hi, eps_lo, BACKWARD: tl.constexpr,
                    CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """Forward: y = gamma * (x - mean) * istd + beta. Backward (BACKWARD): y
    receives dx = g * gamma * istd, and dgamma, dbeta the per-channel sums."""
    c = tl.program_id(0).to(tl.int64)
    ga = tl.load(gamma + c * sg).to(CT)
    mu = tl.load(mean + c * sm).to(CT)
    istd = 1.0 / tl.sqrt(tl.load(var + c * sv).to(CT) + eps_hi + eps_lo)
    base = tl.arange(0, BLOCK)
    sum_g = tl.zeros((BLOCK,), CT)
    sum_gx = tl.zeros((BLOCK,), CT)
    if not BACKWARD:
        be = tl.load(beta + c * sb).to(CT)
    for start in range(0, M, BLOCK):
        i = start + base
        n = i // S
        off = (n * C + c) * S + (i - n * S)
        v = tl.load(x + off, mask=i < M, other=0.0).to(CT)
        if BACKWARD:
            gv = tl.load(g + off, mask=i < M, other=0.0).to(CT)
            sum_g += gv
            sum_gx += gv * ((v - mu) * istd)
            out = gv * ga * istd
        else:
            out = ga * ((v - mu) * istd) + be
        tl.store(y + off, store_value(out, y.dtype.element_ty, INTERP), mask=i < M)
    if BACKWARD:
        tl.store(dbeta + c * sdb, store_value(tl.sum(sum_g, axis=0), dbeta.dtype.element_ty, INTERP))
        tl.store(dgamma + c * sdg, store_value(tl.sum(sum_gx, axis=0), dgamma.dtype.element_ty, INTERP))


# --- host side -------------------------------------------------------------------------

def _check(x, *per_channel):
    if x.dim() < 2:
        raise ShapeError(f"batch norm needs x of shape (N, C, ...), got shape {tuple(x.shape)}")
    c = x.shape[1]
    for v in per_channel:
        if tuple(v.shape) != (c,):
            raise ShapeError(f"batch norm: per-channel parameters must have shape ({c},), "
                             f"got {tuple(v.shape)} for x of shape {tuple(x.shape)}")


def _sizes(x):
    """(C, S, M): channels, spatial positions per sample, values per channel."""
    C = int(x.shape[1])
    S = common.numel(x.shape[2:])
    return C, S, int(x.shape[0]) * S


def _block(M):
    if common.INTERPRET:
        return min(common.next_pow2(max(M, 1)), 1 << 16)
    return 1024


def _eps(eps):
    """eps as two float32 scalars (hi, lo), hi + lo = eps to ~2^-48 relative:
    Triton passes Python floats as float32, and a float64 kernel must not add a
    float32-rounded eps (the kernel adds them one after the other to a value of its compute type)."""
    import numpy as np
    eps = float(eps)
    if not eps >= 0:
        raise ValueError(f"batch norm: eps must be >= 0, got {eps}")
    hi = float(np.float32(eps))
    return hi, float(np.float32(eps - hi))


def batchnorm_train_forward(x, gamma, beta, eps=1e-5):
    _check(x, gamma, beta)
    x = common.contiguous(x)
    y = common.empty(x.shape, x.dtype, x.device)
    C, S, M = _sizes(x)
    if C == 0 or M == 0:
        return y
    common.launch(_bn_train_fwd_kernel, (C,), x, gamma, gamma.stride(0), beta, beta.stride(0), y,
                  C, S, M, *_eps(eps), CT=common.compute_type(x.dtype), INTERP=common.INTERPRET,
                  BLOCK=_block(M))
    return y


def batchnorm_train_backward(grad, out, x, gamma, beta, eps=1e-5):
    _check(x, gamma, beta)
    x = common.contiguous(x)
    C, S, M = _sizes(x)
    dx = common.empty(x.shape, x.dtype, x.device)
    if C == 0:
        return (dx, common.empty(gamma.shape, gamma.dtype, gamma.device),
                common.empty(beta.shape, beta.dtype, beta.device))
    if M == 0:
        return (dx, common.full(gamma.shape, 0.0, gamma.dtype, gamma.device),
                common.full(beta.shape, 0.0, beta.dtype, beta.device))
    g = common.contiguous(grad)
    dgamma = common.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = common.empty(beta.shape, beta.dtype, beta.device)
    common.launch(_bn_train_bwd_kernel, (C,), g, x, gamma, gamma.stride(0), dx, dgamma, 1, dbeta, 1,
                  C, S, M, *_eps(eps), CT=common.compute_type(x.dtype), INTERP=common.INTERPRET,
                  BLOCK=_block(M))
    return dx, dgamma, dbeta


def batchnorm_test_forward(x, gamma, beta, mean, var, eps=1e-5):
    _check(x, gamma, beta, mean, var)
    x = common.contiguous(x)
    y = common.empty(x.shape, x.dtype, x.device)
    C, S, M = _sizes(x)
    if C == 0 or M == 0:
        return y
    common.launch(_bn_test_kernel, (C,), x, x, gamma, gamma.stride(0), beta, beta.stride(0),
                  mean, mean.stride(0), var, var.stride(0), y, y, 0, y, 0,
                  C, S, M, *_eps(eps), BACKWARD=False, CT=common.compute_type(x.dtype),
                  INTERP=common.INTERPRET, BLOCK=_block(M))
    return y


def batchnorm_test_backward(grad, out, x, gamma, beta, mean, var, eps=1e-5):
    _check(x, gamma, beta, mean, var)
    x = common.contiguous(x)
    C, S, M = _sizes(x)
    dx = common.empty(x.shape, x.dtype, x.device)
    if C == 0:
        return (dx, common.empty(gamma.shape, gamma.dtype, gamma.device),
                common.empty(beta.shape, beta.dtype, beta.device), None, None)
    if M == 0:
        return (dx, common.full(gamma.shape, 0.0, gamma.dtype, gamma.device),
                common.full(beta.shape, 0.0, beta.dtype, beta.device), None, None)
    g = common.contiguous(grad)
    dgamma = common.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = common.empty(beta.shape, beta.dtype, beta.device)
    common.launch(_bn_test_kernel, (C,), x, g, gamma, gamma.stride(0), beta, beta.stride(0),
                  mean, mean.stride(0), var, var.stride(0), dx, dgamma, 1, dbeta, 1,
                  C, S, M, *_eps(eps), BACKWARD=True, CT=common.compute_type(x.dtype),
                  INTERP=common.INTERPRET, BLOCK=_block(M))
    return dx, dgamma, dbeta, None, None
