"""Per-sample normalisation, Triton kernels: layernorm, rmsnorm, groupnorm
and instance norm (``triflux.specs.layernorm`` has the geometry, and
reference/layernorm.py the math).

Rows. Every primitive normalises rows of a dense ``x`` (a non-contiguous
``x``, gradient or output is first made dense by ``copy.contiguous``):

* layernorm / rmsnorm: R rows of M values, row i at offset i * M;
* groupnorm (and instance norm, G = C): the N * G rows (n, g) of
  M = (C/G) * S values, at offset (n * G + g) * M, read as tiles of
  BLOCK_C channels by BLOCK_S positions, so that each value's channel (its
  weight, bias and, in a backward, its parameter-gradient sum) is the tile's
  row and no offset needs a division.

Statistics are taken as batch norm's are (triton_kernels/norm.py): sweep 1
the plain mean m, sweep 2 over d = x - m the correction dm = sum(d) / M and
the squared deviations q = sum(d^2) - sum(d) dm; then xhat = (d - dm) * istd,
istd = 1 / sqrt(max(q / M, 0) + eps) (NaN stays NaN; a negative eps gives
NaN where var + eps < 0, as torch). rmsnorm: r = 1 / sqrt(sum(x^2) / M + eps),
xhat = x * r. A row that fits one block (SINGLE) is loaded once and all of
this happens in registers; a longer row is swept in chunks.

Backward, with g = dL/dz through the fused activation (from the output y),
gw = g * w, c1 = mean(gw) (0 for rmsnorm) and c2 = mean(gw * xhat):
dx = istd * (gw - c1 - xhat * c2). For a chunked row the sums of gw and
gw * d ride along sweep 2 and c2 = istd * (sum(gw d) - dm sum(gw)) / M.

Parameter gradients, deterministically (no atomics: the same inputs give
the same bits on every run):

* layernorm / rmsnorm: the backward runs ``programs`` programs, each over a
  contiguous range of row blocks, each summing g * xhat and g over its rows
  into its own row of a (programs, 2, M) workspace of the compute type;
  ``_sum_partials_kernel`` then adds the programs' rows in order, per column.
  With one program, that program stores dweight and dbias itself.
* groupnorm: program (n, g) stores, per channel c of its group, sum_s g d and
  sum_s g (d = x - m) into an (N, C, 2) workspace, and its row's (dm, istd)
  into an (N * G, 2) one; ``_groupnorm_param_grads_kernel`` adds, per channel
  in order of n, dweight[c] = sum_n istd (sum g d - dm sum g) and
  dbias[c] = sum_n sum g.

Instance norm's running statistics (``instancenorm_train`` with them, and
``instancenorm_running_update``): the groupnorm forward also stores each
instance's mean (its plain mean where that is infinite, as torch keeps it)
and squared deviations into an (N, C, 2) workspace, and
``_instance_running_kernel`` averages them over n in order and moves the
running statistics: in place, or into the moved vectors. Every allocation
happens before the first launch, so a call that runs out of memory leaves
the running statistics as they were.

Arithmetic in float32 (float64 for float64); eps and momentum travel as
float32 pairs (``numerics.float32_pair``) so that float64 kernels get them
exactly.
"""
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from triflux.gpus import SATURATING_WARPS

from . import copy, launch, numerics
from .numerics import ACTIVATION_CODES, from_float32_pair, store_value
from ..specs.layernorm import groupnorm_spec, instancenorm_inputs, instancenorm_spec, layernorm_spec, rmsnorm_spec

#: values of x one GPU thread holds per tile: one 16-byte load at most twice (the backward
#: keeps x, g, gw, xhat and the two parameter-gradient accumulators of them live)
_BYTES_PER_THREAD = 16
#: the most values of a row a GPU program holds at once (longer rows are swept in chunks
#: of _GPU_CHUNK): 16 warps of 32 threads, 8 values each in a backward, 16 in a forward
_GPU_ROW_BLOCK = {"forward": 8192, "backward": 4096}
#: the chunk of a row too long for one block (its sweeps keep an accumulator of a chunk, and
#: in a backward three: at 8,192 float32 values a forward's sweep spilled on sm_80)
_GPU_CHUNK = 4096
#: values per tile of a GPU program over short rows (several rows per program) and of groupnorm
_GPU_TILE = 2048
#: values per tile at most in the interpreter (NumPy vectorises inside a program)
_INTERP_TILE = 1 << 16
#: programs of a backward over rows in the interpreter at most (the GPU's: its SMs' worth)
_INTERP_PROGRAMS = 2
#: the workspace's two fields per column (rows) or per channel (groups)
_FIELDS = 2


# --- shared pieces ---------------------------------------------------------------------------------

