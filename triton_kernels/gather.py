"""Gather family, Triton kernels: gather, scatter, embedding, embedding_bag.

The table, the index forms and the shapes are ``triflux/specs/gather.py``'s;
the math is ``reference/gather.py``'s. Every tensor of values is read as a
matrix of rows: the table (rows x row_size) and the entries (n x row_size),
through two strides where the layout allows (:func:`_matrix`), else after a
dense copy. Index tensors are made dense first.

Checking the indices. Before any kernel reads the table, one launch
(``_index_scan_kernel``) takes the least and largest value of every
coordinate, per program, into a small buffer the host reads back; the spec
then raises ``IndexRangeError`` naming the valid range. The buffer is first
filled from the host with values that pass the check, so a launch that does
not run (the kernel report's recording) checks nothing rather than garbage.
The kernels also mask every load at a row outside the table, so no launch
reads other memory even without the check. embedding_bag's offsets are
copied to the host and checked there (``EmbeddingBagSpec.check_offsets``).
These reads make the host wait for the device once per call (and make a
step that uses them one ``triflux.capture`` runs eagerly: a replay would
skip the check).

Deterministic accumulation of repeated indices. A gather's backward and a
scatter's forward add (or multiply, ...) many entries into one row. No
atomics: the entries are put in order of their row with a stable LSD radix
sort of the linear rows (``RADIX_BITS`` bits per pass, three launches per
pass: per-block digit counts, one ordered exclusive scan, the stable
scatter: ranks within a block by a cumulative sum), then a binary search
finds where each row's group starts (``_row_starts_kernel``), and
``_segment_reduce_kernel`` gives each program a block of rows, each row
combined over its group in a sequential loop, in ascending entry order: the
order the reference uses, so the result is the same on every run and on
every tiling, and its sums and extremes are bit for bit the reference's (in
float32 and float64; a product may be fused into an FMA on a GPU). The same sorted
groups drive the scatter's backward (``_scatter_spread_kernel``: each entry
written once) and embedding_bag's weight gradient. A very long group (one
row repeated by most entries) is one program's loop: correct, but it
serialises that row.

Accumulation in float32 for 16-bit values (float64 stays float64), rounded
once on the store (``numerics.store_value``).
"""
import functools

import numpy as np
import torch
import triton
import triton.language as tl

from triflux import recording

from . import copy, launch, numerics
from .numerics import store_value
from ..specs.gather import (MAX_COORDS, SCATTER_INIT, embedding_bag_spec, embedding_spec, gather_spec,
                            scatter_spec)

#: scatter's reductions, as the kernels' OP constexpr
OP_ADD = tl.constexpr(0)
OP_MUL = tl.constexpr(1)
OP_MAX = tl.constexpr(2)
OP_MIN = tl.constexpr(3)
OP_MEAN = tl.constexpr(4)
_OP_CODES = {"add": OP_ADD.value, "mul": OP_MUL.value, "max": OP_MAX.value, "min": OP_MIN.value,
             "mean": OP_MEAN.value}

#: what an entry of embedding_bag contributes (the BAG_MODE constexpr)
BAG_SUM = tl.constexpr(0)
BAG_WEIGHTED = tl.constexpr(1)
BAG_MEAN = tl.constexpr(2)
BAG_MAX = tl.constexpr(3)

#: bits of the row sorted per radix pass, and the digits they make
RADIX_BITS = 4
RADIX = tl.constexpr(1 << RADIX_BITS)

#: values per tile of the row kernels on a GPU (a thread holds 8 of them in 4 warps; smaller tiles take fewer warps)
_GPU_TILE = 1024
#: the widest block along a row on a GPU
_GPU_ROW_BLOCK = 256
#: entries per block of the sort and the index scan on a GPU
_GPU_SORT_BLOCK = 1024
#: on a GPU, the most programs of the index scan (each loops over its blocks)
_GPU_SCAN_PROGRAMS = 512
#: values per tile at most in the interpreter (NumPy vectorises inside a program)
_INTERP_TILE = 1 << 14
_INTERP_SORT_BLOCK = 1 << 16

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


# --- jitted pieces ------------------------------------------------------------------------------

@triton.jit
def _coordinate(idx, e, emask, m: tl.constexpr, M: tl.constexpr, size, row, ok):
    """Fold coordinate m of entries e into the linear row (Horner) and the
    in-range flag."""
    c = tl.load(idx + e * M + m, mask=emask, other=0).to(tl.int64)
    return row * size + c, ok & (c >= 0) & (c < size)


@triton.jit
def _entry_row(idx, e, emask, M: tl.constexpr, n0, n1, n2, n3, n4, n5, n6, n7):
    """The linear row (int64) of entries e of a dense (n, M) index into a
    table of sides (n0, ..., n_{M-1}), and whether every coordinate lies
    inside the table (loads elsewhere are masked: never a read of other memory)."""
    row = tl.zeros(e.shape, tl.int64)
    ok = emask
    row, ok = _coordinate(idx, e, emask, 0, M, n0, row, ok)
    if M > 1:
        row, ok = _coordinate(idx, e, emask, 1, M, n1, row, ok)
    if M > 2:
        row, ok = _coordinate(idx, e, emask, 2, M, n2, row, ok)
    if M > 3:
        row, ok = _coordinate(idx, e, emask, 3, M, n3, row, ok)
    if M > 4:
        row, ok = _coordinate(idx, e, emask, 4, M, n4, row, ok)
    if M > 5:
        row, ok = _coordinate(idx, e, emask, 5, M, n5, row, ok)
    if M > 6:
        row, ok = _coordinate(idx, e, emask, 6, M, n6, row, ok)
    if M > 7:
        row, ok = _coordinate(idx, e, emask, 7, M, n7, row, ok)
    return row, ok


