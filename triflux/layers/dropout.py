"""Dropout: random zeros in training, the identity in testing.

As in Flux, it is active inside ``gradient`` and inactive outside, unless
``trainmode``/``testmode`` pinned it (its ``active`` attribute)."""
from .. import ops
from ..arguments import probability_arg
from ..modes import is_active
from .base import Layer

__all__ = ["Dropout"]


class Dropout(Layer):
    """Zero each element with probability ``p`` (a number in [0, 1]) in
    training, scaling the rest by ``1/(1-p)``; the identity in testing. The
    mask is drawn on the input's device from triflux's seeded stream
    (``triflux.seed``)::

        model = Chain(Dense(10, 10, relu), Dropout(0.5), Dense(10, 2))

    Math: reference/dropout.py ``dropout_forward``.
    """

    def __init__(self, p):
        self.p = probability_arg(p, "Dropout")
        self.active = None

    def __call__(self, x):
        if not is_active(self) or self.p == 0:
            return x
        return ops.dropout(x, self.p)

    def _signature(self):
        return f"{self.p}"
