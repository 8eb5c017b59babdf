"""Strategies and torch oracles for the recurrent family (whole sequences).

Tiny problems: batch N in 0..2, length L in 0..5, input size in 0..3, hidden
size H in 1..4 (zero batch, zero length and zero input features are
included: the output is then empty or the input projection is zero); values
in [-1, 1]. Random memory layouts for every input. The oracles are written
with torch tensor operations (a loop over time), so they run in any dtype
and on empty inputs, where ``torch.nn.RNN`` would refuse.
"""
from . import Case, floats, layouts_for
from ..specs.rnn import GATES


def _case(st, draw, name):
    g = GATES[name]
    n = draw(st.integers(0, 2))
    length = draw(st.integers(0, 5))
    i = draw(st.integers(0, 3))
    h = draw(st.integers(1, 4))
    x = draw(floats((n, length, i), -1.0, 1.0))
    h0 = draw(floats((n, h), -1.0, 1.0))
    inputs = [x, h0]
    if name == "lstm_sequence":
        inputs.append(draw(floats((n, h), -1.0, 1.0)))
    inputs += [draw(floats((g * h, i), -1.0, 1.0)), draw(floats((g * h, h), -1.0, 1.0)),
               draw(floats((g * h,), -1.0, 1.0)), draw(floats((g * h,), -1.0, 1.0))]
    attrs = {}
    if name == "rnn_sequence":
        attrs["activation"] = draw(st.sampled_from(("tanh", "relu")))
    return Case(inputs=tuple(inputs), attrs=attrs, layouts=draw(layouts_for(len(inputs))),
                note=f"N={n} L={length} in={i} H={h}")


def rnn_sequence_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, "rnn_sequence"))()


def lstm_sequence_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, "lstm_sequence"))()


def gru_sequence_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, "gru_sequence"))()


def _stack(steps, x, width, *others):
    """The steps stacked on axis 1; an empty (N, 0, width) result connected to
    every input (zero gradients) when there are none."""
    import torch
    if steps:
        return torch.stack(steps, dim=1)
    link = sum((o.sum() for o in others), x.sum()) * 0
    return x.new_zeros((x.shape[0], 0, width)) + link


def rnn_sequence_torch(x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), torch.nn.RNN's equation."""
    import torch
    act = torch.tanh if activation == "tanh" else torch.relu
    h, ys = h0, []
    for t in range(x.shape[1]):
        h = act(x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        ys.append(h)
    return _stack(ys, x, h0.shape[1], h0, w_ih, w_hh, b_ih, b_hh)


def lstm_sequence_torch(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.LSTM's equations (gates i, f, g, o); returns [h_t, c_t] per step."""
    import torch
    hs = h0.shape[1]
    h, c, ys = h0, c0, []
    for t in range(x.shape[1]):
        a = x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i, f = torch.sigmoid(a[:, :hs]), torch.sigmoid(a[:, hs:2 * hs])
        g, o = torch.tanh(a[:, 2 * hs:3 * hs]), torch.sigmoid(a[:, 3 * hs:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        ys.append(torch.cat([h, c], dim=1))
    return _stack(ys, x, 2 * hs, h0, c0, w_ih, w_hh, b_ih, b_hh)


def gru_sequence_torch(x, h0, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.GRU's equations (gates r, z, n; b_hn inside the reset product)."""
    import torch
    hs = h0.shape[1]
    h, ys = h0, []
    for t in range(x.shape[1]):
        ai = x[:, t] @ w_ih.T + b_ih
        ah = h @ w_hh.T + b_hh
        r = torch.sigmoid(ai[:, :hs] + ah[:, :hs])
        z = torch.sigmoid(ai[:, hs:2 * hs] + ah[:, hs:2 * hs])
        n = torch.tanh(ai[:, 2 * hs:] + r * ah[:, 2 * hs:])
        h = (1 - z) * n + z * h
        ys.append(h)
    return _stack(ys, x, hs, h0, w_ih, w_hh, b_ih, b_hh)
