"""One optimiser step's plan: which parameters move, with which gradient.

``collect`` walks the model, its gradient and its optimiser state together,
checks that they fit (every mismatch an error naming the field, raised
before anything changes) and lists ``(leaf, parameter, gradient)`` for each
trainable parameter with a gradient; ``step_together`` then steps that list,
one ``step_all`` per rule.

The walk follows the model's skeleton (``triflux.skeleton``: its structure,
remembered while it is unchanged) and checks the common case, a gradient
tree that mirrors the model and state on the parameters' devices, with
identity and size comparisons. Anything else (a missing or extra field, a
NumPy gradient, another device object, a mismatch) sends the whole step
through :func:`_plan`, the careful walk, which converts what it may and
raises the error naming the field for what it may not.
"""
import numpy as np

from .. import ops
from ..devices import move_code
from ..dtypes import holds_floats
from ..errors import DeviceMismatchError, StructureError
from ..functor import children, is_layer, path_join
from ..skeleton import DICT, LAYER, LIST, TENSOR, TUPLE, skeleton
from ..tensor import Tensor
from .tree import Leaf, is_trainable, show_path, state_tensors


def _mismatch(what, path, *pairs):
    return StructureError(f"update: {what} at `{show_path(path)}`: " + "; ".join(pairs))


def step_together(plan):
    """Step every ``(leaf, parameter, gradient)`` of ``plan``: one
    ``step_all`` per rule, which launches once per device and dtype for all
    its parameters (and allocates its small table of them before it does)."""
    by_object = {}     # grouped by identity first: a rule's hash builds its hyperparameters
    for entry in plan:
        by_object.setdefault(id(entry[0]["rule"]), []).append(entry)
    by_rule = {}
    for entries in by_object.values():
        by_rule.setdefault(entries[0][0]["rule"], []).extend(entries)
    for rule, entries in by_rule.items():
        states = rule.step_all([x for _, x, _ in entries], [g for _, _, g in entries],
                               [leaf["state"] for leaf, _, _ in entries])
        for (leaf, _, _), st in zip(entries, states):
            leaf["state"] = st


def collect(opt_state, model, grad):
    """Check ``grad`` and ``opt_state`` against ``model``; the list of
    ``(leaf, parameter, gradient)`` to step (each parameter once)."""
    shape = skeleton(model)
    if shape is not None:
        try:
            found = []
            _follow(shape.recipe, opt_state, grad, found)
            return _checked(found)
        except _Irregular:
            pass
    plan = []
    _plan(opt_state, model, grad, "", plan, set())
    return plan


_MISSING = object()


class _Irregular(Exception):
    """Raised by :func:`_follow` and :func:`_checked` where :func:`_plan` must look."""


def _follow(node, st, g, found):
    """:func:`_plan`'s common case along the model's recipe ``node``: the
    gradient tree mirrors the model (a dict for a layer or dict with every
    field, a list as long as the model's); appends ``(state, parameter,
    gradient)`` for each parameter with a gradient. Raises
    :class:`_Irregular` at anything else."""
    kind = node[0]
    if kind == LAYER or kind == DICT:
        items = node[1]
        if type(g) is not dict or len(g) != len(items) or not isinstance(st, dict) or isinstance(st, Leaf):
            raise _Irregular
        skip = node[2] if kind == LAYER else ()
        for name, sub in items:
            gi = g.get(name, _MISSING)
            if gi is _MISSING:
                raise _Irregular
            if gi is None or name in skip:
                continue
            if sub[0] == TENSOR:
                found.append((st.get(name), sub[1], gi))
            else:
                _follow(sub, st.get(name), gi, found)
    elif kind == LIST or kind == TUPLE:
        items = node[1]
        if not isinstance(g, (list, tuple)) or len(g) != len(items) or not isinstance(st, (list, tuple)) \
                or len(st) != len(items):
            raise _Irregular
        for sub, s, gi in zip(items, st, g):
            if gi is not None:
                _follow(sub, s, gi, found)
    elif kind == TENSOR:
        found.append((st, node[1], g))
    # NumPy arrays, functions, numbers: nothing to train


def _checked(found):
    """The plan of the ``(state, parameter, gradient)`` that :func:`_follow`
    found, each parameter once: trainable parameters only, each with a Leaf,
    a Tensor gradient of its shape on its device object and state on its
    device of its shape. Raises :class:`_Irregular` at anything else."""
    plan, done = [], set()
    for st, x, g in found:
        if not holds_floats(x._data.dtype):       # (not trainable)
            continue
        device, shape = x._device, x._data.shape
        if type(st) is not Leaf or type(g) is not Tensor or g._device is not device or g._data.shape != shape:
            raise _Irregular
        state = st["state"]
        for a in (state if type(state) is tuple else state_tensors(state)):
            if type(a) is Tensor:
                if a._device is not device or a._data.shape != shape:
                    raise _Irregular
            elif isinstance(a, (tuple, list)):    # nested state (MixedPrecision's (master, (m, v, t)))
                for b in state_tensors(a):
                    if b._device is not device or b._data.shape != shape:
                        raise _Irregular
        if id(x) not in done:        # a tied parameter: its gradient is already the total
            done.add(id(x))
            plan.append((st, x, g))
    return plan


