"""Recurrent family, Triton kernels (the math is in ``triflux.reference.rnn``).

A sequence costs a few launches, not L per gate:

forward   1. ``xp = x @ w_ih^T`` for every time step at once (the matmul
             family's GEMM, stored in the compute type);
          2. ONE launch for the whole time loop (``_forward_kernel``): each
             program owns BLOCK_SIZE_BATCH batch rows and a range of hidden
             units and walks t = 0 .. L-1 inside the kernel, computing every
             gate of its rows and units per step (units in chunks of
             BLOCK_SIZE_HIDDEN, the product h_{t-1} @ w_hh^T in chunks of
             BLOCK_SIZE_K, h_{t-1} read back from the state buffer written
             at t-1);
          3. a cast to the output dtype for float16/bfloat16 (the recurrence
             keeps its states in float32).
backward  the forward recurrence again where the output was rounded
          (float16/bfloat16: the float32 states are needed), the GEMM for xp,
          then ONE launch walking t = L-1 .. 0 (``_backward_kernel``) that
          stores the gate gradients of every step in (N, L, G*H) buffers and
          finishes with dh0 (and dc0); then dx by a GEMM, dW_ih and dW_hh by
          ``_weight_sum_kernel`` and db_ih, db_hh by the reduce family's sums
          (over batch and time), each only if ``needs`` asks for it.

Programs: in the interpreter, one per batch block, taking every hidden unit.
On a GPU the hidden units are split too, so that a small batch (64 rows: 4
batch blocks) still makes about as many programs as the GPU has SMs; the
programs of a batch block then meet after every step at a barrier on a
counter in memory (``_end_of_step``), which needs all of them resident at
once: the host launches no more programs than SMs. (The barrier runs only on
a GPU; the interpreter, which runs programs one after another, never splits.)

Everything accumulates in float32 (float64 for float64). The dots are
``numerics.dot``'s with the weights' type as operand type: float32 (IEEE, or
TF32 under ``set_matmul_precision("tf32")``) and float64 as before, and
16-bit weights on tensor cores, with h_{t-1} rounded to 16 bits (gradients
through time as two 16-bit parts, hi + lo). The products are computed
transposed (hidden units x batch rows), so that 64 units fill a wgmma on
sm_90. The sizes and the checks of the inputs are ``triflux.specs.rnn``'s.
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from . import copy, launch, numerics
from .numerics import store_value
from .matmul import matrix_product
from .reduce import unbroadcast
from ..dtypes import to_torch
from ..specs.rnn import recurrent_spec

#: the cell a kernel computes (constexpr CELL)
CELL_RNN = tl.constexpr(0)
CELL_LSTM = tl.constexpr(1)
CELL_GRU = tl.constexpr(2)
_CELLS = {"rnn_sequence": CELL_RNN, "lstm_sequence": CELL_LSTM, "gru_sequence": CELL_GRU}

#: which state of the state buffer a read takes (constexpr STATE): the LSTM
#: stores [h_t, c_t] per step, so its c sits H values after its h
HIDDEN_STATE = tl.constexpr(0)
CELL_STATE = tl.constexpr(1)


# --- device helpers ---------------------------------------------------------------------

@triton.jit
def _tanh(x, INTERP: tl.constexpr):
    """tanh. On a GPU ``numerics.tanh`` (expm1 by a short series near 0,
    no ``log``: GPU ``log`` is approximate near 1). In the interpreter, which
    pays per operation inside the time loop, expm1(-2|x|) by Kahan's
    (u - 1) v / log(u), u = exp(v): a few operations, a few ulp with NumPy's
    exact ``log``."""
    if INTERP:
        v = -2.0 * tl.abs(x)
        u = tl.exp(v)
        um1 = u - 1.0
        lg = tl.log(tl.where(u == 1.0, 0.5, u))      # (no 0/0 where u == 1)
        m = tl.where(u == 1.0, v, tl.where(um1 == -1.0, -1.0, um1 * v / lg))
        t = -m / (2.0 + m)
        y = tl.where(x < 0, -t, t)
    else:
        y = numerics.tanh(x)
    return y


@triton.jit
def _dtanh(a):
    """tanh'(a) = 1 - tanh(a)^2 = 4 e / (1 + e)^2, e = exp(-2|a|): from the
    pre-activation, so no cancellation where tanh saturates (1 - y^2 from a
    rounded y loses ~u / (1 - y^2) relative)."""
    e = tl.exp(-2.0 * tl.abs(a))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _previous_state(states, initial, rows, t, cols, N, L, H, W, initial_batch_stride, initial_hidden_stride,
                    STATE: tl.constexpr):
    """The block of the previous state at batch rows ``rows`` and hidden units
    ``cols``, two index blocks that broadcast together (``rows[:, None]`` and
    ``cols[None, :]``, or transposed): the state buffer's step t-1
    (``STATE``: the hidden or the cell state), or ``initial`` (h0 or c0) at t = 0.
    Read through L2 (``.cg``): other programs of the batch block wrote it.

    Step conditions on the scalar t are branches, never parts of a load mask:
    Triton 3.9's interpreter rejects a mask that broadcasts a scalar
    comparison ("mask has unsupported dtype"), and a branch loads once."""
    mask = (rows < N) & (cols < H)
    if t > 0:
        prev = tl.load(states + rows * L * W + (t - 1) * W + STATE * H + cols, mask=mask, other=0.0,
                       cache_modifier=".cg")
    else:
        prev = tl.load(initial + rows * initial_batch_stride + cols * initial_hidden_stride,
                       mask=mask, other=0.0).to(states.dtype.element_ty)
    return prev


@triton.jit
def _hidden_side(states, h0, rows, t, units, N, L, H, W, h0_batch_stride, h0_hidden_stride,
                 w_hh, w_hh_row_stride, w_hh_col_stride, GATES: tl.constexpr,
                 BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_HIDDEN: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                 DOT: tl.constexpr, INTERP: tl.constexpr):
    """h_{t-1} @ w_hh[g*H + units, :]^T for every gate g < GATES at once (each
    block of h_{t-1} loaded once for all gates), (BLOCK_SIZE_BATCH,
    BLOCK_SIZE_HIDDEN) blocks; unused gates stay zero. Computed transposed,
    w_hh[g*H + units, :] @ h_{t-1}^T, so that the hidden units are the dot's
    rows: 64 of them make a 4-warp wgmma on sm_90, which 16 batch rows do not.
    The operands are in w_hh's type (h_{t-1} rounded to it: 16-bit weights
    take tensor cores), the sums in the states' type."""
    COMPUTE_TYPE: tl.constexpr = states.dtype.element_ty
    gate0 = tl.zeros((BLOCK_SIZE_HIDDEN, BLOCK_SIZE_BATCH), dtype=COMPUTE_TYPE)
    gate1 = tl.zeros((BLOCK_SIZE_HIDDEN, BLOCK_SIZE_BATCH), dtype=COMPUTE_TYPE)
    gate2 = tl.zeros((BLOCK_SIZE_HIDDEN, BLOCK_SIZE_BATCH), dtype=COMPUTE_TYPE)
    gate3 = tl.zeros((BLOCK_SIZE_HIDDEN, BLOCK_SIZE_BATCH), dtype=COMPUTE_TYPE)
    for k0 in range(0, H, BLOCK_SIZE_K):
        inner = k0 + tl.arange(0, BLOCK_SIZE_K)
        h_prev = store_value(_previous_state(states, h0, rows[None, :], t, inner[:, None], N, L, H, W,
                                             h0_batch_stride, h0_hidden_stride, HIDDEN_STATE),
                             w_hh.dtype.element_ty, INTERP)
        w_mask = (units < H)[:, None] & (inner < H)[None, :]
        w_ptrs = w_hh + units[:, None] * w_hh_row_stride + inner[None, :] * w_hh_col_stride
        gate0 = numerics.dot(gate0, tl.load(w_ptrs, mask=w_mask, other=0.0), h_prev, DOT)
        if GATES > 1:
            gate1 = numerics.dot(gate1, tl.load(w_ptrs + H * w_hh_row_stride, mask=w_mask, other=0.0), h_prev,
                                 DOT)
            gate2 = numerics.dot(gate2, tl.load(w_ptrs + 2 * H * w_hh_row_stride, mask=w_mask, other=0.0),
                                 h_prev, DOT)
        if GATES > 3:
            gate3 = numerics.dot(gate3, tl.load(w_ptrs + 3 * H * w_hh_row_stride, mask=w_mask, other=0.0),
                                 h_prev, DOT)
    return tl.trans(gate0), tl.trans(gate1), tl.trans(gate2), tl.trans(gate3)


