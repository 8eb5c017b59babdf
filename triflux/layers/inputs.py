"""Making a layer's input fit it: a Tensor of real numbers on the
parameters' device, of their dtype, with the expected size on the expected
axis; errors name the layer, what it expected and what it got (and, for an
input in Flux's layout, the transpose that fixes it)."""
import warnings

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..arguments import flux_layout_hint, is_real, not_real
from ..devices import move_code
from ..errors import DeviceMismatchError, ShapeError
from ..tensor import Tensor, as_tensor
from .base import layer_name

#: layer types that already warned about float64 input (once per type, as Flux)
_WARNED_F64 = set()


def check_input(layer, x, like, *, axis=-1, expected=None, what="features"):
    """Make ``x`` fit ``layer``: a Tensor on the parameters' device, of their
    dtype (float64 converted with one warning per layer type, as Flux does;
    ints and bools converted; complex numbers, strings and objects refused
    with a DTypeError), with ``expected`` entries on ``axis``. Errors name the
    layer, what was expected and what was received."""
    if not isinstance(x, Tensor):
        x = as_tensor(np.asarray(x))
    data = x._data
    if x._device is like._device and data.dtype is like._data.dtype and expected is not None and data.ndim \
            and data.shape[axis] == expected:
        return x                  # the usual call: the parameters' device and dtype, the expected size
    same_device = x._device is like._device or x._device == like._device
    same_dtype = x.dtype == like.dtype
    if not (same_device and same_dtype) and not is_real(x.dtype):
        raise not_real(x.dtype, layer_name(layer))
    if not same_device:
        raise DeviceMismatchError(
            f"{layer_name(layer)}: its parameters are on {like._device!r} but the input is on {x._device!r}. "
            f"Put both on one device: `x = {move_code(like._device)}` (the input to the model's device) "
            f"or `model = {move_code(x._device, 'model')}` (the model to the input's device).")
    if not same_dtype:
        if x.dtype == _dt.float64 and like.dtype == _dt.float32:
            key = type(layer).__name__
            if key not in _WARNED_F64:
                _WARNED_F64.add(key)
                warnings.warn(
                    f"{layer_name(layer)} has float32 parameters but received float64 input; converting the input to "
                    "float32 at every call (slow, and may hide a mistake). `gpu(x)` converts float64 to float32 as "
                    "it moves data; a device object (`device(x)`) keeps float64: convert once with `f32(x)`, or "
                    "the model with `f64(model)` if you want float64.", stacklevel=3)
        x = ops.cast(x, like.dtype)
    if expected is not None:
        if x.ndim == 0 or x.shape[axis] != expected:
            raise ShapeError(f"{layer_name(layer)} expects {expected} {what} on axis {axis % max(x.ndim, 1) if x.ndim else axis} "
                             f"of its input, but got an input of shape {x.shape}."
                             f"{flux_layout_hint(x.shape, axis, expected)}")
    return x
