"""Where a structure's arrays live, and moving them between devices (Flux's
``gpu``/``cpu``, MLDataDevices' ``get_device`` and callable devices).

A structure (tensor, NumPy array, layer, model, tuple/list/dict, see
``triflux.functor``) moves leaf by leaf; every array leaf arrives as a
``Tensor``. Other types that know how to move register a method of
``move`` (``DataLoader`` does: it yields its batches on the device).
"""
import functools

import numpy as np

from . import ops
from .devices import CPU, Device, MetalDevice, select_device
from .errors import DeviceMismatchError
from .functor import acyclic, fmap, leaves
from .tensor import Tensor, numeric, transfer


def _leaf_to(leaf, device, f64_to_f32):
    if isinstance(leaf, Tensor):
        if f64_to_f32 and leaf.dtype == np.float64:
            leaf = ops.cast(leaf, np.float32)
        return transfer(leaf, device)
    arr = numeric(np.asarray(leaf))
    if f64_to_f32 and arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return transfer(Tensor._from_numpy(arr), device)


@functools.singledispatch
def move(x, device, f64_to_f32=False):
    """``x`` with every array leaf on ``device`` (float64 arrays as float32
    when ``f64_to_f32``)."""
    return acyclic(lambda v: fmap(lambda leaf: _leaf_to(leaf, device, f64_to_f32), v), x,
                    lambda: f"moving x to {device!r}")


def _call(device, x):
    """``device(x)``: ``x`` (any structure: a Tensor, a NumPy array, a layer
    or model, tuples/lists/dicts of them, a ``DataLoader``) with every array
    on ``device``, each as a ``Tensor``; other values stay as they are.

    Element types are kept, as MLDataDevices' device objects do: a float64
    array stays float64, and layers with float32 parameters then convert it
    at every call (with a warning). ``gpu(x)`` moves and turns float64 into
    float32 in one step; ``f32(x)`` converts without moving."""
    return move(x, device)


Device.__call__ = _call


def gpu(x):
    """Move ``x`` (any structure) to the default GPU device, turning float64
    arrays into float32 and keeping integer, bool and float16 arrays, like
    Flux's ``gpu``/``cu``. A no-op returning ``x`` unchanged when no GPU
    backend is functional here.

    A device object (``get_device("CUDA")(x)``, ``gpu_device()(x)``) moves
    ``x`` too but keeps every dtype, float64 included: use ``gpu(x)`` (or
    ``f32(x)`` before moving) for float32 layers."""
    dev = select_device()
    if dev.is_cpu or isinstance(dev, MetalDevice):
        return x
    return move(x, dev, f64_to_f32=True)


def cpu(x):
    """Move ``x`` (any structure) to the CPU device."""
    return move(x, CPU)


def device_of(x):
    """The one device ``x``'s arrays live on, ``None`` if it holds none."""
    found = []
    for leaf in acyclic(leaves, x, lambda: "get_device(x)"):
        d = leaf.device if isinstance(leaf, Tensor) else CPU
        if d not in found:
            found.append(d)
    if not found:
        return None
    if len(found) > 1:
        raise DeviceMismatchError(
            f"the arrays of this {type(x).__name__} live on different devices: "
            f"{', '.join(map(repr, found))}; move it to one with `gpu(x)` or `cpu(x)`")
    return found[0]


def get_device(x=None, backend_name=None, idx=0, verbose=False, **kw):
    """Two uses, as in Flux:

    * ``get_device(x)`` for a tensor, array or model: the device it lives on
      (``None`` if it holds no arrays); an error naming the devices if they
      disagree.
    * ``get_device(backend=None, idx=0, verbose=False)`` (or
      ``get_device("CUDA", 1)``, ``get_device("cuda:1")``): a device object,
      chosen as ``triflux.devices.select_device`` says (the preference, then
      the first functional backend; ``verbose`` logs why).
    """
    if "backend" in kw:
        backend_name = kw.pop("backend")
    if kw:
        raise TypeError(f"unexpected keywords {sorted(kw)}")
    if isinstance(x, str):           # get_device("CUDA", 1): backend and index by position
        if backend_name is not None:
            idx = backend_name
        backend_name, x = x, None
    if x is not None:
        return device_of(x)
    return select_device(backend_name, idx, verbose)
