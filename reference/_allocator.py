"""The C allocator under NumPy's arrays, set for a training loop's temporaries.

A training step on the reference allocates the same arrays every step (the
activations, their gradients, a layer's scratch) and frees them by its end.
glibc's malloc, left to itself, gives the top of its heap back to the system
whenever more than ``M_TRIM_THRESHOLD`` bytes lie free there (a threshold it
raises only as far as twice the largest array it has ever served by ``mmap``),
so a step whose arrays add up to more than that grows the heap again, page by
page, every step: measured on the LSTM 64 => 128 benchmark, 1,730 page faults
(7 MB) a step, 11.2 instead of 6.7 ms. Here glibc keeps up to
``KEEP_FREE_BYTES`` of free heap, and serves arrays below ``MMAP_BYTES``
from the heap, larger ones mapped on their own (the UNet at 64x64: 12,000
page faults a step with 4 MiB there, 900 with 32 MiB; 750 -> 700 ms).

This is the process's allocator, so it is set once, when triflux's reference
is imported, and only where it is glibc's and nobody has set it already:
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or
``GLIBC_TUNABLES`` in the environment leave it as the user chose.
``triflux.reclaim()`` gives the kept memory back (``malloc_trim``).
"""
import ctypes
import ctypes.util
import functools
import os
import platform

#: free bytes at the top of the heap that glibc keeps for the next step (M_TRIM_THRESHOLD)
KEEP_FREE_BYTES = 256 << 20
#: arrays from this size up get their own mapping (M_MMAP_THRESHOLD), given back
#: whole when freed: glibc's largest (its own threshold rises no further on 64-bit)
MMAP_BYTES = 32 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3          # mallopt's parameters (malloc.h)
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@functools.cache
def _glibc():
    """The C library, where it is glibc (with ``mallopt`` and ``malloc_trim``); else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_heap_between_steps():
    """Set glibc's thresholds as above; True if they were set (False: not
    glibc, the user's own settings, or glibc refused them)."""
    libc = _glibc()
    if libc is None or any(name in os.environ for name in _USER_SETTINGS):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                    KEEP_FREE_BYTES))


def give_back():
    """Return the heap's free memory to the system (glibc's ``malloc_trim``)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


#: whether the thresholds were set when the reference was imported
KEEPING_HEAP = keep_heap_between_steps()
