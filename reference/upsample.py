"""Upsampling (and downsampling) by interpolation, and pixel shuffling, NumPy
reference (forward and backward): torch's ``F.interpolate`` with modes
"nearest" and "linear" / "bilinear" / "trilinear", and ``F.pixel_shuffle``
/ ``F.pixel_unshuffle``, for any spatial rank R (1, 2 or 3).

Arrays are batch-first ``(N, C, *spatial)``; every primitive works on the R
trailing axes. The attributes (exactly one of ``size`` and ``scale``, and
``align_corners`` for linear), the output size and, along each spatial
axis k, the input positions i0_k(d), i1_k(d) and the weight lam_k(d) that
output position d reads are the family's spec (``triflux.specs.upsample``,
whose docstring has torch's rules). With multi-indices p = (p_0, ..., p_R-1)
over the output's spatial positions:

    nearest:  y[n, c, p] = x[n, c, i0_0(p_0), ..., i0_R-1(p_R-1)]
    linear:   y[n, c, p] = sum_{t in {0, 1}^R} prod_k a_k(p_k, t_k) x[n, c, i_{t_0,0}(p_0), ..., i_{t_R-1,R-1}(p_R-1)]

with a_k(d, 0) = 1 - lam_k(d), a_k(d, 1) = lam_k(d) (linear for R = 1,
bilinear for R = 2, trilinear for R = 3). Both taps of an axis are always
used (a weight of 0 times NaN or infinity gives NaN, as in torch). The map
is separable: the R-d operation applies the 1-d map along the last axis,
then along the one before, and so on; the backward is the adjoint, axis by
axis (for each input position, the sum of the gradients of the outputs that
read it, times their weights). Sums run in float32 for float16/bfloat16 and
are rounded once.
"""
from functools import lru_cache

import numpy as np

from ..specs.upsample import pixel_shuffle_spec, upsample_spec
from ._separable import AxisMap


@lru_cache(maxsize=1024)
def _map(axis):
    """The :class:`AxisMap` of a spec's :class:`UpsampleAxis` (cached with
    it: the map caches its inverse tables)."""
    if axis.linear:
        weight = np.stack([1 - axis.lam, axis.lam], axis=1)
        return AxisMap(axis.size, np.stack([axis.i0, axis.i1], axis=1), np.ones((axis.out, 2), bool), weight)
    return AxisMap(axis.size, axis.i0[:, None], np.ones((axis.out, 1), bool))


def _adjoint(grad, spec):
    """The adjoint of the spec's separable map: along the last axis, then the
    one before, ..., in the compute dtype, rounded once."""
    g = np.asarray(grad)
    acc = spec.compute_dtype
    for k in reversed(range(spec.rank)):
        g = _map(spec.axes[k]).adjoint(g, 2 + k, acc)
    return g.astype(spec.dtype, copy=False)


# --- nearest -------------------------------------------------------------------------------------

def upsample_nearest_forward(x, size=None, scale=None):
    """y[n, c, p] = x[n, c, i0_0(p_0), ..., i0_R-1(p_R-1)]  (i0_k: the spec's nearest rule along axis k)."""
    spec = upsample_spec("upsample_nearest", np.shape(x), x.dtype, size, scale)
    y = x
    for k in reversed(range(spec.rank)):
        y = np.take(y, spec.axes[k].i0, axis=2 + k)
    return y if y is not x else x.copy()


def upsample_nearest_backward(grad, out, x, size=None, scale=None):
    """dx[n, c, q] = sum of g[n, c, p] over the p with i0_k(p_k) = q_k for every axis k

    (each input element's gradient is the sum over the output elements copied from it)."""
    return (_adjoint(grad, upsample_spec("upsample_nearest", np.shape(x), x.dtype, size, scale)),)


# --- linear (bilinear, trilinear) -----------------------------------------------------------------

