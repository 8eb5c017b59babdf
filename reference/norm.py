"""Normalisation family, NumPy reference: batch normalisation.

``x`` has shape (N, C, ...): a batch of N samples with C channels and any
number of trailing spatial axes (none included: (N, C)). Statistics are per
channel ``c``, over the batch axis and every spatial position: M = N * prod(spatial)
values per channel. ``gamma``, ``beta`` (and for ``batchnorm_test`` the given
``mean``, ``var``) have shape (C,).

``batchnorm_running_update`` moves a layer's running statistics toward the
batch's, in place; ``batchnorm_train`` given the running statistics does the
same after normalising (the layer's training step in one call). float16/bfloat16
compute in float32 and round once at the end (a sum over N*H*W half-precision
values would overflow or lose the small terms); float32 and float64 stay as
they are.

``batchnorm_train`` and ``batchnorm_test`` take an ``activation`` attr, one of
the registry's fusable activations (identity, relu, sigmoid, tanh), applied to
the normalised output: a layer ``BatchNorm(C, relu)`` is one primitive, whose
backward first takes dL/dz = dL/dy * act'(z) from the output y.
"""
import math

import numpy as np

from ..specs.norm import batchnorm_spec
from ._activation import activate, through_activation
from ._threads import in_parallel, slices_per_thread
from ._util import in_compute_dtype, keep_for_backward, kept_for_backward


def _spec(x, per_channel, eps, activation="identity"):
    """The batch-norm spec of ``x`` and its per-channel vectors; validates them."""
    return batchnorm_spec(np.shape(x), tuple(np.shape(v) for v in per_channel), np.asarray(x).dtype, eps,
                          activation)


def _rows(x):
    """x (N, C, ...) as (N, C, S), S = prod(spatial) (1 for (N, C)): each (n, c)
    row contiguous for a C-ordered x (a view), so sums along it are NumPy's
    pairwise sums and its sums of products one loop (:func:`_channel_dot`)."""
    return x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))


def _slice_rows(a, cs):
    """The rows (:func:`_rows`) of the channel slice ``cs`` of a C-ordered
    array a (N, C, ...): a view, written through."""
    part = a[:, cs]
    return part.reshape(part.shape[:2] + (math.prod(part.shape[2:]),), copy=False)


def _channel_sum(rows):
    """sum over n and s of rows (N, C, S): (C,), each row summed first."""
    return np.add.reduce(np.add.reduce(rows, axis=2), axis=0)


def _channel_dot(a_rows, b_rows):
    """sum over n and s of a * b for rows (N, C, S): (C,), in one pass without
    the product as an array (np.einsum's loop along each row). Not np.vecdot
    (a BLAS dot per row): OpenBLAS's calls from two threads at once ran slower
    than from one, two halves of (2, 8, 32768) float32 rows on two threads in
    0.73x the time of the whole on one thread where einsum's took 1.86x (one
    thread alone runs vecdot ~1.5x as fast), and the sums must not depend on
    the thread count."""
    return np.add.reduce(np.einsum("ncs,ncs->nc", a_rows, b_rows), axis=0)


