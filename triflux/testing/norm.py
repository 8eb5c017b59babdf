"""Strategies and torch oracles for the normalisation family (batch norm).

Inputs: x of shape (N, C, *spatial) with 0, 1 or 2 spatial axes (so (N, C),
(N, C, L) and (N, C, H, W)), sides 0 and 1 included; per-channel gamma and
beta (beta kept away from 0 so the output has a scale); for ``batchnorm_test``
a given mean and a positive variance. eps from a few orders of magnitude.
About one draw in four adds a per-channel offset of 50 to x (a naive
E[x^2] - E[x]^2 variance loses digits there). Random memory layouts. In
about two draws in three a few entries of x are NaN, +inf and -inf: their
channels' statistics, outputs and gradients are NaN, as torch's (a variance
floor of max(var, 0) must not drop the NaN on a GPU). gamma, beta and the
given statistics stay finite: with those infinite, torch's CPU kernel (which
folds them into one scale and shift) and its CUDA kernel disagree.

Each channel has M = N * prod(spatial) values: the train strategy keeps M
either 0 or >= 3. With M = 1 the output is exactly beta and with M = 2 the
normalised values are +-1 up to eps, so the backward cancels to (nearly) zero
and a relative comparison with torch measures only roundoff; those cases
are pinned by tests/test_norm_family.py instead.

``batchnorm_train`` and ``batchnorm_test`` draw one of their fusable
activations (identity in about half the draws); the oracle applies torch's.

``batchnorm_running_update`` draws x as the train strategy does (M = 0 or
>= 3; M = 1 is where triflux and torch part, pinned by the family's tests),
running means near x's (offset included) and positive running variances,
and momenta from 0 to 1. Its oracle returns the new running statistics.
"""
import numpy as np

from ..specs.norm import FUSABLE_ACTIVATIONS
from . import Case, finite_max, floats, layouts_for, through_activation_terms, torch_activated
from .elementwise import nonfinite_draw, with_nonfinite

EPS_CHOICES = (1e-5, 1e-3, 0.1)


def _nonzero(st, n, low=0.25, high=2.0):
    """n values with |v| in [low, high], random signs."""
    return st.tuples(floats((n,), low, high), st.lists(st.sampled_from((-1.0, 1.0)), min_size=n,
                                                        max_size=n)).map(
        lambda t: t[0] * np.asarray(t[1], dtype=np.float64).reshape((n,)))


def _x_shape(st, draw, train):
    n = draw(st.integers(0, 3))
    c = draw(st.integers(0, 4))
    spatial = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=2)))
    s = 1
    for v in spatial:
        s *= v
    if train and 0 < n * s < 3:
        n = 3 if s == 1 else 2
    return (n, c) + spatial


def _x(st, draw, train):
    """x, its offset (0 or 50) and a note saying what was drawn."""
    shape = _x_shape(st, draw, train)
    x = draw(floats(shape, -3.0, 3.0, extreme=draw(st.booleans())))
    offset = 50.0 if draw(st.integers(0, 3)) == 0 else 0.0
    x = x + offset
    nonfinite = nonfinite_draw(draw)
    if nonfinite:
        x = with_nonfinite(draw, x)
    return x, offset, f"x {shape}" + (" offset 50" if offset else "") + (" NaN/inf" if nonfinite else "")


def _statistics(draw, c, offset):
    """A per-channel mean near x's and a positive variance, as running statistics are."""
    return draw(floats((c,), -2.0, 2.0)) + offset, draw(floats((c,), 0.05, 3.0))


def _case(st, draw, train):
    x, offset, note = _x(st, draw, train)
    c = x.shape[1]
    gamma = draw(floats((c,), -2.0, 2.0))
    beta = draw(_nonzero(st, c))
    eps = draw(st.sampled_from(EPS_CHOICES))
    attrs = {"eps": eps}
    if draw(st.booleans()):
        attrs["activation"] = draw(st.sampled_from(FUSABLE_ACTIVATIONS))
    inputs = (x, gamma, beta) + (() if train else _statistics(draw, c, offset))
    return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))),
                grad_inputs=(0, 1, 2), note=f"{note} {attrs}")


MOMENTUM_CHOICES = (0.0, 0.01, 0.1, 0.5, 1.0)


