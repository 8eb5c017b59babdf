"""BatchNorm: normalisation with the batch's statistics in training and the
running ones in testing.

As in Flux, it is active inside ``gradient`` and inactive outside, unless
``trainmode``/``testmode`` pinned it (its ``active`` attribute)."""
import math
import numbers

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..activations import as_activation, identity
from ..arguments import float_dtype, int_arg
from ..devices import as_device
from ..errors import ArgumentError, ShapeError
from ..modes import is_active, moving
from ..show import fname
from ..tensor import Tensor, transfer
from .base import Layer, layer_name
from .fusion import fused_activation
from .inputs import check_input

__all__ = ["BatchNorm"]


class BatchNorm(Layer):
    """Normalise each channel (axis 1) of ``(N, C, ...)`` input:
    ``activation(weight * (x - μ) / sqrt(σ² + eps) + bias)``.

    In training, μ and σ² are the batch's (biased variance) and the running
    statistics move in place: ``running = (1 - momentum) * running + momentum *
    batch`` with the unbiased batch variance, as Flux and PyTorch do (the
    ``batchnorm_running_update`` primitive's math). In testing the running
    statistics are used. ``weight`` is Flux's γ, ``bias`` β,
    ``running_mean`` μ and ``running_var`` σ² (not trained).

    Inside ``gradient`` and ``train`` the running statistics change only when
    the whole step succeeds (``triflux.modes.all_or_nothing``). As torch's, an
    empty batch in training returns an empty output and leaves them alone,
    and a batch with one value per channel (N·H·W = 1) raises ``ShapeError``."""
    _nontrainable = ("running_mean", "running_var")

    def __init__(self, channels, activation=identity, *, eps=1e-5, momentum=0.1, dtype=_dt.float32, device=None):
        channels = int_arg(channels, "BatchNorm", "channels")
        dtype = float_dtype(dtype, "BatchNorm")
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 <= eps < math.inf:
            raise ArgumentError(f"BatchNorm: eps must be a non-negative finite number, got {eps!r}")
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not math.isfinite(momentum):
            # any finite momentum, as torch: outside [0, 1] the running average extrapolates
            raise ArgumentError(f"BatchNorm: momentum must be a finite number (usually in [0, 1]), got {momentum!r}")
        self.weight = Tensor._from_numpy(np.ones(channels, dtype))
        self.bias = Tensor._from_numpy(np.zeros(channels, dtype))
        self.running_mean = Tensor._from_numpy(np.zeros(channels, dtype))
        self.running_var = Tensor._from_numpy(np.ones(channels, dtype))
        self.activation = as_activation(activation, "BatchNorm")
        self.eps, self.momentum = float(eps), float(momentum)
        self.active = None
        if device is not None:
            dev = as_device(device)
            for name in ("weight", "bias", "running_mean", "running_var"):
                setattr(self, name, transfer(getattr(self, name), dev))

    def __call__(self, x):
        x = check_input(self, x, self.weight, axis=1, expected=self.weight.shape[0], what="channels")
        # relu, sigmoid, tanh and identity are applied in the normalisation's own kernels
        fused = fused_activation(self.activation, "batchnorm_train")
        if not is_active(self):
            y = ops.batchnorm(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps,
                              activation=fused or "identity")
        else:
            # the running statistics move in the normalisation's own launches (an empty batch leaves them,
            # as torch); inside a training step into new memory, kept only if the whole step succeeds
            shape = x._data.shape
            values = shape[0] * math.prod(shape[2:])
            if values == 1:
                raise ShapeError(
                    f"{layer_name(self)}: expected more than 1 value per channel when training, got input of "
                    f"shape {x.shape} (one sample{'' if x.ndim == 2 else ' of one pixel'}): the batch's variance "
                    "is undefined. Use a batch of at least 2, or `testmode(model)` to use the running statistics")
            with moving(self.running_mean, self.running_var) as (running, moved):
                y = ops.batchnorm(x, self.weight, self.bias, eps=self.eps, running=running, moved=moved,
                                  momentum=self.momentum, activation=fused or "identity")
        return y if fused else self.activation(y)

    def _signature(self):
        s = f"{self.weight.shape[0]}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        return s
