"""A model's architecture as plain data: what ``save`` records of each layer,
what ``loadmodel`` compares, and what ``load_model`` rebuilds a model from
without running any code from the file.

A layer's *spec* is JSON data; for ``Chain(Dense(3, 4, relu), relu)``::

    {"type": "Chain", "args": [{"child": ["layers", 0]}, {"function": "relu"}]}
    {"type": "Dense", "kwargs": {"in_features": 3, "out_features": 4,
                                 "activation": {"function": "relu"}, "bias": true}}

* ``type`` names a class of a closed registry: triflux's layers,
  ``models.UNet`` and the classes a program registers with
  :func:`register_layer`. Nothing else is looked up, imported or called.
* ``args`` / ``kwargs`` are the arguments that construct the layer again
  (a built-in layer's constructor arguments, read from its attributes; a
  registered class's ``get_config()``), or ``attributes`` the object's own
  attributes, set on ``cls.__new__(cls)`` without calling ``__init__``
  (``models.UNet``; registered classes without ``get_config``): its
  children and public attributes.
* ``active`` is the train/test mode that ``trainmode``/``testmode`` pinned.
* Values are JSON numbers, strings, booleans, null and lists, or tagged
  objects: ``{"tuple": [...]}``, ``{"dict": {...}}``, ``{"float": "inf"}``,
  ``{"function": name}`` (a function of the closed table, with ``"kwargs"``
  for an ``interop.Activation`` such as ``leakyrelu(a=0.2)``) and
  ``{"child": [key, ...]}``: a layer or array of this layer, by its keys in
  the layer's state. ``{"unknown": kind, "name": ...}`` marks what no spec
  can name (a lambda, an unregistered class): ``save`` records it so that
  ``loadmodel`` can still compare; ``save_model`` and ``load_model`` refuse it.

A spec holds no arrays: they are the layer's state, saved next to it.
``state(model)`` returns each layer's state as a :class:`LayerState`, a dict
that carries the layer's spec.
"""
import math
import operator

import numpy as np

from . import activations as A
from . import ops
from .errors import CheckpointError
from .functor import children, is_layer, path_join
from .interop import Activation
from .layers import (GRU, LSTM, RNN, AdaptiveMaxPool, AdaptiveMeanPool, BatchNorm, Chain, Conv, ConvTranspose,
                     CrossCor, DepthwiseConv, Dense, Dropout, Embedding, EmbeddingBag, GlobalMaxPool,
                     GlobalMeanPool, GroupNorm, GRUCell, InstanceNorm, LayerNorm, LSTMCell, MaxPool, MeanPool,
                     MultiHeadAttention, Parallel, PixelShuffle, RMSNorm, RNNCell, SkipConnection, Upsample,
                     flatten)
from .show import fname
from .tensor import Tensor, tensor

__all__ = ["register_layer", "LayerState", "describe", "difference", "unknown_parts", "layer_states", "build"]


class LayerState(dict):
    """A layer's state (a dict of its children's states) carrying the
    layer's spec (``.spec``; None when unknown), so that ``loadmodel`` can
    check the structure and ``load_model`` can rebuild the layer."""

    def __init__(self, items=(), spec=None):
        super().__init__(items)
        self.spec = spec


def _bias(layer):
    return layer.bias is not None


def _sizes(layer):
    return {"in_features": layer.in_features, "out_features": layer.out_features}


def _conv_arguments(layer):
    """Conv's (and CrossCor's) arguments; ``pad_mode`` only when not zeros, so the
    spec of a zero-padded Conv is what files written before pad_mode hold."""
    out = {"kernel": layer.weight.shape[2:], "in_channels": layer.weight.shape[1] * layer.groups,
           "out_channels": layer.weight.shape[0], "activation": layer.activation, "stride": layer.stride,
           "pad": layer.pad, "dilation": layer.dilation, "groups": layer.groups, "bias": _bias(layer)}
    if layer.pad_mode != "zeros":
        out["pad_mode"] = layer.pad_mode
    return out


