"""Convolution layers: Conv (cross-correlation, as PyTorch and Flux's
CrossCor) and ConvTranspose, on (N, C, H, W) inputs with PyTorch's weight
layouts, so PyTorch weights load without flipping."""
import numpy as np

from .. import ops
from .. import dtypes as _dt
from ..activations import as_activation, identity
from ..arguments import float_dtype, int_arg, pad_arg, pair_arg
from ..devices import as_device
from ..errors import ShapeError
from ..show import fname
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .fusion import fused_activation
from .initialisers import glorot_uniform, initial_weight
from .inputs import check_input

__all__ = ["Conv", "ConvTranspose"]


def same_padding(kernel, dilation):
    """PyTorch's padding="same" for stride 1: the total d(k-1) split with the
    extra element at the bottom/right."""
    out = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        out += [total // 2, total - total // 2]
    return (out[0], out[1], out[2], out[3])


def _geometry(layer, who, kernel, in_channels, out_channels, stride, dilation, groups):
    """Check and set the options Conv and ConvTranspose share; returns the
    (kh, kw) kernel and the channels."""
    kernel = pair_arg(kernel, who, "kernel")
    cin, cout = int_arg(in_channels, who, "in_channels"), int_arg(out_channels, who, "out_channels")
    layer.stride, layer.dilation = pair_arg(stride, who, "stride"), pair_arg(dilation, who, "dilation")
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


def _four_d(layer, x):
    x = as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
    if x.ndim != 4:
        raise ShapeError(f"{layer_name(layer)} expects a 4-d (N, C, H, W) input, got shape {x.shape}")
    return x


def pad_str(pad):
    """A padding (top, bottom, left, right) as Flux prints it: one number
    when all four agree, (h, w) when each axis is symmetric."""
    t, b, l, r = pad
    if t == b == l == r:
        return str(t)
    if t == b and l == r:
        return f"({t}, {l})"
    return str(pad)



def _options(layer, *options):
    """``, name=value`` for each ``(name, value, default)`` that differs from
    its default (pairs of equal sides print as one number), and
    ``, bias=false`` for a layer without a bias: Flux's printing."""
    s = ""
    for name, v, default in options:
        if v != default:
            s += f", {name}={v if not isinstance(v, tuple) or v[0] != v[1] else v[0]}"
    if layer.bias is None:
        s += ", bias=false"
    return s


class Conv(Layer):
    """``activation(conv2d(x, weight) + bias)`` on (N, C, H, W) input:
    ``Conv((3, 3), 3, 16, relu)`` is Flux's ``Conv((3, 3), 3 => 16, relu)``
    (torch's ``Conv2d(3, 16, 3)`` followed by the activation).

    ``kernel`` a positive int or (kh, kw); ``in_channels``, ``out_channels``
    positive ints, both divisible by ``groups``; ``activation`` a function
    or an activation's name; ``stride`` and ``dilation`` positive, an int or
    (h, w); ``pad`` zeros around the input: an int, (h, w), (top, bottom,
    left, right), ``"valid"`` (none) or ``"same"`` (the output keeps H and W;
    stride 1, as in PyTorch); ``bias`` True or False; ``init(*shape)`` the
    initial weight (copied), Glorot uniform by default; ``dtype`` a floating
    type. ``weight`` is ``(out, in/groups, kh, kw)``, PyTorch's layout::

        conv = Conv((3, 3), 3, 16, relu, pad="same")
        conv(tf.ones(8, 3, 32, 32)).shape      # (8, 16, 32, 32)

    Math: reference/conv.py ``conv2d_forward`` (``conv2d_bias_act_forward``
    when the activation fuses); output size: triflux/specs/conv.py.
    """

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None):
        kernel, cin, cout = _geometry(self, "Conv", kernel, in_channels, out_channels, stride, dilation, groups)
        if isinstance(pad, str) and pad.lower() == "same":
            if self.stride != (1, 1):
                raise ShapeError(f'Conv: pad="same" needs stride 1 (as in PyTorch), got stride={stride}; '
                                 "give the padding as numbers instead")
            pad = same_padding(kernel, self.dilation)
        self.pad = pad_arg(pad, "Conv", words=("valid", "same"))
        self.activation = as_activation(activation, "Conv")
        k = kernel[0] * kernel[1]
        _init_parameters(self, "Conv", (cout, cin // self.groups, *kernel), k * cin // self.groups,
                         k * cout // self.groups, cout, init, bias, dtype, device)

    def __call__(self, x):
        cin = self.weight.shape[1] * self.groups
        x = check_input(self, _four_d(self, x), self.weight, axis=1, expected=cin, what="channels")
        kh, kw = self.weight.shape[2:]
        t, b, l, r = self.pad
        for size, k, d, lo, hi, axis in ((x.shape[2], kh, self.dilation[0], t, b, "height"),
                                         (x.shape[3], kw, self.dilation[1], l, r, "width")):
            if size + lo + hi < d * (k - 1) + 1:
                raise ShapeError(f"{layer_name(self)}: input {axis} {size} (padded {size + lo + hi}) is smaller than the "
                                 f"kernel's extent {d * (k - 1) + 1}; input shape {x.shape}")
        # activations whose derivative follows from the output are fused with the conv
        # and the bias into one primitive; others keep conv2d, + bias, activation
        fused = fused_activation(self.activation, "conv2d_bias_act") if self.bias is not None else None
        if fused is not None:
            # one primitive: conv, bias and activation in one kernel (backward from the output)
            return ops.conv2d_bias_act(x, self.weight, self.bias, stride=self.stride, padding=self.pad,
                                       dilation=self.dilation, groups=self.groups, activation=fused)
        y = ops.conv2d(x, self.weight, stride=self.stride, padding=self.pad, dilation=self.dilation,
                       groups=self.groups)
        if self.bias is not None:
            y = y + ops.reshape(self.bias, (1, -1, 1, 1))
        return self.activation(y)

    def _signature(self):
        o, i, kh, kw = self.weight.shape
        s = f"({kh}, {kw}), {i * self.groups} => {o}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        return s + _options(self, ("pad", pad_str(self.pad), "0"), ("stride", self.stride, (1, 1)),
                            ("dilation", self.dilation, (1, 1)), ("groups", self.groups, 1))


class ConvTranspose(Layer):
    """``activation(conv_transpose2d(x, weight) + bias)``, the upsampling
    convolution of a UNET decoder (torch's ``ConvTranspose2d``, Flux's
    ``ConvTranspose``): ``ConvTranspose((2, 2), 64, 32, stride=2)`` doubles
    H and W.

    Arguments as Conv's (no ``"same"``), plus ``outpad`` (an int or (h, w),
    each below its stride or dilation): extra rows and columns at the
    bottom/right of the output. ``weight`` is ``(in, out/groups, kh, kw)``
    (PyTorch's layout)::

        up = ConvTranspose((2, 2), 8, 4, stride=2)
        up(tf.ones(1, 8, 16, 16)).shape        # (1, 4, 32, 32)

    Math: reference/conv.py ``conv_transpose2d_forward``; output size:
    triflux/specs/conv.py.
    """

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 outpad=0, dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None):
        kernel, cin, cout = _geometry(self, "ConvTranspose", kernel, in_channels, out_channels, stride, dilation,
                                      groups)
        self.pad, self.outpad = pad_arg(pad, "ConvTranspose"), pair_arg(outpad, "ConvTranspose", "outpad", low=0)
        if any(o >= max(s, d) for o, s, d in zip(self.outpad, self.stride, self.dilation)):
            raise ShapeError(f"ConvTranspose: outpad={outpad} must be smaller than the stride {self.stride} or the "
                             f"dilation {self.dilation} on each axis (as in PyTorch)")
        self.activation = as_activation(activation, "ConvTranspose")
        k = kernel[0] * kernel[1]
        _init_parameters(self, "ConvTranspose", (cin, cout // self.groups, *kernel), k * cout // self.groups,
                         k * cin // self.groups, cout, init, bias, dtype, device)

    def __call__(self, x):
        x = check_input(self, _four_d(self, x), self.weight, axis=1, expected=self.weight.shape[0],
                        what="channels")
        y = ops.conv_transpose2d(x, self.weight, stride=self.stride, padding=self.pad,
                                 output_padding=self.outpad, dilation=self.dilation, groups=self.groups)
        if self.bias is not None:
            y = y + ops.reshape(self.bias, (1, -1, 1, 1))
        return self.activation(y)

    def _signature(self):
        i, o, kh, kw = self.weight.shape
        s = f"({kh}, {kw}), {i} => {o * self.groups}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        return s + _options(self, ("stride", self.stride, (1, 1)), ("pad", pad_str(self.pad), "0"),
                            ("outpad", self.outpad, (0, 0)), ("dilation", self.dilation, (1, 1)),
                            ("groups", self.groups, 1))
