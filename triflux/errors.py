"""Every error triflux raises: each names what happened and what to do.

All derive from :class:`TrifluxError`, and also from the built-in exception a
Python user would expect (``TypeError`` for a wrong dtype, ``ValueError`` for a
wrong shape, ...), so ``except ValueError`` keeps working.
"""


class TrifluxError(Exception):
    """Base class of all triflux errors."""


class DeviceMismatchError(TrifluxError, RuntimeError):
    """Tensors on different devices met in one operation or layer."""


class NoGPUError(TrifluxError, RuntimeError):
    """A GPU was asked for, but no GPU backend is functional here."""


class BackendNotSupportedError(TrifluxError, RuntimeError):
    """A backend triflux knows of but cannot run kernels on (Metal)."""


class DTypeError(TrifluxError, TypeError):
    """An unsupported or mismatched element type."""


class ShapeError(TrifluxError, ValueError):
    """Shapes that do not fit the operation."""


class ArgumentError(TrifluxError, ValueError, TypeError):
    """An argument of the wrong kind or out of its range (an activation that
    is not a function, a probability above 1, an axis that is not an int):
    the message names the function or layer, the argument, what it expects
    and what it got. Both ``except ValueError`` and ``except TypeError``
    catch it."""


class OutOfMemoryError(TrifluxError, MemoryError):
    """The device ran out of memory."""


class NonFiniteError(TrifluxError, FloatingPointError):
    """A loss (or another value that must be finite) is NaN or Inf."""


class StructureError(TrifluxError, ValueError):
    """A state, gradient or optimiser tree does not match the model."""


class GradientError(TrifluxError, RuntimeError):
    """Misuse of ``gradient``: non-scalar loss, nothing to differentiate, ..."""


class CheckpointError(TrifluxError, ValueError):
    """A file that ``load`` cannot read (missing, truncated, corrupt, a pickle
    or another format), or an object ``save`` cannot store."""


class IndexRangeError(TrifluxError, IndexError):
    """An index outside the table it addresses (a token outside the
    vocabulary, a row past the end): the message names the valid range.
    Also an ``IndexError``, as Python's own."""


class InteropError(TrifluxError, ValueError):
    """A module, layer or array that ``from_torch``/``to_torch``/DLPack cannot
    translate (the message names where it is and what is supported)."""


class DistributedError(TrifluxError, RuntimeError):
    """A distributed collective or rendezvous failed (a dead or stuck
    worker, a timeout, workers that disagree on the model): the message
    names the rank, the collective and what to check."""
