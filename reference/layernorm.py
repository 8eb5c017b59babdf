"""Per-sample normalisation, NumPy reference: layernorm, rmsnorm, groupnorm
and instance norm (``triflux.specs.layernorm`` has the geometry).

Every primitive here normalises *rows*: the values of one sample that share
one set of statistics, M of them per row.

* layernorm: the ``normalised_ndim`` trailing axes of ``x``; a row is
  ``x[i, ...]`` flattened over them. ``weight``/``bias`` have their shape.
* rmsnorm: the same rows, scaled by their root mean square (no centring).
* groupnorm: ``x`` (N, C, *spatial); a row is one sample's group of C/G
  consecutive channels, M = (C/G) * prod(spatial) values. ``weight``/``bias``
  are per channel (C,). Instance norm is groupnorm with G = C.

The math, for one row ``x_1 .. x_M`` (layernorm and groupnorm)::

    mu = sum(x) / M,   var = sum((x - mu)^2) / M   (biased),   istd = 1 / sqrt(var + eps)
    xhat = (x - mu) * istd,   z = xhat * w + b,   y = act(z)

with ``w``, ``b`` the weight and bias of each value's position (layernorm) or
channel (groupnorm); 1 and 0 when not given. rmsnorm::

    r = 1 / sqrt(sum(x^2) / M + eps),   xhat = x * r,   y = xhat * w.

Backward, with ``g = dL/dz = dL/dy * act'(z)`` (written in the output y, see
``_activation.through_activation``) and ``gw = g * w``::

    layernorm, groupnorm:  dx = istd * (gw - mean(gw) - xhat * mean(gw * xhat))
    rmsnorm:               dx = r    * (gw            - xhat * mean(gw * xhat))

(means over the row; both include the paths through the statistics, and are
exact for any eps), and the parameter gradients are sums over every row::

    dweight = sum over rows of g * xhat,   dbias = sum over rows of g

(per position for layernorm/rmsnorm; per channel, over the samples and the
spatial positions, for groupnorm).

Statistics are computed as batch norm's are (reference/norm.py): the mean is
refined once (mu + sum(x - mu) / M), so that rows of nearly equal values far
from 0 keep their small variance. A row holding NaN or +-inf has NaN output
and gradients (and NaN in the parameter gradients it feeds), as torch's. A
row of one value has var = 0 and xhat = 0 (y = b). float16/bfloat16 compute in
float32 and round once at the end; float32 and float64 stay as they are.

``instancenorm_train`` also moves running statistics (the layer
``InstanceNorm(track_stats=True)`` in training): per channel c, with
mu_nc and the unbiased variance v_nc = sum((x - mu_nc)^2) / (S - 1) of each
sample n's instance (S values; S - 1 taken as 1 when S = 1)::

    running_mean_c <- (1 - momentum) running_mean_c + momentum * mean over n of mu_nc
    running_var_c  <- (1 - momentum) running_var_c  + momentum * mean over n of v_nc

as torch's InstanceNorm does (and Flux's, which averages the same way). An
instance whose plain mean is +-inf contributes that infinity as its mean,
as torch keeps it. An empty batch (N = 0) or empty instances (S = 0) move
nothing (torch also moves nothing for S = 0; for N = 0 it stores the NaN of a
mean over no samples).
"""

import numpy as np

from ..specs.layernorm import groupnorm_spec, instancenorm_inputs, instancenorm_spec, layernorm_spec, rmsnorm_spec
from ._activation import activate, through_activation
from ._threads import in_parallel, slices_per_thread
from ._util import in_compute_dtype, keep_for_backward, kept_for_backward


# --- row statistics ----------------------------------------------------------------------------

def _centred(rows, out=None):
    """(mean, x - mean, plain mean) of each row of ``rows`` (R, M), M > 0:
    the plain mean sum(x) / M, refined once by the mean of x - plain (its
    rounding would otherwise show in x - mean for rows far from 0). Keepdims;
    x - mean into ``out`` when given."""
    m = rows.shape[1]
    plain = np.add.reduce(rows, axis=1, keepdims=True) / m
    centred = np.subtract(rows, plain, out=out)
    shift = np.add.reduce(centred, axis=1, keepdims=True) / m
    centred -= shift
    return plain + shift, centred, plain


