"""Per-sample normalisation layers: LayerNorm, GroupNorm, InstanceNorm and
RMSNorm (Flux's first three, torch's ``nn.RMSNorm``).

Unlike BatchNorm, each sample is normalised with its own statistics, so the
layers behave the same in training and testing; only InstanceNorm with
``track_stats=True`` keeps running statistics, which it moves in training
(inside ``gradient``, or when pinned by ``trainmode``) and uses in testing.

Inputs are row-major and batch first: LayerNorm and RMSNorm normalise the
*trailing* ``len(size)`` axes of ``(..., *size)`` (Flux's leading axes of its
column-major arrays: the same memory), GroupNorm and InstanceNorm take
``(N, C, *spatial)`` (Flux's ``(*spatial, C, N)``). Parameters are ``weight``
(Flux's γ) and ``bias`` (β), None without ``affine``; InstanceNorm's running
statistics are ``running_mean`` and ``running_var``.

Each layer is one primitive (``layernorm``, ``rmsnorm``, ``groupnorm``,
``instancenorm_train``: reference/layernorm.py has the math), with the
activation applied in the same kernels when it is identity, relu, sigmoid or
tanh, after it otherwise.
"""
import math
import numbers

import numpy as np

from .. import dtypes as _dt
from .. import normalisation as _norm
from ..activations import as_activation, identity
from ..arguments import flag_arg, float_dtype, int_arg, is_int
from ..devices import as_device
from ..errors import ArgumentError, ShapeError
from ..modes import is_active, moving
from ..operands import floating
from ..show import fname
from ..tensor import Tensor, as_tensor, transfer
from .base import Layer, layer_name
from .fusion import fused_activation
from .inputs import check_input

__all__ = ["LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm"]


def _eps_arg(eps, who, allow_none=False):
    if eps is None and allow_none:
        return None
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 <= eps < math.inf:
        raise ArgumentError(f"{who}: eps must be a non-negative finite number"
                            f"{' or None (the dtype machine epsilon)' if allow_none else ''}, got {eps!r}")
    return float(eps)


def _size_arg(size, who):
    """``size`` (an int or a tuple of ints, Flux's ``size``) as a non-empty tuple of positive ints."""
    sides = (size,) if is_int(size) else tuple(size) if isinstance(size, (tuple, list)) else None
    if not sides or not all(is_int(s) and s >= 1 for s in sides):
        raise ArgumentError(f"{who}: size must be a positive int or a non-empty tuple of them (the trailing axes "
                            f"to normalise), got {size!r}")
    return tuple(int(s) for s in sides)


def _own(shape, value, dtype, device):
    """A new parameter of ``shape`` filled with ``value``, on ``device``."""
    t = Tensor._from_numpy(np.full(shape, value, dtype))
    return t if device is None else transfer(t, as_device(device))


def _prepare(layer, x, like, axis=None, expected=None, what="channels"):
    """``x`` fitted to the layer: through ``check_input`` against the
    parameter ``like`` (device, dtype, size on ``axis``), or without
    parameters made a floating Tensor on its own device."""
    if like is not None:
        return check_input(layer, x, like, axis=-1 if axis is None else axis, expected=expected, what=what)
    x = floating(x if isinstance(x, Tensor) else as_tensor(np.asarray(x)), layer_name(layer))
    if expected is not None and (x.ndim == 0 or x.ndim <= max(axis, -1 - axis) or x.shape[axis] != expected):
        raise ShapeError(f"{layer_name(layer)} expects {expected} {what} on axis {axis} of its input, "
                         f"but got an input of shape {x.shape}")
    return x


def _show_size(size):
    return ", ".join(map(str, size))


def _apply_activation(y, fused, activation):
    return y if fused else activation(y)


def _trailing_input(layer, x):
    """``x`` prepared for a layer that normalises its trailing axes of shape
    ``layer.size`` (LayerNorm, RMSNorm), or a ShapeError naming the layer."""
    k = len(layer.size)
    x = _prepare(layer, x, layer.weight, axis=-1, expected=layer.size[-1], what="features")
    if x.shape[max(x.ndim - k, 0):] != layer.size or x.ndim < k:
        raise ShapeError(f"{layer_name(layer)} normalises the trailing axes of shape {layer.size}, but got an input "
                         f"of shape {x.shape}; its last {k} axes must be {layer.size}")
    return x


