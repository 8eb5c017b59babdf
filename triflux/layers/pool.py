"""Pooling and upsampling layers, Flux's names on (N, C, H, W) input: MaxPool,
MeanPool, AdaptiveMaxPool, AdaptiveMeanPool, GlobalMaxPool, GlobalMeanPool
and Upsample, each matching its torch.nn counterpart (MaxPool2d, AvgPool2d,
AdaptiveMaxPool2d, AdaptiveAvgPool2d, Upsample).

Bad options stop at construction and inputs a layer cannot take stop at the
call, with a ShapeError that names the layer and says what to change.
"""
import numbers

from .. import ops
from ..arguments import flag_arg, is_int, not_real, is_real, pad_arg, pair_arg
from ..errors import ShapeError
from ..specs.pool import pool2d_spec
from ..specs.upsample import upsample2d_spec
from ..tensor import as_tensor
from .base import Layer, layer_name
from .conv import pad_str

__all__ = ["MaxPool", "MeanPool", "AdaptiveMaxPool", "AdaptiveMeanPool", "GlobalMeanPool", "GlobalMaxPool", "Upsample"]


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _real(layer, x):
    """``x`` as a Tensor of real numbers, or a DTypeError naming the layer."""
    x = as_tensor(x)
    if not is_real(x.dtype):
        raise not_real(x.dtype, layer_name(layer))
    return x


def _four_d(layer, x):
    x = _real(layer, x)
    if x.ndim != 4:
        raise ShapeError(f"{layer_name(layer)} expects a 4-d (N, C, H, W) input, got shape {x.shape}")
    return x


def _side(v):
    """A pair of equal sides prints as one number (Flux's printing)."""
    return str(v[0]) if isinstance(v, tuple) and len(set(v)) == 1 else str(v)


def _geometry_error(layer, e, x):
    return ShapeError(f"{layer_name(layer)} cannot pool an input of shape {x.shape}: {e}")


class _WindowPool(Layer):
    """What MaxPool and MeanPool share: the window, stride and padding options."""

    def __init__(self, name, window, stride, pad, ceil_mode):
        self.window = pair_arg(window, name, "the window")
        self.stride = self.window if stride is None else pair_arg(stride, name, "stride")
        self.pad = pad_arg(pad, name)
        self.ceil_mode = flag_arg(ceil_mode, name, "ceil_mode")

    def _check_pad(self, name, extent):
        t, b, l, r = self.pad
        if max(t, b) >= extent[0] or max(l, r) >= extent[1]:
            raise ShapeError(f"{name}: pad={pad_str(self.pad)} must be smaller than the window {extent} along "
                             "each axis (a window of padding only has no value); use a smaller pad")

    def _options(self, *extra):
        s = _side(self.window)
        s = f"({s}, {s})" if "," not in s else s
        for name, v, default in (("pad", pad_str(self.pad), "0"), ("stride", self.stride, self.window)) + extra:
            if v != default:
                s += f", {name}={_side(v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else v}"
        return s


class MaxPool(_WindowPool):
    """The maximum over each ``window`` of (N, C, H, W) input (torch's
    ``MaxPool2d``, Flux's ``MaxPool``): ``window`` a positive int or (kh,
    kw); ``stride`` (the window by default); ``pad`` (an int, (h, w), (top,
    bottom, left, right) or "valid"; padding never wins, and each side is
    smaller than the window); ``dilation`` (taps ``dilation`` apart) and
    ``ceil_mode`` (a last, partial window where the input does not fill one,
    when it starts inside the input or its top/left padding). NaN propagates::

        MaxPool(2)(tf.ones(1, 3, 32, 32)).shape     # (1, 3, 16, 16)

    Math: reference/pool.py ``maxpool2d_forward``; output size and windows:
    triflux/specs/pool.py.
    """

    def __init__(self, window, *, stride=None, pad=0, dilation=1, ceil_mode=False):
        super().__init__("MaxPool", window, stride, pad, ceil_mode)
        self.dilation = pair_arg(dilation, "MaxPool", "dilation")
        extent = tuple(d * (k - 1) + 1 for k, d in zip(self.window, self.dilation))
        self._check_pad("MaxPool", extent)

    def __call__(self, x):
        x = _four_d(self, x)
        try:
            pool2d_spec("maxpool2d", x.shape, x.dtype, self.window, self.stride, self.pad, self.dilation,
                        self.ceil_mode)
        except ShapeError as e:
            raise _geometry_error(self, e, x) from None
        return ops.maxpool2d(x, self.window, self.stride, self.pad, self.dilation, self.ceil_mode)

    def _signature(self):
        return self._options(("dilation", self.dilation, (1, 1)), ("ceil_mode", self.ceil_mode, False))


