"""Maps along one axis: the core that pooling and upsampling share.

Every pooling (max or mean, fixed or adaptive windows) and every upsampling
(nearest, bilinear) of an NCHW array treats the two spatial axes one after
the other. Along one axis of length ``n`` it maps the input to ``m`` outputs
through a table of taps (``k`` per output):

    sum map:  out[i] = sum over taps a with valid[i, a] of  weight[i, a] * in[index[i, a]]
    max map:  out[i] = max over taps a with valid[i, a] of  in[index[i, a]]

(a tap that is not ``valid`` is padding, or lies past the end of a shorter
window: it contributes nothing; a valid tap of weight 0 still contributes
``0 * in``, so a NaN or an infinity there gives NaN, as in torch).
Applying a map along axis 3 and then along axis 2 gives the 2-d operation;
a 2-d window is the product of its row and column windows.

The adjoint of a sum map (its backward) is again a gather,

    din[p] = sum over (i, a) with index[i, a] == p and valid[i, a] of weight[i, a] * dout[i],

read from the inverse tables (for each input position, the outputs that read
it), so no scatter with repeated indices is needed. A max map's backward
routes each output's gradient to the one input its maximum came from
(:meth:`AxisMap.argmax`, torch's choice).

Sums run in the dtype the caller gives (float32 for 16-bit data) and are
rounded by the caller once.
"""
import numpy as np


def _along(v, axis, ndim):
    """The 1-d array ``v`` shaped to broadcast along ``axis`` of an ``ndim``-d array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


class AxisMap:
    """The tap tables ``index``, ``valid`` and ``weight`` (each (m, k)) of a
    map from ``n`` inputs to ``m`` outputs along one axis (see the module
    docstring); ``weight=None`` means weight 1 for every tap."""

    def __init__(self, n, index, valid, weight=None):
        index = np.asarray(index, dtype=np.int64)
        valid = np.asarray(valid, dtype=bool)
        self.n = int(n)
        self.m, self.k = index.shape
        self.valid = valid
        self.index = np.where(valid, index, 0)          # invalid taps read position 0, never used
        self.weight = None if weight is None else np.asarray(weight)
        self.all_valid = valid.all(axis=0)               # per tap: valid for every output
        self._inverse = None

    # --- sums ----------------------------------------------------------------------------------

    def sum(self, x, axis, dtype):
        """``out[i] = sum_a valid[i, a] weight[i, a] x[index[i, a]]`` along ``axis``, in ``dtype``."""
        return _gather_sum(x, axis, dtype, self.index, self.valid, self.weight, self.all_valid, self.m)

    def adjoint(self, g, axis, dtype):
        """The adjoint of :meth:`sum`: ``out[p] = sum_{(i, a): index[i, a] = p} weight[i, a] g[i]``."""
        index, valid, weight, all_valid = self.inverse()
        return _gather_sum(g, axis, dtype, index, valid, weight, all_valid, self.n)

    def inverse(self):
        """For each input position p, the outputs i that read it (and the
        weights of those taps), as tables (n, k'); cached."""
        if self._inverse is None:
            rows, taps = np.nonzero(self.valid)                 # every valid tap (i, a)
            pos = self.index[rows, taps]
            order = np.argsort(pos, kind="stable")
            pos = pos[order]
            counts = np.bincount(pos, minlength=self.n)
            width = max(int(counts.max(initial=0)), 1)
            rank = np.arange(pos.size) - (np.cumsum(counts) - counts)[pos]
            index = np.zeros((self.n, width), dtype=np.int64)
            valid = np.zeros((self.n, width), dtype=bool)
            index[pos, rank] = rows[order]
            valid[pos, rank] = True
            weight = None
            if self.weight is not None:
                weight = np.zeros((self.n, width), dtype=self.weight.dtype)
                weight[pos, rank] = self.weight[rows, taps][order]
            self._inverse = (index, valid, weight, valid.all(axis=0))
        return self._inverse

    # --- maxima --------------------------------------------------------------------------------

    def max(self, x, axis):
        """``out[i] = max over valid taps of x[index[i, a]]`` along ``axis``; NaN propagates."""
        lowest = np.array(-np.inf, dtype=x.dtype)
        out = None
        with np.errstate(invalid="ignore"):
            for a in range(self.k):
                v = np.take(x, self.index[:, a], axis=axis)
                if not self.all_valid[a]:
                    v = np.where(_along(self.valid[:, a], axis, x.ndim), v, lowest)
                out = v if out is None else np.maximum(out, v)
        return out

    def argmax(self, x, axis):
        """``(values, positions)`` along ``axis``: each output's maximum and
        the input position it came from, by torch's rule. Scanning the valid
        taps in order, a tap is taken if it is the first valid one, if it is
        greater than the value taken so far, or if it is NaN; so the position
        is the first maximal tap, or the last NaN tap of a window holding NaN
        (a window of -inf values gives its first valid tap). Every output
        must have a valid tap."""
        nan_possible = bool(np.isnan(x).any())
        best = np.take(x, self.index[:, 0], axis=axis)
        tap = np.zeros(best.shape, dtype=np.int32)              # the tap taken so far
        for a in range(1, self.k):
            v = np.take(x, self.index[:, a], axis=axis)
            take = v > best
            if nan_possible:
                take |= np.isnan(v)
            none_before = ~self.valid[:, :a].any(axis=1)       # outputs whose earlier taps were all padding
            if none_before.any():
                take |= _along(none_before, axis, x.ndim)
            if not self.all_valid[a]:
                take &= _along(self.valid[:, a], axis, x.ndim)
            np.copyto(best, v, where=take)
            np.copyto(tap, a, where=take)
        # position = index[i, tap] for output i along the axis
        rows = _along(np.arange(self.m) * self.k, axis, x.ndim)
        return best, self.index.ravel()[rows + tap]


def _gather_sum(x, axis, dtype, index, valid, weight, all_valid, m):
    out = None
    for a in range(index.shape[1]):
        v = np.take(x, index[:, a], axis=axis)                 # a new array: updated in place below
        if v.dtype != dtype:
            v = v.astype(dtype)
        if weight is not None:
            v *= _along(weight[:, a].astype(dtype, copy=False), axis, x.ndim)
        if not all_valid[a]:
            np.copyto(v, 0, where=_along(~valid[:, a], axis, x.ndim))
        if out is None:
            out = v
        else:
            out += v
    if out is None:                                       # no taps at all: m outputs of 0
        shape = list(x.shape)
        shape[axis] = m
        out = np.zeros(shape, dtype=dtype)
    return out
