"""Train and test mode, as in Flux.

Layers with an ``active`` attribute (Dropout, BatchNorm) behave as in
training inside ``gradient`` and as in testing outside, unless pinned:
``trainmode(model)`` forces training behaviour, ``testmode(model)`` test
behaviour, ``trainmode(model, None)`` returns to automatic. Both mutate the
model's layers and return the model.
"""
from .functor import children, is_layer
from .tape import in_gradient


def _set(x, value):
    if is_layer(x):
        if "active" in vars(x):
            x.active = value
        for c in children(x).values():
            _set(c, value)
    elif isinstance(x, (list, tuple)):
        for c in x:
            _set(c, value)
    elif isinstance(x, dict):
        for c in x.values():
            _set(c, value)
    return x


def trainmode(model, mode=True):
    """Pin ``model``'s Dropout/BatchNorm to training behaviour (``mode=True``),
    test behaviour (``False``) or automatic (``None``). Mutates and returns it."""
    return _set(model, mode)


def testmode(model, mode=True):
    """Pin ``model``'s Dropout/BatchNorm to test behaviour (``mode=True``);
    ``testmode(model, None)`` returns to automatic. Mutates and returns it."""
    return _set(model, None if mode is None else not mode)


def is_active(layer):
    """Whether ``layer`` should behave as in training now."""
    active = getattr(layer, "active", None)
    return in_gradient() if active is None else bool(active)
