"""Pooling, NumPy reference (forward and backward), any spatial rank.

Arrays are batch-first ``(N, C, *spatial)`` with R = 1, 2 or 3 spatial axes
(sequences (N, C, L), images (N, C, H, W), volumes (N, C, D, H, W)); every
primitive works on the spatial axes, independently per (n, c).

Notation (per axis, multi-indices in Z^R): the output i, the tap t with
0 <= t < k (the window), stride s, dilation d, low padding lo. The window of
output i reads the input positions

    q(i, t) = i*s - lo + t*d,        W(i) = { q(i, t) : 0 <= t < k, q inside the input }

(positions outside the input are padding; ``triflux.specs.pool`` has the
output sizes, ceil mode and the checks, torch's rules). Adaptive pooling to
``size`` has per axis the windows floor(i*n/m) <= q < ceil((i+1)*n/m).
Every window holds at least one input position.

* maxpool:    y[n, c, i] = max_{q in W(i)} x[n, c, q]
* meanpool:   y[n, c, i] = (1 / D(i)) sum_{q in W(i)} x[n, c, q], D(i) the
  taps inside the padded input (count_include_pad) or inside the input
* lpnormpool: y[n, c, i] = (S(i) sum_{q in W(i)} x[n, c, q]^p)^(1/p), see
  :func:`lpnormpool_forward` (S(i) = 1 except for torch's ceil-mode windows)

Maxima: NaN propagates. The backward sends each output's gradient to the one
input position its maximum came from, by torch's rule: the first maximal
position in row-major window order (t_0, then t_1, ...; the last axis
fastest), or, in a window holding NaN, the last NaN; padding is never chosen.

Half-precision inputs (float16, bfloat16) accumulate in float32 and are
rounded once; results come in the input's dtype. The machinery (a map along
one axis, applied to each spatial axis in turn: an R-d window is the product
of its per-axis windows) is ``triflux.reference._separable``.
"""
import itertools
from functools import lru_cache

import numpy as np

from ..specs.pool import adaptive_pool_spec, pool_spec
from ._threads import in_parallel, slices_per_thread
from ._separable import AxisMap
from ._util import zeroed_where


@lru_cache(maxsize=1024)
def _windows(axis):
    """The :class:`AxisMap` of the windows of a spec's :class:`PoolAxis`
    (cached with it: the map caches its inverse tables)."""
    return AxisMap(axis.size, axis.index, axis.real)


def _maps(spec):
    return tuple(_windows(a) for a in spec.axes)


@lru_cache(maxsize=1024)
def _tile(axis):
    """k if the windows of a :class:`PoolAxis` are consecutive tiles of k
    positions (output i reads i*k ... i*k + k - 1: no padding, no overlap), else 0."""
    k = axis.taps
    tiles = bool(axis.real.all()) and np.array_equal(axis.index, np.arange(axis.out * k).reshape(axis.out, k))
    return k if tiles else 0


def _sum(x, maps, acc):
    """sum_{q in W(i)} x[n, c, q]: the per-axis window sums, last axis first, in ``acc``."""
    for a in reversed(range(len(maps))):
        x = maps[a].sum(x, 2 + a, acc)
    return x


def _adjoint(g, maps, acc):
    """The adjoint of :func:`_sum`: dx[q] = sum over the windows i holding q of g[i]."""
    for a in range(len(maps)):
        g = maps[a].adjoint(g, 2 + a, acc)
    return g


# --- shared forward/backward bodies --------------------------------------------------------------

def _tiled_taps(x, spec, ks):
    """x's windows as a view (N, C, o_0, k_0, o_1, k_1, ...) where the windows tile the input."""
    outs = [a.out for a in spec.axes]
    crop = x[(slice(None), slice(None)) + tuple(slice(0, o * k) for o, k in zip(outs, ks))]
    return crop.reshape(x.shape[:2] + tuple(v for o, k in zip(outs, ks) for v in (o, k)))


@lru_cache(maxsize=256)
def _tap_indices(ks):
    """For each tap t (row-major, t in Z^R, 0 <= t < ks) the index of its
    strided view in the array of ``_tiled_taps``: (:, :, :, t_0, :, t_1, ...)."""
    full = slice(None)
    return [(full, full) + tuple(v for a in t for v in (full, a)) for t in itertools.product(*map(range, ks))]


