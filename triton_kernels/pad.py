"""Padding (constant, reflect, replicate, symmetric, circular), Triton
kernels (forward and backward), for arrays of any rank.

Semantics are those of ``triflux.reference.pad``; the attributes, their
limits and the output shape are the family's spec (``triflux.specs.pad``),
which the reference builds too, so both sides accept and refuse the same
calls. The source index rules are computed in the kernels (``_source``),
not read from the spec's tables, so the kernel-vs-reference check tests
them.

Forward: one gather over the dense output. The host lifts x to at most
``MAX_AXES`` axes: size-1 axes left alone are dropped and neighbouring axes
left alone are merged where x's strides allow; the rest (one per padded
axis) stay. Each program splits its output indices into the 6 coordinates
(Triton specializes the size-1 leading axes, so their arithmetic folds
away), maps each through the mode's rule (a constexpr ``MODE``) and loads
x through its strides; mode constant loads only where every coordinate is
inside and stores the fill elsewhere. A negative pad needs nothing more
(the rule with lo < 0), but in mode circular, whose crop the host takes as
a view of x first. A fill is passed as the bits of a float64 (float64
data) or a float32 (other dtypes), so every value, NaN, infinities and
-0.0 included, reaches the kernel exactly. A call that does not fit in 6
axes (a non-contiguous x of many axes is first made dense) pads its padded
axes in two or more passes.

Backward, deterministic, without atomics: mode constant copies the slice of
the gradient over x (the strided copy kernel; with negative pads, a fold
that leaves the cropped inputs 0). The other modes fold the gradient one
padded axis at a time: each element i of the (dense) result along that
axis sums the few output positions p that copied it (each only if
0 <= p < m), read from the gradient (any strides) or the previous fold
(dense, in the compute dtype: float32, float64 for float64 data):

    reflect    : lo + i,  lo - i (i >= 1),  lo + 2(n-1) - i (i <= n-2)
    symmetric  : lo + i,  lo - 1 - i,  lo + 2n - 1 - i
    circular   : lo + i,  lo + i - n,  lo + i + n   (in the cropped window)
    replicate  : lo + i,  and at the edges 0..lo-1 (i == 0), lo+n..m-1 (i == n-1)

Sums run in float32 (float64 for float64 data), rounded once on the last
fold. Replicate loops over the pads (a pad of k costs k masked loads per
element of that fold): pads are short in practice.
"""
from functools import lru_cache

import numpy as np
import torch
import triton
import triton.language as tl

from . import copy, launch, numerics
from .indexing import merge_dims, nd_offset
from .numerics import store_value
from ..errors import ShapeError
from ..specs.pad import pad_spec

#: the MODE of a kernel
CONSTANT = tl.constexpr(0)
REFLECT = tl.constexpr(1)
REPLICATE = tl.constexpr(2)
SYMMETRIC = tl.constexpr(3)
CIRCULAR = tl.constexpr(4)
_MODE = {"constant": 0, "reflect": 1, "replicate": 2, "symmetric": 3, "circular": 4}

#: the forward gathers over at most this many (merged) axes
MAX_AXES = 6
_INT32 = 2 ** 31


@triton.jit
def _source(o, n, lo, MODE: tl.constexpr):
    """The input position output position ``o`` copies along an axis of n
    inputs padded by lo in front (the spec's src); mode constant: o - lo
    itself, which lies outside [0, n) in the padding."""
    i = o - lo
    if MODE == REFLECT:
        i = tl.where(i < 0, -i, i)
        i = tl.where(i >= n, 2 * n - 2 - i, i)
    elif MODE == SYMMETRIC:
        i = tl.where(i < 0, -1 - i, i)
        i = tl.where(i >= n, 2 * n - 1 - i, i)
    elif MODE == REPLICATE:
        i = tl.where(i < 0, 0, i)
        i = tl.where(i >= n, n - 1, i)
    elif MODE == CIRCULAR:
        i = tl.where(i < 0, i + n, i)
        i = tl.where(i >= n, i - n, i)
    return i


@triton.jit
def _inside(i, n):
    return (i >= 0) & (i < n)


