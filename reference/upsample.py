"""Upsampling (and downsampling) by interpolation, NumPy reference (forward
and backward): torch's ``F.interpolate`` with modes "nearest" and "bilinear".

Arrays are batch-first NCHW; both primitives work on the last two axes.
The attributes (exactly one of ``size`` and ``scale``, and ``align_corners``
for bilinear), the output size and, along each axis, the input positions
i0(d), i1(d) and the weight lam(d) each output position d reads are the
family's spec (``triflux.specs.upsample``, whose docstring has torch's
rules):

    nearest:   out[d] = in[i0(d)]
    bilinear:  out[d] = (1 - lam(d)) * in[i0(d)] + lam(d) * in[i1(d)]

Both taps are always used (a weight of 0 times NaN or infinity gives NaN,
as in torch). The 2-d operation applies the 1-d map along W, then along H;
the backward is the adjoint (for each input position, the sum of the
gradients of the outputs that read it, times their weights). Sums run in
float32 for float16/bfloat16 and are rounded once.
"""
from functools import lru_cache

import numpy as np

from ..specs.upsample import upsample2d_spec
from ._separable import AxisMap


@lru_cache(maxsize=1024)
def _map(axis):
    """The :class:`AxisMap` of a spec's :class:`UpsampleAxis` (cached with
    it: the map caches its inverse tables)."""
    if axis.bilinear:
        weight = np.stack([1 - axis.lam, axis.lam], axis=1)
        return AxisMap(axis.size, np.stack([axis.i0, axis.i1], axis=1), np.ones((axis.out, 2), bool), weight)
    return AxisMap(axis.size, axis.i0[:, None], np.ones((axis.out, 1), bool))


def _maps(spec):
    return _map(spec.rows), _map(spec.cols)


# --- nearest -------------------------------------------------------------------------------------

def upsample_nearest2d_forward(x, size=None, scale=None):
    """y[n, c, i, j] = x[n, c, i0_h(i), i0_w(j)]  (i0: the spec's nearest rule)."""
    spec = upsample2d_spec("upsample_nearest2d", np.shape(x), x.dtype, size, scale)
    return np.take(np.take(x, spec.cols.i0, axis=3), spec.rows.i0, axis=2)


def upsample_nearest2d_backward(grad, out, x, size=None, scale=None):
    """dx[n, c, p, q] = sum of g[n, c, i, j] over i0_h(i) = p, i0_w(j) = q

    (each input pixel's gradient is the sum over the output pixels copied from it)."""
    spec = upsample2d_spec("upsample_nearest2d", np.shape(x), x.dtype, size, scale)
    rows, cols = _maps(spec)
    acc = spec.compute_dtype
    return (rows.adjoint(cols.adjoint(np.asarray(grad), 3, acc), 2, acc).astype(x.dtype, copy=False),)


# --- bilinear ------------------------------------------------------------------------------------

def upsample_bilinear2d_forward(x, size=None, scale=None, align_corners=False):
    """y[n, c, i, j] = sum_{p in {h0, h1}, q in {w0, w1}} a_i(p) b_j(q) x[n, c, p, q]

    with (h0, h1, lh) the bilinear rule at output row i, a_i(h0) = 1 - lh,
    a_i(h1) = lh (added when h0 == h1), and b_j likewise along W."""
    spec = upsample2d_spec("upsample_bilinear2d", np.shape(x), x.dtype, size, scale, align_corners)
    rows, cols = _maps(spec)
    acc = spec.compute_dtype
    return rows.sum(cols.sum(x, 3, acc), 2, acc).astype(x.dtype, copy=False)


def upsample_bilinear2d_backward(grad, out, x, size=None, scale=None, align_corners=False):
    """dx[n, c, p, q] = sum_{i, j} a_i(p) b_j(q) g[n, c, i, j]  (the adjoint of the forward)."""
    spec = upsample2d_spec("upsample_bilinear2d", np.shape(x), x.dtype, size, scale, align_corners)
    rows, cols = _maps(spec)
    acc = spec.compute_dtype
    return (rows.adjoint(cols.adjoint(np.asarray(grad), 3, acc), 2, acc).astype(x.dtype, copy=False),)
