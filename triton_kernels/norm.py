"""Normalisation family, Triton kernels: batch normalisation.

``x`` (N, C, ...) is read as a dense (N, C, S) array (S = prod(spatial); a
non-contiguous ``x`` or gradient is first made dense by ``copy.contiguous``).
Channel c's M = N * S values form an (N, S) matrix whose rows lie C * S
apart; it is covered by tiles of BLOCK_SIZE_N rows by BLOCK_SIZE_S
positions (whole rows where S is short), so a tile's inner index is
contiguous (vector loads) and no offset needs a division.

Work split. The tiles of each channel are shared by ``splits`` programs
(grid (C, splits)): on a GPU as many as fill its SMs best by the wave
model (:func:`_plan`, ``reduce.splits_for_waves``), in the interpreter one
per channel, with one tile per channel where it fits (the interpreter pays
per program and per loop iteration). Without a split (one program per
channel), each kernel takes its channel's statistics itself
(:func:`_own_stats`) and a training step's forward, running statistics
included, is one launch, as is its backward. With a split, a reduction over
a channel takes two launches, with no atomics, so the result does not
depend on timing:

1. ``_partial_stats_kernel``: program (c, p) takes the corrected two-pass
   statistics of its own values (:func:`_own_stats`; sweep 1: count n_p and
   mean m_p; sweep 2, over d = x - m_p: dm_p = sum(d) / n_p and
   q_p = sum(d^2) - sum(d) dm_p, the squared deviations from m_p + dm_p),
   and for a backward the sums of g and g * d, into a (C, FIELDS, splits)
   workspace;
2. every program of channel c combines the partials in the same order
   (:func:`_channel_stats`; the programs agree bit for bit)::

       mu  = sum n_p m_p / M          e_p = (m_p - mu) + dm_p
       dmu = sum n_p e_p / M          var = (sum q_p + sum n_p (e_p - dmu)^2) / M

   The mean is kept as the two numbers mu + dmu (xhat = ((x - mu) - dmu) *
   istd) so its rounding does not show in x - mean (all-equal or nearly
   equal x, large offsets); m_p - mu is small and exact or nearly, and the
   variance is Chan et al.'s combination of the partial ones.

Then ``_batchnorm_train_forward_kernel`` writes y = gamma * xhat + beta over
the program's tiles, and program p = 0 moves the running statistics when
asked (``batchnorm_running_update`` runs only that part, grid (C, 1));
``_batchnorm_train_backward_kernel`` writes dx = gamma * istd / M * (M g -
dbeta - xhat * dgamma) with dbeta = sum g and dgamma = istd * sum g (x -
mean), the latter as sum_p [sum g d + ((m_p - mu) - dmu) sum g] over the
partials, and program p = 0 stores dgamma and dbeta.

Every kernel that writes y applies the layer's ``ACTIVATION`` (numerics.activate)
before its store, and every backward reads g through it (dL/dz = g * act'(z)
from the output y: :func:`_load_grad`), so ``BatchNorm(C, relu)`` costs no
launch of its own.

``batchnorm_test`` is elementwise with per-channel constants (one launch,
grid (C, splits)); its backward also sums g and g * xhat per program, and
with a split ``_sum_partials_kernel`` adds those up per channel.

Arithmetic in float32 (float64 for float64). Per-channel vectors (gamma,
beta, mean, var, the running statistics) are read and written through their
stride.
"""
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import copy, launch, numerics
from .numerics import ACTIVATION_CODES, from_float32_pair, store_value
from .reduce import splits_for_waves
from ..specs.norm import batchnorm_spec

#: the fields of the partial-statistics workspace (C, FIELDS, splits), per program:
#: its count n_p, mean m_p, mean correction dm_p, squared deviations q_p, and in a
#: backward sum(g) and sum(g * (x - m_p))
FIELD_COUNT = tl.constexpr(0)
FIELD_MEAN = tl.constexpr(1)
FIELD_DMEAN = tl.constexpr(2)
FIELD_SQDEV = tl.constexpr(3)
FIELD_SUM_G = tl.constexpr(4)
FIELD_SUM_GD = tl.constexpr(5)
FIELDS = tl.constexpr(6)