def _max_forward(x, spec):
    """y[n, c, i] = max_{q in W(i)} x[n, c, q]: the running maximum of the
    prod(k) taps (strided views of x) where the windows tile the input, else
    the maxima along the last axis, then along the one before, and so on."""
    ks = [_tile(a) for a in spec.axes]
    if not all(ks):
        maps = _maps(spec)
        for a in reversed(range(len(maps))):
            x = maps[a].max(x, 2 + a)
        return x
    taps = _tiled_taps(x, spec, ks)
    first, *rest = _tap_indices(tuple(ks))
    y = taps[first].copy()
    for t in rest:
        np.maximum(y, taps[t], out=y)                # (NaN propagates)
    return y


def _max_backward(grad, out, x, spec):
    """dx[n, c, q] = sum of g[n, c, i] over the windows i whose maximum came
    from q (torch's rule, see the module docstring)."""
    ks = [_tile(a) for a in spec.axes]
    if all(ks) and not np.isnan(out).any():
        return _max_backward_tiled(grad, out, x, spec, ks)
    return _max_backward_separable(grad, x, _maps(spec))


def _max_backward_tiled(grad, y, x, spec, ks):
    """The backward when the windows tile the input and no maximum is NaN:
    window i's tap t is x[n, c, i*k + t], and the first tap in row-major
    order that equals the window's maximum y[n, c, i] takes g[n, c, i] (one
    comparison per tap, no index arithmetic, the gradient or 0 written by
    ``zeroed_where``; the samples split over the threads)."""
    N = x.shape[0]
    covered = tuple(a.out * k for a, k in zip(spec.axes, ks))
    tiled = covered == x.shape[2:]                       # then dx[s] is a view of the taps' shape
    dx = np.empty(x.shape, dtype=x.dtype)
    g = np.asarray(grad).astype(x.dtype, copy=False)
    all_taps = _tap_indices(tuple(ks))

    def samples(s):
        xs = x[s]
        taps = _tiled_taps(xs, spec, ks)
        dtaps = dx[s].reshape(taps.shape) if tiled else np.empty(taps.shape, dtype=x.dtype)
        ys, gs = y[s], g[s]
        open_ = np.ones(ys.shape, dtype=bool)             # windows whose maximum is not found yet
        for t in all_taps:
            hit = np.equal(taps[t], ys)
            hit &= open_
            missed = ~hit
            open_ &= missed
            zeroed_where(gs, missed, out=dtaps[t])
        if not tiled:                                     # positions past the last window get 0
            dx[s] = 0
            dx[(s, slice(None)) + tuple(slice(0, c) for c in covered)] = dtaps.reshape(xs.shape[:2] + covered)
    in_parallel(samples, slices_per_thread(N, x.size))
    return dx


def _max_backward_separable(grad, x, maps):
    """:func:`_max_backward` for any windows.

    The row-major rule is separable: along the last axis, the maximum of
    each line's part of a window and its position (the first maximal one,
    or the last NaN); then along the axis before, over those maxima, the
    first line whose part attains the maximum (or the last one holding NaN)
    with that line's position; and so on to the first axis."""
    spatial = x.shape[2:]
    values, where = maps[-1].argmax(x, x.ndim - 1)          # where: the offset inside the axes reduced so far
    inner = spatial[-1]
    for a in reversed(range(len(maps) - 1)):
        values, pos = maps[a].argmax(values, 2 + a)
        where = np.take_along_axis(where, pos, axis=2 + a) + pos * inner
        inner *= spatial[a]
    N, C = x.shape[:2]
    plane = np.arange(N * C).reshape((N, C) + (1,) * len(maps)) * inner   # offset of image (n, c) in dx
    g = np.asarray(grad, dtype=np.float64).ravel()
    dx = np.bincount((plane + where).ravel(), weights=g, minlength=x.size)   # sums in float64, one rounding
    return dx.reshape(x.shape).astype(x.dtype)


def _mean_forward(x, maps, divisor, acc):
    """y = (window sums) / divisor, summed in ``acc`` (the compute dtype) and rounded once."""
    s = _sum(x, maps, acc)
    s /= divisor.astype(acc)
    return s.astype(x.dtype, copy=False)


def _mean_backward(grad, x, maps, divisor, acc):
    """dx[q] = sum over the windows i holding q of g[i] / divisor[i]."""
    g = np.asarray(grad).astype(acc) / divisor.astype(acc)
    return _adjoint(g, maps, acc).astype(x.dtype, copy=False)


