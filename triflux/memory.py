"""How much memory a device has and uses: ``memory_status(device)``.

Numbers are bytes. What each backend can tell:

* a CUDA/AMDGPU device on a real GPU: ``allocated`` (bytes in live
  tensors), ``reserved`` (held by torch's caching allocator, allocated
  included), ``free`` and ``total`` (the driver's view of the whole GPU, so
  other processes count);
* the CPU, and a GPU device served by the Triton interpreter (its memory is
  ordinary host memory): ``allocated`` is this process's resident set size,
  ``reserved`` is ``None`` (no caching allocator), ``free`` the memory the
  kernel reports available (``MemAvailable``) and ``total`` the physical
  memory. Any number the system does not report is ``None``.

``triflux.reclaim()`` gives cached blocks back; ``memory_status`` before and
after shows the effect.

Running out of memory anywhere (an allocation, a kernel launch, a copy to the
device) becomes one ``OutOfMemoryError`` built here by ``out_of_memory``: the
bytes asked for, the bytes free, the device and what to do.
"""
import math
import os
import sys
from typing import NamedTuple, Optional

from . import backend
from .devices import MetalDevice, as_device, gpu_device
from .errors import OutOfMemoryError


def format_bytes(n):
    """``n`` bytes in the largest binary unit below it ("1.500 KiB")."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.3f} {unit}"
        n /= 1024


class MemoryStatus(NamedTuple):
    """Memory of one device in bytes (``None``: not known here)."""
    device: object
    allocated: Optional[int]
    reserved: Optional[int]
    free: Optional[int]
    total: Optional[int]

    def __str__(self):
        def b(n):
            return "?" if n is None else format_bytes(n)
        parts = [f"{b(self.allocated)} allocated"]
        if self.reserved is not None:
            parts.append(f"{b(self.reserved)} reserved")
        parts.append(f"{b(self.free)} free of {b(self.total)}")
        return f"{self.device!r}: " + ", ".join(parts)


def _meminfo():
    """``/proc/meminfo`` as {field: bytes}; empty where there is none."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                fields = rest.split()
                if fields:
                    n = int(fields[0])
                    out[key] = n * 1024 if len(fields) > 1 and fields[1] == "kB" else n
    except (OSError, ValueError):
        pass
    return out


def _rss():
    """This process's resident set size in bytes (``None`` if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:  # peak, not current, where /proc is missing (macOS reports bytes, Linux KiB)
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except Exception:
        return None


def _host_status(device):
    info = _meminfo()
    total = info.get("MemTotal")
    if total is None:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = None
    free = info.get("MemAvailable", info.get("MemFree"))
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    return MemoryStatus(device, _rss(), None, free, total)


def _gpu_status(device, tdev):
    torch = backend.torch()
    with torch.cuda.device(tdev):
        allocated = int(torch.cuda.memory_allocated(tdev))
        reserved = int(torch.cuda.memory_reserved(tdev))
        free, total = torch.cuda.mem_get_info(tdev)
    return MemoryStatus(device, allocated, reserved, int(free), int(total))


def memory_status(device=None):
    """``MemoryStatus(device, allocated, reserved, free, total)`` in bytes for
    ``device`` (a device object or a name such as ``"cuda:1"``; by default the
    default GPU device, or the CPU when none is functional). See the module
    docstring for what each number means on each backend."""
    dev = gpu_device() if device is None else as_device(device)
    if dev.is_cpu or isinstance(dev, MetalDevice):
        return _host_status(dev)
    tdev = dev.torch_device          # the CPU under the Triton interpreter
    if tdev.type == "cpu":
        return _host_status(dev)
    return _gpu_status(dev, tdev)


# --- out of memory -----------------------------------------------------------------------

def is_out_of_memory(exc):
    """Whether ``exc`` (raised by NumPy, torch or Triton) says that memory
    ran out: on a GPU, or in host memory (torch's CPU allocator, which holds
    the Triton interpreter's device memory, says "can't allocate memory")."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", ()) if torch is not None else ()
    text = str(exc).lower()
    return isinstance(exc, oom_type) or "out of memory" in text or "can't allocate memory" in text


def _on_host(device):
    """Whether ``device`` (a torch device, a triflux device or ``None``: a
    GPU) is host memory: the CPU device, or the interpreter's storage."""
    if getattr(device, "is_cpu", False):
        return True
    return device is not None and not hasattr(device, "is_cpu") and backend.torch().device(device).type == "cpu"


def _torch_device_name(tdev):
    """The triflux name of the torch device ``tdev`` (or of a triflux CPU device)."""
    if tdev is None:
        return "the GPU"
    if getattr(tdev, "is_cpu", False):
        return "the host memory (CPUDevice())"
    torch = backend.torch()
    tdev = torch.device(tdev)
    if tdev.type == "cpu":
        return "the host memory (the Triton interpreter's device)"
    kind = "AMDGPUDevice" if getattr(torch.version, "hip", None) else "CUDADevice"
    idx = tdev.index if tdev.index is not None else torch.cuda.current_device()
    return f"{kind}({idx})"


def _free_and_total(tdev):
    """(free, total) bytes of the torch device ``tdev``, ``None`` where unknown."""
    try:
        if _on_host(tdev):
            st = _host_status(None)
            return st.free, st.total
        torch = backend.torch()
        f, t = torch.cuda.mem_get_info(tdev)
        return int(f), int(t)
    except Exception:
        return None, None


def out_of_memory(exc, shape=None, dtype=None, device=None, *, asked=None, purpose=None):
    """triflux's ``OutOfMemoryError`` for a failed allocation of a ``shape``
    ``dtype`` (torch or NumPy dtype) tensor on ``device`` (a torch device, or
    the triflux CPU device) (or a failed launch); or of ``asked`` bytes for
    ``purpose`` (e.g. "a DataLoader batch")."""
    what = "asked for more memory than is free"
    if asked is not None:
        what = f"asked for {format_bytes(asked)} ({asked} bytes)" + (f" for {purpose}" if purpose else "")
    elif shape is not None:
        asked = math.prod(int(s) for s in shape) * (dtype.itemsize if dtype is not None else 1)
        what = f"asked for {format_bytes(asked)} ({asked} bytes) for a {tuple(int(s) for s in shape)} " \
               f"{str(dtype).replace('torch.', '')} tensor"
    free, total = _free_and_total(device)
    have = ""
    if free is not None and total is not None:
        have = f"; {format_bytes(free)} ({free} bytes) are free of {format_bytes(total)}"
    where = _torch_device_name(device)
    others = ("check with `free -h` or `top` whether other processes hold the memory" if _on_host(device) else
              "check with `nvidia-smi` whether other processes hold this GPU's memory")
    err = OutOfMemoryError(
        f"out of memory on {where}: {what}{have}. A training step that fails here has not updated the "
        "model's parameters or the optimiser state, so training can go on. To fit: use a smaller batch "
        "(`DataLoader(data, batchsize=...)`); call `triflux.reclaim()` to return cached blocks; keep "
        "parameters and data in float16/bfloat16 (`f16(model)`, `bf16(x)`) to halve the memory; "
        f"{others}.")
    err.asked, err.free, err.total, err.device = asked, free, total, where
    return err