class _BatchStats:
    """Per-channel statistics of x over N and the spatial positions (keepdims),
    from one sum of squares ss = sum (x - mean)^2:

    ``mean``; ``var`` = ss / M (biased, normalising); ``running_mean`` and
    ``unbiased`` = ss / (M - 1) (M - 1 taken as 1 when M = 1), what a running
    average takes (a channel whose plain mean is +-inf keeps it as its mean:
    torch's). With no values per channel (N = 0), zeros.

    The mean in two steps: the plain mean p = sum x / M, then the mean of
    ``centred`` = x - p as rows (N, C, S) (:func:`_rows`; into ``out`` when
    given), ``shift`` = sum (x - p) / M (p's rounding, u |p|, would otherwise
    dominate x - mean when the spread is small next to the mean, x ~ 50 +- 1):
    mean = p + shift, x - mean = centred - shift and

        ss = sum (x - p - shift)^2 = sum (x - p)^2 - M shift^2

    (taken as 0 should rounding make it negative).
    """

    def __init__(self, x, spec, out=None):
        m = spec.values_per_channel
        keepdims = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        if m == 0:
            z = np.zeros(keepdims, x.dtype)
            self.mean = self.var = self.running_mean = self.unbiased = z
            self.centred = np.zeros((x.shape[0], x.shape[1], 0), x.dtype)
            self.shift = np.zeros(x.shape[1], x.dtype)
            return
        rows = _rows(x)
        plain = _channel_sum(rows) / m
        self.centred = np.subtract(rows, plain[:, None], out=out)
        self.shift = _channel_sum(self.centred) / m
        ss = np.maximum(_channel_dot(self.centred, self.centred) - m * self.shift * self.shift, 0)
        self.mean = (plain + self.shift).reshape(keepdims)
        self.var = (ss / m).reshape(keepdims)
        self.unbiased = ss / max(m - 1, 1)
        self.running_mean = np.where(np.isinf(plain), plain, self.mean.reshape(-1))

    @classmethod
    def joined(cls, parts):
        """The statistics of consecutive channel slices as one (the slices' own with one)."""
        if len(parts) == 1:
            return parts[0]
        stats = cls.__new__(cls)
        for name, axis in (("mean", 1), ("var", 1), ("running_mean", 0), ("unbiased", 0)):
            setattr(stats, name, np.concatenate([getattr(p, name) for p in parts], axis=axis))
        return stats


def batchnorm_running_update_forward(x, running_mean, running_var, momentum=0.1):
    """Move the running statistics (C,) toward the batch's, in place (returns None):

        running_mean <- (1 - momentum) * running_mean + momentum * mu
        running_var  <- (1 - momentum) * running_var  + momentum * s2 * M / (M - 1)

    mu_c, s2_c the batch mean and biased variance of channel c (as in
    batchnorm_train), M = N * prod(spatial) its values: s2 M / (M - 1) is the
    unbiased variance, as torch and Flux take it. M = 1 uses s2 itself
    (torch's batch_norm would store 0/0 = NaN, and torch.nn.BatchNorm refuses
    such a batch); M = 0 moves nothing (torch's). A channel holding NaN moves
    to NaN; one holding +inf (or -inf) to mean +inf (-inf) and variance NaN,
    as torch's. Both new vectors are computed before either is stored.
    """
    _move_running_stats(x, (running_mean, running_var), (running_mean, running_var), momentum)
    return None


def _move_running_stats(x, running, moved, momentum, stats=None):
    """Store the running statistics ``running`` = (mean, var) moved toward
    x's batch (:func:`batchnorm_running_update_forward`'s math) into
    ``moved`` = (mean, var): ``running`` itself to move in place, or other
    vectors (which get ``running`` unchanged when there is nothing to move).
    ``stats``: x's :class:`_BatchStats`, where the caller has them."""
    spec = _spec(x, running + moved, 0.0)
    if spec.channels == 0 or spec.values_per_channel == 0:
        new_mean, new_var = running
    else:
        xc, old_mean, old_var = in_compute_dtype(x, *running)
        stats = stats if stats is not None else _BatchStats(xc, spec)
        take = xc.dtype.type(momentum)
        keep = 1 - take
        new_mean = keep * old_mean + take * stats.running_mean
        new_var = keep * old_var + take * stats.unbiased
    moved[0][...] = np.asarray(new_mean).astype(moved[0].dtype)
    moved[1][...] = np.asarray(new_var).astype(moved[1].dtype)