@triton.jit
def _input_side(xp, rows, t, units, gate, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                GATES: tl.constexpr, WITH_B_HH: tl.constexpr):
    """x_t @ w_ih[gate]^T + b_ih[gate] (+ b_hh[gate]) for the block, from the
    input projections ``xp`` (N, L, GATES*H)."""
    mask = (rows < N)[:, None] & (units < H)[None, :]
    gh = GATES * H
    a = tl.load(xp + rows[:, None] * L * gh + t * gh + gate * H + units[None, :], mask=mask, other=0.0)
    a += _gate_bias(b_ih, b_ih_stride, gate, units, H, xp.dtype.element_ty)
    if WITH_B_HH:
        a += _gate_bias(b_hh, b_hh_stride, gate, units, H, xp.dtype.element_ty)
    return a


@triton.jit
def _gate_bias(b, b_stride, gate, units, H, COMPUTE_TYPE: tl.constexpr):
    """The bias of ``gate`` for the hidden units ``units``, as a row."""
    return tl.load(b + (gate * H + units) * b_stride, mask=units < H, other=0.0).to(COMPUTE_TYPE)[None, :]


@triton.jit
def _end_of_step(counters, t, programs_per_block, SYNC: tl.constexpr):
    """Waits until every program of this batch block has finished step t (the
    t-th pass of its time loop), so that the states (gradients) of that step
    are in memory for all of them. One program per block (SYNC false): its
    own stores made visible to its threads. Several (SYNC): a barrier on the
    block's counter (zero at launch): each program adds 1 (release) and spins
    until the counter reaches (t + 1) * programs_per_block (acquire); it needs
    every program of the block resident at once, which the host ensures
    (no more programs than SMs)."""
    tl.debug_barrier()
    if SYNC:
        counter = counters + tl.program_id(0)
        target = (t + 1) * programs_per_block
        arrived = tl.atomic_add(counter, 1, sem="release", scope="gpu") + 1
        while arrived < target:
            arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


