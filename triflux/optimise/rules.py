"""Optimisation rules (Optimisers.jl's): hyperparameters only, no state.

A rule says how one step changes a parameter ``p`` from its gradient ``g``
(the formulas are in ``triflux.optimise``'s docstring). Its step is one
registered in-place primitive (``<rule>_update`` in the ``optimise``
family), called in its list form ``<rule>_update_foreach`` for all the
parameters of a rule at once: one launch per device and dtype.
"""
from . import hyperparameters as checks
from .. import ops
from ..constructors import zeros_like
from ..dispatch import implementation
from ..primitives import REGISTRY

def _fmt(v):
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt(e) for e in v) + ")"
    return repr(v)


class Rule:
    """Base class of optimisation rules: hyperparameters only, no state.

    ``_fields`` lists the hyperparameters in Optimisers.jl's order (the
    positional order of the constructor and of the printed form)."""
    _fields = ()
    _primitive = None  # name of the in-place primitive doing a step (called in its list form)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(_fmt(getattr(self, f)) for f in self._fields)})"

    def __eq__(self, other):
        return type(self) is type(other) and self.hyperparameters() == other.hyperparameters()

    def __hash__(self):
        return hash((type(self).__name__, tuple(self.hyperparameters().items())))

    def hyperparameters(self):
        """``{name: value}`` in field order (plain Python numbers and tuples)."""
        return {f: getattr(self, f) for f in self._fields}

    def replace(self, **kw):
        """A copy with some hyperparameters changed (Optimisers.adjust on a rule)."""
        unknown = set(kw) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no hyperparameter(s) {sorted(unknown)}; "
                            f"it has {list(self._fields)}")
        hp = self.hyperparameters()
        hp.update(kw)
        return type(self)(**hp)

    # per-rule behaviour ------------------------------------------------------------------------
    # A rule defines ``step_all`` (all parameters at once: the rules here, one
    # launch per device and dtype) or ``step`` (one parameter: a wrapper such as
    # DistributedOptimizer); each default is written in terms of the other.
    def init(self, x):
        """The state for parameter ``x`` (arrays on its device, of its dtype)."""
        return None

    def step(self, x, g, st):
        """Update ``x`` in place from gradient ``g``; return the new state."""
        (st,) = self.step_all([x], [g], [st])
        return st

    def step_all(self, xs, gs, states):
        """Update every parameter of the list ``xs`` in place from its gradient
        in ``gs``; return the list of new states."""
        return [self.step(x, g, st) for x, g, st in zip(xs, gs, states)]

    def _call(self, xs, gs, state_lists, **attrs):
        """The rule's primitive, in its list form, on the parameters ``xs``
        (``state_lists``: per state, the list of its arrays)."""
        _update_each(self._primitive, xs, gs, state_lists, **attrs)


def _update_each(primitive, xs, gs, state_lists, **attrs):
    """``<primitive>_foreach`` on the parameters ``xs`` (Tensors), once per
    device they live on."""
    update = REGISTRY[primitive]
    first = xs[0]._device if xs else None
    if all(x._device is first for x in xs):       # the usual case: one device object, one call
        if xs:
            implementation(update, first, "foreach")(
                [x._data for x in xs], [g._data for g in gs], *[[a._data for a in arrays] for arrays in state_lists],
                **attrs)
        return
    by_device = {}
    for i, x in enumerate(xs):
        by_device.setdefault(x._device, []).append(i)
    for device, members in by_device.items():
        implementation(update, device, "foreach")(
            [xs[i]._data for i in members], [gs[i]._data for i in members],
            *[[arrays[i]._data for i in members] for arrays in state_lists], **attrs)


def _by_step(states):
    """``{t: indices}``: the parameters whose Adam state ``(m, v, t)`` takes step ``t`` next."""
    groups = {}
    for i, (_, _, t) in enumerate(states):
        groups.setdefault(int(t) + 1, []).append(i)
    return groups


class Descent(Rule):
    """Classic gradient descent, ``p -= η·g`` (``Descent(eta=0.1)``)."""
    _fields = ("eta",)
    _primitive = "descent_update"

    def __init__(self, eta=0.1):
        self.eta = checks.eta(eta, "Descent")

    def step_all(self, xs, gs, states):
        self._call(xs, gs, (), eta=self.eta)
        return states


class Momentum(Rule):
    """Gradient descent with momentum ρ: ``v = ρ·v + η·g;  p -= v``
    (``Momentum(eta=0.01, rho=0.9)``)."""
    _fields = ("eta", "rho")
    _primitive = "momentum_update"

    def __init__(self, eta=0.01, rho=0.9):
        self.eta, self.rho = checks.eta(eta, "Momentum"), checks.fraction(rho, "Momentum", "rho (the momentum)")

    def init(self, x):
        return zeros_like(x)

    def step_all(self, xs, gs, states):
        self._call(xs, gs, (states,), eta=self.eta, rho=self.rho)
        return states


class Nesterov(Rule):
    """Nesterov momentum: ``d = -ρ²·v + (1+ρ)·η·g;  v = ρ·v - η·g;  p -= d``
    (``Nesterov(eta=0.001, rho=0.9)``)."""
    _fields = ("eta", "rho")
    _primitive = "nesterov_update"

    def __init__(self, eta=0.001, rho=0.9):
        self.eta, self.rho = checks.eta(eta, "Nesterov"), checks.fraction(rho, "Nesterov", "rho (the momentum)")

    def init(self, x):
        return zeros_like(x)

    def step_all(self, xs, gs, states):
        self._call(xs, gs, (states,), eta=self.eta, rho=self.rho)
        return states