def batchnorm_train_forward(x, gamma, beta, running_mean=None, running_var=None, moved_mean=None,
                            moved_var=None, eps=1e-5, momentum=0.1, activation="identity"):
    """y = act(gamma * xhat + beta),   xhat = (x - mu) / sqrt(s2 + eps),

    mu_c = mean of x[:, c, ...],  s2_c = mean of (x[:, c, ...] - mu_c)^2 (biased).

    Given ``running_mean`` and ``running_var`` (C,), they then move as
    :func:`batchnorm_running_update_forward` moves them, once y is computed:
    in place, or given ``moved_mean`` and ``moved_var`` into those (the
    running statistics then stay as they are: a training step keeps the moved
    ones aside until it succeeds).
    """
    running = () if running_mean is None else (running_mean, running_var)
    moved = () if moved_mean is None else (moved_mean, moved_var)
    spec = _spec(x, (gamma, beta) + running + moved, eps, activation)
    xc, gamma, beta = in_compute_dtype(x, gamma, beta)
    slices = slices_per_thread(spec.channels, xc.size)        # each channel's math is independent
    y = None if len(slices) == 1 else np.empty(x.shape, spec.dtype)
    direct = y is not None and y.dtype == xc.dtype             # then each slice is computed in y itself

    def channels(cs):
        stats = _BatchStats(xc[:, cs], spec, out=_slice_rows(y, cs) if direct else None)
        istd = 1 / np.sqrt(stats.var.reshape(-1) + xc.dtype.type(eps))
        # y = act(xhat * gamma + beta) = act((x - p - shift) * a + beta), a = gamma istd,
        # over x - p (``centred``): act((x - p) * a + (beta - shift * a))
        scale = gamma[cs] * istd
        z = stats.centred
        z *= scale[:, None]
        z += (beta[cs] - stats.shift * scale)[:, None]
        out = activate(z, spec.activation, out=z).reshape(xc[:, cs].shape)
        if y is not None and not direct:
            y[:, cs] = out
        return stats, out
    parts = in_parallel(channels, slices)
    stats = _BatchStats.joined([stats for stats, _ in parts])
    if y is None:
        y = parts[0][1].astype(spec.dtype, copy=False)
    if running:
        _move_running_stats(x, running, moved or running, momentum, stats)
    keep_for_backward(y, stats.mean, stats.var)
    return y


def _through_relu(grad, out):
    """(g, sum g per channel) for g = dL/dz of y = relu(z), grad where not
    y <= 0 and 0 elsewhere (:func:`through_activation`'s select), as grad times
    the mask: one product, where the select takes three passes over the
    gradient. Equal to the select for finite gradients (a dropped negative
    one gives -0, which adds as +0); an infinite or NaN one (inf * 0 = NaN)
    makes its channel's sum non-finite, and then g is (None, None): the
    caller takes the select."""
    keep = out <= 0
    np.logical_not(keep, out=keep)                       # not y <= 0: NaN keeps its gradient
    with np.errstate(invalid="ignore"):                  # inf * 0: the caller takes the select
        g = _rows(np.multiply(grad, keep))
    total = _channel_sum(g)
    return (g, total) if np.isfinite(total).all() else (None, None)


