"""Device objects (MLDataDevices' ``CPUDevice``, ``CUDADevice``, ...) and
choosing one (``select_device``, ``gpu_device``, ``as_device``).

A device is a small hashable value: ``CPUDevice()``, ``CUDADevice(idx)``,
``AMDGPUDevice(idx)``, ``MetalDevice()``. Calling one on any structure
moves it there (``triflux.moving`` gives devices that call); ``devices(name)``
lists a backend's devices; ``move_code(device)`` is the code an error message
shows to move data there.

``triflux.devices`` (the package attribute) is the function ``devices``, not
this module: reach the module with ``from triflux.devices import ...`` or
``importlib.import_module("triflux.devices")``.
"""
import gc
import logging
import sys

from . import backend
from .arguments import is_int
from .errors import ArgumentError, BackendNotSupportedError, NoGPUError
from .preferences import gpu_backend_preference
from .reference._allocator import give_back as give_back_heap

SUPPORTED = ("CUDA", "AMDGPU", "Metal", "CPU")


def supported_devices():
    """The backends triflux knows: ``("CUDA", "AMDGPU", "Metal", "CPU")``."""
    return SUPPORTED


def functional(backend_name="CUDA"):
    """Whether ``backend_name`` ("CUDA", "AMDGPU", "Metal" or "CPU", any case)
    can run kernels here: Flux's ``CUDA.functional()``. The CPU always can;
    "CUDA" can with an NVIDIA GPU and Triton, or with ``TRITON_INTERPRET=1``
    (the Triton interpreter on the CPU). ``backend.status(name)`` says why
    not::

        dev = get_device("CUDA") if functional("CUDA") else cpu_device()
    """
    return backend.functional(_canonical(backend_name))


def _canonical(name):
    for b in SUPPORTED:
        if str(name).lower() == b.lower():
            return b
    raise ValueError(f"unknown backend {name!r}; valid backends are {', '.join(SUPPORTED)}")


class Device:
    """Base class of devices. ``device(x)`` moves ``x`` to this device
    (``triflux.moving.move``)."""
    backend = None
    is_cpu = False
    idx = None

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


def ordinal(idx, who):
    """``idx`` as a device index: an int >= 0 (0-based among the visible
    devices), or an ArgumentError naming ``who``."""
    if not is_int(idx) or idx < 0:
        raise ArgumentError(f"{who}: the device index must be an int >= 0 (0, 1, ...: the ordinal among the "
                            f"visible devices), got {idx!r} ({type(idx).__name__})")
    return int(idx)


class _TritonDevice(Device):
    """A GPU served by Triton kernels; torch only holds the memory."""

    def __init__(self, idx=0):
        self.idx = ordinal(idx, type(self).__name__)

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


DEVICE_CLASSES = {"CPU": CPUDevice, "CUDA": CUDADevice, "AMDGPU": AMDGPUDevice, "Metal": MetalDevice}
CPU = CPUDevice()


def cpu_device():
    return CPU


def _preferred_backend():
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
    dev = DEVICE_CLASSES[name](idx)
    check_index(dev)
    return dev


def _split_name(name, idx):
    """"CUDA" or "cuda:1" -> (name before the colon, idx)."""
    base, sep, rest = str(name).partition(":")
    if sep:
        if not rest.strip().isdigit():
            raise ValueError(f"bad device name {name!r}; write it like 'cuda:1'")
        idx = int(rest)
    return base, idx


def _parse_name(name, idx):
    """"CUDA" or "cuda:1" -> (canonical backend, idx)."""
    base, idx = _split_name(name, idx)
    return _canonical(base), idx


def select_device(backend_name=None, idx=0, verbose=False):
    """A device object. With a backend (a name such as "CUDA"): that
    backend's device ``idx`` (0-based among the visible devices, see
    ``CUDA_VISIBLE_DEVICES``), or a ``NoGPUError`` that says why it is not
    functional or how many devices there are. With no backend: the
    preference (``gpu_backend``, ``GPU_BACKEND``) first, then CUDA, AMDGPU,
    Metal, CPU, the first that is functional. ``verbose=True`` logs the
    choice and why each backend before it was skipped, on the "triflux"
    logger (see ``logger``)::

        [ Info: Using backend set in preferences: CUDA.
        [ Warning: Trying to use backend: CUDA but it is not functional: ...
        [ Info: Skipping AMDGPU: this torch is not a ROCm build ...
        [ Info: No functional GPU backend found! Defaulting to CPU.
        [ Info: Using backend: CPU.
    """
    idx = ordinal(idx, "get_device")
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
    dev = select_device(idx=idx or 0, verbose=verbose)
    if force and (dev.is_cpu or isinstance(dev, MetalDevice)):
        reasons = "; ".join(f"{b}: {backend.status(b)[1]}" for b in ("CUDA", "AMDGPU", "Metal"))
        raise NoGPUError(f"no functional GPU backend found ({reasons}). "
                         "Run `python -m triflux doctor` for details.")
    return dev


def as_device(device):
    """A Device from a Device, ``None`` (CPU) or a name: "cpu", "cuda",
    "cuda:1", "amdgpu:0", "gpu"."""
    if device is None:
        return CPU
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        base, idx = _split_name(device, 0)
        if base.lower() == "gpu":
            return gpu_device(idx)
        return select_device(device)
    raise TypeError(f"not a device: {device!r}; give a device object (`gpu_device()`, `cpu_device()`) "
                    "or a name such as \"cpu\", \"cuda\", \"cuda:1\", \"gpu\"")


def devices(backend_name):
    """Every visible device of ``backend_name`` ("CUDA", "AMDGPU", "Metal",
    "CPU", any case), as CUDA.jl's ``CUDA.devices()`` or counting with
    ``torch.cuda.device_count()``: ``devices("CUDA")`` is ``[CUDADevice(0),
    CUDADevice(1), ...]`` (0-based among the devices ``CUDA_VISIBLE_DEVICES``
    shows), ``devices("CPU")`` is ``[CPUDevice()]``. A backend that is not
    functional here has no devices: ``[]`` (``functional(name)`` and
    ``select_device(name)`` say why). An unknown name is a ValueError listing
    ``supported_devices()``.

    The package attribute ``triflux.devices`` is this function; the module's
    names are imported as ``from triflux.devices import ...``."""
    name = _canonical(backend_name)
    if name == "CPU":
        return [CPU]
    if name == "Metal":
        return []
    return [DEVICE_CLASSES[name](k) for k in range(backend.device_count(name))]


def move_code(device, x="x"):
    """Valid code that moves ``x`` to ``device``, for the fix in an error
    message: ``cpu(x)``, ``gpu(x)`` (the default GPU device), otherwise
    ``get_device("CUDA", 1)(x)``. (``gpu`` also turns float64 into float32;
    a device call keeps dtypes.)"""
    if device.is_cpu:
        return f"cpu({x})"
    try:
        default = select_device()
    except Exception:    # a message must not fail: name the device explicitly
        default = None
    if device == default:
        return f"gpu({x})"
    index = "" if device.idx is None else f", {device.idx}"
    return f'get_device("{device.backend}"{index})({x})'


def reclaim():
    """Free memory that is no longer used: run Python's garbage collector,
    give the free heap the CPU reference keeps between steps back to the
    system (``reference/_allocator.py``) and the device allocator's
    cached blocks back to the driver (CUDA's ``reclaim``). Safe to call on
    any machine."""
    gc.collect()
    give_back_heap()
    torch = sys.modules.get("torch")
    if torch is not None and not backend.interpreter_on() and torch.cuda.is_available():
        torch.cuda.empty_cache()
