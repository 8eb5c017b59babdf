"""Which activation a layer hands to its primitive, to be applied in the
primitive's own kernel: ``Conv(..., relu)`` is one ``conv2d_bias_act``,
``Dense(..., relu)`` one ``dense_bias_act`` and ``BatchNorm(C, relu)`` one
``batchnorm_train``, with no launch for the relu
(forward or backward). A primitive declares the activations it can apply as
``fusable_activations`` in its registration (those whose derivative follows
from the output); any other activation runs after it, as its own primitive."""
import functools

from .. import activations
from ..primitives import REGISTRY

__all__ = []


@functools.lru_cache(maxsize=None)
def _fusable(primitive):
    """id(activation function) -> its name, for ``primitive``'s fusable activations."""
    return {id(getattr(activations, name)): name for name in REGISTRY[primitive].fusable_activations}


def fused_activation(activation, primitive):
    """The name of ``activation`` (a function) when ``primitive`` applies it
    itself, else None. Matched by identity: a user's activation need not be
    hashable, and a lookalike function is not fused."""
    return _fusable(primitive).get(id(activation))