#: each built-in layer class -> the (positional, keyword) arguments that construct it again, read
#: from its public attributes (its arrays then come from its state)
CONSTRUCTOR_ARGUMENTS = {
    Chain: lambda l: (list(l.layers), {}) if isinstance(l.layers, list) else ((), dict(l.layers)),
    SkipConnection: lambda l: ((), {"layer": l.layer, "connection": l.connection}),
    Parallel: lambda l: ([l.connection, *l.layers], {}) if isinstance(l.layers, list)
    else ([l.connection], dict(l.layers)),
    Dense: lambda l: ((), {**_sizes(l), "activation": l.activation, "bias": _bias(l)}),
    Conv: lambda l: ((), _conv_arguments(l)),
    CrossCor: lambda l: ((), _conv_arguments(l)),
    DepthwiseConv: lambda l: ((), {k: v for k, v in _conv_arguments(l).items() if k != "groups"}),
    ConvTranspose: lambda l: ((), {"kernel": l.weight.shape[2:], "in_channels": l.weight.shape[0],
                                   "out_channels": l.weight.shape[1] * l.groups, "activation": l.activation,
                                   "stride": l.stride, "pad": l.pad, "outpad": l.outpad, "dilation": l.dilation,
                                   "groups": l.groups, "bias": _bias(l)}),
    BatchNorm: lambda l: ((), {"channels": l.weight.shape[0], "activation": l.activation, "eps": l.eps,
                               "momentum": l.momentum}),
    LayerNorm: lambda l: ((), {"size": l.size, "activation": l.activation, "affine": l.affine, "bias": _bias(l),
                               "eps": l.eps}),
    GroupNorm: lambda l: ((), {"channels": l.channels, "groups": l.groups, "activation": l.activation,
                               "affine": l.affine, "eps": l.eps}),
    InstanceNorm: lambda l: ((), {"channels": l.channels, "activation": l.activation, "affine": l.affine,
                                  "track_stats": l.track_stats, "eps": l.eps, "momentum": l.momentum}),
    RMSNorm: lambda l: ((), {"size": l.size, "eps": l.eps, "affine": l.affine}),
    Embedding: lambda l: ((), {"vocab_size": l.vocab_size, "dim": l.dim, "padding_idx": l.padding_idx,
                               "scale_grad_by_freq": l.scale_grad_by_freq}),
    EmbeddingBag: lambda l: ((), {"vocab_size": l.vocab_size, "dim": l.dim, "mode": l.mode,
                                  "padding_idx": l.padding_idx, "include_last_offset": l.include_last_offset,
                                  "scale_grad_by_freq": l.scale_grad_by_freq}),
    Dropout: lambda l: ((), {"p": l.p}),
    MultiHeadAttention: lambda l: ((), {
        "dims": ((l.q_proj.in_features, l.k_proj.in_features, l.v_proj.in_features),
                 (l.q_proj.out_features, l.v_proj.out_features), l.out_proj.out_features),
        "nheads": l.nheads, "bias": l.q_proj.bias is not None, "dropout_prob": l.dropout_prob}),
    MaxPool: lambda l: ((), {"window": l.window, "stride": l.stride, "pad": l.pad, "dilation": l.dilation,
                             "ceil_mode": l.ceil_mode}),
    MeanPool: lambda l: ((), {"window": l.window, "stride": l.stride, "pad": l.pad, "ceil_mode": l.ceil_mode,
                              "count_include_pad": l.count_include_pad}),
    AdaptiveMaxPool: lambda l: ((), {"out": l.out}),
    AdaptiveMeanPool: lambda l: ((), {"out": l.out}),
    GlobalMaxPool: lambda l: ((), {}),
    GlobalMeanPool: lambda l: ((), {}),
    Upsample: lambda l: ((), {"mode": l.mode, "scale": l.scale, "size": l.size, "align_corners": l.align_corners}),
    PixelShuffle: lambda l: ((), {"r": l.r}),
    RNN: lambda l: ((), {**_sizes(l), "activation": l.activation, "return_state": l.return_state}),
    LSTM: lambda l: ((), {**_sizes(l), "return_state": l.return_state}),
    GRU: lambda l: ((), {**_sizes(l), "return_state": l.return_state}),
    RNNCell: lambda l: ((), {**_sizes(l), "activation": l.activation}),
    LSTMCell: lambda l: ((), _sizes(l)),
    GRUCell: lambda l: ((), _sizes(l)),
}

