"""Tensors through DLPack: :func:`from_dlpack` takes any object with
``__dlpack__`` (torch, NumPy >= 1.22, CuPy, JAX arrays) or a DLPack capsule
and returns a triflux ``Tensor`` sharing its memory where the device allows;
:func:`to_dlpack` returns a capsule of a triflux ``Tensor``, without a copy.
Which device a tensor lands on is in the package's docstring
(``pydoc triflux.interop``)."""
import numpy as np

from triflux import backend
from triflux import dtypes as _dt
from triflux.devices import AMDGPUDevice, CUDADevice, as_device
from triflux.errors import DTypeError, InteropError, TrifluxError
from triflux.tensor import Tensor, transfer
from .torch_modules import import_torch

#: DLPack device types (dlpack.h DLDeviceType)
kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM, kDLCUDAManaged = 1, 2, 3, 10, 13


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _dlpack_device(obj):
    if hasattr(obj, "__dlpack_device__"):
        kind, idx = obj.__dlpack_device__()
        return int(kind), int(idx)
    return None


def _on_interpreter_device(device):
    """Whether ``device`` is a Triton-interpreter device (host memory)."""
    return device is not None and not device.is_cpu and backend.interpreter_on() and \
        device.torch_device.type == "cpu"


def _check_torch_dtype(t):
    if t.dtype != import_torch().bfloat16:
        _dt.from_torch(t.dtype)   # a DTypeError for complex and other unsupported dtypes


def _from_torch_tensor(t, device):
    """A triflux Tensor over torch tensor ``t``'s memory (no copy where the
    device allows), on ``device`` or else the device ``t`` lives on."""
    t = t.detach()
    _check_torch_dtype(t)
    if t.device.type == "cpu":
        if _on_interpreter_device(device):
            return Tensor._make(t, device)
        out = Tensor._from_numpy(_torch_cpu_to_numpy_view(t))
    elif t.device.type != "cuda":    # torch's ROCm builds call their devices "cuda" too
        raise TrifluxError(f"arrays on torch device {t.device} have no triflux device; copy them to the CPU first")
    else:
        if backend.interpreter_on():
            raise TrifluxError(f"a {t.device} array cannot become a triflux Tensor while the Triton "
                               "interpreter serves the CUDA device (TRITON_INTERPRET=1); copy it to the "
                               "CPU first")
        cls = AMDGPUDevice if getattr(import_torch().version, "hip", None) else CUDADevice
        out = Tensor._make(t, cls(t.device.index or 0))
    return out if device is None else transfer(out, device)


def _torch_cpu_to_numpy_view(t):
    """A NumPy array over torch CPU tensor ``t``'s memory (bfloat16 viewed as
    ml_dtypes.bfloat16)."""
    torch = import_torch()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_dt.bfloat16)
    return t.numpy()


def from_dlpack(obj, device=None):
    """A triflux Tensor over the memory of ``obj`` (any object with
    ``__dlpack__``, or a DLPack capsule), without a copy where possible. See
    the package's docstring (``pydoc triflux.interop``) for which device it
    lands on; ``device`` asks for one (copying unless it holds the producer's
    memory)."""
    dev = None if device is None else as_device(device)
    if isinstance(obj, Tensor):
        return obj if dev is None else transfer(obj, dev)
    if type(obj).__module__.startswith("torch") and hasattr(obj, "__dlpack__"):
        return _from_torch_tensor(obj, dev)
    if isinstance(obj, np.ndarray) and _dt.is_bfloat16(obj.dtype):   # not a DLPack dtype; shared all the same
        obj = Tensor._from_numpy(obj)
        return obj if dev is None else transfer(obj, dev)
    if _is_capsule(obj):
        return _from_torch_tensor(import_torch().utils.dlpack.from_dlpack(obj), dev)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__ (a torch, NumPy, CuPy or JAX array) or a "
                        f"DLPack capsule, got {type(obj).__name__}")
    kind = _dlpack_device(obj)
    if kind is not None and kind[0] not in (kDLCPU, kDLCUDAHost):   # device memory: through torch
        return _from_torch_tensor(import_torch().from_dlpack(obj), dev)
    try:
        arr = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError) as e:   # bfloat16 and friends: through torch
        try:
            torch = import_torch()
        except InteropError:
            raise DTypeError(f"NumPy cannot import this array through DLPack ({e}); with torch installed "
                             "triflux imports bfloat16 arrays too") from None
        return _from_torch_tensor(torch.from_dlpack(obj), dev)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"dtype {arr.dtype} is not supported by triflux; use a float, integer or bool array")
    if _on_interpreter_device(dev):
        return Tensor._make(import_torch().from_numpy(arr), dev)
    out = Tensor._from_numpy(arr)
    return out if dev is None else transfer(out, dev)


def to_dlpack(t):
    """A DLPack capsule over triflux Tensor ``t``'s memory (no copy), the
    legacy exchange (``torch.from_dlpack(capsule)``, CuPy's and older JAX's
    ``from_dlpack``). Consumers that want an object with ``__dlpack__``
    (``np.from_dlpack``, newer JAX) take the Tensor itself, whose protocol
    methods are ``Tensor.__dlpack__`` and ``Tensor.__dlpack_device__``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"to_dlpack expects a triflux Tensor, got {type(t).__name__}")
    return t.__dlpack__()
