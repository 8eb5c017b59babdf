"""Strategies and torch oracles for the optimiser updates.

A case is ``Case(inputs=(x, g, *states), attrs=hyperparameters)``; every
array has one shape. States are drawn where a real run could put them:
second moments (Adam's ``v``, RMSProp's ``s``) are positive (in [0.05, 4])
while first moments and velocities lie in [-1, 1], so ``m / (sqrt(v) + eps)``
stays moderate and float16 does not overflow. In about three draws in four
a few entries of ``x`` and of ``g`` are NaN, +inf and -inf (a diverged step):
the update must give torch's NaN and infinities, not clamp them away.

The oracles ``<name>_torch(*tensors, **attrs)`` return a tuple with the NEW
values of the mutated inputs (``mutates`` in the rule's declaration: ``x``
and then the states, in input order),
computed with plain torch arithmetic on whatever dtype they are given; the
inputs themselves are left untouched.
"""
import math

from hypothesis import strategies as st

from . import Case, floats, layouts_for, shapes
from .elementwise import nonfinite_draw, with_nonfinite

ETA = st.sampled_from([1e-3, 0.01, 0.1, 0.5])
RHO = st.sampled_from([0.0, 0.5, 0.9, 0.99])
BETA1 = st.sampled_from([0.0, 0.5, 0.9])
BETA2 = st.sampled_from([0.9, 0.99, 0.999])
EPSILON = st.sampled_from([1e-8, 1e-6, 1e-3])
LAMBD = st.sampled_from([0.0, 1e-4, 0.01, 0.1])
STEP = st.one_of(st.integers(1, 3), st.integers(1, 1000))


def _shape():
    """Shapes of at most 4096 elements."""
    return shapes(min_dims=0, max_dims=4, max_side=9).filter(lambda s: math.prod(s) <= 4096)


@st.composite
def _arrays(draw, n_states, positive=()):
    """``x, g`` and ``n_states`` states of one shape, with layouts; the state
    positions in ``positive`` are second moments, drawn in [0.05, 4]."""
    shape = draw(_shape())
    x = draw(floats(shape, extreme=True))
    g = draw(floats(shape, -2.0, 2.0, extreme=True))
    if nonfinite_draw(draw, out_of=4):
        x, g = with_nonfinite(draw, x), with_nonfinite(draw, g)
    states = []
    for k in range(n_states):
        if k in positive:
            states.append(draw(floats(shape, 0.05, 4.0)))
        else:
            states.append(draw(floats(shape, -1.0, 1.0)))
    return (x, g, *states), draw(layouts_for(2 + n_states))


def _case(arrays, **hyper):
    return st.builds(lambda a, h: Case(a[0], h, a[1]), arrays, st.fixed_dictionaries(hyper))


def descent_update_strategy(dtype):
    return _case(_arrays(0), eta=ETA)


def momentum_update_strategy(dtype):
    return _case(_arrays(1), eta=ETA, rho=RHO)


def nesterov_update_strategy(dtype):
    return _case(_arrays(1), eta=ETA, rho=RHO)


def adam_update_strategy(dtype):
    return _case(_arrays(2, positive=(1,)), eta=ETA, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, step=STEP)


def adamw_update_strategy(dtype):
    return _case(_arrays(2, positive=(1,)), eta=ETA, beta1=BETA1, beta2=BETA2, epsilon=EPSILON,
                 lambd=LAMBD, step=STEP)


def rmsprop_update_strategy(dtype):
    return _case(_arrays(1, positive=(0,)), eta=ETA, rho=RHO, epsilon=EPSILON)


# --- oracles: plain torch arithmetic, returning new values -------------------------------------

def descent_update_torch(x, g, *, eta):
    return (x - eta * g,)


def momentum_update_torch(x, g, v, *, eta, rho):
    v = rho * v + eta * g
    return (x - v, v)


def nesterov_update_torch(x, g, v, *, eta, rho):
    d = -rho ** 2 * v + (1 + rho) * eta * g
    v = rho * v - eta * g
    return (x - d, v)


def adam_update_torch(x, g, m, v, *, eta, beta1, beta2, epsilon, step):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    d = (m / (1 - beta1 ** step)) / ((v / (1 - beta2 ** step)).sqrt() + epsilon)
    return (x - eta * d, m, v)


def adamw_update_torch(x, g, m, v, *, eta, beta1, beta2, epsilon, lambd, step):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    d = (m / (1 - beta1 ** step)) / ((v / (1 - beta2 ** step)).sqrt() + epsilon)
    return (x - eta * (d + lambd * x), m, v)


def rmsprop_update_torch(x, g, s, *, eta, rho, epsilon):
    s = rho * s + (1 - rho) * g * g
    return (x - eta * g / (s.sqrt() + epsilon), s)