class MeanPool(_WindowPool):
    """The mean over each ``window`` of (N, C, H, W) input (torch's
    ``AvgPool2d``, Flux's ``MeanPool``): ``window``, ``stride``, ``pad`` and
    ``ceil_mode`` as for MaxPool; ``count_include_pad`` divides by the
    window's taps inside the padded input (True, padding counts as zeros) or
    inside the input only (False)::

        MeanPool(2, stride=1)(tf.ones(1, 3, 4, 4)).shape     # (1, 3, 3, 3)

    Math: reference/pool.py ``meanpool2d_forward``; windows: triflux/specs/pool.py.
    """

    def __init__(self, window, *, stride=None, pad=0, ceil_mode=False, count_include_pad=True):
        super().__init__("MeanPool", window, stride, pad, ceil_mode)
        self.count_include_pad = flag_arg(count_include_pad, "MeanPool", "count_include_pad")
        self._check_pad("MeanPool", self.window)

    def __call__(self, x):
        x = _four_d(self, x)
        try:
            pool2d_spec("meanpool2d", x.shape, x.dtype, self.window, self.stride, self.pad, (1, 1), self.ceil_mode)
        except ShapeError as e:
            raise _geometry_error(self, e, x) from None
        return ops.meanpool2d(x, self.window, self.stride, self.pad, self.ceil_mode, self.count_include_pad)

    def _signature(self):
        return self._options(("ceil_mode", self.ceil_mode, False),
                             ("count_include_pad", self.count_include_pad, True))


class _AdaptivePool(Layer):
    def __init__(self, out):
        name = type(self).__name__
        sides = (out, out) if out is None or not isinstance(out, (tuple, list)) else tuple(out)
        if len(sides) != 2 or not all(s is None or is_int(s) and s >= 1 for s in sides):
            raise ShapeError(f"{name}: the output size must be a positive int or two of them (None keeps the "
                             f"input's side), got {out!r}")
        self.out = tuple(None if s is None else int(s) for s in sides)

    def _signature(self):
        return str(self.out)


class AdaptiveMaxPool(_AdaptivePool):
    """The maximum over windows that tile the input into ``out`` = (Ho, Wo)
    outputs whatever its size (torch's ``AdaptiveMaxPool2d``: window i along H
    covers floor(i*H/Ho) <= h < ceil((i+1)*H/Ho)); a ``None`` side keeps the
    input's: ``AdaptiveMaxPool((7, 7))(x)`` is (N, C, 7, 7) for any H, W.
    Math: reference/pool.py ``adaptive_maxpool2d_forward``."""

    def __call__(self, x):
        return ops.adaptive_maxpool2d(_four_d(self, x), self.out)


class AdaptiveMeanPool(_AdaptivePool):
    """The mean over the windows of AdaptiveMaxPool (torch's ``AdaptiveAvgPool2d``):
    ``AdaptiveMeanPool(1)`` is GlobalMeanPool. Math: reference/pool.py
    ``adaptive_meanpool2d_forward``."""

    def __call__(self, x):
        return ops.adaptive_meanpool2d(_four_d(self, x), self.out)


def _spatial(layer, x):
    x = _real(layer, x)
    if x.ndim < 3:
        raise ShapeError(f"{layer_name(layer)} expects (N, C, spatial...) input, got shape {x.shape}")
    if 0 in x.shape[2:]:
        raise ShapeError(f"{layer_name(layer)} cannot pool an input with no spatial positions, shape {x.shape}: "
                         "every (sample, channel) needs at least one value")
    return x


class GlobalMeanPool(Layer):
    """The mean over every spatial axis: ``(N, C, H, W) -> (N, C, 1, 1)``
    (Flux's ``(W, H, C, N) -> (1, 1, C, N)``, the same memory order), any
    number of spatial axes, each non-empty; ``Chain(GlobalMeanPool(),
    flatten)`` gives (N, C) features. Math: reference/reduce.py ``mean_forward``."""

    def __call__(self, x):
        x = _spatial(self, x)
        return ops.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


