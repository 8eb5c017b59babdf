"""Recurrent family, NumPy reference: whole sequences through an RNN, LSTM or
GRU cell, with full backpropagation through time (BPTT).

Shapes (batch first; ``triflux.specs.rnn`` checks them): ``x`` (N, L, I), initial state ``h0`` (and ``c0``)
(N, H); weights in PyTorch's layout and gate order: ``w_ih`` (G*H, I),
``w_hh`` (G*H, H), ``b_ih``, ``b_hh`` (G*H,), with G = 1 (RNN), 4 (LSTM:
gates i, f, g, o) or 3 (GRU: gates r, z, n). For a gate ``k`` the rows
``k*H:(k+1)*H`` of the weights and biases belong to it.

Outputs (one per primitive): RNN and GRU return every hidden state,
``y[:, t] = h_t`` of shape (N, L, H); the LSTM returns ``[h_t, c_t]``
concatenated on the last axis, (N, L, 2H), so its backward finds every cell
state in ``out`` and can recompute the gates from it. The reference's LSTM
forward also keeps its gates with the output it returns (for as long as that
array lives), and the backward handed that very array reads them instead.

The backward is BPTT: walking t = L-1 ... 0 with the gradient ``dh`` that
reaches h_t (the output gradient at t plus what flows back from step t+1),
it forms the gradients of the gate pre-activations ``dA_t`` (N, G*H) and

    dx_t      = dA_t @ w_ih           dW_ih = sum_t dA_t^T x_t
    dh_{t-1} += dA_t @ w_hh           dW_hh = sum_t dA_t^T h_{t-1}
    db_ih     = sum_{n,t} dA_t        db_hh = sum_{n,t} dA_t

(GRU: the hidden-side gate gradients differ in the n gate, see
``gru_sequence_backward``). Each backward takes ``needs`` (one bool per
input) and returns None for a gradient nobody needs (a model's data ``x``
needs no dx: one product fewer, as large as dW_ih's). float16/bfloat16 compute in
float32 and round once at the end; float32 and float64 stay as they are.
"""
import numpy as np

from ..specs.rnn import recurrent_spec
from ._activation import relu
from ._util import in_compute_dtype, keep_for_backward, kept_for_backward


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _spec(primitive, inputs, activation=None):
    """The recurrent spec of ``inputs`` (in the primitive's order); validates them."""
    return recurrent_spec(primitive, tuple(np.shape(a) for a in inputs),
                          tuple(np.asarray(a).dtype for a in inputs), activation)


# --- RNN --------------------------------------------------------------------------------

