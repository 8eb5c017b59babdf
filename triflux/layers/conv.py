"""Convolution layers of any spatial rank: Conv (cross-correlation, as
PyTorch and Flux's CrossCor; CrossCor is the same layer under Flux's name),
DepthwiseConv and ConvTranspose, on ``(N, C, *spatial)`` input with PyTorch's
weight layouts, so PyTorch weights load without flipping. The kernel tuple's
length sets the spatial rank, as in Flux: ``Conv((3,), 1, 4)`` runs along
sequences ``(N, C, L)``, ``Conv((3, 3), ...)`` over images, ``Conv((3, 3, 3),
...)`` over volumes ``(N, C, D, H, W)``; an int kernel is 2-D.

A Flux ``Conv`` is a true convolution (it flips the kernel) and stores its
weight as ``(kw, kh, cin, cout)``; :func:`flux_conv_weight` turns such a
weight into this ``Conv``'s."""
import numpy as np

from .. import ops
from .. import dtypes as _dt
from ..activations import as_activation, identity
from ..arguments import float_dtype, int_arg, ntuple_arg, spatial_pad_arg
from ..devices import as_device
from ..errors import ArgumentError, ShapeError
from ..show import fname
from ..spatial import conv_attrs, run_conv, run_conv_bias_act, run_conv_transpose, spatial_axes
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .fusion import fused_activation
from .initialisers import glorot_uniform, initial_weight
from .inputs import check_input

__all__ = ["Conv", "CrossCor", "DepthwiseConv", "ConvTranspose", "flux_conv_weight"]

