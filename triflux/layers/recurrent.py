"""Recurrent layers: RNN, LSTM, GRU over batch-first sequences (N, L, in), and
their cells RNNCell, LSTMCell, GRUCell for one step (N, in).

Parameters have PyTorch's names, layouts, gate order and equations
(``weight_ih`` (G*H, in), ``weight_hh`` (G*H, H), ``bias_ih``, ``bias_hh``
(G*H,); LSTM gates i, f, g, o; GRU gates r, z, n with ``bias_hh``'s n part
inside the reset gate's product), so PyTorch weights load directly. The
initial values are PyTorch's too: every parameter uniform on
[-1/sqrt(H), 1/sqrt(H)], drawn on the CPU from triflux's seeded stream.

A layer returns the output sequence (N, L, H), so it chains with Dense (which
acts on the last axis); ``return_state=True`` (at construction, as in Flux,
or per call) also returns the final state: ``h`` for RNN and GRU, ``(h, c)``
for the LSTM, each (N, H). ``layer(x, state)`` starts from a given state
(zeros by default). A cell returns ``(output, new_state)``; its output is the
new ``h``.

The whole sequence is one primitive, run by its ops function
(``ops.rnn_sequence``, ``ops.lstm_sequence``, ``ops.gru_sequence``): on a GPU
a few kernel launches per sequence, with backpropagation through time in one
more.
"""
import math

import numpy as np

from .. import ops
from .. import dtypes as _dt
from ..activations import as_activation, relu, tanh
from ..arguments import flag_arg, float_dtype, int_arg
from ..constructors import fill, next_seed
from ..devices import as_device
from ..errors import ArgumentError, ShapeError
from ..show import fname
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .inputs import check_input

__all__ = ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"]

_ACTIVATIONS = {tanh: "tanh", relu: "relu"}
_ACTIVATION_BY_NAME = {name: f for f, name in _ACTIVATIONS.items()}


class _Recurrent(Layer):
    """Shared set-up of the recurrent layers and cells (parameters, checks)."""
    _gates = 1
    _sequence = staticmethod(ops.rnn_sequence)   # the ops function that runs the whole sequence
    _two_states = False

    def _setup(self, in_features, out_features, dtype, device, return_state=None):
        """Check the arguments; draw the parameters (``return_state``: layers only, not cells)."""
        who = type(self).__name__
        in_features = int_arg(in_features, who, "in_features", low=0)
        out_features = int_arg(out_features, who, "out_features")
        if return_state is not None:
            self.return_state = flag_arg(return_state, who, "return_state")
        dtype = float_dtype(dtype, who)
        g, h = self._gates, out_features
        bound = 1.0 / math.sqrt(h)
        rng = np.random.default_rng(next_seed())

        def draw(*shape):
            return Tensor._from_numpy(rng.uniform(-bound, bound, shape).astype(dtype))

        self.weight_ih = draw(g * h, in_features)
        self.weight_hh = draw(g * h, h)
        self.bias_ih = draw(g * h)
        self.bias_hh = draw(g * h)
        if device is not None:
            dev = as_device(device)
            for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(self, k, transfer(getattr(self, k), dev))

    @property
    def in_features(self):
        return self.weight_ih.shape[1]

    @property
    def out_features(self):
        return self.weight_hh.shape[1]

    hidden_size = out_features

    def _attrs(self):
        return {}

    def _signature(self):
        s = f"{self.in_features} => {self.out_features}"
        act = getattr(self, "activation", tanh)
        if act is not tanh:
            s += f", {fname(act)}"
        if getattr(self, "return_state", False):
            s += ", return_state=true"
        return s

    # --- checks ---------------------------------------------------------------------------

    def _input(self, x, rank):
        if not isinstance(x, Tensor):
            x = as_tensor(np.asarray(x))
        want = "(N, L, in) sequence (batch first)" if rank == 3 else "(N, in) batch"
        if x.ndim != rank:
            hint = ""
            if rank == 3 and x.ndim == 2:
                hint = (" For one step use the cell (e.g. LSTMCell); for a single sequence add the batch "
                        "axis: `reshape(x, (1, L, in))`.")
            raise ShapeError(f"{layer_name(self)} expects a {rank}-d {want} input, got shape {x.shape}.{hint}")
        return check_input(self, x, self.weight_ih, expected=self.in_features)

    def _one_state(self, s, n, what):
        if not isinstance(s, Tensor):
            s = as_tensor(np.asarray(s))
        if s.ndim != 2 or s.shape[0] != n:
            raise ShapeError(f"{layer_name(self)}: the {what} state must have shape ({n}, {self.out_features}) "
                             f"(batch, hidden) for an input batch of {n}, got shape {s.shape}")
        return check_input(self, s, self.weight_ih, expected=self.out_features, what="hidden units")

    def _state(self, state, n):
        """The initial state as a tuple of (N, H) Tensors (zeros when None)."""
        names = ("h", "c") if self._two_states else ("h",)
        if state is None:
            z = fill((n, self.out_features), 0.0, self.weight_ih.dtype, self.weight_ih._device)
            return (z,) * len(names)
        if self._two_states:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise TypeError(f"{layer_name(self)}: the state is a pair (h, c) of (N, H) tensors, got "
                                f"{type(state).__name__}")
            return tuple(self._one_state(s, n, w) for s, w in zip(state, names))
        if isinstance(state, (tuple, list)):
            if len(state) != 1:
                raise TypeError(f"{layer_name(self)}: the state is one (N, H) tensor h, got a "
                                f"{type(state).__name__} of {len(state)}")
            state = state[0]
        return (self._one_state(state, n, "h"),)

    # --- the computation --------------------------------------------------------------------

    def _run(self, x, state):
        """(y (N, L, H), final state) for x (N, L, in)."""
        n, length, _ = x.shape
        h = self.out_features
        init = self._state(state, n)
        out = self._sequence(x, *init, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, **self._attrs())
        if self._two_states:
            y = ops.getitem(out, (slice(None), slice(None), slice(0, h)))
            if length == 0:
                return y, init
            hT = ops.getitem(out, (slice(None), length - 1, slice(0, h)))
            cT = ops.getitem(out, (slice(None), length - 1, slice(h, 2 * h)))
            return y, (hT, cT)
        if length == 0:
            return out, init[0]
        return out, ops.getitem(out, (slice(None), length - 1, slice(None)))


