"""NumPy references, forward and backward, one module per family of
primitives. Written to be read: the math is in each docstring. They are also
the CPU backend that users train on."""

from ._allocator import KEEPING_HEAP  # noqa: F401  (set on import: glibc keeps its heap between steps)

__all__ = ["KEEPING_HEAP"]
