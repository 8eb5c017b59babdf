"""Mixed precision: a float16 / bfloat16 model trained through float32
master weights, with loss scaling (:class:`MixedPrecision`).

``setup(MixedPrecision(rule), model)`` returns a :class:`MixedPrecisionState`
(the usual state tree, each Leaf holding ``(master, rule's state)``, and
the loss scaler); ``update`` on it unscales and checks the gradients
(:func:`update_mixed`) and skips a step whose gradients overflowed.
"""
import math

from .. import dtypes as _dt
from .. import ops
from ..errors import ArgumentError, GradientError, StructureError
from ..functor import leaves
from ..tensor import Tensor, as_tensor
from . import hyperparameters as checks
from .planning import collect, step_together
from .rules import RULES, Adam, Rule

LOW_PRECISION = ("float16", "bfloat16")


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
            if dtype.name not in LOW_PRECISION + ("float32",):
                raise TypeError(f"MixedPrecision: dtype must be float16 or bfloat16 (or float32, or None to keep "
                                f"the model's), got {dtype}")
        if loss_scale is not None and loss_scale != "dynamic":
            if isinstance(loss_scale, str):
                raise ArgumentError(f"MixedPrecision: loss_scale must be 'dynamic', a positive number or None, "
                                    f"got {loss_scale!r}")
            loss_scale = checks.in_range(loss_scale, "MixedPrecision", "loss_scale", checks.positive,
                                         "finite and > 0")
        self.rule, self.dtype, self.loss_scale = rule, dtype, loss_scale
        self.init_scale = checks.in_range(init_scale, "MixedPrecision", "init_scale", checks.positive,
                                          "finite and > 0")
        self.growth_factor = checks.in_range(growth_factor, "MixedPrecision", "growth_factor",
                                             lambda v: 1 <= v < math.inf, "finite and >= 1")
        self.backoff_factor = checks.in_range(backoff_factor, "MixedPrecision", "backoff_factor",
                                              lambda v: 0 < v <= 1, "in (0, 1]")
        interval = checks.in_range(growth_interval, "MixedPrecision", "growth_interval",
                                   lambda v: v >= 1 and v.is_integer(), "a whole number >= 1")
        self.growth_interval = int(interval)

    def __repr__(self):
        d = "nothing" if self.dtype is None else self.dtype.name
        return (f"MixedPrecision({self.rule!r}, {d}, {self.loss_scale!r}; init_scale={self.init_scale!r}, "
                f"growth_factor={self.growth_factor!r}, backoff_factor={self.backoff_factor!r}, "
                f"growth_interval={self.growth_interval!r})")

    @staticmethod
    def master_dtype(x):
        return _dt.float64 if x.dtype == _dt.float64 else _dt.float32

    def init(self, x):
        master = copy_as(x, self.master_dtype(x))
        return (master, self.rule.init(master))

    def step_all(self, xs, gs, states):
        """One step for the parameters ``xs``, the gradients ``gs`` already
        unscaled and of the masters' dtype (``update`` does that for all of
        them first): the rule steps the masters, the model gets them rounded
        to its dtype."""
        masters = [master for master, _ in states]
        inner = self.rule.step_all(masters, gs, [inner for _, inner in states])
        rounded = [copy_as(master, x.dtype) for x, master in zip(xs, masters)]   # every copy, then the model
        for x, r in zip(xs, rounded):
            x._data = r._data
        return list(zip(masters, inner))


def copy_as(x, dtype):
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


def setup_mixed(rule, model, walk):
    tree = walk(model)
    params = [t for t in leaves(model) if isinstance(t, Tensor) and _dt.is_floating(t.dtype)]
    if rule.dtype is not None:
        for t in params:  # in place: the Tensors keep their identity (masters were taken above)
            if t.dtype != rule.dtype:
                t._data = ops.cast(t, rule.dtype)._data
    low = rule.dtype if rule.dtype is not None else next(
        (t.dtype for t in params if t.dtype.name in LOW_PRECISION), params[0].dtype if params else _dt.float32)
    dynamic = rule.loss_scale == "dynamic" or (rule.loss_scale is None and low.name == "float16")
    scale = rule.init_scale if dynamic else (1.0 if rule.loss_scale is None else rule.loss_scale)
    return MixedPrecisionState(tree=tree, scaler={"scale": float(scale), "growth_tracker": 0, "dynamic": dynamic})


def update_mixed(opt_state, model, grad):
    sc = opt_state["scaler"]
    scale = float(sc["scale"])
    if scale != 1.0 and not opt_state._scaled:
        raise GradientError(
            f"update: this MixedPrecision optimiser state scales the loss by {scale:g}, but `opt_state.scale(loss)` "
            "was not called since the last update, so these gradients are probably of the unscaled loss. "
            "Differentiate the scaled loss, e.g. `gradient(lambda m: opt_state.scale(loss(m, x, y)), model)`, "
            "or let `train(loss, model, data, opt_state)` do it.")
    plan = collect(opt_state["tree"], model, grad)
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
        step_together([(leaf, x, g) for (leaf, x, _), g in zip(plan, grads)])
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
