"""Attention, Triton kernels: fused scaled dot-product attention in the
FlashAttention-2 scheme (forward and backward), and the attention weights.

The math is reference/attention.py's (S = scale q k^T + bias, masked; P =
softmax(S) row by row; Pd = P M / (1 - p); y = Pd V); here the Lq x Lk matrices
S and P are never stored. Per (batch, head) and block of BLOCK_M queries:

* forward (``_attention_forward_kernel``): q stays in registers while the
  key/value blocks stream by; an *online softmax* keeps, per query row, the
  running maximum m, the running sum l of exp(S - m) and the accumulator
  acc = sum exp(S - m) V, rescaling l and acc by exp(m_old - m_new) whenever the
  maximum grows; at the end y = acc / l, and the row's m and log l are stored
  (two float32 per row; float64 for float64 inputs) for the backward: kept
  apart rather than as LSE = m + log l, whose rounding (u |LSE|) would return
  as a relative error of every recomputed weight when the logits are large.
  With ``causal`` only the key blocks at or left of the diagonal are visited:
  blocks wholly below it need no masking, the diagonal blocks (and every block
  when a bool mask is given, and the last partial block) take the masked path.
  The query blocks run in reverse order so that the longest (causal) ones
  start first.
* backward: P is recomputed block by block from the saved statistics,
  P = exp((S - m) - log l), and with D_i = dO_i . y_i (``_attention_delta_kernel``)
  dS = P (dP - D), dP = dO V^T. No float atomics: one kernel per *key* block
  (``_backward_dkdv_kernel``) sweeps the query blocks and accumulates dK =
  scale dS^T Q and dV = Pd^T dO in registers; another per *query* block
  (``_backward_dq_kernel``) sweeps the key blocks for dQ = scale dS K. Each
  program owns the rows it writes, so the gradients are bit-identical run to
  run. A bias that needs its gradient gets dS written out by the dQ kernel
  (zeros where causal blocks are skipped), then summed over its broadcast
  axes by the deterministic two-pass reduction (``reduce.unbroadcast``).
* ``attention_weights``: the row statistics (``_row_statistics_kernel``), then
  the weights written block by block (``_weights_kernel``); its backward reuses
  the two backward kernels with dP read from the incoming gradient instead
  of computed as dO V^T, and D_i = sum_j G Pd from the statistics kernel.

Numerics. Everything runs in float32 (float64 for float64). For float32 the
exponentials are base 2 (exp2 with the scale pre-multiplied by log2 e, m and
log l kept in base 2), for float64 natural. 16-bit P and dS are rounded to the
input dtype before their tensor-core products with V, dO, K and Q (as
FlashAttention does); tests/tolerances.py's floor for that rounding is
``attention_magnitude`` (triflux/testing/attention.py). Fully masked rows (l =
0) give y = 0 and log l = +inf, so that their recomputed P is 0 (torch 2.13's
result). Masked pairs get P = 0 exactly (not just exp of -inf), so a NaN row's
gradient reaches only the keys it may attend. D from y (FlashAttention's) is
less accurate than torch's math path's sum_j dP P where a row's softmax is
nearly one-hot (dP - D cancels): a relative error of u / (1 - P_max) in dS.

Dropout draws ``tl.rand(seed, ((n H + h) Lq + i) Lk + j)`` (Philox on the int64
linear index of the pair in (N, H, Lq, Lk)): the same mask in the forward,
both backward kernels and ``attention_weights`` for the same seed.

Layouts: q, k, v, a bias and a mask are read through their strides (NNlib's
(N, L, H*d) feature blocks are transposed views; a broadcast bias or mask has
stride 0); the output is allocated as (N, Lq, H, dv) and returned as its
(N, H, Lq, dv) view, so the (N, Lq, H*dv) of dot_product_attention is a free
reshape. The forward keeps the row statistics with its output (by identity, while that
output lives); a backward handed another tensor recomputes them.
"""
import functools
import weakref

import torch
import triton
import triton.language as tl

from triflux.specs.attention import attention_spec
from triflux.specs.dropout import keep_scale

from triflux import tape

from . import copy, launch, numerics
from .numerics import store_value
from .reduce import unbroadcast

LOG2E = 1.4426950408889634


# --- device helpers ---------------------------------------------------------------------------

@triton.jit
def _exp(x, COMPUTE_TYPE: tl.constexpr):
    """exp2 in float32 (scores kept in base 2), exp in float64."""
    if COMPUTE_TYPE == tl.float64:
        return tl.exp(x)
    else:
        return tl.exp2(x)


@triton.jit
def _log(x, COMPUTE_TYPE: tl.constexpr):
    """log2 in float32, log in float64 (the base of _exp)."""
    if COMPUTE_TYPE == tl.float64:
        return tl.log(x)
    else:
        return tl.log2(x)


@triton.jit
def _bias_factor(COMPUTE_TYPE: tl.constexpr):
    """What a bias is multiplied by to join the scores' base: log2 e in float32."""
    if COMPUTE_TYPE == tl.float64:
        return 1.0
    else:
        return 1.4426950408889634