#: Conv's pad_mode (torch's padding_mode) -> ops.pad's mode
PAD_MODES = {"zeros": None, "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


def kernel_rank(kernel, who):
    """The spatial rank a kernel or window sets: its tuple's length (1 to 3);
    an int is 2-D."""
    if isinstance(kernel, (tuple, list)):
        if not 1 <= len(kernel) <= 3:
            raise ShapeError(f"{who}: the kernel must have 1, 2 or 3 entries (one per spatial axis: (k,) for "
                             f"sequences, (kh, kw) for images, (kd, kh, kw) for volumes), got {kernel!r}")
        return len(kernel)
    return 2


def same_padding(kernel, dilation):
    """PyTorch's padding="same" for stride 1, any rank: per axis the total
    d(k-1) split with the extra element at the high end; flat (lo, hi, ...)."""
    out = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        out += [total // 2, total - total // 2]
    return tuple(out)


def _geometry(layer, who, kernel, in_channels, out_channels, stride, dilation, groups):
    """Check and set the options Conv and ConvTranspose share; returns the
    kernel tuple and the channels."""
    rank = kernel_rank(kernel, who)
    kernel = ntuple_arg(kernel, rank, who, "kernel")
    cin, cout = int_arg(in_channels, who, "in_channels"), int_arg(out_channels, who, "out_channels")
    layer.stride, layer.dilation = ntuple_arg(stride, rank, who, "stride"), ntuple_arg(dilation, rank, who, "dilation")
    layer.groups = int_arg(groups, who, "groups")
    if cin % layer.groups or cout % layer.groups:
        raise ShapeError(f"{who}: channels {cin} => {cout} must both be divisible by groups={layer.groups}")
    return kernel, cin, cout


def _init_parameters(layer, who, shape, fan_in, fan_out, out_channels, init, bias, dtype, device):
    """``layer.weight`` of ``shape`` from ``init`` (Glorot with the
    convolution's fans by default), a zero ``layer.bias`` (or none) and the
    activation, on ``device``."""
    dtype = float_dtype(dtype, who)
    layer.weight = initial_weight(init, shape, dtype, who, fan_in=fan_in, fan_out=fan_out)
    layer.bias = Tensor._from_numpy(np.zeros(out_channels, dtype=dtype)) if bias else None
    if device is not None:
        dev = as_device(device)
        layer.weight = transfer(layer.weight, dev)
        layer.bias = None if layer.bias is None else transfer(layer.bias, dev)


def spatial_input(layer, x, rank):
    """``x`` as a Tensor of ``rank`` spatial axes, (N, C, *spatial), or a
    ShapeError naming the layer, the layout it takes and the fix."""
    x = as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
    if x.ndim != rank + 2:
        hints = []
        if 3 <= x.ndim <= 5:
            hints.append(f"a batch of {x.ndim - 2} spatial ax{'is' if x.ndim == 3 else 'es'} {spatial_axes(x.ndim - 2)} "
                         f"needs a layer with a kernel or window of {x.ndim - 2} entries")
        if x.ndim == rank + 1:
            hints.append("a single sample needs its batch axis: x.reshape((1,) + x.shape)")
        hint = "; " + "; ".join(hints) if hints else ""
        raise ShapeError(f"{layer_name(layer)} expects a {rank + 2}-d {spatial_axes(rank)} input, got shape "
                         f"{x.shape}{hint}")
    return x


def pad_str(pad):
    """A flat padding (lo_0, hi_0, lo_1, hi_1, ...) as Flux prints it: one
    number when all sides agree, one per axis when each axis is symmetric."""
    if len(set(pad)) == 1:
        return str(pad[0])
    if all(pad[2 * k] == pad[2 * k + 1] for k in range(len(pad) // 2)):
        return str(tuple(pad[::2]))
    return str(pad)


def sides_str(v):
    """A tuple of equal sides prints as one number (Flux's printing)."""
    return str(v[0]) if isinstance(v, tuple) and len(set(v)) == 1 else str(v)


def _options(layer, *options):
    """``, name=value`` for each ``(name, value, default)`` that differs from
    its default (tuples of equal sides print as one number), and
    ``, bias=false`` for a layer without a bias: Flux's printing."""
    s = ""
    for name, v, default in options:
        if v != default:
            s += f", {name}={sides_str(v) if isinstance(v, tuple) else v}"
    if layer.bias is None:
        s += ", bias=false"
    return s


def _check_extent(layer, x, kernel, dilation, pad):
    """Each padded side of ``x`` holds the dilated kernel, else a ShapeError naming the layer."""
    for k, (size, ks, d) in enumerate(zip(x.shape[2:], kernel, dilation)):
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if size + lo + hi < d * (ks - 1) + 1:
            raise ShapeError(f"{layer_name(layer)}: input side {size} on spatial axis {k} (padded {size + lo + hi}) "
                             f"is smaller than the kernel's extent {d * (ks - 1) + 1}; input shape {x.shape}. "
                             "Use a larger input or more padding")


def _bias_shape(rank):
    return (1, -1) + (1,) * rank


def _conv_options(layer):
    """A Conv's stride, padding, dilation and groups as the conv primitive takes them, checked."""
    return conv_attrs(type(layer).__name__, layer.weight.ndim - 2, layer.stride, layer.pad, layer.dilation,
                      layer.groups)


def _conv_transpose_options(layer):
    """A ConvTranspose's options as the conv_transpose primitive takes them, checked."""
    rank = layer.weight.ndim - 2
    options = conv_attrs("ConvTranspose", rank, layer.stride, layer.pad, layer.dilation, layer.groups)
    options["output_padding"] = ntuple_arg(layer.outpad, rank, "ConvTranspose", "outpad", low=0)
    return options


class Conv(Layer):
    """``activation(conv(x, weight) + bias)`` on ``(N, C, *spatial)`` input, the
    kernel tuple's length setting the spatial rank: ``Conv((3, 3), 3, 16, relu)``
    is Flux's ``Conv((3, 3), 3 => 16, relu)`` (torch's ``Conv2d(3, 16, 3)``
    followed by the activation); ``Conv((5,), 1, 8)`` is a ``Conv1d`` over
    (N, C, L), ``Conv((3, 3, 3), 1, 8)`` a ``Conv3d`` over (N, C, D, H, W).
    A cross-correlation, as torch's (Flux's ``Conv`` flips the kernel: see
    :func:`flux_conv_weight`).

    ``kernel`` a positive int (2-D) or one per spatial axis; ``in_channels``,
    ``out_channels`` positive ints, both divisible by ``groups``;
    ``activation`` a function or an activation's name; ``stride`` and
    ``dilation`` positive, an int or one per axis; ``pad``: an int, one per
    axis, (lo, hi) per axis as the flat (lo_0, hi_0, lo_1, hi_1, ...) or as
    pairs, ``"valid"`` (none) or ``"same"`` (the output keeps every side;
    stride 1, as in PyTorch); ``pad_mode`` what the padding holds, torch's
    ``padding_mode``: "zeros", "reflect", "replicate" or "circular"; ``bias``
    True or False; ``init(*shape)`` the initial weight (copied), Glorot
    uniform by default; ``dtype`` a floating type. ``weight`` is ``(out,
    in/groups, *kernel)``, PyTorch's layout::

        conv = Conv((3, 3), 3, 16, relu, pad="same")
        conv(tf.ones(8, 3, 32, 32)).shape      # (8, 16, 32, 32)

    Math: reference/conv.py ``conv_forward`` (``conv_bias_act_forward`` when
    the activation fuses); output size: triflux/specs/conv.py.
    """

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None,
                 pad_mode="zeros"):
        who = type(self).__name__
        kernel, cin, cout = _geometry(self, who, kernel, in_channels, out_channels, stride, dilation, groups)
        rank = len(kernel)
        if isinstance(pad, str) and pad.lower() == "same":
            if any(s != 1 for s in self.stride):
                raise ShapeError(f'{who}: pad="same" needs stride 1 (as in PyTorch), got stride={stride}; '
                                 "give the padding as numbers instead")
            pad = same_padding(kernel, self.dilation)
        self.pad = spatial_pad_arg(pad, rank, who, words=("valid", "same"))
        if pad_mode not in PAD_MODES:
            raise ArgumentError(f"{who}: pad_mode must be one of {tuple(PAD_MODES)} (torch's padding_mode), "
                                f"got {pad_mode!r}")
        self.pad_mode = pad_mode
        self.activation = as_activation(activation, who)
        k = int(np.prod(kernel))
        _init_parameters(self, who, (cout, cin // self.groups, *kernel), k * cin // self.groups,
                         k * cout // self.groups, cout, init, bias, dtype, device)

    def __call__(self, x):
        w = self.weight
        rank = w.ndim - 2
        x = check_input(self, spatial_input(self, x, rank), w, axis=1, expected=w.shape[1] * self.groups,
                        what="channels")
        options = self._checked_options(_conv_options)
        if self.pad_mode != "zeros" and any(options["padding"]):
            # torch's padding_mode: the padding holds reflected/repeated/wrapped input, then no zeros
            try:
                x = ops.pad(x, options["padding"], PAD_MODES[self.pad_mode])
            except ShapeError as e:
                raise ShapeError(f"{layer_name(self)} cannot pad an input of shape {x.shape}: {e}") from None
            options = dict(options, padding=(0,) * (2 * rank))
        # activations whose derivative follows from the output are fused with the conv
        # and the bias into one primitive; others keep conv, + bias, activation
        bias = self.bias
        fused = fused_activation(self.activation, "conv_bias_act") if bias is not None else None
        try:
            # x fits w (check_input): the spec checks the geometry, the bias's device is checked where it meets x
            if fused is not None and bias.dtype == x.dtype:
                return run_conv_bias_act(x, w, bias, dict(options, activation=fused))
            if fused is not None:     # another dtype: promoted as conv(x, w) + bias would be
                return ops.conv_bias_act(x, w, bias, **options, activation=fused)
            y = run_conv(x, w, options, device=x._device)
        except ShapeError:
            _check_extent(self, x, w.shape[2:], options["dilation"], options["padding"])   # says it per layer
            raise
        if bias is not None:
            y = y + ops.reshape(bias, _bias_shape(rank))
        return self.activation(y)

    def _signature(self):
        o, i = self.weight.shape[:2]
        s = f"{tuple(self.weight.shape[2:])}, {i * self.groups} => {o}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        rank = self.weight.ndim - 2
        return s + _options(self, ("pad", pad_str(self.pad), "0"), ("pad_mode", repr(self.pad_mode), "'zeros'"),
                            ("stride", self.stride, (1,) * rank), ("dilation", self.dilation, (1,) * rank),
                            ("groups", self.groups, 1))


class CrossCor(Conv):
    """Flux's ``CrossCor``: the same layer as :class:`Conv` (both are
    cross-correlations in triflux, as in PyTorch), under Flux's name, so
    Flux code that uses ``CrossCor`` ports by name::

        CrossCor((3, 3), 1, 4, pad=1)(tf.ones(1, 1, 8, 8)).shape    # (1, 4, 8, 8)
    """


class DepthwiseConv(Conv):
    """Flux's ``DepthwiseConv``: a :class:`Conv` with ``groups = in_channels``,
    each input channel convolved with its own ``out_channels // in_channels``
    filters (``out_channels`` a multiple of ``in_channels``); torch's
    ``Conv2d(c, k*c, kernel, groups=c)``. Options as Conv's, without
    ``groups``::

        DepthwiseConv((3, 3), 8, 16, relu, pad=1)(tf.ones(1, 8, 32, 32)).shape   # (1, 16, 32, 32)
    """

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0, dilation=1,
                 bias=True, init=glorot_uniform, dtype=_dt.float32, device=None, pad_mode="zeros", groups=None):
        cin = int_arg(in_channels, "DepthwiseConv", "in_channels")
        if groups is not None and groups != cin:
            raise ShapeError(f"DepthwiseConv: groups is in_channels ({cin}) by definition, got groups={groups}; "
                             "use Conv(..., groups=...) for other groupings")
        if int_arg(out_channels, "DepthwiseConv", "out_channels") % cin:
            raise ShapeError(f"DepthwiseConv: out_channels ({out_channels}) must be a multiple of in_channels "
                             f"({cin}): each input channel has out/in filters of its own")
        super().__init__(kernel, cin, out_channels, activation, stride=stride, pad=pad, dilation=dilation,
                         groups=cin, bias=bias, init=init, dtype=dtype, device=device, pad_mode=pad_mode)

    def _signature(self):
        return super()._signature().replace(f", groups={self.groups}", "")


class ConvTranspose(Layer):
    """``activation(conv_transpose(x, weight) + bias)``, the upsampling
    convolution of a UNET decoder (torch's ``ConvTranspose1d/2d/3d``, Flux's
    ``ConvTranspose``), any spatial rank as Conv: ``ConvTranspose((2, 2), 64,
    32, stride=2)`` doubles H and W, ``ConvTranspose((2, 2, 2), ...)`` every
    side of a volume.

    Arguments as Conv's (no ``"same"``, zeros only), plus ``outpad`` (an int
    or one per axis, each below its stride or dilation): extra positions at
    the high end of each axis of the output. ``weight`` is ``(in,
    out/groups, *kernel)`` (PyTorch's layout)::

        up = ConvTranspose((2, 2), 8, 4, stride=2)
        up(tf.ones(1, 8, 16, 16)).shape        # (1, 4, 32, 32)

    Math: reference/conv.py ``conv_transpose_forward``; output size:
    triflux/specs/conv.py.
    """

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 outpad=0, dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None):
        kernel, cin, cout = _geometry(self, "ConvTranspose", kernel, in_channels, out_channels, stride, dilation,
                                      groups)
        rank = len(kernel)
        self.pad = spatial_pad_arg(pad, rank, "ConvTranspose")
        self.outpad = ntuple_arg(outpad, rank, "ConvTranspose", "outpad", low=0)
        if any(o >= max(s, d) for o, s, d in zip(self.outpad, self.stride, self.dilation)):
            raise ShapeError(f"ConvTranspose: outpad={outpad} must be smaller than the stride {self.stride} or the "
                             f"dilation {self.dilation} on each axis (as in PyTorch)")
        self.activation = as_activation(activation, "ConvTranspose")
        k = int(np.prod(kernel))
        _init_parameters(self, "ConvTranspose", (cin, cout // self.groups, *kernel), k * cout // self.groups,
                         k * cin // self.groups, cout, init, bias, dtype, device)

    def __call__(self, x):
        w = self.weight
        rank = w.ndim - 2
        x = check_input(self, spatial_input(self, x, rank), w, axis=1, expected=w.shape[0], what="channels")
        y = run_conv_transpose(x, w, self._checked_options(_conv_transpose_options), device=x._device)
        if self.bias is not None:
            y = y + ops.reshape(self.bias, _bias_shape(rank))
        return self.activation(y)

    def _signature(self):
        i, o = self.weight.shape[:2]
        s = f"{tuple(self.weight.shape[2:])}, {i} => {o * self.groups}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        rank = self.weight.ndim - 2
        return s + _options(self, ("stride", self.stride, (1,) * rank), ("pad", pad_str(self.pad), "0"),
                            ("outpad", self.outpad, (0,) * rank), ("dilation", self.dilation, (1,) * rank),
                            ("groups", self.groups, 1))


def flux_conv_weight(w, *, flipped=True):
    """A Flux ``Conv`` weight as this ``Conv``'s. Flux stores a convolution's
    weight column-major as ``(k_1, ..., k_R, cin, cout)`` (``(kw, kh, cin,
    cout)`` for images, read in Julia's order); in row-major memory the same
    array reads ``(cout, cin, k_R, ..., k_1)``: an array exported from Julia
    as its raw memory (``reinterpret``, HDF5, safetensors of the column-major
    buffer) arrives that way. ``w`` here is the weight as Julia indexes it,
    ``(k_1, ..., k_R, cin, cout)`` (``permutedims``-free export, e.g. through
    ``PyCall``/``juliacall`` or ``np.asarray`` of a Julia array), and the
    result is ``(cout, cin, k_R', ..., k_1')`` laid out for triflux, whose
    spatial axes are Julia's reversed (Flux's (W, H) is triflux's (H, W)).

    Flux's ``Conv`` is a true convolution: it flips the kernel along every
    spatial axis before correlating (``flipped=false``, its default), so the
    kernel is flipped here too; ``flipped=False`` is for a Flux
    ``CrossCor`` (or a ``Conv(...; flipped=true)``) weight, which is only
    permuted. Returns a NumPy array; assign it to ``Conv(...).weight``."""
    w = np.asarray(w)
    if not 3 <= w.ndim <= 5:
        raise ShapeError(f"flux_conv_weight: expected Flux's (k_1, ..., k_R, cin, cout) with 1 to 3 spatial axes, "
                         f"got shape {w.shape}")
    rank = w.ndim - 2
    # Julia (k_1, ..., k_R, cin, cout) -> (cout, cin, k_R, ..., k_1): reverse every axis
    out = np.transpose(w, tuple(range(w.ndim - 1, -1, -1)))
    if flipped:
        out = out[(slice(None), slice(None)) + (slice(None, None, -1),) * rank]
    return np.ascontiguousarray(out)