class _Layer(_Recurrent):
    def __call__(self, x, state=None, *, return_state=None):
        x = self._input(x, 3)
        y, final = self._run(x, state)
        if self.return_state if return_state is None else return_state:
            return y, final
        return y


class _Cell(_Recurrent):
    def __call__(self, x, state=None):
        x = self._input(x, 2)
        n = x.shape[0]
        y, final = self._run(ops.reshape(x, (n, 1, self.in_features)), state)
        h = ops.reshape(y, (n, self.out_features))
        if self._two_states:
            return h, final
        return h, h


def _activation_name(activation, who):
    name = _ACTIVATIONS.get(as_activation(activation, who))
    if name is None:
        raise ArgumentError(f"{who}: the activation must be tanh or relu (as torch.nn.RNN's nonlinearity), "
                            f"got {getattr(activation, '__name__', activation)!r}")
    return name


class RNNCell(_Cell):
    """One step of an Elman RNN: ``h' = activation(x W_ih^T + b_ih + h W_hh^T + b_hh)``;
    ``cell(x, h) -> (h', h')`` on (N, in) steps. Flux's ``RNNCell(in => out, activation)``.
    Math: reference/rnn.py ``rnn_sequence_forward`` (one step)."""

    def __init__(self, in_features, out_features, activation=tanh, *, dtype=_dt.float32, device=None):
        self._act = _activation_name(activation, "RNNCell")
        self.activation = _ACTIVATION_BY_NAME[self._act]
        self._setup(in_features, out_features, dtype, device)

    def _attrs(self):
        return {"activation": self._act}


class LSTMCell(_Cell):
    """One LSTM step (torch.nn.LSTMCell's equations, gates i, f, g, o):
    ``cell(x, (h, c)) -> (h', (h', c'))``. Math: reference/rnn.py ``lstm_sequence_forward``."""
    _gates, _sequence, _two_states = 4, staticmethod(ops.lstm_sequence), True

    def __init__(self, in_features, out_features, *, dtype=_dt.float32, device=None):
        self._setup(in_features, out_features, dtype, device)


class GRUCell(_Cell):
    """One GRU step (torch.nn.GRUCell's equations, gates r, z, n):
    ``cell(x, h) -> (h', h')``. Math: reference/rnn.py ``gru_sequence_forward``."""
    _gates, _sequence = 3, staticmethod(ops.gru_sequence)

    def __init__(self, in_features, out_features, *, dtype=_dt.float32, device=None):
        self._setup(in_features, out_features, dtype, device)


class RNN(_Layer):
    """Elman RNN over a batch-first sequence (N, L, in) -> (N, L, out), as
    ``torch.nn.RNN(in, out, nonlinearity, batch_first=True)``;
    ``RNN(7, 6)`` is Flux's ``RNN(7 => 6)``. ``in_features`` >= 0 and
    ``out_features`` >= 1 are ints, ``activation`` tanh or relu (or their
    names), ``dtype`` a floating type. ``layer(x, h0)`` starts from h0;
    ``return_state=True`` also returns the final h::

        RNN(7, 6)(tf.ones(2, 10, 7)).shape      # (2, 10, 6)

    Math: reference/rnn.py ``rnn_sequence_forward``."""

    def __init__(self, in_features, out_features, activation=tanh, *, return_state=False,
                 dtype=_dt.float32, device=None):
        self._act = _activation_name(activation, "RNN")
        self.activation = _ACTIVATION_BY_NAME[self._act]
        self._setup(in_features, out_features, dtype, device, return_state)

    def _attrs(self):
        return {"activation": self._act}


class LSTM(_Layer):
    """LSTM over a batch-first sequence (N, L, in) -> (N, L, out), as
    ``torch.nn.LSTM(in, out, batch_first=True)`` (Flux's ``LSTM(in => out)``);
    the state is (h, c): ``y, (h, c) = LSTM(3, 4, return_state=True)(x)``.
    Math: reference/rnn.py ``lstm_sequence_forward``."""
    _gates, _sequence, _two_states = 4, staticmethod(ops.lstm_sequence), True

    def __init__(self, in_features, out_features, *, return_state=False, dtype=_dt.float32, device=None):
        self._setup(in_features, out_features, dtype, device, return_state)


class GRU(_Layer):
    """GRU over a batch-first sequence (N, L, in) -> (N, L, out), as
    ``torch.nn.GRU(in, out, batch_first=True)`` (Flux's ``GRU(in => out)``);
    the state is h. Math: reference/rnn.py ``gru_sequence_forward``."""
    _gates, _sequence = 3, staticmethod(ops.gru_sequence)

    def __init__(self, in_features, out_features, *, return_state=False, dtype=_dt.float32, device=None):
        self._setup(in_features, out_features, dtype, device, return_state)
