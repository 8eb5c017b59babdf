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
``layers``, ``None`` where there is no gradient. A layer is walked along its
skeleton (``triflux.skeleton``), remembered while its structure is unchanged.
"""
import functools
import types
import warnings

import numpy as np

from . import functor, tape
from .constructors import fill
from .dispatch import implementation
from .dtypes import holds_floats, is_floating
from .errors import GradientError
from .modes import all_or_nothing
from .primitives import REGISTRY
from .reference._util import keeping_for_backward
from .skeleton import DICT, LAYER, LIST, TENSOR, TUPLE, skeleton
from .tensor import Tensor, as_tensor


def backprop(recording, out, seed):
    """Gradients of ``out`` (seeded with ``seed``) for every live tensor of
    the tape ``recording``, as a dict from ``id(tensor)`` to backend arrays."""
    grads = {id(out): seed}
    live = recording.live
    backwards = {}       # (primitive, on the CPU?) -> its backward there, found once per call
    for prim, inputs, y, attrs in reversed(recording.nodes):
        g = grads.pop(id(y), None)
        if g is None:
            continue
        device = y._device
        backward = backwards.get((prim, device.is_cpu))
        if backward is None:
            backward = backwards[prim, device.is_cpu] = implementation(prim, device, "backward")
        if prim.partial_backward:
            needs = tuple([id(t) in live for t in inputs])
            gin = backward(g, y._data, *[t._data for t in inputs], needs=needs, **attrs)
        else:
            gin = backward(g, y._data, *[t._data for t in inputs], **attrs)
        for t, gi in zip(inputs, gin):
            if gi is None or id(t) not in live:
                continue
            prev = grads.get(id(t))
            grads[id(t)] = gi if prev is None else implementation(REGISTRY["add"], device)(prev, gi)
    return grads


def withgradient(f, *args):
    """``(value, grads)``: the value of ``f(*args)`` (a scalar Tensor) and
    one gradient per argument, shaped like it (Flux's ``withgradient``).

    Gradients are taken with respect to the floating-point Tensors in
    ``args`` (NumPy arrays become Tensors; layers, models, tuples, lists and
    dicts are searched). An argument with none gets ``None``; when no
    argument has any, ``GradientError`` says what to pass. A Python float or
    list of numbers beside other arguments gets ``None`` with a warning (pass
    ``tensor(...)`` to differentiate it), and so does every argument, with a
    warning naming the likely cause, when the value does not depend on them
    (it left the tape through ``.numpy()``, ``float(...)``, an integer Tensor
    or ``ignore_derivatives``). Second-order gradients (``gradient`` inside
    ``f``) are not supported: ``GradientError``.

    The call is all or nothing: state that ``f`` moves in training mode
    (BatchNorm's running statistics) changes only if it returns normally."""
    return _advised("withgradient", f, args)


def gradient(f, *args):
    """The gradients of scalar ``f(*args)`` with respect to each argument, as
    a tuple (Flux's ``gradient``; see :func:`withgradient`)::

        (g,) = gradient(lambda m: mse(m(x), y), model)   # g mirrors model's fields"""
    return _advised("gradient", f, args)[1]


def _advised(who, f, args):
    """:func:`differentiate`, warning where a gradient is ``None`` that the
    caller probably meant to have."""
    y, grads, connected = differentiate(f, args, who)
    for i, a in enumerate(args):
        if _python_numbers(a) and any(isinstance(v, float) for v in _flat(a)):
            warnings.warn(
                f"`{who}`: argument {i} is a Python {type(a).__name__}, not a Tensor, so its gradient is None. "
                "To differentiate with respect to it pass a Tensor (`tensor(...)`); to keep it a constant, "
                "close over it (`gradient(lambda x: f(x, c), x)`).", stacklevel=3)
    if not connected:
        warnings.warn(f"`{who}`: the value does not depend on the arguments' floating-point Tensors, so every "
                      f"gradient is None. {LEFT_THE_TAPE}", stacklevel=3)
    return y, grads


#: the usual ways a value stops depending on the arrays it was computed from
LEFT_THE_TAPE = ("Likely it left the tape: `.numpy()`, `.item()`, `float(...)` or `np.asarray(...)` of a Tensor, a "
                 "computation in integer Tensors, or `ignore_derivatives`/`.detach()` make constants; compute it "
                 "with triflux operations (e.g. `mse(model(x), y)`).")


def differentiate(f, args, who="gradient"):
    """``(value, grads, connected)``: ``f(*args)``, the gradient tuple, and
    whether the value depends on any watched Tensor; :func:`withgradient`
    without its warnings (``train`` raises instead). ``who`` names the
    caller in errors."""
    if tape.TAPE is not None:
        raise GradientError(
            f"`{who}` was called while another `gradient` is recording (inside the function being "
            "differentiated): second-order gradients are not supported in triflux. Take each gradient "
            "on its own, outside the other.")
    args = tuple(as_tensor(a) if isinstance(a, np.ndarray) else a for a in args)
    shapes = [skeleton(a) for a in args]      # each layer walked once, or remembered
    watched = [t for a, shape in zip(args, shapes) for t in (functor.leaves(a) if shape is None else shape.leaves)
               if isinstance(t, Tensor) and holds_floats(t._data.dtype)]
    if not watched:
        raise GradientError(_nothing_to_differentiate(who, args))
    with all_or_nothing():
        recording = tape.Tape(watched)
        tape.TAPE = recording
        try:
            with keeping_for_backward():    # the CPU reference's forwards keep what their backward reads
                y = f(*args)
        finally:
            tape.TAPE = None
        if not isinstance(y, Tensor):
            raise GradientError(
                f"`{who}`: the function returned {type(y).__name__}, not a scalar Tensor; return the loss as a "
                "Tensor (e.g. `mse(model(x), y)`, or `sum(...)`): `.item()`, `float(...)` and `.numpy()` "
                "turn it into a constant with no gradient")
        if y.size != 1:
            raise GradientError(f"`{who}` needs a scalar loss, but the function returned a Tensor of shape "
                                f"{y.shape}; reduce it first, e.g. with `.sum()` or `.mean()`")
        if not is_floating(y.dtype):
            raise GradientError(f"`{who}`: the loss has dtype {y.dtype}; it must be floating point (an integer "
                                "loss has no gradient: compute it from the model's floating-point output)")
        connected = id(y) in recording.live
        grads = backprop(recording, y, fill(y.shape, 1, y.dtype, y.device)._data) if connected else {}
        return y, tuple(_mirror(a, grads) if shape is None else _mirror_recipe(shape.recipe, grads)
                        for a, shape in zip(args, shapes)), connected


def _flat(a):
    return [a] if not isinstance(a, (list, tuple)) else [v for e in a for v in _flat(e)]


def _python_numbers(a):
    """Whether ``a`` is a Python number or a (nested) list/tuple of them."""
    values = _flat(a)
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _nothing_to_differentiate(who, args):
    """The message for arguments none of which holds a floating-point Tensor."""
    if not args:
        return f"`{who}(f, *args)` needs the arguments to differentiate with respect to, e.g. `{who}(f, x)`"
    what = []
    for i, a in enumerate(args):
        if _python_numbers(a):
            what.append(f"argument {i} is a Python {type(a).__name__} ({_short(a)}): pass `tensor({_short(a)})`")
        elif isinstance(a, Tensor):
            what.append(f"argument {i} is a Tensor of {a.dtype}: pass a floating-point one, "
                        "`x.astype('float32')`")
        elif functor.is_layer(a) or functor.holds_arrays(a):
            what.append(f"argument {i} ({type(a).__name__}) holds no floating-point Tensor")
        else:
            what.append(f"argument {i} is a {type(a).__name__}")
    return (f"`{who}`: nothing to differentiate: " + "; ".join(what) + ". Gradients are taken with respect to "
            "floating-point Tensors (or NumPy arrays, or layers and structures holding them).")


def _short(a):
    text = repr(a)
    return text if len(text) <= 40 else text[:37] + "..."


def ignore_derivatives(x):
    """``x`` as a constant for ``gradient`` (ChainRulesCore's name): the same
    values, without a copy, that no gradient flows back through. ``x`` is a
    Tensor or any structure holding Tensors (a layer comes back as a copy
    whose arrays are :meth:`Tensor.detach`-ed); a function of no arguments
    (``ignore_derivatives(lambda: m(x))``) is called and its result treated
    so. Outside ``gradient`` it changes nothing::

        (g,) = gradient(lambda w: (w * ignore_derivatives(w)).sum(), w)   # g == w, not 2w"""
    if isinstance(x, (types.FunctionType, types.MethodType, functools.partial)):
        x = x()
    return functor.fmap(lambda a: a.detach() if isinstance(a, Tensor) else a, x)


def _mirror_recipe(node, grads):
    """:func:`_mirror` of a layer along its skeleton's recipe (the same tree)."""
    kind = node[0]
    if kind == LAYER or kind == DICT:
        return {name: _leaf_gradient(sub, grads) if sub[0] == TENSOR else _mirror_recipe(sub, grads)
                for name, sub in node[1]}
    if kind == LIST:
        return [_mirror_recipe(sub, grads) for sub in node[1]]
    if kind == TUPLE:
        items = [_mirror_recipe(sub, grads) for sub in node[1]]
        return node[2](*items) if hasattr(node[2], "_fields") else node[2](items)
    if kind == TENSOR:
        return _leaf_gradient(node, grads)
    return None


def _leaf_gradient(node, grads):
    """The gradient Tensor of a recipe's Tensor node (None: it has none)."""
    g = grads.get(id(node[1]))
    return None if g is None else Tensor._make(g, node[1]._device)


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
