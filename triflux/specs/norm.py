"""The batch-norm spec: the channel geometry of ``x`` (N, C, ...).

Statistics are per channel ``c``, over the batch axis and every spatial
position: M = N * S values per channel, S = prod(spatial) (1 for (N, C)).
The per-channel vectors (``gamma``, ``beta``, and the given ``mean``, ``var``
of ``batchnorm_test``) have shape (C,).
"""
import functools
import math
from dataclasses import dataclass

from ..dtypes import as_dtype, compute_dtype
from ..errors import ShapeError
from ..primitives import REGISTRY

#: the activations batchnorm_train and batchnorm_test apply in their own kernels
FUSABLE_ACTIVATIONS = REGISTRY["batchnorm_train"].fusable_activations


@dataclass(frozen=True)
class BatchNormSpec:
    """The geometry of a batch normalisation of ``x`` (see the module docstring)."""
    x_shape: tuple
    dtype: object            #: x's NumPy dtype
    compute_dtype: object    #: the dtype statistics and results are computed in
    eps: float
    activation: str = "identity"   #: applied to the normalised output (one of FUSABLE_ACTIVATIONS)

    def __hash__(self):
        # a spec keys the kernels' host plans on every launch: hashed once (from numbers only,
        # so a copy from another process hashes alike)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.x_shape, self.eps))
            object.__setattr__(self, "_hash", h)
        return h

    @functools.cached_property
    def channels(self):
        """C."""
        return self.x_shape[1]

    @functools.cached_property
    def spatial_size(self):
        """S: the positions per sample and channel."""
        return math.prod(self.x_shape[2:])

    @functools.cached_property
    def values_per_channel(self):
        """M = N * S: the values each channel's statistics are taken over."""
        return self.x_shape[0] * self.spatial_size

    @property
    def reduced_axes(self):
        """The axes statistics are taken over: 0 and every spatial axis."""
        return (0,) + tuple(range(2, len(self.x_shape)))

    @property
    def channel_shape(self):
        """(1, C, 1, ...): a per-channel vector reshaped to broadcast against x."""
        return (1, self.channels) + (1,) * (len(self.x_shape) - 2)


@functools.lru_cache(maxsize=1024)
def batchnorm_spec(x_shape, channel_shapes, dtype, eps, activation="identity"):
    """The spec of a batch norm of ``x`` with per-channel vectors of
    ``channel_shapes`` (gamma, beta[, mean, var]); raises ShapeError when
    they do not fit ``x`` and ValueError for a negative ``eps`` or an
    activation it cannot fuse."""
    x_shape = tuple(int(s) for s in x_shape)
    if len(x_shape) < 2:
        raise ShapeError(f"batch norm needs x of shape (N, C, ...), got shape {x_shape}")
    c = x_shape[1]
    for shape in channel_shapes:
        shape = tuple(int(s) for s in shape)
        if shape != (c,):
            raise ShapeError(f"batch norm: per-channel parameters must have shape ({c},), "
                             f"got {shape} for x of shape {x_shape}")
    eps = float(eps)
    if not eps >= 0:
        raise ValueError(f"batch norm: eps must be >= 0, got {eps}")
    if activation not in FUSABLE_ACTIVATIONS:
        raise ValueError(f"batch norm: activation {activation!r} is not one it applies itself "
                         f"({', '.join(FUSABLE_ACTIVATIONS)}); apply it to the output instead")
    dtype = as_dtype(dtype)
    return BatchNormSpec(x_shape=x_shape, dtype=dtype, compute_dtype=compute_dtype(dtype), eps=eps,
                         activation=activation)