def _running_update_case(st, draw):
    x, offset, note = _x(st, draw, True)
    momentum = draw(st.sampled_from(MOMENTUM_CHOICES))
    return Case(inputs=(x,) + _statistics(draw, x.shape[1], offset), attrs={"momentum": momentum},
                layouts=draw(layouts_for(3)), note=f"{note} momentum={momentum}")


def batchnorm_train_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, True))()


def batchnorm_test_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, False))()


def batchnorm_running_update_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _running_update_case(st, draw))()


def _empty(x, gamma, beta):
    """An empty output connected to the inputs (their gradients: zeros)."""
    return x * 1 + (gamma.sum() + beta.sum()) * 0


def batchnorm_train_torch(x, gamma, beta, eps=1e-5, activation="identity"):
    """torch's training-mode batch norm (batch statistics, no running stats),
    then torch's activation. ``torch.batch_norm`` is ``F.batch_norm`` without
    its check that a channel has more than one value."""
    import torch
    if x.numel() == 0:  # torch cannot index a channel that is not there (C = 0)
        return _empty(x, gamma, beta)
    return torch_activated(torch.batch_norm(x, gamma, beta, None, None, True, 0.1, eps, False), activation)


def batchnorm_test_torch(x, gamma, beta, mean, var, eps=1e-5, activation="identity"):
    """torch's evaluation-mode batch norm with the given statistics, then its activation."""
    import torch
    if x.numel() == 0:
        return _empty(x, gamma, beta)
    return torch_activated(torch.nn.functional.batch_norm(x, mean, var, gamma, beta, training=False, eps=eps),
                           activation)


def _xhat_and_istd(x, eps, mean=None, var=None):
    """|xhat| and istd per channel (float64) from the batch's statistics or the given ones."""
    x = np.asarray(x, dtype=np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    with np.errstate(all="ignore"):
        if mean is None:
            mean, var = np.mean(x, axis=axes, keepdims=True), np.var(x, axis=axes, keepdims=True)
        else:
            mean, var = np.reshape(mean, shape), np.reshape(var, shape)
        istd = 1 / np.sqrt(var + eps)
        return np.abs((x - mean) * istd), istd, axes, shape


def _fused_backward_floor(inputs, attrs, out, grad, train):
    """With an activation, the backward reads the rounded output y, so dL/dz
    carries terms of size T = |G| (|act'| + |d act'/dy| |y|)
    (``through_activation_terms``); dbeta sums T, dgamma sums T |xhat|, and dx
    is made of |gamma| istd (T + [train] (sum T + |xhat| sum T |xhat|) / M).
    None (no floor) without an activation."""
    activation = attrs.get("activation", "identity")
    if activation == "identity" or np.size(inputs[0]) == 0:
        return None
    x, gamma = inputs[0], np.abs(np.asarray(inputs[1], dtype=np.float64))
    t = through_activation_terms(grad, out, activation, "batchnorm magnitude")
    xhat, istd, axes, shape = _xhat_and_istd(x, attrs["eps"], *(() if train else inputs[3:5]))
    with np.errstate(all="ignore"):
        dbeta, dgamma = t.sum(axis=axes), (t * xhat).sum(axis=axes)
        dx = t
        if train:
            m = np.size(x) // np.shape(x)[1]
            dx = t + (dbeta.reshape(shape) + xhat * dgamma.reshape(shape)) / m
        dx = gamma.reshape(shape) * istd * dx
    return (finite_max(dx), finite_max(dgamma), finite_max(dbeta)) + (None,) * (len(inputs) - 3)


def batchnorm_train_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Backward with an activation: see :func:`_fused_backward_floor`."""
    return None if direction == "forward" else _fused_backward_floor(inputs, attrs, out, grad, train=True)


def batchnorm_test_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Backward with an activation: see :func:`_fused_backward_floor`."""
    return None if direction == "forward" else _fused_backward_floor(inputs, attrs, out, grad, train=False)


def batchnorm_running_update_torch(x, running_mean, running_var, momentum=0.1):
    """The running statistics after torch's training-mode batch norm of x
    (new tensors; the inputs stay as they are). torch moves nothing for an
    empty x."""
    new_mean, new_var = running_mean.clone(), running_var.clone()
    if x.numel() > 0:
        import torch
        torch.batch_norm(x, None, None, new_mean, new_var, True, momentum, 1e-5, False)
    return new_mean, new_var
