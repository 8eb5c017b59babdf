"""Making a layer's input fit it: a Tensor on the parameters' device, of
their dtype, with the expected size on the expected axis; errors name the
layer, what it expected and what it got."""
import warnings

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..errors import DeviceMismatchError, ShapeError
from ..tensor import Tensor, as_tensor
from .base import layer_name

#: layer types that already warned about float64 input (once per type, as Flux)
_WARNED_F64 = set()


def _device_expr(dev):
    """Code that names ``dev`` as a function moving data there."""
    if dev.is_cpu:
        return "cpu"
    return f"{type(dev).__name__}({dev.idx})" if dev.idx is not None else type(dev).__name__ + "()"


def check_input(layer, x, like, *, axis=-1, expected=None, what="features"):
    """Make ``x`` fit ``layer``: a Tensor on the parameters' device, of their
    dtype (float64 converted with one warning per layer type, as Flux does),
    with ``expected`` entries on ``axis``. Errors name the layer, what was
    expected and what was received."""
    if not isinstance(x, Tensor):
        x = as_tensor(np.asarray(x))
    if x._device is not like._device and x._device != like._device:
        raise DeviceMismatchError(
            f"{layer_name(layer)}: its parameters are on {like._device!r} but the input is on {x._device!r}. "
            f"Put both on one device: `x = {_device_expr(like._device)}(x)` (the input to the model's device) "
            f"or `model = {_device_expr(x._device)}(model)` (the model to the input's device).")
    if x.dtype != like.dtype:
        if x.dtype == _dt.float64 and like.dtype == _dt.float32:
            key = type(layer).__name__
            if key not in _WARNED_F64:
                _WARNED_F64.add(key)
                warnings.warn(
                    f"{layer_name(layer)} has float32 parameters but received float64 input; converting the input to "
                    "float32 (slow, and may hide a mistake). Convert data once with `f32(x)`, or the model "
                    "with `f64(model)` if you want float64.", stacklevel=3)
        x = ops.cast(x, like.dtype)
    if expected is not None:
        if x.ndim == 0 or x.shape[axis] != expected:
            raise ShapeError(f"{layer_name(layer)} expects {expected} {what} on axis {axis % max(x.ndim, 1) if x.ndim else axis} "
                             f"of its input, but got an input of shape {x.shape}")
    return x
