"""Convolution layers: Conv (cross-correlation, as PyTorch and Flux's
CrossCor) and ConvTranspose, on (N, C, H, W) inputs with PyTorch's weight
layouts, so PyTorch weights load without flipping."""
import numpy as np

from .. import activations, ops
from .. import dtypes as _dt
from ..activations import identity
from ..arguments import pair, quad
from ..devices import as_device
from ..errors import ShapeError
from ..show import fname
from ..specs.conv import FUSABLE_ACTIVATIONS
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .initialisers import glorot_uniform
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


def _init_parameters(layer, shape, fan_in, fan_out, out_channels, init, bias, dtype, device):
    """``layer.weight`` of ``shape`` from ``init`` (Glorot with the
    convolution's fans by default) and a zero ``layer.bias``, on ``device``."""
    w = init(*shape, fan_in=fan_in, fan_out=fan_out, dtype=dtype) if init is glorot_uniform else \
        as_tensor(init(*shape))
    layer.weight = ops.cast(w, dtype)
    layer.bias = Tensor._from_numpy(np.zeros(out_channels, dtype=_dt.as_dtype(dtype))) if bias else None
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


#: the activations conv2d_bias_act applies in its epilogue (σ is sigmoid), by identity
#: (a user's activation need not be hashable) -> their name
_FUSABLE = {id(getattr(activations, name)): name for name in FUSABLE_ACTIVATIONS}


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
    """``activation(conv2d(x, weight) + bias)``: ``Conv((3, 3), 3, 16, relu)``
    is Flux's ``Conv((3, 3), 3 => 16, relu)``. ``weight`` is
    ``(out, in/groups, kh, kw)``; ``pad`` is an int, ``(h, w)``,
    ``(top, bottom, left, right)`` or ``"same"``."""

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None):
        kernel = pair(kernel, "kernel")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv: channels {in_channels} => {out_channels} must both be divisible by groups={groups}")
        self.stride, self.dilation, self.groups = pair(stride, "stride"), pair(dilation, "dilation"), int(groups)
        if pad == "same":
            if self.stride != (1, 1):
                raise ValueError('Conv: pad="same" needs stride 1 (as in PyTorch)')
            pad = same_padding(kernel, self.dilation)
        self.pad = quad(pad)
        k = kernel[0] * kernel[1]
        _init_parameters(self, (out_channels, in_channels // groups, *kernel), k * in_channels // groups,
                         k * out_channels // groups, out_channels, init, bias, dtype, device)
        self.activation = activation

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
        fused = _FUSABLE.get(id(self.activation)) if self.bias is not None else None
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
    convolution of a UNET decoder. ``weight`` is ``(in, out/groups, kh, kw)``
    (PyTorch's ConvTranspose2d layout)."""

    def __init__(self, kernel, in_channels, out_channels, activation=identity, *, stride=1, pad=0,
                 outpad=0, dilation=1, groups=1, bias=True, init=glorot_uniform, dtype=_dt.float32, device=None):
        kernel = pair(kernel, "kernel")
        self.stride, self.dilation, self.groups = pair(stride, "stride"), pair(dilation, "dilation"), int(groups)
        self.pad, self.outpad = quad(pad), pair(outpad, "outpad")
        k = kernel[0] * kernel[1]
        _init_parameters(self, (in_channels, out_channels // groups, *kernel), k * out_channels // groups,
                         k * in_channels // groups, out_channels, init, bias, dtype, device)
        self.activation = activation

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