@triton.jit
def _pad_fwd_kernel(x, y, total, out1, out2, out3, out4, out5,
                    n0, n1, n2, n3, n4, n5, lo0, lo1, lo2, lo3, lo4, lo5,
                    stride0, stride1, stride2, stride3, stride4, stride5, value_bits,
                    MODE: tl.constexpr, VALUE_F64: tl.constexpr, WIDE: tl.constexpr,
                    INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """y[o_0, ..., o_5] (dense, sizes (out0, ..., out5)) = x[src_0(o_0), ..., src_5(o_5)]
    read through x's strides; mode constant: the fill (its bits in
    ``value_bits``) wherever some src_k(o_k) is outside [0, n_k)."""
    if WIDE:
        lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    else:
        lin = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    o5 = lin % out5
    rest = lin // out5
    o4 = rest % out4
    rest = rest // out4
    o3 = rest % out3
    rest = rest // out3
    o2 = rest % out2
    rest = rest // out2
    o1 = rest % out1
    o0 = rest // out1
    i0 = _source(o0, n0, lo0, MODE)
    i1 = _source(o1, n1, lo1, MODE)
    i2 = _source(o2, n2, lo2, MODE)
    i3 = _source(o3, n3, lo3, MODE)
    i4 = _source(o4, n4, lo4, MODE)
    i5 = _source(o5, n5, lo5, MODE)
    offset = i0 * stride0 + i1 * stride1 + i2 * stride2 + i3 * stride3 + i4 * stride4 + i5 * stride5
    if MODE == CONSTANT:
        inside = (_inside(i0, n0) & _inside(i1, n1) & _inside(i2, n2) & _inside(i3, n3) & _inside(i4, n4)
                  & _inside(i5, n5))
        if VALUE_F64:
            fill = (tl.zeros((BLOCK_SIZE,), tl.int64) + value_bits).to(tl.float64, bitcast=True)
            v = tl.load(x + offset, mask=mask & inside, other=0.0).to(tl.float64)
        else:
            fill = (tl.zeros((BLOCK_SIZE,), tl.int32) + value_bits).to(tl.float32, bitcast=True)
            v = tl.load(x + offset, mask=mask & inside, other=0.0).to(tl.float32)
        tl.store(y + lin, store_value(tl.where(inside, v, fill), y.dtype.element_ty, INTERP), mask=mask)
    else:
        tl.store(y + lin, tl.load(x + offset, mask=mask), mask=mask)


@triton.jit
def _take(src, offset, p, axis_stride, ok, m, COMPUTE_TYPE: tl.constexpr):
    """src[offset + p * axis_stride] in COMPUTE_TYPE where ``ok`` and 0 <= p < m, else 0."""
    # a loop counter as a tensor, so that the comparisons give a boolean mask (Triton 3.9's interpreter)
    p = tl.zeros_like(offset) + p
    ok = ok & (p >= 0) & (p < m)
    v = tl.load(src + offset + p * axis_stride, mask=ok, other=0.0).to(COMPUTE_TYPE)
    return tl.where(ok, v, 0.0)


@triton.jit
def _fold_kernel(src, dst, total, size1, size2, size3, size4, size5,
                 stride0, stride1, stride2, stride3, stride4, stride5,
                 inner, size, start, n, lo, hi, m, axis_stride,
                 MODE: tl.constexpr, COMPUTE_TYPE: tl.constexpr, WIDE: tl.constexpr,
                 INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """The backward along one axis: dst (dense; ``size`` positions along the
    axis, ``inner`` elements per step of it) at position start + i along the
    axis (0 <= i < n: the window the rule reads, all of it but in a cropped
    circular pad) is the sum of src (m positions along the axis,
    ``axis_stride`` apart; the other axes at the same coordinates, read
    through ``stride0..5`` of the merged dst shape (size0, size1, ...,
    size5), the axis' own stride zeroed) over the output positions that
    copied input position i, padded by (lo, hi) (module docstring); 0
    outside the window."""
    if WIDE:
        lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    else:
        lin = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < total
    i = (lin // inner) % size - start
    valid = mask & (i >= 0) & (i < n)
    base = nd_offset(lin, size1, size2, size3, size4, size5, stride0, stride1, stride2, stride3, stride4, stride5)
    acc = _take(src, base, lo + i, axis_stride, valid, m, COMPUTE_TYPE)
    if MODE == REFLECT:
        acc += _take(src, base, lo - i, axis_stride, valid & (i >= 1), m, COMPUTE_TYPE)
        acc += _take(src, base, lo + 2 * n - 2 - i, axis_stride, valid & (i <= n - 2), m, COMPUTE_TYPE)
    elif MODE == SYMMETRIC:
        acc += _take(src, base, lo - 1 - i, axis_stride, valid, m, COMPUTE_TYPE)
        acc += _take(src, base, lo + 2 * n - 1 - i, axis_stride, valid, m, COMPUTE_TYPE)
    elif MODE == CIRCULAR:
        acc += _take(src, base, lo + i - n, axis_stride, valid, m, COMPUTE_TYPE)
        acc += _take(src, base, lo + i + n, axis_stride, valid, m, COMPUTE_TYPE)
    elif MODE == REPLICATE:
        first = valid & (i == 0)
        for t in range(0, lo):
            acc += _take(src, base, t, axis_stride, first, m, COMPUTE_TYPE)
        last = valid & (i == n - 1)
        for t in range(0, hi):
            acc += _take(src, base, lo + n + t, axis_stride, last, m, COMPUTE_TYPE)
    tl.store(dst + lin, store_value(acc, dst.dtype.element_ty, INTERP), mask=mask)


# --- host side -----------------------------------------------------------------------------------

def _spec(x, padding, mode, value):
    return pad_spec(tuple(x.shape), x.dtype, padding, mode, value)


def _extent(shape, strides):
    """The largest element offset a view of ``shape`` and ``strides`` reaches (+1)."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides) if s > 0)


@lru_cache(maxsize=2048)
def _gather_axes(shape, strides, pairs):
    """x lifted to the forward's axes: [(n, lo, hi, stride)] without the
    size-1 axes left alone, neighbours left alone merged where x's strides
    allow (the output is dense, so its neighbours always merge)."""
    axes = []
    for n, (lo, hi), st in zip(shape, pairs, strides):
        if n == 1 and lo == 0 and hi == 0:
            continue
        if axes and lo == hi == 0:
            pn, plo, phi, pst = axes[-1]
            if plo == phi == 0 and pst == st * n:
                axes[-1] = (pn * n, 0, 0, st)
                continue
        axes.append((n, lo, hi, st))
    return tuple(axes)


def _copy_dense(dst, src):
    """dst (dense) = src (any strides): the copy kernel, one launch per index
    of the leading axis while src has more axes that do not merge than it takes."""
    try:
        return copy.copy_into(dst, src)
    except NotImplementedError:
        for j in range(src.shape[0]):
            _copy_dense(dst[j], src[j])
        return dst


def _value_bits(value, f64):
    """The fill's bits: a float64's as an int64 (float64 data), else a float32's as an int32
    (not cached: -0.0 == 0.0 would share an entry)."""
    return int(np.float64(value).view(np.int64)) if f64 else int(np.float32(value).view(np.int32))


def _gather(x, pairs, spec):
    """x padded by ``pairs`` (a (lo, hi) per axis) in the spec's mode and fill."""
    shape = tuple(x.shape)
    out_shape = tuple(lo + n + hi for n, (lo, hi) in zip(shape, pairs))
    y = launch.empty(out_shape, x.dtype, x.device)
    total = y.numel()
    if total == 0:
        return y
    axes = _gather_axes(shape, tuple(x.stride()), tuple(pairs))
    if len(axes) > MAX_AXES:
        if not x.is_contiguous():
            return _gather(_copy_dense(launch.empty(shape, x.dtype, x.device), x), pairs, spec)
        padded = [k for k, (lo, hi) in enumerate(pairs) if lo or hi]
        cut = padded[len(padded) // 2]          # the first half of the padded axes first, then the rest
        first = [p if k < cut else (0, 0) for k, p in enumerate(pairs)]
        rest = [(0, 0) if k < cut else p for k, p in enumerate(pairs)]
        return _gather(_gather(x, first, spec), rest, spec)
    axes = ((1, 0, 0, 0),) * (MAX_AXES - len(axes)) + axes
    outs = [lo + n + hi for n, lo, hi, _ in axes]
    wide = total >= _INT32 or _extent([n for n, *_ in axes], [st for *_, st in axes]) >= _INT32
    bits = _value_bits(spec.value, x.dtype == torch.float64)
    block = launch.block_for(total)
    launch.launch(_pad_fwd_kernel, (launch.cdiv(total, block),), x, y, total, *outs[1:],
                  *[a[0] for a in axes], *[a[1] for a in axes], *[a[3] for a in axes], bits,
                  MODE=_MODE[spec.mode], VALUE_F64=x.dtype == torch.float64, WIDE=wide,
                  INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return y


@lru_cache(maxsize=2048)
def _fold_plan(dst_shape, src_strides, k):
    """(merged dst sizes after the first, merged src strides with axis k's
    zeroed, elements per step along axis k) of a fold along axis k."""
    strides = list(src_strides)
    strides[k] = 0
    dense = [1] * len(dst_shape)
    for j in range(len(dst_shape) - 2, -1, -1):
        dense[j] = dense[j + 1] * dst_shape[j + 1]
    sizes, (_, merged) = merge_dims(dst_shape, dense, strides)
    return tuple(sizes[1:]), tuple(merged), dense[k]


def _fold(src, dst, k, axis, mode):
    """One fold of the backward (module docstring): dst from src along axis k."""
    total = dst.numel()
    dst_shape = tuple(dst.shape)
    try:
        sizes, strides, inner = _fold_plan(dst_shape, tuple(src.stride()), k)
    except NotImplementedError:              # more than 6 axes that do not merge: read a dense copy
        src = _copy_dense(launch.empty(tuple(src.shape), src.dtype, src.device), src)
        sizes, strides, inner = _fold_plan(dst_shape, tuple(src.stride()), k)
    wide = total >= _INT32 or _extent(tuple(src.shape), tuple(src.stride())) >= _INT32
    block = launch.block_for(total)
    launch.launch(_fold_kernel, (launch.cdiv(total, block),), src, dst, total, *sizes, *strides, inner,
                  axis.size, axis.start, axis.window, axis.before, axis.after, axis.out, src.stride(k),
                  MODE=_MODE[mode],
                  COMPUTE_TYPE=numerics.compute_type(dst.dtype), WIDE=wide, INTERP=launch.INTERPRET,
                  BLOCK_SIZE=block)
    return dst


def _backward(grad, x, spec):
    if tuple(grad.shape) != spec.out_shape:
        raise ShapeError(f"pad: gradient of shape {tuple(grad.shape)}, expected the output's {spec.out_shape}")
    dx = launch.empty(x.shape, x.dtype, x.device)
    if dx.numel() == 0:
        return dx
    axes = spec.padded_axes
    cropped = min(spec.padding, default=0) < 0
    if (spec.mode == "constant" and not cropped) or not axes:   # the slice of the gradient over x
        offset = sum(a.lo * st for a, st in zip(spec.axes, grad.stride()))
        try:
            return copy.copy_into(dx, grad, src_strides=tuple(grad.stride()), src_offset=offset, shape=spec.x_shape)
        except NotImplementedError:          # more than 6 axes that do not merge: fold axis by axis
            if not axes:
                return _copy_dense(dx, grad)
    acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    shape = list(spec.out_shape)
    src = grad
    for j, k in enumerate(axes):
        shape[k] = spec.x_shape[k]
        dst = dx if j == len(axes) - 1 else launch.empty(tuple(shape), acc_dtype, x.device)
        src = _fold(src, dst, k, spec.axes[k], spec.mode)
    return dx


def pad_forward(x, *, padding, mode="constant", value=0.0):
    spec = _spec(x, padding, mode, value)
    if spec.mode == "circular" and min(spec.padding) < 0:     # crop first (a view), then wrap
        x = x[tuple(slice(a.start, a.start + a.window) for a in spec.axes)]
    return _gather(x, tuple((a.before, a.after) for a in spec.axes), spec)


def pad_backward(grad, out, x, *, padding, mode="constant", value=0.0):
    return (_backward(grad, x, _spec(x, padding, mode, value)),)
