"""Operations on the spatial axes of ``(N, C, *spatial)`` Tensors, in any
spatial rank R = 1, 2 or 3 (sequences ``(N, C, L)``, images ``(N, C, H, W)``,
volumes ``(N, C, D, H, W)``): convolution, pooling, resampling, padding and
pixel shuffling. ``triflux.ops`` re-exports every public name here.

The rank comes from the arguments, as in NNlib where the kernel tuple's
length sets it: a convolution's from its weight ``(O, C/groups, *kernel)``, a
pooling's from its window tuple (an int window pools every spatial axis of
the input), a resize's from the input. Per-axis arguments take an int (the
same on every axis) or one value per axis; a padding is an int, one per
axis, the flat ``(lo_0, hi_0, lo_1, hi_1, ...)`` in axis order, or ``(lo,
hi)`` pairs (``triflux.arguments.spatial_pad_arg``). Each function checks
what the user gave (an error names the function, what it expected, what it
got and what to do), then runs one registered primitive, whose spec
(``triflux/specs/<family>.py``) holds the geometry and whose reference
(``reference/<family>.py``) holds the math. The 2-D functions of earlier
releases (``conv2d``, ``maxpool2d``, ...) are these with R = 2.
"""
import numbers

from .arguments import int_arg, is_int, ntuple_arg, spatial_pad_arg
from .dispatch import apply
from .errors import ArgumentError, ShapeError
from .operands import cast, floating as _floating, promote as _promote
from .primitives import REGISTRY as _P
from .specs.conv import conv_bias_act_spec, conv_spec, conv_transpose_spec
from .specs.pad import pad_spec
from .specs.pool import adaptive_pool_spec, pool_spec
from .specs.upsample import pixel_shuffle_spec, scale_tuple, upsample_spec
from .tensor import as_tensor

__all__ = ["conv", "conv_bias_act", "conv_transpose", "conv2d", "conv2d_bias_act", "conv_transpose2d",
           "maxpool", "meanpool", "lpnormpool", "adaptive_maxpool", "adaptive_meanpool", "maxpool2d", "meanpool2d",
           "adaptive_maxpool2d", "adaptive_meanpool2d", "adaptive_size", "upsample", "pixel_shuffle",
           "pixel_unshuffle", "pad", "pad_constant", "pad_zeros", "pad_reflect", "pad_repeat", "pad_symmetric",
           "pad_circular", "spatial_axes", "UPSAMPLE_MODES", "PAD_MODES"]

#: the spatial axes' names by rank, for messages
_AXES = {1: "L", 2: "H, W", 3: "D, H, W"}


def spatial_axes(rank):
    """The layout ``(N, C, ...)`` of an input of ``rank`` spatial axes, as messages write it."""
    return f"(N, C, {_AXES.get(rank, '...')})"


def _padding(name, padding, pad):
    """``padding`` (torch's name), or ``pad`` (NNlib's and Flux's) when given instead."""
    if pad is None:
        return padding
    if padding != 0:
        raise ArgumentError(f"`{name}`: give the padding once, as padding= (torch's name) or pad= (NNlib's), "
                            f"got padding={padding!r} and pad={pad!r}")
    return pad


def _rank_of(name, v, what):
    """The spatial rank a per-axis argument ``v`` sets: its length (1 to 3)."""
    if not 1 <= len(v) <= 3:
        raise ShapeError(f"`{name}`: {what} must have 1, 2 or 3 entries (one per spatial axis), got {v!r}")
    return len(v)


