"""Optimisers.jl's interface: ``setup`` a state tree for a model,
``update`` the model from a gradient, ``adjust`` the hyperparameters.

::

    opt_state = setup(Adam(1e-3), model)      # state tree mirroring the model
    loss, (g,) = withgradient(lambda m: mse(m(x), y), model)
    update(opt_state, model, g)               # parameters change in place
"""
from ..errors import StructureError
from .mixed_precision import MixedPrecision, MixedPrecisionState, setup_mixed, update_mixed
from .planning import collect, fit_gradient, step_together
from .rules import RULES, Rule
from .tree import Leaf, mirror_trainables

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
        return mirror_trainables(x, leaf)

    if isinstance(rule, MixedPrecision):
        return setup_mixed(rule, model, walk)
    return walk(model)


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
        return update_mixed(opt_state, model, grad)
    apply_update(prepare_update(opt_state, model, grad))
    return opt_state, model


def prepare_update(opt_state, model, grad):
    """Everything ``update`` does before a parameter moves: the checks, and
    each gradient converted to its parameter's dtype (which allocates, so
    running out of memory here changes nothing). The list of ``(leaf,
    parameter, gradient)`` that :func:`apply_update` steps."""
    plan = collect(opt_state, model, grad)
    rules = {id(leaf["rule"]): leaf["rule"] for leaf, _, _ in plan}      # (usually one)
    if any(isinstance(rule, MixedPrecision) for rule in rules.values()):
        raise StructureError("update: this optimiser state tree holds MixedPrecision leaves; pass the whole "
                             "state `setup(MixedPrecision(rule), model)` returned (it holds the loss scale)")
    return [(leaf, x, fit_gradient(x, g)) for leaf, x, g in plan]


def apply_update(plan):
    """Step every ``(leaf, parameter, gradient)`` of ``plan`` (from
    :func:`prepare_update`) with its leaf's rule as it is now."""
    step_together(plan)


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
