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

The list form ``<name>_foreach`` has ``foreach_cases(name, dtype)``: a
Case whose inputs are the lists ``(xs, gs, *states)`` of up to six
parameters of different shapes (scalars, size 1 and empty ones often among
them) and whose layouts are lists likewise; and ``foreach_oracle``, the
oracle applied to each parameter.
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


#: shapes for lists of parameters: the awkward small ones often
_LIST_SHAPES = st.one_of(st.sampled_from([(), (1,), (0,), (1, 1), (3, 0, 2), (17,)]), _shape())


@st.composite
def _arrays(draw, n_states, positive=(), shapes=_shape()):
    """``x, g`` and ``n_states`` states of one shape, with layouts; the state
    positions in ``positive`` are second moments, drawn in [0.05, 4]."""
    shape = draw(shapes)
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


#: per rule: its number of states, which of them are second moments, its hyperparameters
RULES = {
    "descent_update": (0, (), dict(eta=ETA)),
    "momentum_update": (1, (), dict(eta=ETA, rho=RHO)),
    "nesterov_update": (1, (), dict(eta=ETA, rho=RHO)),
    "adam_update": (2, (1,), dict(eta=ETA, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, step=STEP)),
    "adamw_update": (2, (1,), dict(eta=ETA, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, lambd=LAMBD,
                                   step=STEP)),
    "rmsprop_update": (1, (0,), dict(eta=ETA, rho=RHO, epsilon=EPSILON)),
}


def _strategy(name):
    n_states, positive, hyper = RULES[name]
    return st.builds(lambda a, h: Case(a[0], h, a[1]), _arrays(n_states, positive),
                     st.fixed_dictionaries(hyper))


def descent_update_strategy(dtype):
    return _strategy("descent_update")


def momentum_update_strategy(dtype):
    return _strategy("momentum_update")


def nesterov_update_strategy(dtype):
    return _strategy("nesterov_update")


def adam_update_strategy(dtype):
    return _strategy("adam_update")


def adamw_update_strategy(dtype):
    return _strategy("adamw_update")


def rmsprop_update_strategy(dtype):
    return _strategy("rmsprop_update")


def foreach_cases(name, dtype):
    """Cases of ``<name>_foreach``: ``inputs`` the lists ``(xs, gs, *states)``
    of 0 to 6 parameters, ``layouts`` their layouts as lists likewise, one set
    of hyperparameters."""
    n_states, positive, hyper = RULES[name]

    def case(parameters, attrs):
        inputs = tuple(list(role) for role in zip(*[arrays for arrays, _ in parameters]))
        layouts = tuple(list(role) for role in zip(*[layout for _, layout in parameters]))
        empty = tuple([] for _ in range(2 + n_states))
        return Case(inputs or empty, attrs, layouts or empty)
    return st.builds(case, st.lists(_arrays(n_states, positive, _LIST_SHAPES), max_size=6),
                     st.fixed_dictionaries(hyper))


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


def foreach_oracle(name, xs, gs, *states, **attrs):
    """The oracle of ``<name>_foreach``: per parameter, the tuple ``<name>_torch`` returns."""
    oracle = globals()[f"{name}_torch"]
    return [oracle(*tensors, **attrs) for tensors in zip(xs, gs, *states)]