def _spatial_input(name, x, rank=None, *, floating=True):
    """``x`` as a Tensor (of a floating type if ``floating``) of ``rank``
    spatial axes, ``(N, C, *spatial)``; with ``rank`` None, any of 1 to 3."""
    x = _floating(x, name) if floating else as_tensor(x)
    if rank is None:
        if not 3 <= x.ndim <= 5:
            raise ShapeError(f"`{name}` expects (N, C, L), (N, C, H, W) or (N, C, D, H, W) input (1 to 3 spatial "
                             f"axes after the batch and channel axes), got shape {x.shape}")
    elif x.ndim != rank + 2:
        hint = (" (add the batch axis: x.reshape((1,) + x.shape))" if x.ndim == rank + 1 else "")
        raise ShapeError(f"`{name}` with {rank} spatial ax{'is' if rank == 1 else 'es'} expects a {rank + 2}-d "
                         f"{spatial_axes(rank)} input, got shape {x.shape}{hint}")
    return x


# --- convolution ---------------------------------------------------------------------------------

def _conv_attrs(name, rank, stride, padding, dilation, groups):
    """A convolution's attributes for ``rank`` spatial axes, checked: strides
    and dilations positive, padding non-negative, groups positive."""
    return conv_attrs(f"`{name}`", rank, stride, padding, dilation, groups)


def conv_attrs(who, rank, stride, padding, dilation, groups):
    """The attributes of a convolution of ``rank`` spatial axes, checked and
    normalised (errors name ``who``): the conv functions' and Conv's."""
    return {"stride": ntuple_arg(stride, rank, who, "stride"),
            "padding": spatial_pad_arg(padding, rank, who, "padding"),
            "dilation": ntuple_arg(dilation, rank, who, "dilation"), "groups": int_arg(groups, who, "groups")}


def _weight_rank(name, w):
    if not 3 <= w.ndim <= 5:
        raise ShapeError(f"`{name}`: the weight must be (out, in/groups, *kernel) with a kernel of 1 to 3 axes, "
                         f"got shape {w.shape}")
    return w.ndim - 2


def _conv(name, x, w, rank, stride, padding, dilation, groups):
    w = _floating(w, name)
    rank = _weight_rank(name, w) if rank is None else rank
    if w.ndim != rank + 2:
        raise ShapeError(f"`{name}` takes a weight (out, in/groups, *kernel) of {rank + 2} dims, got {w.shape}")
    x, w = _promote(_spatial_input(name, x, rank), w)
    return x, w, _conv_attrs(name, rank, stride, padding, dilation, groups)


def conv(x, w, *, stride=1, padding=0, dilation=1, groups=1, pad=None):
    """Cross-correlation of ``x`` (N, C, *spatial) with ``w`` (O, C/groups,
    *kernel) to (N, O, *out), as torch's ``F.conv1d/2d/3d`` (Flux's
    ``CrossCor``; NNlib's ``conv(x, w; flipped=true)``): the kernel's length
    (1 to 3) sets the spatial rank. ``stride``, ``dilation``: an int or one per
    axis; ``padding`` zeros, as the module docstring says; ``groups`` splits
    the channels into independent groups; ``pad=`` (NNlib's name) is
    ``padding``::

        conv(x, w, padding=1)     # x (N, C, L, H, W), w (O, C, 3, 3, 3): keeps the sides

    Math: reference/conv.py ``conv_forward``; output size: triflux/specs/conv.py."""
    x, w, attrs = _conv("conv", x, w, None, stride, _padding("conv", padding, pad), dilation, groups)
    return run_conv(x, w, attrs, "conv")


def run_conv(x, w, attrs, name="conv", device=None):
    """The conv primitive on operands checked where they met (Tensors of one
    dtype; on the one ``device``, or checked here when None) with checked
    ``attrs``: the spec checks the geometry, then it runs. The conv functions
    end here, and so do layers after fitting their input to their weight."""
    conv_spec(x._data.shape, w._data.shape, x.dtype, w.dtype, **attrs)
    return apply(_P["conv"], (x, w), attrs, name, device=device)