#: values per tile on a GPU (half as many in float64, whose accumulators take twice the registers)
_GPU_TILE = 2048
#: bytes of x a thread of a GPU program holds per tile: one 16-byte load (so a 2,048-value
#: tile takes 16 warps in float32, 8 in bfloat16). A backward's statistics sweep keeps four
#: accumulators and three loads of a thread's values live across its loop: about 40
#: registers in float32 and 60 in bfloat16; with 16 bfloat16 values per thread ptxas spilled
#: at 96 registers on sm_90, with 8 float32 values at 64 on sm_80
_BYTES_PER_THREAD = 16
#: the most registers per thread a tiled kernel takes on a GPU, for the wave model
#: (``python -m triflux kernels``: at most 64 for sm_90 and sm_80 in the UNet and demo steps)
_GPU_REGISTERS = 64
#: values per tile at most in the interpreter (NumPy vectorises inside a program)
_INTERP_TILE = 1 << 16
#: on a GPU, every program of a split channel takes at least this many values
_MIN_VALUES_PER_PROGRAM = 4096


@triton.jit
def _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_S: tl.constexpr):
    """Tile t of channel c in a dense (N, C, S) array: the element offsets
    and mask of rows n (samples) and columns s (positions), and how many
    values it holds."""
    tile_n = t // tiles_s
    tile_s = t - tile_n * tiles_s
    n = (tile_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)).to(tl.int64)
    s = tile_s * BLOCK_SIZE_S + tl.arange(0, BLOCK_SIZE_S)
    offsets = ((n * C + c) * S)[:, None] + s[None, :]
    mask = (n < N)[:, None] & (s < S)[None, :]
    count = tl.minimum(N - tile_n * BLOCK_SIZE_N, BLOCK_SIZE_N) * tl.minimum(S - tile_s * BLOCK_SIZE_S, BLOCK_SIZE_S)
    return offsets, mask, count


@triton.jit
def _load_grad(grad, out, offsets, mask, ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """dL/dz at ``offsets``: the gradient g of the output y = act(z), through act
    (the output read only when ACTIVATION is not identity)."""
    g = tl.load(grad + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
    if ACTIVATION != numerics.ACT_IDENTITY:
        g = numerics.through_activation(g, tl.load(out + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE),
                                        ACTIVATION)
    return g


@triton.jit
def _own_stats(x, grad, out, c, p, C, N, S, tiles_s, num_tiles, tiles_per_program, WITH_GRAD: tl.constexpr,
               ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
               BLOCK_SIZE_S: tl.constexpr):
    """The statistics of program p's tiles [p * tiles_per_program, (p + 1) *
    tiles_per_program) of channel c: (n_p, m_p, dm_p, q_p, sum g, sum g (x - m_p))
    (the module docstring; g through ACTIVATION; the sums of g are 0 without WITH_GRAD)."""
    t_lo = p * tiles_per_program
    t_hi = tl.minimum(t_lo + tiles_per_program, num_tiles)
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    count = 0
    for t in range(t_lo, t_hi):
        offsets, mask, tile_count = _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N, BLOCK_SIZE_S)
        acc += tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        count += tile_count
    n_p = count.to(COMPUTE_TYPE)
    mean = tl.sum(acc) / n_p
    acc_d = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    acc_dd = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    acc_g = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    acc_gd = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    for t in range(t_lo, t_hi):
        offsets, mask, _count = _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N, BLOCK_SIZE_S)
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        d = tl.where(mask, v - mean, 0.0)
        acc_d += d
        acc_dd += d * d
        if WITH_GRAD:
            g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
            acc_g += g
            acc_gd += g * d
    sum_d = tl.sum(acc_d)
    dmean = sum_d / n_p
    return n_p, mean, dmean, tl.sum(acc_dd) - sum_d * dmean, tl.sum(acc_g), tl.sum(acc_gd)


