"""``DistributedOptimizer``: a rule that averages gradients over workers
before stepping."""
from ..optimise import MixedPrecision, Rule
from .backends import as_backend
from .collectives import collective_on_leaf

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer(Rule):
    """Wrap the optimisation ``rule`` for data-parallel training (Flux's
    ``DistributedUtils.DistributedOptimizer``)::

        opt = DistributedOptimizer(backend, Adam(1e-3))
        opt_state = synchronize(backend, setup(opt, model))
        update(opt_state, model, grad)    # grads averaged over workers, then Adam

    Each parameter's gradient is ``allreduce``-averaged over all workers
    (in place, when it is writable) before ``rule`` steps with it, so every
    worker applies the same update and the models stay equal. Every worker
    must call ``update`` with the same model structure. Its hyperparameters
    are the inner rule's (``adjust(opt_state, 1e-4)`` changes the inner
    learning rate)."""

    def __init__(self, backend, rule):
        if isinstance(rule, type) and issubclass(rule, Rule):
            rule = rule()
        if not isinstance(rule, Rule) or isinstance(rule, (MixedPrecision, DistributedOptimizer)):
            raise TypeError(f"DistributedOptimizer(backend, rule): {rule!r} is not a plain optimisation rule "
                            "(e.g. `DistributedOptimizer(backend, Adam(1e-3))`)")
        self.backend = as_backend(backend, "DistributedOptimizer")
        self.rule = rule
        self._fields = rule._fields

    def __getattr__(self, name):          # the inner rule's hyperparameters: opt.eta, opt.beta, ...
        if name.startswith("_") or name in ("rule", "backend"):
            raise AttributeError(name)
        return getattr(self.rule, name)

    def __repr__(self):
        return f"DistributedOptimizer({self.backend!r}, {self.rule!r})"

    def __eq__(self, other):
        return type(other) is DistributedOptimizer and other.backend is self.backend and other.rule == self.rule

    def __hash__(self):
        return hash(("DistributedOptimizer", id(self.backend), self.rule))

    def hyperparameters(self):
        return self.rule.hyperparameters()

    def replace(self, **kw):
        return DistributedOptimizer(self.backend, self.rule.replace(**kw))

    def init(self, x):
        return self.rule.init(x)

    def _saved_rule(self):
        """What ``state``/``save`` record: the inner rule (the backend is a live
        connection); loading into a DistributedOptimizer state keeps its backend."""
        return self.rule

    def step_all(self, xs, gs, states):
        """Average every gradient over the workers, then let the inner rule
        update all parameters together (its multi-tensor launches)."""
        gs = [collective_on_leaf(self.backend, g, "allreduce", "avg", 0, "gradient") for g in gs]
        return self.rule.step_all(xs, gs, states)
