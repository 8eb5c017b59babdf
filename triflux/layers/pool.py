"""Pooling and resampling layers of any spatial rank, Flux's names on
``(N, C, *spatial)`` input: MaxPool, MeanPool, AdaptiveMaxPool,
AdaptiveMeanPool, GlobalMaxPool, GlobalMeanPool, Upsample and PixelShuffle,
each matching its torch.nn counterparts (MaxPool1d/2d/3d, AvgPool1d/2d/3d,
AdaptiveMaxPool1d/2d/3d, AdaptiveAvgPool1d/2d/3d, Upsample, PixelShuffle).
A window or output-size tuple's length sets the spatial rank, as in Flux
(``MaxPool((2,))`` pools sequences, ``MaxPool((2, 2, 2))`` volumes); an int
is 2-D.

Bad options stop at construction and inputs a layer cannot take stop at the
call, with a ShapeError that names the layer and says what to change.
"""
import numbers

from .. import ops
from ..arguments import flag_arg, int_arg, is_int, is_real, not_real, ntuple_arg, spatial_pad_arg
from ..errors import ShapeError
from ..operands import floating
from ..spatial import UPSAMPLE_MODES, run_pool
from ..specs.pool import pool_spec
from ..specs.upsample import upsample_spec
from ..tensor import as_tensor
from .base import Layer, layer_name
from .conv import sides_str, kernel_rank, pad_str, spatial_input

__all__ = ["MaxPool", "MeanPool", "AdaptiveMaxPool", "AdaptiveMeanPool", "GlobalMeanPool", "GlobalMaxPool",
           "Upsample", "PixelShuffle"]


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _real(layer, x):
    """``x`` as a Tensor of real numbers, or a DTypeError naming the layer."""
    x = as_tensor(x)
    if not is_real(x.dtype):
        raise not_real(x.dtype, layer_name(layer))
    return x


def _geometry_error(layer, e, x):
    return ShapeError(f"{layer_name(layer)} cannot pool an input of shape {x.shape}: {e}")


