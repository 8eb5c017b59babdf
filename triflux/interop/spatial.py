"""The spatial layers' conversions, in 1 to 3 spatial axes (torch's classes
are rank-specific, triflux's are not): convolutions and their transposes,
max, mean and adaptive pools (global pools as the adaptive ones of size 1),
upsampling and pixel shuffle. torch pads symmetrically, so an asymmetric
``pad`` is refused on the way to torch."""
from triflux.layers import (Conv, ConvTranspose, GlobalMaxPool, GlobalMeanPool, MaxPool, MeanPool, PixelShuffle,
                            Upsample)
from triflux.layers.conv import same_padding
from .activations import with_activation
from .conversion import feeding_rank, refuse_from, refuse_to
from .parameters import set_params, torch_array, torch_device_of, torch_dtype_of, torch_tensor_copy
from .torch_modules import import_torch


# Conv1d/2d/3d <-> Conv (CrossCor, DepthwiseConv), ConvTranspose1d/2d/3d <-> ConvTranspose

#: the spatial ranks of torch's rank-specific modules ("Conv1d", "MaxPool3d", ...)
RANKS = (1, 2, 3)


def _rank_of(m):
    """The spatial rank of torch module ``m`` of a rank-specific class (``Conv3d``: 3)."""
    return int(type(m).__name__[-2])


def _ntuple(v, rank):
    """A torch module's int-or-tuple option as ``rank`` entries."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * rank


def _symmetric(pad):
    """One padding per axis where a flat (lo, hi, ...) padding is symmetric, else None."""
    lo, hi = pad[::2], pad[1::2]
    return tuple(lo) if lo == hi else None


def conv_from_torch(m, path, options):
    rank = _rank_of(m)
    pad = {"same": "same", "valid": 0}[m.padding] if isinstance(m.padding, str) else _ntuple(m.padding, rank)
    w = torch_array(m.weight)
    layer = Conv(_ntuple(m.kernel_size, rank), m.in_channels, m.out_channels, stride=_ntuple(m.stride, rank),
                 pad=pad, dilation=_ntuple(m.dilation, rank), groups=m.groups, bias=m.bias is not None,
                 init=lambda *s: w, dtype=w.dtype, pad_mode=m.padding_mode)
    if m.bias is not None:
        layer.bias = torch_tensor_copy(m.bias)
    return layer


def conv_to_torch(x, path):
    w = x.weight
    rank, kernel = w.ndim - 2, tuple(w.shape[2:])
    padding = _symmetric(x.pad)
    if padding is None:
        if all(s == 1 for s in x.stride) and x.pad == same_padding(kernel, x.dilation):
            padding = "same"
        else:
            refuse_to(path, f"{type(x).__name__} with asymmetric pad={x.pad}",
                      f"torch's Conv{rank}d pads symmetrically (or 'same')")
    mod = getattr(import_torch().nn, f"Conv{rank}d")(w.shape[1] * x.groups, w.shape[0], kernel, stride=x.stride,
                                                     padding=padding, dilation=x.dilation, groups=x.groups,
                                                     bias=x.bias is not None, padding_mode=x.pad_mode,
                                                     dtype=torch_dtype_of(w), device=torch_device_of(w))
    return with_activation(set_params(mod, weight=w, bias=x.bias), x, path)


def conv_transpose_from_torch(m, path, options):
    rank = _rank_of(m)
    if m.padding_mode != "zeros":
        refuse_from(path, m, f"padding_mode={m.padding_mode!r}", f"ConvTranspose{rank}d only has 'zeros'")
    w = torch_array(m.weight)
    layer = ConvTranspose(_ntuple(m.kernel_size, rank), m.in_channels, m.out_channels,
                          stride=_ntuple(m.stride, rank), pad=_ntuple(m.padding, rank),
                          outpad=_ntuple(m.output_padding, rank), dilation=_ntuple(m.dilation, rank),
                          groups=m.groups, bias=m.bias is not None, init=lambda *s: w, dtype=w.dtype)
    if m.bias is not None:
        layer.bias = torch_tensor_copy(m.bias)
    return layer


def conv_transpose_to_torch(x, path):
    w = x.weight
    rank = w.ndim - 2
    padding = _symmetric(x.pad)
    if padding is None:
        refuse_to(path, f"ConvTranspose with asymmetric pad={x.pad}",
                  f"torch's ConvTranspose{rank}d pads symmetrically")
    mod = getattr(import_torch().nn, f"ConvTranspose{rank}d")(
        w.shape[0], w.shape[1] * x.groups, tuple(w.shape[2:]), stride=x.stride, padding=padding,
        output_padding=x.outpad, groups=x.groups, bias=x.bias is not None, dilation=x.dilation,
        dtype=torch_dtype_of(w), device=torch_device_of(w))
    return with_activation(set_params(mod, weight=w, bias=x.bias), x, path)


# MaxPool1d/2d/3d <-> MaxPool, AvgPool1d/2d/3d <-> MeanPool

def maxpool_from_torch(m, path, options):
    if m.return_indices:
        refuse_from(path, m, "return_indices=True")
    rank = _rank_of(m)
    window = _ntuple(m.kernel_size, rank)
    return MaxPool(window, stride=_ntuple(m.stride, rank) if m.stride is not None else window,
                   pad=_ntuple(m.padding, rank), dilation=_ntuple(m.dilation, rank), ceil_mode=m.ceil_mode)


def meanpool_from_torch(m, path, options):
    if getattr(m, "divisor_override", None) is not None:
        refuse_from(path, m, f"divisor_override={m.divisor_override}",
                    "MeanPool divides by the window's size (count_include_pad=True) or its pixels inside the input")
    rank = _rank_of(m)
    window = _ntuple(m.kernel_size, rank)
    return MeanPool(window, stride=_ntuple(m.stride, rank) if m.stride is not None else window,
                    pad=_ntuple(m.padding, rank), ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)


def _torch_pool_padding(x, path):
    """torch's ``padding`` for pool layer ``x``: symmetric and at most half the window."""
    name = type(x).__name__
    padding = _symmetric(x.pad)
    if padding is None:
        refuse_to(path, f"{name} with asymmetric pad={x.pad}", "torch pools pad symmetrically")
    if any(2 * p > k for p, k in zip(padding, x.window)):
        refuse_to(path, f"{name} with pad={x.pad} more than half the window {x.window}", "torch refuses such padding")
    return padding


