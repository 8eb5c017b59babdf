"""A model's skeleton: one walk of its structure, remembered while the
structure stays the same.

Every training step walks the model several times: ``gradient`` to find the
arrays to watch and to shape the gradient like the model, ``update`` to pair
each parameter with its gradient and optimiser state. The structure (which
layers hold which arrays, in which lists and dicts) rarely changes between
steps, so :func:`skeleton` walks a layer once and keeps what it found:

* ``leaves``: its array leaves, depth first, each once (``functor.leaves``);
* ``recipe``: its shape as nested tuples, read by the walks that follow it
  (``autodiff``'s gradient tree, the optimiser's plan) without asking each
  object what it is;
* the *edges* it went through (each child of a layer, each item of a list
  or dict, with the object found there) and the size of each container.

``Skeleton.current()`` says whether it still describes the model: no layer
attribute set or deleted since (``functor.ATTRIBUTE_WRITES``), every
container the same size and every edge leading to the same object. That
sees ``chain.layers.append(...)``, ``model.weight = new`` and a child
replaced behind the layer's back alike. A Tensor's storage may change
(moved BatchNorm statistics, a cast in place): the skeleton holds Tensors,
not their storage, so readers look at the storage every time.

Only layers have skeletons (a tuple or dict of arrays is walked as before);
a structure that contains itself has none (the walks raise their errors). A
layer keeps its skeleton in its ``__dict__`` (``_skeleton``, with the other
things ``Layer`` remembers about itself), so it lives and dies with the
model; a copy of the layer (``fmap``, ``copy.copy``) or a pickled one walks
its own.
"""
import weakref

import numpy as np

from . import functor
from .tensor import Tensor

#: recipe node kinds (the first entry of a node)
TENSOR, ARRAY, LAYER, LIST, TUPLE, DICT, OTHER = range(7)

_MISSING = object()


def _forgotten():
    return None


class Skeleton:
    """What one walk of a layer found: ``recipe``, ``leaves`` and the edges
    that :meth:`current` checks (see the module). The model's own
    attributes are reached through ``owner``, a weak reference: the skeleton
    lives in them, and a strong one would keep the model's memory alive
    until the garbage collector finds the cycle."""
    __slots__ = ("owner", "recipe", "leaves", "writes", "sizes", "edges", "items", "own_size", "own_edges")

    def __init__(self, model):
        self.owner = weakref.ref(model)
        self.writes = functor.ATTRIBUTE_WRITES
        self.sizes, self.edges, self.items = [], [], []    # edges of dicts (and layers), items of lists
        leaves, seen = [], set()
        kids = functor.children(model)
        self.own_size, self.own_edges = len(vars(model)), tuple(kids.items())
        self.recipe = (LAYER, tuple((name, self._node(v, leaves, seen)) for name, v in kids.items()),
                       frozenset(type(model)._nontrainable))
        self.leaves = leaves

    def _node(self, x, leaves, seen):
        """The recipe of ``x``; appends its new leaves and records its edges."""
        if isinstance(x, (Tensor, np.ndarray)):
            if id(x) not in seen:
                seen.add(id(x))
                leaves.append(x)
            return (TENSOR, x) if isinstance(x, Tensor) else (ARRAY, x)
        if functor.is_layer(x):
            kids = functor.children(x)
            d = vars(x)
            self.sizes.append((d, len(d)))
            self.edges.extend((d, name, v) for name, v in kids.items())
            return (LAYER, tuple((name, self._node(v, leaves, seen)) for name, v in kids.items()),
                    frozenset(type(x)._nontrainable))
        if isinstance(x, list):
            self.sizes.append((x, len(x)))
            self.items.extend((x, i, v) for i, v in enumerate(x))
            return (LIST, tuple(self._node(v, leaves, seen) for v in x))
        if isinstance(x, tuple):
            return (TUPLE, tuple(self._node(v, leaves, seen) for v in x), type(x))
        if isinstance(x, dict):
            self.sizes.append((x, len(x)))
            self.edges.extend((x, k, v) for k, v in x.items())
            return (DICT, tuple((k, self._node(v, leaves, seen)) for k, v in x.items()), type(x))
        return (OTHER,)

    def __reduce__(self):      # a skeleton is not data: a pickled (or deep-copied) model forgets it
        return _forgotten, ()

    def current(self):
        """Whether the structure is still the one walked (see the module)."""
        if functor.ATTRIBUTE_WRITES != self.writes:
            return False
        own = vars(self.owner())
        if len(own) != self.own_size:
            return False
        for name, value in self.own_edges:
            if own.get(name, _MISSING) is not value:
                return False
        for container, size in self.sizes:
            if len(container) != size:
                return False
        for container, key, value in self.edges:
            if container.get(key, _MISSING) is not value:
                return False
        for container, index, value in self.items:
            if container[index] is not value:
                return False
        return True


def skeleton(model):
    """The :class:`Skeleton` of the layer ``model``, walked again only when
    its structure changed; None for anything else (not a layer, or a layer
    that contains itself)."""
    if not functor.is_layer(model):
        return None
    d = getattr(model, "__dict__", None)
    if d is None:
        return None
    found = d.get("_skeleton")
    if found is not None and found.owner() is model and found.current():
        return found
    d["_skeleton"] = None       # (in place before the walk counts the layer's attributes)
    try:
        found = Skeleton(model)
    except RecursionError:      # a structure that contains itself: the walks say so
        return None
    d["_skeleton"] = found
    return found
