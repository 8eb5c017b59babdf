"""Model and optimiser state as plain data (Flux's ``state`` and
``loadmodel!``).

``state(model)`` is a nested structure of NumPy arrays, device-free: a dict
keyed by child name for a layer, a list for a list (``Chain``'s
``layers``), a NumPy copy for each Tensor (bfloat16 stays bfloat16 via
``ml_dtypes``), ``None`` where the model holds no arrays (an activation
function inside a ``Chain``). It is what a GPU model should be saved as: it
loads on a machine without a GPU, into a model on any device. Each layer's
dict is a ``LayerState`` that also records the layer's configuration as
plain data (its type, constructor arguments, activations by name: see
:mod:`triflux.model_file`).

``state`` also takes optimiser state trees (``setup``): each ``Leaf``
becomes ``{"rule": {"Adam": {"eta": ..., "beta": [...], "epsilon": ...}},
"state": [m, v, t]}``, so ``loadmodel(opt_state, saved)`` restores the
moments, the step count and the hyperparameters and training resumes
exactly.

``loadmodel(model, state)`` copies the state into the model's existing
Tensors (each keeps its identity and device, so an optimiser state set up
for the model stays valid). It checks everything (structure, shapes, dtypes,
and each layer's configuration where the state records it: a different
activation, stride or padding is named) before writing anything: a failed
load leaves the model as it was.

``save(path, x)`` / ``load(path)`` (from :mod:`triflux.serialization`) write
and read such states as safetensors files, atomically and without ever
running code on load; ``loadmodel(model, load(path))`` restores a model (or
an optimiser state) on any device.
"""
import numpy as np

from .errors import StructureError
from .functor import children, holds_arrays, is_layer, path_join
from .model_file import LayerState, describe, difference
from .optimise import Leaf, MixedPrecision, MixedPrecisionState, Rule, rule_from_dict, rule_to_dict
from .tensor import Tensor, transfer

__all__ = ["state", "loadmodel"]


def state(x):
    """``x`` (a tensor, layer, model, list/tuple/dict of them, or an
    optimiser state tree) as nested dicts and lists of NumPy arrays and
    numbers, holding copies (never views of the model's memory). A layer's
    state is a :class:`~triflux.model_file.LayerState`, a dict that also
    records the layer's configuration (``.spec``), which ``save`` writes
    and ``loadmodel`` checks. A structure that contains itself raises
    ``StructureError``."""
    return _state(x, "", {})


def _state(x, path, enclosing):
    """``state(x)`` for ``x`` at ``path``; ``enclosing``: {id: path} of the
    layers and containers ``x`` is inside (to refuse a structure that
    contains itself)."""
    if isinstance(x, Tensor):
        return x.numpy()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Leaf):
        return {"rule": rule_to_dict(x.rule), "state": _state(x.state, path_join(path, "state"), enclosing)}
    if isinstance(x, Rule):
        return rule_to_dict(x)
    if not (is_layer(x) or isinstance(x, (list, tuple, dict))):
        return x if x is None or isinstance(x, (bool, int, float)) else None  # functions hold no arrays (Flux: ())
    if id(x) in enclosing:
        raise StructureError(f"the structure contains itself: {_show(path)} is the {type(x).__name__} at "
                             f"{_show(enclosing[id(x)])} again (a model or a state must be a tree)")
    enclosing[id(x)] = path
    try:
        if is_layer(x):
            return LayerState(((name, _state(v, path_join(path, name), enclosing)) for name, v in children(x).items()),
                              spec=describe(x))
        if isinstance(x, dict):
            return {k: _state(v, path_join(path, k), enclosing) for k, v in x.items()}
        return [_state(v, path_join(path, i), enclosing) for i, v in enumerate(x)]
    finally:
        del enclosing[id(x)]


# --- loadmodel -----------------------------------------------------------------------------------

def _show(path):
    return f"`{path}`" if path else "the top level"


def _dtype_name(d):
    return str(d)


def _array_of(src):
    """``src`` as a NumPy array (a Tensor, an array, a number), or None."""
    if isinstance(src, Tensor):
        return src.numpy()
    if isinstance(src, np.ndarray):
        return src
    if isinstance(src, (np.generic, bool, int, float)):
        return np.asarray(src)
    return None