@triton.jit
def _partial_stats_kernel(x, grad, out, partials, C, N, S, tiles_s, num_tiles, tiles_per_program, splits,
                          WITH_GRAD: tl.constexpr, ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                          BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_S: tl.constexpr):
    """Program (c, p): :func:`_own_stats` of its tiles of channel c into partials[c, :, p]."""
    c = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    n_p, mean, dmean, sqdev, sum_g, sum_gd = _own_stats(x, grad, out, c, p, C, N, S, tiles_s, num_tiles,
                                                        tiles_per_program, WITH_GRAD, ACTIVATION,
                                                        COMPUTE_TYPE, BLOCK_SIZE_N, BLOCK_SIZE_S)
    out = partials + c * (FIELDS * splits) + p
    tl.store(out + FIELD_COUNT * splits, n_p)
    tl.store(out + FIELD_MEAN * splits, mean)
    tl.store(out + FIELD_DMEAN * splits, dmean)
    tl.store(out + FIELD_SQDEV * splits, sqdev)
    if WITH_GRAD:
        tl.store(out + FIELD_SUM_G * splits, sum_g)
        tl.store(out + FIELD_SUM_GD * splits, sum_gd)


@triton.jit
def _channel_stats(partials, c, splits, M, eps, BLOCK_SIZE_P: tl.constexpr):
    """Channel c's statistics from its ``splits`` partials: (mu, dmu, sqdev,
    istd, shift) with mean = mu + dmu, sqdev = sum (x - mean)^2, istd =
    1 / sqrt(max(sqdev / M, 0) + eps), and per partial p shift_p = (m_p - mu) - dmu
    (0 past the last), so that x - mean = (x - m_p) + shift_p."""
    q = tl.arange(0, BLOCK_SIZE_P)
    valid = q < splits
    row = partials + c * (FIELDS * splits) + q
    n = tl.load(row + FIELD_COUNT * splits, mask=valid, other=0.0)
    m = tl.load(row + FIELD_MEAN * splits, mask=valid, other=0.0)
    mu = tl.sum(n * m) / M
    e = tl.where(valid, (m - mu) + tl.load(row + FIELD_DMEAN * splits, mask=valid, other=0.0), 0.0)
    dmu = tl.sum(n * e) / M
    f = tl.where(valid, e - dmu, 0.0)
    sqdev = tl.sum(tl.load(row + FIELD_SQDEV * splits, mask=valid, other=0.0)) + tl.sum(n * f * f)
    shift = tl.where(valid, (m - mu) - dmu, 0.0)
    return mu, dmu, sqdev, _inverse_std(sqdev, M, eps), shift


@triton.jit
def _inverse_std(sqdev, M, eps):
    """1 / sqrt(var + eps) with var = max(sqdev / M, 0) (NaN stays NaN)."""
    return 1.0 / tl.sqrt(numerics.maximum(sqdev / M, 0.0) + eps)


