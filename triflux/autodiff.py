"""Reverse-mode automatic differentiation with a tape (``triflux.tape``)
that exists only while ``gradient`` runs.

``gradient(f, *args)`` watches every floating Tensor inside ``args`` (a
tensor, a layer, a model, nested tuples/lists/dicts), runs ``f`` while
``triflux.dispatch.apply`` records each primitive applied to a watched
tensor or to a result of one, then walks the records backwards calling
each primitive's backward (reference on the CPU, kernel on a GPU) and
summing the gradients of tensors used more than once. Outside ``gradient`` nothing is recorded and
no tensor keeps a reference to any graph.

Gradients mirror their argument (API.md "Structure"): a Tensor for a
Tensor, a dict keyed by field name for a layer, a list for ``Chain``'s
``layers``, ``None`` where there is no gradient.
"""
import numpy as np

from . import functor, tape
from .constructors import fill
from .dispatch import implementation
from .dtypes import is_floating
from .errors import GradientError
from .primitives import REGISTRY
from .tensor import Tensor, as_tensor


def _watchable(t):
    return is_floating(t.dtype)


def backprop(recording, out, seed):
    """Gradients of ``out`` (seeded with ``seed``) for every live tensor of
    the tape ``recording``, as a dict from ``id(tensor)`` to backend arrays."""
    grads = {id(out): seed}
    live = recording.live
    for prim, inputs, y, attrs in reversed(recording.nodes):
        g = grads.pop(id(y), None)
        if g is None:
            continue
        backward = implementation(prim, y._device, "backward")
        if prim.partial_backward:
            needs = tuple(id(t) in live for t in inputs)
            gin = backward(g, y._data, *[t._data for t in inputs], needs=needs, **attrs)
        else:
            gin = backward(g, y._data, *[t._data for t in inputs], **attrs)
        for t, gi in zip(inputs, gin):
            if gi is None or id(t) not in live:
                continue
            prev = grads.get(id(t))
            grads[id(t)] = gi if prev is None else implementation(REGISTRY["add"], y._device)(prev, gi)
    return grads


def withgradient(f, *args):
    """``(value, grads)``: the value of ``f(*args)`` (a scalar Tensor) and
    one gradient per argument, shaped like it."""
    args = tuple(as_tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    watched = [t for a in args for t in functor.leaves(a) if isinstance(t, Tensor) and _watchable(t)]
    recording = tape.Tape(watched)
    outer, tape.TAPE = tape.TAPE, recording
    try:
        y = f(*args)
    finally:
        tape.TAPE = outer
    if not isinstance(y, Tensor):
        raise GradientError(
            f"`gradient`: the function returned {type(y).__name__}, not a scalar Tensor; "
            "return the loss as a Tensor (e.g. `mse(model(x), y)`, or `sum(...)`)")
    if y.size != 1:
        raise GradientError(f"`gradient` needs a scalar loss, but the function returned a Tensor of shape {y.shape}; "
                            "reduce it first, e.g. with `.sum()` or `.mean()`")
    if not is_floating(y.dtype):
        raise GradientError(f"`gradient`: the loss has dtype {y.dtype}; it must be floating point")
    seed = fill(y.shape, 1, y.dtype, y.device)._data
    grads = backprop(recording, y, seed) if id(y) in recording.live else {}
    return y, tuple(_mirror(a, grads) for a in args)


def gradient(f, *args):
    """The gradients of scalar ``f(*args)`` with respect to each argument, as
    a tuple (Flux's ``gradient``)."""
    return withgradient(f, *args)[1]


def _mirror(x, grads):
    """The gradient tree for ``x``: its structure with gradients at the arrays."""
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