def _plan(st, x, g, path, plan, done):
    """:func:`collect` at ``path``: append to ``plan`` the ``(leaf, parameter,
    gradient)`` of each trainable parameter under ``x`` whose id is not in
    ``done``. (A module-level function: a nested one that calls itself is a
    reference cycle, and would keep the step's gradients alive until the
    garbage collector runs.)"""
    if g is None:
        return
    if isinstance(x, Tensor):
        if not is_trainable(x):
            return
        if not isinstance(st, Leaf):
            raise StructureError(
                f"update: the optimiser state has no Leaf for the parameter `{show_path(path)}` "
                f"(found {type(st).__name__}); was it set up for this model? Call `setup(rule, model)`.")
        if not isinstance(g, Tensor):
            if isinstance(g, np.ndarray):
                g = Tensor._from_numpy(g)
            else:
                raise StructureError(f"update: the gradient for `{show_path(path)}` is a "
                                     f"{type(g).__name__}, expected a Tensor of shape {x.shape}")
        if g._device != x._device:
            raise DeviceMismatchError(
                f"update: the gradient for `{show_path(path)}` is on {g._device!r} but the parameter is on "
                f"{x._device!r}. Compute the gradient with the model and data on one device "
                f"(`{move_code(x._device)}`).")
        if g.shape != x.shape:
            raise StructureError(
                f"update: the gradient for `{show_path(path)}` has shape {g.shape} but the parameter "
                f"has shape {x.shape}")
        for a in state_tensors(st.state):
            if a._device != x._device:
                raise DeviceMismatchError(
                    f"update: the optimiser state for `{show_path(path)}` is on {a._device!r} but the "
                    f"parameter is on {x._device!r} (the model was moved after `setup`). Move the "
                    f"state too (`{move_code(x._device, 'opt_state')}`) or call "
                    "`setup(rule, model)` again.")
            if a.shape != x.shape:
                raise StructureError(
                    f"update: the optimiser state for `{show_path(path)}` has shape {a.shape} but the "
                    f"parameter has shape {x.shape}; call `setup(rule, model)` for this model")
        if id(x) in done:  # a tied parameter: its gradient is already the total
            return
        done.add(id(x))
        plan.append((st, x, g))
        return
    if is_layer(x):
        kids = children(x)
        if not isinstance(g, dict):
            raise StructureError(f"update: the gradient for `{show_path(path)}` ({type(x).__name__}) should be a "
                                 f"dict keyed by field name, got {type(g).__name__}")
        extra = set(g) - set(kids)
        if extra:
            raise StructureError(f"update: the gradient has field(s) {sorted(extra)} at `{show_path(path)}`, "
                                 f"which the {type(x).__name__} lacks (fields: {list(kids)})")
        if not isinstance(st, dict) or isinstance(st, Leaf):
            raise StructureError(f"update: the optimiser state at `{show_path(path)}` does not fit the "
                                 f"{type(x).__name__}; call `setup(rule, model)` for this model")
        skip = type(x)._nontrainable
        for name, v in kids.items():
            if name in skip:
                continue
            _plan(st.get(name), v, g.get(name), path_join(path, name), plan, done)
        return
    if isinstance(x, (list, tuple)):
        if not isinstance(g, (list, tuple)) or len(g) != len(x):
            raise _mismatch("the gradient does not fit", path,
                            f"the model has a {type(x).__name__} of {len(x)}",
                            f"the gradient is {_describe(g)}")
        if not isinstance(st, (list, tuple)) or len(st) != len(x):
            raise _mismatch("the optimiser state does not fit", path,
                            f"the model has a {type(x).__name__} of {len(x)}",
                            f"the state is {_describe(st)}; call `setup(rule, model)` for this model")
        for i, (s, v, gi) in enumerate(zip(st, x, g)):
            _plan(s, v, gi, path_join(path, i), plan, done)
        return
    if isinstance(x, dict):
        if not isinstance(g, dict):
            raise _mismatch("the gradient does not fit", path, "the model has a dict",
                            f"the gradient is {_describe(g)}")
        extra = set(g) - set(x)
        if extra:
            raise StructureError(f"update: the gradient has key(s) {sorted(map(repr, extra))} at "
                                 f"`{show_path(path)}`, which the model lacks")
        if not isinstance(st, dict) or isinstance(st, Leaf):
            raise _mismatch("the optimiser state does not fit", path, "the model has a dict",
                            f"the state is {_describe(st)}")
        for k, v in x.items():
            _plan(st.get(k), v, g.get(k), path_join(path, k), plan, done)
        return
    # functions, numbers, NumPy arrays: nothing to train


def _describe(v):
    if isinstance(v, (list, tuple)):
        return f"a {type(v).__name__} of {len(v)}"
    return "None" if v is None else f"a {type(v).__name__}"


def fit_gradient(x, g):
    """The gradient as the update kernels take it: ``x``'s dtype (any layout:
    the kernels honour strides)."""
    if g._data.dtype is not x._data.dtype and g.dtype != x.dtype:   # the same storage dtype object: equal
        g = ops.cast(g, x.dtype)
    return g