# --- max pooling ---------------------------------------------------------------------------------

def maxpool_forward(x, window, stride, padding, dilation=None, ceil_mode=False):
    """y[n, c, i] = max_{0 <= t < k} x[n, c, i*s - lo + t*d]   (i, t, k, s, lo, d in Z^R)

    over the positions inside the input (padding never wins); NaN propagates."""
    spec = pool_spec("maxpool", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode)
    return _max_forward(x, spec)


def maxpool_backward(grad, out, x, window, stride, padding, dilation=None, ceil_mode=False):
    """dx[n, c, q] = sum of g[n, c, i] over the windows i whose maximum came from q:
    the first maximal position in row-major window order, or the last NaN (torch's rule)."""
    spec = pool_spec("maxpool", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode)
    return (_max_backward(grad, out, x, spec),)


# --- mean pooling --------------------------------------------------------------------------------

def meanpool_forward(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """y[n, c, i] = (1 / D[i]) * sum_{0 <= t < k} x[n, c, i*s - lo + t]   (i, t in Z^R)

    over the positions inside the input (padding adds zeros). The divisor
    D[i] = prod over the axes of the window's taps inside the padded input
    (``count_include_pad``; prod(k) except for a ceil-mode window that reaches
    past the high padding) or inside the input only."""
    spec = pool_spec("meanpool", np.shape(x), x.dtype, window, stride, padding, None, ceil_mode)
    return _mean_forward(x, _maps(spec), spec.divisor(count_include_pad), spec.compute_dtype)


def meanpool_backward(grad, out, x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    """dx[n, c, q] = sum over the windows i holding q of g[n, c, i] / D[i]

    (the adjoint of the forward; what lands on padding is dropped)."""
    spec = pool_spec("meanpool", np.shape(x), x.dtype, window, stride, padding, None, ceil_mode)
    return (_mean_backward(grad, x, _maps(spec), spec.divisor(count_include_pad), spec.compute_dtype),)


# --- Lp-norm pooling -----------------------------------------------------------------------------

def _lp_sums(x, spec, p):
    """u[n, c, i] = S[i] * sum_{q in W(i)} x[n, c, q]^p in the compute dtype."""
    acc = spec.compute_dtype
    u = _sum(np.power(x.astype(acc, copy=False), acc.type(p)), _maps(spec), acc)
    scale = spec.lp_scale()
    if not np.all(scale == 1):
        u *= scale.astype(acc)
    return u


def lpnormpool_forward(x, p, window, stride, padding, dilation=None, ceil_mode=False):
    """y[n, c, i] = u[n, c, i]^(1/p),  u[n, c, i] = S[i] * sum_{0 <= t < k} x[n, c, i*s - lo + t*d]^p

    (i, t, k, s, lo, d in Z^R) over the positions inside the input: padding
    adds 0 to the sum. ``p`` > 0; p = inf gives max_{q in W(i)} |x[n, c, q]|
    (NaN propagates).

    This is torch's ``lp_pool1d/2d/3d`` wherever torch defines it (no padding,
    no dilation; torch computes avg_pool(x^p) * prod(k), then pow(1/p)), and
    NNlib's ``lpnormpool`` extended by ceil_mode:

    * x^p and u^(1/p) are IEEE pow, as torch's: a negative x gives NaN unless
      p is an integer (odd p keeps the sign: then a window whose sum is
      negative gives NaN, except p = 1, the signed sum). NNlib's Julia ``^``
      raises a DomainError for a negative x and a non-integer p instead.
    * S[i] = prod(k) / D[i], D[i] the window's taps inside the padded input:
      1 except for a ceil-mode window reaching past the high padding, which
      torch (its avg_pool divides by D[i], then multiplies by prod(k)) scales
      up by prod(k) / D[i]. NNlib has no ceil_mode.
    * padding and dilation are NNlib's (torch's lp_pool has neither); with
      them this equals torch's lp_pool of the zero-padded input (zeros add 0
      to the sums) with dilated windows.
    * p = inf: torch's lp_pool takes max_pool(|x|); NNlib refuses p = inf.
    """
    spec = pool_spec("lpnormpool", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode, p)
    if spec.p == np.inf:
        return _max_forward(np.abs(x), spec)
    acc = spec.compute_dtype
    u = _lp_sums(x, spec, spec.p)
    return np.power(u, acc.type(1.0 / spec.p)).astype(x.dtype, copy=False)


def lpnormpool_backward(grad, out, x, p, window, stride, padding, dilation=None, ceil_mode=False):
    """dx[n, c, q] = x[n, c, q]^(p-1) * sum over the windows i holding q of w[n, c, i],

    w[n, c, i] = g[n, c, i] * S[i] * u[n, c, i]^(1/p - 1) * sign(u)^2, and w = 0 where u = 0

    (the chain rule of y = u^(1/p) through the sums, u and S as in the
    forward). The factor sign(u)^2 is torch's: its lp_pool computes
    ``sign(u) * relu(|u|)``, whose derivative sign(u) * relu'(|u|) * sign(u)
    is 0 at u = 0 (a window whose sum is 0 passes no gradient, where NNlib's
    x^(p-1) * y^(1-p) gives 0 * inf = NaN for p > 1) and, as torch's sign(NaN)
    is 0, 0 * (the rest) at u = NaN (0 for p = 1, else NaN). p = inf: the gradient
    of max |x|, g * sign(x) at the position the maximum came from (torch's
    rule, as maxpool; sign(NaN) = 0, as torch's). NaN, inf and 0^(negative) follow IEEE arithmetic as
    torch's autograd does (0 * inf = NaN)."""
    spec = pool_spec("lpnormpool", np.shape(x), x.dtype, window, stride, padding, dilation, ceil_mode, p)
    if spec.p == np.inf:
        ax = np.abs(x)
        dx = _max_backward(grad, out if out is not None else _max_forward(ax, spec), ax, spec)
        sign = np.where(np.isnan(x), 0, np.sign(x))          # torch's sign(NaN) = 0
        return (np.multiply(dx, sign, dtype=x.dtype),)
    acc = spec.compute_dtype
    p = acc.type(spec.p)
    u = _lp_sums(x, spec, p)
    w = np.asarray(grad).astype(acc) * np.power(u, acc.type(1.0 / spec.p) - 1)
    scale = spec.lp_scale()
    if not np.all(scale == 1):
        w *= scale.astype(acc)
    sign = np.where(np.isnan(u), acc.type(0), np.sign(u))    # torch's sign(NaN) = 0
    w *= sign                                                 # (0 * NaN = NaN)
    w[u == 0] = 0
    w *= sign
    dx = _adjoint(w, _maps(spec), acc)
    dx *= np.power(x.astype(acc, copy=False), p - 1)
    return (dx.astype(x.dtype, copy=False),)


# --- adaptive pooling ----------------------------------------------------------------------------

def adaptive_maxpool_forward(x, size):
    """y[n, c, i] = max of x[n, c, q] over start(i) <= q < end(i)   (i, q in Z^R),

    start(i) = floor(i*n/m), end(i) = ceil((i+1)*n/m) per axis (input side n,
    output side m); NaN propagates."""
    spec = adaptive_pool_spec("adaptive_maxpool", np.shape(x), x.dtype, size)
    return _max_forward(x, spec)


def adaptive_maxpool_backward(grad, out, x, size):
    """dx[n, c, q] = sum of g[n, c, i] over the windows whose maximum came from q
    (the first maximal position in row-major order, or the last NaN: torch's rule)."""
    spec = adaptive_pool_spec("adaptive_maxpool", np.shape(x), x.dtype, size)
    return (_max_backward(grad, out, x, spec),)


def adaptive_meanpool_forward(x, size):
    """y[n, c, i] = mean of x[n, c, q] over the window i of adaptive_maxpool_forward,

    dividing by its size prod over the axes of (end(i) - start(i))."""
    spec = adaptive_pool_spec("adaptive_meanpool", np.shape(x), x.dtype, size)
    return _mean_forward(x, _maps(spec), spec.divisor(), spec.compute_dtype)


def adaptive_meanpool_backward(grad, out, x, size):
    """dx[n, c, q] = sum over the windows i holding q of g[n, c, i] / (window i's size)."""
    spec = adaptive_pool_spec("adaptive_meanpool", np.shape(x), x.dtype, size)
    return (_mean_backward(grad, x, _maps(spec), spec.divisor(), spec.compute_dtype),)
