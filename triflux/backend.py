"""Whether GPU kernels can run here, and lazy access to torch and Triton.

torch (memory and copies only) and Triton (the kernels) are an optional extra:
nothing here imports them until a GPU path is used, so a CPU-only user needs
neither. ``TRITON_INTERPRET=1`` (set before triton is imported) makes the
Triton interpreter run the kernels on the CPU with torch CPU tensors as device
storage; the CUDA backend then counts as functional.

Detection is split in two so that it can be tested without hardware:

* :func:`facts` reads everything detection depends on (is torch importable,
  ``torch.version.cuda`` / ``torch.version.hip``, ``torch.cuda.is_available()``,
  the device count and names, is triton importable, is the interpreter on,
  ``CUDA_VISIBLE_DEVICES``, ``TRIFLUX_INTERPRETER_DEVICES``) into a small
  :class:`Facts` value, once per process;
* :func:`status_from` decides, from a ``Facts`` alone, whether a backend is
  functional and why not. Tests replace :func:`facts` (``monkeypatch``) to
  play a CUDA build, a ROCm build, a CPU-only torch, no torch, ...

Device numbering. A device index is the 0-based ordinal among the *visible*
devices, as in CUDA: with ``CUDA_VISIBLE_DEVICES=1,0`` ``CUDADevice(0)`` is
physical GPU 1. torch already renumbers real GPUs; under the Triton
interpreter triflux serves ``TRIFLUX_INTERPRETER_DEVICES`` (default 1)
virtual CUDA devices (all stored as torch CPU tensors) and applies
``CUDA_VISIBLE_DEVICES`` to them the same way, so multi-GPU behaviour can be
tested without a GPU.
"""
import dataclasses
import functools
import importlib
import os
from typing import Optional, Tuple

from .errors import NoGPUError

INSTALL_HINT = "install the GPU extra: `pip install triflux[gpu]` (torch and triton)"

#: how many virtual CUDA devices the Triton interpreter serves (default 1)
INTERPRETER_DEVICES_VAR = "TRIFLUX_INTERPRETER_DEVICES"


