"""Running a primitive on a device: the one place where a declared
primitive becomes a call.

``implementation(prim, device, direction)`` is the callable that computes
``prim`` there: the NumPy reference (``triflux.reference.<family>``) on the
CPU, the Triton kernel (``triflux.triton_kernels.<family>``) on a GPU.
``apply`` checks that the inputs share a device, calls the implementation on
their storage, wraps the result as a Tensor on that device and records the
call on the tape while ``gradient`` runs. The user-facing functions of
``triflux.ops`` validate their arguments and end in ``apply``; autodiff
calls the backward implementations, optimisers the in-place updates.
"""
from . import tape
from .devices import move_code
from .errors import DeviceMismatchError
from .tensor import Tensor


def implementation(prim, device, direction="forward"):
    """The callable computing ``prim``'s ``direction`` ("forward" or
    "backward") on ``device``: the reference on the CPU, the kernel on a GPU."""
    return prim.reference(direction) if device.is_cpu else prim.kernel(direction)


def device_mismatch(opname, devices):
    """The ``DeviceMismatchError`` for operation ``opname`` given tensors on ``devices``."""
    a, b = devices[0], next(d for d in devices if d != devices[0])
    fixes = [f"`{move_code(d)}` moves x to {d!r}" for d in (a, b)]
    if not (a.is_cpu or b.is_cpu):
        fixes.append("`cpu(x)` to the CPU")
    return DeviceMismatchError(f"`{opname}` got tensors on different devices: {a!r} and {b!r}. "
                               f"Put them on one device first: {', '.join(fixes)}.")


def common_device(opname, tensors):
    """The device all ``tensors`` live on, or a ``DeviceMismatchError``."""
    dev = tensors[0]._device
    for t in tensors:
        if t._device is not dev and t._device != dev:
            raise device_mismatch(opname, [t._device for t in tensors])
    return dev


def apply(prim, inputs, attrs, opname=None, record=True, device=None):
    """Run primitive ``prim`` on Tensors ``inputs`` on their (common) device,
    recording it for ``gradient`` unless ``record`` is false; ``device``: the
    inputs' device where the caller has checked it already."""
    dev = common_device(opname or prim.name, inputs) if device is None else device
    out = Tensor._make(implementation(prim, dev)(*[t._data for t in inputs], **attrs), dev)
    recording = tape.TAPE
    if recording is not None and record:
        recording.record(prim, inputs, out, attrs)
    return out


def create(prim, device, attrs):
    """Run a primitive without tensor inputs (a fill) on ``device``."""
    return Tensor._make(implementation(prim, device)(**attrs, device=device), device)