@triton.jit
def _move_running_stats(running_mean, running_mean_stride, running_var, running_var_stride,
                        moved_mean, moved_mean_stride, moved_var, moved_var_stride, c,
                        mu, dmu, sqdev, M, momentum, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """moved <- (1 - momentum) * running + momentum * batch statistic for
    channel c: the mean mu + dmu (mu itself where it is infinite: torch keeps
    +-inf) and the unbiased variance sqdev / (M - 1) (/ 1 for M = 1). The
    moved vectors are the running ones (in place) or others (kept aside)."""
    batch_mean = tl.where(tl.abs(mu) < float("inf"), mu + dmu, mu)
    unbiased = numerics.maximum(sqdev, 0.0) / tl.maximum(M - 1, 1)
    keep = 1.0 - momentum
    old_mean = tl.load(running_mean + c * running_mean_stride).to(COMPUTE_TYPE)
    old_var = tl.load(running_var + c * running_var_stride).to(COMPUTE_TYPE)
    tl.store(moved_mean + c * moved_mean_stride,
             store_value(keep * old_mean + momentum * batch_mean, moved_mean.dtype.element_ty, INTERP))
    tl.store(moved_var + c * moved_var_stride,
             store_value(keep * old_var + momentum * unbiased, moved_var.dtype.element_ty, INTERP))


@triton.jit
def _batchnorm_train_forward_kernel(x, partials, gamma, gamma_stride, beta, beta_stride, y,
                                    running_mean, running_mean_stride, running_var, running_var_stride,
                                    moved_mean, moved_mean_stride, moved_var, moved_var_stride,
                                    C, N, S, tiles_s, num_tiles, tiles_per_program, splits, M,
                                    eps_hi, eps_lo, momentum_hi, momentum_lo,
                                    SPLIT: tl.constexpr, NORMALISE: tl.constexpr, UPDATE_RUNNING: tl.constexpr,
                                    ACTIVATION: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                                    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_S: tl.constexpr,
                                    BLOCK_SIZE_P: tl.constexpr):
    """Program (c, p): y = act(gamma * xhat + beta) over its tiles of channel c
    (NORMALISE), and for p = 0 the running statistics' move into the moved ones
    (UPDATE_RUNNING).
    The statistics come from the partials (SPLIT), or without a split from
    this program's own sweeps over the whole channel (one launch in all)."""
    c = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    if SPLIT:
        mu, dmu, sqdev, istd, shift = _channel_stats(partials, c, splits, M, eps, BLOCK_SIZE_P)
    else:
        count, mu, dmu, sqdev, sum_g, sum_gd = _own_stats(x, x, x, c, p, C, N, S, tiles_s, num_tiles,
                                                          tiles_per_program, False, numerics.ACT_IDENTITY,
                                                          COMPUTE_TYPE, BLOCK_SIZE_N, BLOCK_SIZE_S)
        istd = _inverse_std(sqdev, M, eps)
    if UPDATE_RUNNING:
        if p == 0:
            _move_running_stats(running_mean, running_mean_stride, running_var, running_var_stride,
                                moved_mean, moved_mean_stride, moved_var, moved_var_stride, c, mu, dmu, sqdev, M, from_float32_pair(momentum_hi, momentum_lo, COMPUTE_TYPE),
                                COMPUTE_TYPE, INTERP)
    if NORMALISE:
        gamma_c = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE)
        beta_c = tl.load(beta + c * beta_stride).to(COMPUTE_TYPE)
        t_lo = p * tiles_per_program
        for t in range(t_lo, tl.minimum(t_lo + tiles_per_program, num_tiles)):
            offsets, mask, _count = _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N, BLOCK_SIZE_S)
            v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
            out = numerics.activate(gamma_c * (((v - mu) - dmu) * istd) + beta_c, ACTIVATION)
            tl.store(y + offsets, store_value(out, y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _batchnorm_train_backward_kernel(grad, out, x, partials, gamma, gamma_stride, dx, dgamma, dgamma_stride,
                                     dbeta, dbeta_stride, C, N, S, tiles_s, num_tiles, tiles_per_program,
                                     splits, M, eps_hi, eps_lo, SPLIT: tl.constexpr, ACTIVATION: tl.constexpr,
                                     COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                                     BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_S: tl.constexpr,
                                     BLOCK_SIZE_P: tl.constexpr):
    """Program (c, p): dx over its tiles of channel c; p = 0 stores dgamma[c]
    and dbeta[c] (the module docstring has the formulas; g is dL/dz, through
    ACTIVATION). The statistics and sums come from the partials (SPLIT) or
    from this program's own sweeps."""
    c = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    if SPLIT:
        mu, dmu, sqdev, istd, shift = _channel_stats(partials, c, splits, M, eps, BLOCK_SIZE_P)
        q = tl.arange(0, BLOCK_SIZE_P)
        row = partials + c * (FIELDS * splits) + q
        sum_g = tl.load(row + FIELD_SUM_G * splits, mask=q < splits, other=0.0)
        sum_gd = tl.load(row + FIELD_SUM_GD * splits, mask=q < splits, other=0.0)
        db = tl.sum(sum_g)
        dg = istd * tl.sum(sum_gd + shift * sum_g)
    else:
        count, mu, dmu, sqdev, db, sum_gd = _own_stats(x, grad, out, c, p, C, N, S, tiles_s, num_tiles,
                                                       tiles_per_program, True, ACTIVATION, COMPUTE_TYPE,
                                                       BLOCK_SIZE_N, BLOCK_SIZE_S)
        istd = _inverse_std(sqdev, M, eps)
        dg = istd * (sum_gd - dmu * db)
    if p == 0:
        tl.store(dbeta + c * dbeta_stride, store_value(db, dbeta.dtype.element_ty, INTERP))
        tl.store(dgamma + c * dgamma_stride, store_value(dg, dgamma.dtype.element_ty, INTERP))
    k = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE) * istd / M
    t_lo = p * tiles_per_program
    for t in range(t_lo, tl.minimum(t_lo + tiles_per_program, num_tiles)):
        offsets, mask, _count = _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N, BLOCK_SIZE_S)
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
        d = k * (M * g - db - (((v - mu) - dmu) * istd) * dg)
        tl.store(dx + offsets, store_value(d, dx.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _batchnorm_test_kernel(x, grad, out, gamma, gamma_stride, beta, beta_stride, mean, mean_stride, var,
                           var_stride, y, partials, dgamma, dgamma_stride, dbeta, dbeta_stride,
                           C, N, S, tiles_s, num_tiles, tiles_per_program, splits, eps_hi, eps_lo,
                           BACKWARD: tl.constexpr, SPLIT: tl.constexpr, ACTIVATION: tl.constexpr,
                           COMPUTE_TYPE: tl.constexpr,
                           INTERP: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_S: tl.constexpr):
    """Program (c, p), over its tiles of channel c. Forward: y = act(gamma * (x -
    mean) * istd + beta). Backward (BACKWARD), g = dL/dz through ACTIVATION from
    the forward's output ``out``: y receives dx = g * gamma * istd, and the sums of g and g * xhat go to partials[c, 0:2, p] (SPLIT) or
    straight to dbeta[c] and dgamma[c]."""
    c = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    gamma_c = tl.load(gamma + c * gamma_stride).to(COMPUTE_TYPE)
    mean_c = tl.load(mean + c * mean_stride).to(COMPUTE_TYPE)
    eps = from_float32_pair(eps_hi, eps_lo, COMPUTE_TYPE)
    istd = 1.0 / tl.sqrt(tl.load(var + c * var_stride).to(COMPUTE_TYPE) + eps)
    if BACKWARD:
        acc_g = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
        acc_gx = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_S), COMPUTE_TYPE)
    else:
        beta_c = tl.load(beta + c * beta_stride).to(COMPUTE_TYPE)
    t_lo = p * tiles_per_program
    for t in range(t_lo, tl.minimum(t_lo + tiles_per_program, num_tiles)):
        offsets, mask, _count = _tile(t, c, C, N, S, tiles_s, BLOCK_SIZE_N, BLOCK_SIZE_S)
        v = tl.load(x + offsets, mask=mask, other=0.0).to(COMPUTE_TYPE)
        if BACKWARD:
            g = _load_grad(grad, out, offsets, mask, ACTIVATION, COMPUTE_TYPE)
            acc_g += g
            acc_gx += g * ((v - mean_c) * istd)
            result = g * gamma_c * istd
        else:
            result = numerics.activate(gamma_c * ((v - mean_c) * istd) + beta_c, ACTIVATION)
        tl.store(y + offsets, store_value(result, y.dtype.element_ty, INTERP), mask=mask)
    if BACKWARD:
        if SPLIT:
            tl.store(partials + (c * 2) * splits + p, tl.sum(acc_g))
            tl.store(partials + (c * 2 + 1) * splits + p, tl.sum(acc_gx))
        else:
            tl.store(dbeta + c * dbeta_stride, store_value(tl.sum(acc_g), dbeta.dtype.element_ty, INTERP))
            tl.store(dgamma + c * dgamma_stride, store_value(tl.sum(acc_gx), dgamma.dtype.element_ty, INTERP))