@triton.jit
def _load_grad(grad, out, offsets, mask, ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """dL/dz at ``offsets``: the gradient of the output y = act(z) through act
    (the output read only when ACTIVATION is not identity)."""
    g = tl.load(grad + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
    if ACTIVATION != numerics.ACT_IDENTITY:
        g = numerics.through_activation(g, tl.load(out + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE),
                                        ACTIVATION)
    return g


@triton.jit
def _inverse_std(sqdev, M, eps):
    """1 / sqrt(max(sqdev / M, 0) + eps) (NaN stays NaN)."""
    return 1.0 / tl.sqrt(numerics.maximum(sqdev / M, 0.0) + eps)


@triton.jit
def _block_stats(v, mask, M, eps, RMS: tl.constexpr):
    """Per row of the block ``v`` (rows by values, 0 where not ``mask``)
    holding whole rows: (m, dm, istd) with xhat = ((v - m) - dm) * istd;
    rmsnorm (RMS): (0, 0, r) with xhat = v * r."""
    if RMS:
        r = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / M + eps)
        zero = tl.zeros_like(r)
        return zero, zero, r
    else:
        m = tl.sum(v, axis=1) / M
        d = tl.where(mask, v - m[:, None], 0.0)
        sum_d = tl.sum(d, axis=1)
        dm = sum_d / M
        return m, dm, _inverse_std(tl.sum(d * d, axis=1) - sum_d * dm, M, eps)


# --- layernorm and rmsnorm: rows ------------------------------------------------------------------

@triton.jit
def _row_sweep_stats(x, grad, out, w, row_offsets, row_mask, M, eps, WITH_GRAD: tl.constexpr,
                     HAS_WEIGHT: tl.constexpr, RMS: tl.constexpr, ACTIVATION: tl.constexpr,
                     COMPUTE_TYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    """The statistics of rows too long for one block, swept in chunks of
    BLOCK_M: (m, dm, istd) as _block_stats, and with WITH_GRAD the
    backward's c1 = mean(gw) and c2 = mean(gw * xhat) (0 without)."""
    cols = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
    acc_gw = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
    acc_gwd = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
    for start in range(0, M, BLOCK_M):
        c = start + cols
        mask = row_mask[:, None] & (c < M)[None, :]
        offsets = row_offsets[:, None] + c[None, :]
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        if RMS:
            acc += v * v
            if WITH_GRAD:
                gw = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
                if HAS_WEIGHT:
                    gw = gw * tl.load(w + c, mask=c < M, other=0.0).to(COMPUTE_TYPE)[None, :]
                acc_gwd += gw * v
        else:
            acc += v
    if RMS:
        r = 1.0 / tl.sqrt(tl.sum(acc, axis=1) / M + eps)
        zero = tl.zeros_like(r)
        return zero, zero, r, zero, r * tl.sum(acc_gwd, axis=1) / M
    else:
        m = tl.sum(acc, axis=1) / M
        acc_d = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
        acc_dd = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
        for start in range(0, M, BLOCK_M):
            c = start + cols
            mask = row_mask[:, None] & (c < M)[None, :]
            offsets = row_offsets[:, None] + c[None, :]
            v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
            d = tl.where(mask, v - m[:, None], 0.0)
            acc_d += d
            acc_dd += d * d
            if WITH_GRAD:
                gw = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
                if HAS_WEIGHT:
                    gw = gw * tl.load(w + c, mask=c < M, other=0.0).to(COMPUTE_TYPE)[None, :]
                acc_gw += gw
                acc_gwd += gw * d
        sum_d = tl.sum(acc_d, axis=1)
        dm = sum_d / M
        istd = _inverse_std(tl.sum(acc_dd, axis=1) - sum_d * dm, M, eps)
        sum_gw = tl.sum(acc_gw, axis=1)
        return m, dm, istd, sum_gw / M, istd * (tl.sum(acc_gwd, axis=1) - dm * sum_gw) / M


@triton.jit
def _rows_forward_kernel(x, w, b, y, R, M, eps_hi, eps_lo, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         RMS: tl.constexpr, ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                         INTERP: tl.constexpr, SINGLE: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_M: tl.constexpr):
    """Rows [program * BLOCK_R, + BLOCK_R): y = act(xhat * w + b), the row
    held at once (SINGLE) or swept in chunks."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < R
    row_offsets = rows * M
    cols = tl.arange(0, BLOCK_M)
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    if SINGLE:
        col_mask = cols < M
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = row_offsets[:, None] + cols[None, :]
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        m, dm, istd = _block_stats(v, mask, M, eps, RMS)
        z = ((v - m[:, None]) - dm[:, None]) * istd[:, None]
        if HAS_WEIGHT:
            z = z * tl.load(w + cols, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
        if HAS_BIAS:
            z = z + tl.load(b + cols, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
        tl.store(y + offsets, store_value(numerics.activate(z, ACTIVATION), y.dtype.element_ty, INTERP), mask=mask)
    else:
        m, dm, istd, _c1, _c2 = _row_sweep_stats(x, x, x, w, row_offsets, row_mask, M, eps, False, HAS_WEIGHT, RMS,
                                                 numerics.ACT_IDENTITY, COMPUTE_TYPE, BLOCK_R, BLOCK_M)
        for start in range(0, M, BLOCK_M):
            c = start + cols
            col_mask = c < M
            mask = row_mask[:, None] & col_mask[None, :]
            offsets = row_offsets[:, None] + c[None, :]
            v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
            z = ((v - m[:, None]) - dm[:, None]) * istd[:, None]
            if HAS_WEIGHT:
                z = z * tl.load(w + c, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
            if HAS_BIAS:
                z = z + tl.load(b + c, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
            tl.store(y + offsets, store_value(numerics.activate(z, ACTIVATION), y.dtype.element_ty, INTERP),
                     mask=mask)


@triton.jit
def _rows_backward_kernel(grad, out, x, w, dx, partials, dw, db, R, M, eps_hi, eps_lo, num_blocks, blocks_per_program,
                          HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr,
                          ACTIVATION: tl.constexpr, DIRECT: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                          INTERP: tl.constexpr, SINGLE: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_M: tl.constexpr):
    """Program p over the row blocks [p * blocks_per_program, + blocks_per_program):
    dx of its rows, and (HAS_WEIGHT / HAS_BIAS) its sums of g * xhat and g over
    them into partials[p, 0:2, :], or with one program (DIRECT, SINGLE only)
    straight into dw and db."""
    p = tl.program_id(0)
    blk_lo = p * blocks_per_program
    blk_hi = tl.minimum(blk_lo + blocks_per_program, num_blocks)
    cols = tl.arange(0, BLOCK_M)
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    part = partials + p.to(tl.int64) * (2 * M)
    if SINGLE:
        col_mask = cols < M
        if HAS_WEIGHT:
            wv = tl.load(w + cols, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
        acc_dw = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
        acc_db = tl.zeros((BLOCK_R, BLOCK_M), COMPUTE_TYPE)
        for blk in range(blk_lo, blk_hi):
            rows = (blk * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
            mask = (rows < R)[:, None] & col_mask[None, :]
            offsets = (rows * M)[:, None] + cols[None, :]
            v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
            g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
            m, dm, istd = _block_stats(v, mask, M, eps, RMS)
            xhat = tl.where(mask, ((v - m[:, None]) - dm[:, None]) * istd[:, None], 0.0)
            gw = g
            if HAS_WEIGHT:
                gw = g * wv
            c2 = tl.sum(gw * xhat, axis=1) / M
            d = gw - xhat * c2[:, None]
            if not RMS:
                d = d - (tl.sum(gw, axis=1) / M)[:, None]
            tl.store(dx + offsets, store_value(istd[:, None] * d, dx.dtype.element_ty, INTERP), mask=mask)
            if HAS_WEIGHT:
                acc_dw += g * xhat
            if HAS_BIAS:
                acc_db += g
        if DIRECT:
            if HAS_WEIGHT:
                tl.store(dw + cols, store_value(tl.sum(acc_dw, axis=0), dw.dtype.element_ty, INTERP), mask=col_mask)
            if HAS_BIAS:
                tl.store(db + cols, store_value(tl.sum(acc_db, axis=0), db.dtype.element_ty, INTERP), mask=col_mask)
        else:
            if HAS_WEIGHT:
                tl.store(part + cols, tl.sum(acc_dw, axis=0), mask=col_mask)
            if HAS_BIAS:
                tl.store(part + M + cols, tl.sum(acc_db, axis=0), mask=col_mask)
    else:
        for blk in range(blk_lo, blk_hi):
            rows = (blk * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
            row_mask = rows < R
            row_offsets = rows * M
            m, dm, istd, c1, c2 = _row_sweep_stats(x, grad, out, w, row_offsets, row_mask, M, eps, True, HAS_WEIGHT,
                                                   RMS, ACTIVATION, COMPUTE_TYPE, BLOCK_R, BLOCK_M)
            for start in range(0, M, BLOCK_M):
                c = start + cols
                col_mask = c < M
                mask = row_mask[:, None] & col_mask[None, :]
                offsets = row_offsets[:, None] + c[None, :]
                v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
                g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
                xhat = tl.where(mask, ((v - m[:, None]) - dm[:, None]) * istd[:, None], 0.0)
                gw = g
                if HAS_WEIGHT:
                    gw = g * tl.load(w + c, mask=col_mask, other=0.0).to(COMPUTE_TYPE)[None, :]
                d = istd[:, None] * ((gw - c1[:, None]) - xhat * c2[:, None])
                tl.store(dx + offsets, store_value(d, dx.dtype.element_ty, INTERP), mask=mask)
                # this program's running sums over its rows, in its own row of the workspace
                # (the first row block stores, the others add: no read of memory never written)
                later = col_mask & (c >= M * (blk == blk_lo))   # false on the first row block
                if HAS_WEIGHT:
                    s = tl.sum(g * xhat, axis=0) + tl.load(part + c, mask=later, other=0.0)
                    tl.store(part + c, s, mask=col_mask)
                if HAS_BIAS:
                    s = tl.sum(g, axis=0) + tl.load(part + M + c, mask=later, other=0.0)
                    tl.store(part + M + c, s, mask=col_mask)


@triton.jit
def _sum_partials_kernel(partials, dw, db, programs, M, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         INTERP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr):
    """Columns [program * BLOCK_M, + BLOCK_M): dw = sum_p partials[p, 0, :] and
    db = sum_p partials[p, 1, :], the programs added in order (the same
    blocks, the same tree inside a block: the same bits every run)."""
    cols = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    acc_w = tl.zeros((BLOCK_P, BLOCK_M), partials.dtype.element_ty)
    acc_b = tl.zeros((BLOCK_P, BLOCK_M), partials.dtype.element_ty)
    for start in range(0, programs, BLOCK_P):
        ps = start + tl.arange(0, BLOCK_P)
        mask = (ps < programs)[:, None] & col_mask[None, :]
        offsets = (ps.to(tl.int64) * (2 * M))[:, None] + cols[None, :]
        if HAS_WEIGHT:
            acc_w += tl.load(partials + offsets, mask=mask, other=0.0)
        if HAS_BIAS:
            acc_b += tl.load(partials + offsets + M, mask=mask, other=0.0)
    if HAS_WEIGHT:
        tl.store(dw + cols, store_value(tl.sum(acc_w, axis=0), dw.dtype.element_ty, INTERP), mask=col_mask)
    if HAS_BIAS:
        tl.store(db + cols, store_value(tl.sum(acc_b, axis=0), db.dtype.element_ty, INTERP), mask=col_mask)


# --- groupnorm and instance norm: rows of channel groups ---------------------------------------------

@triton.jit
def _group_tile(t, row, Cg, S, tiles_s, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Tile t of row ``row`` = n * G + g: the element offsets, mask and the
    channels within the group (0 .. C/G - 1) of BLOCK_C channels by BLOCK_S
    positions (row-major tiles: channel blocks outside, position blocks inside)."""
    tile_c = t // tiles_s
    tile_s = t - tile_c * tiles_s
    cl = tile_c * BLOCK_C + tl.arange(0, BLOCK_C)
    s = tile_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offsets = ((row * Cg + cl) * S)[:, None] + s[None, :]
    mask = (cl < Cg)[:, None] & (s < S)[None, :]
    return offsets, mask, cl


@triton.jit
def _group_mean(x, row, Cg, S, M, tiles_s, num_tiles, COMPUTE_TYPE: tl.constexpr, BLOCK_C: tl.constexpr,
                BLOCK_S: tl.constexpr):
    """Sweep 1: the plain mean m of row ``row``."""
    acc = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
    for t in range(0, num_tiles):
        offsets, mask, _cl = _group_tile(t, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
        acc += tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
    return tl.sum(acc) / M


@triton.jit
def _groupnorm_forward_kernel(x, w, b, y, stats, G, Cg, S, M, tiles_s, num_tiles, eps_hi, eps_lo,
                              HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, NORMALISE: tl.constexpr,
                              STORE_STATS: tl.constexpr, ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                              INTERP: tl.constexpr, SINGLE: tl.constexpr, BLOCK_C: tl.constexpr,
                              BLOCK_S: tl.constexpr):
    """Program = row (n * G + g): y = act(xhat * w[c] + b[c]) over the group
    (NORMALISE), and (STORE_STATS, instance norm's running statistics) the
    row's mean (its plain mean where infinite) and squared deviations into
    stats[row, 0:2]. The group is held at once (SINGLE: one tile) or swept."""
    row = tl.program_id(0).to(tl.int64)
    g_idx = row % G
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    if SINGLE:
        offsets, mask, cl = _group_tile(0, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        m = tl.sum(v) / M
        d = tl.where(mask, v - m, 0.0)
        sum_d = tl.sum(d)
        dm = sum_d / M
        sqdev = tl.sum(d * d) - sum_d * dm
    else:
        m = _group_mean(x, row, Cg, S, M, tiles_s, num_tiles, COMPUTE_TYPE, BLOCK_C, BLOCK_S)
        acc_d = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
        acc_dd = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
        for t in range(0, num_tiles):
            offsets, mask, cl = _group_tile(t, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
            d = tl.where(mask, tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE) - m, 0.0)
            acc_d += d
            acc_dd += d * d
        sum_d = tl.sum(acc_d)
        dm = sum_d / M
        sqdev = tl.sum(acc_dd) - sum_d * dm
    if STORE_STATS:
        tl.store(stats + row * 2, tl.where(tl.abs(m) < float("inf"), m + dm, m))
        tl.store(stats + row * 2 + 1, sqdev)
    if NORMALISE:
        istd = _inverse_std(sqdev, M, eps)
        for t in range(0, num_tiles):
            if not SINGLE:
                offsets, mask, cl = _group_tile(t, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
                v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
            z = ((v - m) - dm) * istd
            c = g_idx * Cg + cl
            if HAS_WEIGHT:
                z = z * tl.load(w + c, mask=cl < Cg, other=0.0).to(COMPUTE_TYPE)[:, None]
            if HAS_BIAS:
                z = z + tl.load(b + c, mask=cl < Cg, other=0.0).to(COMPUTE_TYPE)[:, None]
            tl.store(y + offsets, store_value(numerics.activate(z, ACTIVATION), y.dtype.element_ty, INTERP),
                     mask=mask)


@triton.jit
def _groupnorm_backward_kernel(grad, out, x, w, dx, channel_sums, row_stats, G, Cg, S, M, tiles_s, tiles_c,
                               eps_hi, eps_lo, HAS_WEIGHT: tl.constexpr, PARAM_GRADS: tl.constexpr,
                               ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                               BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program = row (n * G + g): dx over the group, and (PARAM_GRADS) per
    channel c of the group sum_s g d and sum_s g (d = x - m) into
    channel_sums[n, c, 0:2] and the row's (dm, istd) into row_stats[row, 0:2]."""
    row = tl.program_id(0).to(tl.int64)
    g_idx = row % G
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    num_tiles = tiles_c * tiles_s
    m = _group_mean(x, row, Cg, S, M, tiles_s, num_tiles, COMPUTE_TYPE, BLOCK_C, BLOCK_S)
    acc_d = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
    acc_dd = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
    sum_gw = tl.sum(tl.zeros((BLOCK_C,), COMPUTE_TYPE))
    sum_gwd = tl.sum(tl.zeros((BLOCK_C,), COMPUTE_TYPE))
    for tc in range(0, tiles_c):
        acc_g = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
        acc_gd = tl.zeros((BLOCK_C, BLOCK_S), COMPUTE_TYPE)
        for ts in range(0, tiles_s):
            offsets, mask, cl = _group_tile(tc * tiles_s + ts, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
            d = tl.where(mask, tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE) - m, 0.0)
            g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
            acc_d += d
            acc_dd += d * d
            acc_g += g
            acc_gd += g * d
        # per channel of the block: sum_s g and sum_s g d; the weight is constant along a channel,
        # so the group's sums of gw and gw d are those weighted by it
        cl = tc * BLOCK_C + tl.arange(0, BLOCK_C)
        sum_g = tl.sum(acc_g, axis=1)
        sum_gd = tl.sum(acc_gd, axis=1)
        if HAS_WEIGHT:
            wc = tl.load(w + g_idx * Cg + cl, mask=cl < Cg, other=0.0).to(COMPUTE_TYPE)
            sum_gw += tl.sum(wc * sum_g)
            sum_gwd += tl.sum(wc * sum_gd)
        else:
            sum_gw += tl.sum(sum_g)
            sum_gwd += tl.sum(sum_gd)
        if PARAM_GRADS:
            where = channel_sums + ((row // G) * (G * Cg) + g_idx * Cg + cl) * 2
            tl.store(where, sum_gd, mask=cl < Cg)
            tl.store(where + 1, sum_g, mask=cl < Cg)
    sum_d = tl.sum(acc_d)
    dm = sum_d / M
    istd = _inverse_std(tl.sum(acc_dd) - sum_d * dm, M, eps)
    c1 = sum_gw / M
    c2 = istd * (sum_gwd - dm * sum_gw) / M
    if PARAM_GRADS:
        tl.store(row_stats + row * 2, dm)
        tl.store(row_stats + row * 2 + 1, istd)
    for t in range(0, num_tiles):
        offsets, mask, cl = _group_tile(t, row, Cg, S, tiles_s, BLOCK_C, BLOCK_S)
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        gw = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
        if HAS_WEIGHT:
            gw = gw * tl.load(w + g_idx * Cg + cl, mask=cl < Cg, other=0.0).to(COMPUTE_TYPE)[:, None]
        xhat = ((v - m) - dm) * istd
        tl.store(dx + offsets, store_value(istd * ((gw - c1) - xhat * c2), dx.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _groupnorm_param_grads_kernel(channel_sums, row_stats, dw, db, N, C, G, Cg, HAS_WEIGHT: tl.constexpr,
                                  HAS_BIAS: tl.constexpr, INTERP: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_C: tl.constexpr):
    """Channels [program * BLOCK_C, + BLOCK_C): dw[c] = sum_n istd (sum g d -
    dm sum g) and db[c] = sum_n sum g, over n in order."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    group = c // Cg
    acc_w = tl.zeros((BLOCK_N, BLOCK_C), channel_sums.dtype.element_ty)
    acc_b = tl.zeros((BLOCK_N, BLOCK_C), channel_sums.dtype.element_ty)
    for start in range(0, N, BLOCK_N):
        n = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask = (n < N)[:, None] & c_mask[None, :]
        where = ((n * C)[:, None] + c[None, :]) * 2
        sum_g = tl.load(channel_sums + where + 1, mask=mask, other=0.0)
        acc_b += sum_g
        if HAS_WEIGHT:
            stats = ((n * G)[:, None] + group[None, :]) * 2
            dm = tl.load(row_stats + stats, mask=mask, other=0.0)
            istd = tl.load(row_stats + stats + 1, mask=mask, other=0.0)
            sum_gd = tl.load(channel_sums + where, mask=mask, other=0.0)
            acc_w += tl.where(mask, istd * (sum_gd - dm * sum_g), 0.0)
    if HAS_WEIGHT:
        tl.store(dw + c, store_value(tl.sum(acc_w, axis=0), dw.dtype.element_ty, INTERP), mask=c_mask)
    if HAS_BIAS:
        tl.store(db + c, store_value(tl.sum(acc_b, axis=0), db.dtype.element_ty, INTERP), mask=c_mask)


@triton.jit
def _instance_running_kernel(stats, running_mean, running_mean_stride, running_var, running_var_stride,
                             moved_mean, moved_mean_stride, moved_var, moved_var_stride, N, C, divisor,
                             momentum_hi, momentum_lo, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """Channels [program * BLOCK_C, + BLOCK_C): moved = (1 - momentum) * running
    + momentum * the average over n (in order) of the instances' means and
    unbiased variances sqdev / divisor (max(S - 1, 1), a float), from stats[n, c, 0:2]."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    acc_m = tl.zeros((BLOCK_N, BLOCK_C), COMPUTE_TYPE)
    acc_v = tl.zeros((BLOCK_N, BLOCK_C), COMPUTE_TYPE)
    for start in range(0, N, BLOCK_N):
        n = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask = (n < N)[:, None] & c_mask[None, :]
        where = ((n * C)[:, None] + c[None, :]) * 2
        acc_m += tl.load(stats + where, mask=mask, other=0.0)
        acc_v += numerics.maximum(tl.load(stats + where + 1, mask=mask, other=0.0), 0.0) / divisor
    momentum = from_float32_pair(momentum_hi, momentum_lo, COMPUTE_TYPE)
    keep = 1.0 - momentum
    old_mean = tl.load(running_mean + c * running_mean_stride, mask=c_mask, other=0.0).to(COMPUTE_TYPE)
    old_var = tl.load(running_var + c * running_var_stride, mask=c_mask, other=0.0).to(COMPUTE_TYPE)
    new_mean = keep * old_mean + momentum * (tl.sum(acc_m, axis=0) / N)
    new_var = keep * old_var + momentum * (tl.sum(acc_v, axis=0) / N)
    tl.store(moved_mean + c * moved_mean_stride, store_value(new_mean, moved_mean.dtype.element_ty, INTERP),
             mask=c_mask)
    tl.store(moved_var + c * moved_var_stride, store_value(new_var, moved_var.dtype.element_ty, INTERP),
             mask=c_mask)


# --- host side: plans ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _RowPlan:
    """How rows of one geometry are launched: BLOCK_R rows of BLOCK_M values
    per step, whole rows at once (single) or in chunks, and the backward's
    programs, each over ``blocks_per_program`` consecutive row blocks."""
    block_r: int
    block_m: int
    single: bool
    num_warps: int
    programs: int
    blocks_per_program: int

    @property
    def meta(self):
        return dict(SINGLE=self.single, BLOCK_R=self.block_r, BLOCK_M=self.block_m, num_warps=self.num_warps)


def _warps(values, itemsize):
    """Warps for a tile of ``values`` values: one 16-byte load per thread (1 to 16 warps)."""
    return max(1, min(16, values * itemsize // (32 * _BYTES_PER_THREAD)))


@functools.lru_cache(maxsize=1024)
def _row_plan(r, m, itemsize, direction, interpret, sms):
    """The blocks of a layernorm/rmsnorm of R rows of M values (``direction``
    "forward" or "backward"). The interpreter holds up to _INTERP_TILE values
    at once; a GPU whole rows of up to _GPU_ROW_BLOCK values (several short
    rows per program, up to _GPU_TILE values), longer rows in chunks of that
    many. The backward's programs: a few in the interpreter, on a GPU two
    waves' worth of the SMs at most (their partial sums cost a workspace row each)."""
    most = _INTERP_TILE if interpret else _GPU_ROW_BLOCK[direction]
    single = m <= most
    block_m = launch.next_pow2(m) if single else (_INTERP_TILE if interpret else min(_GPU_CHUNK, most))
    tile = _INTERP_TILE if interpret else max(_GPU_TILE, block_m)
    block_r = min(launch.next_pow2(r), max(1, tile // block_m)) if single else 1
    warps = _warps(block_r * block_m, itemsize)
    blocks = launch.cdiv(max(r, 1), block_r)
    most_programs = _INTERP_PROGRAMS if interpret else 2 * sms * max(1, SATURATING_WARPS // warps)
    per_program = launch.cdiv(blocks, min(blocks, most_programs))
    return _RowPlan(block_r, block_m, single, warps, launch.cdiv(blocks, per_program), per_program)


@dataclass(frozen=True)
class _GroupPlan:
    """Tiles of BLOCK_C channels by BLOCK_S positions over each group."""
    block_c: int
    block_s: int
    tiles_s: int
    tiles_c: int
    num_warps: int

    @property
    def num_tiles(self):
        return self.tiles_c * self.tiles_s

    @property
    def meta(self):
        return dict(BLOCK_C=self.block_c, BLOCK_S=self.block_s, num_warps=self.num_warps)


@functools.lru_cache(maxsize=1024)
def _group_plan(cg, s, itemsize, interpret):
    """Tiles of a group of ``cg`` channels by ``s`` positions: whole rows of
    positions where they fit, up to _INTERP_TILE values in the interpreter
    and _GPU_TILE on a GPU (one 16-byte load per thread)."""
    tile = _INTERP_TILE if interpret else _GPU_TILE
    block_s = min(launch.next_pow2(s), tile)
    block_c = min(launch.next_pow2(cg), max(1, tile // block_s))
    return _GroupPlan(block_c, block_s, launch.cdiv(max(s, 1), block_s), launch.cdiv(max(cg, 1), block_c),
                      _warps(block_c * block_s, itemsize))


def _workspace_dtype(x):
    """Partial sums and statistics are kept in the compute type."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _eps(spec):
    return numerics.float32_pair(spec.eps)


def _zeros(shape, like):
    return copy.full(tuple(shape), 0.0, like.dtype, like.device)


def _dense(*tensors):
    return tuple(copy.contiguous(t) for t in tensors)


def _grad_and_output(grad, out, activation):
    """The dense gradient (broadcast to the output first when it is a
    broadcast view) and the output, which the kernels read only through a
    fused activation (else the gradient stands in for it), and the ACTIVATION code."""
    act = ACTIVATION_CODES[activation]
    grad = copy.contiguous(grad)
    return grad, (copy.contiguous(out) if act != numerics.ACT_IDENTITY.value else grad), act


# --- host side: layernorm and rmsnorm ----------------------------------------------------------------

def _rows_forward(spec, x, params):
    y = launch.empty(x.shape, x.dtype, x.device)
    r, m = spec.rows, spec.row_length
    if r == 0 or m == 0:
        return y
    x, *params = _dense(x, *params)
    plan = _row_plan(r, m, x.element_size(), "forward", launch.INTERPRET, launch.sm_count(x.get_device()))
    w = params[0] if spec.has_weight else x
    b = params[1] if spec.has_bias else x
    launch.launch(_rows_forward_kernel, (launch.cdiv(r, plan.block_r),), x, w, b, y, r, m, *_eps(spec),
                  HAS_WEIGHT=spec.has_weight, HAS_BIAS=spec.has_bias, RMS=spec.primitive == "rmsnorm",
                  ACTIVATION=ACTIVATION_CODES[spec.activation], COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  INTERP=launch.INTERPRET, **plan.meta)
    return y


def _rows_backward(spec, grad, out, x, params):
    r, m = spec.rows, spec.row_length
    dx = launch.empty(x.shape, x.dtype, x.device)
    grads = [launch.empty(p.shape, p.dtype, p.device) for p in params]
    if r == 0 or m == 0:
        return (dx,) + tuple(_zeros(p.shape, p) for p in params)
    x, *params = _dense(x, *params)
    grad, out, act = _grad_and_output(grad, out, spec.activation)
    plan = _row_plan(r, m, x.element_size(), "backward", launch.INTERPRET, launch.sm_count(x.get_device()))
    direct = plan.single and plan.programs == 1
    partials = x if direct or not params else launch.empty((plan.programs, _FIELDS, m), _workspace_dtype(x),
                                                           x.device)
    w = params[0] if spec.has_weight else x
    dw = grads[0] if spec.has_weight else dx
    db = grads[1] if spec.has_bias else dx
    launch.launch(_rows_backward_kernel, (plan.programs,), grad, out, x, w, dx, partials, dw, db, r, m, *_eps(spec),
                  launch.cdiv(r, plan.block_r), plan.blocks_per_program, HAS_WEIGHT=spec.has_weight, HAS_BIAS=spec.has_bias,
                  RMS=spec.primitive == "rmsnorm", ACTIVATION=act, DIRECT=direct,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET, **plan.meta)
    if params and not direct:
        block_m = min(launch.next_pow2(m), 64 if not launch.INTERPRET else _INTERP_TILE // 4)
        block_p = min(launch.next_pow2(plan.programs), 16 if not launch.INTERPRET else 1024)
        launch.launch(_sum_partials_kernel, (launch.cdiv(m, block_m),), partials, dw, db, plan.programs, m,
                      HAS_WEIGHT=spec.has_weight, HAS_BIAS=spec.has_bias, INTERP=launch.INTERPRET,
                      BLOCK_P=block_p, BLOCK_M=block_m, num_warps=_warps(block_p * block_m, 4))
    return (dx,) + tuple(grads)


def _row_spec(primitive, x, params, normalised_ndim, eps, activation="identity"):
    shapes = tuple(tuple(p.shape) for p in params)
    if primitive == "layernorm":
        return layernorm_spec(tuple(x.shape), shapes, x.dtype, normalised_ndim, eps, activation)
    return rmsnorm_spec(tuple(x.shape), shapes, x.dtype, normalised_ndim, eps)


def layernorm_forward(x, weight=None, bias=None, normalised_ndim=1, eps=1e-5, activation="identity"):
    params = tuple(p for p in (weight, bias) if p is not None)
    return _rows_forward(_row_spec("layernorm", x, params, normalised_ndim, eps, activation), x, params)


def layernorm_backward(grad, out, x, weight=None, bias=None, normalised_ndim=1, eps=1e-5, activation="identity"):
    params = tuple(p for p in (weight, bias) if p is not None)
    return _rows_backward(_row_spec("layernorm", x, params, normalised_ndim, eps, activation), grad, out, x, params)


def rmsnorm_forward(x, weight=None, normalised_ndim=1, eps=None):
    params = () if weight is None else (weight,)
    return _rows_forward(_row_spec("rmsnorm", x, params, normalised_ndim, eps), x, params)


def rmsnorm_backward(grad, out, x, weight=None, normalised_ndim=1, eps=None):
    params = () if weight is None else (weight,)
    return _rows_backward(_row_spec("rmsnorm", x, params, normalised_ndim, eps), grad, out, x, params)


# --- host side: groupnorm and instance norm --------------------------------------------------------

def _group_sizes(spec):
    """G, C/G, S, M: the kernels' geometry arguments."""
    return spec.groups, spec.channels_per_group, spec.spatial_size, spec.row_length


def _groups_forward(spec, x, params, running=(), moved=(), momentum=0.1, normalise=True):
    """y (``normalise``, else None) of a groupnorm, and given ``running`` =
    (running_mean, running_var) their move, in place or into ``moved``.
    Everything is allocated before the first launch."""
    y = launch.empty(x.shape, x.dtype, x.device) if normalise else None
    rows, m = spec.rows, spec.row_length
    moves = bool(running) and spec.batch > 0 and spec.channels > 0 and spec.spatial_size > 0
    if running and not moves:
        for source, destination in zip(running, moved):    # nothing moves: the moved ones are the old
            copy.copy_into(destination, source)
    if rows == 0 or m == 0:
        return y
    x, *params = _dense(x, *params)
    stats = launch.empty((rows, _FIELDS), _workspace_dtype(x), x.device) if moves else x
    plan = _group_plan(spec.channels_per_group, spec.spatial_size, x.element_size(), launch.INTERPRET)
    w = params[0] if spec.has_weight else x
    b = params[1] if spec.has_bias else x
    launch.launch(_groupnorm_forward_kernel, (rows,), x, w, b, y if normalise else x, stats, *_group_sizes(spec),
                  plan.tiles_s, plan.num_tiles, *_eps(spec), HAS_WEIGHT=spec.has_weight, HAS_BIAS=spec.has_bias,
                  NORMALISE=normalise, STORE_STATS=moves, ACTIVATION=ACTIVATION_CODES[spec.activation],
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET,
                  SINGLE=plan.num_tiles == 1, **plan.meta)
    if moves:
        running_mean, running_var = running
        moved_mean, moved_var = moved or running
        n, c = spec.batch, spec.channels
        block_c = min(launch.next_pow2(c), 128 if not launch.INTERPRET else 4096)
        block_n = min(launch.next_pow2(n), 8 if not launch.INTERPRET else 1024)
        launch.launch(_instance_running_kernel, (launch.cdiv(c, block_c),), stats,
                      running_mean, running_mean.stride(0), running_var, running_var.stride(0),
                      moved_mean, moved_mean.stride(0), moved_var, moved_var.stride(0), n, c, float(max(spec.spatial_size - 1, 1)),
                      *numerics.float32_pair(momentum), COMPUTE_TYPE=numerics.compute_type(x.dtype),
                      INTERP=launch.INTERPRET, BLOCK_N=block_n, BLOCK_C=block_c,
                      num_warps=_warps(block_n * block_c, 4))
    return y


def _groups_backward(spec, grad, out, x, params):
    rows, m = spec.rows, spec.row_length
    dx = launch.empty(x.shape, x.dtype, x.device)
    grads = [launch.empty(p.shape, p.dtype, p.device) for p in params]
    if rows == 0 or m == 0:
        return (dx,) + tuple(_zeros(p.shape, p) for p in params)
    x, *params = _dense(x, *params)
    grad, out, act = _grad_and_output(grad, out, spec.activation)
    n, c = spec.batch, spec.channels
    if params:
        channel_sums = launch.empty((n, c, _FIELDS), _workspace_dtype(x), x.device)
        row_stats = launch.empty((rows, _FIELDS), _workspace_dtype(x), x.device)
    else:
        channel_sums = row_stats = x
    plan = _group_plan(spec.channels_per_group, spec.spatial_size, x.element_size(), launch.INTERPRET)
    w = params[0] if spec.has_weight else x
    launch.launch(_groupnorm_backward_kernel, (rows,), grad, out, x, w, dx, channel_sums, row_stats,
                  *_group_sizes(spec), plan.tiles_s, plan.tiles_c, *_eps(spec), HAS_WEIGHT=spec.has_weight,
                  PARAM_GRADS=bool(params), ACTIVATION=act, COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  INTERP=launch.INTERPRET, **plan.meta)
    if params:
        dw = grads[0]
        db = grads[1] if spec.has_bias else dw
        block_c = min(launch.next_pow2(c), 128 if not launch.INTERPRET else 4096)
        block_n = min(launch.next_pow2(n), 8 if not launch.INTERPRET else 1024)
        launch.launch(_groupnorm_param_grads_kernel, (launch.cdiv(c, block_c),), channel_sums, row_stats, dw, db,
                      n, c, spec.groups, spec.channels_per_group, HAS_WEIGHT=spec.has_weight,
                      HAS_BIAS=spec.has_bias, INTERP=launch.INTERPRET, BLOCK_N=block_n, BLOCK_C=block_c,
                      num_warps=_warps(block_n * block_c, 4))
    return (dx,) + tuple(grads)


def _group_spec(x, params, groups, eps, activation):
    return groupnorm_spec(tuple(x.shape), tuple(tuple(p.shape) for p in params), x.dtype, groups, eps, activation)


def groupnorm_forward(x, weight=None, bias=None, *, groups, eps=1e-5, activation="identity"):
    params = tuple(p for p in (weight, bias) if p is not None)
    return _groups_forward(_group_spec(x, params, groups, eps, activation), x, params)


def groupnorm_backward(grad, out, x, weight=None, bias=None, *, groups, eps=1e-5, activation="identity"):
    params = tuple(p for p in (weight, bias) if p is not None)
    return _groups_backward(_group_spec(x, params, groups, eps, activation), grad, out, x, params)


def _instance_spec(x, tensors, affine, eps, activation, primitive="instancenorm_train"):
    params, running, moved = instancenorm_inputs(tensors, affine)
    spec = instancenorm_spec(tuple(x.shape), tuple(tuple(p.shape) for p in params),
                             tuple(tuple(v.shape) for v in running + moved), x.dtype, eps, activation, bool(moved),
                             primitive)
    return spec, params, running, moved


def instancenorm_train_forward(x, *tensors, affine=False, eps=1e-5, momentum=0.1, activation="identity"):
    spec, params, running, moved = _instance_spec(x, tensors, affine, eps, activation)
    return _groups_forward(spec, x, params, running, moved, momentum)


def instancenorm_train_backward(grad, out, x, *tensors, affine=False, eps=1e-5, momentum=0.1,
                                activation="identity"):
    spec, params, running, moved = _instance_spec(x, tensors, affine, eps, activation)
    return _groups_backward(spec, grad, out, x, params) + (None,) * (len(running) + len(moved))


def instancenorm_running_update_forward(x, running_mean, running_var, momentum=0.1):
    spec, _, running, _ = _instance_spec(x, (running_mean, running_var), False, 1e-5, "identity",
                                         "instancenorm_running_update")
    _groups_forward(spec, x, (), running, (), momentum, normalise=False)