# --- forward ------------------------------------------------------------------------------
# Gate numbers in the calls below: LSTM i, f, g, o = 0, 1, 2, 3; GRU r, z, n = 0, 1, 2.

@triton.jit
def _forward_kernel(xp, h0, c0, w_hh, b_ih, b_hh, states, counters, N, L, H, units_per_program,
                    h0_batch_stride, h0_hidden_stride, c0_batch_stride, c0_hidden_stride,
                    w_hh_row_stride, w_hh_col_stride, b_ih_stride, b_hh_stride,
                    CELL: tl.constexpr, RELU: tl.constexpr, GATES: tl.constexpr,
                    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_HIDDEN: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                    SYNC: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """Every step of the recurrence for BLOCK_SIZE_BATCH batch rows (program
    axis 0) and ``units_per_program`` hidden units (axis 1); states into
    ``states`` ((N, L, H), or (N, L, 2H) = [h, c] for the LSTM), in the
    compute type. The programs of a batch block meet after every step
    (:func:`_end_of_step`)."""
    COMPUTE_TYPE: tl.constexpr = states.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    first_unit = tl.program_id(1) * units_per_program
    last_unit = tl.minimum(first_unit + units_per_program, H)
    W = H
    if CELL == CELL_LSTM:
        W = 2 * H
    for t in range(0, L):
        for j0 in range(first_unit, last_unit, BLOCK_SIZE_HIDDEN):
            units = j0 + tl.arange(0, BLOCK_SIZE_HIDDEN)
            mask = (rows < N)[:, None] & (units < H)[None, :]
            out = states + rows[:, None] * L * W + t * W + units[None, :]
            hh0, hh1, hh2, hh3 = _hidden_side(states, h0, rows, t, units, N, L, H, W,
                                              h0_batch_stride, h0_hidden_stride,
                                              w_hh, w_hh_row_stride, w_hh_col_stride, GATES,
                                              BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K, DOT, INTERP)
            if CELL == CELL_RNN:
                a = _input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                GATES, True) + hh0
                if RELU:
                    h = tl.where(a < 0, 0.0, a)
                else:
                    h = _tanh(a, INTERP)
                tl.store(out, h.to(COMPUTE_TYPE), mask=mask)
            elif CELL == CELL_LSTM:
                ai = _input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh0
                af = _input_side(xp, rows, t, units, 1, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh1
                ag = _input_side(xp, rows, t, units, 2, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh2
                ao = _input_side(xp, rows, t, units, 3, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh3
                c_prev = _previous_state(states, c0, rows[:, None], t, units[None, :], N, L, H, W, c0_batch_stride,
                                         c0_hidden_stride, CELL_STATE)
                c = numerics.sigmoid(af) * c_prev + numerics.sigmoid(ai) * _tanh(ag, INTERP)
                h = numerics.sigmoid(ao) * _tanh(c, INTERP)
                tl.store(out, h.to(COMPUTE_TYPE), mask=mask)
                tl.store(out + H, c.to(COMPUTE_TYPE), mask=mask)
            else:
                r = numerics.sigmoid(_input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                         GATES, True) + hh0)
                az = _input_side(xp, rows, t, units, 1, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh1
                hn = hh2 + _gate_bias(b_hh, b_hh_stride, 2, units, H, COMPUTE_TYPE)
                n = _tanh(_input_side(xp, rows, t, units, 2, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                      GATES, False) + r * hn, INTERP)
                h_prev = _previous_state(states, h0, rows[:, None], t, units[None, :], N, L, H, W, h0_batch_stride,
                                         h0_hidden_stride, HIDDEN_STATE)
                h = numerics.sigmoid(-az) * n + numerics.sigmoid(az) * h_prev
                tl.store(out, h.to(COMPUTE_TYPE), mask=mask)
        _end_of_step(counters, t, tl.num_programs(1), SYNC)


# --- backward -----------------------------------------------------------------------------

@triton.jit
def _to_previous_state(dgh, rows, t, has_step, units, N, L, H, w_hh, w_hh_row_stride, w_hh_col_stride,
                       GATES: tl.constexpr, BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_HIDDEN: tl.constexpr,
                       BLOCK_SIZE_K: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """dAh_t @ w_hh for the block (BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN): the
    gradient reaching h_{t-1} (zero unless ``has_step``: there is no step t).
    Transposed as in :func:`_hidden_side`; dAh_t, which every program of the
    batch block wrote, read through L2. With 16-bit weights dAh_t enters the
    tensor cores as two 16-bit parts, hi + lo (the gradient through time
    cancels: one rounding of it per step would cost more than the tolerance)."""
    gh = GATES * H
    acc = tl.zeros((BLOCK_SIZE_HIDDEN, BLOCK_SIZE_BATCH), dtype=dgh.dtype.element_ty)
    if has_step:                 # a branch, not a mask term (see _previous_state)
        for k0 in range(0, gh, BLOCK_SIZE_K):
            inner = k0 + tl.arange(0, BLOCK_SIZE_K)
            d = tl.load(dgh + rows[None, :] * L * gh + t * gh + inner[:, None],
                        mask=(rows < N)[None, :] & (inner < gh)[:, None], other=0.0, cache_modifier=".cg")
            w = tl.load(w_hh + inner[None, :] * w_hh_row_stride + units[:, None] * w_hh_col_stride,
                        mask=(inner < gh)[None, :] & (units < H)[:, None], other=0.0)
            if w_hh.dtype.element_ty == dgh.dtype.element_ty:
                acc = numerics.dot(acc, w, d, DOT)
            else:
                d_hi = store_value(d, w_hh.dtype.element_ty, INTERP)
                acc = numerics.dot(acc, w, d_hi, DOT)
                acc = numerics.dot(acc, w, store_value(d - d_hi.to(d.dtype), w_hh.dtype.element_ty, INTERP), DOT)
    return tl.trans(acc)


@triton.jit
def _backward_kernel(xp, h0, c0, w_hh, b_ih, b_hh, states, grad, dgi, dgh, carry, dh0, dc0, counters,
                     N, L, H, units_per_program,
                     h0_batch_stride, h0_hidden_stride, c0_batch_stride, c0_hidden_stride,
                     w_hh_row_stride, w_hh_col_stride, b_ih_stride, b_hh_stride,
                     grad_batch_stride, grad_time_stride, grad_hidden_stride,
                     CELL: tl.constexpr, RELU: tl.constexpr, GATES: tl.constexpr,
                     BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_HIDDEN: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                     SYNC: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """BPTT for BLOCK_SIZE_BATCH batch rows (program axis 0) and
    ``units_per_program`` hidden units (axis 1): gate gradients of every step
    into ``dgi`` (input side) and ``dgh`` (hidden side; the same buffer except
    for the GRU), ``carry`` (N, H) holds the elementwise path to the previous
    step (LSTM: dc_t * f_t, GRU: dh_t * z_t); at the end dh0 (and dc0). The
    programs of a batch block meet after every step (:func:`_end_of_step`)."""
    COMPUTE_TYPE: tl.constexpr = states.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    first_unit = tl.program_id(1) * units_per_program
    last_unit = tl.minimum(first_unit + units_per_program, H)
    gh = GATES * H
    W = H
    if CELL == CELL_LSTM:
        W = 2 * H
    for tt in range(0, L):
        t = L - 1 - tt
        for j0 in range(first_unit, last_unit, BLOCK_SIZE_HIDDEN):
            units = j0 + tl.arange(0, BLOCK_SIZE_HIDDEN)
            mask = (rows < N)[:, None] & (units < H)[None, :]
            grad_ptrs = grad + rows[:, None] * grad_batch_stride + t * grad_time_stride \
                + units[None, :] * grad_hidden_stride
            dh = tl.load(grad_ptrs, mask=mask, other=0.0).to(COMPUTE_TYPE)
            dh += _to_previous_state(dgh, rows, t + 1, t < L - 1, units, N, L, H, w_hh, w_hh_row_stride,
                                     w_hh_col_stride, GATES, BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K,
                                     DOT, INTERP)
            carry_ptrs = carry + rows[:, None] * H + units[None, :]
            carry_in = tl.zeros((BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN), dtype=carry.dtype.element_ty)
            if t < L - 1:            # the carry from step t+1 (a branch: see _previous_state)
                carry_in = tl.load(carry_ptrs, mask=mask, other=0.0)
            dgi_ptrs = dgi + rows[:, None] * L * gh + t * gh + units[None, :]
            dgh_ptrs = dgh + rows[:, None] * L * gh + t * gh + units[None, :]
            if CELL == CELL_RNN:
                if RELU:
                    h = tl.load(states + rows[:, None] * L * W + t * W + units[None, :], mask=mask, other=0.0)
                    da = tl.where(h > 0, dh, 0.0)
                else:
                    hh0, hh1, hh2, hh3 = _hidden_side(states, h0, rows, t, units, N, L, H, W,
                                                      h0_batch_stride, h0_hidden_stride,
                                                      w_hh, w_hh_row_stride, w_hh_col_stride, GATES,
                                                      BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K, DOT,
                                                      INTERP)
                    da = dh * _dtanh(_input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh,
                                                 b_hh_stride, GATES, True) + hh0)
                tl.store(dgi_ptrs, da, mask=mask)
            elif CELL == CELL_LSTM:
                hh0, hh1, hh2, hh3 = _hidden_side(states, h0, rows, t, units, N, L, H, W,
                                                  h0_batch_stride, h0_hidden_stride,
                                                  w_hh, w_hh_row_stride, w_hh_col_stride, GATES,
                                                  BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K, DOT, INTERP)
                # derivatives without cancellation: s (1 - s) = s sigmoid(-a), 1 - tanh^2 by _dtanh
                ai = _input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh0
                af = _input_side(xp, rows, t, units, 1, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh1
                ag = _input_side(xp, rows, t, units, 2, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh2
                ao = _input_side(xp, rows, t, units, 3, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh3
                i = numerics.sigmoid(ai)
                f = numerics.sigmoid(af)
                g = _tanh(ag, INTERP)
                o = numerics.sigmoid(ao)
                c = tl.load(states + rows[:, None] * L * W + t * W + H + units[None, :], mask=mask, other=0.0)
                c_prev = _previous_state(states, c0, rows[:, None], t, units[None, :], N, L, H, W, c0_batch_stride,
                                         c0_hidden_stride, CELL_STATE)
                tanh_c = _tanh(c, INTERP)
                grad_c = tl.load(grad_ptrs + H * grad_hidden_stride, mask=mask, other=0.0).to(COMPUTE_TYPE)
                dc = grad_c + carry_in + dh * o * _dtanh(c)
                tl.store(dgi_ptrs, dc * g * i * numerics.sigmoid(-ai), mask=mask)
                tl.store(dgi_ptrs + H, dc * c_prev * f * numerics.sigmoid(-af), mask=mask)
                tl.store(dgi_ptrs + 2 * H, dc * i * _dtanh(ag), mask=mask)
                tl.store(dgi_ptrs + 3 * H, dh * tanh_c * o * numerics.sigmoid(-ao), mask=mask)
                tl.store(carry_ptrs, dc * f, mask=mask)
            else:
                hh0, hh1, hh2, hh3 = _hidden_side(states, h0, rows, t, units, N, L, H, W,
                                                  h0_batch_stride, h0_hidden_stride,
                                                  w_hh, w_hh_row_stride, w_hh_col_stride, GATES,
                                                  BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K, DOT, INTERP)
                dh += carry_in
                ar = _input_side(xp, rows, t, units, 0, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh0
                az = _input_side(xp, rows, t, units, 1, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, True) + hh1
                r = numerics.sigmoid(ar)
                z = numerics.sigmoid(az)
                one_minus_z = numerics.sigmoid(-az)        # 1 - z without cancellation
                hn = hh2 + _gate_bias(b_hh, b_hh_stride, 2, units, H, COMPUTE_TYPE)
                an = _input_side(xp, rows, t, units, 2, N, L, H, b_ih, b_ih_stride, b_hh, b_hh_stride,
                                 GATES, False) + r * hn
                n = _tanh(an, INTERP)
                h_prev = _previous_state(states, h0, rows[:, None], t, units[None, :], N, L, H, W, h0_batch_stride,
                                         h0_hidden_stride, HIDDEN_STATE)
                dn = dh * one_minus_z * _dtanh(an)
                dr = dn * hn * r * numerics.sigmoid(-ar)
                dz = dh * (h_prev - n) * z * one_minus_z
                tl.store(dgi_ptrs, dr, mask=mask)
                tl.store(dgi_ptrs + H, dz, mask=mask)
                tl.store(dgi_ptrs + 2 * H, dn, mask=mask)
                tl.store(dgh_ptrs, dr, mask=mask)
                tl.store(dgh_ptrs + H, dz, mask=mask)
                tl.store(dgh_ptrs + 2 * H, dn * r, mask=mask)
                tl.store(carry_ptrs, dh * z, mask=mask)
        _end_of_step(counters, tt, tl.num_programs(1), SYNC)
    # the gradients of the initial state
    for j0 in range(first_unit, last_unit, BLOCK_SIZE_HIDDEN):
        units = j0 + tl.arange(0, BLOCK_SIZE_HIDDEN)
        mask = (rows < N)[:, None] & (units < H)[None, :]
        d = _to_previous_state(dgh, rows, 0, L > 0, units, N, L, H, w_hh, w_hh_row_stride, w_hh_col_stride,
                               GATES, BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN, BLOCK_SIZE_K, DOT, INTERP)
        carry_in = tl.load(carry + rows[:, None] * H + units[None, :], mask=mask, other=0.0)
        if CELL == CELL_GRU:
            d += carry_in
        tl.store(dh0 + rows[:, None] * H + units[None, :], store_value(d, dh0.dtype.element_ty, INTERP),
                 mask=mask)
        if CELL == CELL_LSTM:
            tl.store(dc0 + rows[:, None] * H + units[None, :], store_value(carry_in, dc0.dtype.element_ty, INTERP),
                     mask=mask)


@triton.jit
def _weight_sum_kernel(a, b, b0, out, R, C, M, L,
                       b_batch_stride, b_time_stride, b_col_stride, b0_batch_stride, b0_col_stride,
                       out_row_stride, out_col_stride,
                       SHIFT: tl.constexpr, DOT: tl.constexpr,
                       BLOCK_SIZE_R: tl.constexpr, BLOCK_SIZE_C: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                       INTERP: tl.constexpr):
    """out[r, c] = sum over rows m = (n, t) of a[m, r] * b[n, t, c] (a dense
    (N*L, R)). SHIFT: b's row is step t-1, and b0[n] at t = 0 (h_{t-1}).
    The products take
    their operands in ``out``'s type (rounded to it: 16-bit weights get
    tensor cores), the sums a's."""
    COMPUTE_TYPE: tl.constexpr = a.dtype.element_ty
    OPERAND_TYPE: tl.constexpr = out.dtype.element_ty
    out_rows = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_R + tl.arange(0, BLOCK_SIZE_R)
    out_cols = tl.program_id(1).to(tl.int64) * BLOCK_SIZE_C + tl.arange(0, BLOCK_SIZE_C)
    acc = tl.zeros((BLOCK_SIZE_R, BLOCK_SIZE_C), dtype=COMPUTE_TYPE)
    for m0 in range(0, M, BLOCK_SIZE_M):
        steps = m0 + tl.arange(0, BLOCK_SIZE_M).to(tl.int64)
        steps_mask = steps < M
        a_block = tl.load(a + steps[None, :] * R + out_rows[:, None],
                          mask=(out_rows < R)[:, None] & steps_mask[None, :], other=0.0)
        n = steps // L
        t = steps % L
        b_mask = steps_mask[:, None] & (out_cols < C)[None, :]
        if SHIFT:
            b_block = tl.load(b + n[:, None] * b_batch_stride + (t - 1)[:, None] * b_time_stride
                              + out_cols[None, :] * b_col_stride,
                              mask=b_mask & (t > 0)[:, None], other=0.0).to(COMPUTE_TYPE)
            b_block += tl.load(b0 + n[:, None] * b0_batch_stride + out_cols[None, :] * b0_col_stride,
                               mask=b_mask & (t == 0)[:, None], other=0.0).to(COMPUTE_TYPE)
        else:
            b_block = tl.load(b + n[:, None] * b_batch_stride + t[:, None] * b_time_stride
                              + out_cols[None, :] * b_col_stride, mask=b_mask, other=0.0).to(COMPUTE_TYPE)
        acc = numerics.dot(acc, store_value(a_block, OPERAND_TYPE, INTERP),
                           store_value(b_block, OPERAND_TYPE, INTERP), DOT)
    tl.store(out + out_rows[:, None] * out_row_stride + out_cols[None, :] * out_col_stride,
             store_value(acc, out.dtype.element_ty, INTERP),
             mask=(out_rows < R)[:, None] & (out_cols < C)[None, :])


# --- host side ------------------------------------------------------------------------------

def _spec(primitive, inputs, activation=None):
    """The recurrent spec of the tensors ``inputs`` (in the primitive's order)."""
    return recurrent_spec(primitive, tuple(t.shape for t in inputs), tuple(t.dtype for t in inputs), activation)


#: GPU blocks of the time-loop kernels by dot kind, ((BLOCK_SIZE_BATCH, BLOCK_SIZE_HIDDEN,
#: BLOCK_SIZE_K), num_warps): no register spill for sm_90 and sm_80. The hidden units are the dots'
#: rows: 64 for wgmma with 16-bit weights (on 8 warps: the LSTM backward's gates need the
#: registers); float32 (FFMA, TF32) and float64 take 16, so that a program's four LSTM gates fit.
_GPU_BLOCKS = {numerics.DOT_NATIVE.value: ((16, 64, 16), 8), numerics.DOT_FP64.value: ((16, 16, 16), 4),
               None: ((16, 16, 32), 4)}


@lru_cache(maxsize=256)
def _time_loop_plan(spec, sms, kind):
    """(grid, units per program, launch keywords) of the time-loop kernels for
    ``spec`` on a GPU of ``sms`` SMs, with dots of ``kind`` (an argument, not
    read here: it follows ``set_matmul_precision``, and the plan is cached). Grid axis 0: the batch blocks; axis 1:
    on a GPU the hidden units are split so that the launch has about as many
    programs as the GPU has SMs, never more (the programs of a batch block
    wait for each other after every step, so all of them must be resident at
    once); in the interpreter, which runs programs one after another, one
    program per batch block takes every unit."""
    p2 = launch.next_pow2
    n, h = spec.batch, spec.hidden_size
    if launch.INTERPRET:
        (bn, bj, bk), warps, splits = (min(p2(n), 64), min(p2(h), 64), min(p2(h), 64)), 4, 1
    else:
        (bn, bj, bk), warps = _GPU_BLOCKS.get(kind, _GPU_BLOCKS[None])
        splits = max(1, min(launch.cdiv(h, bj), sms // launch.cdiv(n, bn)))
    units = launch.cdiv(launch.cdiv(h, splits), bj) * bj
    splits = launch.cdiv(h, units)
    options = dict(CELL=_CELLS[spec.primitive].value, RELU=spec.activation == "relu", GATES=spec.gates,
                   BLOCK_SIZE_BATCH=bn, BLOCK_SIZE_HIDDEN=bj, BLOCK_SIZE_K=bk, SYNC=splits > 1, DOT=kind,
                   INTERP=launch.INTERPRET, num_warps=warps)
    return (launch.cdiv(n, bn), splits), units, options


def _step_counters(grid, device, fallback):
    """The zeroed barrier counters of a split time loop (one per batch
    block), or ``fallback`` (unused) when a program per block takes every unit."""
    return copy.full((grid[0],), 0, torch.int32, device) if grid[1] > 1 else fallback


def _states(spec, x, h0, c0, w_ih, w_hh, b_ih, b_hh, xp=None):
    """(states, xp): every state in the compute type ((N, L, H), LSTM
    (N, L, 2H)) and the input projections (N, L, G*H)."""
    compute_dtype = to_torch(spec.compute_dtype)
    states = launch.empty(spec.out_shape, compute_dtype, x.device)
    if xp is None:
        xp = matrix_product(x, w_ih.transpose(0, 1), out_dtype=compute_dtype)
    grid, units, options = _time_loop_plan(spec, launch.sm_count(x.device.index), numerics.dot_kind(to_torch(spec.dtype)))
    c0_ = h0 if c0 is None else c0
    launch.launch(_forward_kernel, grid, xp, h0, c0_, w_hh, b_ih, b_hh, states,
                  _step_counters(grid, x.device, states), spec.batch, spec.length, spec.hidden_size, units,
                  h0.stride(0), h0.stride(1), c0_.stride(0), c0_.stride(1), w_hh.stride(0), w_hh.stride(1),
                  b_ih.stride(0), b_hh.stride(0), **options)
    return states, xp


def _forward(spec, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    if spec.batch * spec.length * spec.hidden_size == 0:
        return launch.empty(spec.out_shape, x.dtype, x.device)
    states, _ = _states(spec, x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return copy.cast(states, x.dtype)


def _weight_sum(a, b, b0, out_shape, dtype, shift=False):
    """The (R, C) sum over (n, t) of a[n, t, :]^T b[n, t, :] (see the kernel)."""
    n, length, r = a.shape
    c = out_shape[-1]
    out = launch.empty(out_shape, dtype, a.device)
    if out.numel() == 0:
        return out
    m = n * length
    if m == 0:
        return copy.full(out_shape, 0.0, dtype, a.device)
    f64 = a.dtype == torch.float64
    p2 = launch.next_pow2
    if launch.INTERPRET:
        br, bc, bm = min(p2(r), 128), min(p2(c), 128), min(p2(m), 256)
    elif f64:
        br, bc, bm = 16, 16, 16
    elif numerics.dot_kind(dtype) == numerics.DOT_NATIVE.value:    # 64 rows: a 4-warp wgmma on sm_90
        br, bc, bm = 64, 32, 32
    else:
        br, bc, bm = 32, 32, 32
    o2 = out.view(r, c)
    b0_strides = (0, 0) if b0 is None else tuple(b0.stride())
    launch.launch(_weight_sum_kernel, (launch.cdiv(r, br), launch.cdiv(c, bc)), a, b,
                  a if b0 is None else b0, o2, r, c, m, length, *b.stride(), *b0_strides,
                  o2.stride(0), o2.stride(1), SHIFT=shift, DOT=numerics.dot_kind(dtype),
                  BLOCK_SIZE_R=br, BLOCK_SIZE_C=bc, BLOCK_SIZE_M=bm, INTERP=launch.INTERPRET)
    return out


def _backward(spec, needs, grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    n, length, h = spec.batch, spec.length, spec.hidden_size
    dev, dt = x.device, x.dtype

    def zeros(t):
        return copy.full(tuple(t.shape), 0.0, t.dtype, dev)

    if n * length * h == 0:
        gs = [zeros(x), zeros(h0)] + ([] if c0 is None else [zeros(c0)]) + \
             [zeros(w_ih), zeros(w_hh), zeros(b_ih), zeros(b_hh)]
        return tuple(g if need else None for g, need in zip(gs, needs))
    ct = to_torch(spec.compute_dtype)
    xp = matrix_product(x, w_ih.transpose(0, 1), out_dtype=ct)
    if out.dtype == ct:
        states = copy.contiguous(out)
    else:   # the output was rounded: recompute the states in the compute type
        states, _ = _states(spec, x, h0, c0, w_ih, w_hh, b_ih, b_hh, xp=xp)
    gate_width = spec.gates * h
    dgi = launch.empty((n, length, gate_width), ct, dev)
    dgh = launch.empty((n, length, gate_width), ct, dev) if spec.primitive == "gru_sequence" else dgi
    carry = launch.empty((n, h), ct, dev)
    dh0 = launch.empty((n, h), h0.dtype, dev)
    dc0 = launch.empty((n, h), c0.dtype, dev) if c0 is not None else dh0
    c0_ = h0 if c0 is None else c0
    grid, units, options = _time_loop_plan(spec, launch.sm_count(dev.index), numerics.dot_kind(to_torch(spec.dtype)))
    launch.launch(_backward_kernel, grid, xp, h0, c0_, w_hh, b_ih, b_hh, states, grad, dgi, dgh, carry, dh0, dc0,
                  _step_counters(grid, dev, carry), n, length, h, units,
                  h0.stride(0), h0.stride(1), c0_.stride(0), c0_.stride(1), w_hh.stride(0), w_hh.stride(1),
                  b_ih.stride(0), b_hh.stride(0), grad.stride(0), grad.stride(1), grad.stride(2), **options)
    # the products and sums after the time loop, each only where its gradient is needed
    need_x, need_h0, *need_c0, need_w_ih, need_w_hh, need_b_ih, need_b_hh = needs
    h_states = states if spec.primitive != "lstm_sequence" else states[:, :, :h]
    gs = [matrix_product(copy.cast(dgi, dt), w_ih) if need_x else None,     # 16-bit: both operands in it (tensor cores)
          dh0 if need_h0 else None]
    gs += [] if c0 is None else [dc0 if need_c0[0] else None]
    gs += [_weight_sum(dgi, x, None, tuple(w_ih.shape), w_ih.dtype) if need_w_ih else None,
           _weight_sum(dgh, h_states, h0, tuple(w_hh.shape), w_hh.dtype, shift=True) if need_w_hh else None,
           unbroadcast(dgi, tuple(b_ih.shape), dtype=b_ih.dtype) if need_b_ih else None,    # sums over batch and time
           unbroadcast(dgh, tuple(b_hh.shape), dtype=b_hh.dtype) if need_b_hh else None]
    return tuple(gs)


# --- the primitives -------------------------------------------------------------------------

def rnn_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """See ``reference.rnn.rnn_sequence_forward``: GEMM, then one launch for the time loop."""
    spec = _spec("rnn_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), activation)
    return _forward(spec, x, h0, None, w_ih, w_hh, b_ih, b_hh)


def rnn_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh", needs=(True,) * 6):
    """See ``reference.rnn.rnn_sequence_backward``: one launch for BPTT, then GEMM/sums."""
    spec = _spec("rnn_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), activation)
    return _backward(spec, needs, grad, out, x, h0, None, w_ih, w_hh, b_ih, b_hh)


def lstm_sequence_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.lstm_sequence_forward``; output [h_t, c_t] per step."""
    spec = _spec("lstm_sequence", (x, h0, c0, w_ih, w_hh, b_ih, b_hh))
    return _forward(spec, x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def lstm_sequence_backward(grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh, needs=(True,) * 7):
    """See ``reference.rnn.lstm_sequence_backward``."""
    spec = _spec("lstm_sequence", (x, h0, c0, w_ih, w_hh, b_ih, b_hh))
    return _backward(spec, needs, grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def gru_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.gru_sequence_forward``."""
    spec = _spec("gru_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh))
    return _forward(spec, x, h0, None, w_ih, w_hh, b_ih, b_hh)


def gru_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh, needs=(True,) * 6):
    """See ``reference.rnn.gru_sequence_backward``."""
    spec = _spec("gru_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh))
    return _backward(spec, needs, grad, out, x, h0, None, w_ih, w_hh, b_ih, b_hh)
