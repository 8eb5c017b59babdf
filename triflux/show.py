"""Printing models the way Flux does, on any device (a Tensor prints itself).

    Chain(
      Dense(784 => 32, relu),               # 25_120 parameters
      Dense(32 => 10),                      # 330 parameters
    )                   # Total: 4 arrays, 25_450 parameters, 99.664 KiB.
"""
import numpy as np

from . import dtypes as _dt
from .functor import children, is_layer, leaves
from .memory import format_bytes
from .tensor import Tensor


def fname(f):
    return getattr(f, "__name__", None) or repr(f)


def _param_info(layer):
    """(trainable arrays, trainable params, non-trainable params, bytes, flags)."""
    nontrain = set()
    _collect_nontrainable(layer, nontrain)
    arrays = params = extra = nbytes = 0
    nan = inf = False
    for leaf in leaves(layer):
        size = leaf.size
        nbytes += size * leaf.dtype.itemsize
        if id(leaf) in nontrain:
            extra += size
        else:
            arrays += 1
            params += size
        if _dt.is_floating(leaf.dtype):
            values = leaf.numpy() if isinstance(leaf, Tensor) else leaf
            values = values.astype(np.float32)
            nan |= bool(np.isnan(values).any())
            inf |= bool(np.isinf(values).any())
    return arrays, params, extra, nbytes, nan, inf


def _collect_nontrainable(x, out):
    if is_layer(x):
        for name, v in children(x).items():
            if name in type(x)._nontrainable:
                out.update(id(leaf) for leaf in leaves(v))
            else:
                _collect_nontrainable(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _collect_nontrainable(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _collect_nontrainable(v, out)


def _count(arrays, params, extra, nan, inf):
    s = f"{params:_} parameters"
    if extra:
        s += f", plus {extra:_} non-trainable"
    if nan:
        s += "  (some NaN)"
    elif inf:
        s += "  (some Inf)"
    return s


def _is_container(x):
    """Whether ``x`` prints as a block of its layers, one per line (a layer
    whose class sets ``_big_show``, Flux's name: ``Chain``)."""
    return is_layer(x) and getattr(type(x), "_big_show", False)


def layer_repr(layer):
    if _is_container(layer):
        return "\n".join(_container_lines(layer, 0, top=True))
    text = f"{type(layer).__name__}({layer._signature()})"
    a, p, e, _, nan, inf = _param_info(layer)
    return f"{text}  # {_count(a, p, e, nan, inf)}" if p or e else text


def _line(text, comment):
    return f"{text:<36}  # {comment}" if comment else text


def _container_lines(chain, indent, top=False, name=None):
    pad = "  " * indent
    lines = [f"{pad}{name + '=' if name else ''}Chain("]
    items = chain.layers.items() if isinstance(chain.layers, dict) else [(None, l) for l in chain.layers]
    for key, l in items:
        label = f"{key}=" if key else ""
        if _is_container(l):
            lines += _container_lines(l, indent + 1, name=key)
        elif is_layer(l):
            a, p, e, _, nan, inf = _param_info(l)
            lines.append(_line(f"{pad}  {label}{type(l).__name__}({l._signature()}),",
                               _count(a, p, e, nan, inf) if p or e else ""))
        else:
            lines.append(f"{pad}  {label}{fname(l)},")
    if top:
        a, p, e, b, nan, inf = _param_info(chain)
        total = f"Total: {a} arrays, {p:_} parameters"
        if e:
            total += f", plus {e:_} non-trainable"
        total += f", {format_bytes(b)}."
        lines.append(f"{pad})" + " " * 19 + f"# {total}")
    else:
        lines.append(f"{pad}),")
    return lines
