"""Reductions: ``sum``, ``mean``, ``max`` over any set of axes, forward and
backward, and :func:`unbroadcast` (the adjoint of broadcasting, used by every
family whose inputs broadcast).

Design. The reduced axes are the *columns*, the kept axes the *rows* of a
logical ``(M, N)`` matrix. Neither is materialised: the kernel indexes rows and
columns through up to six merged strided dimensions each
(:func:`indexing.nd_offset` on 1-d index vectors, so the div/mod cost is per
row and per column, not per element), hence any axes of any (non-contiguous,
broadcast) view reduce without a copy. One program owns ``BLOCK_SIZE_M`` rows
and walks its columns in ``BLOCK_SIZE_N`` chunks, accumulating such a
tile (float32; float64 for float64; int64 for integer sums); the tile is
reduced once at the end. When there are few rows and long columns (a full
reduction of 1e6 elements), the columns are split among several programs that
write partial results, and a second launch of the same kernel reduces those:
on a GPU as many splits as fill its SMs by the wave model
(:func:`splits_for_waves`, which BatchNorm's statistics use too).

Semantics follow NumPy: the sum of nothing is 0, the mean of nothing NaN; the
sum of integers or booleans is int64, their mean float64; ``max`` propagates
NaN, on a GPU too (:func:`numerics.max_along`). ``max`` backward gives each tied
maximum an equal share of the gradient, and NaN to every entry of a row whose
maximum is NaN (``torch.amax``).
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from triflux.dtypes import to_torch
from triflux.errors import ShapeError
from triflux.specs.reduce import reduce_spec

from . import copy, indexing, launch, numerics

#: what a reduction computes (constexpr OP); the host compares them with ``is``
#: (``==`` on constexprs builds constexpr objects, slowly)
REDUCE_SUM = tl.constexpr(0)
REDUCE_MAX = tl.constexpr(1)
#: count the entries equal to a per-row reference value (max's ties)
REDUCE_COUNT_EQUAL = tl.constexpr(2)

#: elements per tile (GPU); the interpreter takes bigger tiles
_GPU_TILE = 4096
_INTERP_TILE = 1 << 16
#: the most registers per thread _reduce_kernel takes on a GPU, for the wave model
#: (``python -m triflux kernels``: at most 56 for sm_90 and sm_80 in the UNet and demo steps)
_GPU_REGISTERS = 64
#: on the GPU, give every split of long columns at least this many columns
_MIN_CHUNK = 4096
#: splits_for_waves looks at grids of at most this many rounds of the GPU
_MAX_ROUNDS = 4

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _reduce_kernel(x, reference_values, out, M, N, split_size, denominator,
                   row_size1, row_size2, row_size3, row_size4, row_size5,
                   row_stride0, row_stride1, row_stride2, row_stride3, row_stride4, row_stride5,
                   col_size1, col_size2, col_size3, col_size4, col_size5,
                   col_stride0, col_stride1, col_stride2, col_stride3, col_stride4, col_stride5,
                   OP: tl.constexpr, VALUE_TYPE: tl.constexpr, ACC_TYPE: tl.constexpr,
                   LOWEST: tl.constexpr, IS_FLOAT: tl.constexpr, MEAN: tl.constexpr,
                   INTERP: tl.constexpr,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """out[s, m] = reduce over the columns n of split s of x[m, n]
    (s = program_id(1); a split is ``split_size`` columns). Rows and columns
    are read through up to six merged (size, stride) dimensions each; MEAN
    divides by ``denominator``; REDUCE_COUNT_EQUAL counts x[m, n] ==
    reference_values[m]."""
    pid_m = tl.program_id(0).to(tl.int64)
    pid_split = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rows_mask = rows < M
    row_offsets = indexing.nd_offset(rows, row_size1, row_size2, row_size3, row_size4, row_size5,
                                     row_stride0, row_stride1, row_stride2, row_stride3, row_stride4, row_stride5)
    n_lo = pid_split * split_size
    n_hi = tl.minimum(n_lo + split_size, N)
    if OP == REDUCE_MAX:
        acc = tl.full([BLOCK_SIZE_M, BLOCK_SIZE_N], LOWEST, ACC_TYPE)
    else:
        acc = tl.zeros([BLOCK_SIZE_M, BLOCK_SIZE_N], ACC_TYPE)
    if OP == REDUCE_COUNT_EQUAL:
        r = tl.load(reference_values + rows, mask=rows_mask).to(VALUE_TYPE)
    for n0 in range(n_lo, n_hi, BLOCK_SIZE_N):
        cols = n0 + tl.arange(0, BLOCK_SIZE_N)
        cols_mask = cols < n_hi
        col_offsets = indexing.nd_offset(cols, col_size1, col_size2, col_size3, col_size4, col_size5,
                                         col_stride0, col_stride1, col_stride2, col_stride3, col_stride4,
                                         col_stride5)
        mask = rows_mask[:, None] & cols_mask[None, :]
        ptrs = x + (row_offsets[:, None] + col_offsets[None, :])
        if OP == REDUCE_SUM:
            v = tl.load(ptrs, mask=mask, other=0).to(ACC_TYPE)
            acc = acc + v
        elif OP == REDUCE_MAX:
            v = tl.load(ptrs, mask=mask, other=0).to(ACC_TYPE)
            v = tl.where(mask, v, LOWEST)   # (LOWEST may not fit the loaded type)
            acc = numerics.maximum(acc, v)
        else:
            v = tl.load(ptrs, mask=mask, other=0).to(VALUE_TYPE)
            acc = acc + ((v == r[:, None]) & mask).to(ACC_TYPE)
    if OP == REDUCE_MAX:
        if IS_FLOAT:
            res = numerics.max_along(acc, 1)   # NaN-propagating (tl.max drops NaN)
        else:
            res = tl.max(acc, axis=1)
    else:
        res = tl.sum(acc, axis=1)
    if MEAN:
        res = res / denominator
    tl.store(out + pid_split * M + rows, numerics.store_value(res, out.dtype.element_ty, INTERP), mask=rows_mask)


def _value_type(dtype):
    """The type values are compared/accumulated in for max and counting."""
    if dtype in _FLOATS:
        return numerics.compute_type(dtype)
    if dtype == torch.bool:
        return tl.int32
    return tl.int64


def _lowest(acc):
    if acc in (tl.float32, tl.float64):
        return float("-inf")
    if acc == tl.int32:
        return -2 ** 31
    return -2 ** 63


def _tiles(M, N, rstride, cstride):
    """(BLOCK_SIZE_M, BLOCK_SIZE_N) for an (M, N) reduction whose innermost
    row and column strides are ``rstride`` and ``cstride``."""
    np2 = launch.next_pow2
    if launch.INTERPRET:
        bn = min(np2(N), _INTERP_TILE)
        bm = min(np2(M), max(1, _INTERP_TILE // bn))
        return bm, bn
    if cstride == 1 or M == 1:
        # columns contiguous (the usual trailing-axis case), or a single row:
        # long column chunks, as many rows as fit in the tile
        bn = min(np2(N), 1024)
        bm = min(np2(M), max(1, _GPU_TILE // bn))
    elif rstride == 1:
        # rows contiguous (reduction over a leading axis): coalesce along rows
        bm = min(np2(M), 256)
        bn = min(np2(N), max(1, _GPU_TILE // bm))
    else:
        bn = min(np2(N), 64)
        bm = min(np2(M), max(1, _GPU_TILE // bn))
    return bm, bn


def splits_for_waves(rows, units, max_splits, num_warps, registers, sms, tolerance=1.02):
    """How many programs share the ``units`` work units of each of ``rows``
    rows (a reduction's column blocks, a BatchNorm channel's tiles) on a GPU
    of ``sms`` SMs: the fewest splits, at most ``max_splits``, whose grid
    runs within ``tolerance`` of the fastest by the wave model. s splits make
    rows * s programs of ceil(units / s) units; a launch takes whole rounds
    of the GPU (:func:`launch.wave_efficiency` of programs of ``num_warps``
    warps and ``registers`` registers), each as long as a program's units.
    Fewer splits win ties (``tolerance``: float rounding): every split adds
    partial results to combine.
    Grids of more than ``_MAX_ROUNDS`` rounds are not considered."""
    if rows < 1 or units < 1:
        return 1
    per_round = round(1 / launch.wave_efficiency(1, num_warps, registers, sms))   # programs a round runs
    candidates = range(1, max(1, min(max_splits, units, launch.cdiv(_MAX_ROUNDS * per_round, rows))) + 1)
    times = []
    for splits in candidates:
        per_program = launch.cdiv(units, splits)
        programs = rows * launch.cdiv(units, per_program)
        times.append(programs / launch.wave_efficiency(programs, num_warps, registers, sms) * per_program)
    return next(s for s, t in zip(candidates, times) if t <= min(times) * tolerance)


def _merged(sizes, strides):
    shape, (st,) = indexing.merge_dims(sizes, strides)
    return tuple(shape), tuple(st)


@lru_cache(maxsize=4096)
def _reduce_grid(M, N, rstride, cstride, acc, splits, sms):
    """(BLOCK_SIZE_M, BLOCK_SIZE_N, programs along M, splits along N, the
    columns of a split, LOWEST, IS_FLOAT, num_warps) of an (M, N) reduction
    (``splits`` None: on a GPU of ``sms`` SMs, :func:`splits_for_waves` of
    the column blocks, each split ``_MIN_CHUNK`` columns or more)."""
    bm, bn = _tiles(M, N, rstride, cstride)
    grid_m = launch.cdiv(M, bm)
    nw = max(1, min(8, (bm * bn) // 256))  # one warp per 256 tile elements, at most 8
    if splits is None:
        splits = 1
        if not launch.INTERPRET and N > _MIN_CHUNK:
            splits = splits_for_waves(grid_m, launch.cdiv(N, bn), launch.cdiv(N, _MIN_CHUNK), nw, _GPU_REGISTERS,
                                      sms)
    splits = max(1, min(int(splits), max(N, 1)))
    chunk = launch.cdiv(max(N, 1), splits)
    chunk = launch.cdiv(chunk, bn) * bn
    splits = launch.cdiv(max(N, 1), chunk)
    return bm, bn, grid_m, splits, chunk, _lowest(acc), acc in (tl.float32, tl.float64), nw


@lru_cache(maxsize=4096)
def _reduce_layout(shape, strides, axes, kept):
    """The merged (sizes, strides) of the kept axes (rows) and of the reduced
    axes (columns) of a tensor of ``shape`` and ``strides``; None when either
    side has more than six dimensions that do not merge."""
    try:
        return (_merged([shape[d] for d in kept], [strides[d] for d in kept])
                + _merged([shape[d] for d in axes], [strides[d] for d in axes]))
    except NotImplementedError:
        return None


def _launch_reduce(x, reference_values, out, M, N, rshape, rst, cshape, cst, op, xt, acc, mean_denom,
                   splits=None):
    """Reduce the logical (M, N) matrix into ``out`` (dense, M entries)."""
    bm, bn, grid_m, splits, chunk, lowest, is_float, nw = _reduce_grid(M, N, rst[-1], cst[-1], acc, splits,
                                                                       launch.sm_count(x.get_device()))
    if reference_values is None:
        reference_values = x
    if splits == 1:
        launch.launch(_reduce_kernel, (grid_m, 1), x, reference_values, out,
                      M, N, chunk, float(mean_denom or 1.0),
                      *rshape[1:], *rst, *cshape[1:], *cst,
                      OP=op.value, VALUE_TYPE=xt, ACC_TYPE=acc, LOWEST=lowest, IS_FLOAT=is_float,
                      MEAN=mean_denom is not None,
                      INTERP=launch.INTERPRET, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, num_warps=nw)
        return out
    # pass 1: partial results, one row of M per split, in the accumulator type
    part_dtype = {tl.float32: torch.float32, tl.float64: torch.float64,
                  tl.int32: torch.int32, tl.int64: torch.int64}[acc]
    part = launch.empty((splits, M), part_dtype, x.device)
    launch.launch(_reduce_kernel, (grid_m, splits), x, reference_values, part,
                  M, N, chunk, 1.0, *rshape[1:], *rst, *cshape[1:], *cst,
                  OP=op.value, VALUE_TYPE=xt, ACC_TYPE=acc, LOWEST=lowest, IS_FLOAT=is_float, MEAN=False,
                  INTERP=launch.INTERPRET, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, num_warps=nw)
    # pass 2: reduce the (M, splits) matrix of partials (counts add up)
    op2 = REDUCE_SUM if op is REDUCE_COUNT_EQUAL else op
    return _launch_reduce(part, None, out, M, splits, [1] * 5 + [M], [0] * 5 + [1],
                          [1] * 5 + [splits], [0] * 5 + [M], op2, acc, acc, mean_denom,
                          splits=1)


def _reduce(x, axis, op, out_dtype=None, keepdims=False, reference_values=None, mean=False, splits=None):
    """Reduce ``x`` over ``axis`` (``op``: REDUCE_SUM, with ``mean`` the mean,
    REDUCE_MAX or REDUCE_COUNT_EQUAL) into a new dense tensor of ``out_dtype``
    (default: the spec's)."""
    primitive = "max" if op is REDUCE_MAX else "mean" if mean else "sum"
    spec = reduce_spec(primitive, x.shape, x.dtype, axis, keepdims)
    out_dtype = to_torch(spec.out_dtype) if out_dtype is None else out_dtype
    shape, axes, kept = spec.x_shape, spec.axes, spec.kept_axes
    M, N = spec.rows, spec.count
    if M == 0:
        return launch.empty(spec.out_shape, out_dtype, x.device)
    if N == 0:
        return copy.full(spec.out_shape, float("nan") if mean else 0, out_dtype, x.device)
    layout = _reduce_layout(shape, x.stride(), axes, kept)
    if layout is None:  # more than 6 non-mergeable dims on one side: copy first
        x = copy.contiguous(x)
        layout = _reduce_layout(shape, x.stride(), axes, kept)
    rshape, rst, cshape, cst = layout
    xt = _value_type(x.dtype)
    if op is REDUCE_COUNT_EQUAL:
        acc = tl.int32
    elif op is REDUCE_SUM and x.dtype not in _FLOATS:
        acc = tl.float64 if mean else tl.int64
    else:
        acc = xt
    out = launch.empty(spec.out_shape, out_dtype, x.device)
    _launch_reduce(x, reference_values, out, M, N, rshape, rst, cshape, cst, op, xt, acc,
                   float(N) if mean else None, splits=splits)
    return out


# --- unbroadcast (shared with other families) -----------------------------------------

def unbroadcast(g, shape, dtype=None):
    """Sum ``g`` over the axes that broadcasting added or stretched so that it
    has ``shape``: the adjoint of ``broadcast_to(x, g.shape)``. Returns ``g``
    itself when it already has that shape (and dtype). ``dtype``: the torch
    dtype of the result (default ``g.dtype``); the sum accumulates in float32
    (float64 for float64, int64 for integers) whatever it is."""
    shape = tuple(int(s) for s in shape)
    dtype = g.dtype if dtype is None else dtype
    if tuple(g.shape) == shape:
        return g if g.dtype == dtype else _reduce(g, (), REDUCE_SUM, dtype)
    lead = g.dim() - len(shape)
    if lead < 0 and all(s == 1 for s in shape[:-lead]):   # shape has extra leading 1s
        g = g.reshape((1,) * -lead + tuple(g.shape))
        lead = 0
    if lead < 0:
        raise ShapeError(f"cannot unbroadcast a gradient of shape {tuple(g.shape)} to {shape}")
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    for i, s in enumerate(shape):
        if s != 1 and g.shape[lead + i] != s:
            raise ShapeError(f"cannot unbroadcast a gradient of shape {tuple(g.shape)} to {shape}")
    # (with no axes to sum, the reduction is a converting copy)
    r = _reduce(g, axes, REDUCE_SUM, dtype, keepdims=True)
    return r.reshape(shape)


# --- forward ---------------------------------------------------------------------------

def sum_forward(x, axis=None, keepdims=False):
    """Sum over ``axis`` (float32/float64 accumulation; integers and booleans
    sum to int64, as NumPy)."""
    return _reduce(x, axis, REDUCE_SUM, keepdims=keepdims)


def mean_forward(x, axis=None, keepdims=False):
    """Mean over ``axis``: the sum divided by the number of reduced entries
    (NaN over an empty axis; integers and booleans give float64, as NumPy)."""
    return _reduce(x, axis, REDUCE_SUM, keepdims=keepdims, mean=True)


def max_forward(x, axis=None, keepdims=False):
    """Maximum over ``axis`` (propagates NaN; the axis must not be empty)."""
    return _reduce(x, axis, REDUCE_MAX, keepdims=keepdims)


# --- backward ----------------------------------------------------------------------------

@triton.jit
def _broadcast_backward_kernel(grad, x, y, count, out, n, denominator,
                               size1, size2, size3, size4, size5,
                               grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                               x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                               y_stride0, y_stride1, y_stride2, y_stride3, y_stride4, y_stride5,
                               OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, VALUE_TYPE: tl.constexpr,
                               GRAD_DENSE: tl.constexpr, X_DENSE: tl.constexpr, Y_DENSE: tl.constexpr,
                               INTERP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """REDUCE_SUM (sum and mean): out = g / denominator; REDUCE_MAX:
    out = (g / count) [x == y]. g, y and count broadcast to x's shape (y and
    count share strides); a *_DENSE input is read at the linear index."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = lin < n
    if GRAD_DENSE:
        grad_offsets = lin
    else:
        grad_offsets = indexing.nd_offset(lin, size1, size2, size3, size4, size5, grad_stride0, grad_stride1,
                                          grad_stride2, grad_stride3, grad_stride4, grad_stride5)
    g = tl.load(grad + grad_offsets, mask=mask, other=0).to(COMPUTE_TYPE)
    if OP == REDUCE_SUM:
        r = g / denominator
    else:
        if X_DENSE:
            x_offsets = lin
        else:
            x_offsets = indexing.nd_offset(lin, size1, size2, size3, size4, size5,
                                           x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5)
        if Y_DENSE:
            y_offsets = lin
        else:
            y_offsets = indexing.nd_offset(lin, size1, size2, size3, size4, size5,
                                           y_stride0, y_stride1, y_stride2, y_stride3, y_stride4, y_stride5)
        xv = tl.load(x + x_offsets, mask=mask, other=0).to(VALUE_TYPE)
        yv = tl.load(y + y_offsets, mask=mask, other=0).to(VALUE_TYPE)
        c = tl.load(count + y_offsets, mask=mask, other=1).to(COMPUTE_TYPE)
        r = (g / c) * (xv == yv).to(COMPUTE_TYPE)   # a NaN maximum (count 0): NaN, as torch.amax
    tl.store(out + lin, numerics.store_value(r, out.dtype.element_ty, INTERP), mask=mask)


def _keepdims_view(t, axes, nd):
    """``t`` (a reduction result) as a view with the reduced axes back as 1s."""
    if t.dim() == nd:
        return t
    for a in axes:
        t = t.unsqueeze(a)
    return t


def _broadcast_backward(grad, x, axes, op, denominator=1.0, y=None, count=None):
    nd = x.dim()
    out = launch.empty(x.shape, x.dtype, x.device)
    n = out.numel()
    if n == 0:
        return out
    shape = tuple(x.shape)
    g = _keepdims_view(grad, axes, nd)
    gs = indexing.broadcast_strides(g, shape)
    xs = tuple(x.stride())
    if y is not None:
        ys = indexing.broadcast_strides(y, shape)
    else:
        y, count, ys = x, x, xs
    mshape, (gs, xs, ys) = indexing.merge_dims(shape, gs, xs, ys)
    block = launch.block_for(n)
    launch.launch(_broadcast_backward_kernel, (launch.cdiv(n, block),), grad, x, y, count, out, n,
                  float(denominator), *mshape[1:], *gs, *xs, *ys, OP=op.value,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), VALUE_TYPE=_value_type(x.dtype),
                  GRAD_DENSE=indexing.dense_strides(mshape, gs), X_DENSE=indexing.dense_strides(mshape, xs),
                  Y_DENSE=indexing.dense_strides(mshape, ys), INTERP=launch.INTERPRET, BLOCK_SIZE=block)
    return out


def sum_backward(grad, out, x, axis=None, keepdims=False):
    """dx = broadcast(g) back to x's shape (no gradient for integer inputs)."""
    if x.dtype not in _FLOATS:
        return (None,)
    spec = reduce_spec("sum", x.shape, x.dtype, axis, keepdims)
    return (_broadcast_backward(grad, x, spec.axes, REDUCE_SUM),)


def mean_backward(grad, out, x, axis=None, keepdims=False):
    """dx = broadcast(g) / N, N the number of reduced entries."""
    if x.dtype not in _FLOATS:
        return (None,)
    spec = reduce_spec("mean", x.shape, x.dtype, axis, keepdims)
    return (_broadcast_backward(grad, x, spec.axes, REDUCE_SUM, denominator=float(spec.count)),)


def max_backward(grad, out, x, axis=None, keepdims=False):
    """dx = [x == max] * g / (number of entries equal to the max): tied maxima
    share the gradient equally (torch.amax)."""
    if x.dtype not in _FLOATS:
        return (None,)
    spec = reduce_spec("max", x.shape, x.dtype, axis, keepdims)
    if not spec.axes:   # over no axes the max is the identity: dx = g (NaN entries included)
        return (copy.copy_into(launch.empty(x.shape, x.dtype, x.device), grad.reshape(x.shape)),)
    y = _keepdims_view(copy.contiguous(out), spec.axes, x.dim())
    count = _reduce(x, spec.axes, REDUCE_COUNT_EQUAL, torch.int32, keepdims=True, reference_values=y)
    return (_broadcast_backward(grad, x, spec.axes, REDUCE_MAX, y=y, count=count),)