class LayerNorm(Layer):
    """Normalise each sample's trailing axes of shape ``size`` together (an
    int: the last axis), then scale and shift elementwise and apply
    ``activation``::

        y = activation((x - mean) / sqrt(var + eps) * weight + bias)

    mean and (biased) variance over those axes, per sample: Flux's
    ``LayerNorm(size, λ)`` and torch's ``nn.LayerNorm(size)``. ``weight`` and
    ``bias`` (shape ``size``; ones and zeros to start) exist with ``affine``
    (``bias=False`` keeps only the weight, torch's ``LayerNorm(bias=False)``);
    without ``affine`` both are None. Inputs ``(..., *size)``."""

    def __init__(self, size, activation=identity, *, affine=True, bias=True, eps=1e-5, dtype=_dt.float32,
                 device=None):
        self.size = _size_arg(size, "LayerNorm")
        affine = flag_arg(affine, "LayerNorm", "affine")
        dtype = float_dtype(dtype, "LayerNorm")
        self.activation = as_activation(activation, "LayerNorm")
        self.eps = _eps_arg(eps, "LayerNorm")
        self.weight = _own(self.size, 1, dtype, device) if affine else None
        self.bias = _own(self.size, 0, dtype, device) if affine and flag_arg(bias, "LayerNorm", "bias") else None

    @property
    def affine(self):
        return self.weight is not None

    def __call__(self, x):
        x = _trailing_input(self, x)
        fused = fused_activation(self.activation, "layernorm")
        y = _norm.layer_norm(x, self.size, self.weight, self.bias, self.eps, activation=fused or "identity")
        return _apply_activation(y, fused, self.activation)

    def _signature(self):
        s = _show_size(self.size)
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if not self.affine:
            s += ", affine=false"
        elif self.bias is None:
            s += ", bias=false"
        return s


class RMSNorm(Layer):
    """torch's ``nn.RMSNorm``: divide each sample's trailing axes of shape
    ``size`` by their root mean square and scale elementwise::

        y = x / sqrt(mean(x^2) + eps) * weight

    ``eps=None`` is the machine epsilon of the type the statistics are
    computed in (2^-23 for float16, bfloat16 and float32 inputs, 2^-52 for
    float64: torch's value). ``weight`` (shape ``size``, ones to start) with
    ``affine``, else None. Inputs ``(..., *size)``."""

    def __init__(self, size, *, eps=None, affine=True, dtype=_dt.float32, device=None):
        self.size = _size_arg(size, "RMSNorm")
        dtype = float_dtype(dtype, "RMSNorm")
        self.eps = _eps_arg(eps, "RMSNorm", allow_none=True)
        self.weight = _own(self.size, 1, dtype, device) if flag_arg(affine, "RMSNorm", "affine") else None

    @property
    def affine(self):
        return self.weight is not None

    def __call__(self, x):
        x = _trailing_input(self, x)
        return _norm.rms_norm(x, self.size, self.weight, self.eps)

    def _signature(self):
        s = _show_size(self.size)
        if self.eps is not None:
            s += f", eps={self.eps:g}"
        if not self.affine:
            s += ", affine=false"
        return s


class GroupNorm(Layer):
    """Flux's ``GroupNorm(channels, groups, λ)``: the ``channels`` of
    ``(N, C, *spatial)`` input cut into ``groups`` groups of consecutive
    channels (``groups`` must divide ``channels``); each sample's group
    normalised with its own mean and biased variance, then scaled and shifted
    per channel and passed through ``activation``::

        y = activation((x - mean) / sqrt(var + eps) * weight[c] + bias[c])

    ``weight`` and ``bias`` (C,) with ``affine``, else None (torch's
    ``nn.GroupNorm(groups, channels)``, arguments swapped as in Flux)."""

    def __init__(self, channels, groups, activation=identity, *, affine=True, eps=1e-5, dtype=_dt.float32,
                 device=None):
        self.channels = int_arg(channels, "GroupNorm", "channels")
        self.groups = int_arg(groups, "GroupNorm", "groups")
        if self.channels % self.groups:
            divisors = [d for d in range(1, self.channels + 1) if self.channels % d == 0]
            raise ShapeError(f"GroupNorm: {self.groups} groups do not divide {self.channels} channels; the number of "
                             f"groups must divide the channels ({', '.join(map(str, divisors))})")
        dtype = float_dtype(dtype, "GroupNorm")
        self.activation = as_activation(activation, "GroupNorm")
        self.eps = _eps_arg(eps, "GroupNorm")
        affine = flag_arg(affine, "GroupNorm", "affine")
        self.weight = _own((self.channels,), 1, dtype, device) if affine else None
        self.bias = _own((self.channels,), 0, dtype, device) if affine else None

    @property
    def affine(self):
        return self.weight is not None

    def __call__(self, x):
        x = _prepare(self, x, self.weight, axis=1, expected=self.channels)
        if x.ndim < 2:
            raise ShapeError(f"{layer_name(self)} expects input of shape (N, {self.channels}, *spatial), got {x.shape}")
        fused = fused_activation(self.activation, "groupnorm")
        y = _norm.group_norm(x, self.groups, self.weight, self.bias, self.eps, activation=fused or "identity")
        return _apply_activation(y, fused, self.activation)

    def _signature(self):
        s = f"{self.channels}, {self.groups}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if not self.affine:
            s += ", affine=false"
        return s


