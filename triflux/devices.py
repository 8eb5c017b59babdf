"""Devices, and moving any structure between them (Flux's ``gpu``/``cpu`` and
MLDataDevices' device objects).

A device is a small hashable value: ``CPUDevice()``, ``CUDADevice(idx)``,
``AMDGPUDevice(idx)``, ``MetalDevice()``. Calling one on any structure
(tensor, NumPy array, layer, model, tuple/list/dict, DataLoader) returns the
structure with every array on that device, as ``Tensor``s.
"""
import numpy as np

from . import backend
from .errors import BackendNotSupportedError, NoGPUError

SUPPORTED = ("CUDA", "AMDGPU", "Metal", "CPU")


def supported_devices():
    """The backends triflux knows: ``("CUDA", "AMDGPU", "Metal", "CPU")``."""
    return SUPPORTED


def functional(backend_name="CUDA"):
    """Whether ``backend_name`` can run kernels here."""
    return backend.functional(_canonical(backend_name))


def _canonical(name):
    for b in SUPPORTED:
        if str(name).lower() == b.lower():
            return b
    raise ValueError(f"unknown backend {name!r}; valid backends are {', '.join(SUPPORTED)}")


class Device:
    """Base class of devices. ``device(x)`` moves ``x`` to this device."""
    backend = None
    is_cpu = False
    idx = None

    def __call__(self, x):
        return move(x, self)

    def __eq__(self, other):
        return type(self) is type(other) and self.idx == other.idx

    def __hash__(self):
        return hash((type(self).__name__, self.idx))


class CPUDevice(Device):
    """The CPU: NumPy arrays, computed by the reference implementations."""
    backend = "CPU"
    is_cpu = True

    def __repr__(self):
        return "CPUDevice()"


class _TritonDevice(Device):
    """A GPU served by Triton kernels; torch only holds the memory."""

    def __init__(self, idx=0):
        idx = int(idx)
        if idx < 0:
            raise ValueError(f"{type(self).__name__} index must be >= 0, got {idx}")
        self.idx = idx

    @property
    def torch_device(self):
        """The torch device holding this device's memory (the CPU under the
        Triton interpreter)."""
        tdev = _TORCH_DEVICES.get(self)
        if tdev is None:
            backend.require(self.backend)
            torch = backend.torch()
            if backend.interpreter_on():
                tdev = torch.device("cpu")
            else:
                n = backend.device_count(self.backend)
                if self.idx >= n:
                    raise NoGPUError(f"{self!r} does not exist: {n} {self.backend} device(s) visible "
                                     f"(indices 0..{n - 1}); check CUDA_VISIBLE_DEVICES")
                tdev = torch.device("cuda", self.idx)
            _TORCH_DEVICES[self] = tdev
        return tdev

    def __repr__(self):
        if backend.interpreter_on():
            return f"{type(self).__name__}({self.idx}) [Triton interpreter on the CPU]"
        return f"{type(self).__name__}({self.idx})"


_TORCH_DEVICES = {}


class CUDADevice(_TritonDevice):
    """An NVIDIA GPU (or the Triton interpreter with TRITON_INTERPRET=1)."""
    backend = "CUDA"


class AMDGPUDevice(_TritonDevice):
    """An AMD GPU, through Triton's AMD backend and a ROCm build of torch."""
    backend = "AMDGPU"


class MetalDevice(Device):
    """Apple GPUs. Triton has no Metal backend, so moving data here raises."""
    backend = "Metal"
    idx = None

    def __init__(self, idx=None):
        pass

    def __call__(self, x):
        raise BackendNotSupportedError(
            "Metal is not supported: Triton has no Metal backend. Use the CPU device "
            "(`cpu_device()` / `cpu(x)`), which runs everything with NumPy.")

    def __repr__(self):
        return "MetalDevice()"


_CLASSES = {"CPU": CPUDevice, "CUDA": CUDADevice, "AMDGPU": AMDGPUDevice, "Metal": MetalDevice}
CPU = CPUDevice()


def cpu_device():
    return CPU


def _preferred_backend():
    from .preferences import gpu_backend_preference
    return gpu_backend_preference()


def get_device(x=None, backend_name=None, idx=0, verbose=False, **kw):
    """Two uses, as in Flux:

    * ``get_device(x)`` for a tensor, array or model: the device it lives on
      (``None`` if it holds no arrays); an error naming the devices if they
      disagree.
    * ``get_device(backend=None, idx=0, verbose=False)``: a device object. With
      no backend: the preference (``gpu_backend``) first, then CUDA, AMDGPU,
      Metal, CPU, the first that is functional.
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
    log = (lambda msg: print(f"[triflux] {msg}")) if verbose else (lambda msg: None)
    if backend_name is not None:
        name = _canonical(backend_name)
        if name == "CPU":
            return CPU
        if name == "Metal":
            return MetalDevice()
        backend.require(name)
        return _CLASSES[name](idx)
    order = []
    pref = _preferred_backend()
    if pref:
        order.append(pref)
    order += [b for b in ("CUDA", "AMDGPU", "Metal") if b not in order]
    for name in order:
        if name == "CPU":
            log("Using the CPU device (preference).")
            return CPU
        ok, why = backend.status(name)
        if ok:
            log(f"Using {name} device {idx}: {why}.")
            return _CLASSES[name](idx)
        log(f"{name} is not functional: {why}.")
    log("No functional GPU backend; using the CPU device.")
    return CPU


def gpu_device(idx=None, verbose=False):
    """The default GPU device (preference, then CUDA, AMDGPU), or the CPU
    device when none is functional, as MLDataDevices' ``gpu_device``."""
    dev = get_device(idx=idx or 0, verbose=verbose)
    return dev


# --- moving structures ---------------------------------------------------------------

def _leaf_to(leaf, device, f64_to_f32):
    from .tensor import Tensor, transfer
    if isinstance(leaf, Tensor):
        if f64_to_f32 and leaf.dtype == np.float64:
            from . import ops
            leaf = ops.cast(leaf, np.float32)
        return transfer(leaf, device)
    arr = np.asarray(leaf)
    if f64_to_f32 and arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return transfer(Tensor._from_numpy(arr), device)


def move(x, device, f64_to_f32=False):
    """``x`` with every array leaf on ``device``."""
    from .functor import fmap
    from .data import DataLoader
    if isinstance(x, DataLoader):
        return x.to(device, f64_to_f32=f64_to_f32)
    return fmap(lambda leaf: _leaf_to(leaf, device, f64_to_f32), x)


def gpu(x):
    """Move ``x`` (any structure) to the default GPU device, turning float64
    arrays into float32 and keeping integer, bool and float16 arrays, like
    Flux's ``gpu``/``cu``. A no-op returning ``x`` unchanged when no GPU
    backend is functional here."""
    dev = get_device()
    if dev.is_cpu or isinstance(dev, MetalDevice):
        return x
    return move(x, dev, f64_to_f32=True)


def cpu(x):
    """Move ``x`` (any structure) to the CPU device."""
    return move(x, CPU)


def device_of(x):
    """The one device ``x``'s arrays live on, ``None`` if it holds none."""
    from .functor import leaves
    from .tensor import Tensor
    from .errors import DeviceMismatchError
    found = []
    for leaf in leaves(x):
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


def reclaim():
    """Free memory that is no longer used: run Python's garbage collector and
    give the device allocator's cached blocks back to the driver (CUDA's
    ``reclaim``). Safe to call on any machine."""
    import gc
    import sys
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and not backend.interpreter_on() and torch.cuda.is_available():
        torch.cuda.empty_cache()