@triton.jit
def _allowed(iq, jk, Lq, Lk, mask_base, sm_q, sm_k, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """Whether each pair (query iq, key jk) is in bounds and allowed (mask True, causal j <= i);
    iq and jk broadcast to the block's shape."""
    inside = (iq < Lq) & (jk < Lk)
    ok = inside
    if CAUSAL:
        ok = ok & (jk <= iq)
    if HAS_MASK:
        m = tl.load(mask_base + iq.to(tl.int64) * sm_q + jk.to(tl.int64) * sm_k, mask=inside, other=0)
        ok = ok & (m != 0)
    return ok


@triton.jit
def _scores(qk, iq, jk, Lq, Lk, qk_scale, bias_base, sb_q, sb_k, allowed,
            HAS_BIAS: tl.constexpr, MASKED: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """S in the kernels' base (module docstring): qk * qk_scale + bias * factor,
    -inf where not ``allowed`` (MASKED blocks only)."""
    s = qk * qk_scale
    if HAS_BIAS:
        bptr = bias_base + iq.to(tl.int64) * sb_q + jk.to(tl.int64) * sb_k
        if MASKED:
            b = tl.load(bptr, mask=(iq < Lq) & (jk < Lk), other=0.0)
        else:
            b = tl.load(bptr)
        s += b.to(COMPUTE_TYPE) * _bias_factor(COMPUTE_TYPE)
    if MASKED:
        s = tl.where(allowed, s, -float("inf"))
    return s


@triton.jit
def _keep(seed, rng_base, iq, jk, Lk, p):
    """The dropout mask of the pairs (iq, jk): Philox on their int64 linear index."""
    return tl.rand(seed, rng_base + iq.to(tl.int64) * Lk + jk) >= p


@triton.jit
def _rows_of(base, rows, cols, row_stride, col_stride, n_rows, n_cols, CHECK_ROWS: tl.constexpr):
    """A (len(rows), len(cols)) block of a matrix; columns past n_cols (a head
    dim padded to a power of two) read 0, and rows past n_rows too with CHECK_ROWS."""
    ptrs = base + rows[:, None].to(tl.int64) * row_stride + cols[None, :] * col_stride
    if CHECK_ROWS:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    else:
        return tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)


@triton.jit
def _store_row_statistics(LSE, lse_plane, nh, Lq, offs_m, m_i, l_i, row_ok, COMPUTE_TYPE: tl.constexpr):
    """Store a row's softmax statistics: the shift m (its maximum; 0 for a fully
    masked row) and log l (+inf for a fully masked row, l = 0, so that every
    recomputed weight exp((s - m) - log l) is 0 there)."""
    shift = tl.where(m_i == -float("inf"), 0.0, m_i)
    log_l = tl.where(l_i == 0.0, float("inf"), _log(l_i, COMPUTE_TYPE))
    tl.store(LSE + nh.to(tl.int64) * Lq + offs_m, shift, mask=row_ok)
    tl.store(LSE + lse_plane + nh.to(tl.int64) * Lq + offs_m, log_l, mask=row_ok)


# --- forward ---------------------------------------------------------------------------------

@triton.jit
def _forward_block(acc, m_i, l_i, q, rows, start_n, Lq, Lk, k_base, v_base, bias_base, mask_base,
                   sk2, sk3, sv2, sv3, sb2, sb3, sm2, sm3, qk_scale, p_drop, drop_scale, seed, rng_base,
                   D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                   CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr,
                   COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """One key block of the online softmax: (acc, m, l) updated with keys start_n..start_n+BLOCK_N."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _rows_of(k_base, offs_n, tl.arange(0, BLOCK_D), sk2, sk3, Lk, D, MASKED)
    v = _rows_of(v_base, offs_n, tl.arange(0, BLOCK_DV), sv2, sv3, Lk, DV, MASKED)
    qk = numerics.dot(tl.zeros((q.shape[0], BLOCK_N), COMPUTE_TYPE), q, tl.trans(k), DOT)
    iq = rows[:, None]
    jk = offs_n[None, :]
    allowed = None
    if MASKED:
        allowed = _allowed(iq, jk, Lq, Lk, mask_base, sm2, sm3, HAS_MASK, CAUSAL)
    s = _scores(qk, iq, jk, Lq, Lk, qk_scale, bias_base, sb2, sb3, allowed, HAS_BIAS, MASKED, COMPUTE_TYPE)
    m_new = numerics.maximum(m_i, numerics.max_along(s, 1))
    shift = tl.where(m_new == -float("inf"), 0.0, m_new)
    old_shift = tl.where(m_i == -float("inf"), 0.0, m_i)
    # nothing summed yet (m_i = -inf): l and acc are 0, keep them so (exp(0 - shift) may overflow)
    alpha = tl.where(m_i == -float("inf"), 1.0, _exp(old_shift - shift, COMPUTE_TYPE))
    p = _exp(s - shift[:, None], COMPUTE_TYPE)
    if MASKED:
        p = tl.where(allowed, p, 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        p = tl.where(_keep(seed, rng_base, iq, jk, Lk, p_drop), p * drop_scale, 0.0)
    acc = acc * alpha[:, None]
    acc = numerics.dot(acc, store_value(p, v.dtype, INTERP), v, DOT)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["seed"])
def _attention_forward_kernel(Q, K, V, BIAS, MASK, OUT, LSE, lse_plane, OUT32, H, Lq, Lk,
                              sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                              sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3, so0, so1, so2, so3,
                              scale_hi, scale_lo, p_drop, drop_hi, drop_lo, seed,
                              D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr,
                              HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                              STORE_F32: tl.constexpr, DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                              INTERP: tl.constexpr):
    """y and the softmax statistics (m, log l) of BLOCK_M queries of one (batch, head): program
    (n H + h, query block);
    STORE_F32: y also unrounded in float32 into OUT32 (N H, Lq, dv), for the backward's D."""
    nh = tl.program_id(0)
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M     # longest (causal) blocks first
    n = nh // H
    h = nh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = tl.minimum(offs_m, Lq - 1)              # padding rows reread the last row (never stored)
    qk_scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    drop_scale = numerics.from_float32_pair(drop_hi, drop_lo, COMPUTE_TYPE)
    q = _rows_of(Q + n.to(tl.int64) * sq0 + h.to(tl.int64) * sq1, rows, tl.arange(0, BLOCK_D), sq2, sq3,
                 Lq, D, False)
    k_base = K + n.to(tl.int64) * sk0 + h.to(tl.int64) * sk1
    v_base = V + n.to(tl.int64) * sv0 + h.to(tl.int64) * sv1
    bias_base = BIAS + n.to(tl.int64) * sb0 + h.to(tl.int64) * sb1
    mask_base = MASK + n.to(tl.int64) * sm0 + h.to(tl.int64) * sm1
    rng_base = nh.to(tl.int64) * Lq * Lk
    acc = tl.zeros((BLOCK_M, BLOCK_DV), COMPUTE_TYPE)
    m_i = tl.full((BLOCK_M,), -float("inf"), COMPUTE_TYPE)
    l_i = tl.zeros((BLOCK_M,), COMPUTE_TYPE)
    # key blocks [0, full): no masking; [full, hi): the masked path (diagonal, last partial, any mask)
    hi = Lk
    full = (Lk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(Lk, start_m + BLOCK_M)
        full = tl.minimum(full, ((start_m + 1) // BLOCK_N) * BLOCK_N)
    if HAS_MASK:
        full = 0
    for start_n in range(0, full, BLOCK_N):
        acc, m_i, l_i = _forward_block(acc, m_i, l_i, q, rows, start_n, Lq, Lk, k_base, v_base, bias_base,
                                       mask_base, sk2, sk3, sv2, sv3, sb2, sb3, sm2, sm3, qk_scale, p_drop,
                                       drop_scale, seed, rng_base, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_BIAS,
                                       HAS_MASK, CAUSAL, DROPOUT, False, DOT, COMPUTE_TYPE, INTERP)
    for start_n in range(full, hi, BLOCK_N):
        acc, m_i, l_i = _forward_block(acc, m_i, l_i, q, rows, start_n, Lq, Lk, k_base, v_base, bias_base,
                                       mask_base, sk2, sk3, sv2, sv3, sb2, sb3, sm2, sm3, qk_scale, p_drop,
                                       drop_scale, seed, rng_base, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_BIAS,
                                       HAS_MASK, CAUSAL, DROPOUT, True, DOT, COMPUTE_TYPE, INTERP)
    # a fully masked row has l = 0: y = 0
    y = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    row_ok = offs_m < Lq
    _store_row_statistics(LSE, lse_plane, nh, Lq, offs_m, m_i, l_i, row_ok, COMPUTE_TYPE)
    offs_dv = tl.arange(0, BLOCK_DV)
    out_ptrs = (OUT + n.to(tl.int64) * so0 + h.to(tl.int64) * so1 + offs_m[:, None].to(tl.int64) * so2
                + offs_dv[None, :] * so3)
    tl.store(out_ptrs, store_value(y, OUT.dtype.element_ty, INTERP), mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    if STORE_F32:
        tl.store(OUT32 + (nh.to(tl.int64) * Lq + offs_m[:, None]) * DV + offs_dv[None, :], y,
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV))


# --- row statistics and weights (attention_weights; the statistics when the forward's are not at hand) ---

@triton.jit(do_not_specialize=["seed"])
def _row_statistics_kernel(Q, K, BIAS, MASK, G, W, LSE, lse_plane, DELTA, H, Lq, Lk,
                           sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3,
                           sg0, sg1, sg2, sg3, sw0, sw1, sw2, sw3, scale_hi, scale_lo,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                           WITH_DELTA: tl.constexpr, DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr):
    """The softmax statistics (m, log l) of BLOCK_M query rows (online maximum and
    rescaled sum over every key block) and, WITH_DELTA, D_i = sum_j G[i, j] W[i, j] (the weights'
    backward: G the incoming gradient, W the forward's weights)."""
    nh = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    n = nh // H
    h = nh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = tl.minimum(offs_m, Lq - 1)
    qk_scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    q = _rows_of(Q + n.to(tl.int64) * sq0 + h.to(tl.int64) * sq1, rows, tl.arange(0, BLOCK_D), sq2, sq3,
                 Lq, D, False)
    k_base = K + n.to(tl.int64) * sk0 + h.to(tl.int64) * sk1
    bias_base = BIAS + n.to(tl.int64) * sb0 + h.to(tl.int64) * sb1
    mask_base = MASK + n.to(tl.int64) * sm0 + h.to(tl.int64) * sm1
    m_i = tl.full((BLOCK_M,), -float("inf"), COMPUTE_TYPE)
    l_i = tl.zeros((BLOCK_M,), COMPUTE_TYPE)
    delta = tl.zeros((BLOCK_M,), COMPUTE_TYPE)
    iq = rows[:, None]
    for start_n in range(0, Lk, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        jk = offs_n[None, :]
        k = _rows_of(k_base, offs_n, tl.arange(0, BLOCK_D), sk2, sk3, Lk, D, True)
        qk = numerics.dot(tl.zeros((BLOCK_M, BLOCK_N), COMPUTE_TYPE), q, tl.trans(k), DOT)
        allowed = _allowed(iq, jk, Lq, Lk, mask_base, sm2, sm3, HAS_MASK, CAUSAL)
        s = _scores(qk, iq, jk, Lq, Lk, qk_scale, bias_base, sb2, sb3, allowed, HAS_BIAS, True, COMPUTE_TYPE)
        m_new = numerics.maximum(m_i, numerics.max_along(s, 1))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha = tl.where(m_i == -float("inf"), 1.0,
                         _exp(tl.where(m_i == -float("inf"), 0.0, m_i) - shift, COMPUTE_TYPE))
        p = tl.where(allowed, _exp(s - shift[:, None], COMPUTE_TYPE), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        if WITH_DELTA:
            inside = (iq < Lq) & (jk < Lk)
            g = tl.load(G + n.to(tl.int64) * sg0 + h.to(tl.int64) * sg1 + iq.to(tl.int64) * sg2
                        + jk.to(tl.int64) * sg3, mask=inside, other=0.0).to(COMPUTE_TYPE)
            w = tl.load(W + n.to(tl.int64) * sw0 + h.to(tl.int64) * sw1 + iq.to(tl.int64) * sw2
                        + jk.to(tl.int64) * sw3, mask=inside, other=0.0).to(COMPUTE_TYPE)
            delta += tl.sum(g * w, 1)
    row_ok = offs_m < Lq
    _store_row_statistics(LSE, lse_plane, nh, Lq, offs_m, m_i, l_i, row_ok, COMPUTE_TYPE)
    if WITH_DELTA:
        tl.store(DELTA + nh.to(tl.int64) * Lq + offs_m, delta, mask=row_ok)


@triton.jit(do_not_specialize=["seed"])
def _weights_kernel(Q, K, BIAS, MASK, LSE, lse_plane, W, H, Lq, Lk,
                    sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3,
                    sw0, sw1, sw2, sw3, scale_hi, scale_lo, p_drop, drop_hi, drop_lo, seed,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                    DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """W = P M / (1 - p) for BLOCK_M query rows and every key, from the rows' statistics (m, log l)."""
    nh = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    n = nh // H
    h = nh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = tl.minimum(offs_m, Lq - 1)
    qk_scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    drop_scale = numerics.from_float32_pair(drop_hi, drop_lo, COMPUTE_TYPE)
    q = _rows_of(Q + n.to(tl.int64) * sq0 + h.to(tl.int64) * sq1, rows, tl.arange(0, BLOCK_D), sq2, sq3,
                 Lq, D, False)
    k_base = K + n.to(tl.int64) * sk0 + h.to(tl.int64) * sk1
    bias_base = BIAS + n.to(tl.int64) * sb0 + h.to(tl.int64) * sb1
    mask_base = MASK + n.to(tl.int64) * sm0 + h.to(tl.int64) * sm1
    shift = tl.load(LSE + nh.to(tl.int64) * Lq + rows)
    log_l = tl.load(LSE + lse_plane + nh.to(tl.int64) * Lq + rows)
    rng_base = nh.to(tl.int64) * Lq * Lk
    iq = rows[:, None]
    w_base = W + n.to(tl.int64) * sw0 + h.to(tl.int64) * sw1
    for start_n in range(0, Lk, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        jk = offs_n[None, :]
        k = _rows_of(k_base, offs_n, tl.arange(0, BLOCK_D), sk2, sk3, Lk, D, True)
        qk = numerics.dot(tl.zeros((BLOCK_M, BLOCK_N), COMPUTE_TYPE), q, tl.trans(k), DOT)
        allowed = _allowed(iq, jk, Lq, Lk, mask_base, sm2, sm3, HAS_MASK, CAUSAL)
        s = _scores(qk, iq, jk, Lq, Lk, qk_scale, bias_base, sb2, sb3, allowed, HAS_BIAS, True, COMPUTE_TYPE)
        p = tl.where(allowed, _exp((s - shift[:, None]) - log_l[:, None], COMPUTE_TYPE), 0.0)
        if DROPOUT:
            p = tl.where(_keep(seed, rng_base, iq, jk, Lk, p_drop), p * drop_scale, 0.0)
        tl.store(w_base + offs_m[:, None].to(tl.int64) * sw2 + jk.to(tl.int64) * sw3,
                 store_value(p, W.dtype.element_ty, INTERP), mask=(offs_m[:, None] < Lq) & (jk < Lk))


# --- backward ----------------------------------------------------------------------------------

@triton.jit
def _attention_delta_kernel(DO, OUT, DELTA, H, Lq, sd0, sd1, sd2, sd3, so0, so1, so2, so3,
                            DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                            COMPUTE_TYPE: tl.constexpr):
    """D_i = dO_i . y_i for BLOCK_M rows of one (batch, head) (= sum_j dP[i, j] P[i, j])."""
    nh = tl.program_id(0)
    n = nh // H
    h = nh % H
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_DV)
    do = _rows_of(DO + n.to(tl.int64) * sd0 + h.to(tl.int64) * sd1, offs_m, cols, sd2, sd3, Lq, DV, True)
    o = _rows_of(OUT + n.to(tl.int64) * so0 + h.to(tl.int64) * so1, offs_m, cols, so2, so3, Lq, DV, True)
    delta = tl.sum(do.to(COMPUTE_TYPE) * o.to(COMPUTE_TYPE), 1)
    tl.store(DELTA + nh.to(tl.int64) * Lq + offs_m, delta, mask=offs_m < Lq)


@triton.jit
def _dkdv_block(dk, dv, k, v, cols, start_m, Lq, Lk, q_base, do_base, g_base, bias_base, mask_base, lse_base,
                lse_plane, delta_base, sq2, sq3, sd2, sd3, sg2, sg3, sb2, sb3, sm2, sm3, qk_scale, p_drop, drop_scale,
                seed, rng_base, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, WEIGHTS: tl.constexpr, MASKED: tl.constexpr,
                DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """One query block's contribution to dK (and dV) of a key block, in the
    transposed orientation: rows are keys (``cols``), columns queries."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _rows_of(q_base, offs_m, tl.arange(0, BLOCK_D), sq2, sq3, Lq, D, MASKED)
    qkT = numerics.dot(tl.zeros((k.shape[0], BLOCK_M), COMPUTE_TYPE), k, tl.trans(q), DOT)
    iq = offs_m[None, :]
    jk = cols[:, None]
    allowed = None
    if MASKED:
        allowed = _allowed(iq, jk, Lq, Lk, mask_base, sm2, sm3, HAS_MASK, CAUSAL)
        shift = tl.load(lse_base + offs_m, mask=offs_m < Lq, other=0.0)
        log_l = tl.load(lse_base + lse_plane + offs_m, mask=offs_m < Lq, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < Lq, other=0.0)
    else:
        shift = tl.load(lse_base + offs_m)
        log_l = tl.load(lse_base + lse_plane + offs_m)
        delta = tl.load(delta_base + offs_m)
    sT = _scores(qkT, iq, jk, Lq, Lk, qk_scale, bias_base, sb2, sb3, allowed, HAS_BIAS, MASKED, COMPUTE_TYPE)
    pT = _exp((sT - shift[None, :]) - log_l[None, :], COMPUTE_TYPE)
    if MASKED:
        pT = tl.where(allowed, pT, 0.0)
    if DROPOUT:
        keep = _keep(seed, rng_base, iq, jk, Lk, p_drop)
    if WEIGHTS:
        gptr = g_base + iq.to(tl.int64) * sg2 + jk.to(tl.int64) * sg3
        if MASKED:
            dpT = tl.load(gptr, mask=(iq < Lq) & (jk < Lk), other=0.0).to(COMPUTE_TYPE)
        else:
            dpT = tl.load(gptr).to(COMPUTE_TYPE)
    else:
        do = _rows_of(do_base, offs_m, tl.arange(0, BLOCK_DV), sd2, sd3, Lq, DV, MASKED)
        pdT = pT
        if DROPOUT:
            pdT = tl.where(keep, pT * drop_scale, 0.0)
        dv = numerics.dot(dv, store_value(pdT, do.dtype, INTERP), do, DOT)
        dpT = numerics.dot(tl.zeros((k.shape[0], BLOCK_M), COMPUTE_TYPE), v, tl.trans(do), DOT)
    if DROPOUT:
        dpT = tl.where(keep, dpT * drop_scale, 0.0)
    dsT = pT * (dpT - delta[None, :])
    if MASKED:
        dsT = tl.where(allowed, dsT, 0.0)
    dk = numerics.dot(dk, store_value(dsT, q.dtype, INTERP), q, DOT)
    return dk, dv


@triton.jit(do_not_specialize=["seed"])
def _backward_dkdv_kernel(Q, K, V, BIAS, MASK, DO, G, LSE, lse_plane, DELTA, DK, DVT, H, Lq, Lk,
                          sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                          sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3, sd0, sd1, sd2, sd3, sg0, sg1, sg2, sg3,
                          sdk0, sdk1, sdk2, sdk3, sdv0, sdv1, sdv2, sdv3,
                          scale_hi, scale_lo, grad_hi, grad_lo, p_drop, drop_hi, drop_lo, seed,
                          D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                          WEIGHTS: tl.constexpr, DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                          INTERP: tl.constexpr):
    """dK (and, for attention, dV) of BLOCK_N keys of one (batch, head): every
    query block that may attend them, in order (program (n H + h, key block))."""
    nh = tl.program_id(0)
    start_n = tl.program_id(1) * BLOCK_N
    n = nh // H
    h = nh % H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    cols = tl.minimum(offs_n, Lk - 1)             # padding keys reread the last key (never stored)
    qk_scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    drop_scale = numerics.from_float32_pair(drop_hi, drop_lo, COMPUTE_TYPE)
    grad_scale = numerics.from_float32_pair(grad_hi, grad_lo, COMPUTE_TYPE)
    k = _rows_of(K + n.to(tl.int64) * sk0 + h.to(tl.int64) * sk1, cols, tl.arange(0, BLOCK_D), sk2, sk3,
                 Lk, D, False)
    dk = tl.zeros((BLOCK_N, BLOCK_D), COMPUTE_TYPE)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), COMPUTE_TYPE)
    if WEIGHTS:
        v = k                                     # (unused: dP comes from G)
    else:
        v = _rows_of(V + n.to(tl.int64) * sv0 + h.to(tl.int64) * sv1, cols, tl.arange(0, BLOCK_DV), sv2, sv3,
                     Lk, DV, False)
    q_base = Q + n.to(tl.int64) * sq0 + h.to(tl.int64) * sq1
    do_base = DO + n.to(tl.int64) * sd0 + h.to(tl.int64) * sd1
    g_base = G + n.to(tl.int64) * sg0 + h.to(tl.int64) * sg1
    bias_base = BIAS + n.to(tl.int64) * sb0 + h.to(tl.int64) * sb1
    mask_base = MASK + n.to(tl.int64) * sm0 + h.to(tl.int64) * sm1
    lse_base = LSE + nh.to(tl.int64) * Lq
    delta_base = DELTA + nh.to(tl.int64) * Lq
    rng_base = nh.to(tl.int64) * Lq * Lk
    # query blocks: [lo, full) the causal diagonal (masked), [full, inner) unmasked, [.., Lq) the last
    # partial block (masked); with a bool mask every block takes the masked path
    lo = 0
    full = 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        full = ((start_n + BLOCK_N - 1 + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    inner = (Lq // BLOCK_M) * BLOCK_M
    diagonal_end = tl.minimum(full, ((Lq + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
    for start_m in range(lo, diagonal_end, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, cols, start_m, Lq, Lk, q_base, do_base, g_base, bias_base, mask_base,
                             lse_base, lse_plane, delta_base, sq2, sq3, sd2, sd3, sg2, sg3, sb2, sb3, sm2, sm3, qk_scale,
                             p_drop, drop_scale, seed, rng_base, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV, HAS_BIAS,
                             HAS_MASK, CAUSAL, DROPOUT, WEIGHTS, True, DOT, COMPUTE_TYPE, INTERP)
    for start_m in range(tl.maximum(lo, full), inner, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, cols, start_m, Lq, Lk, q_base, do_base, g_base, bias_base, mask_base,
                             lse_base, lse_plane, delta_base, sq2, sq3, sd2, sd3, sg2, sg3, sb2, sb3, sm2, sm3, qk_scale,
                             p_drop, drop_scale, seed, rng_base, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV, HAS_BIAS,
                             HAS_MASK, CAUSAL, DROPOUT, WEIGHTS, HAS_MASK, DOT, COMPUTE_TYPE, INTERP)
    for start_m in range(tl.maximum(tl.maximum(lo, full), inner), Lq, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, cols, start_m, Lq, Lk, q_base, do_base, g_base, bias_base, mask_base,
                             lse_base, lse_plane, delta_base, sq2, sq3, sd2, sd3, sg2, sg3, sb2, sb3, sm2, sm3, qk_scale,
                             p_drop, drop_scale, seed, rng_base, D, DV, BLOCK_M, BLOCK_D, BLOCK_DV, HAS_BIAS,
                             HAS_MASK, CAUSAL, DROPOUT, WEIGHTS, True, DOT, COMPUTE_TYPE, INTERP)
    key_ok = offs_n[:, None] < Lk
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(DK + n.to(tl.int64) * sdk0 + h.to(tl.int64) * sdk1 + offs_n[:, None].to(tl.int64) * sdk2
             + offs_d[None, :] * sdk3, store_value(dk * grad_scale, DK.dtype.element_ty, INTERP),
             mask=key_ok & (offs_d[None, :] < D))
    if not WEIGHTS:
        offs_dv = tl.arange(0, BLOCK_DV)
        tl.store(DVT + n.to(tl.int64) * sdv0 + h.to(tl.int64) * sdv1 + offs_n[:, None].to(tl.int64) * sdv2
                 + offs_dv[None, :] * sdv3, store_value(dv, DVT.dtype.element_ty, INTERP),
                 mask=key_ok & (offs_dv[None, :] < DV))


@triton.jit
def _dq_block(dq, q, do, shift, log_l, delta, rows, offs_m, start_n, Lq, Lk, k_base, v_base, g_base, bias_base, mask_base,
              ds_base, sk2, sk3, sv2, sv3, sg2, sg3, sb2, sb3, sm2, sm3, sds2, sds3, qk_scale, p_drop, drop_scale,
              seed, rng_base, D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
              DROPOUT: tl.constexpr, WEIGHTS: tl.constexpr, WRITE_DS: tl.constexpr, MASKED: tl.constexpr,
              DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """One key block's contribution to dQ of a query block (and its dS, WRITE_DS)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _rows_of(k_base, offs_n, tl.arange(0, BLOCK_D), sk2, sk3, Lk, D, MASKED)
    qk = numerics.dot(tl.zeros((q.shape[0], BLOCK_N), COMPUTE_TYPE), q, tl.trans(k), DOT)
    iq = rows[:, None]
    jk = offs_n[None, :]
    allowed = None
    if MASKED:
        allowed = _allowed(iq, jk, Lq, Lk, mask_base, sm2, sm3, HAS_MASK, CAUSAL)
    s = _scores(qk, iq, jk, Lq, Lk, qk_scale, bias_base, sb2, sb3, allowed, HAS_BIAS, MASKED, COMPUTE_TYPE)
    p = _exp((s - shift[:, None]) - log_l[:, None], COMPUTE_TYPE)
    if MASKED:
        p = tl.where(allowed, p, 0.0)
    if WEIGHTS:
        gptr = g_base + iq.to(tl.int64) * sg2 + jk.to(tl.int64) * sg3
        if MASKED:
            dp = tl.load(gptr, mask=(iq < Lq) & (jk < Lk), other=0.0).to(COMPUTE_TYPE)
        else:
            dp = tl.load(gptr).to(COMPUTE_TYPE)
    else:
        v = _rows_of(v_base, offs_n, tl.arange(0, BLOCK_DV), sv2, sv3, Lk, DV, MASKED)
        dp = numerics.dot(tl.zeros((q.shape[0], BLOCK_N), COMPUTE_TYPE), do, tl.trans(v), DOT)
    if DROPOUT:
        dp = tl.where(_keep(seed, rng_base, iq, jk, Lk, p_drop), dp * drop_scale, 0.0)
    ds = p * (dp - delta[:, None])
    if MASKED:
        ds = tl.where(allowed, ds, 0.0)
    if WRITE_DS:
        tl.store(ds_base + iq.to(tl.int64) * sds2 + jk.to(tl.int64) * sds3, ds,
                 mask=(offs_m[:, None] < Lq) & (jk < Lk))
    dq = numerics.dot(dq, store_value(ds, k.dtype, INTERP), k, DOT)
    return dq


@triton.jit(do_not_specialize=["seed"])
def _backward_dq_kernel(Q, K, V, BIAS, MASK, DO, G, LSE, lse_plane, DELTA, DQ, DS, H, Lq, Lk,
                        sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                        sb0, sb1, sb2, sb3, sm0, sm1, sm2, sm3, sd0, sd1, sd2, sd3, sg0, sg1, sg2, sg3,
                        sdq0, sdq1, sdq2, sdq3, sds0, sds1, sds2, sds3,
                        scale_hi, scale_lo, grad_hi, grad_lo, p_drop, drop_hi, drop_lo, seed,
                        D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                        WEIGHTS: tl.constexpr, WRITE_DS: tl.constexpr, WRITE_DQ: tl.constexpr,
                        DOT: tl.constexpr, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr):
    """dQ (and dS for a bias's gradient) of BLOCK_M queries of one (batch, head):
    every key block they may attend, in order (program (n H + h, query block))."""
    nh = tl.program_id(0)
    start_m = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    n = nh // H
    h = nh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = tl.minimum(offs_m, Lq - 1)
    qk_scale = numerics.from_float32_pair(scale_hi, scale_lo, COMPUTE_TYPE)
    drop_scale = numerics.from_float32_pair(drop_hi, drop_lo, COMPUTE_TYPE)
    grad_scale = numerics.from_float32_pair(grad_hi, grad_lo, COMPUTE_TYPE)
    q = _rows_of(Q + n.to(tl.int64) * sq0 + h.to(tl.int64) * sq1, rows, tl.arange(0, BLOCK_D), sq2, sq3,
                 Lq, D, False)
    if WEIGHTS:
        do = q                                    # (unused: dP comes from G)
    else:
        do = _rows_of(DO + n.to(tl.int64) * sd0 + h.to(tl.int64) * sd1, rows, tl.arange(0, BLOCK_DV), sd2, sd3,
                      Lq, DV, False)
    shift = tl.load(LSE + nh.to(tl.int64) * Lq + rows)
    log_l = tl.load(LSE + lse_plane + nh.to(tl.int64) * Lq + rows)
    delta = tl.load(DELTA + nh.to(tl.int64) * Lq + rows)
    k_base = K + n.to(tl.int64) * sk0 + h.to(tl.int64) * sk1
    v_base = V + n.to(tl.int64) * sv0 + h.to(tl.int64) * sv1
    g_base = G + n.to(tl.int64) * sg0 + h.to(tl.int64) * sg1
    bias_base = BIAS + n.to(tl.int64) * sb0 + h.to(tl.int64) * sb1
    mask_base = MASK + n.to(tl.int64) * sm0 + h.to(tl.int64) * sm1
    ds_base = DS + n.to(tl.int64) * sds0 + h.to(tl.int64) * sds1
    rng_base = nh.to(tl.int64) * Lq * Lk
    dq = tl.zeros((BLOCK_M, BLOCK_D), COMPUTE_TYPE)
    hi = Lk
    full = (Lk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(Lk, start_m + BLOCK_M)
        full = tl.minimum(full, ((start_m + 1) // BLOCK_N) * BLOCK_N)
    if HAS_MASK:
        full = 0
    for start_n in range(0, full, BLOCK_N):
        dq = _dq_block(dq, q, do, shift, log_l, delta, rows, offs_m, start_n, Lq, Lk, k_base, v_base, g_base, bias_base,
                       mask_base, ds_base, sk2, sk3, sv2, sv3, sg2, sg3, sb2, sb3, sm2, sm3, sds2, sds3,
                       qk_scale, p_drop, drop_scale, seed, rng_base, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV,
                       HAS_BIAS, HAS_MASK, CAUSAL, DROPOUT, WEIGHTS, WRITE_DS, False, DOT, COMPUTE_TYPE, INTERP)
    for start_n in range(full, hi, BLOCK_N):
        dq = _dq_block(dq, q, do, shift, log_l, delta, rows, offs_m, start_n, Lq, Lk, k_base, v_base, g_base, bias_base,
                       mask_base, ds_base, sk2, sk3, sv2, sv3, sg2, sg3, sb2, sb3, sm2, sm3, sds2, sds3,
                       qk_scale, p_drop, drop_scale, seed, rng_base, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV,
                       HAS_BIAS, HAS_MASK, CAUSAL, DROPOUT, WEIGHTS, WRITE_DS, True, DOT, COMPUTE_TYPE, INTERP)
    if WRITE_DS:
        if CAUSAL:                                # the skipped blocks' dS is 0
            for start_n in range(((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, Lk, BLOCK_N):
                jk = start_n + tl.arange(0, BLOCK_N)[None, :]
                tl.store(ds_base + rows[:, None].to(tl.int64) * sds2 + jk.to(tl.int64) * sds3,
                         tl.zeros((BLOCK_M, BLOCK_N), COMPUTE_TYPE), mask=(offs_m[:, None] < Lq) & (jk < Lk))
    if WRITE_DQ:
        offs_d = tl.arange(0, BLOCK_D)
        tl.store(DQ + n.to(tl.int64) * sdq0 + h.to(tl.int64) * sdq1 + offs_m[:, None].to(tl.int64) * sdq2
                 + offs_d[None, :] * sdq3, store_value(dq * grad_scale, DQ.dtype.element_ty, INTERP),
                 mask=(offs_m[:, None] < Lq) & (offs_d[None, :] < D))


# --- host side ---------------------------------------------------------------------------------

#: {kind: (BLOCK_M, BLOCK_N, num_warps, num_stages)} replacing _plan's (tests run the GPU's plan
#: in the interpreter with it)
FORCED_PLAN = None


@functools.lru_cache(maxsize=None)
def _plan(kind, dtype, d, dv, interpret):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of kernel ``kind`` ("forward",
    "dkdv", "dq", "rows": the statistics and weights kernels) for head dims d,
    dv in ``dtype`` (a torch dtype). The GPU's are the largest tiles whose sm_90
    code neither spills nor leaves the tensor cores (16-bit: HGMMA, two
    warpgroups of 64 query rows; float32's IEEE products run on FFMA and
    keep their operands in registers, hence the small tiles)."""
    if interpret:
        # small blocks, unequal, so that drawn lengths of a few dozen span several blocks,
        # diagonal blocks of both shapes and partial last blocks
        return {"forward": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1),
                "rows": (32, 16, 4, 1)}[kind]
    width = max(d, dv)
    if dtype == torch.float64:
        return (16, 16, 4, 1)
    if dtype == torch.float32:
        if width <= 64:
            return {"forward": (32, 32, 4, 2), "dkdv": (16, 32, 4, 2), "dq": (32, 32, 4, 2),
                    "rows": (32, 32, 4, 2)}[kind]
        return {"forward": (32, 16, 4, 2), "dkdv": (16, 32, 4, 2), "dq": (32, 16, 4, 2),
                "rows": (32, 16, 4, 2)}[kind]
    if width <= 64:
        return {"forward": (128, 64, 8, 3), "dkdv": (64, 128, 8, 2), "dq": (128, 64, 8, 2),
                "rows": (128, 64, 8, 2)}[kind]
    if width <= 128:
        return {"forward": (128, 64, 8, 3), "dkdv": (32, 128, 8, 2), "dq": (128, 32, 8, 2),
                "rows": (128, 64, 8, 2)}[kind]
    return {"forward": (64, 32, 4, 2), "dkdv": (16, 64, 4, 2), "dq": (64, 32, 4, 2),
            "rows": (64, 32, 4, 2)}[kind]


def _blocks(kind, dtype, d, dv):
    if FORCED_PLAN is not None and kind in FORCED_PLAN:
        return FORCED_PLAN[kind]
    return _plan(kind, dtype, d, dv, launch.INTERPRET)


def _head_block(d):
    """The head dim padded to a power of two, at least 16 (tl.dot's smallest)."""
    return max(16, launch.next_pow2(d))


def _spec(primitive, tensors, causal, scale, p, seed):
    return attention_spec(primitive, tuple(tuple(t.shape) for t in tensors), tuple(t.dtype for t in tensors),
                          causal, scale, p, seed)


def _scores_strides(t, spec):
    """The four strides that read ``t`` (a bias or mask) broadcast to (N, H, Lq, Lk); zeros without one."""
    if t is None:
        return (0, 0, 0, 0)
    shape = spec.scores_shape
    pad = 4 - t.dim()
    sizes = (1,) * pad + tuple(t.shape)
    strides = (0,) * pad + tuple(t.stride())
    return tuple(0 if s == 1 and o != 1 else st for s, st, o in zip(sizes, strides, shape))


def _extras(spec, tensors):
    bias = tensors[spec.bias_index] if spec.has_bias else None
    mask = tensors[spec.mask_index] if spec.has_mask else None
    return bias, mask


def _scalars(spec):
    """(qk_scale hi, lo, dropout keep scale hi, lo, scale hi, lo) as float32 pairs."""
    base = 1.0 if spec.compute_dtype.itemsize == 8 else LOG2E
    return (numerics.float32_pair(spec.scale * base), numerics.float32_pair(keep_scale(spec.p)),
            numerics.float32_pair(spec.scale))


def _lse_dtype(spec):
    return torch.float64 if spec.compute_dtype.itemsize == 8 else torch.float32


def _common_meta(spec, q):
    return dict(HAS_BIAS=spec.has_bias, HAS_MASK=spec.has_mask, CAUSAL=spec.causal,
                DOT=numerics.dot_kind(q.dtype), COMPUTE_TYPE=numerics.compute_type(q.dtype))


#: id(output) -> (weak reference to it, (its row statistics, its float32 copy or None), its spec)
_KEPT = {}


def _keep_for_backward(out, lse, spec):
    key = id(out)
    _KEPT[key] = (weakref.ref(out, lambda _, key=key: _KEPT.pop(key, None)), lse, spec)


def _kept_for_backward(out, spec):
    ref, lse, kept_spec = _KEPT.get(id(out), (None, None, None))
    return lse if ref is not None and ref() is out and kept_spec == spec else None


def _row_statistics(spec, q, k, bias, mask, g=None, w=None):
    """((m, log l) as a (2, N H, Lq) tensor, D (N H, Lq)) from the statistics kernel; D only given g and w."""
    N, H, Lq, Lk = spec.scores_shape
    lse = launch.empty((2, N * H, Lq), _lse_dtype(spec), q.device)
    delta = launch.empty((N * H, Lq), _lse_dtype(spec), q.device) if g is not None else lse
    if N * H * Lq == 0:
        return lse, delta
    bm, bn, warps, stages = _blocks("rows", q.dtype, spec.qk_dim, spec.v_dim)
    (s_hi, s_lo), _, _ = _scalars(spec)
    launch.launch(_row_statistics_kernel, (N * H, launch.cdiv(Lq, bm)), q, k,
                  q if bias is None else bias, q if mask is None else mask, q if g is None else g,
                  q if w is None else w, lse, N * H * Lq, delta, H, Lq, Lk, *q.stride(), *k.stride(),
                  *_scores_strides(bias, spec), *_scores_strides(mask, spec),
                  *(g.stride() if g is not None else (0,) * 4), *(w.stride() if w is not None else (0,) * 4),
                  s_hi, s_lo, D=spec.qk_dim, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_head_block(spec.qk_dim),
                  WITH_DELTA=g is not None, **_common_meta(spec, q), num_warps=warps, num_stages=stages)
    return lse, delta


def attention_forward(q, k, v, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """y = dropout(softmax(scale q k^T + bias, masked)) v, fused (module docstring)."""
    tensors = (q, k, v) + bias_mask
    spec = _spec("attention", tensors, causal, scale, p, seed)
    bias, mask = _extras(spec, tensors)
    N, H, Lq, Lk = spec.scores_shape
    out = launch.empty((N, Lq, H, spec.v_dim), q.dtype, q.device).permute(0, 2, 1, 3)
    lse = launch.empty((2, N * H, Lq), _lse_dtype(spec), q.device)
    if N * H * Lq == 0:
        return out
    bm, bn, warps, stages = _blocks("forward", q.dtype, spec.qk_dim, spec.v_dim)
    (s_hi, s_lo), (d_hi, d_lo), _ = _scalars(spec)
    # inside `gradient`, 16-bit outputs are also kept unrounded: the backward's D = dO . y then
    # carries no 16-bit rounding of y (it would cancel in dS = P (dP - D))
    out32 = None
    if tape.TAPE is not None and q.dtype in (torch.float16, torch.bfloat16):
        out32 = launch.empty((N * H, Lq, spec.v_dim), torch.float32, q.device)
    launch.launch(_attention_forward_kernel, (N * H, launch.cdiv(Lq, bm)), q, k, v,
                  q if bias is None else bias, q if mask is None else mask, out, lse, N * H * Lq,
                  lse if out32 is None else out32, H, Lq, Lk,
                  *q.stride(), *k.stride(), *v.stride(), *_scores_strides(bias, spec),
                  *_scores_strides(mask, spec), *out.stride(), s_hi, s_lo, spec.p, d_hi, d_lo, spec.seed,
                  D=spec.qk_dim, DV=spec.v_dim, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_head_block(spec.qk_dim),
                  BLOCK_DV=_head_block(spec.v_dim), DROPOUT=spec.p > 0, STORE_F32=out32 is not None,
                  INTERP=launch.INTERPRET, **_common_meta(spec, q), num_warps=warps, num_stages=stages)
    _keep_for_backward(out, (lse, out32), spec)
    return out


def _needs(needs, n):
    return (True,) * n if needs is None else tuple(bool(x) for x in needs)


def _backward(spec, tensors, grad, lse, delta, needs, weights):
    """dq, dk, dv (None for attention_weights), dbias from the two backward kernels."""
    q, k = tensors[0], tensors[1]
    v = None if weights else tensors[2]
    bias, mask = _extras(spec, tensors)
    N, H, Lq, Lk = spec.scores_shape
    d, dv_dim = spec.qk_dim, spec.v_dim
    want_bias = bias is not None and needs[spec.bias_index]
    dq = launch.empty(q.shape, q.dtype, q.device) if needs[0] else None
    dk = launch.empty(k.shape, k.dtype, k.device) if needs[1] else None
    dv = launch.empty(v.shape, v.dtype, v.device) if (not weights and needs[2]) else None
    (s_hi, s_lo), (d_hi, d_lo), (g_hi, g_lo) = _scalars(spec)
    common = dict(D=d, DV=dv_dim, BLOCK_D=_head_block(d), BLOCK_DV=_head_block(dv_dim), DROPOUT=spec.p > 0,
                  WEIGHTS=weights, INTERP=launch.INTERPRET, **_common_meta(spec, q))
    do = g = q
    if weights:
        g = grad
    else:
        do = grad
    vv = q if v is None else v
    scalars = (s_hi, s_lo, g_hi, g_lo, spec.p, d_hi, d_lo, spec.seed)
    inputs = (q, k, vv, q if bias is None else bias, q if mask is None else mask, do, g)
    strides = (*q.stride(), *k.stride(), *vv.stride(), *_scores_strides(bias, spec), *_scores_strides(mask, spec),
               *(do.stride() if not weights else (0,) * 4), *(g.stride() if weights else (0,) * 4))
    if (dk is not None or dv is not None) and Lk > 0 and Lq > 0:
        dk_t = dk if dk is not None else launch.empty(k.shape, k.dtype, k.device)
        dv_t = dv if dv is not None else (launch.empty(v.shape, v.dtype, v.device) if v is not None else dk_t)
        bm, bn, warps, stages = _blocks("dkdv", q.dtype, d, dv_dim)
        launch.launch(_backward_dkdv_kernel, (N * H, launch.cdiv(Lk, bn)), *inputs, lse, N * H * Lq, delta,
                      dk_t, dv_t,
                      H, Lq, Lk, *strides, *dk_t.stride(), *dv_t.stride(), *scalars,
                      BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)
    elif Lq == 0:                                 # no query attends any key
        dk = None if dk is None else copy.full(tuple(k.shape), 0, k.dtype, k.device)
        dv = None if dv is None else copy.full(tuple(v.shape), 0, v.dtype, v.device)
    dbias = None
    if (dq is not None or want_bias) and Lq > 0:
        ds = launch.empty((N, H, Lq, Lk), _lse_dtype(spec), q.device) if want_bias else q
        dq_t = dq if dq is not None else q
        bm, bn, warps, stages = _blocks("dq", q.dtype, d, dv_dim)
        launch.launch(_backward_dq_kernel, (N * H, launch.cdiv(Lq, bm)), *inputs, lse, N * H * Lq, delta,
                      dq_t, ds,
                      H, Lq, Lk, *strides, *dq_t.stride(), *(ds.stride() if want_bias else (0,) * 4), *scalars,
                      WRITE_DS=want_bias, WRITE_DQ=dq is not None,
                      BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **common)
        if want_bias:
            dbias = unbroadcast(ds, tuple(bias.shape), dtype=bias.dtype)
    elif want_bias:
        dbias = copy.full(tuple(bias.shape), 0, bias.dtype, bias.device)
    return dq, dk, dv, dbias


def attention_backward(grad, out, q, k, v, *bias_mask, causal=False, scale=None, p=0.0, seed=0, needs=None):
    """dq, dk, dv (and dbias; None for the mask) from the saved row statistics: dS = P (dP - D),
    dP = dO V^T (dropout applied), D_i = dO_i . y_i (module docstring)."""
    tensors = (q, k, v) + bias_mask
    spec = _spec("attention", tensors, causal, scale, p, seed)
    needs = _needs(needs, len(tensors))
    N, H, Lq, Lk = spec.scores_shape
    bias, mask = _extras(spec, tensors)
    kept = _kept_for_backward(out, spec)
    lse, out32 = kept if kept is not None else (_row_statistics(spec, q, k, bias, mask)[0], None)
    delta = launch.empty((N * H, Lq), _lse_dtype(spec), q.device)
    if N * H * Lq > 0:
        bm = 64 if not launch.INTERPRET else 32
        o = out if out32 is None else out32.view(N, H, Lq, spec.v_dim)
        launch.launch(_attention_delta_kernel, (N * H, launch.cdiv(Lq, bm)), grad, o, delta, H, Lq,
                      *grad.stride(), *o.stride(), DV=spec.v_dim, BLOCK_M=bm,
                      BLOCK_DV=_head_block(spec.v_dim), COMPUTE_TYPE=numerics.compute_type(q.dtype))
    dq, dk, dv, dbias = _backward(spec, tensors, grad, lse, delta, needs, weights=False)
    grads = [dq, dk, dv] + [None] * len(bias_mask)
    if bias is not None:
        grads[spec.bias_index] = dbias
    return tuple(grads)


def attention_weights_forward(q, k, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """W = softmax(scale q k^T + bias, masked) M / (1 - p), (N, H, Lq, Lk): the
    weights ``attention`` multiplies v by (the same dropout mask for the same seed)."""
    tensors = (q, k) + bias_mask
    spec = _spec("attention_weights", tensors, causal, scale, p, seed)
    bias, mask = _extras(spec, tensors)
    N, H, Lq, Lk = spec.scores_shape
    w = launch.empty((N, H, Lq, Lk), q.dtype, q.device)
    if w.numel() == 0:
        return w
    lse, _ = _row_statistics(spec, q, k, bias, mask)
    bm, bn, warps, stages = _blocks("rows", q.dtype, spec.qk_dim, 0)
    (s_hi, s_lo), (d_hi, d_lo), _ = _scalars(spec)
    launch.launch(_weights_kernel, (N * H, launch.cdiv(Lq, bm)), q, k, q if bias is None else bias,
                  q if mask is None else mask, lse, N * H * Lq, w, H, Lq, Lk, *q.stride(), *k.stride(),
                  *_scores_strides(bias, spec), *_scores_strides(mask, spec), *w.stride(),
                  s_hi, s_lo, spec.p, d_hi, d_lo, spec.seed, D=spec.qk_dim, BLOCK_M=bm, BLOCK_N=bn,
                  BLOCK_D=_head_block(spec.qk_dim), DROPOUT=spec.p > 0, INTERP=launch.INTERPRET,
                  **_common_meta(spec, q), num_warps=warps, num_stages=stages)
    return w


def attention_weights_backward(grad, out, q, k, *bias_mask, causal=False, scale=None, p=0.0, seed=0,
                               needs=None):
    """dq, dk (and dbias; None for the mask) with G = dL/dW: dP = G M/(1-p),
    dS = P (dP - D), D_i = sum_j G W (module docstring)."""
    tensors = (q, k) + bias_mask
    spec = _spec("attention_weights", tensors, causal, scale, p, seed)
    needs = _needs(needs, len(tensors))
    bias, mask = _extras(spec, tensors)
    lse, delta = _row_statistics(spec, q, k, bias, mask, g=grad, w=out)
    dq, dk, _, dbias = _backward(spec, tensors, grad, lse, delta, needs, weights=True)
    grads = [dq, dk] + [None] * len(bias_mask)
    if bias is not None:
        grads[spec.bias_index] = dbias
    return tuple(grads)
