"""Per-sample normalisation functions: torch's ``layer_norm``, ``rms_norm``,
``group_norm`` and ``instance_norm``, on any device.

Each checks its inputs at the API edge (the family's spec,
``triflux.specs.layernorm``: shapes, groups that divide the channels, eps)
and raises a triflux error naming what it got, what it expects and the fix,
before any work; then it runs the primitive (``layernorm``, ``rmsnorm``,
``groupnorm``, ``instancenorm_train``; math in reference/layernorm.py) on the
inputs' device, recorded for ``gradient``.

``activation`` (keyword) is applied to the output: identity, relu, sigmoid
and tanh (their names or triflux's functions) inside the normalisation's own
kernels, any other function after it (other activations are given as
functions, not names). The layers (``LayerNorm``, ``GroupNorm``,
``InstanceNorm``, ``RMSNorm``: triflux/layers/normalisation.py) call these;
``triflux.ops`` re-exports them, so this module sits below ``ops`` and
``activations`` and imports neither.

Axes are row-major, batch first, as everywhere in triflux: ``layer_norm``
normalises the *trailing* axes (Flux's LayerNorm the leading ones of its
column-major arrays: the same memory), ``group_norm`` and ``instance_norm``
take ``(N, C, *spatial)``.
"""
import math
import numbers

from .arguments import is_int
from .constructors import ones, zeros
from .dispatch import apply
from .errors import ArgumentError, ShapeError
from .operands import floating
from .primitives import REGISTRY as _P
from .specs.layernorm import groupnorm_spec, instancenorm_spec, layernorm_spec, rmsnorm_spec
from .specs.norm import batchnorm_spec
from .tensor import Tensor, as_tensor

__all__ = ["layer_norm", "rms_norm", "group_norm", "instance_norm"]


#: the module of triflux's activation functions: one of them whose name the primitive applies itself is
#: fused (this module sits below triflux.ops, which re-exports it, so it cannot import triflux.activations)
_ACTIVATIONS_MODULE = __name__.rpartition(".")[0] + ".activations"


def _fused(activation, primitive, who):
    """(name applied by ``primitive`` itself or None, function applied after or None)."""
    fusable = _P[primitive].fusable_activations
    if activation is None:
        return "identity", None
    if isinstance(activation, str):
        if activation in fusable:
            return activation, None
        raise ArgumentError(f"{who}: activation {activation!r} is not one the normalisation applies in its own "
                            f"kernels ({', '.join(fusable)}); pass the function instead (activation=triflux."
                            f"{activation}), which runs after it")
    if not callable(activation):
        raise ArgumentError(f"{who}: activation must be a function (e.g. relu) or the name of one, got {activation!r}")
    name = getattr(activation, "__name__", None)
    if name in fusable and getattr(activation, "__module__", None) == _ACTIVATIONS_MODULE:
        return name, None   # triflux's own relu, sigmoid, tanh, identity (a lookalike of the user's is not fused)
    return None, activation


def _finish(y, after):
    return y if after is None else after(y)


def _attrs(attrs, name):
    """``attrs`` with the activation's name, which identity leaves out."""
    if name not in (None, "identity"):
        attrs["activation"] = name
    return attrs


def _tensor(t, who, what):
    if t is None:
        return None
    if not isinstance(t, Tensor):
        t = as_tensor(t)
    return floating(t, f"{who}'s {what}")


def _normalised_ndim(x, normalised_shape, who):
    """How many trailing axes ``normalised_shape`` (an int or a tuple of ints,
    torch's normalized_shape) names; a ShapeError unless they are x's last ones."""
    shape = (normalised_shape,) if is_int(normalised_shape) else tuple(normalised_shape) \
        if isinstance(normalised_shape, (tuple, list)) else None
    if shape is None or not shape or not all(is_int(s) and s >= 0 for s in shape):
        raise ShapeError(f"{who}: normalised_shape must be a non-negative int or a non-empty tuple of them (the "
                         f"sizes of the trailing axes to normalise), got {normalised_shape!r}")
    shape = tuple(int(s) for s in shape)
    if x.shape[max(x.ndim - len(shape), 0):] != shape or len(shape) > x.ndim:
        raise ShapeError(f"{who}: normalised_shape {shape} must be the last {len(shape)} axes of the input, but the "
                         f"input has shape {x.shape} (expected (*, {', '.join(map(str, shape))})); normalise "
                         f"over its trailing axes {x.shape[max(x.ndim - len(shape), 0):]}, or transpose it so "
                         "that the axes to normalise come last")
    return len(shape)