@triton.jit
def _sum_partials_kernel(partials, dgamma, dgamma_stride, dbeta, dbeta_stride, splits,
                         INTERP: tl.constexpr, BLOCK_SIZE_P: tl.constexpr):
    """dbeta[c] = sum_p partials[c, 0, p], dgamma[c] = sum_p partials[c, 1, p] (c = program_id(0))."""
    c = tl.program_id(0).to(tl.int64)
    q = tl.arange(0, BLOCK_SIZE_P)
    row = partials + (c * 2) * splits + q
    db = tl.sum(tl.load(row, mask=q < splits, other=0.0))
    dg = tl.sum(tl.load(row + splits, mask=q < splits, other=0.0))
    tl.store(dbeta + c * dbeta_stride, store_value(db, dbeta.dtype.element_ty, INTERP))
    tl.store(dgamma + c * dgamma_stride, store_value(dg, dgamma.dtype.element_ty, INTERP))


# --- host side -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    """How a batch norm of one geometry is launched: the tiles of a channel
    and the programs (splits) that share them."""
    block_n: int
    block_s: int
    tiles_s: int            #: tiles across a row (S positions)
    num_tiles: int          #: tiles of one channel
    tiles_per_program: int
    splits: int             #: programs per channel
    num_warps: int          #: warps per program on a GPU

    @functools.cached_property
    def tile_args(self):
        """The tile arguments every kernel takes after C, N, S."""
        return self.tiles_s, self.num_tiles, self.tiles_per_program, self.splits

    @functools.cached_property
    def meta(self):
        """The block sizes and warps of a tiled kernel's launch (read, never changed)."""
        return dict(BLOCK_SIZE_N=self.block_n, BLOCK_SIZE_S=self.block_s, num_warps=self.num_warps)


