"""Walking structures of arrays (Functors.jl's ``fmap``, in Python).

A structure is a Tensor or NumPy array (a leaf), a tuple/list/dict of
structures, or a layer: any object whose class defines ``_children()``, the
attributes that hold structures (``triflux.layers.Layer`` does, for every
layer). ``fmap`` rebuilds a structure with a function applied to every
leaf; layers are copied, never mutated.
"""
import copy

import numpy as np

from .errors import StructureError
from .tensor import Tensor

#: attributes set or deleted on any layer so far (``Layer`` counts them): a walk
#: remembered since (``triflux.skeleton``, a captured step's guards) may be out of date
ATTRIBUTE_WRITES = 0


def is_layer(x):
    """Whether ``x`` is a layer (its class defines ``_children``)."""
    return hasattr(type(x), "_children")


def is_leaf(x):
    return isinstance(x, (Tensor, np.ndarray))


def holds_arrays(x):
    """Whether the structure ``x`` holds any array or layer."""
    if is_leaf(x) or is_layer(x):
        return True
    if isinstance(x, (list, tuple)):
        return any(holds_arrays(e) for e in x)
    if isinstance(x, dict):
        return any(holds_arrays(e) for e in x.values())
    return False


def path_join(path, key):
    """The path of child ``key`` below ``path``, as written in error
    messages: ``layers[1].weight``, ``opt['x']``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def children(layer):
    """The attributes of ``layer`` that hold arrays or other layers, in
    definition order: ``{"weight": ..., "bias": ...}``."""
    return layer._children()


def fmap(f, x):
    """``x`` rebuilt with ``f`` applied to every array leaf (a Tensor or a
    NumPy array): Functors.jl's ``fmap``. ``x`` is any structure: a leaf,
    tuples, lists and dicts of structures, or a layer, which is copied with
    its children mapped (the original is not changed); anything else (a
    function, a number) is kept. ``gpu``, ``f32`` and friends are fmaps.
    A structure that contains itself is a ``StructureError``::

        halved = fmap(lambda t: t * 0.5, model)      # a new model, weights halved
    """
    return acyclic(lambda v: _fmap(f, v), x, lambda: "fmap")


def _fmap(f, x):
    if is_leaf(x):
        return f(x)
    if is_layer(x):
        new = copy.copy(x)
        for name, v in children(x).items():
            object.__setattr__(new, name, _fmap(f, v))
        return new
    if isinstance(x, tuple):
        items = [_fmap(f, v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, list):
        return [_fmap(f, v) for v in x]
    if isinstance(x, dict):
        return type(x)((k, _fmap(f, v)) for k, v in x.items())
    return x


def cycle_path(x, path="x"):
    """Where ``x`` contains itself: ``(inner, outer)``, two paths of one
    list, tuple, dict or layer, ``inner`` inside ``outer`` (``("x[1]",
    "x")`` for ``x = [a]; x.append(x)``); ``None`` when there is no cycle."""
    on_path = {}

    def walk(v, where):
        if is_layer(v):
            items = children(v).items()
        elif isinstance(v, (list, tuple)):
            items = enumerate(v)
        elif isinstance(v, dict):
            items = v.items()
        else:
            return None
        if id(v) in on_path:
            return where, on_path[id(v)]
        on_path[id(v)] = where
        for key, c in items:
            found = walk(c, path_join(where, key))
            if found is not None:
                return found
        del on_path[id(v)]
        return None
    return walk(x, path)


def acyclic(walk, x, who):
    """``walk(x)``, a recursion over the structure ``x``; a structure that
    contains itself is a ``StructureError`` (``who()`` names the call), not
    a RecursionError."""
    try:
        return walk(x)
    except RecursionError:
        cycle = cycle_path(x)
        if cycle is None:
            raise
    inner, outer = cycle
    raise StructureError(f"{who()}: the structure contains itself ({inner} is {outer}), so walking it never "
                         "ends; give a structure without cycles (a model that holds a layer, not itself)")


def leaves(x):
    """Every array leaf of ``x``, depth first, each once."""
    out = []
    _add_leaves(x, out, set())
    return out


def _add_leaves(v, out, seen):
    """Append to ``out`` the array leaves of ``v`` whose ids are not in ``seen``.
    (Module-level: a nested function calling itself is a reference cycle,
    which would hold the leaves until the garbage collector runs.)"""
    if is_leaf(v):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    elif is_layer(v):
        for c in children(v).values():
            _add_leaves(c, out, seen)
    elif isinstance(v, (tuple, list)):
        for c in v:
            _add_leaves(c, out, seen)
    elif isinstance(v, dict):
        for c in v.values():
            _add_leaves(c, out, seen)
