"""The recurrent spec: the sizes of a whole-sequence RNN, LSTM or GRU.

Inputs, batch first, in PyTorch's layout: ``x`` (N, L, I), the initial state
``h0`` (and the LSTM's ``c0``) (N, H), ``w_ih`` (G*H, I), ``w_hh`` (G*H, H),
``b_ih``, ``b_hh`` (G*H,), with G gates per cell (:data:`GATES`). The output
is every hidden state, (N, L, H); the LSTM's is ``[h_t, c_t]`` per step,
(N, L, 2H).
"""
import functools
import math
from dataclasses import dataclass

from ..dtypes import as_dtype, compute_dtype, is_floating
from ..errors import DTypeError, ShapeError

#: gates per cell, by primitive: RNN 1; LSTM 4 (i, f, g, o); GRU 3 (r, z, n)
GATES = {"rnn_sequence": 1, "lstm_sequence": 4, "gru_sequence": 3}

#: the RNN's activations (torch.nn.RNN's nonlinearity)
ACTIVATIONS = ("tanh", "relu")


@dataclass(frozen=True)
class RecurrentSpec:
    """The sizes of one sequence primitive (see the module docstring)."""
    primitive: str           #: "rnn_sequence", "lstm_sequence" or "gru_sequence"
    gates: int               #: G
    batch: int               #: N
    length: int              #: L
    input_size: int          #: I
    hidden_size: int         #: H
    dtype: object            #: the inputs' (common) NumPy dtype
    compute_dtype: object    #: the dtype the recurrence runs in
    activation: str          #: the RNN's activation ("tanh" or "relu"); None for LSTM and GRU

    @property
    def state_width(self):
        """Values per step in the output: H, or 2H for the LSTM's [h, c]."""
        return 2 * self.hidden_size if self.primitive == "lstm_sequence" else self.hidden_size

    @property
    def out_shape(self):
        return (self.batch, self.length, self.state_width)


@functools.lru_cache(maxsize=1024)
def recurrent_spec(primitive, shapes, dtypes, activation=None):
    """The spec of ``primitive`` for inputs of ``shapes`` and ``dtypes`` (tuples
    in the primitive's order: x, h0, [c0,] w_ih, w_hh, b_ih, b_hh; NumPy or
    torch dtypes) and, for ``rnn_sequence``, its ``activation``. Raises
    ValueError, DTypeError or ShapeError naming the input that does not fit."""
    gates = GATES[primitive]
    if primitive == "rnn_sequence" and activation not in ACTIVATIONS:
        raise ValueError(f"rnn_sequence: activation must be 'tanh' or 'relu', got {activation!r}")
    shapes = tuple(tuple(int(s) for s in shape) for shape in shapes)
    names = ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh") if primitive == "lstm_sequence" else \
        ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh")
    given = dict(zip(names, shapes))
    kinds = {as_dtype(d) for d in dtypes}
    if len(kinds) != 1 or not is_floating(next(iter(kinds))):
        raise DTypeError(f"{primitive}: every input must have one floating dtype, got "
                         f"{', '.join(sorted(str(d) for d in kinds))}; convert with `f32(...)` first")
    x, w_hh = given["x"], given["w_hh"]
    if len(x) != 3:
        raise ShapeError(f"{primitive}: x must have shape (N, L, in), got {x}")
    n, length, i = x
    if len(w_hh) != 2 or w_hh[0] != gates * w_hh[1]:
        raise ShapeError(f"{primitive}: w_hh must have shape ({gates}*H, H), got {w_hh}")
    h = w_hh[1]
    want = {"h0": (n, h), "w_ih": (gates * h, i), "b_ih": (gates * h,), "b_hh": (gates * h,), "c0": (n, h)}
    for name in want:
        if name in given and given[name] != want[name]:
            raise ShapeError(f"{primitive}: {name} must have shape {want[name]} for x of shape {x} "
                             f"and hidden size {h}, got {given[name]}")
    dtype = next(iter(kinds))
    return RecurrentSpec(primitive=primitive, gates=gates, batch=n, length=length, input_size=i,
                         hidden_size=h, dtype=dtype, compute_dtype=compute_dtype(dtype),
                         activation=activation if primitive == "rnn_sequence" else None)


# --- floating-point operations (the registry's ``flops``, read by the kernel report) ------------

def recurrent_flops(name, direction, inputs, out_shape, attrs, largest):
    """2 N L (|W_ih| + |W_hh|) forward (the two products of every time step);
    twice that backward."""
    first_weight = 3 if name == "lstm_sequence" else 2
    x, w_ih, w_hh = inputs[0], inputs[first_weight], inputs[first_weight + 1]
    return 2 * x[0] * x[1] * (math.prod(w_ih) + math.prod(w_hh)) * (2 if direction == "backward" else 1)
