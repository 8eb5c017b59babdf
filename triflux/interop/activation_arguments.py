"""``Activation``: an activation function with fixed keyword arguments, such
as ``leakyrelu(a=0.2)``, what ``from_torch`` makes of ``LeakyReLU(0.2)`` or
``Softmax(dim=2)``. A model file names it too (``triflux.model_file``)."""


class Activation:
    """An activation function with fixed keyword arguments, e.g.
    ``Activation(leakyrelu, a=0.2)``; prints as ``leakyrelu(a=0.2)``."""

    def __init__(self, fn, **kwargs):
        self.fn, self.kwargs = fn, dict(kwargs)
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        self.__name__ = f"{fn.__name__}({args})"

    def __call__(self, x):
        return self.fn(x, **self.kwargs)

    def __repr__(self):
        return self.__name__

    def __eq__(self, other):
        return isinstance(other, Activation) and other.fn is self.fn and other.kwargs == self.kwargs

    def __hash__(self):
        return hash((self.fn, tuple(sorted(self.kwargs.items()))))