@functools.lru_cache(maxsize=1024)
def _plan(spec, interpret, sms):
    """The tiling and split of ``spec``'s channels. The interpreter takes one
    program per channel and tiles as large as it allows; a GPU of ``sms`` SMs
    takes tiles of ``_GPU_TILE`` values (half in float64) in programs of a
    warp per 32 x ``_BYTES_PER_THREAD`` bytes of a tile (1 to 16), and the
    splits per channel that ``reduce.splits_for_waves`` finds fastest, each
    program with ``_MIN_VALUES_PER_PROGRAM`` values or more."""
    n, s = spec.x_shape[0], spec.spatial_size
    tile = _INTERP_TILE if interpret else _GPU_TILE // (2 if spec.compute_dtype.itemsize == 8 else 1)
    block_s = min(launch.next_pow2(s), tile)
    block_n = min(launch.next_pow2(n), max(tile // block_s, 1))
    tiles_s = launch.cdiv(max(s, 1), block_s)
    num_tiles = launch.cdiv(max(n, 1), block_n) * tiles_s
    warps = max(1, min(16, block_n * block_s * spec.dtype.itemsize // (32 * _BYTES_PER_THREAD)))
    splits = 1
    if not interpret:
        splits = splits_for_waves(spec.channels, num_tiles, spec.values_per_channel // _MIN_VALUES_PER_PROGRAM,
                                  warps, _GPU_REGISTERS, sms)
    per_program = launch.cdiv(num_tiles, splits)
    return _Plan(block_n, block_s, tiles_s, num_tiles, per_program, launch.cdiv(num_tiles, per_program), warps)


def _spec(x, per_channel, eps, activation="identity"):
    """The batch-norm spec of the tensor ``x`` and its per-channel vectors."""
    return batchnorm_spec(x.shape, tuple([v.shape for v in per_channel]), x.dtype, eps, activation)


def _sizes(spec):
    """C, N, S: the channels, samples and positions per sample of a dense (N, C, S) x."""
    return spec.channels, spec.x_shape[0], spec.spatial_size


@functools.lru_cache(maxsize=1024)
def _trailing(spec, interpret, sms):
    """The arguments every training kernel takes after its tensors and their
    strides: C, N, S, the tiles of ``_plan(spec, interpret, sms)``, M and eps
    as a float32 pair; made once per spec and plan."""
    plan = _plan(spec, interpret, sms)
    return (*_sizes(spec), *plan.tile_args, spec.values_per_channel, *numerics.float32_pair(spec.eps))


def _partial_stats(x, spec, plan, grad=None, out=None, activation=numerics.ACT_IDENTITY.value):
    """The partial statistics of every channel (the first launch of a split
    reduction), in a new (C, FIELDS, splits) workspace of the compute type;
    without a split, no launch (the kernels take their own statistics)."""
    if plan.splits == 1:
        return x
    partials = launch.empty((spec.channels, FIELDS.value, plan.splits), _workspace_dtype(x), x.device)
    launch.launch(_partial_stats_kernel, (spec.channels, plan.splits), x, x if grad is None else grad,
                  x if out is None else out, partials, *_sizes(spec), *plan.tile_args, WITH_GRAD=grad is not None,
                  ACTIVATION=activation, COMPUTE_TYPE=numerics.compute_type(x.dtype), **plan.meta)
    return partials


def _workspace_dtype(x):
    """The torch dtype of partial sums: the compute type."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _train_forward(x, spec, gamma, beta, running, momentum, normalise, moved=(),
                   activation=numerics.ACT_IDENTITY.value):
    """A training-mode forward in one launch, or two with a split: y
    (``normalise``, else None) and, given ``running`` = (running_mean,
    running_var), their move, in place or into ``moved``. Everything is
    allocated before the launch that writes: a call that runs out of memory
    leaves the running statistics."""
    sms = launch.sm_count(x.get_device())
    plan = _plan(spec, launch.INTERPRET, sms)
    y = launch.empty(x.shape, x.dtype, x.device) if normalise else None
    if spec.channels == 0 or spec.values_per_channel == 0:
        for source, destination in zip(running, moved):    # nothing moves: the moved ones are the old
            copy.copy_into(destination, source)
        return y
    partials = _partial_stats(x, spec, plan)
    running_mean, running_var = running if running else (x, x)
    moved_mean, moved_var = moved or (running_mean, running_var)
    grid, trailing, meta = _forward_launch(spec, launch.INTERPRET, sms, normalise, bool(running), activation,
                                           x.dtype)
    launch.launch(_batchnorm_train_forward_kernel, grid,
                  x, partials, gamma if normalise else x, gamma.stride(0) if normalise else 0,
                  beta if normalise else x, beta.stride(0) if normalise else 0, y if normalise else x,
                  running_mean, running_mean.stride(0) if running else 0,
                  running_var, running_var.stride(0) if running else 0,
                  moved_mean, moved_mean.stride(0) if running else 0, moved_var, moved_var.stride(0) if running else 0,
                  *trailing, *numerics.float32_pair(momentum), **meta)
    return y


@functools.lru_cache(maxsize=1024)
def _forward_launch(spec, interpret, sms, normalise, update_running, activation, dtype):
    """The grid, the trailing arguments (:func:`_trailing`) and the
    constexprs of a training forward launch, made once per spec, plan and options."""
    plan = _plan(spec, interpret, sms)
    meta = dict(SPLIT=plan.splits > 1, NORMALISE=normalise, UPDATE_RUNNING=update_running, ACTIVATION=activation,
                COMPUTE_TYPE=numerics.compute_type(dtype), INTERP=interpret,
                BLOCK_SIZE_P=launch.next_pow2(plan.splits), **plan.meta)
    return (spec.channels, plan.splits if normalise else 1), _trailing(spec, interpret, sms), meta


@functools.lru_cache(maxsize=1024)
def _backward_launch(spec, interpret, sms, activation, dtype):
    """The grid, the trailing arguments and the constexprs of a training
    backward launch, made once per spec, plan and activation code."""
    plan = _plan(spec, interpret, sms)
    meta = dict(SPLIT=plan.splits > 1, ACTIVATION=activation, COMPUTE_TYPE=numerics.compute_type(dtype),
                INTERP=interpret, BLOCK_SIZE_P=launch.next_pow2(plan.splits), **plan.meta)
    return (spec.channels, plan.splits), _trailing(spec, interpret, sms), meta


def _grad_and_output(grad, out, activation):
    """The dense gradient and output a backward reads (the output only for an
    activation other than identity: it is not loaded otherwise) and the
    ACTIVATION code."""
    act = ACTIVATION_CODES[activation]
    grad = copy.contiguous(grad)
    return grad, (copy.contiguous(out) if act != numerics.ACT_IDENTITY.value else grad), act


def _empty_channel_grads(spec, dx, gamma, beta):
    """The backward's results where there is nothing to launch: no channels
    (empty gradients) or no values per channel (zero gradients)."""
    if spec.channels == 0:
        return (dx, launch.empty(gamma.shape, gamma.dtype, gamma.device),
                launch.empty(beta.shape, beta.dtype, beta.device))
    return (dx, copy.full(gamma.shape, 0.0, gamma.dtype, gamma.device),
            copy.full(beta.shape, 0.0, beta.dtype, beta.device))


def batchnorm_running_update_forward(x, running_mean, running_var, momentum=0.1):
    spec = _spec(x, (running_mean, running_var), 0.0)
    _train_forward(copy.contiguous(x), spec, None, None, (running_mean, running_var), momentum, normalise=False)


def batchnorm_train_forward(x, gamma, beta, running_mean=None, running_var=None, moved_mean=None,
                            moved_var=None, eps=1e-5, momentum=0.1, activation="identity"):
    running = () if running_mean is None else (running_mean, running_var)
    moved = () if moved_mean is None else (moved_mean, moved_var)
    spec = _spec(x, (gamma, beta) + running + moved, eps, activation)
    return _train_forward(copy.contiguous(x), spec, gamma, beta, running, momentum, normalise=True, moved=moved,
                          activation=ACTIVATION_CODES[spec.activation])


def batchnorm_train_backward(grad, out, x, gamma, beta, running_mean=None, running_var=None, moved_mean=None,
                             moved_var=None, eps=1e-5, momentum=0.1, activation="identity"):
    none_for_running = (None,) * sum(v is not None for v in (running_mean, running_var, moved_mean, moved_var))
    spec = _spec(x, (gamma, beta), eps, activation)
    x = copy.contiguous(x)
    dx = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return _empty_channel_grads(spec, dx, gamma, beta) + none_for_running
    grad, out, act = _grad_and_output(grad, out, spec.activation)
    dgamma = launch.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = launch.empty(beta.shape, beta.dtype, beta.device)
    sms = launch.sm_count(x.get_device())
    plan = _plan(spec, launch.INTERPRET, sms)
    partials = _partial_stats(x, spec, plan, grad, out, act)
    grid, trailing, meta = _backward_launch(spec, launch.INTERPRET, sms, act, x.dtype)
    launch.launch(_batchnorm_train_backward_kernel, grid, grad, out, x, partials,
                  gamma, gamma.stride(0), dx, dgamma, 1, dbeta, 1, *trailing, **meta)
    return (dx, dgamma, dbeta) + none_for_running


def batchnorm_test_forward(x, gamma, beta, mean, var, eps=1e-5, activation="identity"):
    spec = _spec(x, (gamma, beta, mean, var), eps, activation)
    x = copy.contiguous(x)
    y = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return y
    plan = _plan(spec, launch.INTERPRET, launch.sm_count(x.get_device()))
    launch.launch(_batchnorm_test_kernel, (spec.channels, plan.splits), x, x, x, gamma, gamma.stride(0),
                  beta, beta.stride(0), mean, mean.stride(0), var, var.stride(0), y, y, y, 0, y, 0,
                  *_sizes(spec), *plan.tile_args, *numerics.float32_pair(spec.eps), BACKWARD=False, SPLIT=False,
                  ACTIVATION=ACTIVATION_CODES[spec.activation], COMPUTE_TYPE=numerics.compute_type(x.dtype), INTERP=launch.INTERPRET, **plan.meta)
    return y


def batchnorm_test_backward(grad, out, x, gamma, beta, mean, var, eps=1e-5, activation="identity"):
    spec = _spec(x, (gamma, beta, mean, var), eps, activation)
    x = copy.contiguous(x)
    dx = launch.empty(x.shape, x.dtype, x.device)
    if spec.channels == 0 or spec.values_per_channel == 0:
        return _empty_channel_grads(spec, dx, gamma, beta) + (None, None)
    grad, out, act = _grad_and_output(grad, out, spec.activation)
    dgamma = launch.empty(gamma.shape, gamma.dtype, gamma.device)
    dbeta = launch.empty(beta.shape, beta.dtype, beta.device)
    plan = _plan(spec, launch.INTERPRET, launch.sm_count(x.get_device()))
    split = plan.splits > 1
    partials = launch.empty((spec.channels, 2, plan.splits), _workspace_dtype(x), x.device) if split else dx
    launch.launch(_batchnorm_test_kernel, (spec.channels, plan.splits), x, grad, out, gamma, gamma.stride(0),
                  beta, beta.stride(0), mean, mean.stride(0), var, var.stride(0), dx, partials,
                  dgamma, 1, dbeta, 1, *_sizes(spec), *plan.tile_args, *numerics.float32_pair(spec.eps),
                  BACKWARD=True, SPLIT=split, ACTIVATION=act, COMPUTE_TYPE=numerics.compute_type(x.dtype),
                  INTERP=launch.INTERPRET, **plan.meta)
    if split:
        launch.launch(_sum_partials_kernel, (spec.channels,), partials, dgamma, 1, dbeta, 1, plan.splits,
                      INTERP=launch.INTERPRET, BLOCK_SIZE_P=launch.next_pow2(plan.splits))
    return dx, dgamma, dbeta, None, None