class _WindowPool(Layer):
    """What MaxPool and MeanPool share: the window, stride and padding options."""

    def __init__(self, name, window, stride, pad, ceil_mode):
        rank = kernel_rank(window, name)
        self.window = ntuple_arg(window, rank, name, "the window")
        self.stride = self.window if stride is None else ntuple_arg(stride, rank, name, "stride")
        self.pad = spatial_pad_arg(pad, rank, name)
        self.ceil_mode = flag_arg(ceil_mode, name, "ceil_mode")

    def _check_pad(self, name, extent):
        """torch's rule, per side: at most half the window's extent (a window
        of padding only has no value, and torch refuses more)."""
        if any(max(self.pad[2 * k], self.pad[2 * k + 1]) > e // 2 for k, e in enumerate(extent)):
            raise ShapeError(f"{name}: pad={pad_str(self.pad)} must be smaller than the window {extent} along "
                             f"each axis, at most half of it ({tuple(e // 2 for e in extent)}, torch's rule: a "
                             "window of padding only has no value); use a smaller pad")

    def _input(self, x):
        return spatial_input(self, _real(self, x), len(self.window))

    def _options(self, *extra):
        s = sides_str(self.window)
        s = str(self.window) if "," not in s else s
        for name, v, default in (("pad", pad_str(self.pad), "0"), ("stride", self.stride, self.window)) + extra:
            if v != default:
                s += f", {name}={sides_str(v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else v}"
        return s


class MaxPool(_WindowPool):
    """The maximum over each ``window`` of (N, C, *spatial) input (torch's
    ``MaxPool1d/2d/3d``, Flux's ``MaxPool``): ``window`` a positive int (2-D)
    or one per spatial axis (its length sets the rank); ``stride`` (the window
    by default); ``pad`` (an int, one per axis, (lo, hi) per axis or "valid";
    padding never wins, and each side is smaller than the window); ``dilation``
    (taps ``dilation`` apart) and ``ceil_mode`` (a last, partial window where
    the input does not fill one, when it starts inside the input or its low
    padding). NaN propagates::

        MaxPool(2)(tf.ones(1, 3, 32, 32)).shape               # (1, 3, 16, 16)
        MaxPool((2, 2, 2))(tf.ones(1, 3, 8, 8, 8)).shape      # (1, 3, 4, 4, 4)

    Math: reference/pool.py ``maxpool_forward``; output size and windows:
    triflux/specs/pool.py.
    """

    def __init__(self, window, *, stride=None, pad=0, dilation=1, ceil_mode=False):
        super().__init__("MaxPool", window, stride, pad, ceil_mode)
        self.dilation = ntuple_arg(dilation, len(self.window), "MaxPool", "dilation")
        extent = tuple(d * (k - 1) + 1 for k, d in zip(self.window, self.dilation))
        self._check_pad("MaxPool", extent)

    def __call__(self, x):
        x = self._input(x)
        attrs = {"window": self.window, "stride": self.stride, "padding": self.pad, "dilation": self.dilation,
                 "ceil_mode": self.ceil_mode}
        try:
            pool_spec("maxpool", x._data.shape, x.dtype, **attrs)     # the windows, checked once
        except ShapeError as e:
            raise _geometry_error(self, e, x) from None
        return run_pool("maxpool", floating(x, "maxpool"), attrs, "maxpool")

    def _signature(self):
        return self._options(("dilation", self.dilation, (1,) * len(self.window)), ("ceil_mode", self.ceil_mode, False))


class MeanPool(_WindowPool):
    """The mean over each ``window`` of (N, C, *spatial) input (torch's
    ``AvgPool1d/2d/3d``, Flux's ``MeanPool``): ``window``, ``stride``, ``pad``
    and ``ceil_mode`` as for MaxPool; ``count_include_pad`` divides by the
    window's taps inside the padded input (True, padding counts as zeros) or
    inside the input only (False)::

        MeanPool(2, stride=1)(tf.ones(1, 3, 4, 4)).shape     # (1, 3, 3, 3)

    Math: reference/pool.py ``meanpool_forward``; windows: triflux/specs/pool.py.
    """

    def __init__(self, window, *, stride=None, pad=0, ceil_mode=False, count_include_pad=True):
        super().__init__("MeanPool", window, stride, pad, ceil_mode)
        self.count_include_pad = flag_arg(count_include_pad, "MeanPool", "count_include_pad")
        self._check_pad("MeanPool", self.window)

    def __call__(self, x):
        x = self._input(x)
        attrs = {"window": self.window, "stride": self.stride, "padding": self.pad, "ceil_mode": self.ceil_mode}
        try:
            pool_spec("meanpool", x._data.shape, x.dtype, **attrs)     # the windows, checked once
        except ShapeError as e:
            raise _geometry_error(self, e, x) from None
        attrs["count_include_pad"] = self.count_include_pad
        return run_pool("meanpool", floating(x, "meanpool"), attrs, "meanpool")

    def _signature(self):
        return self._options(("ceil_mode", self.ceil_mode, False),
                             ("count_include_pad", self.count_include_pad, True))


class _AdaptivePool(Layer):
    def __init__(self, out):
        name = type(self).__name__
        rank = kernel_rank(out, name)
        sides = (out,) * rank if out is None or not isinstance(out, (tuple, list)) else tuple(out)
        if not all(s is None or is_int(s) and s >= 1 for s in sides):
            raise ShapeError(f"{name}: the output size must be a positive int or one per spatial axis (None keeps "
                             f"the input's side), got {out!r}")
        self.out = tuple(None if s is None else int(s) for s in sides)

    def _input(self, x):
        return spatial_input(self, _real(self, x), len(self.out))

    def _signature(self):
        return str(self.out)


class AdaptiveMaxPool(_AdaptivePool):
    """The maximum over windows that tile the input into ``out`` outputs per
    spatial axis whatever its size (torch's ``AdaptiveMaxPool1d/2d/3d``: window
    i along an axis of n covers floor(i*n/m) <= h < ceil((i+1)*n/m)); ``out``
    an int (2-D) or one per axis (its length sets the rank), a ``None`` side
    keeping the input's: ``AdaptiveMaxPool((7, 7))(x)`` is (N, C, 7, 7) for
    any H, W. Math: reference/pool.py ``adaptive_maxpool_forward``."""

    def __call__(self, x):
        return ops.adaptive_maxpool(self._input(x), self.out)


class AdaptiveMeanPool(_AdaptivePool):
    """The mean over the windows of AdaptiveMaxPool (torch's
    ``AdaptiveAvgPool1d/2d/3d``): ``AdaptiveMeanPool(1)`` is GlobalMeanPool of
    images. Math: reference/pool.py ``adaptive_meanpool_forward``."""

    def __call__(self, x):
        return ops.adaptive_meanpool(self._input(x), self.out)


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
    """The maximum over every spatial axis: ``(N, C, *spatial) -> (N, C, 1,
    ..., 1)`` (any number of spatial axes); the gradient goes to one maximal
    element (the first, or the last NaN), as a MaxPool with the whole input
    as its window. Math: reference/pool.py ``adaptive_maxpool_forward``."""

    def __call__(self, x):
        x = _spatial(self, x)
        if x.ndim <= 5:
            return ops.adaptive_maxpool(x, (1,) * (x.ndim - 2))
        y = ops.adaptive_maxpool(ops.reshape(x, x.shape[:2] + (-1,)), (1,))
        return ops.reshape(y, x.shape[:2] + (1,) * (x.ndim - 2))


class Upsample(Layer):
    """Upsampling by interpolation, torch's ``nn.Upsample`` (Flux's
    ``Upsample(:bilinear; scale=2)``): ``Upsample(mode, scale=None,
    size=None, align_corners=False)`` with exactly one of ``scale`` (a
    positive number or one per spatial axis, ints or floats; each output side
    is floor(side * scale); 2 when neither is given) and ``size`` (the
    output's spatial sides). ``mode``: "nearest" (any spatial rank: a single
    scale applies to every axis of the input), "linear" (N, C, L), "bilinear"
    (N, C, H, W) or "trilinear" (N, C, D, H, W); ``align_corners`` (the linear
    modes) maps the corner elements of input and output onto each other.

    A first positional string is the mode, a number the scale, so
    ``Upsample("bilinear", scale=2)``, ``Upsample(2)`` and
    ``Upsample(2, mode="bilinear")`` all work::

        Upsample("bilinear", scale=2)(tf.ones(1, 3, 8, 8)).shape         # (1, 3, 16, 16)
        Upsample("trilinear", scale=2)(tf.ones(1, 3, 4, 8, 8)).shape     # (1, 3, 8, 16, 16)

    Math: reference/upsample.py ``upsample_nearest_forward`` and
    ``upsample_linear_forward``; output size: triflux/specs/upsample.py."""

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
        if mode not in UPSAMPLE_MODES:
            raise ShapeError(f"Upsample: mode must be one of {tuple(UPSAMPLE_MODES)}, got {mode!r}")
        if scale is not None and size is not None:
            raise ShapeError(f"Upsample: give scale or size, not both (got scale={scale!r}, size={size!r}); "
                             f"e.g. Upsample('{mode}', scale=2) or Upsample('{mode}', size=(64, 64))")
        if scale is None and size is None:
            scale = 2                              # API.md's Upsample(scale=2, mode="nearest")
        align_corners = flag_arg(align_corners, "Upsample", "align_corners")
        if align_corners and mode == "nearest":
            raise ShapeError("Upsample: align_corners applies to the linear modes only (linear, bilinear, "
                             "trilinear); use Upsample('bilinear', ..., align_corners=True) or drop align_corners")
        self.mode = mode
        rank = UPSAMPLE_MODES[mode]
        self.scale = None if scale is None else _scales(scale, rank)
        self.size = None if size is None else _sizes(size, rank)
        if rank is not None:
            for v in (self.scale, self.size):
                if isinstance(v, tuple) and len(v) != rank:
                    raise ShapeError(f"Upsample: mode {mode!r} resizes {rank} spatial ax{'is' if rank == 1 else 'es'}, "
                                     f"got {v!r} of {len(v)} entries")
        self.align_corners = align_corners

    def _rank(self):
        """The spatial rank the layer takes, or None (nearest with one scale: any)."""
        rank = UPSAMPLE_MODES[self.mode]
        for v in (self.scale, self.size):
            if isinstance(v, tuple):
                return len(v)
        return rank

    def __call__(self, x):
        x = _real(self, x)
        rank = self._rank()
        x = spatial_input(self, x, rank if rank is not None else max(1, min(3, x.ndim - 2)))
        rank = x.ndim - 2
        scale = None if self.scale is None else self.scale if isinstance(self.scale, tuple) else (self.scale,) * rank
        attrs = dict(size=self.size, scale=scale)
        name = "upsample_nearest" if self.mode == "nearest" else "upsample_linear"
        if name == "upsample_linear":
            attrs["align_corners"] = self.align_corners
        try:
            upsample_spec(name, x.shape, x.dtype, **attrs)
        except ShapeError as e:
            raise ShapeError(f"{layer_name(self)} cannot resize an input of shape {x.shape}: {e}; use a larger "
                             "scale, or size=(...)") from None
        return ops.upsample(x, scale, self.mode, size=self.size, align_corners=self.align_corners)

    def _signature(self):
        s = f":{self.mode}"
        if self.scale is not None:
            s += f", scale={sides_str(self.scale)}"
        if self.size is not None:
            s += f", size={self.size}"
        if self.align_corners:
            s += ", align_corners=true"
        return s


def _scales(scale, rank):
    """One scale per axis of the mode's ``rank``, ints where integral; for
    nearest (``rank`` None) one number stays one, applying to every spatial
    axis of the input."""
    if _is_number(scale) and 0 < float(scale) < float("inf"):
        one = int(scale) if float(scale).is_integer() else float(scale)
        return one if rank is None else (one,) * rank
    vals = tuple(scale) if isinstance(scale, (tuple, list)) else ()
    if not 1 <= len(vals) <= 3 or not all(_is_number(v) and 0 < float(v) < float("inf") for v in vals):
        raise ShapeError(f"Upsample: scale must be a positive number or one per spatial axis, got {scale!r}")
    return tuple(int(v) if float(v).is_integer() else float(v) for v in vals)


def _sizes(size, rank):
    """The output size: one positive int per spatial axis (an int: 2-D, or the mode's rank)."""
    if is_int(size):
        return ntuple_arg(size, rank or 2, "Upsample", "size")
    vals = tuple(size) if isinstance(size, (tuple, list)) else ()
    if not 1 <= len(vals) <= 3:
        raise ShapeError(f"Upsample: size must be a positive int or one per spatial axis, got {size!r}")
    return ntuple_arg(vals, len(vals), "Upsample", "size")


class PixelShuffle(Layer):
    """Flux's ``PixelShuffle(r)`` (torch's ``nn.PixelShuffle``): (N, C*r^R,
    *spatial) to (N, C, *(spatial*r)), each group of r^R channels spread
    over an r-by-...-by-r block, for any spatial rank R of the input (the
    last step of a sub-pixel convolution)::

        PixelShuffle(2)(tf.ones(1, 12, 8, 8)).shape     # (1, 3, 16, 16)

    Math: reference/upsample.py ``pixel_shuffle_forward``."""

    def __init__(self, r):
        self.r = int_arg(r, "PixelShuffle", "r")

    def __call__(self, x):
        x = _real(self, x)
        if not 3 <= x.ndim <= 5:
            raise ShapeError(f"{layer_name(self)} expects (N, C, L), (N, C, H, W) or (N, C, D, H, W) input, got "
                             f"shape {x.shape}")
        try:
            return ops.pixel_shuffle(x, self.r)
        except ShapeError as e:
            raise ShapeError(f"{layer_name(self)} cannot shuffle an input of shape {x.shape}: {e}") from None

    def _signature(self):
        return str(self.r)
