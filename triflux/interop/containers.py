"""The containers' conversions, which convert their children in turn:
Sequential <-> Chain, ``TorchSkipConnection`` <-> ``SkipConnection(layer,
+)`` and a UNET's ``SkipConnection(layer, models.cat_channels)``, and
``models.UNet`` -> the Sequential of its Chain."""
import operator
from collections import OrderedDict

from triflux import ops
from triflux.functor import path_join
from triflux.layers import Chain, SkipConnection
from triflux.show import fname
from .conversion import convert_from, convert_to, refuse_to
from .torch_modules import import_torch, torch_classes


# Sequential <-> Chain

def chain_from_torch(m, path, options):
    """Children named ``"0", "1", ...`` give a positional Chain, other names a named one."""
    names = [n for n, _ in m.named_children()]
    layers = [convert_from(c, f"{path}.{n}", options) for n, c in m.named_children()]
    if names == [str(i) for i in range(len(names))]:
        return Chain(*layers)
    return Chain(**dict(zip(names, layers)))


def chain_to_torch(x, path):
    nn = import_torch().nn
    if isinstance(x.layers, dict):
        return nn.Sequential(OrderedDict((k, convert_to(v, path_join(path + ".layers", k)))
                                         for k, v in x.layers.items()))
    return nn.Sequential(*[convert_to(v, f"{path}.layers[{i}]") for i, v in enumerate(x.layers)])


# TorchSkipConnection <-> SkipConnection(layer, +) and SkipConnection(layer, models.cat_channels)

def _cat_channels():
    from triflux.models import cat_channels     # models imports layers only when a UNET is converted
    return cat_channels


def skip_from_torch(m, path, options):
    connection = _cat_channels() if getattr(m, "connection", "add") == "cat" else operator.add
    return SkipConnection(convert_from(m.layer, f"{path}.layer", options), connection)


def skip_to_torch(x, path):
    if x.connection in (operator.add, ops.add):
        connection = "add"
    elif x.connection is _cat_channels():
        connection = "cat"
    else:
        refuse_to(path, f"SkipConnection with connection {fname(x.connection)}",
                  "only `+` (operator.add / triflux.ops.add) and a UNET's channel concatenation "
                  "(triflux.models.cat_channels) translate, to triflux.interop.TorchSkipConnection")
    return torch_classes()["TorchSkipConnection"](convert_to(x.layer, f"{path}.layer"), connection)


# models.UNet -> its Chain (a UNET is a Chain of Conv, BatchNorm, MaxPool, ConvTranspose and skips)

def unet_to_torch(x, path):
    return convert_to(x.net, f"{path}.net")
