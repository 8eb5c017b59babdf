"""Optimisers (Optimisers.jl's rules and its ``setup`` / ``update`` /
``adjust``) and Flux's ``train``.

::

    opt_state = setup(Adam(1e-3), model)      # state tree mirroring the model
    loss, (g,) = withgradient(lambda m: mse(m(x), y), model)
    update(opt_state, model, g)               # parameters change in place
    train(lambda m, x, y: mse(m(x), y), model, loader, opt_state)   # one epoch

Each rule's step is one registered in-place primitive (``<rule>_update``
in the ``optimise`` family), called in its list form ``<rule>_update_foreach``
for all the parameters of a rule at once: the NumPy reference on the CPU
(a loop over the parameters), on a GPU one fused kernel launch per dtype for
all of them, as torch's foreach/fused optimisers. The formulas are
Optimisers.jl's (``p`` a parameter, ``g`` its gradient, ``t`` the step):

=============  =========================================================================
Descent        p -= η·g
Momentum       v = ρ·v + η·g;  p -= v
Nesterov       d = -ρ²·v + (1+ρ)·η·g;  v = ρ·v - η·g;  p -= d
RMSProp        s = ρ·s + (1-ρ)·g²;  p -= η·g / (√s + ϵ)
Adam           m = β₁·m + (1-β₁)·g;  v = β₂·v + (1-β₂)·g²;
               p -= η · m/(1-β₁ᵗ) / (√(v/(1-β₂ᵗ)) + ϵ)
AdamW          Adam's step with η = 1, then p -= η·(step + λ·p)   (couple=True,
               PyTorch's AdamW);  p -= η·step + λ·p   (couple=False)
=============  =========================================================================

The optimiser state tree has the model's shape (API.md "Structure"): a dict
keyed by child name for a layer, a list for lists (``Chain``'s ``layers``),
a :class:`Leaf` at each trainable array and ``None`` elsewhere. Leaves are
dicts, so ``gpu(opt_state)`` / ``cpu(opt_state)`` move optimiser state
like any other structure, and ``state`` / ``loadmodel`` save and restore it.
"""
import contextlib
import math
import warnings
from functools import partial

import numpy as np

from . import dtypes as _dt
from . import ops
from .autodiff import LEFT_THE_TAPE, differentiate
from .capture import CapturedStep, eager_phase
from .constructors import zeros_like
from .devices import move_code
from .dispatch import implementation
from .errors import ArgumentError, DeviceMismatchError, GradientError, NonFiniteError, StructureError
from .functor import children, holds_arrays, is_layer, leaves, path_join
from .modes import all_or_nothing
from .primitives import REGISTRY
from .tensor import Tensor, as_tensor

__all__ = ["Descent", "Momentum", "Nesterov", "Adam", "AdamW", "RMSProp", "Leaf", "Rule",
           "MixedPrecision", "MixedPrecisionState", "setup", "update", "adjust", "train", "trainables", "RULES",
           "capture_step", "train_step", "prepare_update", "apply_update"]


# --- rules ------------------------------------------------------------------------------------

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


# --- hyperparameter checks: every rule's constructor (and so ``replace``, ``adjust`` and loading a
# saved rule) takes its values through these, so no rule exists that would turn parameters into NaN