@triton.jit
def _index_scan_kernel(idx, n, stats, keys, blocks_per_program, n0, n1, n2, n3, n4, n5, n6, n7,
                       M: tl.constexpr, MP: tl.constexpr, WRITE_KEYS: tl.constexpr, BLOCK: tl.constexpr):
    """Program p over its blocks of entries of a dense (n, M) index: the
    least and largest value of each coordinate into stats[p, 0, :M] and
    stats[p, 1, :M]; with WRITE_KEYS the linear row of each entry into keys
    (which the range check then vouches for)."""
    p = tl.program_id(0)
    cols = tl.arange(0, MP)
    lo = tl.full((BLOCK, MP), 9223372036854775807, tl.int64)
    hi = tl.full((BLOCK, MP), -9223372036854775807 - 1, tl.int64)
    for t in range(0, blocks_per_program):
        e = (p * blocks_per_program + t).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        emask = e < n
        mask = emask[:, None] & (cols < M)[None, :]
        c = tl.load(idx + e[:, None] * M + cols[None, :], mask=mask, other=0).to(tl.int64)
        lo = tl.where(mask, tl.minimum(lo, c), lo)
        hi = tl.where(mask, tl.maximum(hi, c), hi)
        if WRITE_KEYS:
            row, ok = _entry_row(idx, e, emask, M, n0, n1, n2, n3, n4, n5, n6, n7)
            tl.store(keys + e, row.to(keys.dtype.element_ty), mask=emask)
    out = stats + p * (2 * MP) + cols
    tl.store(out, tl.min(lo, axis=0))
    tl.store(out + MP, tl.max(hi, axis=0))


@triton.jit
def _digit_counts_kernel(keys, n, counts, shift, nblocks, RADIX: tl.constexpr, BLOCK: tl.constexpr):
    """counts[d * nblocks + b] = how many keys of block b have digit d
    ((key >> shift) mod RADIX): digit-major, so an exclusive scan of counts
    gives where block b's keys of digit d go."""
    b = tl.program_id(0)
    i = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    digit = (tl.load(keys + i, mask=m, other=0) >> shift) & (RADIX - 1)
    for d in tl.static_range(RADIX):
        tl.store(counts + d * nblocks + b, tl.sum((m & (digit == d)).to(tl.int32), axis=0))


@triton.jit
def _exclusive_scan_kernel(counts, offsets, total, BLOCK: tl.constexpr):
    """offsets[i] = counts[0] + ... + counts[i - 1], in order (one program)."""
    carry = tl.sum(tl.zeros((BLOCK,), tl.int64), axis=0)
    for start in range(0, total, BLOCK):
        i = start + tl.arange(0, BLOCK)
        m = i < total
        c = tl.load(counts + i, mask=m, other=0).to(tl.int64)
        inclusive = tl.cumsum(c, axis=0)
        tl.store(offsets + i, carry + inclusive - c, mask=m)
        carry += tl.sum(c, axis=0)


@triton.jit
def _digit_scatter_kernel(keys, perm, sorted_keys, sorted_perm, n, offsets, shift, nblocks, FIRST: tl.constexpr,
                          RADIX: tl.constexpr, BLOCK: tl.constexpr):
    """One stable pass: key i of block b with digit d goes to offsets[d *
    nblocks + b] + (keys of digit d before it in its block), carrying its
    entry number (perm[i], or i itself on the FIRST pass)."""
    b = tl.program_id(0)
    i = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    key = tl.load(keys + i, mask=m, other=0)
    if FIRST:
        entry = i
    else:
        entry = tl.load(perm + i, mask=m, other=0).to(tl.int64)
    digit = (key >> shift) & (RADIX - 1)
    position = tl.zeros((BLOCK,), tl.int64)
    for d in tl.static_range(RADIX):
        chosen = (m & (digit == d)).to(tl.int32)
        rank = tl.cumsum(chosen, axis=0) - chosen
        base = tl.load(offsets + d * nblocks + b)
        position = tl.where(chosen != 0, base + rank, position)
    tl.store(sorted_keys + position, key, mask=m)
    tl.store(sorted_perm + position, entry.to(sorted_perm.dtype.element_ty), mask=m)


@triton.jit
def _row_starts_kernel(sorted_keys, n, starts, rows_plus_one, steps, BLOCK: tl.constexpr):
    """starts[r] = the first sorted position whose row is >= r (a binary
    search per r), for r = 0 .. rows: row r's group is [starts[r], starts[r + 1])."""
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = r < rows_plus_one
    lo = tl.zeros((BLOCK,), tl.int64)
    hi = tl.zeros((BLOCK,), tl.int64) + n
    for _ in range(0, steps):
        active = lo < hi
        mid = (lo + hi) // 2
        key = tl.load(sorted_keys + mid, mask=m & active, other=0).to(tl.int64)
        right = active & (key < r)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & (key >= r), mid, hi)
    tl.store(starts + r, lo.to(starts.dtype.element_ty), mask=m)


@triton.jit
def _gather_rows_kernel(idx, n, table, stride_r, stride_f, out, F, n0, n1, n2, n3, n4, n5, n6, n7,
                        M: tl.constexpr, INTERP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """out[e, f] = table[row(e), f] for a block of entries e and of a row's
    values f (out dense (n, F))."""
    e = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    f = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)).to(tl.int64)
    emask = e < n
    fmask = f < F
    row, ok = _entry_row(idx, e, emask, M, n0, n1, n2, n3, n4, n5, n6, n7)
    v = tl.load(table + row[:, None] * stride_r + f[None, :] * stride_f, mask=ok[:, None] & fmask[None, :],
                other=0)
    tl.store(out + e[:, None] * F + f[None, :], store_value(v, out.dtype.element_ty, INTERP),
             mask=emask[:, None] & fmask[None, :])


