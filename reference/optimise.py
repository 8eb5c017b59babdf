"""Optimiser updates: one step of each rule of Optimisers.jl (v0.4,
``src/rules.jl``), applied in place.

Each ``<rule>_update_forward(x, g, *states, **hyper)`` overwrites the
parameter ``x`` and the rule's state arrays with their new values and returns
``None``. ``g`` is the gradient of the loss with respect to ``x``; every
array has ``x``'s shape and dtype. The formulas are elementwise; ``t`` is the
1-based step count, so the first update uses ``t = 1``.

``<rule>_update_foreach(xs, gs, *state_lists, **hyper)`` is the same step for
a list of parameters (the lists hold, per parameter, its ``x``, ``g`` and
states; the parameters may differ in shape and dtype): here a loop applying
``<rule>_update_forward`` to each (the small ones of a dtype as one array laid
end to end), on the GPU one launch per dtype for all.

Arithmetic happens in float64 for float64 arrays and in float32 otherwise
(float16 and bfloat16 are converted to float32 first and rounded at the end,
as the kernels do). So unlike Optimisers.jl on Float16 arrays, an epsilon of
1e-8 needs no minimum: it is representable in float32. The hyperparameters
(``eta``, ``rho``, ...) are converted to the compute type like Julia's
``T(o.eta)``; the bias corrections ``1 - beta^t`` are computed in float64
first (Optimisers.jl accumulates ``beta^t`` in the array's type).

Defaults in Optimisers.jl (triflux.optimise keeps them): ``Descent(0.1)``,
``Momentum(0.01, 0.9)``, ``Nesterov(0.001, 0.9)``, ``Adam(0.001, (0.9,
0.999), 1e-8)``, ``AdamW(0.001, (0.9, 0.999), lambda=0, 1e-8)``,
``RMSProp(0.001, 0.9, 1e-8)``.
"""
import contextlib

import numpy as np

from triflux.dtypes import compute_dtype
from triflux.specs.optimise import check_step

from ._threads import in_parallel


@contextlib.contextmanager
def _in_compute_type(*arrays):
    """The arrays as the compute type, to be updated in place. Arrays already
    of that type are used as they are (no copy); float16/bfloat16 arrays get
    float32 copies, rounded back into the originals on exit."""
    work = [a if a.dtype == compute_dtype(a.dtype) else a.astype(compute_dtype(a.dtype)) for a in arrays]
    yield work
    for a, w in zip(arrays, work):
        if w is not a:
            a[...] = w.astype(a.dtype)


def descent_update_forward(x, g, *, eta):
    """Plain gradient descent (Optimisers.jl ``Descent``)::

        x <- x - eta * g
    """
    with _in_compute_type(x, g) as (xc, gc):
        xc -= xc.dtype.type(eta) * gc


def momentum_update_forward(x, g, v, *, eta, rho):
    """Gradient descent with momentum (Optimisers.jl ``Momentum``); ``v`` is
    the velocity, zero at the start::

        v <- rho * v + eta * g
        x <- x - v
    """
    with _in_compute_type(x, g, v) as (xc, gc, vc):
        T = xc.dtype.type
        vc *= T(rho)
        vc += T(eta) * gc
        xc -= vc


def nesterov_update_forward(x, g, v, *, eta, rho):
    """Nesterov momentum (Optimisers.jl ``Nesterov``); ``v`` is the velocity,
    zero at the start, kept with the opposite sign to ``Momentum``'s::

        d <- -rho^2 * v + (1 + rho) * eta * g     (uses the old v)
        v <- rho * v - eta * g
        x <- x - d
    """
    with _in_compute_type(x, g, v) as (xc, gc, vc):
        T = xc.dtype.type
        eta, rho = T(eta), T(rho)
        d = -rho ** 2 * vc + (1 + rho) * eta * gc
        vc *= rho
        vc -= eta * gc
        xc -= d