def batchnorm_train_backward(grad, out, x, gamma, beta, running_mean=None, running_var=None, moved_mean=None,
                             moved_var=None, eps=1e-5, momentum=0.1, activation="identity"):
    """With M values per channel, istd = 1 / sqrt(s2 + eps) and g = dL/dz
    = dL/dy * act'(z) (written in the output y; dL/dy itself for identity):

    dbeta_c  = sum g,            dgamma_c = sum g * xhat   (sums over N and space)
    dx       = gamma * istd / M * (M g - dbeta - xhat * dgamma)

    (dx includes the paths through mu and s2.) ``out`` serves act' only:
    xhat is recomputed from x, with the batch's mean and variance that the
    forward kept with ``out`` (or recomputed for another array). The running
    (and moved) statistics, when given, get no gradient (None).
    """
    none_for_running = (None,) * sum(v is not None for v in (running_mean, running_var, moved_mean, moved_var))
    spec = _spec(x, (gamma, beta), eps, activation)
    dtypes = x.dtype, np.asarray(gamma).dtype, np.asarray(beta).dtype
    kept = kept_for_backward(out)
    x, gamma, beta, grad, out = in_compute_dtype(x, gamma, beta, grad, out)
    grad, out = np.broadcast_to(grad, x.shape), np.broadcast_to(out, x.shape)   # (a scalar gradient, too)
    m = spec.values_per_channel
    if kept is not None:
        kept = [v.astype(x.dtype, copy=False) for v in kept]
    slices = slices_per_thread(spec.channels, x.size)
    dx = None if len(slices) == 1 else np.empty(x.shape, dtypes[0])
    direct = dx is not None and dx.dtype == x.dtype             # then each slice is computed in dx itself

    def channels(cs):
        xs = x[:, cs]
        if kept is None:
            stats = _BatchStats(xs, spec)
            mean, var = stats.mean, stats.var
        else:
            mean, var = (v[:, cs] for v in kept)
        if m == 0:
            return np.zeros_like(xs), np.zeros(xs.shape[1], xs.dtype), np.zeros(xs.shape[1], xs.dtype)
        g, dbeta = _through_relu(grad[:, cs], out[:, cs]) if spec.activation == "relu" else (None, None)
        if dbeta is None:
            g = _rows(through_activation(grad[:, cs], out[:, cs], spec.activation))
            dbeta = _channel_sum(g)
        istd = 1 / np.sqrt(var.reshape(-1) + x.dtype.type(eps))
        centred = np.subtract(_rows(xs), mean.reshape(-1, 1), out=_slice_rows(dx, cs) if direct else None)
        dgamma = _channel_dot(g, centred) * istd          # sum g * xhat, xhat = (x - mean) istd
        # dx = gamma istd (g - dbeta / M - xhat dgamma / M), its passes in place over x - mean
        dxs = centred
        dxs *= (-istd * dgamma / m)[:, None]
        dxs += g
        dxs -= (dbeta / m)[:, None]
        dxs *= (gamma[cs] * istd)[:, None]
        dxs = dxs.reshape(xs.shape)
        if dx is not None and not direct:
            dx[:, cs] = dxs
        return dxs, dgamma, dbeta
    parts = in_parallel(channels, slices)
    dgamma, dbeta = (np.concatenate([p[i] for p in parts]) for i in (1, 2))
    dxs = parts[0][0].astype(dtypes[0], copy=False) if dx is None else dx
    return (dxs, dgamma.astype(dtypes[1]), dbeta.astype(dtypes[2])) + none_for_running


def batchnorm_test_forward(x, gamma, beta, mean, var, eps=1e-5, activation="identity"):
    """y = act(gamma * (x - mean) / sqrt(var + eps) + beta), with the given
    (running) per-channel ``mean`` and ``var``."""
    spec = _spec(x, (gamma, beta, mean, var), eps, activation)
    shape = spec.channel_shape
    x, gamma, beta, mean, var = in_compute_dtype(x, gamma, beta, mean, var)
    istd = 1 / np.sqrt(var.reshape(shape) + x.dtype.type(eps))
    y = gamma.reshape(shape) * (x - mean.reshape(shape)) * istd + beta.reshape(shape)
    return activate(y, spec.activation).astype(spec.dtype)


def batchnorm_test_backward(grad, out, x, gamma, beta, mean, var, eps=1e-5, activation="identity"):
    """istd = 1 / sqrt(var + eps), g = dL/dz = dL/dy * act'(z) (from the output y):

    dx = g * gamma * istd,   dgamma_c = sum g * (x - mean) * istd,   dbeta_c = sum g;
    no gradient (None) for the statistics ``mean`` and ``var``.
    """
    spec = _spec(x, (gamma, beta, mean, var), eps, activation)
    axes, shape = spec.reduced_axes, spec.channel_shape
    dtypes = x.dtype, np.asarray(gamma).dtype, np.asarray(beta).dtype
    x, gamma, beta, mean, var, g, y = in_compute_dtype(x, gamma, beta, mean, var, grad, out)
    g = through_activation(g, y, spec.activation)
    istd = 1 / np.sqrt(var.reshape(shape) + x.dtype.type(eps))
    dx = g * gamma.reshape(shape) * istd
    dgamma = np.sum(g * (x - mean.reshape(shape)) * istd, axis=axes)
    dbeta = np.sum(g, axis=axes)
    return dx.astype(dtypes[0]), dgamma.astype(dtypes[1]), dbeta.astype(dtypes[2]), None, None
