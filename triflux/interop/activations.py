"""The activations' conversions: ReLU, Sigmoid, GELU, Softmax... to triflux's
functions and back, with their arguments (``leakyrelu(a=0.2)``,
``softmax(dims=-1)``), and a layer's ``activation`` as the torch module that
follows it (:func:`with_activation`).

torch's default ``GELU()`` is the exact erf form, triflux's ``gelu_erf``;
``GELU(approximate="tanh")`` is triflux's ``gelu``. ``Softmax()`` without a
``dim`` (torch's deprecated implicit axis) becomes a function of its own
(:func:`softmax_implicit`) that picks the axis as torch does."""
from triflux import activations as A
from triflux import ops
from triflux.tensor import as_tensor
from .activation_arguments import Activation
from .conversion import Conversion, convert_to, refuse_from, refuse_to
from .torch_modules import import_torch


def arguments(x, path, *names):
    """The keyword arguments of activation ``x``: none for the bare function,
    an ``Activation``'s own when they are among ``names`` (refused otherwise)."""
    if not isinstance(x, Activation):
        return {}
    if names and set(x.kwargs) <= set(names):
        return x.kwargs
    refuse_to(path, f"activation {x.__name__}")


def with_activation(mod, layer, path):
    """``mod``, followed by ``layer``'s activation when it has one (``Sequential(mod, activation)``,
    so a Chain's i-th layer stays the Sequential's i-th module)."""
    act = getattr(layer, "activation", None)
    if act is None or act is A.identity:
        return mod
    return import_torch().nn.Sequential(mod, convert_to(act, f"{path}.activation"))


# --- torch's implicit softmax axis -------------------------------------------------------------

def _torch_implicit_softmax_axis(x):
    """torch's (deprecated) axis choice for ``Softmax(dim=None)``."""
    return 0 if x.ndim in (0, 1, 3) else 1


def softmax_implicit(x):
    """``torch.nn.Softmax()``'s softmax: along the axis torch picks for ``x``."""
    x = as_tensor(x)
    return ops.softmax(x, _torch_implicit_softmax_axis(x))


def logsoftmax_implicit(x):
    """``torch.nn.LogSoftmax()``'s logsoftmax: along the axis torch picks for ``x``."""
    x = as_tensor(x)
    return ops.logsoftmax(x, _torch_implicit_softmax_axis(x))


softmax_implicit.__name__ = "softmax_torch_implicit_dim"
logsoftmax_implicit.__name__ = "logsoftmax_torch_implicit_dim"


# --- the conversions ----------------------------------------------------------------------------

def activation(torch_name, fn, from_torch=None):
    """The Conversion of an activation without arguments: ``torch_name()``
    <-> ``fn`` (``from_torch`` checks the torch module's options, if any)."""
    def to_torch(x, path):
        arguments(x, path)
        return getattr(import_torch().nn, torch_name)()
    return Conversion((torch_name,), (fn,), from_torch or (lambda m, path, options: fn), to_torch)


def gelu_from_torch(m, path, options):
    if m.approximate == "tanh" or options.approximate_gelu:
        return A.gelu
    if m.approximate == "none":
        return A.gelu_erf
    refuse_from(path, m, f"GELU(approximate={m.approximate!r})", "use approximate='none' or 'tanh'")


def gelu_to_torch(x, path):
    arguments(x, path)
    return import_torch().nn.GELU(approximate="tanh") if x is A.gelu else import_torch().nn.GELU()


def softplus_from_torch(m, path, options):
    if m.beta != 1:
        refuse_from(path, m, f"beta={m.beta}", "triflux's softplus has beta=1")
    return A.softplus


def elu_from_torch(m, path, options):
    return A.elu if m.alpha == 1.0 else Activation(A.elu, alpha=float(m.alpha))


def elu_to_torch(x, path):
    return import_torch().nn.ELU(arguments(x, path, "alpha").get("alpha", 1.0))


def leakyrelu_from_torch(m, path, options):
    return A.leakyrelu if m.negative_slope == 0.01 else Activation(A.leakyrelu, a=float(m.negative_slope))


def leakyrelu_to_torch(x, path):
    return import_torch().nn.LeakyReLU(arguments(x, path, "a").get("a", 0.01))


def softmax(torch_name, fn, implicit):
    """The Conversion torch_name(dim) <-> fn(dims=dim); ``dim=None`` (torch's
    deprecated implicit axis) <-> ``implicit``, and ``fn`` itself to dim=1
    (triflux's class axis for batched input)."""
    def from_torch(m, path, options):
        return implicit if m.dim is None else Activation(fn, dims=int(m.dim))

    def to_torch(x, path):
        cls = getattr(import_torch().nn, torch_name)
        if x is implicit:
            return cls()
        dims = arguments(x, path, "dims").get("dims")
        return cls(dim=1 if dims is None else dims)
    return Conversion((torch_name,), (fn, implicit), from_torch, to_torch)