def _real(value, rule, field):
    """``value`` as a float, or an ArgumentError naming the rule and the field."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ArgumentError(f"{rule}: {field} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{rule}: {field} must be a real number, got {value!r}") from None


def _in_range(value, rule, field, ok, valid):
    v = _real(value, rule, field)
    if not ok(v):
        raise ArgumentError(f"{rule}: {field} must be {valid}, got {v!r}")
    return v


def _non_negative(v):
    return 0 <= v < math.inf


def _positive(v):
    return 0 < v < math.inf


def _eta(v, rule):
    return _in_range(v, rule, "eta (the learning rate)", _non_negative, "finite and >= 0")


def _decay(v, rule, field):
    return _in_range(v, rule, field, _non_negative, "finite and >= 0")


def _epsilon(v, rule):
    return _in_range(v, rule, "epsilon", _positive, "finite and > 0")


def _fraction(v, rule, field):
    """A decay rate of a running average: in [0, 1) (at 1 the average never moves)."""
    return _in_range(v, rule, field, lambda v: 0 <= v < 1, "in [0, 1)")


def _beta(beta, rule):
    pair = "a pair (β1, β2) of numbers in [0, 1), e.g. (0.9, 0.999)"
    try:
        beta = tuple(beta)
    except TypeError:
        raise ArgumentError(f"{rule}: beta must be {pair}, got {beta!r}") from None
    if len(beta) != 2:
        raise ArgumentError(f"{rule}: beta must be {pair}, got {beta!r}")
    return tuple(_fraction(b, rule, f"beta[{i}] (β{i + 1})") for i, b in enumerate(beta))


def _flag(v, rule, field):
    if v not in (True, False):
        raise ArgumentError(f"{rule}: {field} must be True or False, got {v!r}")
    return bool(v)


class Descent(Rule):
    """Classic gradient descent, ``p -= η·g`` (``Descent(eta=0.1)``)."""
    _fields = ("eta",)
    _primitive = "descent_update"

    def __init__(self, eta=0.1):
        self.eta = _eta(eta, "Descent")

    def step_all(self, xs, gs, states):
        self._call(xs, gs, (), eta=self.eta)
        return states


class Momentum(Rule):
    """Gradient descent with momentum ρ: ``v = ρ·v + η·g;  p -= v``
    (``Momentum(eta=0.01, rho=0.9)``)."""
    _fields = ("eta", "rho")
    _primitive = "momentum_update"

    def __init__(self, eta=0.01, rho=0.9):
        self.eta, self.rho = _eta(eta, "Momentum"), _fraction(rho, "Momentum", "rho (the momentum)")

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
        self.eta, self.rho = _eta(eta, "Nesterov"), _fraction(rho, "Nesterov", "rho (the momentum)")

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
        self.eta, self.rho = _eta(eta, "RMSProp"), _fraction(rho, "RMSProp", "rho")
        self.epsilon = _epsilon(epsilon, "RMSProp")

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
        self.eta, self.beta, self.epsilon = _eta(eta, "Adam"), _beta(beta, "Adam"), _epsilon(epsilon, "Adam")

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
        self.eta, self.beta = _eta(eta, "AdamW"), _beta(beta, "AdamW")
        self.lambd = _decay(lambd, "AdamW", "lambd (the weight decay)")
        self.epsilon, self.couple = _epsilon(epsilon, "AdamW"), _flag(couple, "AdamW", "couple")

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


def rule_from_dict(d):
    """The rule saved by ``rule_to_dict`` (``{"Adam": {"eta": ..., ...}}``)."""
    if not isinstance(d, dict) or len(d) != 1:
        raise StructureError(f"not a saved optimisation rule: {d!r}")
    (name, hp), = d.items()
    if name == "MixedPrecision":
        return MixedPrecision._from_dict(hp)
    cls = RULES.get(name)
    if cls is None:
        raise StructureError(f"unknown optimisation rule {name!r}; known: {sorted(RULES)}")
    hp = _saved_hyperparameters(cls, hp)
    for k, v in list(hp.items()):
        if isinstance(v, np.ndarray):   # a file's arrays: beta as a pair, the rest as numbers
            hp[k] = tuple(v.reshape(-1).tolist()) if k == "beta" else v.item() if v.size == 1 else v
    return cls(**hp)   # the constructor checks every value


def _saved_hyperparameters(cls, hp):
    """A copy of the saved hyperparameters ``hp`` of a ``cls`` rule, checked to be ones it has."""
    name = cls.__name__
    if not isinstance(hp, dict):
        raise StructureError(f"not a saved {name} rule: its hyperparameters are {hp!r}, not a dict")
    unknown = set(hp) - set(cls._fields)
    if unknown:
        raise StructureError(f"a saved {name} rule with unknown hyperparameter(s) {sorted(map(str, unknown))}; "
                             f"{name} has {list(cls._fields)}")
    return dict(hp)


def rule_to_dict(rule):
    """``{"Adam": {"eta": 0.001, "beta": [0.9, 0.999], "epsilon": 1e-08}}``: the
    rule as plain data (names as keys, so a file format needs no strings). A
    wrapper that holds live resources (``DistributedOptimizer``'s backend)
    saves as the rule it wraps."""
    rule = rule._saved_rule() if hasattr(rule, "_saved_rule") else rule
    if isinstance(rule, MixedPrecision):
        return rule._to_dict()
    hp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in rule.hyperparameters().items()}
    return {type(rule).__name__: hp}


# --- mixed precision ------------------------------------------------------------------------------

_LOW = ("float16", "bfloat16")


class MixedPrecision(Rule):
    """Train a float16 / bfloat16 model with float32 master weights
    (``MixedPrecision(rule, dtype=None, loss_scale=None, *, init_scale=2**16,
    growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)``)::

        opt = setup(MixedPrecision(Adam(1e-3), float16), model)  # model's floats -> float16
        train(loss, model, data, opt)             # scales the loss by itself
        # or by hand: the loss goes through opt.scale
        (g,) = gradient(lambda m: opt.scale(loss(m, x, y)), model)
        update(opt, model, g)

    ``setup`` keeps a float32 copy (the *master*) of every trainable
    parameter in the optimiser state (a float64 parameter keeps a float64
    master) next to ``rule``'s state for it; with ``dtype`` given it first
    converts every floating Tensor of the model, in place, to ``dtype`` (the
    masters keep the original values). ``dtype=None`` takes the model as it
    is (e.g. already ``f16(model)``).

    ``update`` casts each low-precision gradient to float32, divides it by the
    loss scale and checks all of them for Inf/NaN: if any is non-finite the
    step is skipped (parameters, moments and step counts unchanged) and, with
    dynamic scaling, the scale is multiplied by ``backoff_factor``;
    otherwise ``rule`` updates the masters and the model receives them rounded
    to its dtype, and after ``growth_interval`` good steps in a row the scale
    is multiplied by ``growth_factor`` (torch.amp.GradScaler's policy).

    ``loss_scale``: ``"dynamic"``, a fixed positive number, or ``None`` (the
    default: dynamic for float16, none (1.0) for bfloat16 and wider types,
    whose range needs no scaling). The scaled loss must be differentiated:
    ``train`` does it; by hand, pass the loss through ``opt.scale(loss)`` —
    ``update`` refuses gradients when ``scale`` was not called since the last
    step, so an unscaled loss cannot silently shrink every step. A float16
    loss cannot hold the cotangent 2**16 (float16's largest value is 65504):
    with the default initial scale the first step then overflows and is
    skipped, and the scale settles at 2**15; compute the loss in float32
    (``mse(f32(m(x)), y)``) or pass ``init_scale=2**15`` to avoid that."""
    _fields = ("rule", "dtype", "loss_scale", "init_scale", "growth_factor", "backoff_factor",
               "growth_interval")

    def __init__(self, rule=None, dtype=None, loss_scale=None, *, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000):
        if rule is None:
            rule = Adam()
        if isinstance(rule, type) and issubclass(rule, Rule):
            rule = rule()
        if not isinstance(rule, Rule) or isinstance(rule, MixedPrecision):
            raise TypeError(f"MixedPrecision(rule, ...): {rule!r} is not a plain optimisation rule "
                            f"(use one of {', '.join(RULES)}, e.g. `MixedPrecision(Adam(1e-3), float16)`)")
        if dtype is not None:
            dtype = _dt.as_dtype(dtype)
            if dtype.name not in _LOW + ("float32",):
                raise TypeError(f"MixedPrecision: dtype must be float16 or bfloat16 (or float32, or None to keep "
                                f"the model's), got {dtype}")
        if loss_scale is not None and loss_scale != "dynamic":
            if isinstance(loss_scale, str):
                raise ArgumentError(f"MixedPrecision: loss_scale must be 'dynamic', a positive number or None, "
                                    f"got {loss_scale!r}")
            loss_scale = _in_range(loss_scale, "MixedPrecision", "loss_scale", _positive, "finite and > 0")
        self.rule, self.dtype, self.loss_scale = rule, dtype, loss_scale
        self.init_scale = _in_range(init_scale, "MixedPrecision", "init_scale", _positive, "finite and > 0")
        self.growth_factor = _in_range(growth_factor, "MixedPrecision", "growth_factor",
                                       lambda v: 1 <= v < math.inf, "finite and >= 1")
        self.backoff_factor = _in_range(backoff_factor, "MixedPrecision", "backoff_factor", lambda v: 0 < v <= 1,
                                        "in (0, 1]")
        interval = _in_range(growth_interval, "MixedPrecision", "growth_interval",
                             lambda v: v >= 1 and v.is_integer(), "a whole number >= 1")
        self.growth_interval = int(interval)

    def __repr__(self):
        d = "nothing" if self.dtype is None else self.dtype.name
        return (f"MixedPrecision({self.rule!r}, {d}, {self.loss_scale!r}; init_scale={self.init_scale!r}, "
                f"growth_factor={self.growth_factor!r}, backoff_factor={self.backoff_factor!r}, "
                f"growth_interval={self.growth_interval!r})")

    def _to_dict(self):
        hp = self.hyperparameters()
        hp["rule"] = rule_to_dict(self.rule)
        hp["dtype"] = None if self.dtype is None else self.dtype.name
        return {"MixedPrecision": hp}

    @classmethod
    def _from_dict(cls, hp):
        hp = _saved_hyperparameters(cls, hp)
        hp = {k: (v.item() if isinstance(v, np.ndarray) and v.size == 1 else v) for k, v in hp.items()}
        if "rule" not in hp:
            raise StructureError(f"a saved MixedPrecision rule without its inner rule: {hp!r}")
        hp["rule"] = rule_from_dict(hp["rule"])
        return cls(**hp)

    @staticmethod
    def master_dtype(x):
        return _dt.float64 if x.dtype == _dt.float64 else _dt.float32

    def init(self, x):
        master = _copy_as(x, self.master_dtype(x))
        return (master, self.rule.init(master))

    def step_all(self, xs, gs, states):
        """One step for the parameters ``xs``, the gradients ``gs`` already
        unscaled and of the masters' dtype (``update`` does that for all of
        them first): the rule steps the masters, the model gets them rounded
        to its dtype."""
        masters = [master for master, _ in states]
        inner = self.rule.step_all(masters, gs, [inner for _, inner in states])
        rounded = [_copy_as(master, x.dtype) for x, master in zip(xs, masters)]   # every copy, then the model
        for x, r in zip(xs, rounded):
            x._data = r._data
        return list(zip(masters, inner))


def _copy_as(x, dtype):
    """A new Tensor holding ``x``'s values as ``dtype`` (never ``x``'s storage)."""
    if x.dtype != dtype:
        return ops.cast(x, dtype)
    return ops.mul(x, 1.0)  # exact: a fresh copy


class MixedPrecisionState(dict):
    """What ``setup(MixedPrecision(rule), model)`` returns: ``opt["tree"]`` is
    the usual state tree (a :class:`Leaf` per parameter holding
    ``(master, rule's state)``), ``opt["scaler"]`` the loss scaling
    (``{"scale": 65536.0, "growth_tracker": 0, "dynamic": True}``). Pass it
    to ``update`` / ``train`` / ``adjust`` / ``state`` / ``loadmodel`` / ``save``
    like any optimiser state; ``opt.scale(loss)`` is the loss to
    differentiate."""
    __hash__ = object.__hash__

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if set(self) != {"tree", "scaler"}:
            raise StructureError(f"a MixedPrecisionState holds exactly `tree` and `scaler`, got keys {sorted(self)}")
        self._scaled = False
        self.last_step_skipped = False

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    @property
    def loss_scale(self):
        """The current loss scale (1.0 without scaling)."""
        return float(self["scaler"]["scale"])

    def scale(self, loss):
        """``loss`` multiplied by the loss scale (in float32, so the scaled
        value itself cannot overflow float16): differentiate this. Also tells
        ``update`` that the gradients it gets next are scaled."""
        self._scaled = True
        s = self.loss_scale
        if s == 1.0:
            return loss
        loss = as_tensor(loss)
        if loss.dtype != _dt.float64:
            loss = ops.cast(loss, _dt.float32)
        return ops.mul(loss, s)

    def __repr__(self):
        sc = self["scaler"]
        return (f"MixedPrecisionState(scale={sc['scale']!r}, dynamic={sc['dynamic']!r}, "
                f"growth_tracker={sc['growth_tracker']!r}, tree={self['tree']!r})")


def _setup_mixed(rule, model, walk):
    tree = walk(model)
    params = [t for t in leaves(model) if isinstance(t, Tensor) and _dt.is_floating(t.dtype)]
    if rule.dtype is not None:
        for t in params:  # in place: the Tensors keep their identity (masters were taken above)
            if t.dtype != rule.dtype:
                t._data = ops.cast(t, rule.dtype)._data
    low = rule.dtype if rule.dtype is not None else next(
        (t.dtype for t in params if t.dtype.name in _LOW), params[0].dtype if params else _dt.float32)
    dynamic = rule.loss_scale == "dynamic" or (rule.loss_scale is None and low.name == "float16")
    scale = rule.init_scale if dynamic else (1.0 if rule.loss_scale is None else rule.loss_scale)
    return MixedPrecisionState(tree=tree, scaler={"scale": float(scale), "growth_tracker": 0, "dynamic": dynamic})


def _update_mixed(opt_state, model, grad):
    sc = opt_state["scaler"]
    scale = float(sc["scale"])
    if scale != 1.0 and not opt_state._scaled:
        raise GradientError(
            f"update: this MixedPrecision optimiser state scales the loss by {scale:g}, but `opt_state.scale(loss)` "
            "was not called since the last update, so these gradients are probably of the unscaled loss. "
            "Differentiate the scaled loss, e.g. `gradient(lambda m: opt_state.scale(loss(m, x, y)), model)`, "
            "or let `train(loss, model, data, opt_state)` do it.")
    plan = _collect(opt_state["tree"], model, grad)
    rules = {id(leaf.rule): leaf.rule for leaf, _, _ in plan}
    for leaf, _, _ in plan:
        if not isinstance(leaf.rule, MixedPrecision):
            raise StructureError(f"update: a MixedPrecisionState holds a Leaf with rule {leaf.rule!r}; its leaves "
                                 "must come from `setup(MixedPrecision(rule), model)`")
    inv = 1.0 / scale
    grads, checks = [], {}
    for leaf, x, g in plan:
        g = ops.cast(g, leaf.state[0].dtype) if g.dtype != leaf.state[0].dtype else g
        if inv != 1.0:
            g = ops.mul(g, inv)       # exact for a power-of-two scale
        grads.append(g)
        z = ops.sum(ops.mul(g, 0.0))  # 0, or NaN if any element is Inf or NaN
        key = g._device
        checks[key] = z if key not in checks else ops.add(checks[key], z)
    finite = all(math.isfinite(float(z.item())) for z in checks.values())
    some = next(iter(rules.values()), None)
    if finite:
        _step_together([(leaf, x, g) for (leaf, x, _), g in zip(plan, grads)])
    opt_state._scaled = False
    opt_state.last_step_skipped = not finite
    if not finite:
        if sc["dynamic"] and some is not None:
            sc["scale"] = scale * some.backoff_factor
            sc["growth_tracker"] = 0
        return opt_state, model
    if sc["dynamic"] and some is not None:
        sc["growth_tracker"] = int(sc["growth_tracker"]) + 1
        if sc["growth_tracker"] >= some.growth_interval:
            sc["scale"] = scale * some.growth_factor
            sc["growth_tracker"] = 0
    return opt_state, model


# --- the state tree ---------------------------------------------------------------------------

class Leaf(dict):
    """The optimiser state of one trainable array: ``leaf.rule`` and
    ``leaf.state`` (Optimisers.jl's ``Leaf``). A dict underneath
    (``{"rule": ..., "state": ...}``) so that ``fmap``, ``gpu``, ``cpu`` and
    ``get_device`` see the state arrays inside it."""
    __hash__ = object.__hash__

    def __init__(self, rule=None, state=None, **kw):
        if isinstance(rule, Rule) or rule is None and not kw:
            super().__init__(rule=rule, state=state)
        else:  # dict-style construction, as fmap rebuilds it: Leaf(pairs)
            super().__init__(rule, **kw)
        if set(self) != {"rule", "state"}:
            raise StructureError(f"a Leaf holds exactly `rule` and `state`, got keys {sorted(self)}")

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    @property
    def rule(self):
        return self["rule"]

    @rule.setter
    def rule(self, r):
        self["rule"] = r

    @property
    def state(self):
        return self["state"]

    @state.setter
    def state(self, s):
        self["state"] = s

    def __repr__(self):
        return f"Leaf({self.rule!r}, {_state_repr(self.state)})"


def _state_repr(s):
    if isinstance(s, Tensor):
        dims = "×".join(map(str, s.shape)) if s.ndim else "0-d"
        return f"{dims} Tensor{{{s.dtype}}}"
    if isinstance(s, tuple):
        return "(" + ", ".join(_state_repr(e) for e in s) + ")"
    return repr(s)


def _show(path):
    return path or "(the model itself)"


def _trainable(x):
    return isinstance(x, Tensor) and _dt.is_floating(x.dtype)


def _mirror_trainables(x, at):
    """``x``'s structure with ``at(t)`` at every trainable Tensor ``t`` and
    None at everything else (a layer's ``_nontrainable`` children, integer
    buffers, functions); a dict for a layer, a list for a list or tuple."""
    if isinstance(x, Tensor):
        return at(x) if _trainable(x) else None
    if is_layer(x):
        skip = type(x)._nontrainable
        return {name: (None if name in skip else _mirror_trainables(v, at)) for name, v in children(x).items()}
    if isinstance(x, (list, tuple)):
        return [_mirror_trainables(v, at) for v in x]
    if isinstance(x, dict):
        return {k: _mirror_trainables(v, at) for k, v in x.items()}
    return None


def trainables(model):
    """The trainable parameters of ``model`` (Flux's and Optimisers.jl's
    ``trainables``): a list of its floating-point Tensors, depth first in
    definition order, each once (a tied parameter once), without the state a
    layer does not train (its ``_nontrainable`` children: BatchNorm's running
    statistics). These are the Tensors ``setup`` gives optimiser state::

        n = sum(p.size for p in trainables(model))   # the number of parameters"""
    found = {}
    _mirror_trainables(model, lambda t: found.setdefault(id(t), t))
    return list(found.values())


def setup(rule, model):
    """The optimiser state tree for training ``model`` with ``rule``
    (Optimisers.setup): the model's shape, a :class:`Leaf` at every trainable
    (floating) Tensor, holding the rule's state allocated on that Tensor's
    device with its dtype; ``None`` at non-trainable children (a layer's
    ``_nontrainable``, integer buffers, functions). A Tensor used twice
    (tied weights) gets one shared Leaf."""
    if isinstance(rule, type) and issubclass(rule, Rule):
        rule = rule()
    if not isinstance(rule, Rule):
        raise TypeError(f"setup(rule, model): {rule!r} is not an optimisation rule "
                        f"(use one of {', '.join(RULES)}, e.g. `setup(Adam(1e-3), model)`)")
    memo = {}

    def leaf(x):
        found = memo.get(id(x))
        if found is None:
            found = memo[id(x)] = Leaf(rule, rule.init(x))
        return found

    def walk(x):
        return _mirror_trainables(x, leaf)

    if isinstance(rule, MixedPrecision):
        return _setup_mixed(rule, model, walk)
    return walk(model)


def _mismatch(what, path, *pairs):
    return StructureError(f"update: {what} at `{_show(path)}`: " + "; ".join(pairs))


def update(opt_state, model, grad):
    """Apply one optimisation step (Optimisers.update!): every parameter of
    ``model`` with a gradient in ``grad`` changes in place, as does its state
    in ``opt_state``. ``grad`` mirrors the model (what ``gradient`` returns
    for it); ``None`` anywhere means "no gradient, skip". Returns
    ``(opt_state, model)``.

    Everything is checked, and every gradient converted, before anything
    changes, so an update that raises leaves the model and ``opt_state`` as
    they were: a gradient on another device than its parameter raises
    ``DeviceMismatchError``, a gradient of another shape or a tree that does
    not fit the model ``StructureError``, each naming the field
    (``layers[1].weight``). The step itself is one launch per rule, device
    and dtype (for a model of one dtype on one device, a single one).

    A NaN or Inf in a gradient is applied, as Optimisers.jl does (the
    parameter becomes NaN): ``train`` stops on a non-finite loss before it
    updates, and a ``MixedPrecision`` state unscales the gradients into
    float32 and skips the whole step when any of them is Inf or NaN (see
    :class:`MixedPrecision`)."""
    if isinstance(opt_state, Rule):
        raise TypeError("update(opt_state, model, grad) needs the state tree from `setup(rule, model)`, "
                        f"not the rule {opt_state!r}")
    if isinstance(opt_state, MixedPrecisionState):
        return _update_mixed(opt_state, model, grad)
    apply_update(prepare_update(opt_state, model, grad))
    return opt_state, model


def prepare_update(opt_state, model, grad):
    """Everything ``update`` does before a parameter moves: the checks, and
    each gradient converted to its parameter's dtype (which allocates, so
    running out of memory here changes nothing). The list of ``(leaf,
    parameter, gradient)`` that :func:`apply_update` steps."""
    plan = _collect(opt_state, model, grad)
    if any(isinstance(leaf.rule, MixedPrecision) for leaf, _, _ in plan):
        raise StructureError("update: this optimiser state tree holds MixedPrecision leaves; pass the whole "
                             "state `setup(MixedPrecision(rule), model)` returned (it holds the loss scale)")
    return [(leaf, x, _fit_gradient(x, g)) for leaf, x, g in plan]


def apply_update(plan):
    """Step every ``(leaf, parameter, gradient)`` of ``plan`` (from
    :func:`prepare_update`) with its leaf's rule as it is now."""
    _step_together(plan)


def _step_together(plan):
    """Step every ``(leaf, parameter, gradient)`` of ``plan``: one
    ``step_all`` per rule, which launches once per device and dtype for all
    its parameters (and allocates its small table of them before it does)."""
    by_object = {}     # grouped by identity first: a rule's hash builds its hyperparameters
    for entry in plan:
        by_object.setdefault(id(entry[0].rule), []).append(entry)
    by_rule = {}
    for entries in by_object.values():
        by_rule.setdefault(entries[0][0].rule, []).extend(entries)
    for rule, entries in by_rule.items():
        states = rule.step_all([x for _, x, _ in entries], [g for _, _, g in entries],
                               [leaf.state for leaf, _, _ in entries])
        for (leaf, _, _), st in zip(entries, states):
            leaf.state = st


def _collect(opt_state, model, grad):
    """Check ``grad`` and ``opt_state`` against ``model``; the list of
    ``(leaf, parameter, gradient)`` to step (each parameter once)."""
    plan = []
    _plan(opt_state, model, grad, "", plan, set())
    return plan


def _plan(st, x, g, path, plan, done):
    """:func:`_collect` at ``path``: append to ``plan`` the ``(leaf, parameter,
    gradient)`` of each trainable parameter under ``x`` whose id is not in
    ``done``. (A module-level function: a nested one that calls itself is a
    reference cycle, and would keep the step's gradients alive until the
    garbage collector runs.)"""
    if g is None:
        return
    if isinstance(x, Tensor):
        if not _trainable(x):
            return
        if not isinstance(st, Leaf):
            raise StructureError(
                f"update: the optimiser state has no Leaf for the parameter `{_show(path)}` "
                f"(found {type(st).__name__}); was it set up for this model? Call `setup(rule, model)`.")
        if not isinstance(g, Tensor):
            if isinstance(g, np.ndarray):
                g = Tensor._from_numpy(g)
            else:
                raise StructureError(f"update: the gradient for `{_show(path)}` is a "
                                     f"{type(g).__name__}, expected a Tensor of shape {x.shape}")
        if g._device != x._device:
            raise DeviceMismatchError(
                f"update: the gradient for `{_show(path)}` is on {g._device!r} but the parameter is on "
                f"{x._device!r}. Compute the gradient with the model and data on one device "
                f"(`{move_code(x._device)}`).")
        if g.shape != x.shape:
            raise StructureError(
                f"update: the gradient for `{_show(path)}` has shape {g.shape} but the parameter "
                f"has shape {x.shape}")
        for a in _state_tensors(st.state):
            if a._device != x._device:
                raise DeviceMismatchError(
                    f"update: the optimiser state for `{_show(path)}` is on {a._device!r} but the "
                    f"parameter is on {x._device!r} (the model was moved after `setup`). Move the "
                    f"state too (`{move_code(x._device, 'opt_state')}`) or call "
                    "`setup(rule, model)` again.")
            if a.shape != x.shape:
                raise StructureError(
                    f"update: the optimiser state for `{_show(path)}` has shape {a.shape} but the "
                    f"parameter has shape {x.shape}; call `setup(rule, model)` for this model")
        if id(x) in done:  # a tied parameter: its gradient is already the total
            return
        done.add(id(x))
        plan.append((st, x, g))
        return
    if is_layer(x):
        kids = children(x)
        if not isinstance(g, dict):
            raise StructureError(f"update: the gradient for `{_show(path)}` ({type(x).__name__}) should be a "
                                 f"dict keyed by field name, got {type(g).__name__}")
        extra = set(g) - set(kids)
        if extra:
            raise StructureError(f"update: the gradient has field(s) {sorted(extra)} at `{_show(path)}`, "
                                 f"which the {type(x).__name__} lacks (fields: {list(kids)})")
        if not isinstance(st, dict) or isinstance(st, Leaf):
            raise StructureError(f"update: the optimiser state at `{_show(path)}` does not fit the "
                                 f"{type(x).__name__}; call `setup(rule, model)` for this model")
        skip = type(x)._nontrainable
        for name, v in kids.items():
            if name in skip:
                continue
            _plan(st.get(name), v, g.get(name), path_join(path, name), plan, done)
        return
    if isinstance(x, (list, tuple)):
        if not isinstance(g, (list, tuple)) or len(g) != len(x):
            raise _mismatch("the gradient does not fit", path,
                            f"the model has a {type(x).__name__} of {len(x)}",
                            f"the gradient is {_describe(g)}")
        if not isinstance(st, (list, tuple)) or len(st) != len(x):
            raise _mismatch("the optimiser state does not fit", path,
                            f"the model has a {type(x).__name__} of {len(x)}",
                            f"the state is {_describe(st)}; call `setup(rule, model)` for this model")
        for i, (s, v, gi) in enumerate(zip(st, x, g)):
            _plan(s, v, gi, path_join(path, i), plan, done)
        return
    if isinstance(x, dict):
        if not isinstance(g, dict):
            raise _mismatch("the gradient does not fit", path, "the model has a dict",
                            f"the gradient is {_describe(g)}")
        extra = set(g) - set(x)
        if extra:
            raise StructureError(f"update: the gradient has key(s) {sorted(map(repr, extra))} at "
                                 f"`{_show(path)}`, which the model lacks")
        if not isinstance(st, dict) or isinstance(st, Leaf):
            raise _mismatch("the optimiser state does not fit", path, "the model has a dict",
                            f"the state is {_describe(st)}")
        for k, v in x.items():
            _plan(st.get(k), v, g.get(k), path_join(path, k), plan, done)
        return
    # functions, numbers, NumPy arrays: nothing to train


def _describe(v):
    if isinstance(v, (list, tuple)):
        return f"a {type(v).__name__} of {len(v)}"
    return "None" if v is None else f"a {type(v).__name__}"


def _state_tensors(s):
    if isinstance(s, Tensor):
        return [s]
    if isinstance(s, (tuple, list)):
        return [a for e in s for a in _state_tensors(e)]
    return []


def _fit_gradient(x, g):
    """The gradient as the update kernels take it: ``x``'s dtype (any layout:
    the kernels honour strides)."""
    if g.dtype != x.dtype:
        g = ops.cast(g, x.dtype)
    return g


def adjust(opt_state, eta=None, **hyperparameters):
    """Change hyperparameters of every rule in ``opt_state`` in place
    (Optimisers.adjust!): ``adjust(opt_state, 1e-4)`` sets the learning rate,
    ``adjust(opt_state, rho=0.95)`` another field (rules lacking it keep
    theirs; a name no rule has raises). Every value is checked as the rule's
    constructor checks it, and an invalid one (``adjust(opt_state,
    beta=(2, 2))``) raises before any rule changes. Returns ``opt_state``."""
    if eta is not None:
        hyperparameters["eta"] = eta
    if not hyperparameters:
        return opt_state
    used = set()
    seen = set()
    changes = []      # (leaf, new rule): every new rule is made (and checked) before any leaf changes
    replaced = {}     # id(rule) -> its replacement, so leaves sharing a rule keep sharing one

    def adjusted(rule):
        if id(rule) not in replaced:
            if isinstance(rule, MixedPrecision):  # the inner rule's hyperparameters
                inner = adjusted(rule.rule)
                replaced[id(rule)] = rule if inner is rule.rule else rule.replace(rule=inner)
            else:
                kw = {k: v for k, v in hyperparameters.items() if k in rule._fields}
                used.update(kw)
                replaced[id(rule)] = rule.replace(**kw) if kw else rule
        return replaced[id(rule)]

    def walk(s):
        if isinstance(s, Leaf):
            if id(s) not in seen:
                seen.add(id(s))
                changes.append((s, adjusted(s.rule)))
        elif isinstance(s, dict):
            for v in s.values():
                walk(v)
        elif isinstance(s, (list, tuple)):
            for v in s:
                walk(v)

    walk(opt_state)
    unused = set(hyperparameters) - used
    if unused and seen:
        raise TypeError(f"adjust: no rule in this optimiser state has hyperparameter(s) {sorted(unused)}")
    for leaf, rule in changes:
        leaf.rule = rule
    return opt_state


# --- the training loop ----------------------------------------------------------------------------

def _learns_nothing(model, batch):
    """The message for a loss with no gradient for any trainable parameter of ``model``."""
    if not trainables(model):
        return (f"train: the model has no trainable parameters (floating-point Tensors outside a layer's "
                f"non-trainable state), so there is nothing to train; got a {type(model).__name__}")
    return (f"train: the loss on batch {batch} (0-based) does not depend on any trainable parameter of the model: "
            f"every gradient is None, so training would learn nothing (the model was not updated). "
            + LEFT_THE_TAPE)


@contextlib.contextmanager
def _naming_what_cannot_learn(model, index):
    """A GradientError inside becomes train's message when the model has no
    trainable parameter at all (nothing to differentiate)."""
    try:
        yield
    except GradientError:
        if not trainables(model):
            raise GradientError(_learns_nothing(model, index)) from None
        raise


def train(loss, model, data, opt_state, *, progress=False, capture=False):
    """One epoch (Flux's ``train!``): for each ``batch`` in ``data``, compute
    ``loss(model, *batch)`` (a tuple batch is splatted; anything else is
    passed whole, ``loss(model, batch)``) and its gradient with respect to
    ``model``, then ``update(opt_state, model, grad)``. With a
    ``MixedPrecision`` state the scaled loss ``opt_state.scale(loss(...))``
    is differentiated (and the unscaled value reported); a step whose
    gradients overflow is skipped by ``update``.

    Each step is all or nothing: a step that raises leaves the model (its
    running statistics included) and ``opt_state`` exactly as they were. A
    NaN or Inf loss stops training with ``NonFiniteError`` naming the batch
    before that batch updates anything, as Flux does; a loss that does not
    depend on any trainable parameter (every gradient None: it went through
    ``.numpy()`` or ``float(...)``, say) stops it with ``GradientError``.
    ``progress=True``
    shows a tqdm bar when tqdm is installed. ``capture=True`` records the
    step on the first two batches of each shape and replays its kernel
    launches after (:func:`capture_step`; on a GPU, a step's host cost
    without the Python per launch; the same results). Returns the list of
    losses (as Python floats), one per batch."""
    if isinstance(opt_state, Rule):
        raise TypeError(f"train(loss, model, data, opt_state): pass `setup({opt_state!r}, model)`, "
                        "not the rule itself (Flux's `opt_state = Flux.setup(rule, model)`)")
    it = data
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            warnings.warn("train(progress=True) needs the `tqdm` package; training without a progress bar",
                          stacklevel=2)
        else:
            it = tqdm(data, desc="train", leave=False)
    step = capture_step(loss, model, opt_state, name="train").run if capture else \
        partial(train_step, loss, model, opt_state)
    losses = []
    for i, batch in enumerate(it):
        v = step(batch, i)
        losses.append(v)
        if progress and hasattr(it, "set_postfix"):
            it.set_postfix(loss=f"{v:.4g}")
    return losses


def capture_step(loss, model, opt_state, *, name="capture_step"):
    """:func:`train`'s step, recorded on its first two calls and replayed
    after (:class:`triflux.capture.CapturedStep`): ``step = capture_step(loss,
    model, opt_state)``, then ``step(x, y)`` per batch returns the loss as a
    float, as one step of ``train`` would, with the same checks and the
    same all-or-nothing guarantee. On a GPU the replay repeats the recorded
    kernel launches without the Python that made them; on the CPU (or for a
    step that cannot be replayed, with a warning saying why) it runs
    eagerly. ``train(..., capture=True)`` uses one for the epoch."""
    if isinstance(opt_state, Rule):
        raise TypeError(f"{name}(loss, model, opt_state): pass `setup({opt_state!r}, model)`, not the rule itself")
    return CapturedStep(partial(train_step, loss, model, opt_state), (model, opt_state), name=name)


def train_step(loss, model, opt_state, batch, index=0, phase=eager_phase):
    """One step of :func:`train` on ``batch`` (number ``index`` of the
    epoch, for messages): the loss and its gradient, the checks, the update,
    all or nothing. Returns the loss as a Python float. The device work is
    in two phases, ``phase("gradient", ...)`` and ``phase("update", ...)``,
    which ``triflux.capture`` records and replays."""
    # the gradient is the model's only (as Flux's train!): none is computed for the data
    args = tuple(as_tensor(a) if isinstance(a, np.ndarray) else a
                 for a in (batch if isinstance(batch, tuple) else (batch,)))
    with all_or_nothing(), _naming_what_cannot_learn(model, index):   # a step that raises leaves the running statistics too as they were
        if isinstance(opt_state, MixedPrecisionState):   # differentiate the scaled loss; report the loss itself
            scale = opt_state.loss_scale
            value, grads, _ = phase("gradient", differentiate,
                                    lambda m: opt_state.scale(loss(m, *args)), (model,), "train")
            v = float(value.item()) / scale
        else:
            value, grads, _ = phase("gradient", differentiate, lambda m: loss(m, *args), (model,), "train")
            v = float(value.item())
        if not math.isfinite(v):
            raise NonFiniteError(
                f"train: the loss is {v} on batch {index} (0-based), stopping training; the model was not "
                "updated with this batch. Check the data for NaN/Inf, lower the learning rate, or use a "
                "stabler loss (e.g. logitcrossentropy on logits instead of crossentropy on softmax).")
        if not holds_arrays(grads[0]):
            raise GradientError(_learns_nothing(model, index))
        if isinstance(opt_state, MixedPrecisionState):
            phase("update", update, opt_state, model, grads[0])
        else:
            apply_update(phase("update", prepare_update, opt_state, model, grads[0]))
    return v