@triton.jit
def _combine(acc, v, mask, OP: tl.constexpr):
    """acc op v where mask (acc elsewhere); max and min propagate NaN."""
    if OP == OP_MUL:
        acc = acc * tl.where(mask, v, 1.0)
    elif OP == OP_MAX:
        acc = tl.where(mask, numerics.maximum(acc, v), acc)
    elif OP == OP_MIN:
        acc = tl.where(mask, numerics.minimum(acc, v), acc)
    else:
        acc = acc + tl.where(mask, v, 0.0)
    return acc


@triton.jit
def _segment_reduce_kernel(starts, perm, src, src_stride_r, src_stride_f, out, R, F,
                           bag_of, bag_counts, psw, psw_stride, arg, padding_idx, init,
                           OP: tl.constexpr, BAGS: tl.constexpr, BAG_MODE: tl.constexpr, PADDING: tl.constexpr,
                           FREQ: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """out[r, f] for a block of rows r: OP over row r's group of sorted
    entries i = perm[j], starts[r] <= j < starts[r + 1], in order, of
    src[i, f] (or with BAGS, of the entry's contribution from its bag's row
    src[bag_of[i], f]: times psw[i], over the bag's count, or only where i
    won the bag's maximum, arg[bag, f] == i); ``init`` where the group is
    empty. MEAN divides by the group's size, FREQ too (scale_grad_by_freq);
    PADDING zeroes row ``padding_idx``."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    f = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)).to(tl.int64)
    rmask = r < R
    fmask = f < F
    first = tl.load(starts + r, mask=rmask, other=0).to(tl.int64)
    count = tl.load(starts + r + 1, mask=rmask, other=0).to(tl.int64) - first
    acc = tl.zeros((BLOCK_R, BLOCK_F), COMPUTE_TYPE) + init
    for j in range(0, tl.max(count, axis=0)):
        has = rmask & (j < count)
        i = tl.load(perm + first + j, mask=has, other=0).to(tl.int64)
        if BAGS:
            bag = tl.load(bag_of + i, mask=has, other=-1).to(tl.int64)
            take = has & (bag >= 0)
            source = bag
        else:
            take = has
            source = i
        mask = take[:, None] & fmask[None, :]
        v = tl.load(src + source[:, None] * src_stride_r + f[None, :] * src_stride_f, mask=mask,
                    other=0.0).to(COMPUTE_TYPE)
        if BAGS:
            if BAG_MODE == BAG_WEIGHTED:
                v = v * tl.load(psw + i * psw_stride, mask=take, other=0.0).to(COMPUTE_TYPE)[:, None]
            elif BAG_MODE == BAG_MEAN:
                v = v / tl.load(bag_counts + source, mask=take, other=1).to(COMPUTE_TYPE)[:, None]
            elif BAG_MODE == BAG_MAX:
                won = tl.load(arg + source[:, None] * F + f[None, :], mask=mask, other=-1).to(tl.int64)
                v = tl.where(won == i[:, None], v, 0.0)
        acc = _combine(acc, v, mask, OP)
    if OP == OP_MEAN:
        acc = tl.where(count[:, None] > 0, acc / tl.maximum(count, 1).to(COMPUTE_TYPE)[:, None], 0.0)
    if FREQ:
        acc = acc / tl.maximum(count, 1).to(COMPUTE_TYPE)[:, None]
    if PADDING:
        acc = tl.where((r == padding_idx)[:, None], 0.0, acc)
    tl.store(out + r[:, None] * F + f[None, :], store_value(acc, out.dtype.element_ty, INTERP),
             mask=rmask[:, None] & fmask[None, :])


@triton.jit
def _scatter_spread_kernel(starts, perm, grad, g_stride_r, g_stride_f, y, y_stride_r, y_stride_f,
                           src, s_stride_r, s_stride_f, work, dsrc, R, F,
                           OP: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    """scatter's backward for a block of rows r: each entry i of row r's
    group gets dsrc[i, f] (reference/gather.py ``scatter_backward``): g[r]
    (add), g[r] / size (mean), g[r] / ties where src[i] = y[r] (max, min;
    NaN where y[r] is NaN), g[r] times the product of the group's other
    values (mul: a forward loop stores each entry's prefix product in
    ``work``, a backward loop multiplies in the suffix)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    f = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)).to(tl.int64)
    rmask = r < R
    fmask = f < F
    rf = rmask[:, None] & fmask[None, :]
    first = tl.load(starts + r, mask=rmask, other=0).to(tl.int64)
    count = tl.load(starts + r + 1, mask=rmask, other=0).to(tl.int64) - first
    longest = tl.max(count, axis=0)
    g = tl.load(grad + r[:, None] * g_stride_r + f[None, :] * g_stride_f, mask=rf, other=0.0).to(COMPUTE_TYPE)
    if OP == OP_MEAN:
        g = g / tl.maximum(count, 1).to(COMPUTE_TYPE)[:, None]
    if OP == OP_MAX or OP == OP_MIN:
        top = tl.load(y + r[:, None] * y_stride_r + f[None, :] * y_stride_f, mask=rf, other=0.0).to(COMPUTE_TYPE)
        ties = tl.zeros((BLOCK_R, BLOCK_F), COMPUTE_TYPE)
        for j in range(0, longest):
            has = rmask & (j < count)
            i = tl.load(perm + first + j, mask=has, other=0).to(tl.int64)
            mask = has[:, None] & fmask[None, :]
            v = tl.load(src + i[:, None] * s_stride_r + f[None, :] * s_stride_f, mask=mask, other=0.0)
            ties += tl.where(mask & (v.to(COMPUTE_TYPE) == top), 1.0, 0.0)
        g = tl.where(top != top, float("nan"), g / tl.maximum(ties, 1.0))
    if OP == OP_MUL:
        prefix = tl.zeros((BLOCK_R, BLOCK_F), COMPUTE_TYPE) + 1.0
        for j in range(0, longest):
            has = rmask & (j < count)
            i = tl.load(perm + first + j, mask=has, other=0).to(tl.int64)
            mask = has[:, None] & fmask[None, :]
            tl.store(work + (first + j)[:, None] * F + f[None, :], prefix, mask=mask)
            v = tl.load(src + i[:, None] * s_stride_r + f[None, :] * s_stride_f, mask=mask, other=1.0)
            prefix = prefix * v.to(COMPUTE_TYPE)
        suffix = tl.zeros((BLOCK_R, BLOCK_F), COMPUTE_TYPE) + 1.0
        for jj in range(0, longest):
            j = longest - 1 - jj
            has = rmask & (j < count)
            i = tl.load(perm + first + j, mask=has, other=0).to(tl.int64)
            mask = has[:, None] & fmask[None, :]
            before = tl.load(work + (first + j)[:, None] * F + f[None, :], mask=mask, other=1.0)
            tl.store(dsrc + i[:, None] * F + f[None, :],
                     store_value(g * (before * suffix), dsrc.dtype.element_ty, INTERP), mask=mask)
            v = tl.load(src + i[:, None] * s_stride_r + f[None, :] * s_stride_f, mask=mask, other=1.0)
            suffix = suffix * v.to(COMPUTE_TYPE)
    else:
        for j in range(0, longest):
            has = rmask & (j < count)
            i = tl.load(perm + first + j, mask=has, other=0).to(tl.int64)
            mask = has[:, None] & fmask[None, :]
            d = g
            if OP == OP_MAX or OP == OP_MIN:
                v = tl.load(src + i[:, None] * s_stride_r + f[None, :] * s_stride_f, mask=mask,
                            other=0.0).to(COMPUTE_TYPE)
                d = tl.where((v == top) | (top != top), g, 0.0)
            tl.store(dsrc + i[:, None] * F + f[None, :], store_value(d, dsrc.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _bag_bounds(offsets, offsets_stride, n_offsets, b, bmask, n):
    """Bag b's entries [start, end): from its offset to the next one (the
    last bag's end is n, the entries' count)."""
    start = tl.load(offsets + b * offsets_stride, mask=bmask, other=0).to(tl.int64)
    nxt = b + 1
    end = tl.load(offsets + nxt * offsets_stride, mask=bmask & (nxt < n_offsets), other=0).to(tl.int64)
    end = tl.where(nxt < n_offsets, end, n)
    return start, tl.where(bmask, end - start, 0)


@triton.jit
def _bag_reduce_kernel(idx, offsets, offsets_stride, n_offsets, n, B, weight, w_stride_r, w_stride_f,
                       psw, psw_stride, y, arg, F, padding_idx,
                       BAG_MODE: tl.constexpr, WRITE_ARG: tl.constexpr, PADDING: tl.constexpr,
                       COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr, BLOCK_B: tl.constexpr,
                       BLOCK_F: tl.constexpr):
    """A block of bags b over its entries i in order, w_i = weight[idx[i]]
    (entries at padding_idx left out): y[b] = the sum (times psw[i]), the
    mean or the elementwise maximum (NaN wins), zeros for an empty bag; or,
    with WRITE_ARG (max mode's backward), arg[b, f] = the first entry with
    w_i[f] = y[b, f] (both NaN counts), -1 if none."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    f = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)).to(tl.int64)
    bmask = b < B
    fmask = f < F
    bf = bmask[:, None] & fmask[None, :]
    start, count = _bag_bounds(offsets, offsets_stride, n_offsets, b, bmask, n)
    counted = tl.zeros((BLOCK_B,), tl.int32)
    if BAG_MODE == BAG_MAX:
        acc = tl.zeros((BLOCK_B, BLOCK_F), COMPUTE_TYPE) - float("inf")
    else:
        acc = tl.zeros((BLOCK_B, BLOCK_F), COMPUTE_TYPE)
    if WRITE_ARG:
        top = tl.load(y + b[:, None] * F + f[None, :], mask=bf, other=0.0).to(COMPUTE_TYPE)
        won = tl.zeros((BLOCK_B, BLOCK_F), tl.int64) - 1
    for j in range(0, tl.max(count, axis=0)):
        i = start + j
        has = bmask & (j < count)
        row = tl.load(idx + i, mask=has, other=0).to(tl.int64)
        take = has
        if PADDING:
            take = take & (row != padding_idx)
        mask = take[:, None] & fmask[None, :]
        v = tl.load(weight + row[:, None] * w_stride_r + f[None, :] * w_stride_f, mask=mask,
                    other=0.0).to(COMPUTE_TYPE)
        counted += take.to(tl.int32)
        if WRITE_ARG:
            hit = mask & ((v == top) | ((v != v) & (top != top))) & (won < 0)
            won = tl.where(hit, i[:, None], won)
        elif BAG_MODE == BAG_MAX:
            acc = tl.where(mask, numerics.maximum(acc, v), acc)
        else:
            if BAG_MODE == BAG_WEIGHTED:
                v = v * tl.load(psw + i * psw_stride, mask=take, other=0.0).to(COMPUTE_TYPE)[:, None]
            acc = acc + tl.where(mask, v, 0.0)
    if WRITE_ARG:
        tl.store(arg + b[:, None] * F + f[None, :], won.to(arg.dtype.element_ty), mask=bf)
    else:
        if BAG_MODE == BAG_MEAN:
            acc = acc / tl.maximum(counted, 1).to(COMPUTE_TYPE)[:, None]
        acc = tl.where((counted > 0)[:, None], acc, 0.0)
        tl.store(y + b[:, None] * F + f[None, :], store_value(acc, y.dtype.element_ty, INTERP), mask=bf)


@triton.jit
def _bag_entries_kernel(idx, offsets, offsets_stride, n_offsets, n, B, bag_of, counts, padding_idx,
                        PADDING: tl.constexpr, BLOCK_B: tl.constexpr):
    """For a block of bags b: bag_of[i] = b for each of its entries, and
    counts[b] = its entries not at padding_idx."""
    b = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    bmask = b < B
    start, count = _bag_bounds(offsets, offsets_stride, n_offsets, b, bmask, n)
    counted = tl.zeros((BLOCK_B,), tl.int32)
    for j in range(0, tl.max(count, axis=0)):
        i = start + j
        has = bmask & (j < count)
        tl.store(bag_of + i, b.to(bag_of.dtype.element_ty), mask=has)
        take = has
        if PADDING:
            take = take & (tl.load(idx + i, mask=has, other=0).to(tl.int64) != padding_idx)
        counted += take.to(tl.int32)
    tl.store(counts + b, counted, mask=bmask)


@triton.jit
def _entry_dot_kernel(idx, bag_of, grad, g_stride_r, g_stride_f, weight, w_stride_r, w_stride_f, dpsw, n, F,
                      padding_idx, PADDING: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr):
    """dpsw[i] = sum_f g[bag_of[i], f] * weight[idx[i], f] for a block of
    entries (0 for an entry not counted: at padding_idx or in no bag)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    imask = i < n
    bag = tl.load(bag_of + i, mask=imask, other=-1).to(tl.int64)
    row = tl.load(idx + i, mask=imask, other=0).to(tl.int64)
    take = imask & (bag >= 0)
    if PADDING:
        take = take & (row != padding_idx)
    acc = tl.zeros((BLOCK_N, BLOCK_F), COMPUTE_TYPE)
    for f0 in range(0, F, BLOCK_F):
        f = (f0 + tl.arange(0, BLOCK_F)).to(tl.int64)
        mask = take[:, None] & (f < F)[None, :]
        g = tl.load(grad + bag[:, None] * g_stride_r + f[None, :] * g_stride_f, mask=mask, other=0.0)
        w = tl.load(weight + row[:, None] * w_stride_r + f[None, :] * w_stride_f, mask=mask, other=0.0)
        acc += g.to(COMPUTE_TYPE) * w.to(COMPUTE_TYPE)
    tl.store(dpsw + i, store_value(tl.sum(acc, axis=1), dpsw.dtype.element_ty, INTERP), mask=imask)


# --- host side: layouts, the index check, the sort ------------------------------------------------

def _merged_stride(shape, strides):
    """The one stride that steps through ``shape`` row-major, or None when
    the axes do not merge (size-1 axes ignored; 0 for no axis left)."""
    axes = [(s, st) for s, st in zip(shape, strides) if s != 1]
    for (_, outer), (size, inner) in zip(axes, axes[1:]):
        if outer != inner * size:
            return None
    return axes[-1][1] if axes else 0


def _matrix(t, split):
    """``t`` as the matrix (prod(shape[:split]), prod(shape[split:])):
    (tensor, row stride, value stride), without a copy where the strides
    allow, else of a dense copy."""
    shape, strides = tuple(t.shape), t.stride()
    outer, inner = _merged_stride(shape[:split], strides[:split]), _merged_stride(shape[split:], strides[split:])
    if outer is None or inner is None:
        t = copy.contiguous(t)
        return t, launch.numel(shape[split:]), 1
    return t, outer, inner


def _upload(array, device):
    """A host NumPy array copied to ``device`` (torch only copies)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    out = host.to(device)
    if recording.ACTIVE is not None and out.device.type != "cpu":
        recording.note_upload(array)
        recording.note_allocation(out)
    return out


def _read(t):
    """A device tensor copied to the host, as NumPy (the host waits for the device)."""
    if recording.ACTIVE is not None:
        recording.note_host_read(t)
    return t.to("cpu").numpy()


def _sizes(table):
    """The table's sides, padded to MAX_COORDS with 1s (the kernels' n0..n7)."""
    return tuple(table.table_shape) + (1,) * (MAX_COORDS - table.ncoords)


def _key_dtype(rows):
    return torch.int32 if rows <= np.iinfo(np.int32).max else torch.int64


def _check_indices(idx, table, who, write_keys=False):
    """Check every coordinate of the dense index ``idx`` (n entries of
    table.ncoords coordinates) against ``table`` (raising IndexRangeError
    before anything reads the table); with ``write_keys``, return the linear
    rows of the entries (n,), computed in the same launch."""
    m = table.ncoords
    n = idx.numel() // m
    mp = launch.next_pow2(m)
    block = launch.next_pow2(min(max(n, 1), _INTERP_SORT_BLOCK)) if launch.INTERPRET else _GPU_SORT_BLOCK
    blocks = launch.cdiv(n, block)
    programs = blocks if launch.INTERPRET else min(blocks, _GPU_SCAN_PROGRAMS)
    per_program = launch.cdiv(blocks, programs)
    programs = launch.cdiv(blocks, per_program)
    neutral = np.empty((programs, 2, mp), np.int64)
    neutral[:, 0], neutral[:, 1] = 0, -1            # what a launch that does not run leaves: nothing out of range
    stats = _upload(neutral, idx.device)
    keys = launch.empty((n,), _key_dtype(table.rows), idx.device) if write_keys else stats
    launch.launch(_index_scan_kernel, (programs,), idx, n, stats, keys, per_program, *_sizes(table),
                  M=m, MP=mp, WRITE_KEYS=write_keys, BLOCK=block)
    found = _read(stats)
    table.check_range(who, found[:, 0, :m].min(axis=0), found[:, 1, :m].max(axis=0))
    return keys if write_keys else None


def _sort_rows(keys, rows):
    """A stable sort of the rows ``keys`` (n,), all in 0..rows-1: (sorted
    keys, perm) with perm[j] the entry whose row is j-th (LSD radix,
    RADIX_BITS per pass, three launches per pass). ``keys``' buffer is
    reused (overwritten) by the passes."""
    n = keys.numel()
    device = keys.device
    block = launch.next_pow2(min(n, _INTERP_SORT_BLOCK)) if launch.INTERPRET else _GPU_SORT_BLOCK
    nblocks = launch.cdiv(n, block)
    passes = max(1, launch.cdiv(max(rows - 1, 0).bit_length(), RADIX_BITS))
    perm_dtype = torch.int32 if n <= np.iinfo(np.int32).max else torch.int64
    counts = launch.empty((RADIX.value * nblocks,), torch.int32, device)
    offsets = launch.empty((RADIX.value * nblocks,), torch.int64, device)
    keys_in, keys_out = keys, launch.empty((n,), keys.dtype, device)
    perm_in, perm_out = launch.empty((n,), perm_dtype, device), launch.empty((n,), perm_dtype, device)
    scan_block = min(launch.next_pow2(RADIX.value * nblocks), 1 << 12)
    for p in range(passes):
        shift = p * RADIX_BITS
        launch.launch(_digit_counts_kernel, (nblocks,), keys_in, n, counts, shift, nblocks, RADIX=RADIX,
                      BLOCK=block)
        launch.launch(_exclusive_scan_kernel, (1,), counts, offsets, RADIX.value * nblocks, BLOCK=scan_block)
        launch.launch(_digit_scatter_kernel, (nblocks,), keys_in, perm_in, keys_out, perm_out, n, offsets, shift,
                      nblocks, FIRST=p == 0, RADIX=RADIX, BLOCK=block)
        keys_in, keys_out = keys_out, keys_in
        perm_in, perm_out = perm_out, perm_in
    return keys_in, perm_in


def _groups(idx, table, who):
    """The entries of the dense index ``idx`` grouped by row, the indices
    checked first: (starts (rows + 1,), perm (n,)): row r's entries are
    perm[starts[r]:starts[r + 1]], in ascending entry order."""
    n = idx.numel() // table.ncoords
    keys = _check_indices(idx, table, who, write_keys=True)
    sorted_keys, perm = _sort_rows(keys, table.rows)
    starts = launch.empty((table.rows + 1,), torch.int64, idx.device)
    block = launch.next_pow2(min(table.rows + 1, _INTERP_SORT_BLOCK)) if launch.INTERPRET else _GPU_SORT_BLOCK
    launch.launch(_row_starts_kernel, (launch.cdiv(table.rows + 1, block),), sorted_keys, n, starts,
                  table.rows + 1, n.bit_length() + 1, BLOCK=block)
    return starts, perm


@functools.lru_cache(maxsize=1024)
def _tiles(rows, row_size, interpret, min_block_f=1):
    """(BLOCK_R, BLOCK_F, warps): a tile of rows x values of a row kernel
    (at least ``min_block_f`` values wide on a GPU)."""
    if interpret:
        block_f = min(launch.next_pow2(row_size), 1 << 12)
        block_r = min(launch.next_pow2(rows), max(1, _INTERP_TILE // block_f))
        return block_r, block_f, 4
    block_f = max(min(launch.next_pow2(row_size), _GPU_ROW_BLOCK), min_block_f)
    block_r = min(launch.next_pow2(rows), max(1, _GPU_TILE // block_f))
    # a warp per 256 values (a small tile in 4 warps made ptxas spill on sm_80)
    return block_r, block_f, max(1, min(4, block_r * block_f // 256))


def _grid(rows, row_size, tiles):
    return (launch.cdiv(rows, tiles[0]), launch.cdiv(row_size, tiles[1]))


def _compute(dtype):
    return numerics.compute_type(dtype)


def _gather_rows(idx, table, src, who, out, split):
    """out (dense (n, F)) = the rows of ``src`` (table.rows x table.row_size
    after its first ``split`` axes) that the dense ``idx`` names; checks first."""
    n = idx.numel() // table.ncoords
    if n == 0:
        return out
    _check_indices(idx, table, who)
    f = table.row_size
    if f == 0:
        return out
    matrix, stride_r, stride_f = _matrix(src, split)
    tiles = _tiles(n, f, launch.INTERPRET)
    launch.launch(_gather_rows_kernel, _grid(n, f, tiles), idx, n, matrix, stride_r, stride_f, out, f,
                  *_sizes(table), M=table.ncoords, INTERP=launch.INTERPRET, BLOCK_N=tiles[0], BLOCK_F=tiles[1],
                  num_warps=tiles[2])
    return out


def _reduce_groups(starts, perm, src, stride_r, stride_f, out, table, op, *, bags=None, padding_idx=None,
                   freq=False):
    """out (dense (rows, F)) = op over each row's group (``_segment_reduce_kernel``)."""
    rows, f = table.rows, table.row_size
    tiles = _tiles(rows, f, launch.INTERPRET)
    bag_of, bag_counts, psw, psw_stride, arg, mode = bags if bags is not None else (perm, perm, src, 0, perm, 0)
    launch.launch(_segment_reduce_kernel, _grid(rows, f, tiles), starts, perm, src, stride_r, stride_f, out, rows,
                  f, bag_of, bag_counts, psw, psw_stride, arg, -1 if padding_idx is None else padding_idx,
                  float(SCATTER_INIT[op]), OP=_OP_CODES[op], BAGS=bags is not None, BAG_MODE=mode,
                  PADDING=padding_idx is not None, FREQ=freq, COMPUTE_TYPE=_compute(out.dtype),
                  INTERP=launch.INTERPRET, BLOCK_R=tiles[0], BLOCK_F=tiles[1], num_warps=tiles[2])
    return out


# --- gather --------------------------------------------------------------------------------------

def _gather_spec(src, idx, coords):
    return gather_spec(tuple(src.shape), tuple(idx.shape), src.dtype, idx.dtype, coords)


def gather_forward(src, idx, coords=False):
    spec = _gather_spec(src, idx, coords)
    out = launch.empty(spec.out_shape, src.dtype, src.device)
    _gather_rows(copy.contiguous(idx), spec.table, src, "gather", out, spec.table.ncoords)
    return out


def gather_backward(grad, out, src, idx, coords=False):
    spec = _gather_spec(src, idx, coords)
    table = spec.table
    if spec.entries == 0:
        return copy.full(tuple(src.shape), 0.0, src.dtype, src.device), None
    dsrc = launch.empty(tuple(src.shape), src.dtype, src.device)
    idx = copy.contiguous(idx)
    if table.rows * table.row_size == 0:
        _check_indices(idx, table, "gather")
        return dsrc, None
    starts, perm = _groups(idx, table, "gather")
    g, stride_r, stride_f = _matrix(grad, len(spec.entries_shape))
    _reduce_groups(starts, perm, g, stride_r, stride_f, dsrc, table, "add")
    return dsrc, None


# --- scatter -------------------------------------------------------------------------------------

def _scatter_spec(src, idx, op, dstsize, coords):
    return scatter_spec(tuple(src.shape), tuple(idx.shape), src.dtype, idx.dtype, op, dstsize, coords)


def scatter_forward(src, idx, op="add", dstsize=None, coords=False):
    spec = _scatter_spec(src, idx, op, dstsize, coords)
    table = spec.table
    idx = copy.contiguous(idx)
    if spec.entries == 0:
        return copy.full(spec.out_shape, SCATTER_INIT[spec.op], src.dtype, src.device)
    out = launch.empty(spec.out_shape, src.dtype, src.device)
    if table.rows * table.row_size == 0:
        _check_indices(idx, table, "scatter")
        return out
    starts, perm = _groups(idx, table, "scatter")
    values, stride_r, stride_f = _matrix(src, len(spec.entries_shape))
    return _reduce_groups(starts, perm, values, stride_r, stride_f, out, table, spec.op)


def scatter_backward(grad, out, src, idx, op="add", dstsize=None, coords=False):
    spec = _scatter_spec(src, idx, op, dstsize, coords)
    table = spec.table
    dsrc = launch.empty(tuple(src.shape), src.dtype, src.device)
    if spec.entries == 0:
        return dsrc, None
    idx = copy.contiguous(idx)
    if table.row_size == 0:
        _check_indices(idx, table, "scatter")
        return dsrc, None
    if out is None and spec.op in ("max", "min"):
        out = scatter_forward(src, idx, op, dstsize, coords)
    starts, perm = _groups(idx, table, "scatter")
    m = table.ncoords
    g, g_r, g_f = _matrix(grad, m)
    y, y_r, y_f = _matrix(out, m) if spec.op in ("max", "min") else (g, 0, 0)
    values, s_r, s_f = _matrix(src, len(spec.entries_shape))
    work = dsrc
    if spec.op == "mul":
        work = launch.empty((spec.entries, table.row_size),
                            torch.float64 if src.dtype == torch.float64 else torch.float32, src.device)
    rows, f = table.rows, table.row_size
    tiles = _tiles(rows, f, launch.INTERPRET)
    launch.launch(_scatter_spread_kernel, _grid(rows, f, tiles), starts, perm, g, g_r, g_f, y, y_r, y_f,
                  values, s_r, s_f, work, dsrc, rows, f, OP=_OP_CODES[spec.op], COMPUTE_TYPE=_compute(src.dtype),
                  INTERP=launch.INTERPRET, BLOCK_R=tiles[0], BLOCK_F=tiles[1], num_warps=tiles[2])
    return dsrc, None


# --- embedding -----------------------------------------------------------------------------------

def _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq):
    return embedding_spec(tuple(weight.shape), tuple(idx.shape), weight.dtype, idx.dtype, padding_idx,
                          scale_grad_by_freq)


