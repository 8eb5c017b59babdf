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
"""
import os
import sys
from typing import NamedTuple, Optional

from . import backend


class MemoryStatus(NamedTuple):
    """Memory of one device in bytes (``None``: not known here)."""
    device: object
    allocated: Optional[int]
    reserved: Optional[int]
    free: Optional[int]
    total: Optional[int]

    def __str__(self):
        def b(n):
            if n is None:
                return "?"
            from .show import format_bytes
            return format_bytes(n)
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
    from .devices import gpu_device, MetalDevice
    from .tensor import as_device
    dev = gpu_device() if device is None else as_device(device)
    if dev.is_cpu or isinstance(dev, MetalDevice):
        return _host_status(dev)
    tdev = dev.torch_device          # the CPU under the Triton interpreter
    if tdev.type == "cpu":
        return _host_status(dev)
    return _gpu_status(dev, tdev)
