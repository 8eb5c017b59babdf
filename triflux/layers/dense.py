"""Dense: the fully connected layer."""
import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..activations import as_activation, identity
from ..arguments import float_dtype, int_arg
from ..devices import as_device
from ..show import fname
from ..tensor import Tensor, transfer
from .base import Layer
from .fusion import fused_activation
from .initialisers import glorot_uniform, initial_weight, owned_parameter
from .inputs import check_input

__all__ = ["Dense"]


class Dense(Layer):
    """``y = activation(x @ weight.T + bias)`` on the last axis of ``x``.

    ``Dense(10, 5, relu)`` is Flux's ``Dense(10 => 5, relu)`` (``Dense((10,
    5))`` works too): ``in_features`` and ``out_features`` are non-negative
    ints; ``activation`` a function or an activation's name (``"relu"``,
    see ``triflux.activations.BY_NAME``); ``bias`` True (zeros), False/None
    (no bias) or an array of ``out_features`` values; ``init(out, in)``
    returns the initial weight (Glorot uniform by default); ``dtype`` a
    floating type; ``device`` where the parameters live. Arrays given as
    ``bias`` or returned by ``init`` are copied: the layer owns its
    parameters.

    ``weight`` has PyTorch's layout ``(out_features, in_features)``; inputs
    are ``(..., in_features)``, batch first (Flux's ``(in, N)`` in the same
    memory order)::

        layer = Dense(3, 2, relu)
        layer(tf.ones(4, 3)).shape     # (4, 2)

    With a bias and an activation whose derivative follows from its output
    (identity, relu, sigmoid, tanh), the layer is one fused primitive,
    ``ops.dense_bias_act``; any other activation runs after ``matmul`` and
    the bias add.

    Math: reference/matmul.py ``dense_bias_act_forward``, or
    ``matmul_forward`` (``ops.matmul(x, weight.T)``) and the activation's own.
    """

    def __init__(self, in_features, out_features=None, activation=identity, *, bias=True,
                 init=glorot_uniform, dtype=_dt.float32, device=None):
        if out_features is None and isinstance(in_features, tuple) and len(in_features) == 2:
            in_features, out_features = in_features
        in_features = int_arg(in_features, "Dense", "in_features", low=0)
        out_features = int_arg(out_features, "Dense", "out_features", low=0)
        self.activation = as_activation(activation, "Dense")
        dtype = float_dtype(dtype, "Dense")
        self.weight = initial_weight(init, (out_features, in_features), dtype, "Dense")
        if bias is True:
            self.bias = Tensor._from_numpy(np.zeros(out_features, dtype=dtype))
        elif bias is False or bias is None:
            self.bias = None
        else:
            self.bias = owned_parameter(bias, (out_features,), dtype, "Dense", "bias")
        if device is not None:
            dev = as_device(device)
            self.weight = transfer(self.weight, dev)
            if self.bias is not None:
                self.bias = transfer(self.bias, dev)

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return self.weight.shape[0]

    def __call__(self, x):
        x = check_input(self, x, self.weight, expected=self.in_features)
        # activations whose derivative follows from the output are fused with the
        # product and the bias into one primitive; others keep matmul, + bias, activation
        fused = fused_activation(self.activation, "dense_bias_act") if self.bias is not None else None
        if fused is not None:
            return ops.dense_bias_act(x, self.weight, self.bias, activation=fused)
        y = ops.matmul(x, self.weight.T)
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def _signature(self):
        s = f"{self.in_features} => {self.out_features}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if self.bias is None:
            s += "; bias=false"
        return s
