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
"""
from . import Case, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

EPS_CHOICES = (1e-5, 1e-3, 0.1)


def _nonzero(st, n, low=0.25, high=2.0):
    """n values with |v| in [low, high], random signs."""
    import numpy as np
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


def _case(st, draw, train):
    shape = _x_shape(st, draw, train)
    c = shape[1]
    x = draw(floats(shape, -3.0, 3.0, extreme=draw(st.booleans())))
    offset = draw(st.integers(0, 3)) == 0
    if offset:
        x = x + 50.0
    nonfinite = nonfinite_draw(draw)
    if nonfinite:
        x = with_nonfinite(draw, x)
    gamma = draw(floats((c,), -2.0, 2.0))
    beta = draw(_nonzero(st, c))
    eps = draw(st.sampled_from(EPS_CHOICES))
    inputs = (x, gamma, beta)
    if not train:
        mean = draw(floats((c,), -2.0, 2.0)) + (50.0 if offset else 0.0)
        var = draw(floats((c,), 0.05, 3.0))
        inputs = inputs + (mean, var)
    return Case(inputs=inputs, attrs={"eps": eps}, layouts=draw(layouts_for(len(inputs))),
                grad_inputs=(0, 1, 2),
                note=f"x {shape} eps={eps}" + (" offset 50" if offset else "")
                + (" NaN/inf" if nonfinite else ""))


def batchnorm_train_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, True))()


def batchnorm_test_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, False))()


def _empty(x, gamma, beta):
    """An empty output connected to the inputs (their gradients: zeros)."""
    return x * 1 + (gamma.sum() + beta.sum()) * 0


def batchnorm_train_torch(x, gamma, beta, eps=1e-5):
    """torch's training-mode batch norm (batch statistics, no running stats).
    ``torch.batch_norm`` is ``F.batch_norm`` without its check that a channel
    has more than one value."""
    import torch
    if x.numel() == 0:  # torch cannot index a channel that is not there (C = 0)
        return _empty(x, gamma, beta)
    return torch.batch_norm(x, gamma, beta, None, None, True, 0.1, eps, False)


def batchnorm_test_torch(x, gamma, beta, mean, var, eps=1e-5):
    """torch's evaluation-mode batch norm with the given statistics."""
    import torch
    if x.numel() == 0:
        return _empty(x, gamma, beta)
    return torch.nn.functional.batch_norm(x, mean, var, gamma, beta, training=False, eps=eps)