class InstanceNorm(Layer):
    """Flux's ``InstanceNorm(channels, λ)``: each sample's channel of
    ``(N, C, *spatial)`` input normalised with its own mean and biased
    variance over its spatial positions, then scaled and shifted per channel
    (``weight``, ``bias`` (C,), only with ``affine``, which is off by default
    as in Flux and torch) and passed through ``activation``.

    With ``track_stats=True`` it keeps ``running_mean`` and ``running_var``
    (C,) (zeros and ones to start, not trained): in training (inside
    ``gradient``, or pinned by ``trainmode``) they move toward the batch's,
    ``running = (1 - momentum) * running + momentum * batch``, where batch is
    the average over the samples of each instance's mean and unbiased
    variance (torch's and Flux's), in the normalisation's own launches and,
    inside a training step, only when the whole step succeeds; in testing they
    normalise instead of each instance's own statistics. An empty batch moves
    nothing. As torch's, the layer refuses instances of one value when it uses
    their statistics (one value normalises to 0 whatever it is)."""
    _nontrainable = ("running_mean", "running_var")

    def __init__(self, channels, activation=identity, *, affine=False, track_stats=False, eps=1e-5, momentum=0.1,
                 dtype=_dt.float32, device=None):
        self.channels = int_arg(channels, "InstanceNorm", "channels")
        dtype = float_dtype(dtype, "InstanceNorm")
        self.activation = as_activation(activation, "InstanceNorm")
        self.eps = _eps_arg(eps, "InstanceNorm")
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not math.isfinite(momentum):
            raise ArgumentError(f"InstanceNorm: momentum must be a finite number (usually in [0, 1]), got {momentum!r}")
        self.momentum = float(momentum)
        affine = flag_arg(affine, "InstanceNorm", "affine")
        self.track_stats = flag_arg(track_stats, "InstanceNorm", "track_stats")
        self.weight = _own((self.channels,), 1, dtype, device) if affine else None
        self.bias = _own((self.channels,), 0, dtype, device) if affine else None
        self.running_mean = _own((self.channels,), 0, dtype, device) if self.track_stats else None
        self.running_var = _own((self.channels,), 1, dtype, device) if self.track_stats else None
        self.active = None

    @property
    def affine(self):
        return self.weight is not None

    def __call__(self, x):
        like = self.weight if self.weight is not None else self.running_mean
        x = _prepare(self, x, like, axis=1, expected=self.channels)
        if x.ndim < 3:
            raise ShapeError(f"{layer_name(self)} expects input of shape (N, {self.channels}, *spatial) with at least "
                             f"one spatial axis, got {x.shape}: each sample's channel is normalised over its "
                             "positions. For (N, C) input use LayerNorm or BatchNorm")
        fused = fused_activation(self.activation, "instancenorm_train")
        act = fused or "identity"
        own_stats = not self.track_stats or is_active(self)
        if own_stats and math.prod(x.shape[2:]) == 1 and x.shape[0] > 0:
            raise ShapeError(f"{layer_name(self)}: expected more than 1 spatial element per instance, got an input of "
                             f"shape {x.shape}: an instance of one value normalises to 0 whatever it is. Give the "
                             "samples more positions, or use LayerNorm or BatchNorm")
        if not own_stats:
            y = _norm.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                    use_input_stats=False, eps=self.eps, activation=act)
        elif self.track_stats:
            # the running statistics move in the normalisation's own launches; inside a training step
            # into new memory, kept only if the whole step succeeds (an empty batch leaves them)
            with moving(self.running_mean, self.running_var) as (running, moved):
                y = _norm.instance_norm(x, running[0], running[1], self.weight, self.bias, momentum=self.momentum,
                                        eps=self.eps, activation=act, moved=moved)
        else:
            y = _norm.instance_norm(x, None, None, self.weight, self.bias, eps=self.eps, activation=act)
        return _apply_activation(y, fused, self.activation)

    def _signature(self):
        s = f"{self.channels}"
        if self.activation is not identity:
            s += f", {fname(self.activation)}"
        if not self.affine:
            s += ", affine=false"
        return s
