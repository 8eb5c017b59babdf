"""Devices, and moving any structure between them (Flux's ``gpu``/``cpu`` and
MLDataDevices' device objects).

A device is a small hashable value: ``CPUDevice()``, ``CUDADevice(idx)``,
``AMDGPUDevice(idx)``, ``MetalDevice()``. Calling one on any structure
(tensor, NumPy array, layer, model, tuple/list/dict, DataLoader) returns the
structure with every array on that device, as ``Tensor``s.
"""
import logging
import sys

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
        Triton interpreter, for every virtual device)."""
        tdev = _TORCH_DEVICES.get(self)
        if tdev is None:
            backend.require(self.backend)
            check_index(self)
            torch = backend.torch()
            if backend.facts().interpreter:
                tdev = torch.device("cpu")
            else:
                tdev = torch.device("cuda", self.idx)   # ROCm builds of torch call AMD GPUs "cuda" too
            _TORCH_DEVICES[self] = tdev
        return tdev

    @property
    def name(self):
        """The device's name (the GPU model, or the interpreter's virtual device)."""
        check_index(self)
        return backend.visible_devices()[self.idx][1]

    def __repr__(self):
        if backend.interpreter_on():
            return f"{type(self).__name__}({self.idx}) [Triton interpreter on the CPU]"
        return f"{type(self).__name__}({self.idx})"


def check_index(dev):
    """Raise a NoGPUError when ``dev.idx`` is not a visible device."""
    n = backend.device_count(dev.backend)
    if dev.idx >= n:
        have = f"indices 0..{n - 1}" if n else "none"
        raise NoGPUError(
            f"{type(dev).__name__}({dev.idx}) does not exist: {n} {dev.backend} device(s) visible ({have}); "
            f"{backend.describe_visibility()}. Device indices count the visible devices from 0.")


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


#: ``get_device(verbose=True)`` reports through this logger (INFO for the
#: choice and each skipped backend, WARNING for a preference that cannot be
#: honoured). When nothing is configured to show it, the first verbose call
#: gives it a handler that writes Flux-style lines (``[ Info: ...``) to
#: stderr and lowers its level to INFO; an application that configures
#: logging keeps control (set the "triflux" logger to INFO to see them).
logger = logging.getLogger("triflux")


class _FluxStyle(logging.Formatter):
    def format(self, record):
        return f"[ {record.levelname.capitalize()}: {record.getMessage()}"


def _verbose_logger():
    if not logger.hasHandlers():
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(_FluxStyle())
        logger.addHandler(h)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return logger


class _Quiet:
    def info(self, *a, **k):
        pass

    warning = info


def _device_for(name, idx):
    if name == "CPU":
        return CPU
    if name == "Metal":
        return MetalDevice()
    dev = _CLASSES[name](idx)
    check_index(dev)
    return dev


def _parse_name(name, idx):
    """"CUDA" or "cuda:1" -> (canonical backend, idx)."""
    base, sep, rest = str(name).partition(":")
    if sep:
        try:
            idx = int(rest)
        except ValueError:
            raise ValueError(f"bad device name {name!r}; write it like 'cuda:1'") from None
    return _canonical(base), idx


def get_device(x=None, backend_name=None, idx=0, verbose=False, **kw):
    """Two uses, as in Flux:

    * ``get_device(x)`` for a tensor, array or model: the device it lives on
      (``None`` if it holds no arrays); an error naming the devices if they
      disagree.
    * ``get_device(backend=None, idx=0, verbose=False)`` (or
      ``get_device("CUDA", 1)``, ``get_device("cuda:1")``): a device object.
      With a backend: that backend's device ``idx`` (0-based among the
      visible devices, see ``CUDA_VISIBLE_DEVICES``), or a ``NoGPUError``
      that says why it is not functional or how many devices there are.
      With no backend: the preference (``gpu_backend``, ``GPU_BACKEND``)
      first, then CUDA, AMDGPU, Metal, CPU, the first that is functional.
      ``verbose=True`` logs the choice and why each backend before it was
      skipped, on the "triflux" logger (see ``triflux.devices.logger``)::

          [ Info: Using backend set in preferences: CUDA.
          [ Warning: Trying to use backend: CUDA but it is not functional: ...
          [ Info: Skipping AMDGPU: this torch is not a ROCm build ...
          [ Info: No functional GPU backend found! Defaulting to CPU.
          [ Info: Using backend: CPU.
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
    idx = int(idx)
    log = _verbose_logger() if verbose else _Quiet()
    if backend_name is not None:
        name, idx = _parse_name(backend_name, idx)
        if name not in ("CPU", "Metal"):
            backend.require(name)
        dev = _device_for(name, idx)
        log.info(f"Using backend: {name}{_which(dev)}.")
        return dev
    tried = []
    pref = _preferred_backend()
    if pref:
        log.info(f"Using backend set in preferences: {pref}.")
        if pref == "CPU":
            return CPU
        ok, why = backend.status(pref)
        if ok:
            dev = _device_for(pref, idx)
            log.info(f"Using backend: {pref}{_which(dev)}.")
            return dev
        log.warning(f"Trying to use backend: {pref} but it is not functional here: {why}. "
                    "Choosing a backend automatically; fix the cause, or change the preference "
                    "with `triflux.gpu_backend(name)` and restart.")
        tried.append(pref)
    for name in ("CUDA", "AMDGPU", "Metal"):
        if name in tried:
            continue
        ok, why = backend.status(name)
        if ok:
            dev = _device_for(name, idx)
            log.info(f"Using backend: {name}{_which(dev)}.")
            return dev
        log.info(f"Skipping {name}: {why}.")
    log.info("No functional GPU backend found! Defaulting to CPU.")
    log.info("Using backend: CPU.")
    return CPU


def _which(dev):
    if dev.is_cpu or dev.idx is None:
        return ""
    try:
        return f", device {dev.idx} ({dev.name})"
    except Exception:
        return f", device {dev.idx}"


def gpu_device(idx=None, verbose=False, force=False):
    """The default GPU device (preference, then CUDA, AMDGPU), or the CPU
    device when none is functional, as MLDataDevices' ``gpu_device``;
    ``force=True`` raises a ``NoGPUError`` (with every backend's reason)
    instead of falling back to the CPU."""
    dev = get_device(idx=idx or 0, verbose=verbose)
    if force and (dev.is_cpu or isinstance(dev, MetalDevice)):
        reasons = "; ".join(f"{b}: {backend.status(b)[1]}" for b in ("CUDA", "AMDGPU", "Metal"))
        raise NoGPUError(f"no functional GPU backend found ({reasons}). "
                         "Run `python -m triflux doctor` for details.")
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