def _conv_bias_act(name, x, w, b, rank, stride, padding, dilation, groups, activation):
    x, w, attrs = _conv(name, x, w, rank, stride, padding, dilation, groups)
    b = as_tensor(b)
    if b.dtype != x.dtype:  # promote as conv(x, w) + b would
        b = _floating(b, name)
        x, b = _promote(x, b)
        w = cast(w, x.dtype)
    attrs["activation"] = activation
    return run_conv_bias_act(x, w, b, attrs, name)


def run_conv_bias_act(x, w, b, attrs, name="conv_bias_act", device=None):
    """The conv_bias_act primitive on checked operands (as :func:`run_conv`)."""
    conv_bias_act_spec(x._data.shape, w._data.shape, b._data.shape, x.dtype, w.dtype, b.dtype, **attrs)
    return apply(_P["conv_bias_act"], (x, w, b), attrs, name, device=device)


def conv_bias_act(x, w, b, *, stride=1, padding=0, dilation=1, groups=1, activation="identity"):
    """``activation(conv(x, w) + b)`` as one fused primitive, any spatial rank:
    ``b`` (O,); ``activation`` one of the primitive's ``fusable_activations``,
    "identity", "relu", "sigmoid", "tanh" (those whose derivative follows from
    the output). Math: reference/conv.py ``conv_bias_act_forward``."""
    return _conv_bias_act("conv_bias_act", x, w, b, None, stride, padding, dilation, groups, activation)


def _conv_transpose(name, x, w, rank, stride, padding, output_padding, dilation, groups):
    x, w, attrs = _conv(name, x, w, rank, stride, padding, dilation, groups)
    attrs["output_padding"] = ntuple_arg(output_padding, w.ndim - 2, f"`{name}`", "output_padding", low=0)
    return run_conv_transpose(x, w, attrs, name)


def run_conv_transpose(x, w, attrs, name="conv_transpose", device=None):
    """The conv_transpose primitive on checked operands (as :func:`run_conv`)."""
    conv_transpose_spec(x._data.shape, w._data.shape, x.dtype, w.dtype, **attrs)
    return apply(_P["conv_transpose"], (x, w), attrs, name, device=device)


def conv_transpose(x, w, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1, pad=None):
    """The adjoint of ``conv`` (torch's ``F.conv_transpose1d/2d/3d``): ``x``
    (N, C, *spatial), ``w`` (C, O/groups, *kernel) to (N, O, *out); with a
    kernel of 2 per axis and ``stride=2`` it doubles every side.
    ``output_padding`` (an int or one per axis, each below its stride or its
    dilation) adds positions at the high end of each axis. Math:
    reference/conv.py ``conv_transpose_forward``; output size: triflux/specs/conv.py."""
    return _conv_transpose("conv_transpose", x, w, None, stride, _padding("conv_transpose", padding, pad),
                           output_padding, dilation, groups)


def conv2d(x, w, *, stride=1, padding=0, dilation=1, groups=1):
    """``conv`` of (N, C, H, W) input with ``w`` (O, C/groups, kh, kw), as torch's
    ``F.conv2d``; ``padding`` an int, (h, w) or (top, bottom, left, right).
    ``conv2d(x, w, padding=1)`` keeps H and W for a 3x3 ``w``."""
    x, w, attrs = _conv("conv2d", x, w, 2, stride, padding, dilation, groups)
    return run_conv(x, w, attrs, "conv2d")


def conv2d_bias_act(x, w, b, *, stride=1, padding=0, dilation=1, groups=1, activation="identity"):
    """``conv_bias_act`` of (N, C, H, W) input (``w`` (O, C/groups, kh, kw), ``b`` (O,))."""
    return _conv_bias_act("conv2d_bias_act", x, w, b, 2, stride, padding, dilation, groups, activation)


