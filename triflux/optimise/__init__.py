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

The package, one concern per module:

==================  ==============================================================
``rules``           the rules (``Rule``, ``Descent`` ... ``AdamW``)
``hyperparameters`` the checks every rule's hyperparameters go through
``tree``            the state tree (``Leaf``, ``trainables``)
``planning``        one step's checked list of (leaf, parameter, gradient)
``mixed_precision`` ``MixedPrecision``: float32 masters and loss scaling
``saved_rules``     rules as plain data, for ``state`` / ``save`` / ``load``
``interface``       ``setup``, ``update``, ``adjust``
``training``        ``train``, ``train_step``, ``capture_step``
==================  ==============================================================
"""
from .interface import adjust, apply_update, prepare_update, setup, update
from .mixed_precision import MixedPrecision, MixedPrecisionState
from .planning import collect as _collect  # noqa: F401  (the name the tests use)
from .rules import RULES, Adam, AdamW, Descent, Momentum, Nesterov, RMSProp, Rule
from .saved_rules import rule_from_dict, rule_to_dict
from .training import capture_step, train, train_step
from .tree import Leaf, trainables

__all__ = ["Descent", "Momentum", "Nesterov", "Adam", "AdamW", "RMSProp", "Leaf", "Rule",
           "MixedPrecision", "MixedPrecisionState", "setup", "update", "adjust", "train", "trainables", "RULES",
           "capture_step", "train_step", "prepare_update", "apply_update"]