def _weight_for_bias(weight, bias, shape, like):
    """A bias without a weight (torch allows it): a weight of ones next to it."""
    if weight is None and bias is not None:
        return ones(shape, dtype=bias.dtype, device=bias.device)
    return weight


def layer_norm(x, normalised_shape, weight=None, bias=None, eps=1e-5, *, activation="identity"):
    """torch's ``F.layer_norm``: each sample's trailing axes of shape
    ``normalised_shape`` normalised together to mean 0 and variance 1 (biased
    variance), then scaled by ``weight`` and shifted by ``bias`` (both of
    shape ``normalised_shape``, optional), then ``activation``::

        y = act((x - mean) / sqrt(var + eps) * weight + bias)

    Math: reference/layernorm.py ``layernorm_forward``."""
    who = "`layer_norm`"
    x = floating(x, who)
    k = _normalised_ndim(x, normalised_shape, who)
    weight, bias = _tensor(weight, who, "weight"), _tensor(bias, who, "bias")
    weight = _weight_for_bias(weight, bias, x.shape[x.ndim - k:], x)
    params = tuple(p for p in (weight, bias) if p is not None)
    name, after = _fused(activation, "layernorm", who)
    spec = layernorm_spec(x.shape, tuple(p.shape for p in params), x.dtype, k, eps, name or "identity")
    attrs = _attrs({"normalised_ndim": k, "eps": spec.eps}, name)
    return _finish(apply(_P["layernorm"], (x,) + params, attrs, "layer_norm"), after)


def rms_norm(x, normalised_shape, weight=None, eps=None):
    """torch's ``F.rms_norm``: each sample's trailing axes of shape
    ``normalised_shape`` divided by their root mean square, then scaled by
    ``weight`` (optional, of shape ``normalised_shape``)::

        y = x / sqrt(mean(x^2) + eps) * weight

    ``eps=None`` is the machine epsilon of the type the statistics are
    computed in (2^-23 for float16, bfloat16 and float32 inputs, 2^-52 for
    float64), the value torch uses. Math: reference/layernorm.py ``rmsnorm_forward``."""
    who = "`rms_norm`"
    x = floating(x, who)
    k = _normalised_ndim(x, normalised_shape, who)
    weight = _tensor(weight, who, "weight")
    params = () if weight is None else (weight,)
    spec = rmsnorm_spec(x.shape, tuple(p.shape for p in params), x.dtype, k, eps)
    return apply(_P["rmsnorm"], (x,) + params, {"normalised_ndim": k, "eps": spec.eps}, "rms_norm")


def group_norm(x, groups, weight=None, bias=None, eps=1e-5, *, activation="identity"):
    """torch's ``F.group_norm``: ``x`` (N, C, *spatial) with its C channels
    cut into ``groups`` groups of C/groups consecutive channels; each
    sample's group normalised with its own mean and biased variance, then
    scaled and shifted per channel by ``weight`` and ``bias`` (C,) (optional),
    then ``activation``. ``groups`` must divide C. Math: reference/layernorm.py
    ``groupnorm_forward``."""
    who = "`group_norm`"
    x = floating(x, who)
    weight, bias = _tensor(weight, who, "weight"), _tensor(bias, who, "bias")
    if x.ndim >= 2:
        weight = _weight_for_bias(weight, bias, (x.shape[1],), x)
    params = tuple(p for p in (weight, bias) if p is not None)
    name, after = _fused(activation, "groupnorm", who)
    spec = groupnorm_spec(x.shape, tuple(p.shape for p in params), x.dtype, groups, eps, name or "identity")
    attrs = _attrs({"groups": spec.groups, "eps": spec.eps}, name)
    return _finish(apply(_P["groupnorm"], (x,) + params, attrs, "group_norm"), after)