def maxpool_to_torch(x, path):
    cls = getattr(import_torch().nn, f"MaxPool{len(x.window)}d")
    return cls(x.window, stride=x.stride, padding=_torch_pool_padding(x, path), dilation=x.dilation,
               ceil_mode=x.ceil_mode)


def meanpool_to_torch(x, path):
    cls = getattr(import_torch().nn, f"AvgPool{len(x.window)}d")
    return cls(x.window, stride=x.stride, padding=_torch_pool_padding(x, path), ceil_mode=x.ceil_mode,
               count_include_pad=x.count_include_pad)


# AdaptiveAvgPool1d/2d/3d <-> AdaptiveMeanPool (GlobalMeanPool from and to the 2-d one of size 1),
# AdaptiveMaxPool1d/2d/3d <-> AdaptiveMaxPool (GlobalMaxPool likewise)

def adaptive_from_torch(adaptive, global_):
    """from_torch for an adaptive pool: ``global_()`` for the 2-d one of output
    size 1 (as Flux's global pools serve images), else ``adaptive(output_size)``."""
    def from_torch(m, path, options):
        if getattr(m, "return_indices", False):
            refuse_from(path, m, "return_indices=True")
        rank = _rank_of(m)
        size = _ntuple(m.output_size, rank)
        if size == (1,) * rank:
            return global_()
        return adaptive(size)
    return from_torch


def adaptive_to_torch(torch_prefix):
    def to_torch(x, path):
        if isinstance(x, (GlobalMeanPool, GlobalMaxPool)):
            # the rank of what feeds it (2 when nothing says): torch's adaptive pools are rank-specific
            return getattr(import_torch().nn, f"{torch_prefix}{feeding_rank(x)}d")(1)
        return getattr(import_torch().nn, f"{torch_prefix}{len(x.out)}d")(x.out)
    return to_torch


# Upsample, UpsamplingNearest2d, UpsamplingBilinear2d <-> Upsample

#: torch's interpolation modes triflux's Upsample has
_UPSAMPLE_MODES = ("nearest", "linear", "bilinear", "trilinear")


def upsample_from_torch(m, path, options):
    mode = m.mode
    if mode == "nearest-exact":        # the same index rule as "nearest" for integer factors only
        sf = m.scale_factor if isinstance(m.scale_factor, tuple) else (m.scale_factor,)
        if m.scale_factor is None or any(float(s) != int(s) for s in sf):
            refuse_from(path, m, "mode='nearest-exact' with a size or a non-integer scale_factor",
                        "use mode='nearest' (torch's nearest index rule) or an integer scale_factor")
        mode = "nearest"
    if mode not in _UPSAMPLE_MODES:
        refuse_from(path, m, f"mode={m.mode!r}", f"use one of {', '.join(_UPSAMPLE_MODES)}")
    if m.scale_factor is not None and m.recompute_scale_factor:
        refuse_from(path, m, "recompute_scale_factor=True",
                    "triflux's Upsample(scale=...) uses the given factor, as torch's default; give size=(...) "
                    "for the output-size rule")
    return Upsample(mode, size=m.size, scale=m.scale_factor,
                    align_corners=bool(m.align_corners) if mode != "nearest" else False)


def upsample_to_torch(x, path):
    scale = None if x.scale is None else tuple(float(s) for s in x.scale) if isinstance(x.scale, tuple) \
        else float(x.scale)
    if x.mode != "nearest":
        return import_torch().nn.Upsample(size=x.size, scale_factor=scale, mode=x.mode, align_corners=x.align_corners)
    return import_torch().nn.Upsample(size=x.size, scale_factor=scale, mode="nearest")


# PixelShuffle <-> PixelShuffle (torch's shuffles the last two axes: images)

def pixel_shuffle_from_torch(m, path, options):
    return PixelShuffle(m.upscale_factor)


def pixel_shuffle_to_torch(x, path):
    return import_torch().nn.PixelShuffle(x.r)
