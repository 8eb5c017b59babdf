"""Optimiser updates: one step of each rule of Optimisers.jl (v0.4,
``src/rules.jl``), applied in place.

Each ``<rule>_update_forward(x, g, *states, **hyper)`` overwrites the
parameter ``x`` and the rule's state arrays with their new values and returns
``None``. ``g`` is the gradient of the loss with respect to ``x``; every
array has ``x``'s shape and dtype. The formulas are elementwise; ``t`` is the
1-based step count, so the first update uses ``t = 1``.

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
import numpy as np


def _compute(a):
    """``a`` in the type arithmetic happens in: float64 stays, others float32."""
    return a.astype(np.float64 if a.dtype == np.float64 else np.float32)


def _store(dst, value):
    """Write ``value`` into ``dst`` in place, rounding to ``dst``'s dtype."""
    dst[...] = value.astype(dst.dtype)


def descent_update_forward(x, g, *, eta):
    """Plain gradient descent (Optimisers.jl ``Descent``)::

        x <- x - eta * g
    """
    xc, gc = _compute(x), _compute(g)
    eta = xc.dtype.type(eta)
    _store(x, xc - eta * gc)


def momentum_update_forward(x, g, v, *, eta, rho):
    """Gradient descent with momentum (Optimisers.jl ``Momentum``); ``v`` is
    the velocity, zero at the start::

        v <- rho * v + eta * g
        x <- x - v
    """
    xc, gc, vc = _compute(x), _compute(g), _compute(v)
    T = xc.dtype.type
    eta, rho = T(eta), T(rho)
    vc = rho * vc + eta * gc
    _store(v, vc)
    _store(x, xc - vc)


def nesterov_update_forward(x, g, v, *, eta, rho):
    """Nesterov momentum (Optimisers.jl ``Nesterov``); ``v`` is the velocity,
    zero at the start, kept with the opposite sign to ``Momentum``'s::

        d <- -rho^2 * v + (1 + rho) * eta * g     (uses the old v)
        v <- rho * v - eta * g
        x <- x - d
    """
    xc, gc, vc = _compute(x), _compute(g), _compute(v)
    T = xc.dtype.type
    eta, rho = T(eta), T(rho)
    d = -rho ** 2 * vc + (1 + rho) * eta * gc
    vc = rho * vc - eta * gc
    _store(v, vc)
    _store(x, xc - d)


def _adam_direction(gc, mc, vc, beta1, beta2, epsilon, step):
    """The shared Adam moments and step direction (learning rate 1)::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        d  = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
    """
    T = gc.dtype.type
    b1, b2, eps = T(beta1), T(beta2), T(epsilon)
    bc1, bc2 = T(1.0 - float(beta1) ** step), T(1.0 - float(beta2) ** step)
    mc = b1 * mc + (1 - b1) * gc
    vc = b2 * vc + (1 - b2) * gc * gc
    d = (mc / bc1) / (np.sqrt(vc / bc2) + eps)
    return mc, vc, d


def _check_step(step):
    if int(step) != step or step < 1:
        raise ValueError(f"step is the 1-based count of updates, got {step!r}")
    return int(step)


def adam_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, step):
    """Adam (Optimisers.jl ``Adam``); ``m``, ``v`` start at zero, ``t = step``::

        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g^2
        x <- x - eta * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)

    The same as ``torch.optim.Adam`` (whose epsilon is also added after the
    square root of the bias-corrected ``v``).
    """
    step = _check_step(step)
    xc, gc, mc, vc = _compute(x), _compute(g), _compute(m), _compute(v)
    mc, vc, d = _adam_direction(gc, mc, vc, beta1, beta2, epsilon, step)
    _store(m, mc)
    _store(v, vc)
    _store(x, xc - xc.dtype.type(eta) * d)


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
    step = _check_step(step)
    xc, gc, mc, vc = _compute(x), _compute(g), _compute(m), _compute(v)
    T = xc.dtype.type
    mc, vc, d = _adam_direction(gc, mc, vc, beta1, beta2, epsilon, step)
    _store(m, mc)
    _store(v, vc)
    _store(x, xc - T(eta) * (d + T(lambd) * xc))


def rmsprop_update_forward(x, g, s, *, eta, rho, epsilon):
    """RMSProp (Optimisers.jl ``RMSProp``, not centred); ``s`` is the running
    mean of squared gradients, zero at the start::

        s <- rho * s + (1 - rho) * g^2
        x <- x - eta * g / (sqrt(s) + epsilon)

    The same as ``torch.optim.RMSprop`` with ``alpha = rho``.
    """
    xc, gc, sc = _compute(x), _compute(g), _compute(s)
    T = xc.dtype.type
    eta, rho, eps = T(eta), T(rho), T(epsilon)
    sc = rho * sc + (1 - rho) * gc * gc
    _store(s, sc)
    _store(x, xc - eta * gc / (np.sqrt(sc) + eps))