def _row_sum_of_products(a, b):
    """sum over each row of a * b, for (R, M) arrays: (R, 1), without the product as an array."""
    return np.vecdot(a, b)[:, None]


def _inverse_std(sqdev, m, eps):
    """1 / sqrt(sqdev / M + eps) (NaN where var + eps < 0, as torch's rsqrt)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1 / np.sqrt(sqdev / m + sqdev.dtype.type(eps))


def _grad_and_output(xc, grad, out, activation):
    """The output gradient and the output in x's compute dtype, broadcast to
    x's shape (a scalar gradient, too); the output is read only through the
    activation's derivative, so without one it may be None (then the
    gradient stands in for it)."""
    grad = np.broadcast_to(np.asarray(grad).astype(xc.dtype, copy=False), xc.shape)
    if activation == "identity" or out is None:
        return grad, grad
    return grad, np.broadcast_to(np.asarray(out).astype(xc.dtype, copy=False), xc.shape)


def _slices(rows, values):
    """The rows cut into one slice of consecutive rows per thread (see _threads)."""
    return slices_per_thread(rows, values)


# --- layernorm and rmsnorm -----------------------------------------------------------------------

def _row_spec(primitive, x, params, normalised_ndim, eps, activation="identity"):
    shapes = tuple(np.shape(p) for p in params)
    if primitive == "layernorm":
        return layernorm_spec(np.shape(x), shapes, np.asarray(x).dtype, normalised_ndim, eps, activation)
    return rmsnorm_spec(np.shape(x), shapes, np.asarray(x).dtype, normalised_ndim, eps)


def _normalise_rows(spec, x, params):
    """y for a layernorm or rmsnorm (``spec.primitive``) of ``x``, and per row
    the statistics its backward reads: (mean, istd) for layernorm, (0, r) for
    rmsnorm, each (R, 1) in the compute dtype. The work happens in y's own
    memory where y has the compute dtype (float32, float64): a fresh array
    per step would cost more in page faults than the arithmetic."""
    r, m = spec.rows, spec.row_length
    ct = spec.compute_dtype
    xc, *params = in_compute_dtype(x, *params)
    rows = xc.reshape(r, m)
    w = params[0].reshape(1, m) if spec.has_weight else None
    b = params[1].reshape(1, m) if spec.has_bias else None
    y = np.empty((r, m), spec.dtype)
    mean = np.zeros((r, 1), ct)
    istd = np.empty((r, 1), ct)
    if r == 0 or m == 0:
        return y.reshape(spec.x_shape), mean, istd

    def part(s):
        z = y[s] if y.dtype == ct else np.empty(rows[s].shape, ct)
        if spec.primitive == "layernorm":
            mean[s] = _centred(rows[s], out=z)[0]
        else:
            np.copyto(z, rows[s])
        istd[s] = _inverse_std(_row_sum_of_products(z, z), m, spec.eps)
        z *= istd[s]                      # xhat
        if w is not None:
            z *= w
        if b is not None:
            z += b
        activate(z, spec.activation, out=z)
        if z.base is not y:
            y[s] = z
    in_parallel(part, _slices(r, r * m))
    return y.reshape(spec.x_shape), mean, istd


def _row_backward(spec, grad, out, x, params):
    """(dx, dweight[, dbias]) of a layernorm or rmsnorm (see the module docstring),
    in dx's memory where dx has the compute dtype, with one temporary, t = g xhat:

        c2 = mean(gw xhat) = t . weight / M,   dweight = sum over rows of t,
        dx = istd * (gw - mean(gw) - xhat * c2)    (layernorm; rmsnorm without mean(gw))."""
    r, m = spec.rows, spec.row_length
    dtypes = [np.asarray(a).dtype for a in (x,) + tuple(params)]
    kept = kept_for_backward(out)
    xc, *params = in_compute_dtype(x, *params)
    grad, out = _grad_and_output(xc, grad, out, spec.activation)
    rows, g_rows, out_rows = xc.reshape(r, m), grad.reshape(r, m), out.reshape(r, m)
    w = params[0].reshape(m) if spec.has_weight else None
    ct = xc.dtype
    dx = np.empty((r, m), dtypes[0])
    if r == 0 or m == 0:
        sums = [np.zeros(m, ct) for _ in params]
        return (dx.reshape(spec.x_shape),) + tuple(s.reshape(spec.normalised_shape).astype(d)
                                                   for s, d in zip(sums, dtypes[1:]))
    if kept is not None:
        mean, istd = (v.astype(ct, copy=False) for v in kept)

    def part(s):
        g = through_activation(g_rows[s], out_rows[s], spec.activation)
        xhat = dx[s] if dx.dtype == ct else np.empty(rows[s].shape, ct)
        if kept is None:
            if spec.primitive == "layernorm":
                _centred(rows[s], out=xhat)
            else:
                np.copyto(xhat, rows[s])
            inv = _inverse_std(_row_sum_of_products(xhat, xhat), m, spec.eps)
        else:
            inv = istd[s]
            if spec.primitive == "layernorm":
                np.subtract(rows[s], mean[s], out=xhat)
            else:
                np.copyto(xhat, rows[s])
        xhat *= inv
        t = np.multiply(g, xhat)                                  # g xhat
        c2 = (t @ w if w is not None else np.add.reduce(t, axis=1))[:, None] / m
        sums = []
        if spec.has_weight:
            sums.append(np.add.reduce(t, axis=0))
        if spec.has_bias:
            sums.append(np.add.reduce(g, axis=0))
        gw = np.multiply(g, w, out=t) if w is not None else g
        xhat *= -c2
        xhat += gw
        if spec.primitive == "layernorm":
            xhat -= np.add.reduce(gw, axis=1, keepdims=True) / m
        xhat *= inv
        if xhat.base is not dx:
            dx[s] = xhat
        return sums
    parts = in_parallel(part, _slices(r, r * m))
    sums = [_sum_in_order([p[i] for p in parts]) for i in range(len(params))]
    return (dx.reshape(spec.x_shape),) + tuple(s.reshape(spec.normalised_shape).astype(d)
                                               for s, d in zip(sums, dtypes[1:]))


def _sum_in_order(arrays):
    """The arrays added up in order (the threads' partial sums of a parameter gradient)."""
    total = arrays[0]
    for a in arrays[1:]:
        total = total + a
    return total


def layernorm_forward(x, weight=None, bias=None, normalised_ndim=1, eps=1e-5, activation="identity"):
    """y = act((x - mu) / sqrt(var + eps) * weight + bias), mu and the biased
    variance var over each row: the ``normalised_ndim`` trailing axes of x
    (torch's ``layer_norm(x, x.shape[-normalised_ndim:], weight, bias, eps)``).
    ``weight`` and ``bias`` (the normalised shape) are optional: without
    them the scale is 1 and the shift 0."""
    params = tuple(p for p in (weight, bias) if p is not None)
    spec = _row_spec("layernorm", x, params, normalised_ndim, eps, activation)
    y, mean, istd = _normalise_rows(spec, x, params)
    keep_for_backward(y, mean, istd)
    return y


def layernorm_backward(grad, out, x, weight=None, bias=None, normalised_ndim=1, eps=1e-5, activation="identity"):
    """With xhat = (x - mu) * istd per row, g = dL/dz = dL/dy * act'(z) (from
    the output y) and gw = g * weight:

        dx      = istd * (gw - mean(gw) - xhat * mean(gw * xhat))   (means over the row)
        dweight = sum over the rows of g * xhat,   dbias = sum over the rows of g

    One gradient per given input. ``out`` serves act' only; the row statistics
    are those the forward kept with ``out`` (or recomputed for another array)."""
    params = tuple(p for p in (weight, bias) if p is not None)
    spec = _row_spec("layernorm", x, params, normalised_ndim, eps, activation)
    return _row_backward(spec, grad, out, x, params)


def rmsnorm_forward(x, weight=None, normalised_ndim=1, eps=None):
    """y = x * r * weight,  r = 1 / sqrt(mean(x^2) + eps), the mean over each
    row (the ``normalised_ndim`` trailing axes): torch's ``rms_norm``.
    ``eps=None`` is the machine epsilon of the compute type (2^-23 for
    float16, bfloat16 and float32 data, 2^-52 for float64), the value torch
    2.x uses. ``weight`` (the normalised shape) is optional."""
    params = () if weight is None else (weight,)
    spec = _row_spec("rmsnorm", x, params, normalised_ndim, eps)
    y, zero, r = _normalise_rows(spec, x, params)
    keep_for_backward(y, zero, r)
    return y


def rmsnorm_backward(grad, out, x, weight=None, normalised_ndim=1, eps=None):
    """With xhat = x * r per row and gw = grad * weight:

        dx      = r * (gw - xhat * mean(gw * xhat))      (= r gw - x r^3 mean(gw x))
        dweight = sum over the rows of grad * xhat.
    """
    params = () if weight is None else (weight,)
    spec = _row_spec("rmsnorm", x, params, normalised_ndim, eps)
    return _row_backward(spec, grad, out, x, params)


# --- groupnorm and instance norm -------------------------------------------------------------------

def _group_rows(spec, a):
    """``a`` (N, C, *spatial) as (N, G, C/G, S): each [n, g] one row of the norm (a view for a C-ordered a)."""
    n, c = spec.x_shape[:2]
    return a.reshape(n, spec.groups, spec.channels_per_group, spec.spatial_size)


def _normalise_groups(spec, x, params):
    """y of a groupnorm and per row its (mean, istd, plain mean, sum of squared deviations), (N, G) each."""
    n, gs, cg, s = spec.batch, spec.groups, spec.channels_per_group, spec.spatial_size
    m = spec.row_length
    xc, *params = in_compute_dtype(x, *params)
    ct = xc.dtype
    y = np.empty(spec.x_shape, spec.dtype)
    mean, istd, plain, sqdev = (np.zeros((n, gs), ct) for _ in range(4))
    if n * gs == 0 or m == 0:
        return y, (mean, istd, plain, sqdev)
    w = params[0].reshape(gs, cg, 1) if spec.has_weight else None
    b = params[1].reshape(gs, cg, 1) if spec.has_bias else None
    x4, y4 = _group_rows(spec, xc), _group_rows(spec, y)

    def part(sl):
        rows = x4[sl].reshape(-1, m)
        mu, z, pl = _centred(rows)
        q = _row_sum_of_products(z, z)
        inv = _inverse_std(q, m, spec.eps)
        k = rows.shape[0] // gs if gs else 0
        mean[sl], istd[sl], plain[sl], sqdev[sl] = (v.reshape(k, gs) for v in (mu, inv, pl, q))
        z *= inv
        z = z.reshape(k, gs, cg, s)
        if w is not None:
            z *= w
        if b is not None:
            z += b
        y4[sl] = activate(z, spec.activation, out=z)
    in_parallel(part, _slices(n, n * gs * m))
    return y, (mean, istd, plain, sqdev)


def _group_backward(spec, grad, out, x, params, kept):
    """(dx, dweight[, dbias]) of a groupnorm (see the module docstring)."""
    n, gs, cg, s = spec.batch, spec.groups, spec.channels_per_group, spec.spatial_size
    m = spec.row_length
    dtypes = [np.asarray(a).dtype for a in (x,) + tuple(params)]
    xc, *params = in_compute_dtype(x, *params)
    grad, out = _grad_and_output(xc, grad, out, spec.activation)
    ct = xc.dtype
    dx = np.empty(spec.x_shape, dtypes[0])
    if n * gs == 0 or m == 0:
        return (dx,) + tuple(np.zeros(spec.channels, d) for d in dtypes[1:])
    w = params[0].reshape(gs, cg, 1) if spec.has_weight else None
    x4, g4, o4, dx4 = (_group_rows(spec, a) for a in (xc, grad, out, dx))
    if kept is not None:
        mean, istd = (v.astype(ct, copy=False) for v in kept[:2])

    def part(sl):
        k = x4[sl].shape[0]
        g = through_activation(g4[sl], o4[sl], spec.activation)
        if kept is None:
            _, xhat, _ = _centred(x4[sl].reshape(-1, m))
            inv = _inverse_std(_row_sum_of_products(xhat, xhat), m, spec.eps)
        else:
            inv = istd[sl].reshape(-1, 1)
            xhat = x4[sl].reshape(-1, m) - mean[sl].reshape(-1, 1)
        xhat *= inv
        xhat = xhat.reshape(k, gs, cg, s)
        gw = g * w if w is not None else g
        gw_rows, xhat_rows = gw.reshape(-1, m), xhat.reshape(-1, m)
        c2 = _row_sum_of_products(gw_rows, xhat_rows) / m
        d = gw_rows - xhat_rows * c2
        d -= np.add.reduce(gw_rows, axis=1, keepdims=True) / m
        d *= inv
        dx4[sl] = d.reshape(k, gs, cg, s)
        sums = []
        if spec.has_weight:
            sums.append(np.add.reduce(np.add.reduce(g * xhat, axis=3), axis=0).reshape(-1))
        if spec.has_bias:
            sums.append(np.add.reduce(np.add.reduce(g, axis=3), axis=0).reshape(-1))
        return sums
    parts = in_parallel(part, _slices(n, n * gs * m))
    sums = [_sum_in_order([p[i] for p in parts]) for i in range(len(params))]
    return (dx,) + tuple(v.astype(d) for v, d in zip(sums, dtypes[1:]))


def _group_spec(x, params, groups, eps, activation):
    return groupnorm_spec(np.shape(x), tuple(np.shape(p) for p in params), np.asarray(x).dtype, groups, eps,
                          activation)


def groupnorm_forward(x, weight=None, bias=None, *, groups, eps=1e-5, activation="identity"):
    """y = act((x - mu) / sqrt(var + eps) * weight[c] + bias[c]) for x (N, C,
    *spatial), mu and the biased variance var over each sample's group of
    C/groups consecutive channels and all their positions (torch's
    ``group_norm``). ``weight`` and ``bias`` (C,) are optional."""
    params = tuple(p for p in (weight, bias) if p is not None)
    spec = _group_spec(x, params, groups, eps, activation)
    y, stats = _normalise_groups(spec, x, params)
    keep_for_backward(y, *stats[:2])
    return y


def groupnorm_backward(grad, out, x, weight=None, bias=None, *, groups, eps=1e-5, activation="identity"):
    """With xhat = (x - mu) * istd per group, g = dL/dz (through act, from
    the output) and gw = g * weight[c]:

        dx         = istd * (gw - mean(gw) - xhat * mean(gw * xhat))   (means over the group)
        dweight[c] = sum over samples and positions of channel c of g * xhat
        dbias[c]   = sum over samples and positions of channel c of g.
    """
    params = tuple(p for p in (weight, bias) if p is not None)
    spec = _group_spec(x, params, groups, eps, activation)
    return _group_backward(spec, grad, out, x, params, kept_for_backward(out))


def _instance_spec(x, tensors, affine, eps, activation, primitive="instancenorm_train"):
    params, running, moved = instancenorm_inputs(tensors, affine)
    spec = instancenorm_spec(np.shape(x), tuple(np.shape(p) for p in params),
                             tuple(np.shape(v) for v in running + moved), np.asarray(x).dtype, eps, activation,
                             bool(moved), primitive)
    return spec, params, running, moved


def _move_running(spec, x, running, moved, momentum, stats):
    """Store running = (mean, var) moved toward the batch's instance
    statistics into ``moved`` (running itself: in place). ``stats``: the
    groupnorm's (mean, istd, plain, sqdev) per (n, c), or None to take them."""
    n, c, s = spec.batch, spec.channels, spec.spatial_size
    if n == 0 or c == 0 or s == 0:
        new_mean, new_var = running
    else:
        xc, old_mean, old_var = in_compute_dtype(x, *running)
        if stats is None:
            mu, z, plain = _centred(xc.reshape(n * c, s))
            stats = (mu.reshape(n, c), None, plain.reshape(n, c), _row_sum_of_products(z, z).reshape(n, c))
        mu, _, plain, sqdev = stats
        instance_mean = np.where(np.isinf(plain), plain, mu)
        unbiased = sqdev / max(s - 1, 1)
        take = xc.dtype.type(momentum)
        keep = 1 - take
        new_mean = keep * old_mean + take * (np.add.reduce(instance_mean, axis=0) / n)
        new_var = keep * old_var + take * (np.add.reduce(unbiased, axis=0) / n)
    moved[0][...] = np.asarray(new_mean).astype(moved[0].dtype)
    moved[1][...] = np.asarray(new_var).astype(moved[1].dtype)


def instancenorm_train_forward(x, *tensors, affine=False, eps=1e-5, momentum=0.1, activation="identity"):
    """Instance norm with each sample's own statistics: groupnorm with one
    group per channel (y = act((x - mu_nc) / sqrt(var_nc + eps) * weight[c] +
    bias[c])), ``tensors`` = (weight, bias) when ``affine``, then optionally
    (running_mean, running_var) and (moved_mean, moved_var).

    Given the running statistics, they then move (once y is computed), in
    place or into the moved ones, which get them while the running ones stay
    (a training step keeps the moved ones aside until it succeeds)::

        running_mean <- (1 - momentum) running_mean + momentum * mean over n of mu_nc
        running_var  <- (1 - momentum) running_var  + momentum * mean over n of sum((x - mu_nc)^2) / (S - 1)

    (S the positions per instance; S - 1 taken as 1 when S = 1; nothing moves
    for N = 0 or S = 0), torch's InstanceNorm(track_running_stats=True)."""
    spec, params, running, moved = _instance_spec(x, tensors, affine, eps, activation)
    y, stats = _normalise_groups(spec, x, params)
    if running:
        _move_running(spec, x, running, moved or running, momentum, stats)
    keep_for_backward(y, *stats[:2])
    return y


def instancenorm_train_backward(grad, out, x, *tensors, affine=False, eps=1e-5, momentum=0.1,
                                activation="identity"):
    """groupnorm_backward with one group per channel: dx, and dweight, dbias
    when ``affine``; None for the running (and moved) statistics."""
    spec, params, running, moved = _instance_spec(x, tensors, affine, eps, activation)
    grads = _group_backward(spec, grad, out, x, params, kept_for_backward(out))
    return grads + (None,) * (len(running) + len(moved))


def instancenorm_running_update_forward(x, running_mean, running_var, momentum=0.1):
    """Move the running statistics (C,) toward the batch's instance statistics,
    in place (returns None), as instancenorm_train does:

        running_mean <- (1 - momentum) running_mean + momentum * mean over n of mu_nc
        running_var  <- (1 - momentum) running_var  + momentum * mean over n of v_nc

    mu_nc the mean and v_nc the unbiased variance (sum of squared deviations
    over S - 1; over 1 when S = 1) of sample n's channel c. Nothing moves for
    N = 0 or S = 0; a NaN instance makes both NaN, an infinite one the mean
    +-inf and the variance NaN (torch's). Both new vectors are computed
    before either is stored."""
    spec, _, running, _ = _instance_spec(x, (running_mean, running_var), False, 1e-5, "identity",
                                         "instancenorm_running_update")
    _move_running(spec, x, running, running, momentum, None)
    return None