def _momentum(momentum, who):
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not math.isfinite(momentum):
        raise ArgumentError(f"{who}: momentum must be a finite number (usually in [0, 1]), got {momentum!r}")
    return float(momentum)


def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5, *, activation="identity", moved=None):
    """torch's ``F.instance_norm``: ``x`` (N, C, *spatial), each sample's
    channel normalised on its own (with ``use_input_stats``; a groupnorm with
    one group per channel), scaled and shifted per channel by ``weight`` and
    ``bias`` (C,) (optional), then ``activation``.

    With ``use_input_stats`` and the running statistics ``running_mean``,
    ``running_var`` (C,), these move in the same kernels, in place (as
    torch's): running = (1 - momentum) * running + momentum * the batch's
    average of the instances' means (unbiased variances); given ``moved=(mean,
    var)`` the moved values go there instead and the running ones stay (what
    a training step keeps aside until it succeeds). An empty batch moves
    nothing. Without ``use_input_stats`` the running statistics normalise
    (batch norm's test mode: ``ops.batchnorm``).

    As torch's, each instance must hold more than one value when its own
    statistics are used (a ShapeError otherwise: one value normalises to 0,
    whatever it is). Math: reference/layernorm.py ``instancenorm_train_forward``."""
    who = "`instance_norm`"
    x = floating(x, who)
    if x.ndim < 2:
        raise ShapeError(f"{who} needs x of shape (N, C, *spatial), got shape {x.shape}")
    c = x.shape[1]
    weight, bias = _tensor(weight, who, "weight"), _tensor(bias, who, "bias")
    if (running_mean is None) != (running_var is None):
        raise ArgumentError(f"{who}: give both running_mean and running_var, or neither")
    momentum = _momentum(momentum, who)
    name, after = _fused(activation, "instancenorm_train", who)
    if not use_input_stats:
        if running_mean is None:
            raise ArgumentError(f"{who}: use_input_stats=False normalises with the running statistics; give "
                                "running_mean and running_var")
        w = weight if weight is not None else ones(c, dtype=x.dtype, device=x.device)
        b = bias if bias is not None else zeros(c, dtype=x.dtype, device=x.device)
        # batch norm's test mode (ops.batchnorm with given statistics), launched here: triflux.ops re-exports
        # this module, so it cannot call ops
        stats = (w, b, running_mean, running_var)
        spec = batchnorm_spec(x.shape, tuple(t.shape for t in stats), x.dtype, eps, name or "identity")
        attrs = _attrs({"eps": spec.eps}, spec.activation)
        return _finish(apply(_P["batchnorm_test"], (x,) + stats, attrs, "instance_norm"), after)
    spatial = math.prod(x.shape[2:])
    if spatial == 1 and x.shape[0] * c > 0:
        raise ShapeError(f"{who}: expected more than 1 spatial element per instance, got input of shape {x.shape}: "
                         "an instance of one value normalises to 0 whatever it is. Give each sample's channels "
                         "spatial positions (N, C, L, ...), or use LayerNorm / GroupNorm across channels")
    affine = weight is not None or bias is not None
    params = ()
    if affine:
        params = (weight if weight is not None else ones(c, dtype=bias.dtype, device=bias.device),
                  bias if bias is not None else zeros(c, dtype=weight.dtype, device=weight.device))
    stats = ()
    if running_mean is not None:
        stats = (running_mean, running_var) + (tuple(moved) if moved is not None else ())
    spec = instancenorm_spec(x.shape, tuple(p.shape for p in params), tuple(s.shape for s in stats), x.dtype, eps,
                             name or "identity", moved is not None and bool(stats))
    attrs = _attrs({"affine": affine, "eps": spec.eps}, name)
    if stats:
        attrs["momentum"] = momentum
    return _finish(apply(_P["instancenorm_train"], (x,) + params + stats, attrs, "instance_norm"), after)
