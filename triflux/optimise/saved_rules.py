"""Rules as plain data: what ``state`` and ``save`` write for a rule, and
what ``loadmodel`` and ``load`` rebuild (``{"Adam": {"eta": 0.001, ...}}``).

A rule is saved by its class name and hyperparameters, never by code, and
rebuilt through its constructor, so a saved rule passes the same checks as
a new one.
"""
import numpy as np

from ..errors import StructureError
from .mixed_precision import MixedPrecision
from .rules import RULES

def rule_from_dict(d):
    """The rule saved by ``rule_to_dict`` (``{"Adam": {"eta": ..., ...}}``)."""
    if not isinstance(d, dict) or len(d) != 1:
        raise StructureError(f"not a saved optimisation rule: {d!r}")
    (name, hp), = d.items()
    if name == "MixedPrecision":
        return _mixed_from_dict(hp)
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
        return _mixed_to_dict(rule)
    hp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in rule.hyperparameters().items()}
    return {type(rule).__name__: hp}


def _mixed_to_dict(rule):
    """A MixedPrecision rule as plain data: its inner rule saved the same way, its dtype by name."""
    hp = rule.hyperparameters()
    hp["rule"] = rule_to_dict(rule.rule)
    hp["dtype"] = None if rule.dtype is None else rule.dtype.name
    return {"MixedPrecision": hp}


def _mixed_from_dict(hp):
    """The MixedPrecision rule saved by :func:`_mixed_to_dict`."""
    hp = _saved_hyperparameters(MixedPrecision, hp)
    hp = {k: (v.item() if isinstance(v, np.ndarray) and v.size == 1 else v) for k, v in hp.items()}
    if "rule" not in hp:
        raise StructureError(f"a saved MixedPrecision rule without its inner rule: {hp!r}")
    hp["rule"] = rule_from_dict(hp["rule"])
    return MixedPrecision(**hp)