class _Plan:
    """Checks collected while walking, and the writes to do if none failed."""

    def __init__(self):
        self.errors = []
        self.writes = []

    def error(self, msg):
        self.errors.append(msg)


def _check_tensor(plan, dst, src, path):
    arr = _array_of(src)
    if arr is None:
        plan.error(f"{_show(path)}: the model has a Tensor of shape {dst.shape} and dtype "
                   f"{_dtype_name(dst.dtype)}, the state has {_what(src)}")
        return
    if tuple(arr.shape) != dst.shape:
        plan.error(f"{_show(path)}: shape mismatch, the model has {dst.shape}, the state has {tuple(arr.shape)}")
        return
    if arr.dtype != dst.dtype:
        plan.error(f"{_show(path)}: dtype mismatch, the model has {_dtype_name(dst.dtype)}, the state has "
                   f"{_dtype_name(arr.dtype)} (convert one side first, e.g. `f32(model)` / `f64(model)`)")
        return
    plan.writes.append((dst, arr))


def _is_torch_tensor(x):
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(x).__mro__)


def _what(src):
    if src is None:
        return "nothing (None)"
    if _is_torch_tensor(src):
        return f"a torch.Tensor of shape {tuple(src.shape)}"
    if isinstance(src, np.ndarray):
        return f"an array of shape {src.shape}"
    if isinstance(src, (list, tuple)):
        return f"a {type(src).__name__} of {len(src)}"
    if isinstance(src, dict):
        return f"a dict with keys {sorted(map(str, src))}"
    name = type(src).__name__
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _check_keys(plan, dst_keys, src, path, kind):
    if not isinstance(src, dict):
        plan.error(f"{_show(path)}: the model has {kind} with fields {list(dst_keys)}, the state has {_what(src)}")
        return False
    missing = [k for k in dst_keys if k not in src]
    extra = [k for k in src if k not in dst_keys and src[k] is not None]
    for k in missing:
        plan.error(f"{_show(path_join(path, k))}: missing from the state (the model has it)")
    for k in extra:
        plan.error(f"{_show(path_join(path, k))}: in the state but not in the model")
    return True


def _walk(plan, dst, src, path):
    if isinstance(dst, Tensor):
        _check_tensor(plan, dst, src, path)
    elif isinstance(dst, np.ndarray):
        arr = _array_of(src)
        if arr is None or tuple(arr.shape) != dst.shape or arr.dtype != dst.dtype:
            plan.error(f"{_show(path)}: the model has an array of shape {dst.shape} and dtype {dst.dtype}, "
                       f"the state has " + (_what(src) if arr is None else
                                            f"shape {tuple(arr.shape)} and dtype {arr.dtype}"))
        else:
            plan.writes.append((dst, arr))
    elif isinstance(dst, Leaf):
        _walk_leaf(plan, dst, src, path)
    elif isinstance(dst, MixedPrecisionState):
        _walk_mixed(plan, dst, src, path)
    elif is_layer(dst):
        saved = getattr(src, "spec", None)
        if saved is not None:
            differs = difference(describe(dst), saved)
            if differs:
                plan.error(f"{_show(path)}: {differs}")
        kids = children(dst)
        if _check_keys(plan, list(kids), src, path, f"a {type(dst).__name__}"):
            for name, v in kids.items():
                if name in src:
                    _walk(plan, v, src[name], path_join(path, name))
    elif isinstance(dst, (list, tuple)):
        if not isinstance(src, (list, tuple)):
            plan.error(f"{_show(path)}: the model has a {type(dst).__name__} of {len(dst)}, "
                       f"the state has {_what(src)}")
        elif len(src) != len(dst):
            plan.error(f"{_show(path)}: length mismatch, the model has a {type(dst).__name__} of {len(dst)}, "
                       f"the state has {len(src)} entries")
        else:
            for i, (d, s) in enumerate(zip(dst, src)):
                _walk(plan, d, s, path_join(path, i))
    elif isinstance(dst, dict):
        if _check_keys(plan, list(dst), src, path, "a dict"):
            for k, v in dst.items():
                if k in src:
                    _walk(plan, v, src[k], path_join(path, k))
    else:
        # no arrays here (None, a function, a number outside a Leaf): nothing to load,
        # but the state must not bring arrays the model has no place for
        if holds_arrays(src):
            plan.error(f"{_show(path)}: the state has arrays ({_what(src)}) but the model holds "
                       f"{'nothing' if dst is None else type(dst).__name__} there")


