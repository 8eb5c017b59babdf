"""BatchNorm: normalisation with the batch's statistics in training and the
running ones in testing.

As in Flux, it is active inside ``gradient`` and inactive outside, unless
``trainmode``/``testmode`` pinned it (its ``active`` attribute)."""
import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..activations import identity
from ..devices import as_device
from ..modes import is_active
from ..show import fname
from ..tensor import Tensor, transfer
from .base import Layer
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
    ``running_mean`` μ and ``running_var`` σ² (not trained)."""
    _nontrainable = ("running_mean", "running_var")

    def __init__(self, channels, activation=identity, *, eps=1e-5, momentum=0.1, dtype=_dt.float32, device=None):
        dtype = _dt.as_dtype(dtype)
        self.weight = Tensor._from_numpy(np.ones(channels, dtype))
        self.bias = Tensor._from_numpy(np.zeros(channels, dtype))
        self.running_mean = Tensor._from_numpy(np.zeros(channels, dtype))
        self.running_var = Tensor._from_numpy(np.ones(channels, dtype))
        self.activation = activation
        self.eps, self.momentum = float(eps), float(momentum)
        self.active = None
        if device is not None:
            dev = as_device(device)
            for name in ("weight", "bias", "running_mean", "running_var"):
                setattr(self, name, transfer(getattr(self, name), dev))

    def __call__(self, x):
        x = check_input(self, x, self.weight, axis=1, expected=self.weight.shape[0], what="channels")
        if not is_active(self):
            y = ops.batchnorm(x, self.weight, self.bias, self.running_mean, self.running_var, self.eps)
        else:
            # the running statistics move in place, in the normalisation's own launches (after every
            # allocation: a call that runs out of memory leaves them as they were)
            y = ops.batchnorm(x, self.weight, self.bias, eps=self.eps,
                              running=(self.running_mean, self.running_var), momentum=self.momentum)
        return self.activation(y)

    def _signature(self):
        s = f"{self.weight.shape[0]}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        return s