def embedding_forward(weight, idx, padding_idx=None, scale_grad_by_freq=False):
    spec = _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq)
    out = launch.empty(spec.out_shape, weight.dtype, weight.device)
    _gather_rows(copy.contiguous(idx), spec.table, weight, "embedding", out, 1)
    return out


def embedding_backward(grad, out, weight, idx, padding_idx=None, scale_grad_by_freq=False):
    spec = _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq)
    table = spec.table
    if spec.entries == 0:
        return copy.full(tuple(weight.shape), 0.0, weight.dtype, weight.device), None
    dweight = launch.empty(tuple(weight.shape), weight.dtype, weight.device)
    idx = copy.contiguous(idx)
    if table.rows * table.row_size == 0:
        _check_indices(idx, table, "embedding")
        return dweight, None
    starts, perm = _groups(idx, table, "embedding")
    g, stride_r, stride_f = _matrix(grad, len(spec.idx_shape))
    _reduce_groups(starts, perm, g, stride_r, stride_f, dweight, table, "add", padding_idx=spec.padding_idx,
                   freq=spec.scale_grad_by_freq)
    return dweight, None


# --- embedding_bag -------------------------------------------------------------------------------

def _bag_spec(weight, idx, offsets, psw, mode, padding_idx, include_last_offset, scale_grad_by_freq):
    return embedding_bag_spec(tuple(weight.shape), tuple(idx.shape), tuple(offsets.shape),
                              None if psw is None else tuple(psw.shape), weight.dtype, idx.dtype, offsets.dtype,
                              None if psw is None else psw.dtype, mode, padding_idx, include_last_offset,
                              scale_grad_by_freq)