def interpreter_on():
    """True when the Triton interpreter serves the CUDA device."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def visible_ordinals(cuda_visible_devices, physical_count):
    """The physical device numbers that ``CUDA_VISIBLE_DEVICES`` makes visible,
    in visible order (visible device ``k`` is physical ``result[k]``), with
    CUDA's rules: unset shows every device; the list is read left to right
    and stops at the first entry that is not a valid, not yet listed device
    number, so ``-1`` or ``""`` hide everything and ``"1,0"`` swaps two GPUs.
    (UUID entries, ``GPU-...``/``MIG-...``, only a real driver can resolve:
    here they end the list.)"""
    if cuda_visible_devices is None:
        return list(range(physical_count))
    out = []
    for tok in cuda_visible_devices.split(","):
        tok = tok.strip()
        try:
            k = int(tok)
        except ValueError:
            break
        if k < 0 or k >= physical_count or k in out:
            break
        out.append(k)
    return out


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


@dataclasses.dataclass(frozen=True)
class Facts:
    """What backend detection depends on; see :func:`facts`."""
    torch_version: Optional[str] = None      # None: torch cannot be imported
    torch_error: Optional[str] = None        # why not
    cuda_version: Optional[str] = None       # torch.version.cuda (None: not a CUDA build)
    hip_version: Optional[str] = None        # torch.version.hip (set: a ROCm build)
    cuda_available: bool = False             # torch.cuda.is_available()
    device_count: int = 0                    # torch.cuda.device_count() (visible devices)
    device_names: Tuple[str, ...] = ()       # torch.cuda.get_device_name(k) for each
    triton_version: Optional[str] = None     # None: triton cannot be imported
    triton_error: Optional[str] = None
    interpreter: bool = False                # TRITON_INTERPRET=1
    cuda_visible_devices: Optional[str] = None   # the raw value, None when unset
    interpreter_devices: Optional[str] = None    # raw TRIFLUX_INTERPRETER_DEVICES, None when unset
    numpy_version: Optional[str] = None      # numpy.__version__ (the interpreter runs on NumPy)


def read_facts():
    """Read the facts of this process (imports torch and triton if present)."""
    env = os.environ
    import numpy
    kw = dict(interpreter=interpreter_on(), numpy_version=numpy.__version__,
              cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
              interpreter_devices=env.get(INTERPRETER_DEVICES_VAR))
    tm = _import("torch")
    if isinstance(tm, ImportError):
        kw["torch_error"] = str(tm)
    else:
        kw["torch_version"] = str(tm.__version__)
        kw["cuda_version"] = getattr(tm.version, "cuda", None)
        kw["hip_version"] = getattr(tm.version, "hip", None)
        if not kw["interpreter"]:
            try:
                kw["cuda_available"] = bool(tm.cuda.is_available())
                if kw["cuda_available"]:
                    n = int(tm.cuda.device_count())
                    kw["device_count"] = n
                    kw["device_names"] = tuple(str(tm.cuda.get_device_name(k)) for k in range(n))
            except Exception as e:  # a broken driver: report it, do not crash detection
                kw["cuda_available"] = False
                kw["torch_error"] = f"torch.cuda failed: {e}"
    tr = _import("triton")
    if isinstance(tr, ImportError):
        kw["triton_error"] = str(tr)
    else:
        kw["triton_version"] = str(getattr(tr, "__version__", "unknown"))
    return Facts(**kw)


@functools.lru_cache(maxsize=None)
def _cached_facts():
    return read_facts()


def facts():
    """The :class:`Facts` of this process, read once (as CUDA reads
    ``CUDA_VISIBLE_DEVICES`` once). Tests replace this function."""
    return _cached_facts()


def interpreter_pool(f):
    """``(n, error)``: how many virtual devices the interpreter serves, from
    ``TRIFLUX_INTERPRETER_DEVICES`` (default 1)."""
    raw = f.interpreter_devices
    if raw is None or raw.strip() == "":
        return 1, None
    try:
        n = int(raw)
        if n < 0:
            raise ValueError
    except ValueError:
        return 0, f"{INTERPRETER_DEVICES_VAR}={raw!r} is not a whole number >= 0"
    return n, None


def _cvd(f):
    return "unset" if f.cuda_visible_devices is None else repr(f.cuda_visible_devices)


def visible_devices(f=None):
    """For the CUDA/AMDGPU device ordinals visible now: a list of
    ``(physical, name)``; visible device ``k`` is entry ``k``."""
    f = facts() if f is None else f
    if f.interpreter:
        n, _ = interpreter_pool(f)
        return [(p, f"Triton interpreter virtual device {p}, CPU memory")
                for p in visible_ordinals(f.cuda_visible_devices, n)]
    # torch has applied CUDA_VISIBLE_DEVICES already; physical numbers are not known
    return [(None, name) for name in f.device_names] + \
        [(None, "?")] * max(0, f.device_count - len(f.device_names))


def _interpreter_numpy_clash(triton_version, numpy_version):
    """Whether this Triton's interpreter is known not to run on this NumPy:
    Triton 3.6 with NumPy 2.4 or newer (setup.cfg's range allows both ends)."""
    def minor(v):
        try:
            return tuple(int(p) for p in str(v).split(".")[:2])
        except ValueError:
            return None
    t, n = minor(triton_version), minor(numpy_version)
    return t is not None and n is not None and t <= (3, 6) and n >= (2, 4)


def status_from(backend, f):
    """``(functional, reason)`` for ``backend`` given the facts ``f``: the
    detection logic, with no I/O."""
    if backend == "CPU":
        return True, "the NumPy reference always runs"
    if backend == "Metal":
        return False, "Triton has no Metal backend; use the CPU device (`cpu_device()`)"
    if backend not in ("CUDA", "AMDGPU"):
        raise ValueError(f"unknown backend {backend!r}; valid backends are CUDA, AMDGPU, Metal, CPU")
    cvd = f.cuda_visible_devices
    if _hides_everything(cvd):
        hidden = "all GPUs and the Triton interpreter's virtual devices" if f.interpreter else "all GPUs"
        return False, f"CUDA_VISIBLE_DEVICES={cvd!r} hides {hidden}"
    if f.torch_version is None:
        return False, f"torch is not installed ({INSTALL_HINT})"
    if f.triton_version is None:
        return False, f"triton is not installed ({INSTALL_HINT})"
    if f.interpreter:
        if backend == "AMDGPU":
            return False, "TRITON_INTERPRET=1: the Triton interpreter serves the CUDA backend only"
        n, err = interpreter_pool(f)
        if err:
            return False, err
        visible = visible_ordinals(cvd, n)
        if not visible:
            why = (f"{INTERPRETER_DEVICES_VAR}=0" if n == 0 else
                   f"CUDA_VISIBLE_DEVICES={cvd!r} selects none of the {n} virtual device(s)")
            return False, f"TRITON_INTERPRET=1 but no virtual device is visible: {why}"
        if _interpreter_numpy_clash(f.triton_version, f.numpy_version):
            return False, (f"TRITON_INTERPRET=1, but Triton {f.triton_version}'s interpreter fails with NumPy "
                           f"{f.numpy_version} (it converts 1-element arrays with int(), which NumPy 2.4 refuses): "
                           "install `numpy<2.4`, or Triton 3.9")
        return True, (f"TRITON_INTERPRET=1: the Triton interpreter runs the kernels on the CPU "
                      f"({len(visible)} virtual device(s))")
    if f.torch_error and f.torch_error.startswith("torch.cuda failed"):
        return False, f.torch_error
    is_rocm = f.hip_version is not None
    if backend == "CUDA" and is_rocm:
        return False, f"this torch is a ROCm build (HIP {f.hip_version}); use the AMDGPU backend"
    if backend == "AMDGPU" and not is_rocm:
        return False, ("this torch is not a ROCm build (torch.version.hip is None); "
                       "AMDGPU needs torch built for ROCm")
    if backend == "CUDA" and f.cuda_version is None:
        return False, "this torch is a CPU-only build (torch.version.cuda is None); install a CUDA build of torch"
    if not f.cuda_available or f.device_count == 0:
        kind = "AMD GPU (ROCm driver)" if is_rocm else "NVIDIA GPU driver or device"
        if cvd is not None:
            return False, (f"no {kind} is visible: CUDA_VISIBLE_DEVICES={cvd!r} selects none "
                           "(torch.cuda.is_available() is False)")
        return False, f"no {kind} found (torch.cuda.is_available() is False)"
    names = ", ".join(f"{k}: {n}" for k, n in enumerate(f.device_names)) or "?"
    return True, f"{f.device_count} device(s) ({names})"


def status(backend="CUDA"):
    """``(functional, reason)`` for a backend name: CUDA, AMDGPU, Metal, CPU."""
    backend = {"cuda": "CUDA", "amdgpu": "AMDGPU", "metal": "Metal", "cpu": "CPU"}.get(
        str(backend).lower(), backend)
    if backend in ("CPU", "Metal"):        # no need to import anything
        return status_from(backend, Facts())
    return status_from(backend, facts())


def functional(backend="CUDA"):
    """Whether ``backend`` ("CUDA", "AMDGPU", "Metal", "CPU") can run kernels here."""
    return status(backend)[0]


def device_count(backend="CUDA"):
    """How many ``backend`` devices are visible (0 when it is not functional)."""
    if not functional(backend):
        return 0
    return len(visible_devices())


def describe_visibility(f=None):
    """A phrase for error messages: how many devices and why."""
    f = facts() if f is None else f
    s = f"CUDA_VISIBLE_DEVICES is {_cvd(f)}"
    if f.interpreter:
        n, _ = interpreter_pool(f)
        s += (f"; the Triton interpreter serves {n} virtual device(s) "
              f"(set {INTERPRETER_DEVICES_VAR} for more)")
    return s


def _hides_everything(cuda_visible_devices):
    return cuda_visible_devices is not None and cuda_visible_devices.strip() in ("-1", "")


def advice(backend, f):
    """What to do when ``backend`` is not functional given the facts ``f``:
    only steps that can help in this situation (the interpreter is not
    suggested when it is on already, or when torch or triton is missing)."""
    on_cpu = "run on the CPU device (`cpu(x)`)"
    if _hides_everything(f.cuda_visible_devices):
        return f"Unset CUDA_VISIBLE_DEVICES (or list the devices to use, e.g. CUDA_VISIBLE_DEVICES=0), or {on_cpu}"
    if f.torch_version is None or f.triton_version is None:
        return f"Install the GPU extra (`pip install triflux[gpu]`), or {on_cpu}, which needs neither"
    if f.interpreter:
        if backend == "AMDGPU":
            return f'Use the CUDA device the interpreter serves (`get_device("CUDA")`), or {on_cpu}'
        n, err = interpreter_pool(f)
        if err or not visible_ordinals(f.cuda_visible_devices, n):
            return (f"Set {INTERPRETER_DEVICES_VAR} to the number of virtual devices (default 1) and "
                    f"CUDA_VISIBLE_DEVICES to a list of them (or unset it), or {on_cpu}")
        return f"Install versions that work together, or {on_cpu}"
    target = "the CUDA device" if backend == "CUDA" else "the CUDA device (the interpreter serves CUDA only)"
    return (f"Run on the CPU device (`cpu(x)`), or set TRITON_INTERPRET=1 in the environment before importing "
            f"triflux to run the Triton kernels in the interpreter on {target}")


def require(backend="CUDA"):
    """Raise a ``NoGPUError`` saying why ``backend`` is not functional and
    what can be done about it here."""
    ok, why = status(backend)
    if not ok:
        raise NoGPUError(f"no {backend} GPU backend is functional here: {why}. {advice(backend, facts())}.")