def _adam_moments(gc, mc, vc, beta1, beta2, scratch):
    """The Adam moments, in place (``scratch``: a buffer like ``g``)::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
    """
    T = gc.dtype.type
    mc *= T(beta1)
    mc += np.multiply(gc, T(1 - beta1), out=scratch)
    vc *= T(beta2)
    np.multiply(gc, gc, out=scratch)
    vc += np.multiply(scratch, T(1 - beta2), out=scratch)


def _adam_direction(mc, vc, beta1, beta2, epsilon, step, out, eta=1.0):
    """The Adam step, ``eta`` times the direction, written into ``out``::

        d = eta * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
    """
    T = mc.dtype.type
    bc1, bc2 = T(1.0 - float(beta1) ** step), T(1.0 - float(beta2) ** step)
    np.divide(vc, bc2, out=out)
    np.sqrt(out, out=out)
    out += T(epsilon)
    np.divide(mc, out, out=out)
    out *= T(eta) / bc1
    return out


#: elements per block of :func:`_in_blocks`: the four float32 arrays of a block (1 MB) stay in cache
_BLOCK = 1 << 16


def _in_blocks(*arrays):
    """The arrays (of one shape), cut into matching blocks of their flattened
    memory: an update's dozen elementwise passes then run over each block
    while it is in cache, instead of a dozen trips through main memory for a
    large parameter. Small arrays (that stay in cache anyway) and arrays that
    are not all contiguous come as one block."""
    if arrays[0].size <= 4 * _BLOCK or not all(a.flags.c_contiguous for a in arrays):
        yield arrays
        return
    flat = [a.reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, _BLOCK):
        yield [a[start: start + _BLOCK] for a in flat]


def _each_block(update, *arrays):
    """``update(*blocks, scratch)`` for each block of :func:`_in_blocks`, with
    a scratch array of the block's shape; the blocks are independent, so they
    run on all the reference's threads at once (``_threads``)."""
    in_parallel(lambda blocks: update(*blocks, np.empty_like(blocks[0])), list(_in_blocks(*arrays)))


def adam_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, step):
    """Adam (Optimisers.jl ``Adam``); ``m``, ``v`` start at zero, ``t = step``::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        x <- x - eta * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)

    The same as ``torch.optim.Adam`` (whose epsilon is also added after the
    square root of the bias-corrected ``v``).
    """
    step = check_step(step)
    def update(xb, gb, mb, vb, d):
        _adam_moments(gb, mb, vb, beta1, beta2, d)
        _adam_direction(mb, vb, beta1, beta2, epsilon, step, d, eta)
        xb -= d
    with _in_compute_type(x, g, m, v) as (xc, gc, mc, vc):
        _each_block(update, xc, gc, mc, vc)


def adamw_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, lambd, step):
    """AdamW (Optimisers.jl ``AdamW``, v0.4 default ``couple=true``): Adam
    with learning rate 1, then weight decay coupled with the learning rate::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        d  = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
        x <- x - eta * (d + lambd * x)          (the old x in lambd * x)

    This is ``torch.optim.AdamW`` (which shrinks ``x`` by ``1 - eta*lambd``
    first). Optimisers.jl's default ``lambd`` is 0 (torch's is 0.01).
    Optimisers.jl before v0.4 decoupled it: ``x <- x - eta*d - lambd*x``.
    """
    step = check_step(step)
    def update(xb, gb, mb, vb, d):
        T = xb.dtype.type
        _adam_moments(gb, mb, vb, beta1, beta2, d)
        _adam_direction(mb, vb, beta1, beta2, epsilon, step, d)
        d += T(lambd) * xb
        d *= T(eta)
        xb -= d
    with _in_compute_type(x, g, m, v) as (xc, gc, mc, vc):
        _each_block(update, xc, gc, mc, vc)


