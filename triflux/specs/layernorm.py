"""The per-sample normalisation specs: layernorm, rmsnorm, groupnorm and
instance norm (family ``layernorm``).

Every primitive of the family normalises *rows*: sets of values that share
one mean and variance (rmsnorm: one mean square), each row belonging to one
sample.

* ``layernorm`` / ``rmsnorm``: ``x`` of any shape ``(*batch, *normalised)``,
  the ``normalised_ndim`` trailing axes normalised together: R = prod(batch)
  rows of M = prod(normalised) values, contiguous in a dense ``x``. The
  optional ``weight`` (and for layernorm ``bias``) have the normalised shape,
  one value per position in a row (torch's ``elementwise_affine``).
* ``groupnorm``: ``x`` of shape (N, C, *spatial), the C channels cut into
  ``groups`` groups of C/G consecutive channels: N * G rows of M = (C/G) * S
  values (S = prod(spatial); 1 for (N, C)), again contiguous in a dense ``x``.
  The optional ``weight`` and ``bias`` have shape (C,), one value per channel.
* instance norm is groupnorm with G = C (a row per sample and channel);
  ``instancenorm_train`` adds the running statistics that
  ``InstanceNorm(track_stats=True)`` moves in training (per channel: the
  batch's average of the instances' means and unbiased variances).

Optional inputs are trailing, as batchnorm_train's running statistics are:
the number of inputs says which are given (layernorm ``x[, weight[, bias]]``,
rmsnorm ``x[, weight]``, groupnorm ``x[, weight[, bias]]``; no weight is
torch's ``weight=None``, Flux's ``affine=false``). instancenorm_train's
inputs are ``x``, then ``weight, bias`` when its attr ``affine`` is true, then
optionally ``running_mean, running_var`` and after them optionally
``moved_mean, moved_var`` (:func:`instancenorm_inputs` splits them).

``eps`` may be any finite number, negative included, as torch's functional
forms take it (a negative eps gives NaN where var + eps < 0, as torch); the
layers ask for eps >= 0. rmsnorm's ``eps=None`` is the machine epsilon of
the type the statistics are computed in, which is what torch 2.x computes
(``torch.finfo`` of the float32 it upcasts 16-bit inputs to: 2^-23 for
float16, bfloat16 and float32, 2^-52 for float64).
"""
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import as_dtype, compute_dtype
from ..errors import ArgumentError, ShapeError
from ..primitives import REGISTRY

#: the activations layernorm, groupnorm and instancenorm_train apply in their own kernels
FUSABLE_ACTIVATIONS = REGISTRY["layernorm"].fusable_activations


def _check_eps(eps, who):
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(eps)):
        raise ArgumentError(f"{who}: eps must be a finite number, got {eps!r}")
    return float(eps)


def _check_activation(activation, who):
    if activation not in FUSABLE_ACTIVATIONS:
        raise ArgumentError(f"{who}: activation {activation!r} is not one it applies itself "
                            f"({', '.join(FUSABLE_ACTIVATIONS)}); apply it to the output instead")
    return activation


def machine_eps(dtype):
    """rmsnorm's ``eps=None``: the machine epsilon of the type statistics of
    ``dtype`` data are computed in (float32's 2^-23 for 16-bit and float32
    data, float64's 2^-52 for float64), as torch 2.x computes it."""
    return float(np.finfo(compute_dtype(as_dtype(dtype))).eps)


# --- layernorm and rmsnorm: rows over the trailing axes ------------------------------------------

@dataclass(frozen=True)
class RowNormSpec:
    """A layernorm or rmsnorm of ``x`` over its ``normalised_ndim`` trailing axes."""
    primitive: str           #: "layernorm" or "rmsnorm"
    x_shape: tuple
    normalised_ndim: int
    dtype: object            #: x's NumPy dtype
    compute_dtype: object    #: statistics and results are computed in this dtype
    eps: float               #: resolved (rmsnorm's None is machine_eps(dtype))
    params: int              #: how many of weight, bias are given (0, 1 or 2)
    activation: str = "identity"

    @property
    def normalised_shape(self):
        """The trailing axes' sizes: the shape of weight and bias."""
        return self.x_shape[len(self.x_shape) - self.normalised_ndim:]

    @property
    def rows(self):
        """R: the number of rows (product of the leading axes)."""
        return math.prod(self.x_shape[:len(self.x_shape) - self.normalised_ndim])

    @property
    def row_length(self):
        """M: the values normalised together."""
        return math.prod(self.normalised_shape)

    @property
    def has_weight(self):
        return self.params >= 1

    @property
    def has_bias(self):
        return self.params >= 2


