"""The conversion protocol: one :class:`Conversion` per supported pair of a
torch module and a triflux layer or function, and the walk over a model that
converts each part by looking it up (:func:`convert_from`,
:func:`convert_to`).

The table itself, ``CONVERSIONS``, is in :mod:`triflux.interop.table`, which
imports every family's conversions and hands them to :func:`install`. The
families convert their children (a Chain's layers, a layer's activation)
through :func:`convert_from` and :func:`convert_to`, so they need this
module, not the table: the families sit below the table, which lists them.
"""
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

from triflux import activations as A
from triflux.errors import InteropError
from triflux.functor import is_layer
from triflux.show import fname
from .activation_arguments import Activation
from .torch_modules import HOME, OWN_TORCH_MODULES, torch_class, torch_name


@dataclass(frozen=True)
class Conversion:
    """One supported pair: the torch modules named in ``torch`` and the triflux
    layer classes (matched by exact type) or functions (matched by identity;
    an ``Activation`` by its ``fn``) in ``triflux``; ``triflux_names`` names
    layer classes by module and class name instead, for those interop does not
    import (``triflux.models.UNet``).

    ``from_torch(module, path, options)`` builds the triflux layer (``options``
    is a ``FromOptions``); ``to_torch(x, path)`` builds the torch module. Either
    may be None for a one-way entry. ``path`` names the place in the model for
    errors. ``shown`` lists the triflux side in to_torch's error where its names
    do not say enough."""
    torch: tuple
    triflux: tuple
    from_torch: Optional[Callable]
    to_torch: Optional[Callable]
    shown: str = ""
    triflux_names: tuple = ()


@dataclass(frozen=True)
class FromOptions:
    """from_torch's options, passed down the module tree."""
    approximate_gelu: bool = False
    train_active: Optional[bool] = None   # the mode of BatchNorm/Dropout in training mode: automatic or pinned


def refuse_from(path, m, what, fix=""):
    """Raise the error for torch module ``m`` at ``path`` whose ``what`` triflux lacks."""
    raise InteropError(f"{path} ({torch_name(type(m))}): {what} is not supported by triflux"
                       + (f"; {fix}" if fix else ""))


def refuse_to(path, what, fix=""):
    """Raise the error for the part at ``path`` (``what``) that torch cannot express."""
    raise InteropError(f"{path} ({what}) cannot be translated to torch" + (f"; {fix}" if fix else ""))


def active_for(m, options):
    """``active`` of the triflux layer for torch module ``m``: pinned to test
    behaviour in eval mode, ``options.train_active`` in training mode."""
    return options.train_active if m.training else False


# --- the installed table ----------------------------------------------------------------------

_TABLE = []             # every Conversion, in the order of the error messages
_BY_TORCH = {}          # torch module class name -> Conversion (those with a from_torch)
_BY_TRIFLUX = {}        # triflux layer class or function -> Conversion (those with a to_torch)
_BY_TRIFLUX_NAME = {}   # "module.Class" of a triflux layer -> Conversion (those with a to_torch)


def _index(pairs):
    """{key: Conversion} from (key, Conversion) pairs; a key in two entries is a mistake in the table."""
    index = {}
    for key, c in pairs:
        if key in index:
            raise TypeError(f"{getattr(key, '__name__', key)} is in two entries of triflux.interop.CONVERSIONS")
        index[key] = c
    return index


def install(conversions):
    """Make ``conversions`` the table :func:`convert_from` and :func:`convert_to` read."""
    by_torch = _index((name, c) for c in conversions if c.from_torch for name in c.torch)
    by_triflux = _index((key, c) for c in conversions if c.to_torch for key in c.triflux)
    by_name = _index((name, c) for c in conversions if c.to_torch for name in c.triflux_names)
    for table, new in ((_BY_TORCH, by_torch), (_BY_TRIFLUX, by_triflux), (_BY_TRIFLUX_NAME, by_name)):
        table.clear()
        table.update(new)
    _TABLE[:] = conversions
    _from_torch_classes.cache_clear()


def supported_torch():
    """The torch modules from_torch takes (triflux's own as ``triflux.interop.<name>``)."""
    return tuple(f"{HOME}.{name}" if name in OWN_TORCH_MODULES else name for name in _BY_TORCH)


def supported_triflux():
    """What to_torch takes, as its error lists it."""
    layers, functions, activations = [], [], []
    for c in _TABLE:
        if c.to_torch is None:
            continue
        if c.shown:
            (layers if isinstance(c.triflux[0], type) else functions).append(c.shown)
            continue
        for key in c.triflux:
            if getattr(key, "__module__", "").startswith(HOME + "."):   # made here (torch's implicit softmax axis)
                continue
            (layers if isinstance(key, type) else activations if key.__module__ == A.__name__
             else functions).append(key.__name__)
    return f"{', '.join(layers + functions)} and the activations {', '.join(activations)}"


@lru_cache(maxsize=None)
def _from_torch_classes():
    """{torch module class: its Conversion}, built on first use (it imports torch)."""
    return {torch_class(name): c for name, c in _BY_TORCH.items()}


# --- the walk ---------------------------------------------------------------------------------

def convert_from(m, path, options):
    """The triflux layer or function for torch module ``m`` at ``path``."""
    conversion = _from_torch_classes().get(type(m))
    if conversion is None:
        raise InteropError(f"{path} ({torch_name(type(m))}) is not supported yet; supported: "
                           f"{', '.join(supported_torch())}. Translate that part by hand (triflux layers take "
                           "PyTorch's weight layouts) or wrap the rest around it.")
    return conversion.from_torch(m, path, options)


def _to_torch_conversion(x):
    """The Conversion for triflux layer or function ``x``, or None."""
    if is_layer(x):
        cls = type(x)
        return _BY_TRIFLUX_NAME.get(f"{cls.__module__}.{cls.__qualname__}") or _BY_TRIFLUX.get(cls)
    if isinstance(x, type):
        return None
    try:
        return _BY_TRIFLUX.get(x.fn if isinstance(x, Activation) else x)
    except TypeError:   # unhashable callables
        return None


def convert_to(x, path):
    """The torch module for triflux layer or function ``x`` at ``path``."""
    conversion = _to_torch_conversion(x)
    if conversion is not None:
        return conversion.to_torch(x, path)
    if isinstance(x, Activation):
        refuse_to(path, f"activation {x.__name__}")
    what = f"{type(x).__module__}.{type(x).__qualname__}" if is_layer(x) else f"function {fname(x)}"
    refuse_to(path, what, f"supported: {supported_triflux()}")


# --- what to_torch knows of the whole model ----------------------------------------------------

#: id(BatchNorm, InstanceNorm or global pool) -> the spatial rank of its input, for the model being
#: translated (set by ``table.to_torch`` for the duration of one translation)
FEEDING_RANKS = {}


def feeding_rank(layer, default=2):
    """The spatial rank of what feeds ``layer`` in the model being translated (``default`` when nothing says)."""
    return FEEDING_RANKS.get(id(layer), default)