def upsample_linear_forward(x, size=None, scale=None, align_corners=False):
    """y[n, c, p] = sum_q prod_k a_k(p_k, q_k) x[n, c, q]

    where, along axis k, a_k(d, i0_k(d)) = 1 - lam_k(d) and a_k(d, i1_k(d)) =
    lam_k(d) (summed when i0_k(d) == i1_k(d)) and a_k(d, q) = 0 elsewhere: the
    linear rule of the spec; computed as one 1-d map per axis, last axis first."""
    spec = upsample_spec("upsample_linear", np.shape(x), x.dtype, size, scale, align_corners)
    acc = spec.compute_dtype
    y = x
    for k in reversed(range(spec.rank)):
        y = _map(spec.axes[k]).sum(y, 2 + k, acc)
    return y.astype(x.dtype, copy=False)


def upsample_linear_backward(grad, out, x, size=None, scale=None, align_corners=False):
    """dx[n, c, q] = sum_p prod_k a_k(p_k, q_k) g[n, c, p]  (the adjoint of the forward)."""
    return (_adjoint(grad, upsample_spec("upsample_linear", np.shape(x), x.dtype, size, scale, align_corners)),)


# --- pixel shuffle -----------------------------------------------------------------------------------

def _shuffle(x, r, rank):
    """(N, C r^R, *s) -> (N, C, *(r s)): reshape to (N, C, r, ..., r, s_0, ..., s_R-1), bring each
    sub-position next to its axis, (N, C, s_0, r, s_1, r, ...), and merge the pairs."""
    n, cr, spatial = x.shape[0], x.shape[1], x.shape[2:]
    c = cr // r ** rank
    y = x.reshape((n, c) + (r,) * rank + spatial)
    order = (0, 1) + tuple(a for k in range(rank) for a in (2 + rank + k, 2 + k))
    return np.ascontiguousarray(y.transpose(order)).reshape((n, c) + tuple(s * r for s in spatial))


def _unshuffle(x, r, rank):
    """(N, C, *(r s)) -> (N, C r^R, *s): the inverse permutation of :func:`_shuffle`."""
    n, c, spatial = x.shape[0], x.shape[1], tuple(s // r for s in x.shape[2:])
    y = x.reshape((n, c) + tuple(a for s in spatial for a in (s, r)))
    order = (0, 1) + tuple(3 + 2 * k for k in range(rank)) + tuple(2 + 2 * k for k in range(rank))
    return np.ascontiguousarray(y.transpose(order)).reshape((n, c * r ** rank) + spatial)


def pixel_shuffle_forward(x, factor):
    """y[n, c, r p_0 + i_0, ..., r p_R-1 + i_R-1] = x[n, c r^R + sum_k i_k r^(R-1-k), p_0, ..., p_R-1]

    for 0 <= i_k < r (torch's channel order; NNlib's on the same memory; the spec's docstring)."""
    spec = pixel_shuffle_spec("pixel_shuffle", np.shape(x), x.dtype, factor)
    return _shuffle(np.asarray(x), spec.factor, spec.rank)


def pixel_shuffle_backward(grad, out, x, factor):
    """dx = pixel_unshuffle(g): the forward is a permutation, its adjoint the inverse permutation."""
    spec = pixel_shuffle_spec("pixel_shuffle", np.shape(x), x.dtype, factor)
    return (_unshuffle(np.asarray(grad), spec.factor, spec.rank).astype(x.dtype, copy=False),)


def pixel_unshuffle_forward(x, factor):
    """y[n, c r^R + sum_k i_k r^(R-1-k), p_0, ..., p_R-1] = x[n, c, r p_0 + i_0, ..., r p_R-1 + i_R-1]

    (the inverse of pixel_shuffle_forward)."""
    spec = pixel_shuffle_spec("pixel_unshuffle", np.shape(x), x.dtype, factor)
    return _unshuffle(np.asarray(x), spec.factor, spec.rank)


def pixel_unshuffle_backward(grad, out, x, factor):
    """dx = pixel_shuffle(g)."""
    spec = pixel_shuffle_spec("pixel_unshuffle", np.shape(x), x.dtype, factor)
    return (_shuffle(np.asarray(grad), spec.factor, spec.rank).astype(x.dtype, copy=False),)
