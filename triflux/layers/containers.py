"""Layers that combine other layers (Flux's containers): Chain,
SkipConnection and Parallel."""
from ..functor import is_layer
from ..show import fname
from .base import Layer

__all__ = ["Chain", "SkipConnection", "Parallel"]


class Chain(Layer):
    """Layers (or any functions) applied in order: ``Chain(l1, l2)(x) ==
    l2(l1(x))``. ``Chain(enc=..., dec=...)`` names them; ``chain[i]``
    indexes, slices give a sub-Chain."""
    _big_show = True   # prints as a block, one layer per line (triflux.show)

    def __init__(self, *layers, **named):
        if layers and named:
            raise TypeError("Chain takes layers either by position or by name, not both")
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        self.layers = dict(named) if named else list(layers)

    def _sequence(self):
        return list(self.layers.values()) if isinstance(self.layers, dict) else self.layers

    def __call__(self, x):
        for layer in self._sequence():
            x = layer(x)
        return x

    def __getitem__(self, i):
        if isinstance(self.layers, dict) and isinstance(i, str):
            return self.layers[i]
        seq = self._sequence()
        if isinstance(i, slice):
            return Chain(*seq[i])
        return seq[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self._sequence())


def _short(f):
    if is_layer(f):
        return f"{type(f).__name__}({f._signature()})"
    return {"add": "+", "mul": "*"}.get(fname(f), fname(f))


class SkipConnection(Layer):
    """``connection(layer(x), x)``: a residual block with ``connection=add``,
    a UNET skip with ``connection=lambda y, x: cat([y, x], axis=1)``."""

    def __init__(self, layer, connection):
        self.layer = layer
        self.connection = connection

    def __call__(self, x):
        return self.connection(self.layer(x), x)

    def _signature(self):
        return f"{_short(self.layer)}, {_short(self.connection)}"


class Parallel(Layer):
    """``connection(l1(x), l2(x), ...)``; with several inputs,
    ``connection(l1(x1), l2(x2), ...)``. ``Parallel(connection, a=l1, b=l2)``
    names the layers."""

    def __init__(self, connection, *layers, **named):
        if layers and named:
            raise TypeError("Parallel takes layers either by position or by name, not both")
        if not layers and not named:
            raise TypeError("Parallel needs at least one layer")
        self.connection = connection
        self.layers = dict(named) if named else list(layers)

    def _sequence(self):
        return list(self.layers.values()) if isinstance(self.layers, dict) else self.layers

    def __call__(self, *xs):
        seq = self._sequence()
        if len(xs) == 1:
            ys = [layer(xs[0]) for layer in seq]
        elif len(xs) == len(seq):
            ys = [layer(x) for layer, x in zip(seq, xs)]
        else:
            raise TypeError(f"Parallel with {len(seq)} layers takes 1 input or {len(seq)} inputs, got {len(xs)}")
        return self.connection(*ys)

    def _signature(self):
        return ", ".join([_short(self.connection)] + [_short(l) for l in self._sequence()])
