"""Layers that combine other layers (Flux's containers): Chain,
SkipConnection and Parallel."""
from ..activations import BY_NAME
from ..arguments import is_int
from ..errors import ArgumentError
from ..functor import is_layer
from ..modes import all_or_nothing
from ..show import fname
from .base import Layer

__all__ = ["Chain", "SkipConnection", "Parallel"]


def _callable(f, who, what):
    """``f`` if it can be called (a layer or a function), else an
    ArgumentError naming ``what`` it was in ``who``."""
    if callable(f):
        return f
    hint = f"; for the activation write `{f}` (the function), not the string" if isinstance(f, str) and \
        f in BY_NAME else ""
    raise ArgumentError(f"{who}: {what} must be a layer or a function, got {f!r:.60} ({type(f).__name__}){hint}")


def _layers(who, layers, named):
    """The layers of a container, a dict when named, checked callable."""
    for key, layer in (named.items() if named else enumerate(layers)):
        _callable(layer, who, f"layer {key!r}" if named else f"layer {key}")
    return dict(named) if named else list(layers)


class Chain(Layer):
    """Layers (or any functions) applied in order: ``Chain(l1, l2)(x) ==
    l2(l1(x))`` (Flux's ``Chain``, torch's ``nn.Sequential``).

    ``Chain(enc=..., dec=...)`` names them; ``Chain([l1, l2])`` takes a
    list. ``chain[i]`` indexes (``chain["enc"]`` by name), slices give a
    sub-Chain, ``len(chain)`` counts the layers::

        model = Chain(Dense(784, 32, relu), Dense(32, 10))
        model(tf.rand(16, 784)).shape     # (16, 10)
    """
    _big_show = True   # prints as a block, one layer per line (triflux.show)

    def __init__(self, *layers, **named):
        if layers and named:
            raise TypeError("Chain takes layers either by position or by name, not both")
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        self.layers = _layers("Chain", layers, named)

    def _sequence(self):
        return list(self.layers.values()) if isinstance(self.layers, dict) else self.layers

    def __call__(self, x):
        with all_or_nothing():      # a layer that fails leaves the state earlier layers moved
            for layer in self._sequence():
                x = layer(x)
        return x

    def __getitem__(self, i):
        named = isinstance(self.layers, dict)
        if isinstance(i, str):
            if named and i in self.layers:
                return self.layers[i]
            names = f"its names are {', '.join(map(repr, self.layers))}" if named else \
                "its layers have no names (index them by position, or build Chain(name=layer, ...))"
            raise KeyError(f"Chain has no layer named {i!r}: {names}")
        seq = self._sequence()
        if isinstance(i, slice):
            return Chain(*seq[i])
        if not is_int(i):
            raise ArgumentError(f"Chain index must be an int, a slice or a layer's name, got {i!r} "
                                f"({type(i).__name__})")
        if not -len(seq) <= i < len(seq):
            valid = f"indices 0 to {len(seq) - 1}, or -{len(seq)} to -1" if seq else "it is empty"
            raise IndexError(f"Chain index {i} is out of range: the Chain has {len(seq)} layers ({valid})")
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
    """``connection(layer(x), x)`` (Flux's ``SkipConnection``): a residual
    block with ``connection=ops.add``, a UNET skip with
    ``connection=lambda y, x: cat(y, x, dims=1)``; both arguments are
    layers or functions::

        block = SkipConnection(Chain(Dense(4, 4, relu), Dense(4, 4)), tf.ops.add)
    """

    def __init__(self, layer, connection):
        self.layer = _callable(layer, "SkipConnection", "the layer")
        self.connection = _callable(connection, "SkipConnection", "the connection")

    def __call__(self, x):
        with all_or_nothing():
            return self.connection(self.layer(x), x)

    def _signature(self):
        return f"{_short(self.layer)}, {_short(self.connection)}"


class Parallel(Layer):
    """``connection(l1(x), l2(x), ...)``; with several inputs,
    ``connection(l1(x1), l2(x2), ...)`` (Flux's ``Parallel``).
    ``Parallel(connection, a=l1, b=l2)`` names the layers::

        two_heads = Parallel(lambda a, b: cat(a, b, dims=1), Dense(4, 2), Dense(4, 3))
        two_heads(tf.ones(5, 4)).shape      # (5, 5)
    """

    def __init__(self, connection, *layers, **named):
        if layers and named:
            raise TypeError("Parallel takes layers either by position or by name, not both")
        if not layers and not named:
            raise TypeError("Parallel needs at least one layer")
        self.connection = _callable(connection, "Parallel", "the connection")
        self.layers = _layers("Parallel", layers, named)

    def _sequence(self):
        return list(self.layers.values()) if isinstance(self.layers, dict) else self.layers

    def __call__(self, *xs):
        seq = self._sequence()
        if len(xs) not in (1, len(seq)):
            raise TypeError(f"Parallel with {len(seq)} layers takes 1 input or {len(seq)} inputs, got {len(xs)}")
        with all_or_nothing():
            ys = [layer(x) for layer, x in zip(seq, xs * len(seq) if len(xs) == 1 else xs)]
            return self.connection(*ys)

    def _signature(self):
        return ", ".join([_short(self.connection)] + [_short(l) for l in self._sequence()])