def _walk_leaf(plan, leaf, src, path):
    if isinstance(src, Leaf):
        src = state(src)
    if not isinstance(src, dict) or set(src) != {"rule", "state"}:
        plan.error(f"{_show(path)}: the optimiser state has a Leaf ({leaf.rule!r}), the state has {_what(src)} "
                   "instead of {'rule': ..., 'state': ...}")
        return
    try:
        rule = rule_from_dict(src["rule"]) if not isinstance(src["rule"], Rule) else src["rule"]
    except (StructureError, TypeError, ValueError) as e:
        plan.error(f"{_show(path_join(path, 'rule'))}: {e}")
        return
    if hasattr(leaf.rule, "_saved_rule") and type(rule) is type(leaf.rule._saved_rule()):
        rule = leaf.rule.replace(**rule.hyperparameters())   # e.g. DistributedOptimizer: keep its backend
    if type(rule) is not type(leaf.rule):
        plan.error(f"{_show(path_join(path, 'rule'))}: the optimiser state uses {type(leaf.rule).__name__}, the "
                   f"saved state was made by {type(rule).__name__}; call `setup({type(rule).__name__}(), model)` "
                   "before loading it")
        return
    if isinstance(leaf.rule, MixedPrecision) and type(leaf.rule.rule) is not type(rule.rule):
        inner_old, inner_new = leaf.rule.rule, rule.rule
        plan.error(f"{_show(path_join(path, 'rule'))}: the optimiser state uses MixedPrecision("
                   f"{type(inner_old).__name__}), the saved state was made by MixedPrecision("
                   f"{type(inner_new).__name__}); call `setup(MixedPrecision({type(inner_new).__name__}()), model)` "
                   "before loading it")
        return
    new_state = _leaf_state(plan, leaf.state, src["state"], path_join(path, "state"))
    plan.writes.append((leaf, (rule, new_state)))


def _leaf_state(plan, dst, src, path):
    """The new value of a Leaf's state: same Tensor objects (filled later),
    numbers (the step count) replaced."""
    if isinstance(dst, Tensor):
        _check_tensor(plan, dst, src, path)
        return dst
    if isinstance(dst, (list, tuple)):
        if not isinstance(src, (list, tuple)) or len(src) != len(dst):
            plan.error(f"{_show(path)}: the optimiser state has a {type(dst).__name__} of {len(dst)}, "
                       f"the saved state has {_what(src)}")
            return dst
        return type(dst)(_leaf_state(plan, d, s, path_join(path, i)) for i, (d, s) in enumerate(zip(dst, src)))
    if dst is None:
        if src is not None:
            plan.error(f"{_show(path)}: the optimiser state holds nothing, the saved state has {_what(src)}")
        return None
    if isinstance(dst, (bool, int, float, np.generic)):
        arr = _array_of(src)
        if arr is None or arr.size != 1:
            plan.error(f"{_show(path)}: the optimiser state has the number {dst!r}, the saved state has {_what(src)}")
            return dst
        v = arr.reshape(()).item()
        if isinstance(dst, (int, np.integer)) and not isinstance(dst, bool):
            if float(v) != int(v):
                plan.error(f"{_show(path)}: expected an integer (a step count), the saved state has {v!r}")
                return dst
            return int(v)
        return type(dst)(v)
    plan.error(f"{_show(path)}: cannot load into a {type(dst).__name__}")
    return dst


def _walk_mixed(plan, dst, src, path):
    """A MixedPrecisionState: its tree like any state tree, and the loss
    scaler's numbers (replaced)."""
    if not isinstance(src, dict) or set(src) != {"tree", "scaler"}:
        plan.error(f"{_show(path)}: the optimiser state is a MixedPrecisionState (keys `tree`, `scaler`), the "
                   f"state has {_what(src)}; was it saved from `setup(MixedPrecision(rule), model)`?")
        return
    _walk(plan, dst["tree"], src["tree"], path_join(path, "tree"))
    sc, where = src["scaler"], path_join(path, "scaler")
    if not isinstance(sc, dict) or set(sc) != set(dst["scaler"]):
        plan.error(f"{_show(where)}: expected a dict with keys {sorted(dst['scaler'])}, the state has {_what(sc)}")
        return
    new = {}
    for k, v in sc.items():
        arr = _array_of(v)
        if arr is None or arr.size != 1:
            plan.error(f"{_show(path_join(where, k))}: expected a number, the state has {_what(v)}")
            return
        new[k] = arr.reshape(()).item()
    if not (isinstance(new["scale"], (int, float)) and new["scale"] > 0 and np.isfinite(new["scale"])):
        plan.error(f"{_show(path_join(where, 'scale'))}: the loss scale must be a positive number, "
                   f"got {new['scale']!r}")
        return
    if float(new["growth_tracker"]) != int(new["growth_tracker"]) or new["growth_tracker"] < 0:
        plan.error(f"{_show(path_join(where, 'growth_tracker'))}: expected a step count, got {new['growth_tracker']!r}")
        return
    plan.writes.append((dst, {"scale": float(new["scale"]), "growth_tracker": int(new["growth_tracker"]),
                              "dynamic": bool(new["dynamic"])}))


