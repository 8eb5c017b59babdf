"""Helpers shared by the reference families: arrays converted to the dtype
the arithmetic runs in (``triflux.dtypes.compute_dtype``), and the adjoint of
broadcasting.

The reference computes as the kernels do: float16 and bfloat16 values are
converted to float32, every product and sum runs there, and the result is
rounded to the 16-bit dtype once, at the end. A sum accumulated in the 16-bit
type instead stalls once the partial sum is large next to each term: a
thousand bfloat16 terms of 0.037 add up to 16 there (37.1 in float32).

``zeroed_where`` selects without branching: NumPy's ``np.where`` and
``np.copyto(where=)`` take a branch per element, several times slower on masks
without a pattern (which of a max-pool window's taps is its maximum, the signs
under a relu).

A forward may also keep intermediate results for the backward of the output
it returns (``keep_for_backward``): the backward handed that very array reads
them, and recomputes them for any other (the primitives' contract stays
``backward(grad, out, *inputs)``). They go when the output is freed, and are
kept only while a gradient is being recorded (``keeping_for_backward``, which
``triflux.autodiff`` opens around the differentiated function): a forward
outside one, whose output nobody differentiates, keeps nothing.
"""
import contextlib
import weakref

import numpy as np

from ..dtypes import compute_dtype


def in_compute_dtype(*arrays):
    """The arrays converted to the compute dtype of the first one (no copy
    for an array already in it), as a list."""
    ct = compute_dtype(np.asarray(arrays[0]).dtype)
    return [np.asarray(a).astype(ct, copy=False) for a in arrays]


def unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, so it
    has ``shape`` again: the adjoint of ``np.broadcast_to(x, grad.shape)``,

        dx[j] = sum over the copies i of x[j] in the broadcast result of grad[i].

    The sums accumulate in ``compute_dtype(grad.dtype)`` and are rounded
    once to ``grad``'s dtype."""
    grad = np.asarray(grad)
    if grad.shape == tuple(shape):
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    if not axes:
        return grad.reshape(shape)
    summed = grad.sum(axis=axes, keepdims=True, dtype=compute_dtype(grad.dtype))
    return summed.astype(grad.dtype, copy=False).reshape(shape)


#: id(output) -> (a weak reference to that output, what its forward kept for the backward)
_KEPT = {}


#: whether forwards keep results for their backward now (see the module docstring)
_KEEPING = [False]


@contextlib.contextmanager
def keeping_for_backward():
    """A block in which forwards keep what their backward will read."""
    outer, _KEEPING[0] = _KEEPING[0], True
    try:
        yield
    finally:
        _KEEPING[0] = outer


def keep_for_backward(out, *arrays):
    """Keep ``arrays`` for the backward of the forward's output ``out``, as
    long as ``out`` lives (inside :func:`keeping_for_backward` only)."""
    if not _KEEPING[0]:
        return
    key = id(out)
    _KEPT[key] = (weakref.ref(out, lambda _, key=key: _KEPT.pop(key, None)), arrays)


def kept_for_backward(out):
    """The arrays the forward kept with this very ``out`` (a tuple), or None."""
    ref, arrays = _KEPT.get(id(out), (None, None))
    return arrays if ref is not None and ref() is out else None


def zeroed_where(values, drop, out=None):
    """``values`` with +0 where the boolean ``drop`` is true (broadcasting), into
    ``out`` when given: ``np.where(drop, 0, values)`` exactly (an infinite or
    NaN value where ``drop`` is true gives 0 too), computed as the values' bits
    ANDed with a mask of all zero bits (drop) or all one bits (keep), with no
    branch per element."""
    ints = np.dtype(f"i{values.dtype.itemsize}")
    keep = drop.astype(ints)
    keep -= 1                           # drop: 1 - 1 = 0; keep: 0 - 1 = -1, all one bits
    result = np.bitwise_and(values.view(ints), keep, out=None if out is None else out.view(ints))
    return result.view(values.dtype)
