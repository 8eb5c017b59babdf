"""The layer base class: parameters are attributes holding Tensors."""
from .. import functor
from ..functor import holds_arrays
from ..show import layer_repr

__all__ = ["Layer"]

#: what a layer remembers in its ``__dict__`` about itself, dropped whenever an attribute is
#: set or deleted: ``_children_names`` (see ``_children``), ``_checked`` (its options, checked:
#: see :meth:`Layer._checked_options`) and ``_skeleton`` (its walk: ``triflux.skeleton``)
_REMEMBERED = ("_children_names", "_checked", "_skeleton")


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
        # every walk of a model (gradient, update, gpu, fmap, state) asks each layer for its
        # children, so the names are remembered until an attribute is set or deleted:
        # ``names`` hold an array, a layer or a tuple of them (re-checked: ``fmap`` may
        # put anything there), ``mutable`` are lists and dicts (re-checked: they can
        # gain arrays in place, ``chain.layers.append(...)``); the rest cannot change unseen
        d = vars(self)
        cached = d.get("_children_names")
        if cached is not None:
            names, mutable = cached
            kids = {k: d[k] for k in names if k in d and holds_arrays(d[k])}
            if len(kids) == len(names):
                if mutable:
                    return {k: d[k] for k in d if k in kids or (k in mutable and holds_arrays(d[k]))}
                return kids
        kids = {k: v for k, v in d.items() if k not in _REMEMBERED and holds_arrays(v)}
        mutable = frozenset(k for k, v in d.items() if k not in _REMEMBERED and isinstance(v, (list, dict)))
        d["_children_names"] = (tuple(k for k in kids if k not in mutable), mutable)
        return kids

    def __setattr__(self, name, value):
        functor.ATTRIBUTE_WRITES += 1      # remembered walks of models look again
        d = self.__dict__
        for key in _REMEMBERED:
            d.pop(key, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        functor.ATTRIBUTE_WRITES += 1
        d = self.__dict__
        for key in _REMEMBERED:
            d.pop(key, None)
        object.__delattr__(self, name)

    def _checked_options(self, check):
        """``check(self)``: the layer's options (stride, padding, ...) checked
        and normalised, as its call passes them on, remembered until an
        attribute is set or deleted (a call checks them once, not per call)."""
        d = vars(self)
        options = d.get("_checked")
        if options is None:
            options = d["_checked"] = check(self)
        return options

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