def rnn_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """Elman RNN over the sequence, as ``torch.nn.RNN``:

        h_t = act(x_t @ w_ih^T + b_ih + h_{t-1} @ w_hh^T + b_hh),   h_{-1} = h0,

    act = tanh or relu. Returns y (N, L, H) with y[:, t] = h_t.
    """
    spec = _spec("rnn_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), activation)
    x, h, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(x, h0, w_ih, w_hh, b_ih, b_hh)
    y = np.zeros(spec.out_shape, dtype=spec.compute_dtype)
    xa = _project(x, w_ih, b_ih + b_hh)          # the input side of every step at once
    for t in range(spec.length):
        a = xa[:, t] + h @ w_hh.T
        h = np.tanh(a) if activation == "tanh" else relu(a)
        y[:, t] = h
    return y.astype(spec.dtype)


def rnn_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh", needs=(True,) * 6):
    """BPTT with G = dL/dy. For t = L-1 ... 0, with dh = G_t + (carry from t+1):

        dA_t = dh * act'(A_t)     (tanh: 1 - tanh(A_t)^2; relu: [A_t > 0])
        dh_{t-1} = dA_t @ w_hh    (the carry; dh0 = dA_0 @ w_hh)

    and the sums over t in the module docstring for dx, dW_ih, dW_hh, db_ih, db_hh.
    The pre-activations A_t = x_t @ w_ih^T + h_{t-1} @ w_hh^T + b_ih + b_hh are
    recomputed from the stored states, as the kernels do: 1 - h_t^2 from an
    output rounded to 16 bits loses its digits where tanh saturates.
    """
    spec = _spec("rnn_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), activation)
    grad, out, x, h0, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh)
    hprev = np.concatenate([h0[:, None], out[:, :-1]], axis=1) if spec.length else out
    pre = _project(x, w_ih, b_ih + b_hh) + _project(hprev, w_hh, 0)
    d_act = 1 - np.tanh(pre) ** 2 if activation == "tanh" else (pre > 0).astype(pre.dtype)
    da = np.zeros_like(out)
    dh = np.zeros_like(h0)
    for t in reversed(range(spec.length)):
        dh = dh + grad[:, t]
        da[:, t] = dh * d_act[:, t]
        dh = da[:, t] @ w_hh
    return _sums(spec.dtype, needs, da, da, x, hprev, w_ih, dh)


def _project(x, w, b):
    """``x_t @ w^T + b`` for every (n, t) at once, as one matrix product:
    (N, L, K) -> (N, L, rows of w)."""
    n, length, k = x.shape
    return (x.reshape(n * length, k) @ w.T + b).reshape(n, length, w.shape[0])


def _sums(dtype, needs, da_i, da_h, x, hprev, w_ih, dh0):
    """dx, dh0, dW_ih, dW_hh, db_ih, db_hh from the gate gradients (each sum
    over (n, t) one matrix product over the flattened batch and time); None
    for those not in ``needs``."""
    n, length, _ = da_i.shape
    flat = lambda a: a.reshape(n * length, a.shape[2])   # noqa: E731
    need_x, need_h0, need_w_ih, need_w_hh, need_b_ih, need_b_hh = needs
    grads = ((flat(da_i) @ w_ih).reshape(x.shape) if need_x else None,
             dh0 if need_h0 else None,
             flat(da_i).T @ flat(x) if need_w_ih else None,
             flat(da_h).T @ flat(hprev) if need_w_hh else None,
             da_i.sum(axis=(0, 1)) if need_b_ih else None,
             da_h.sum(axis=(0, 1)) if need_b_hh else None)
    return tuple(None if g is None else g.astype(dtype) for g in grads)


# --- LSTM -------------------------------------------------------------------------------

def _columns(a):
    """(N, L, K) -> (L, K, N): each step's rows as columns, contiguous. (Copied
    by way of (L, N, K): two local copies beat one reading across the batch.)"""
    return _rows(np.ascontiguousarray(a.transpose(1, 0, 2)))


def _rows(a):
    """(L, K, N) -> (L, N, K), contiguous: each step's columns as rows."""
    return np.ascontiguousarray(a.transpose(0, 2, 1))


def lstm_sequence_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """LSTM over the sequence, as ``torch.nn.LSTM`` (gate order i, f, g, o):

        [a_i, a_f, a_g, a_o] = x_t @ w_ih^T + b_ih + h_{t-1} @ w_hh^T + b_hh
        i = sigmoid(a_i), f = sigmoid(a_f), g = tanh(a_g), o = sigmoid(a_o)
        c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t),   (h_{-1}, c_{-1}) = (h0, c0)

    Returns (N, L, 2H): y[:, t] = [h_t, c_t]. The loop runs on the transposed
    states h_t^T, c_t^T (H, N), A_t^T = w_ih x_t^T + w_hh h_{t-1}^T + b: BLAS
    runs these products, the batch their short side, faster than h @ w^T
    (2-3x for a batch of 16, 1.2x for 64), and each gate is a contiguous block
    of rows. The gates [i; f; g; o], states [h; c] and tanh(c) of every step
    are kept for the backward of the output.
    """
    spec = _spec("lstm_sequence", (x, h0, c0, w_ih, w_hh, b_ih, b_hh))
    hs = spec.hidden_size
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    gates = w_ih @ _columns(x)                  # (L, 4H, N): the input side of every step
    gates += (b_ih + b_hh)[:, None]
    states = np.empty((spec.length, 2 * hs, spec.batch), dtype=spec.compute_dtype)    # [h_t^T; c_t^T]
    tanh_c = np.empty((spec.length, hs, spec.batch), dtype=spec.compute_dtype)
    h, c = h0.T, c0.T
    for t in range(spec.length):
        a = gates[t]
        a += w_hh @ h
        i, f, g, o = _lstm_gates(a)              # in place: a becomes [i; f; g; o]
        c_prev, h, c = c, states[t, :hs], states[t, hs:]
        np.multiply(f, c_prev, out=c)
        c += i * g
        np.multiply(o, np.tanh(c, out=tanh_c[t]), out=h)
    out = np.ascontiguousarray(_rows(states).transpose(1, 0, 2), dtype=spec.dtype)
    keep_for_backward(out, gates, states, tanh_c)
    return out


def _sigmoid_in_place(v):
    """sigmoid(v) = 1 / (1 + exp(-v)), written over v."""
    np.negative(v, out=v)
    np.exp(v, out=v)
    v += 1
    return np.reciprocal(v, out=v)


def _gate_blocks(a):
    """The four gates' row blocks of ``a`` (..., 4H, N)."""
    hs = a.shape[-2] // 4
    return a[..., :hs, :], a[..., hs:2 * hs, :], a[..., 2 * hs:3 * hs, :], a[..., 3 * hs:, :]


def _lstm_gates(a):
    """(i, f, g, o) from the transposed pre-activations ``a`` (..., 4H, N), written over ``a``."""
    i, f, g, o = _gate_blocks(a)
    _sigmoid_in_place(a[..., :2 * g.shape[-2], :])       # i and f, one block
    np.tanh(g, out=g)
    _sigmoid_in_place(o)
    return i, f, g, o


def lstm_sequence_backward(grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh, needs=(True,) * 7):
    """BPTT. ``out`` gives h_t and c_t; the gates are the ones the forward kept
    with this ``out``, or (for any other array) recomputed from x_t and h_{t-1}.
    With G = [G^h, G^c] = dL/dy, for t = L-1 ... 0:

        dh  = G^h_t + dA_{t+1} @ w_hh                     (dA_L = 0)
        dc  = G^c_t + dc_{t+1} * f_{t+1} + dh * o * (1 - tanh(c_t)^2)
        dA_t = [dc * g * i (1 - i),  dc * c_{t-1} * f (1 - f),
                dc * i * (1 - g^2),  dh * tanh(c_t) * o (1 - o)]

    dh0 = dA_0 @ w_hh, dc0 = dc_0 * f_0; weights and biases as in the module
    docstring (the same dA for the input and hidden sides). The loop runs
    transposed, as the forward's (dA_t^T is (4H, N)); the factors of dc and dh
    in dA depend on the forward only, so they are formed for all steps at once.
    """
    spec = _spec("lstm_sequence", (x, h0, c0, w_ih, w_hh, b_ih, b_hh))
    kept = kept_for_backward(out)
    grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    n, length, hs = spec.batch, spec.length, spec.hidden_size
    if kept is None:    # every h_{t-1} is known, so the gates of all steps come from two matrix products
        states = _columns(out)
        h_prev = np.concatenate([h0.T[None], states[:-1, :hs]]) if length else states[:, :hs]
        gates = w_ih @ _columns(x) + b_ih[:, None] + (w_hh @ h_prev + b_hh[:, None])
        for a in gates:     # step by step, on contiguous blocks: NumPy 2.3 computes some in-place unary
            _lstm_gates(a)  # ufuncs wrongly on strided views with size-1 axes, such as (L, H, 1)
        i, f, g, o = _gate_blocks(gates)
        tc = np.tanh(states[:, hs:])
    else:
        gates, states, tc = (a.astype(x.dtype, copy=False) for a in kept)
        i, f, g, o = _gate_blocks(gates)
    # the factors of [dc; dc; dc; dh] in dA, each computed in place (a pass per operation)
    da = np.empty((length, 4 * hs, n), dtype=x.dtype)
    da_i, da_f, da_g, da_o = _gate_blocks(da)
    np.subtract(1, i, out=da_i)
    da_i *= i
    da_i *= g                                   # g i (1 - i)
    np.subtract(1, f, out=da_f)
    da_f *= f
    da_f[1:] *= states[:-1, hs:]                # c_{t-1} f (1 - f), c_{-1} = c0
    da_f[:1] *= c0.T
    np.square(g, out=da_g)
    np.subtract(1, da_g, out=da_g)
    da_g *= i                                   # i (1 - g^2)
    np.subtract(1, o, out=da_o)
    da_o *= o
    da_o *= tc                                  # tanh(c) o (1 - o)
    dc_dh = np.square(tc)
    np.subtract(1, dc_dh, out=dc_dh)
    dc_dh *= o                                  # o (1 - tanh(c)^2): dh's part of dc
    by_gate = da.reshape(length, 4, hs, n)      # dA_t^T gate by gate
    grad = _columns(grad)
    w_hh_t = np.ascontiguousarray(w_hh.T)
    dh_next = np.zeros((hs, n), dtype=x.dtype)     # (dA_{t+1} @ w_hh)^T
    dc_next = np.zeros((hs, n), dtype=x.dtype)     # (dc_{t+1} * f_{t+1})^T
    for t in reversed(range(length)):
        dh = grad[t, :hs] + dh_next
        dc = grad[t, hs:] + dc_next
        dc += dh * dc_dh[t]
        by_gate[t, :3] *= dc
        by_gate[t, 3] *= dh
        dh_next = w_hh_t @ da[t]
        dc_next = dc * f[t]
    # dA^T with columns (t, n), as x's and h_prev's rows below: a copy of whole runs
    # of N values (transposing each dA_t back reads it value by value: 26 vs 19 ms
    # for 128 steps of (2048, 64))
    da = np.ascontiguousarray(da.transpose(1, 0, 2)).reshape(4 * hs, length * n)
    need_x, need_h0, need_c0, need_w_ih, need_w_hh, need_b_ih, need_b_hh = needs
    dx = dw_ih = dw_hh = db = None
    if need_x:                                  # dx_t = dA_t @ w_ih
        dx = (da.T @ w_ih).reshape(length, n, spec.input_size).transpose(1, 0, 2)
    if need_w_ih:                               # sum over t, n of dA_t^T x_t
        dw_ih = da @ x.transpose(1, 0, 2).reshape(length * n, spec.input_size)
    if need_w_hh:
        h_prev = np.concatenate([h0[None], out.transpose(1, 0, 2)[:-1, :, :hs]]) if length else out[:, :, :hs]
        dw_hh = da @ h_prev.reshape(length * n, hs)
    if need_b_ih or need_b_hh:
        db = da.sum(axis=1)                     # db_ih = db_hh
    grads = (dx, dh_next.T if need_h0 else None, dc_next.T if need_c0 else None, dw_ih, dw_hh,
             db if need_b_ih else None, db.copy() if need_b_hh else None)
    return tuple(None if v is None else np.ascontiguousarray(v, dtype=spec.dtype) for v in grads)


# --- GRU --------------------------------------------------------------------------------

def gru_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh):
    """GRU over the sequence, as ``torch.nn.GRU`` (gate order r, z, n):

        r = sigmoid(x_t W_ir^T + b_ir + h_{t-1} W_hr^T + b_hr)
        z = sigmoid(x_t W_iz^T + b_iz + h_{t-1} W_hz^T + b_hz)
        n = tanh(x_t W_in^T + b_in + r * (h_{t-1} W_hn^T + b_hn))
        h_t = (1 - z) * n + z * h_{t-1},   h_{-1} = h0

    Returns y (N, L, H) with y[:, t] = h_t.
    """
    spec = _spec("gru_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh))
    hs = spec.hidden_size
    x, h, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(x, h0, w_ih, w_hh, b_ih, b_hh)
    y = np.zeros(spec.out_shape, dtype=spec.compute_dtype)
    xa = _project(x, w_ih, b_ih)                 # the input side of every step at once
    for t in range(spec.length):
        r, z, nn, _ = _gru_gates(xa[:, t], h @ w_hh.T + b_hh, hs)
        h = (1 - z) * nn + z * h
        y[:, t] = h
    return y.astype(spec.dtype)


def _gru_gates(ai, ah, hs):
    """(r, z, n, hn) from the input-side ``ai`` = x W_ih^T + b_ih and
    hidden-side ``ah`` = h W_hh^T + b_hh pre-activations (..., 3H)."""
    r = _sigmoid(ai[..., :hs] + ah[..., :hs])
    z = _sigmoid(ai[..., hs:2 * hs] + ah[..., hs:2 * hs])
    hn = ah[..., 2 * hs:]
    return r, z, np.tanh(ai[..., 2 * hs:] + r * hn), hn


def gru_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh, needs=(True,) * 6):
    """BPTT; gates recomputed from x_t and h_{t-1} (read from ``out``). For
    t = L-1 ... 0, with dh = G_t + dAh_{t+1} @ w_hh + dh_{t+1} * z_{t+1}:

        dn_pre = dh * (1 - z) * (1 - n^2)
        dr_pre = dn_pre * hn * r (1 - r),   hn = h_{t-1} W_hn^T + b_hn
        dz_pre = dh * (h_{t-1} - n) * z (1 - z)
        dAi_t = [dr_pre, dz_pre, dn_pre]          (input side: dx, dW_ih, db_ih)
        dAh_t = [dr_pre, dz_pre, dn_pre * r]      (hidden side: dh_{t-1}, dW_hh, db_hh)

    dh0 = dAh_0 @ w_hh + dh_0 * z_0.
    """
    spec = _spec("gru_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh))
    grad, out, x, h0, w_ih, w_hh, b_ih, b_hh = in_compute_dtype(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh)
    n, length, hs = spec.batch, spec.length, spec.hidden_size
    hprev = np.concatenate([h0[:, None], out[:, :-1]], axis=1) if length else out
    dai = np.zeros((n, length, 3 * hs), dtype=x.dtype)
    dah = np.zeros_like(dai)
    carry = np.zeros_like(h0)
    # every h_{t-1} is known, so the gates of all steps come from two matrix products
    gates = _gru_gates(_project(x, w_ih, b_ih), _project(hprev, w_hh, b_hh), hs)
    for t in reversed(range(length)):
        r, z, nn, hn = (v[:, t] for v in gates)
        dh = grad[:, t] + carry
        dn_pre = dh * (1 - z) * (1 - nn ** 2)
        dr_pre = dn_pre * hn * r * (1 - r)
        dz_pre = dh * (hprev[:, t] - nn) * z * (1 - z)
        dai[:, t] = np.concatenate([dr_pre, dz_pre, dn_pre], axis=1)
        dah[:, t] = np.concatenate([dr_pre, dz_pre, dn_pre * r], axis=1)
        carry = dah[:, t] @ w_hh + dh * z
    return _sums(spec.dtype, needs, dai, dah, x, hprev, w_ih, carry)
