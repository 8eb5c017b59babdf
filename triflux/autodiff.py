"""Reverse-mode automatic differentiation with a tape that exists only
while ``gradient`` runs.

``gradient(f, *args)`` watches every floating Tensor inside ``args`` (a
tensor, a layer, a model, nested tuples/lists/dicts), runs ``f`` while
``triflux.ops`` records each primitive applied to a watched tensor or to a
result of one, then walks the records backwards calling each primitive's
backward (reference on the CPU, kernel on a GPU) and summing the gradients
of tensors used more than once. Outside ``gradient`` nothing is recorded and
no tensor keeps a reference to any graph.

Gradients mirror their argument (API.md "Structure"): a Tensor for a
Tensor, a dict keyed by field name for a layer, a list for ``Chain``'s
``layers``, ``None`` where there is no gradient.
"""
import numpy as np

from . import functor
from .dtypes import is_floating
from .errors import GradientError

#: the tape in use, or None outside ``gradient`` (a module global: cheap to test)
TAPE = None


class Tape:
    __slots__ = ("live", "nodes")

    def __init__(self, watched):
        self.live = {id(t) for t in watched}
        self.nodes = []

    def record(self, prim, inputs, out, attrs):
        live = self.live
        for t in inputs:
            if id(t) in live:
                self.nodes.append((prim, inputs, out, attrs))
                live.add(id(out))
                return


def in_gradient():
    """True while ``gradient`` is recording (layers use it for train mode)."""
    return TAPE is not None


def _watchable(t):
    return is_floating(t.dtype)


def _add_impl(on_cpu):
    from .registry import REGISTRY
    return REGISTRY["add"].impl(on_cpu)


def backprop(tape, out, seed):
    """Gradients of ``out`` (seeded with ``seed``) for every live tensor,
    as a dict from ``id(tensor)`` to backend arrays."""
    grads = {id(out): seed}
    for prim, inputs, y, attrs in reversed(tape.nodes):
        g = grads.pop(id(y), None)
        if g is None:
            continue
        on_cpu = y._device.is_cpu
        backward = prim.impl(on_cpu, "backward")
        if prim.partial_backward:
            needs = tuple(id(t) in tape.live for t in inputs)
            gin = backward(g, y._data, *[t._data for t in inputs], needs=needs, **attrs)
        else:
            gin = backward(g, y._data, *[t._data for t in inputs], **attrs)
        for t, gi in zip(inputs, gin):
            if gi is None or id(t) not in tape.live:
                continue
            prev = grads.get(id(t))
            grads[id(t)] = gi if prev is None else _add_impl(on_cpu)(prev, gi)
    return grads


def withgradient(f, *args):
    """``(value, grads)``: the value of ``f(*args)`` (a scalar Tensor) and
    one gradient per argument, shaped like it."""
    global TAPE
    from .tensor import Tensor
    from . import ops

    args = tuple(ops.as_tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    watched = [t for a in args for t in functor.leaves(a) if isinstance(t, Tensor) and _watchable(t)]
    tape = Tape(watched)
    outer, TAPE = TAPE, tape
    try:
        y = f(*args)
    finally:
        TAPE = outer
    if not isinstance(y, Tensor):
        raise GradientError(
            f"`gradient`: the function returned {type(y).__name__}, not a scalar Tensor; "
            "return the loss as a Tensor (e.g. `mse(model(x), y)`, or `sum(...)`)")
    if y.size != 1:
        raise GradientError(f"`gradient` needs a scalar loss, but the function returned a Tensor of shape {y.shape}; "
                            "reduce it first, e.g. with `.sum()` or `.mean()`")
    if not is_floating(y.dtype):
        raise GradientError(f"`gradient`: the loss has dtype {y.dtype}; it must be floating point")
    seed = ops.fill(y.shape, 1, y.dtype, y.device)._data
    grads = backprop(tape, y, seed) if id(y) in tape.live else {}
    return y, tuple(_mirror(a, grads) for a in args)


def gradient(f, *args):
    """The gradients of scalar ``f(*args)`` with respect to each argument, as
    a tuple (Flux's ``gradient``)."""
    return withgradient(f, *args)[1]


def _mirror(x, grads):
    """The gradient tree for ``x``: its structure with gradients at the arrays."""
    Tensor = functor._classes()[0]
    if isinstance(x, Tensor):
        g = grads.get(id(x))
        return None if g is None else Tensor._make(g, x._device)
    if functor.is_layer(x):
        return {name: _mirror(v, grads) for name, v in functor.children(x).items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_mirror(v, grads) for v in x) if not hasattr(x, "_fields") else \
            type(x)(*[_mirror(v, grads) for v in x])
    if isinstance(x, dict):
        return {k: _mirror(v, grads) for k, v in x.items()}
    return None