def _check_bags(spec, idx, offsets):
    """The dense index, its entries checked against the vocabulary, and the
    offsets checked on the host (they are copied there: B + 1 numbers)."""
    if offsets.numel():
        spec.check_offsets(_read(offsets))
    idx = copy.contiguous(idx)
    if spec.entries:
        _check_indices(idx, spec.table, "embedding_bag")
    return idx


_BAG_MODES = {"sum": BAG_SUM.value, "mean": BAG_MEAN.value, "max": BAG_MAX.value}


def _bag_mode(spec):
    return BAG_WEIGHTED.value if spec.per_sample_weights else _BAG_MODES[spec.mode]


def _bag_launch(spec, idx, offsets, weight, psw, y, arg, write_arg):
    d = spec.weight_shape[1]
    w, w_r, w_f = _matrix(weight, 1)
    # (tiles two values wide at least: Triton 3.6 miscompiles the weighted sum for rows of one value,
    # "operand #1 does not dominate this use" for sm_90 and sm_80)
    tiles = _tiles(spec.bags, d, launch.INTERPRET, 2)
    launch.launch(_bag_reduce_kernel, _grid(spec.bags, d, tiles), idx, offsets, offsets.stride(0), offsets.numel(),
                  spec.entries, spec.bags, w, w_r, w_f, idx if psw is None else psw,
                  0 if psw is None else psw.stride(0), y, arg, d,
                  -1 if spec.padding_idx is None else spec.padding_idx, BAG_MODE=_bag_mode(spec),
                  WRITE_ARG=write_arg, PADDING=spec.padding_idx is not None, COMPUTE_TYPE=_compute(weight.dtype),
                  INTERP=launch.INTERPRET, BLOCK_B=tiles[0], BLOCK_F=tiles[1], num_warps=tiles[2])


