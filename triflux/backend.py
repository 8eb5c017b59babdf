"""Whether GPU kernels can run here, and lazy access to torch and Triton.

torch (memory and copies only) and Triton (the kernels) are an optional extra:
nothing here imports them until a GPU path is used, so a CPU-only user needs
neither. ``TRITON_INTERPRET=1`` (set before triton is imported) makes the
Triton interpreter run the kernels on the CPU with torch CPU tensors as device
storage; the CUDA backend then counts as functional.
"""
import functools
import importlib
import os

from .errors import NoGPUError

INSTALL_HINT = "install the GPU extra: `pip install triflux[gpu]` (torch and triton)"


def interpreter_on():
    """True when the Triton interpreter serves the CUDA device."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def cuda_visible_disabled():
    """``CUDA_VISIBLE_DEVICES=-1`` (or empty) hides every GPU, as in the seeds."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    return v is not None and v.strip() in ("-1", "")


@functools.lru_cache(maxsize=None)
def _import(name):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        return e


def torch():
    """The torch module, or a NoGPUError that says how to get it."""
    mod = _import("torch")
    if isinstance(mod, ImportError):
        raise NoGPUError(f"torch is not installed, so no GPU backend is functional; {INSTALL_HINT}")
    return mod


def triton():
    mod = _import("triton")
    if isinstance(mod, ImportError):
        raise NoGPUError(f"triton is not installed, so no GPU kernels can run; {INSTALL_HINT}")
    return mod


def has_module(name):
    return not isinstance(_import(name), ImportError)


@functools.lru_cache(maxsize=None)
def status(backend="CUDA"):
    """``(functional, reason)`` for a backend name: CUDA, AMDGPU, Metal, CPU."""
    backend = backend.upper() if backend.upper() != "AMDGPU" else "AMDGPU"
    if backend == "CPU":
        return True, "the NumPy reference always runs"
    if backend == "METAL":
        return False, "Triton has no Metal backend; use the CPU device (`cpu_device()`)"
    if cuda_visible_disabled():
        return False, "CUDA_VISIBLE_DEVICES hides all GPUs"
    if not has_module("torch"):
        return False, f"torch is not installed ({INSTALL_HINT})"
    if not has_module("triton"):
        return False, f"triton is not installed ({INSTALL_HINT})"
    tm = torch()
    is_rocm = getattr(tm.version, "hip", None) is not None
    if interpreter_on():
        if backend == "CUDA":
            return True, "TRITON_INTERPRET=1: the Triton interpreter runs the kernels on the CPU"
        return False, "TRITON_INTERPRET=1 serves the CUDA backend only"
    if backend == "CUDA" and is_rocm:
        return False, "this torch is a ROCm build; use the AMDGPU backend"
    if backend == "AMDGPU" and not is_rocm:
        return False, "this torch is not a ROCm build (AMDGPU needs torch for ROCm)"
    if not tm.cuda.is_available():
        if backend == "CUDA" and tm.version.cuda is None:
            return False, "this torch is a CPU-only build (no CUDA)"
        return False, "no GPU driver or device found (torch.cuda.is_available() is False)"
    return True, f"{tm.cuda.device_count()} device(s): {tm.cuda.get_device_name(0)}"


def functional(backend="CUDA"):
    """Whether ``backend`` ("CUDA", "AMDGPU", "Metal", "CPU") can run kernels here."""
    return status(backend)[0]


def device_count(backend="CUDA"):
    if not functional(backend):
        return 0
    if interpreter_on():
        return 1
    return torch().cuda.device_count()


def require(backend="CUDA"):
    ok, why = status(backend)
    if not ok:
        raise NoGPUError(f"no {backend} GPU backend is functional here: {why}. "
                         "Run on the CPU device (`cpu(x)`), or set TRITON_INTERPRET=1 "
                         "before importing triflux to run the Triton kernels in the interpreter.")
