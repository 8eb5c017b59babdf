"""Train and test mode, as in Flux, and the state a training step moves.

Layers with an ``active`` attribute (Dropout, BatchNorm) behave as in
training inside ``gradient`` and as in testing outside, unless pinned:
``trainmode(model)`` forces training behaviour, ``testmode(model)`` test
behaviour, ``trainmode(model, None)`` returns to automatic. Both mutate the
model's layers and return the model.

A training-mode forward also moves state in place (BatchNorm's running
statistics). Inside :func:`all_or_nothing` (``gradient`` and each step of
``train`` open one) the moved values go to new memory, which replaces the
originals only when the block completes, so a step that fails
(any exception: a NaN loss in ``train``, a shape error, running out of
memory) leaves the state exactly as it was. Outside such a block it moves
in place at once, as in Flux.
"""
import contextlib

from .constructors import empty_like
from .functor import children, is_layer
from .tape import in_gradient

#: the open block's moved state, ``{id(original): (original, moved)}``; None outside a block
_STAGED = None


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


@contextlib.contextmanager
def all_or_nothing():
    """A block in which state moved through :func:`moving` replaces the
    originals if the block completes and is dropped if it raises. A block
    inside another is part of the outer one. Yields the moved state so far,
    ``{id(original): (original, moved)}`` (the outer block's, inside one)."""
    global _STAGED
    if _STAGED is not None:
        yield _STAGED
        return
    _STAGED = block = {}
    try:
        yield block
    finally:
        _STAGED = None
    for original, moved in block.values():   # only reached when the block completed
        original._data = moved._data


@contextlib.contextmanager
def moving(*state):
    """Move the state Tensors ``state`` (BatchNorm's running statistics) in
    a training-mode forward: yields ``(sources, targets)``; the block reads
    ``sources`` and writes the moved values into ``targets`` (None: into the
    sources, in place), all in its own launches. Outside
    :func:`all_or_nothing` that is ``state`` itself, in place. Inside, the
    first time it is new memory (no launch fills it: the block writes every
    element), which replaces ``state`` when the step completes; after that
    the same memory again, in place, so a layer called twice moves twice. The
    new memory counts only if this block completes."""
    if _STAGED is None:
        yield state, None
        return
    pending = [_STAGED.get(id(t)) for t in state]
    if all(p is not None for p in pending):
        yield tuple(moved for _, moved in pending), None
        return
    targets = tuple(empty_like(t) for t in state)
    yield state, targets
    for t, moved in zip(state, targets):
        _STAGED[id(t)] = (t, moved)
