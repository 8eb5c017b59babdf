"""Dropout, Triton kernel.

y = x * m / (1 - p) with m[i] = (tl.rand(seed, i) >= p): Triton's Philox
generator keyed by the seed and the element's row-major linear index i, so
the mask is a function of (seed, i) only. The backward redraws the same mask
from the seed (nothing is stored): dx = dropout(g), the same kernel applied
to the gradient. p = 1 drops everything (scale 0, no division by zero). The
mask multiplies, as in torch: a dropped NaN or infinity gives NaN.

The NumPy reference draws its mask with ``np.random.default_rng(seed)``: same
distribution, different numbers, so kernel and reference are compared by
their statistics, not elementwise. Inputs are read through their strides
(any view); outputs are dense.
"""
import triton
import triton.language as tl

from . import common
from .common import nd_offset, store_value
from triflux.reference.dropout import _check_p, _scale
from triflux.reference.fill import check_seed


@triton.jit(do_not_specialize=["seed"])
def _dropout_kernel(src, dst, n, seed, p, scale_hi, scale_lo,
                    D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5,
                    CT: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    off = nd_offset(lin, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5)
    v = tl.load(src + off, mask=mask, other=0.0).to(CT)
    if CT == tl.float64:
        scale = tl.cast(scale_hi, tl.float64) + tl.cast(scale_lo, tl.float64)
    else:
        scale = scale_hi
    keep = tl.rand(seed, lin) >= p
    out = v * tl.where(keep, scale, 0.0)   # a multiplication, as torch: dropped NaN/inf give NaN
    tl.store(dst + lin, store_value(out, dst.dtype.element_ty, INTERP), mask=mask)


def _split(v):
    """v as two float32 values hi + lo (Triton passes Python floats as float32;
    a float64 kernel adds them in float64, keeping ~48 bits of 1 / (1 - p))."""
    import numpy as np
    hi = float(np.float32(v))
    return hi, float(np.float32(v - hi))


def _apply(src, p, seed, like):
    """dst[i] = src[i] * m[i] / (1 - p), dense, in ``like``'s dtype."""
    p = _check_p(p)
    seed = check_seed(seed)
    out = common.empty(like.shape, like.dtype, like.device)
    n = out.numel()
    if n == 0:
        return out
    shape, (strides,) = common.merge_dims(tuple(like.shape), common.broadcast_strides(src, tuple(like.shape)))
    block = common.block_for(n)
    common.launch(_dropout_kernel, (common.cdiv(n, block),), src, out, n, seed, p, *_split(_scale(p)),
                  *shape[1:], *strides, CT=common.compute_type(like.dtype),
                  INTERP=common.INTERPRET, BLOCK=block)
    return out


def dropout_forward(x, p, seed):
    return _apply(x, p, seed, x)


def dropout_backward(grad, out, x, p, seed):
    return (_apply(grad, p, seed, x),)