class RMSProp(Rule):
    """RMSProp: ``s = ρ·s + (1-ρ)·g²;  p -= η·g / (√s + ϵ)``
    (``RMSProp(eta=0.001, rho=0.9, epsilon=1e-8)``). The centred variant is
    not implemented."""
    _fields = ("eta", "rho", "epsilon")
    _primitive = "rmsprop_update"

    def __init__(self, eta=0.001, rho=0.9, epsilon=1e-8, *, centred=False, centered=False):
        if centred or centered:
            raise NotImplementedError("RMSProp(centred=True) is not implemented in triflux; "
                                      "use the plain RMSProp or Adam")
        self.eta, self.rho = checks.eta(eta, "RMSProp"), checks.fraction(rho, "RMSProp", "rho")
        self.epsilon = checks.epsilon(epsilon, "RMSProp")

    def __repr__(self):
        return f"RMSProp({self.eta!r}, {self.rho!r}, {self.epsilon!r}; centred = false)"

    def init(self, x):
        return zeros_like(x)

    def step_all(self, xs, gs, states):
        self._call(xs, gs, (states,), eta=self.eta, rho=self.rho, epsilon=self.epsilon)
        return states


class Adam(Rule):
    """Adam: ``m = β₁·m + (1-β₁)·g;  v = β₂·v + (1-β₂)·g²;
    p -= η · m/(1-β₁ᵗ) / (√(v/(1-β₂ᵗ)) + ϵ)``
    (``Adam(eta=0.001, beta=(0.9, 0.999), epsilon=1e-8)``). State: ``(m, v, t)``
    with ``t`` the number of steps taken."""
    _fields = ("eta", "beta", "epsilon")
    _primitive = "adam_update"

    def __init__(self, eta=0.001, beta=(0.9, 0.999), epsilon=1e-8):
        self.eta, self.beta = checks.eta(eta, "Adam"), checks.beta(beta, "Adam")
        self.epsilon = checks.epsilon(epsilon, "Adam")

    def init(self, x):
        return (zeros_like(x), zeros_like(x), 0)

    def step_all(self, xs, gs, states):
        for t, members in _by_step(states).items():
            self._call([xs[i] for i in members], [gs[i] for i in members],
                       ([states[i][0] for i in members], [states[i][1] for i in members]),
                       eta=self.eta, beta1=self.beta[0], beta2=self.beta[1], epsilon=self.epsilon, step=t)
        return [(m, v, int(t) + 1) for m, v, t in states]


class AdamW(Rule):
    """Adam with decoupled weight decay λ (Optimisers.jl ≥ 0.4, the form of
    PyTorch's AdamW): with ``s`` Adam's step at η = 1,
    ``p -= η·(s + λ·p)`` (``couple=True``, the default) or ``p -= η·s + λ·p``
    (``couple=False``). ``AdamW(eta=0.001, beta=(0.9, 0.999), lambd=0.0,
    epsilon=1e-8; couple=True)``; ``lambda_`` is accepted for ``lambd``."""
    _fields = ("eta", "beta", "lambd", "epsilon", "couple")
    _primitive = "adamw_update"

    def __init__(self, eta=0.001, beta=(0.9, 0.999), lambd=0.0, epsilon=1e-8, couple=True, *,
                 lambda_=None):
        if lambda_ is not None:
            lambd = lambda_
        self.eta, self.beta = checks.eta(eta, "AdamW"), checks.beta(beta, "AdamW")
        self.lambd = checks.decay(lambd, "AdamW", "lambd (the weight decay)")
        self.epsilon, self.couple = checks.epsilon(epsilon, "AdamW"), checks.flag(couple, "AdamW", "couple")

    def init(self, x):
        return (zeros_like(x), zeros_like(x), 0)

    def step_all(self, xs, gs, states):
        for t, members in _by_step(states).items():
            xs_t, gs_t = [xs[i] for i in members], [gs[i] for i in members]
            moments = ([states[i][0] for i in members], [states[i][1] for i in members])
            common = dict(beta1=self.beta[0], beta2=self.beta[1], epsilon=self.epsilon, step=t)
            if self.couple:
                self._call(xs_t, gs_t, moments, eta=self.eta, lambd=self.lambd, **common)
            elif self.eta > 0:
                # η·s + λ·p == η·(s + (λ/η)·p): the coupled kernel with λ' = λ/η
                self._call(xs_t, gs_t, moments, eta=self.eta, lambd=self.lambd / self.eta, **common)
            else:
                # η == 0: the moments still advance; the decay alone is p -= λ·p. The copies of p
                # are taken first, so nothing allocates once a parameter has moved: the Adam step
                # at η = 0 leaves p equal to itself (-0 may become +0) or NaN, and p - λ·p comes
                # out the same with either copy
                copies = [ops.contiguous(x) for x in xs_t] if self.lambd else None
                self._call(xs_t, gs_t, moments, eta=0.0, lambd=0.0, **common)
                if copies:
                    _update_each("descent_update", xs_t, copies, (), eta=self.lambd)
        return [(m, v, int(t) + 1) for m, v, t in states]


RULES = {r.__name__: r for r in (Descent, Momentum, Nesterov, RMSProp, Adam, AdamW)}
