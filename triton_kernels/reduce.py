"""Reductions: ``sum``, ``mean``, ``max`` over any set of axes, forward and
backward, and :func:`unbroadcast` (the adjoint of broadcasting, used by every
family whose inputs broadcast).

Design. The reduced axes are the *columns*, the kept axes the *rows* of a
logical ``(M, N)`` matrix. Neither is materialised: the kernel indexes rows and
columns through up to six merged strided dimensions each
(:func:`common.nd_offset` on 1-d index vectors, so the div/mod cost is per
row and per column, not per element), hence any axes of any (non-contiguous,
broadcast) view reduce without a copy. One program owns ``BLOCK_M`` rows and
walks its columns in ``BLOCK_N`` chunks, accumulating a ``[BLOCK_M, BLOCK_N]``
tile (float32; float64 for float64; int64 for integer sums); the tile is
reduced once at the end. When there are few rows and long columns (a full
reduction of 1e6 elements), the columns are split among several programs that
write partial results, and a second launch of the same kernel reduces those.

Semantics follow NumPy: the sum of nothing is 0, the mean of nothing NaN; the
sum of integers or booleans is int64, their mean float64; ``max`` propagates
NaN, on a GPU too (:func:`common.max_along`). ``max`` backward gives each tied
maximum an equal share of the gradient, and NaN to every entry of a row whose
maximum is NaN (``torch.amax``).
"""
import torch
import triton
import triton.language as tl

from triflux.errors import ShapeError

from . import common

OP_SUM = 0
OP_MAX = 1
OP_COUNT_EQ = 2  # count the entries equal to a per-row reference value