def _row_spec(primitive, x_shape, param_shapes, dtype, normalised_ndim, eps, activation, max_params):
    who = f"`{primitive}`"
    x_shape = tuple(int(s) for s in x_shape)
    if isinstance(normalised_ndim, bool) or not isinstance(normalised_ndim, (int, np.integer)):
        raise ArgumentError(f"{who}: normalised_ndim must be an int (how many trailing axes are normalised "
                            f"together), got {normalised_ndim!r}")
    k = int(normalised_ndim)
    if not 1 <= k <= len(x_shape):
        raise ShapeError(f"{who}: normalised_ndim={k} trailing axes, but x has shape {x_shape} "
                         f"({len(x_shape)} axes); normalise between 1 and {max(len(x_shape), 1)} trailing axes"
                         + (" (a 0-d x has nothing to normalise: reshape it to (1,))" if not x_shape else ""))
    if len(param_shapes) > max_params:
        names = "weight and bias" if max_params == 2 else "weight"
        raise ShapeError(f"{who} takes x and at most {names}, got {1 + len(param_shapes)} inputs")
    normalised = x_shape[len(x_shape) - k:]
    for name, shape in zip(("weight", "bias"), param_shapes):
        shape = tuple(int(s) for s in shape)
        if shape != normalised:
            raise ShapeError(f"{who}: {name} has shape {shape}, but x {x_shape} normalised over its last {k} "
                             f"axes needs {name} of shape {normalised} (the normalised shape); give it that "
                             f"shape, or normalise over the trailing axes of shape {shape}")
    dtype = as_dtype(dtype)
    if eps is None:
        if primitive != "rmsnorm":
            raise ArgumentError(f"{who}: eps must be a finite number, got None")
        eps = machine_eps(dtype)
    return RowNormSpec(primitive=primitive, x_shape=x_shape, normalised_ndim=k, dtype=dtype,
                       compute_dtype=compute_dtype(dtype), eps=_check_eps(eps, who),
                       params=len(param_shapes), activation=_check_activation(activation, who))


@functools.lru_cache(maxsize=1024)
def layernorm_spec(x_shape, param_shapes, dtype, normalised_ndim=1, eps=1e-5, activation="identity"):
    """The spec of a layernorm of ``x`` with ``param_shapes`` = the shapes of
    the given (weight[, bias]); raises ShapeError when they do not fit."""
    return _row_spec("layernorm", x_shape, tuple(param_shapes), dtype, normalised_ndim, eps, activation, 2)


@functools.lru_cache(maxsize=1024)
def rmsnorm_spec(x_shape, param_shapes, dtype, normalised_ndim=1, eps=None):
    """The spec of an rmsnorm of ``x`` with ``param_shapes`` = the shapes of
    the given (weight,); ``eps=None`` resolves to :func:`machine_eps`."""
    return _row_spec("rmsnorm", x_shape, tuple(param_shapes), dtype, normalised_ndim, eps, "identity", 1)


# --- groupnorm and instance norm: rows of channel groups -------------------------------------------

@dataclass(frozen=True)
class GroupNormSpec:
    """A groupnorm of ``x`` (N, C, *spatial) over ``groups`` groups of channels
    (instance norm: groups = C), with its optional parameters and running statistics."""
    primitive: str           #: "groupnorm", "instancenorm_train" or "instancenorm_running_update"
    x_shape: tuple
    groups: int
    dtype: object
    compute_dtype: object
    eps: float
    params: int              #: how many of weight, bias are given (0, 1 or 2)
    running: int = 0         #: 0: no running statistics; 1: moved in place; 2: moved into moved_mean/var
    activation: str = "identity"

    @property
    def batch(self):
        """N."""
        return self.x_shape[0]

    @property
    def channels(self):
        """C."""
        return self.x_shape[1]

    @property
    def spatial_size(self):
        """S: the positions per sample and channel."""
        return math.prod(self.x_shape[2:])

    @property
    def channels_per_group(self):
        """C / G (1 for an instance norm of no channels: G = C = 0)."""
        return self.channels // self.groups if self.groups else 1

    @property
    def rows(self):
        """N * G: the groups of all samples, each normalised on its own."""
        return self.batch * self.groups

    @property
    def row_length(self):
        """M = (C / G) * S: the values of one sample's group."""
        return self.channels_per_group * self.spatial_size

    @property
    def has_weight(self):
        return self.params >= 1

    @property
    def has_bias(self):
        return self.params >= 2


