"""The checks every rule's hyperparameters go through.

Each rule's constructor (and so ``Rule.replace``, ``adjust`` and loading a
saved rule) takes its values through these functions, so no rule exists
that would turn the parameters into NaN. Each returns the value as the rule
keeps it (a float, a pair of floats, a bool) or raises an
``ArgumentError`` naming the rule, the field and what is valid.
"""
import math

from ..errors import ArgumentError


def real(value, rule, field):
    """``value`` as a float, or an ArgumentError naming the rule and the field."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ArgumentError(f"{rule}: {field} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{rule}: {field} must be a real number, got {value!r}") from None


def in_range(value, rule, field, ok, valid):
    """``value`` as a float for which ``ok`` holds; ``valid`` says in words what that is."""
    v = real(value, rule, field)
    if not ok(v):
        raise ArgumentError(f"{rule}: {field} must be {valid}, got {v!r}")
    return v


def non_negative(v):
    return 0 <= v < math.inf


def positive(v):
    return 0 < v < math.inf


def eta(v, rule):
    """A learning rate: finite and >= 0."""
    return in_range(v, rule, "eta (the learning rate)", non_negative, "finite and >= 0")


def decay(v, rule, field):
    """A weight decay: finite and >= 0."""
    return in_range(v, rule, field, non_negative, "finite and >= 0")


def epsilon(v, rule):
    """The ϵ added to a denominator: finite and > 0."""
    return in_range(v, rule, "epsilon", positive, "finite and > 0")


def fraction(v, rule, field):
    """A decay rate of a running average: in [0, 1) (at 1 the average never moves)."""
    return in_range(v, rule, field, lambda v: 0 <= v < 1, "in [0, 1)")


def beta(value, rule):
    """Adam's pair (β1, β2), each a :func:`fraction`."""
    pair = "a pair (β1, β2) of numbers in [0, 1), e.g. (0.9, 0.999)"
    try:
        value = tuple(value)
    except TypeError:
        raise ArgumentError(f"{rule}: beta must be {pair}, got {value!r}") from None
    if len(value) != 2:
        raise ArgumentError(f"{rule}: beta must be {pair}, got {value!r}")
    return tuple(fraction(b, rule, f"beta[{i}] (β{i + 1})") for i, b in enumerate(value))


def flag(v, rule, field):
    """True or False (not 0/1 spelled otherwise)."""
    if v not in (True, False):
        raise ArgumentError(f"{rule}: {field} must be True or False, got {v!r}")
    return bool(v)