#: the functions a spec names, besides models.cat_channels and those registered: activations,
#: flatten, and the connections of SkipConnection and Parallel
BUILTIN_FUNCTIONS = {
    **{f.__name__: f for f in (A.identity, A.relu, A.sigmoid, A.tanh, A.leakyrelu, A.elu, A.gelu, A.gelu_erf,
                               A.swish, A.softplus, A.softmax, A.logsoftmax, A.logsumexp)},
    "flatten": flatten,
    **{f.__name__: f for f in (ops.add, ops.sub, ops.mul, ops.maximum, ops.minimum, ops.cat)},
    **{f"operator.{f.__name__}": f for f in (operator.add, operator.sub, operator.mul)},
}

_TYPES = {}       # name -> layer class
_TYPE_NAMES = {}  # layer class -> name
_FUNCTIONS = {}   # name -> function
_NAMES = {}       # id(function) -> name (the functions stay alive in _FUNCTIONS)
_BUILTIN = set()  # the names triflux itself registers


def _registry():
    """The closed registry, built on first use (importing ``triflux.models``
    only then keeps it out of ``import triflux``)."""
    if not _TYPES:
        from . import models
        for cls in (*CONSTRUCTOR_ARGUMENTS, models.UNet):
            _TYPES[cls.__name__], _TYPE_NAMES[cls] = cls, cls.__name__
        for name, f in {**BUILTIN_FUNCTIONS, "models.cat_channels": models.cat_channels}.items():
            _FUNCTIONS[name], _NAMES[id(f)] = f, name
        _BUILTIN.update(_TYPES, _FUNCTIONS)
    return _TYPES, _FUNCTIONS


def _qualified(x):
    return f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', fname(x))}"


def register_layer(x, name=None):
    """Let ``save_model`` record, and ``load_model`` rebuild, a layer class
    or a function of your program; returns ``x`` (so it also works as a
    decorator). Call it in the program that saves and in the one that loads
    (before ``load_model``): a file names the class or function, it never
    holds its code. ``name`` (default ``x.__name__``) is what the file
    records; triflux's own names cannot be taken.

    A class must be a subclass of ``triflux.Layer``. It is recorded in one
    of two ways:

    * if it has a method ``get_config(self)`` returning its constructor's
      keyword arguments as a dict, ``load_model`` calls ``cls(**config)``
      and then loads the saved arrays into the new layer (so the constructor
      must create every array, with the saved shapes);
    * otherwise as its attributes: ``load_model`` makes the object with
      ``cls.__new__(cls)`` (``__init__`` is not called) and sets them,
      arrays taken from the file. These are its children (the attributes
      holding arrays or layers) and its other public attributes; private
      ones (``_name``) that hold no arrays are taken for caches and left out.

    Either way every value must be plain data (None, bools, numbers,
    strings, and lists, tuples and str-keyed dicts of them), one of the
    layer's own child layers or arrays, or a function of the table
    (triflux's activations, ``flatten``, ``add``, ``mul``, ``cat``, ... and
    the functions registered here)::

        @triflux.register_layer
        class Scale(triflux.Layer):
            def __init__(self, n):
                self.weight = triflux.ones(n)

            def __call__(self, x):
                return x * self.weight

        @triflux.register_layer
        def join(y, x):                    # a SkipConnection's connection
            return triflux.cat(y, x, dims=1)
    """
    types, functions = _registry()
    if isinstance(x, type):
        if not hasattr(x, "_children"):   # (what makes a class a layer: functor.is_layer)
            raise TypeError(f"register_layer: {x.__qualname__} is a class but not a layer; register subclasses "
                            "of triflux.Layer (or functions)")
    elif not callable(x):
        raise TypeError(f"register_layer: expects a subclass of triflux.Layer or a function, got "
                        f"{type(x).__name__} {x!r:.60}")
    name = x.__name__ if name is None else name
    if not isinstance(name, str) or not name or name == "<lambda>":
        raise TypeError(f"register_layer: {fname(x)} needs a name the file can record; define it with `def` "
                        f"or pass name='...', got name={name!r}")
    taken = types.get(name, functions.get(name))
    if taken is not None and taken is not x and (name in _BUILTIN or _qualified(taken) != _qualified(x)):
        owner = "triflux's" if name in _BUILTIN else f"{_qualified(taken)}'s"
        raise ValueError(f"register_layer: the name {name!r} is already {owner}; register "
                         f"{fname(x)} under another one: register_layer({fname(x)}, name='...')")
    if isinstance(x, type):   # (a class redefined under the same name, e.g. in a notebook, replaces the old)
        _TYPE_NAMES.pop(taken, None)
        types[name], _TYPE_NAMES[x] = x, name
    else:
        _NAMES.pop(id(taken), None)
        functions[name], _NAMES[id(x)] = x, name
    return x


