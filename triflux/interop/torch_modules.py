"""torch's side of the interop: torch imported on first use (importing
triflux never imports it), the names of torch's module classes, and the two
torch modules triflux defines itself, :class:`TorchSkipConnection` and
:class:`TorchSequence`, created on first use too.

Those two classes say they live in the package (``__module__`` is
``triflux.interop``), whose module-level ``__getattr__`` returns them: so
``triflux.interop.TorchSkipConnection`` is importable, and a pickled model
holding one loads again."""
import importlib

from triflux.errors import InteropError

#: the module the own torch modules are importable (and pickled) from: the package
HOME = __name__.rpartition(".")[0]
#: the torch modules triflux defines (see :func:`torch_classes`)
OWN_TORCH_MODULES = ("TorchSkipConnection", "TorchSequence")
_TORCH_CLASSES = {}


def import_torch():
    """The torch module, or an ``InteropError`` saying how to install it."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise InteropError("PyTorch interop needs torch; install it (`pip install torch`, or "
                           "`pip install triflux[gpu]`)") from None


def torch_name(cls):
    """How an error names torch module class ``cls`` (``torch.nn.Linear``)."""
    torch = import_torch()
    name = cls.__name__
    if getattr(torch.nn, name, None) is cls:
        return f"torch.nn.{name}"
    return f"{cls.__module__}.{cls.__qualname__}"


def torch_classes():
    """The torch modules triflux defines, by name (created on first use, so that
    importing triflux does not import torch)."""
    if not _TORCH_CLASSES:
        nn, torch_cat = import_torch().nn, import_torch().cat

        class TorchSkipConnection(nn.Module):
            """``layer(x) + x`` (``connection="add"``): triflux's
            ``SkipConnection(layer, +)``, or ``torch.cat([layer(x), x], 1)``
            (``connection="cat"``): a UNET's ``SkipConnection(layer,
            models.cat_channels)``, in torch."""

            def __init__(self, layer, connection="add"):
                super().__init__()
                if connection not in ("add", "cat"):
                    raise ValueError(f"TorchSkipConnection: connection must be 'add' or 'cat', got {connection!r}")
                self.layer, self.connection = layer, connection

            def forward(self, x):
                y = self.layer(x)
                return y + x if self.connection == "add" else torch_cat([y, x], 1)

            def extra_repr(self):
                return f"connection={self.connection!r}"

        class TorchSequence(nn.Module):
            """triflux's RNN/LSTM/GRU in torch: the batch-first ``rnn`` module's
            output sequence only, so it chains with Linear in nn.Sequential as
            the triflux layer chains with Dense."""

            def __init__(self, rnn):
                super().__init__()
                self.rnn = rnn

            def forward(self, x):
                return self.rnn(x)[0]

        for cls in (TorchSkipConnection, TorchSequence):
            cls.__module__ = HOME
            cls.__qualname__ = cls.__name__   # picklable as triflux.interop.<name>
            _TORCH_CLASSES[cls.__name__] = cls
    return _TORCH_CLASSES


def torch_class(name):
    """The torch module class called ``name`` in a Conversion's ``torch``: one
    of torch.nn's, or one of :data:`OWN_TORCH_MODULES`."""
    return torch_classes()[name] if name in OWN_TORCH_MODULES else getattr(import_torch().nn, name)