class GlobalMaxPool(Layer):
    """The maximum over every spatial axis: ``(N, C, H, W) -> (N, C, 1, 1)``
    (any number of spatial axes); the gradient goes to one maximal element
    (the first, or the last NaN), as a MaxPool with the whole input as its window.
    Math: reference/pool.py ``adaptive_maxpool2d_forward``."""

    def __call__(self, x):
        x = _spatial(self, x)
        flat = x if x.ndim == 4 else ops.reshape(x, x.shape[:2] + (-1, 1))
        y = ops.adaptive_maxpool2d(flat, (1, 1))
        return y if x.ndim == 4 else ops.reshape(y, x.shape[:2] + (1,) * (x.ndim - 2))


_MODES = ("nearest", "bilinear")


class Upsample(Layer):
    """Upsampling by interpolation, torch's ``nn.Upsample`` (Flux's
    ``Upsample(:bilinear; scale=2)``): ``Upsample(mode, scale=None,
    size=None, align_corners=False)`` with exactly one of ``scale`` (a
    positive number or one per axis, ints or floats; the output is
    floor(H * scale) by floor(W * scale); 2 when neither is given) and
    ``size`` (the output's (H, W)).
    ``mode`` is "nearest" or "bilinear"; ``align_corners`` (bilinear only)
    maps the corner pixels of input and output onto each other.

    A first positional string is the mode, a number the scale, so
    ``Upsample("bilinear", scale=2)``, ``Upsample(2)`` and
    ``Upsample(2, mode="bilinear")`` all work::

        Upsample("bilinear", scale=2)(tf.ones(1, 3, 8, 8)).shape    # (1, 3, 16, 16)

    Math: reference/upsample.py ``upsample_nearest2d_forward`` and
    ``upsample_bilinear2d_forward``; output size: triflux/specs/upsample.py."""

    def __init__(self, *args, mode=None, scale=None, size=None, align_corners=False):
        modes = [a for a in args if isinstance(a, str)]
        scales = [a for a in args if not isinstance(a, str)]
        if len(args) > 2 or len(modes) > 1 or len(scales) > 1 or (modes and mode is not None) \
                or (scales and scale is not None):
            raise ShapeError(f"Upsample: the positional arguments are the mode (a string) and, in the older order "
                             f"Upsample(scale, mode), the scale; got {args!r} with mode={mode!r}, scale={scale!r}. "
                             "Write Upsample('bilinear', scale=2) or Upsample('nearest', size=(64, 64))")
        mode = modes[0] if modes else mode if mode is not None else "nearest"
        scale = scales[0] if scales else scale
        mode = mode[1:] if isinstance(mode, str) and mode.startswith(":") else mode          # Flux's :bilinear
        if mode not in _MODES:
            raise ShapeError(f"Upsample: mode must be 'nearest' or 'bilinear', got {mode!r}")
        if scale is not None and size is not None:
            raise ShapeError(f"Upsample: give scale or size, not both (got scale={scale!r}, size={size!r}); "
                             f"e.g. Upsample('{mode}', scale=2) or Upsample('{mode}', size=(64, 64))")
        if scale is None and size is None:
            scale = 2                              # API.md's Upsample(scale=2, mode="nearest")
        align_corners = flag_arg(align_corners, "Upsample", "align_corners")
        if align_corners and mode != "bilinear":
            raise ShapeError("Upsample: align_corners applies to the bilinear mode only; use "
                             "Upsample('bilinear', ..., align_corners=True) or drop align_corners")
        self.mode = mode
        self.scale = None if scale is None else _scales(scale)
        self.size = None if size is None else pair_arg(size, "Upsample", "size")
        self.align_corners = align_corners

    def __call__(self, x):
        x = _four_d(self, x)
        try:
            upsample2d_spec(f"upsample_{self.mode}2d", x.shape, x.dtype, self.size, self.scale, self.align_corners)
        except ShapeError as e:
            raise ShapeError(f"{layer_name(self)} cannot resize an input of shape {x.shape}: {e}; use a larger "
                             "scale, or size=(H, W)") from None
        return ops.upsample(x, self.scale, self.mode, size=self.size, align_corners=self.align_corners)

    def _signature(self):
        s = f":{self.mode}"
        if self.scale is not None:
            s += f", scale={_side(self.scale)}"
        if self.size is not None:
            s += f", size={self.size}"
        if self.align_corners:
            s += ", align_corners=true"
        return s


def _scales(scale):
    vals = (scale, scale) if _is_number(scale) else tuple(scale) if isinstance(scale, (tuple, list)) else ()
    if len(vals) != 2 or not all(_is_number(v) and 0 < float(v) < float("inf") for v in vals):
        raise ShapeError(f"Upsample: scale must be a positive number or two of them (one per axis), got {scale!r}")
    return tuple(int(v) if float(v).is_integer() else float(v) for v in vals)