def _x_channels(who, x_shape):
    x_shape = tuple(int(s) for s in x_shape)
    if len(x_shape) < 2:
        raise ShapeError(f"{who} needs x of shape (N, C, *spatial) (a batch of samples with channels on axis 1), "
                         f"got shape {x_shape}; add the missing axes (x of one sample: reshape to (1, C, ...))")
    return x_shape


def _per_channel(who, names, shapes, x_shape):
    c = x_shape[1]
    for name, shape in zip(names, shapes):
        shape = tuple(int(s) for s in shape)
        if shape != (c,):
            raise ShapeError(f"{who}: {name} must have one value per channel, shape ({c},) for x of shape "
                             f"{x_shape} (channels on axis 1), got shape {shape}")


@functools.lru_cache(maxsize=1024)
def groupnorm_spec(x_shape, param_shapes, dtype, groups, eps=1e-5, activation="identity"):
    """The spec of a groupnorm of ``x`` with ``groups`` groups and the
    given (weight[, bias]) of ``param_shapes``; raises ShapeError when the
    groups do not divide the channels or the parameters do not fit."""
    who = "`groupnorm`"
    x_shape = _x_channels(who, x_shape)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ArgumentError(f"{who}: groups must be a positive int, got {groups!r}")
    groups, c = int(groups), x_shape[1]
    if c % groups:
        divisors = [d for d in range(1, c + 1) if c % d == 0] if c else []
        raise ShapeError(f"{who}: {groups} groups do not divide the {c} channels of x {x_shape}; use a number of "
                         f"groups that divides {c} ({', '.join(map(str, divisors[:12]))}"
                         f"{', ...' if len(divisors) > 12 else ''})")
    if len(param_shapes) > 2:
        raise ShapeError(f"{who} takes x and at most weight and bias, got {1 + len(param_shapes)} inputs")
    _per_channel(who, ("weight", "bias"), param_shapes, x_shape)
    dtype = as_dtype(dtype)
    return GroupNormSpec(primitive="groupnorm", x_shape=x_shape, groups=groups, dtype=dtype,
                         compute_dtype=compute_dtype(dtype), eps=_check_eps(eps, who), params=len(param_shapes),
                         activation=_check_activation(activation, who))


def instancenorm_inputs(tensors, affine):
    """(weight-and-bias, running, moved) of instancenorm_train's inputs after
    ``x``: ``(weight, bias)`` first when ``affine``, then ``(running_mean,
    running_var)`` if given, then ``(moved_mean, moved_var)`` if given (each
    an empty tuple when absent). Raises ShapeError for another count."""
    tensors = tuple(tensors)
    params = tensors[:2] if affine else ()
    rest = tensors[len(params):]
    if len(params) != (2 if affine else 0) or len(rest) not in (0, 2, 4):
        first = "x, weight, bias" if affine else "x"
        counts = (3, 5, 7) if affine else (1, 3, 5)
        raise ShapeError(
            f"`instancenorm_train` with affine={bool(affine)} takes {first}, then optionally running_mean and "
            f"running_var, then optionally moved_mean and moved_var: {counts[0]}, {counts[1]} or {counts[2]} "
            f"inputs, got {1 + len(tensors)}")
    return params, rest[:2], rest[2:]


@functools.lru_cache(maxsize=1024)
def instancenorm_spec(x_shape, param_shapes, stat_shapes, dtype, eps=1e-5, activation="identity", moved=False,
                      primitive="instancenorm_train"):
    """The spec of an instance norm of ``x`` (N, C, *spatial): a groupnorm
    with one group per channel, with per-channel (weight, bias) of
    ``param_shapes`` (empty or two) and running statistics of
    ``stat_shapes`` (empty, two or, with ``moved``, four: running then moved)."""
    who = f"`{primitive}`"
    x_shape = _x_channels(who, x_shape)
    _per_channel(who, ("weight", "bias"), param_shapes, x_shape)
    names = ("running_mean", "running_var", "moved_mean", "moved_var")
    _per_channel(who, names, stat_shapes, x_shape)
    dtype = as_dtype(dtype)
    return GroupNormSpec(primitive=primitive, x_shape=x_shape, groups=x_shape[1], dtype=dtype,
                         compute_dtype=compute_dtype(dtype), eps=_check_eps(eps, who), params=len(param_shapes),
                         running=0 if not stat_shapes else (2 if moved else 1),
                         activation=_check_activation(activation, who))