#: elements per tile (GPU); the interpreter takes bigger tiles
_GPU_TILE = 4096
_INTERP_TILE = 1 << 16
#: on the GPU, split long columns until about this many programs run
_TARGET_PROGRAMS = 512
#: ... but give every split at least this many columns
_MIN_CHUNK = 4096

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _reduce_kernel(x, ref, out, M, N, chunk, denom,
                   R1, R2, R3, R4, R5, RS0, RS1, RS2, RS3, RS4, RS5,
                   C1, C2, C3, C4, C5, CS0, CS1, CS2, CS3, CS4, CS5,
                   OP: tl.constexpr, XT: tl.constexpr, ACC: tl.constexpr,
                   LOWEST: tl.constexpr, IS_FLOAT: tl.constexpr, MEAN: tl.constexpr,
                   INTERP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[s, m] = reduce_{n in split s} x[m, n]   (s = program_id(1))."""
    pid_m = tl.program_id(0).to(tl.int64)
    pid_s = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    roff = common.nd_offset(rows, R1, R2, R3, R4, R5, RS0, RS1, RS2, RS3, RS4, RS5)
    n_lo = pid_s * chunk
    n_hi = tl.minimum(n_lo + chunk, N)
    if OP == 1:
        acc = tl.full([BLOCK_M, BLOCK_N], LOWEST, ACC)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    if OP == 2:
        r = tl.load(ref + rows, mask=rmask).to(XT)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        cmask = cols < n_hi
        coff = common.nd_offset(cols, C1, C2, C3, C4, C5, CS0, CS1, CS2, CS3, CS4, CS5)
        mask = rmask[:, None] & cmask[None, :]
        ptrs = x + (roff[:, None] + coff[None, :])
        if OP == 0:
            v = tl.load(ptrs, mask=mask, other=0).to(ACC)
            acc = acc + v
        elif OP == 1:
            v = tl.load(ptrs, mask=mask, other=0).to(ACC)
            v = tl.where(mask, v, LOWEST)   # (LOWEST may not fit the loaded type)
            acc = common.maximum(acc, v)
        else:
            v = tl.load(ptrs, mask=mask, other=0).to(XT)
            acc = acc + ((v == r[:, None]) & mask).to(ACC)
    if OP == 1:
        if IS_FLOAT:
            res = common.max_along(acc, 1)   # NaN-propagating (tl.max drops NaN)
        else:
            res = tl.max(acc, axis=1)
    else:
        res = tl.sum(acc, axis=1)
    if MEAN:
        res = res / denom
    tl.store(out + pid_s * M + rows, common.store_value(res, out.dtype.element_ty, INTERP), mask=rmask)


def dense_strides(mshape, strides):
    """Whether ``strides`` (from :func:`common.merge_dims`) are those of a dense
    row-major tensor of shape ``mshape``: such an input is read at the linear
    index itself, saving the div/mod of :func:`common.nd_offset`."""
    expect = 1
    for size, st in zip(reversed(mshape), reversed(strides)):
        if size != 1 and st != expect:
            return False
        expect *= size
    return True


def _value_type(dtype):
    """The type values are compared/accumulated in for max and counting."""
    if dtype in _FLOATS:
        return common.compute_type(dtype)
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
    """(BLOCK_M, BLOCK_N) for an (M, N) reduction whose innermost row and
    column strides are ``rstride`` and ``cstride``."""
    np2 = common.next_pow2
    if common.INTERPRET:
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


def _merged(sizes, strides):
    shape, (st,) = common.merge_dims(sizes, strides)
    return shape, st


def _launch_reduce(x, ref, out, M, N, rshape, rst, cshape, cst, op, xt, acc, mean_denom,
                   splits=None):
    """Reduce the logical (M, N) matrix into ``out`` (dense, M entries)."""
    bm, bn = _tiles(M, N, rst[-1], cst[-1])
    grid_m = common.cdiv(M, bm)
    if splits is None:
        splits = 1
        if not common.INTERPRET and grid_m < _TARGET_PROGRAMS and N > _MIN_CHUNK:
            splits = min(common.cdiv(N, _MIN_CHUNK), common.cdiv(_TARGET_PROGRAMS, grid_m))
    splits = max(1, min(int(splits), max(N, 1)))
    chunk = common.cdiv(max(N, 1), splits)
    chunk = common.cdiv(chunk, bn) * bn
    splits = common.cdiv(max(N, 1), chunk)
    lowest = _lowest(acc)
    is_float = acc in (tl.float32, tl.float64)
    nw = max(1, min(8, (bm * bn) // 256))  # one warp per 256 tile elements, at most 8
    if splits == 1:
        common.launch(_reduce_kernel, (grid_m, 1), x, ref if ref is not None else x, out,
                      M, N, chunk, float(mean_denom or 1.0),
                      *rshape[1:], *rst, *cshape[1:], *cst,
                      OP=op, XT=xt, ACC=acc, LOWEST=lowest, IS_FLOAT=is_float,
                      MEAN=mean_denom is not None,
                      INTERP=common.INTERPRET, BLOCK_M=bm, BLOCK_N=bn, num_warps=nw)
        return out
    # pass 1: partial results, one row of M per split, in the accumulator type
    part_dtype = {tl.float32: torch.float32, tl.float64: torch.float64,
                  tl.int32: torch.int32, tl.int64: torch.int64}[acc]
    part = common.empty((splits, M), part_dtype, x.device)
    common.launch(_reduce_kernel, (grid_m, splits), x, ref if ref is not None else x, part,
                  M, N, chunk, 1.0, *rshape[1:], *rst, *cshape[1:], *cst,
                  OP=op, XT=xt, ACC=acc, LOWEST=lowest, IS_FLOAT=is_float, MEAN=False,
                  INTERP=common.INTERPRET, BLOCK_M=bm, BLOCK_N=bn, num_warps=nw)
    # pass 2: reduce the (M, splits) matrix of partials (counts add up)
    op2 = OP_SUM if op == OP_COUNT_EQ else op
    return _launch_reduce(part, None, out, M, splits, [1] * 5 + [M], [0] * 5 + [1],
                          [1] * 5 + [splits], [0] * 5 + [M], op2, acc, acc, mean_denom,
                          splits=1)


def _normalise_axis(axis, nd):
    if axis is None:
        return tuple(range(nd))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted({int(a) % nd if nd else int(a) for a in axis}))


def _reduce(x, axis, op, out_dtype, keepdims=False, ref=None, mean=False, splits=None):
    """Reduce ``x`` over ``axis`` into a new dense tensor of ``out_dtype``."""
    shape = tuple(x.shape)
    nd = len(shape)
    axis = _normalise_axis(axis, nd)
    kept = [d for d in range(nd) if d not in axis]
    M = common.numel(shape[d] for d in kept)
    N = common.numel(shape[d] for d in axis)
    if keepdims:
        out_shape = tuple(1 if d in axis else shape[d] for d in range(nd))
    else:
        out_shape = tuple(shape[d] for d in kept)
    if M == 0:
        return common.empty(out_shape, out_dtype, x.device)
    if N == 0:
        if op == OP_MAX:
            raise ShapeError(f"max over an empty axis (shape {shape}, axis {axis}) has no value")
        return common.full(out_shape, float("nan") if mean else 0, out_dtype, x.device)
    try:
        rshape, rst = _merged([shape[d] for d in kept], [x.stride(d) for d in kept])
        cshape, cst = _merged([shape[d] for d in axis], [x.stride(d) for d in axis])
    except NotImplementedError:  # more than 6 non-mergeable dims on one side: copy first
        x = common.contiguous(x)
        rshape, rst = _merged([shape[d] for d in kept], [x.stride(d) for d in kept])
        cshape, cst = _merged([shape[d] for d in axis], [x.stride(d) for d in axis])
    xt = _value_type(x.dtype)
    if op == OP_COUNT_EQ:
        acc = tl.int32
    elif op == OP_SUM and x.dtype not in _FLOATS:
        acc = tl.float64 if mean else tl.int64
    else:
        acc = xt
    out = common.empty(out_shape, out_dtype, x.device)
    _launch_reduce(x, ref, out, M, N, rshape, rst, cshape, cst, op, xt, acc,
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
        return g if g.dtype == dtype else _reduce(g, (), OP_SUM, dtype)
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
    r = _reduce(g, axes, OP_SUM, dtype, keepdims=True)
    return r.reshape(shape)


# --- forward ---------------------------------------------------------------------------

def _sum_dtype(dtype):
    return dtype if dtype in _FLOATS else torch.int64


def _mean_dtype(dtype):
    return dtype if dtype in _FLOATS else torch.float64


def sum_forward(x, axis=None, keepdims=False):
    """Sum over ``axis`` (float32/float64 accumulation; integers and booleans
    sum to int64, as NumPy)."""
    return _reduce(x, axis, OP_SUM, _sum_dtype(x.dtype), keepdims)


def mean_forward(x, axis=None, keepdims=False):
    """Mean over ``axis``: the sum divided by the number of reduced entries
    (NaN over an empty axis; integers and booleans give float64, as NumPy)."""
    return _reduce(x, axis, OP_SUM, _mean_dtype(x.dtype), keepdims, mean=True)


def max_forward(x, axis=None, keepdims=False):
    """Maximum over ``axis`` (propagates NaN; the axis must not be empty)."""
    return _reduce(x, axis, OP_MAX, x.dtype, keepdims)


# --- backward ----------------------------------------------------------------------------

@triton.jit
def _bcast_bwd_kernel(g, x, y, cnt, out, n, denom,
                      D1, D2, D3, D4, D5,
                      GS0, GS1, GS2, GS3, GS4, GS5,
                      XS0, XS1, XS2, XS3, XS4, XS5,
                      YS0, YS1, YS2, YS3, YS4, YS5,
                      OP: tl.constexpr, CT: tl.constexpr, XT: tl.constexpr,
                      GD: tl.constexpr, XD: tl.constexpr, YD: tl.constexpr,
                      INTERP: tl.constexpr, BLOCK: tl.constexpr):
    """OP 0 (sum/mean): out = g / denom;  OP 1 (max): out = (g / count) [x == y].
    g, y and count broadcast to x's shape (y and count share strides)."""
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if GD:  # dense, not broadcast: the offset is the linear index
        go = lin
    else:
        go = common.nd_offset(lin, D1, D2, D3, D4, D5, GS0, GS1, GS2, GS3, GS4, GS5)
    gv = tl.load(g + go, mask=mask, other=0).to(CT)
    if OP == 0:
        r = gv / denom
    else:
        if XD:  # dense, not broadcast: the offset is the linear index
            xo = lin
        else:
            xo = common.nd_offset(lin, D1, D2, D3, D4, D5, XS0, XS1, XS2, XS3, XS4, XS5)
        if YD:  # dense, not broadcast: the offset is the linear index
            yo = lin
        else:
            yo = common.nd_offset(lin, D1, D2, D3, D4, D5, YS0, YS1, YS2, YS3, YS4, YS5)
        xv = tl.load(x + xo, mask=mask, other=0).to(XT)
        yv = tl.load(y + yo, mask=mask, other=0).to(XT)
        c = tl.load(cnt + yo, mask=mask, other=1).to(CT)
        r = (gv / c) * (xv == yv).to(CT)   # a NaN maximum (count 0): NaN, as torch.amax
    tl.store(out + lin, common.store_value(r, out.dtype.element_ty, INTERP), mask=mask)


def _keepdims_view(t, axis, nd):
    """``t`` (a reduction result) as a view with the reduced axes back as 1s."""
    if t.dim() == nd:
        return t
    for a in axis:
        t = t.unsqueeze(a)
    return t


def _bcast_bwd(grad, x, axis, op, denom=1.0, y=None, cnt=None):
    nd = x.dim()
    out = common.empty(x.shape, x.dtype, x.device)
    n = out.numel()
    if n == 0:
        return out
    shape = tuple(x.shape)
    g = _keepdims_view(grad, axis, nd)
    gs = common.broadcast_strides(g, shape)
    xs = tuple(x.stride())
    if y is not None:
        ys = common.broadcast_strides(y, shape)
    else:
        y, cnt, ys = x, x, xs
    mshape, (gs, xs, ys) = common.merge_dims(shape, gs, xs, ys)
    block = common.block_for(n)
    common.launch(_bcast_bwd_kernel, (common.cdiv(n, block),), grad, x, y, cnt, out, n,
                  float(denom), *mshape[1:], *gs, *xs, *ys, OP=op,
                  CT=common.compute_type(x.dtype), XT=_value_type(x.dtype),
                  GD=dense_strides(mshape, gs), XD=dense_strides(mshape, xs),
                  YD=dense_strides(mshape, ys), INTERP=common.INTERPRET, BLOCK=block)
    return out


def sum_backward(grad, out, x, axis=None, keepdims=False):
    """dx = broadcast(g) back to x's shape (no gradient for integer inputs)."""
    if x.dtype not in _FLOATS:
        return (None,)
    axis = _normalise_axis(axis, x.dim())
    return (_bcast_bwd(grad, x, axis, 0),)


def mean_backward(grad, out, x, axis=None, keepdims=False):
    """dx = broadcast(g) / N, N the number of reduced entries."""
    if x.dtype not in _FLOATS:
        return (None,)
    axis = _normalise_axis(axis, x.dim())
    N = common.numel(x.shape[a] for a in axis)
    return (_bcast_bwd(grad, x, axis, 0, denom=float(N)),)


def max_backward(grad, out, x, axis=None, keepdims=False):
    """dx = [x == max] * g / (number of entries equal to the max): tied maxima
    share the gradient equally (torch.amax)."""
    if x.dtype not in _FLOATS:
        return (None,)
    nd = x.dim()
    axis = _normalise_axis(axis, nd)
    if not axis:   # over no axes the max is the identity: dx = g (NaN entries included)
        return (common.copy_into(common.empty(x.shape, x.dtype, x.device), grad.reshape(x.shape)),)
    y = _keepdims_view(common.contiguous(out), axis, nd)
    cnt = _reduce(x, axis, OP_COUNT_EQ, torch.int32, keepdims=True, ref=y)
    return (_bcast_bwd(grad, x, axis, 1, y=y, cnt=cnt),)