def conv_transpose2d(x, w, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """``conv_transpose`` of (N, C, H, W) input (``w`` (C, O/groups, kh, kw)), as
    torch's ``F.conv_transpose2d``."""
    return _conv_transpose("conv_transpose2d", x, w, 2, stride, padding, output_padding, dilation, groups)


# --- pooling -------------------------------------------------------------------------------------

def _window_rank(name, window, x, rank):
    """The spatial rank of a pooling: ``rank`` if given, else the window
    tuple's length, else (an int window) the input's."""
    if rank is not None:
        return rank
    if isinstance(window, (tuple, list)):
        return _rank_of(name, tuple(window), "the window")
    return as_tensor(x).ndim - 2


def _pool(name, primitive, x, window, stride, padding, rank, **extra):
    rank = _window_rank(name, window, x, rank)
    x = _spatial_input(name, x, rank)
    who = f"`{name}`"
    window = ntuple_arg(window, rank, who, "window")
    attrs = dict(window=window, stride=window if stride is None else ntuple_arg(stride, rank, who, "stride"),
                 padding=spatial_pad_arg(padding, rank, who, "padding"))
    if "dilation" in extra:
        extra["dilation"] = ntuple_arg(extra["dilation"], rank, who, "dilation")
    attrs.update(extra)
    count_include_pad = attrs.pop("count_include_pad", None)
    pool_spec(primitive, x._data.shape, x.dtype, **attrs)
    if count_include_pad is not None:
        attrs["count_include_pad"] = count_include_pad
    return run_pool(primitive, x, attrs, name)


def run_pool(primitive, x, attrs, name):
    """The pooling ``primitive`` on the floating Tensor ``x`` with ``attrs``
    whose windows its spec checked (``pool_spec``; a pooling layer builds it
    itself, to name the layer in the error): the last step of the pooling
    functions and layers."""
    return apply(_P[primitive], (x,), attrs, name, device=x._device)


def maxpool(x, window, stride=None, padding=0, dilation=1, ceil_mode=False, *, pad=None):
    """torch's ``max_pool1d/2d/3d`` on (N, C, *spatial): the maximum over
    each ``window`` (an int pools every spatial axis of ``x``; a tuple's
    length sets the rank); ``stride`` defaults to the window; ``padding``
    (padding never wins; each side below half the window's extent, torch's
    rule); ``dilation`` spaces the taps; ``ceil_mode`` keeps a last partial
    window. ``maxpool(x, 2)`` halves every side. NaN propagates.
    Math: reference/pool.py ``maxpool_forward``; windows: triflux/specs/pool.py."""
    return _pool("maxpool", "maxpool", x, window, stride, _padding("maxpool", padding, pad), None,
                 dilation=dilation, ceil_mode=bool(ceil_mode))


def meanpool(x, window, stride=None, padding=0, ceil_mode=False, count_include_pad=True, *, pad=None):
    """torch's ``avg_pool1d/2d/3d``: the mean over each window (arguments as
    ``maxpool``); ``count_include_pad`` divides by the taps inside the padded
    input (True) or inside the input only (False).
    Math: reference/pool.py ``meanpool_forward``."""
    return _pool("meanpool", "meanpool", x, window, stride, _padding("meanpool", padding, pad), None,
                 ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


def lpnormpool(x, p, window, stride=None, padding=0, dilation=1, ceil_mode=False, *, pad=None):
    """NNlib's ``lpnormpool`` and torch's ``lp_pool1d/2d/3d``: the p-norm
    ``(sum of x^p over the window)^(1/p)`` of each window (arguments as
    ``maxpool``, ``pad=`` NNlib's name for ``padding``; padding adds zeros to
    the sums). ``p`` a positive number:
    1 is the sum, 2 the Euclidean norm, large p approaches the maximum of |x|.
    Math: reference/pool.py ``lpnormpool_forward``."""
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not p > 0:
        raise ArgumentError(f"`lpnormpool`: p must be a positive number, got {p!r}")
    return _pool("lpnormpool", "lpnormpool", x, window, stride, _padding("lpnormpool", padding, pad), None,
                 p=float(p), dilation=dilation, ceil_mode=bool(ceil_mode))


def maxpool2d(x, window, stride=None, padding=0, dilation=1, ceil_mode=False):
    """``maxpool`` of (N, C, H, W) input (torch's ``max_pool2d``)."""
    return _pool("maxpool2d", "maxpool", x, window, stride, padding, 2, dilation=dilation,
                 ceil_mode=bool(ceil_mode))


def meanpool2d(x, window, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """``meanpool`` of (N, C, H, W) input (torch's ``avg_pool2d``)."""
    return _pool("meanpool2d", "meanpool", x, window, stride, padding, 2, ceil_mode=bool(ceil_mode),
                 count_include_pad=bool(count_include_pad))


def adaptive_size(size, shape, name="adaptive pooling", rank=None):
    """The output sides of an adaptive pooling of an input of ``shape``
    ``(N, C, *spatial)`` to ``size``: a positive int (every side), or one
    entry per spatial axis whose ``None`` entries keep the input's side.
    ``rank`` defaults to the input's spatial rank."""
    rank = len(shape) - 2 if rank is None else rank
    sides = (size,) * rank if size is None or not isinstance(size, (tuple, list)) else tuple(size)
    if len(sides) != rank or not all(s is None or is_int(s) and s >= 1 for s in sides):
        raise ShapeError(f"`{name}`: the output size must be a positive int or {rank} of them (one per spatial "
                         f"axis of the input {tuple(shape)}; None keeps the input's side), got {size!r}")
    return tuple(int(shape[2 + i]) if s is None else int(s) for i, s in enumerate(sides))


def _adaptive(name, primitive, x, size, rank):
    if rank is None:
        rank = _rank_of(name, tuple(size), "the output size") if isinstance(size, (tuple, list)) else \
            as_tensor(x).ndim - 2
    x = _spatial_input(name, x, rank)
    size = adaptive_size(size, x.shape, name, rank)
    adaptive_pool_spec(primitive, x.shape, x.dtype, size)
    return apply(_P[primitive], (x,), {"size": size}, name)


def _out_or_size(name, out, size):
    if (out is None) == (size is None):
        raise ArgumentError(f"`{name}`: give the output size once, as `out` (or torch's `size`), "
                            f"got out={out!r}, size={size!r}")
    return out if size is None else size


def adaptive_maxpool(x, out=None, *, size=None):
    """torch's ``adaptive_max_pool1d/2d/3d``: (N, C, *spatial) to (N, C,
    *out), the maximum over windows that tile the input (an int ``out`` sets
    every side of ``x``; a tuple's length sets the rank; a ``None`` side
    keeps the input's; ``size=`` is the same argument). Math:
    reference/pool.py; windows: triflux/specs/pool.py."""
    return _adaptive("adaptive_maxpool", "adaptive_maxpool", x, _out_or_size("adaptive_maxpool", out, size), None)


def adaptive_meanpool(x, out=None, *, size=None):
    """torch's ``adaptive_avg_pool1d/2d/3d``: the mean over the windows of
    ``adaptive_maxpool`` (same arguments). Math: reference/pool.py."""
    return _adaptive("adaptive_meanpool", "adaptive_meanpool", x, _out_or_size("adaptive_meanpool", out, size),
                     None)


def adaptive_maxpool2d(x, size):
    """``adaptive_maxpool`` of (N, C, H, W) input."""
    return _adaptive("adaptive_maxpool2d", "adaptive_maxpool", x, size, 2)


def adaptive_meanpool2d(x, size):
    """``adaptive_meanpool`` of (N, C, H, W) input."""
    return _adaptive("adaptive_meanpool2d", "adaptive_meanpool", x, size, 2)


# --- resampling ----------------------------------------------------------------------------------

#: upsample's modes and the spatial rank each needs (None: any)
UPSAMPLE_MODES = {"nearest": None, "linear": 1, "bilinear": 2, "trilinear": 3}


def upsample(x, scale=None, mode="nearest", size=None, align_corners=False):
    """torch's ``F.interpolate`` on (N, C, *spatial): to ``size`` (one side
    per spatial axis, or an int for all), or by ``scale`` (a number or one per
    axis, ints or floats; each output side is floor(side * scale)); neither
    given: ``scale=2``. ``mode`` "nearest" (any rank, torch's index rule),
    "linear" (N, C, L), "bilinear" (N, C, H, W), "trilinear" (N, C, D, H, W);
    ``align_corners`` (the linear modes) maps the corner elements of input
    and output onto each other. Math: reference/upsample.py."""
    if mode not in UPSAMPLE_MODES:
        raise ArgumentError(f"`upsample`: mode must be one of {tuple(UPSAMPLE_MODES)}, got {mode!r}")
    rank = UPSAMPLE_MODES[mode]
    x = _spatial_input("upsample", x, rank)
    rank = x.ndim - 2
    if scale is not None and size is not None:
        raise ShapeError(f"`upsample`: give scale or size, not both (got scale={scale!r}, size={size!r})")
    if scale is None and size is None:
        scale = 2
    # a zero side is left to the spec, whose message says the output must be at least 1
    attrs = {"size": None if size is None else ntuple_arg(size, rank, "`upsample`", "size", low=0),
             "scale": None if scale is None else scale_tuple(scale, rank)}
    name = "upsample_nearest" if mode == "nearest" else "upsample_linear"
    if name == "upsample_linear":
        attrs["align_corners"] = bool(align_corners)
    elif align_corners:
        raise ShapeError("`upsample`: align_corners applies to the linear modes only (linear, bilinear, trilinear); "
                         "drop it or use one of those")
    upsample_spec(name, x.shape, x.dtype, **attrs)
    return apply(_P[name], (x,), attrs, name)


def _shuffle(name, x, r):
    x = _spatial_input(name, x, floating=True)
    r = int_arg(r, f"`{name}`", "the factor r")
    pixel_shuffle_spec(name, x.shape, x.dtype, r)
    return apply(_P[name], (x,), {"factor": r}, name)


def pixel_shuffle(x, r):
    """Depth to space (torch's ``F.pixel_shuffle``, NNlib's ``pixel_shuffle``):
    (N, C*r^R, *s) to (N, C, *(s*r)) for R = 1 to 3 spatial axes, each group
    of r^R channels spread over an r-by-...-by-r block; a sub-pixel
    convolution's last step. Math: reference/upsample.py ``pixel_shuffle_forward``."""
    return _shuffle("pixel_shuffle", x, r)


def pixel_unshuffle(x, r):
    """Space to depth (torch's ``F.pixel_unshuffle``), the inverse of
    ``pixel_shuffle``: (N, C, *(s*r)) to (N, C*r^R, *s)."""
    return _shuffle("pixel_unshuffle", x, r)


# --- padding -------------------------------------------------------------------------------------

#: ops.pad's modes (Flux's and torch's names) -> the primitive's
PAD_MODES = {"constant": "constant", "zeros": "constant", "reflect": "reflect", "replicate": "replicate",
             "repeat": "replicate", "symmetric": "symmetric", "circular": "circular"}


def _padded_axes(x, pad, dims):
    """The axes ``pad`` applies to: ``dims`` if given, else the spatial axes
    of (N, C, *spatial) (every axis of a 1-d or 2-d ``x``)."""
    if dims is None:
        if isinstance(pad, (tuple, list)) and pad and all(isinstance(p, (tuple, list)) for p in pad):
            n = len(pad)                       # (lo, hi) pairs: the trailing axes
        else:
            n = x.ndim - 2 if x.ndim >= 3 else x.ndim
        if not 1 <= n <= x.ndim:
            raise ShapeError(f"`pad`: {len(pad)} (lo, hi) pairs for a {x.ndim}-d input of shape {x.shape}")
        return tuple(range(x.ndim - n, x.ndim))
    dims = (dims,) if is_int(dims) else tuple(dims)
    if not dims or not all(is_int(d) and -x.ndim <= d < x.ndim for d in dims) or \
            len({d % x.ndim for d in dims}) != len(dims):
        raise ShapeError(f"`pad`: dims must be distinct axes of the {x.ndim}-d input, got {dims!r}")
    return tuple(int(d) % x.ndim for d in dims)


def pad(x, pad, mode="constant", value=0, *, dims=None):
    """``x`` padded on its spatial axes (those after (N, C); every axis of a
    1-d or 2-d input; or the axes ``dims``): ``pad`` an int (every side), one
    int per axis (both sides), the flat (lo_0, hi_0, lo_1, hi_1, ...) in axis
    order, or (lo, hi) pairs for the trailing axes. ``mode``:

    * "constant" (or "zeros"): ``value`` outside (torch's ``F.pad``);
    * "reflect": mirrored without repeating the edge (each pad below the side);
    * "replicate" (or Flux's "repeat"): the edge element repeated;
    * "symmetric": mirrored with the edge repeated (each pad at most the side);
    * "circular": wrapped around (each pad at most the side).

    Differentiable in every mode: the gradient of an input element sums those
    of the output elements copied from it. Note that this is row-major axis
    order, not torch's ``F.pad`` (last axis first) nor Julia's.
    Math: reference/pad.py; rules: triflux/specs/pad.py."""
    if mode not in PAD_MODES:
        raise ArgumentError(f"`pad`: mode must be one of {tuple(PAD_MODES)}, got {mode!r}")
    x = _floating(x, "pad")
    if x.ndim == 0:
        raise ShapeError("`pad` needs at least one axis to pad, got a 0-d tensor")
    axes = _padded_axes(x, pad, dims)
    sides = spatial_pad_arg(pad, len(axes), "`pad`", "pad", words=(), low=None)
    padding = [0] * (2 * x.ndim)
    for k, a in enumerate(axes):
        padding[2 * a], padding[2 * a + 1] = sides[2 * k], sides[2 * k + 1]
    mode = PAD_MODES[mode]
    if mode != "constant" and value != 0:
        raise ArgumentError(f"`pad`: value={value!r} applies to mode='constant' only")
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ArgumentError(f"`pad`: value must be a real number, got {value!r}")
    attrs = {"padding": tuple(padding), "mode": mode, "value": float(value)}
    pad_spec(x.shape, x.dtype, **attrs)
    return apply(_P["pad"], (x,), attrs, "pad")


_pad = pad     # the function, for NNlib's names below, whose argument is called pad too


def pad_constant(x, pad, value=0, *, dims=None):
    """NNlib's ``pad_constant``: ``ops.pad(x, pad, "constant", value)``."""
    return _pad(x, pad, "constant", value, dims=dims)


def pad_zeros(x, pad, *, dims=None):
    """NNlib's ``pad_zeros``: ``ops.pad(x, pad, "constant", 0)``."""
    return _pad(x, pad, "constant", 0, dims=dims)


def pad_reflect(x, pad, *, dims=None):
    """NNlib's ``pad_reflect``: ``ops.pad(x, pad, "reflect")``."""
    return _pad(x, pad, "reflect", dims=dims)


def pad_repeat(x, pad, *, dims=None):
    """NNlib's ``pad_repeat`` (torch's replicate): ``ops.pad(x, pad, "replicate")``."""
    return _pad(x, pad, "replicate", dims=dims)


def pad_symmetric(x, pad, *, dims=None):
    """NNlib's ``pad_symmetric``: ``ops.pad(x, pad, "symmetric")``."""
    return _pad(x, pad, "symmetric", dims=dims)


def pad_circular(x, pad, *, dims=None):
    """NNlib's ``pad_circular``: ``ops.pad(x, pad, "circular")``."""
    return _pad(x, pad, "circular", dims=dims)