# --- describing a layer ---------------------------------------------------------------------------

def _child_keys(layer):
    """{id(x): [key, ...]} for each layer and array of ``layer``'s children,
    down to the next layers: where each is in the layer's state."""
    found = {}

    def walk(x, keys):
        if isinstance(x, (Tensor, np.ndarray)) or is_layer(x):
            found.setdefault(id(x), keys)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, keys + [i])
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, keys + [k])

    for name, v in children(layer).items():
        walk(v, [name])
    return found


def _value(v, keys_of):
    """The spec of one argument or attribute value."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, np.generic) and isinstance(v.item(), (bool, int, float)):
        return _value(v.item(), keys_of)
    if id(v) in keys_of:
        return {"child": keys_of[id(v)]}
    if isinstance(v, tuple):
        return {"tuple": [_value(e, keys_of) for e in v]}
    if isinstance(v, list):
        return [_value(e, keys_of) for e in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": {k: _value(e, keys_of) for k, e in v.items()}}
    if is_layer(v) or isinstance(v, (Tensor, np.ndarray)):
        return {"unknown": "not a child", "name": type(v).__name__}
    if isinstance(v, Activation) and id(v.fn) in _NAMES:
        return {"function": _NAMES[id(v.fn)], "kwargs": {k: _value(e, keys_of) for k, e in v.kwargs.items()}}
    if id(v) in _NAMES:
        return {"function": _NAMES[id(v)]}
    if callable(v) and not isinstance(v, type):
        return {"unknown": "function", "name": fname(v)}
    return {"unknown": "object", "name": type(v).__qualname__}


def describe(layer):
    """The spec of ``layer`` itself (its child layers are referenced by their
    keys, and have specs of their own), with ``{"unknown": ...}`` where a
    part cannot be named."""
    _registry()
    cls = type(layer)
    name = _TYPE_NAMES.get(cls)
    if name is None:
        return {"type": cls.__name__, "unknown": "layer", "name": _qualified(cls)}
    keys_of = _child_keys(layer)
    spec = {"type": name}
    if cls in CONSTRUCTOR_ARGUMENTS:
        args, kwargs = CONSTRUCTOR_ARGUMENTS[cls](layer)
    elif hasattr(cls, "get_config"):
        args, kwargs = (), layer.get_config()
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise TypeError(f"{name}.get_config() must return a dict of keyword arguments, got {kwargs!r:.80}")
    else:
        args, kwargs, kids = (), None, children(layer)
        spec["attributes"] = {k: _value(v, keys_of) for k, v in vars(layer).items()
                              if k != "active" and (k in kids or not k.startswith("_"))}
    if args:
        spec["args"] = [_value(v, keys_of) for v in args]
    if kwargs:
        spec["kwargs"] = {k: _value(v, keys_of) for k, v in kwargs.items()}
    if "active" in vars(layer):
        spec["active"] = None if layer.active is None else bool(layer.active)
    return spec


def _labelled(spec):
    """(label, value) for each argument or attribute of a spec."""
    sections = spec if isinstance(spec, dict) else {}
    args = sections.get("args")
    for i, v in enumerate(args if isinstance(args, list) else ()):
        yield f"argument {i}", v
    for section in ("kwargs", "attributes"):
        entries = sections.get(section)
        for k, v in (entries.items() if isinstance(entries, dict) else ()):
            yield f"`{k}`", v


def _markers(v):
    """The ``{"unknown": ...}`` parts of a spec value."""
    if isinstance(v, list):
        items = v
    elif isinstance(v, dict) and "unknown" in v:
        return [v]
    elif isinstance(v, dict) and isinstance(v.get("tuple"), list):
        items = v["tuple"]
    elif isinstance(v, dict) and isinstance(v.get("dict"), dict):
        items = list(v["dict"].values())
    else:
        return []
    return [m for e in items for m in _markers(e)]


def unknown_parts(spec, path):
    """Messages naming each part of the spec of the layer at ``path`` that
    no file can name (each says how to fix it); empty when it rebuilds."""
    where = f"`{path}`" if path else "the model"
    if isinstance(spec, dict) and spec.get("unknown") == "layer":
        short = str(spec.get("type"))
        return [f"{where} is a {spec.get('name')}, which is not a triflux layer: call "
                f"`triflux.register_layer({short})` before saving and before loading it "
                "(help(triflux.register_layer) says what the class must provide)"]
    out = []
    for label, v in _labelled(spec):
        for m in _markers(v):
            what = f"{where} ({spec.get('type')}): its {label}"
            if m.get("unknown") == "function":
                fix = ("define it with `def` and call `triflux.register_layer(fn)`" if m.get("name") == "<lambda>"
                       else f"call `triflux.register_layer({m.get('name')})`")
                out.append(f"{what} is the function {m.get('name')}, which is not one of triflux's functions; "
                           f"{fix} before saving and before loading, so the file can name it")
            elif m.get("unknown") == "object":
                out.append(f"{what} is a {m.get('name')} object; a model file records plain data (numbers, "
                           "strings, lists, tuples, dicts), the layer's own layers and arrays, and functions "
                           "by name")
            else:
                out.append(f"{what} holds a {m.get('name')} that is not one of its children (its arrays and "
                           "layers must be its attributes)")
    return out


def layer_states(tree, path=""):
    """(path, LayerState) for every layer's state in ``tree``, outermost first."""
    if isinstance(tree, LayerState):
        yield path, tree
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from layer_states(v, path_join(path, k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from layer_states(v, path_join(path, i))


# --- comparing ------------------------------------------------------------------------------------

_MISSING = object()


def _display(v):
    """A spec value as the user wrote it."""
    if v is _MISSING:
        return "not given"
    if isinstance(v, list):
        return "[" + ", ".join(map(_display, v)) + "]"
    if isinstance(v, dict):
        if "function" in v:
            kw = v.get("kwargs")
            args = ", ".join(f"{k}={_display(e)}" for k, e in kw.items()) if isinstance(kw, dict) else ""
            return f"{v['function']}({args})" if args else str(v["function"])
        if "child" in v and isinstance(v["child"], list):
            path = ""
            for k in v["child"]:
                path = path_join(path, k)
            return f"the layer at `{path}`"
        if "tuple" in v and isinstance(v["tuple"], list):
            return "(" + ", ".join(map(_display, v["tuple"])) + ("," if len(v["tuple"]) == 1 else "") + ")"
        if "float" in v:
            return str(v["float"])
        if "unknown" in v:
            return str(v.get("name"))
        if "dict" in v and isinstance(v["dict"], dict):
            return "{" + ", ".join(f"{k!r}: {_display(e)}" for k, e in v["dict"].items()) + "}"
    return repr(v)


def difference(spec, saved):
    """In words, how the spec of a model's layer differs from the spec saved
    with its state (the train/test mode aside), or None when they agree."""
    def structural(s):
        return {k: v for k, v in s.items() if k != "active"} if isinstance(s, dict) else s

    if structural(spec) == structural(saved):
        return None
    kind = saved.get("type") if isinstance(saved, dict) else None
    if spec.get("type") != kind:
        return f"the model has a {spec.get('type')}, the state was saved from a {kind}"
    mine, theirs = dict(_labelled(spec)), dict(_labelled(saved))
    parts = []
    for label in list(mine) + [k for k in theirs if k not in mine]:
        a, b = mine.get(label, _MISSING), theirs.get(label, _MISSING)
        if a != b:
            parts.append(f"{label} is {_display(a)} in the model, {_display(b)} in the state")
    return f"the model's {kind} differs from the one saved: " + "; ".join(parts or ["its description"])


# --- rebuilding -----------------------------------------------------------------------------------

def _corrupt(path, what):
    where = f"`{path}`" if path else "the model"
    return CheckpointError(f"the description of {where} {what} (the file is corrupt or was edited)")


def build(node, path=""):
    """The layer described by ``node.spec`` (``node``, its LayerState from
    ``load``), made anew on the CPU with the dtypes of the saved arrays.
    Arrays of a layer rebuilt from its attributes are the saved ones; a
    constructed layer's arrays are filled by ``loadmodel`` afterwards.
    Raises CheckpointError naming the layer's path."""
    types, _ = _registry()
    spec = node.spec if isinstance(node, LayerState) else None
    where = f"`{path}`" if path else "the model"
    if spec is None:
        raise CheckpointError(f"the file holds the arrays of {where} but no description of the layer")
    problems = unknown_parts(spec, path)
    if problems:
        raise CheckpointError(problems[0])
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise _corrupt(path, f"is not a layer's: {spec!r:.80}")
    cls = types.get(spec["type"])
    if cls is None:
        raise CheckpointError(f"{where} is a layer of type {spec['type']!r}, which this program has not "
                              f"registered: if it is a class of your program, call "
                              f"`triflux.register_layer({spec['type']})` before load_model")
    built = {}
    try:
        if "attributes" in spec:
            layer = cls.__new__(cls)
            for k, v in _section(spec, "attributes", dict, path).items():
                setattr(layer, k, _resolve(v, node, path, built))
        else:
            args = [_resolve(v, node, path, built) for v in _section(spec, "args", list, path)]
            kwargs = {k: _resolve(v, node, path, built) for k, v in _section(spec, "kwargs", dict, path).items()}
            layer = cls(*args, **kwargs)
    except CheckpointError:
        raise
    except Exception as e:   # the constructor's check of a value from the file
        raise CheckpointError(f"the description of {where} does not build a {spec['type']}: "
                              f"{type(e).__name__}: {e}") from None
    if "active" in spec:
        if not (spec["active"] is None or isinstance(spec["active"], bool)):
            raise _corrupt(path, f"has the mode active={spec['active']!r:.40}")
        layer.active = spec["active"]
    for name, v in children(layer).items():
        _adopt_dtypes(v, node.get(name))
    return layer


def _section(spec, key, kind, path):
    v = spec.get(key, kind())
    if not isinstance(v, kind):
        raise _corrupt(path, f"has {key} {v!r:.80}")
    return v


def _resolve(v, node, path, built):
    """The Python value of a spec value; child layers built, arrays as Tensors."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_resolve(e, node, path, built) for e in v]
    if isinstance(v, dict):
        if "tuple" in v and isinstance(v["tuple"], list):
            return tuple(_resolve(e, node, path, built) for e in v["tuple"])
        if "dict" in v and isinstance(v["dict"], dict):
            return {k: _resolve(e, node, path, built) for k, e in v["dict"].items()}
        if v.get("float") in ("inf", "-inf", "nan"):
            return float(v["float"])
        if "function" in v:
            f = _FUNCTIONS.get(v["function"]) if isinstance(v["function"], str) else None
            if f is None:
                raise CheckpointError(
                    f"`{path}` uses the function {v['function']!r}, which this program has not registered: if it "
                    f"is a function of your program, call `triflux.register_layer({v['function']})` before "
                    "load_model")
            kwargs = v.get("kwargs")
            return f if kwargs is None else Activation(f, **_resolve({"dict": kwargs}, node, path, built))
        if "child" in v and isinstance(v["child"], list):
            return _child(v["child"], node, path, built)
    raise _corrupt(path, f"holds {v!r:.80}")


def _child(keys, node, path, built):
    """The layer or array at ``keys`` below ``node`` (built once, however often it is named)."""
    sub, where = node, path
    for k in keys:
        try:
            sub, where = sub[k], path_join(where, k)
        except (KeyError, IndexError, TypeError):
            raise _corrupt(path, f"names a child {keys!r:.80} its state does not have") from None
    if where not in built:
        if isinstance(sub, np.ndarray):
            built[where] = tensor(sub)
        elif isinstance(sub, LayerState):
            built[where] = build(sub, where)
        else:
            raise _corrupt(path, f"names a child {keys!r:.80} that holds no layer or array")
    return built[where]


def _adopt_dtypes(x, s):
    """Give each array of a newly made layer the dtype of its saved array
    (bfloat16 and float16 models rebuild as such); child layers did theirs."""
    if isinstance(x, Tensor) and isinstance(s, np.ndarray):
        if x.dtype != s.dtype and x.shape == s.shape:
            x._data = ops.cast(x, s.dtype)._data
    elif isinstance(x, (list, tuple)) and isinstance(s, list):
        for a, b in zip(x, s):
            _adopt_dtypes(a, b)
    elif isinstance(x, dict) and isinstance(s, dict) and not is_layer(x):
        for k, a in x.items():
            _adopt_dtypes(a, s.get(k))
