"""The layer base class: parameters are attributes holding Tensors."""
from ..functor import holds_arrays
from ..show import layer_repr

__all__ = ["Layer"]


class Layer:
    """Base class of layers. A layer's children are its attributes that hold
    Tensors or other layers (in definition order); ``gpu``/``cpu``, ``fmap``,
    ``gradient``, ``state`` and the optimisers all walk them.

    ``_nontrainable`` names children that hold state but are not trained
    (BatchNorm's running statistics); ``_big_show`` makes a container print
    as a block of its layers, one per line (Chain, as Flux)."""
    _nontrainable = ()
    _big_show = False

    def _children(self):
        return {k: v for k, v in vars(self).items() if holds_arrays(v)}

    def __repr__(self):
        return layer_repr(self)

    def _signature(self):
        """The part inside ``Name(...)`` when printed (override per layer)."""
        return ""


def layer_name(layer):
    """The layer's Flux-style one-line repr (without the parameter count)."""
    try:
        text = repr(layer)
    except Exception:  # printing must never hide the real error
        return type(layer).__name__
    first = text.splitlines()[0] if text else type(layer).__name__
    return first.split("  #")[0].rstrip()
