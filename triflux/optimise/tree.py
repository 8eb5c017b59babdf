"""The optimiser state tree: the model's shape with a :class:`Leaf` at
every trainable array.

The tree (API.md "Structure") is a dict keyed by child name for a layer, a
list for lists (``Chain``'s ``layers``), a :class:`Leaf` at each trainable
array and ``None`` elsewhere. Leaves are dicts, so ``gpu(opt_state)`` /
``cpu(opt_state)`` move optimiser state like any other structure, and
``state`` / ``loadmodel`` save and restore it.
"""
from .. import dtypes as _dt
from ..errors import StructureError
from ..functor import children, is_layer
from ..tensor import Tensor
from .rules import Rule

class Leaf(dict):
    """The optimiser state of one trainable array: ``leaf.rule`` and
    ``leaf.state`` (Optimisers.jl's ``Leaf``). A dict underneath
    (``{"rule": ..., "state": ...}``) so that ``fmap``, ``gpu``, ``cpu`` and
    ``get_device`` see the state arrays inside it."""
    __hash__ = object.__hash__

    def __init__(self, rule=None, state=None, **kw):
        if isinstance(rule, Rule) or rule is None and not kw:
            super().__init__(rule=rule, state=state)
        else:  # dict-style construction, as fmap rebuilds it: Leaf(pairs)
            super().__init__(rule, **kw)
        if set(self) != {"rule", "state"}:
            raise StructureError(f"a Leaf holds exactly `rule` and `state`, got keys {sorted(self)}")

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    @property
    def rule(self):
        return self["rule"]

    @rule.setter
    def rule(self, r):
        self["rule"] = r

    @property
    def state(self):
        return self["state"]

    @state.setter
    def state(self, s):
        self["state"] = s

    def __repr__(self):
        return f"Leaf({self.rule!r}, {state_repr(self.state)})"


def state_repr(s):
    if isinstance(s, Tensor):
        dims = "×".join(map(str, s.shape)) if s.ndim else "0-d"
        return f"{dims} Tensor{{{s.dtype}}}"
    if isinstance(s, tuple):
        return "(" + ", ".join(state_repr(e) for e in s) + ")"
    return repr(s)


def show_path(path):
    return path or "(the model itself)"


def is_trainable(x):
    return isinstance(x, Tensor) and _dt.is_floating(x.dtype)


def mirror_trainables(x, at):
    """``x``'s structure with ``at(t)`` at every trainable Tensor ``t`` and
    None at everything else (a layer's ``_nontrainable`` children, integer
    buffers, functions); a dict for a layer, a list for a list or tuple."""
    if isinstance(x, Tensor):
        return at(x) if is_trainable(x) else None
    if is_layer(x):
        skip = type(x)._nontrainable
        return {name: (None if name in skip else mirror_trainables(v, at)) for name, v in children(x).items()}
    if isinstance(x, (list, tuple)):
        return [mirror_trainables(v, at) for v in x]
    if isinstance(x, dict):
        return {k: mirror_trainables(v, at) for k, v in x.items()}
    return None


def trainables(model):
    """The trainable parameters of ``model`` (Flux's and Optimisers.jl's
    ``trainables``): a list of its floating-point Tensors, depth first in
    definition order, each once (a tied parameter once), without the state a
    layer does not train (its ``_nontrainable`` children: BatchNorm's running
    statistics). These are the Tensors ``setup`` gives optimiser state::

        n = sum(p.size for p in trainables(model))   # the number of parameters"""
    found = {}
    mirror_trainables(model, lambda t: found.setdefault(id(t), t))
    return list(found.values())


def state_tensors(s):
    if isinstance(s, Tensor):
        return [s]
    if isinstance(s, (tuple, list)):
        return [a for e in s for a in state_tensors(e)]
    return []