def _backend_array(t, arr):
    """A fresh backend array on ``t``'s device holding ``arr``'s values."""
    host = np.array(arr, dtype=t.dtype, copy=True, order="C")
    if t._device.is_cpu:
        return host
    data = transfer(Tensor._from_numpy(host), t._device)._data
    if tuple(data.shape) != host.shape:  # a 0-d array must stay 0-d on the device
        data = data.reshape(host.shape)
    return data


def loadmodel(x, state_):
    """Copy ``state_`` (from ``state``, a saved file, or another model) into
    ``x`` in place (Flux's ``loadmodel!``) and return ``x``.

    The Tensors of ``x`` keep their identity and device; their values are
    replaced by the state's, moved to that device (a CPU state loads into a
    GPU model and vice versa). ``x`` may also be an optimiser state tree
    (its rules are rebuilt through their constructors, which check the
    saved hyperparameters).

    Structure (missing or extra fields, list lengths), shapes, dtypes and,
    where the state records them (``state``, ``load``), the layers'
    configurations (type, activation, stride, padding, ...; not the
    train/test mode) are all checked first; on any mismatch
    ``StructureError`` names every offending field (``layers[1].weight``)
    with both values, and nothing has been written. A state holding
    torch.Tensors (a torch ``state_dict``) is named as such, with how to
    convert it."""
    src = state_
    if _anywhere(src, lambda v: isinstance(v, (Tensor, Leaf)) or is_layer(v)):
        src = state(src)  # another model (or a tree holding Tensors): take a copy of its state
    plan = _Plan()
    _walk(plan, x, src, "")
    if plan.errors:
        n = len(plan.errors)
        head = "loadmodel: the state does not fit the model" + (f" ({n} problems)" if n > 1 else "")
        shown = plan.errors[:20]
        more = f"\n  ... and {n - len(shown)} more" if n > len(shown) else ""
        torch = ("\nThe state holds torch.Tensors (a torch `state_dict`?): convert them to NumPy first, "
                 "`{k: v.detach().cpu().numpy() for k, v in state_dict.items()}`, nested as `state(model)` is, "
                 "or translate the torch module itself with `triflux.from_torch(module)`."
                 if _anywhere(src, _is_torch_tensor) else "")
        raise StructureError(head + ":\n  " + "\n  ".join(shown) + more + torch + "\nNothing was loaded.")
    # Everything fits: transfer first (a failure here, e.g. out of memory, still leaves x intact),
    # then assign.
    staged = []
    for dst, payload in plan.writes:
        if isinstance(dst, Tensor):
            staged.append((dst, _backend_array(dst, payload)))
        else:
            staged.append((dst, payload))
    for dst, payload in staged:
        if isinstance(dst, Tensor):
            dst._data = payload
        elif isinstance(dst, Leaf):
            dst.rule, dst.state = payload
        elif isinstance(dst, MixedPrecisionState):
            dst["scaler"] = payload
        else:  # a NumPy array leaf of the model
            np.copyto(dst, payload)
    return x


def _anywhere(v, found):
    """Whether ``found(e)`` holds for ``v`` or anything nested in its lists, tuples and dicts
    (each visited once: a structure that contains itself is fine)."""
    seen, todo = set(), [v]
    while todo:
        e = todo.pop()
        if found(e):
            return True
        if isinstance(e, (list, tuple, dict)) and id(e) not in seen:
            seen.add(id(e))
            todo.extend(e.values() if isinstance(e, dict) else e)
    return False
