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

from triflux.specs.dropout import check_p, keep_scale
from triflux.specs.fill import check_seed

from . import indexing, launch, numerics
from .numerics import store_value


@triton.jit(do_not_specialize=["seed"])
def _dropout_kernel(input_pointer, output_pointer, n_elements, seed, p, scale_hi, scale_lo,
                    size1, size2, size3, size4, size5,
                    input_stride0, input_stride1, input_stride2, input_stride3, input_stride4,
                    input_stride5,
                    COMPUTE_TYPE: tl.constexpr, INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output[i] = input[i] * (rand(seed, i) >= p) * scale, scale = 1 / (1 - p)
    passed as the float32 pair (scale_hi, scale_lo)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    input_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, input_stride0,
                                      input_stride1, input_stride2, input_stride3, input_stride4,
                                      input_stride5)
    x = tl.load(input_pointer + input_offset, mask=mask, other=0.0).to(COMPUTE_TYPE)
    scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    keep = tl.rand(seed, index) >= p
    y = x * tl.where(keep, scale, 0.0)   # a multiplication, as torch: dropped NaN/inf give NaN
    tl.store(output_pointer + index, store_value(y, output_pointer.dtype.element_ty, INTERPRETER),
             mask=mask)


def _apply(src, p, seed, like):
    """dst[i] = src[i] * m[i] / (1 - p), dense, in ``like``'s dtype."""
    p = check_p(p)
    seed = check_seed(seed)
    out = launch.empty(like.shape, like.dtype, like.device)
    n = out.numel()
    if n == 0:
        return out
    shape = tuple(like.shape)
    sizes, (src_strides,) = indexing.merge_dims(shape, indexing.broadcast_strides(src, shape))
    block = launch.block_for(n)
    launch.launch(_dropout_kernel, (launch.cdiv(n, block),), src, out, n, seed, p,
                  *numerics.float32_pair(keep_scale(p)), *sizes[1:], *src_strides,
                  COMPUTE_TYPE=numerics.compute_type(like.dtype), INTERPRETER=launch.INTERPRET,
                  BLOCK_SIZE=block)
    return out


def dropout_forward(x, p, seed):
    return _apply(x, p, seed, x)


def dropout_backward(grad, out, x, p, seed):
    return (_apply(grad, p, seed, x),)