def embedding_bag_forward(weight, idx, offsets, per_sample_weights=None, mode="mean", padding_idx=None,
                          include_last_offset=False, scale_grad_by_freq=False):
    spec = _bag_spec(weight, idx, offsets, per_sample_weights, mode, padding_idx, include_last_offset,
                     scale_grad_by_freq)
    idx = _check_bags(spec, idx, offsets)
    y = launch.empty(spec.out_shape, weight.dtype, weight.device)
    if spec.bags * spec.weight_shape[1] == 0:
        return y
    _bag_launch(spec, idx, offsets, weight, per_sample_weights, y, y, False)
    return y


def embedding_bag_backward(grad, out, weight, idx, offsets, per_sample_weights=None, mode="mean",
                           padding_idx=None, include_last_offset=False, scale_grad_by_freq=False):
    spec = _bag_spec(weight, idx, offsets, per_sample_weights, mode, padding_idx, include_last_offset,
                     scale_grad_by_freq)
    idx = _check_bags(spec, idx, offsets)
    psw = per_sample_weights
    v, d = spec.weight_shape
    dpsw = None if psw is None else launch.empty(tuple(psw.shape), psw.dtype, psw.device)
    if spec.bags == 0 or spec.entries == 0 or v * d == 0:
        dweight = copy.full((v, d), 0.0, weight.dtype, weight.device)
        if dpsw is not None and spec.entries:
            dpsw = copy.full(tuple(psw.shape), 0.0, psw.dtype, psw.device)
        return (dweight, None, None) + (() if psw is None else (dpsw,))
    device = weight.device
    bag_of = launch.empty((spec.entries,), torch.int32 if spec.bags <= np.iinfo(np.int32).max else torch.int64,
                          device)
    counts = launch.empty((spec.bags,), torch.int32, device)
    block_b = min(launch.next_pow2(spec.bags), _INTERP_SORT_BLOCK if launch.INTERPRET else 128)
    launch.launch(_bag_entries_kernel, (launch.cdiv(spec.bags, block_b),), idx, offsets, offsets.stride(0),
                  offsets.numel(), spec.entries, spec.bags, bag_of, counts,
                  -1 if spec.padding_idx is None else spec.padding_idx, PADDING=spec.padding_idx is not None,
                  BLOCK_B=block_b)
    g, g_r, g_f = _matrix(grad, 1)
    arg = bag_of
    if spec.mode == "max":
        if out is None:
            out = embedding_bag_forward(weight, idx, offsets, psw, mode, padding_idx, include_last_offset,
                                        scale_grad_by_freq)
        arg = launch.empty(spec.out_shape, torch.int32 if spec.entries <= np.iinfo(np.int32).max else torch.int64,
                           device)
        _bag_launch(spec, idx, offsets, weight, None, copy.contiguous(out), arg, True)
    starts, perm = _groups(idx, spec.table, "embedding_bag")
    dweight = launch.empty((v, d), weight.dtype, device)
    bags = (bag_of, counts, idx if psw is None else psw, 0 if psw is None else psw.stride(0), arg, _bag_mode(spec))
    _reduce_groups(starts, perm, g, g_r, g_f, dweight, spec.table, "add", bags=bags, padding_idx=spec.padding_idx,
                   freq=spec.scale_grad_by_freq)
    if psw is None:
        return dweight, None, None
    w, w_r, w_f = _matrix(weight, 1)
    block_f = min(launch.next_pow2(d), 1 << 12 if launch.INTERPRET else 128)
    block_n = min(launch.next_pow2(spec.entries), max(1, (_INTERP_TILE if launch.INTERPRET else _GPU_TILE) // block_f))
    launch.launch(_entry_dot_kernel, (launch.cdiv(spec.entries, block_n),), idx, bag_of, g, g_r, g_f, w, w_r, w_f,
                  dpsw, spec.entries, d, -1 if spec.padding_idx is None else spec.padding_idx,
                  PADDING=spec.padding_idx is not None, COMPUTE_TYPE=_compute(weight.dtype), INTERP=launch.INTERPRET,
                  BLOCK_N=block_n, BLOCK_F=block_f)
    return dweight, None, None, dpsw