def rmsprop_update_forward(x, g, s, *, eta, rho, epsilon):
    """RMSProp (Optimisers.jl ``RMSProp``, not centred); ``s`` is the running
    mean of squared gradients, zero at the start::

        s <- rho * s + (1 - rho) * g^2
        x <- x - eta * g / (sqrt(s) + epsilon)

    The same as ``torch.optim.RMSprop`` with ``alpha = rho``.
    """
    with _in_compute_type(x, g, s) as (xc, gc, sc):
        T = xc.dtype.type
        sc *= T(rho)
        sc += T(1 - rho) * (gc * gc)
        d = np.asarray(np.sqrt(sc))
        d += T(epsilon)
        np.divide(T(eta) * gc, d, out=d)
        xc -= d


# --- every parameter of a list ---------------------------------------------------------------

#: parameters below this many values are updated together (:func:`_for_each`)
_SMALL = 1 << 14


def _for_each(update, xs, gs, *state_lists, **hyper):
    """``update(x, g, *states, **hyper)`` for each parameter of the lists.

    The updates are elementwise, so the small parameters of one dtype are
    updated as one: their arrays laid end to end, one update, the new values
    copied back. A dozen NumPy calls for all of them instead of a dozen for
    each (a UNet's 36 parameters: 1.03 -> 0.56 ms), with the same values (a NaN
    made by an invalid operation may come out with the other sign bit)."""
    if any(len(arrays) != len(xs) for arrays in (gs, *state_lists)):
        raise ValueError(f"{update.__name__.removesuffix('_forward')}: the lists of parameters, gradients "
                         f"and states differ in length: {[len(arrays) for arrays in (xs, gs, *state_lists)]}")
    together = {}
    for arrays in zip(xs, gs, *state_lists):
        x, _, *states = arrays
        if x.size < _SMALL and all(a.flags.c_contiguous and a.dtype == x.dtype for a in (x, *states)):
            together.setdefault(x.dtype, []).append(arrays)
        else:
            update(*arrays, **hyper)
    for group in together.values():
        if len(group) == 1:
            update(*group[0], **hyper)
            continue
        x, g, *states = (np.concatenate([a.reshape(-1) for a in arrays]) for arrays in zip(*group))
        update(x, g, *states, **hyper)
        start = 0
        for arrays in group:        # the new parameter and states; the gradient stays as it was
            end = start + arrays[0].size
            for a, whole in zip(arrays[:1] + arrays[2:], (x, *states)):
                a.reshape(-1)[...] = whole[start:end]
            start = end


def descent_update_foreach(xs, gs, *, eta):
    """``descent_update_forward`` on each parameter of the lists, in turn."""
    _for_each(descent_update_forward, xs, gs, eta=eta)


def momentum_update_foreach(xs, gs, vs, *, eta, rho):
    """``momentum_update_forward`` on each parameter of the lists, in turn."""
    _for_each(momentum_update_forward, xs, gs, vs, eta=eta, rho=rho)


def nesterov_update_foreach(xs, gs, vs, *, eta, rho):
    """``nesterov_update_forward`` on each parameter of the lists, in turn."""
    _for_each(nesterov_update_forward, xs, gs, vs, eta=eta, rho=rho)


def adam_update_foreach(xs, gs, ms, vs, *, eta, beta1, beta2, epsilon, step):
    """``adam_update_forward`` on each parameter of the lists, in turn."""
    check_step(step)
    _for_each(adam_update_forward, xs, gs, ms, vs, eta=eta, beta1=beta1, beta2=beta2, epsilon=epsilon,
              step=step)


def adamw_update_foreach(xs, gs, ms, vs, *, eta, beta1, beta2, epsilon, lambd, step):
    """``adamw_update_forward`` on each parameter of the lists, in turn."""
    check_step(step)
    _for_each(adamw_update_forward, xs, gs, ms, vs, eta=eta, beta1=beta1, beta2=beta2, epsilon=epsilon,
              lambd=lambd, step=step)


def rmsprop_update_foreach(xs, gs, ss, *, eta, rho, epsilon):
    """``rmsprop_update_forward`` on each parameter of the lists, in turn."""
    _for_each(rmsprop_update_forward, xs, gs, ss, eta=eta, rho=rho, epsilon=epsilon)
