"""The conversion table, ``CONVERSIONS``: every supported pair of a torch
module and a triflux layer or function, and the two entry points that walk a
model through it, :func:`from_torch` and :func:`to_torch` (the pairs are
listed in the package's docstring, ``pydoc triflux.interop``).

Supporting another layer is one entry here: its functions go in the module
of its family (:mod:`.dense`, :mod:`.spatial`, :mod:`.norm`,
:mod:`.recurrent`, :mod:`.activations`, :mod:`.containers`);
``SUPPORTED_TORCH`` and the error messages are read from the table.
"""
from triflux import activations as A
from triflux.devices import as_device
from triflux.functor import is_layer
from triflux.layers import (AdaptiveMaxPool, AdaptiveMeanPool, BatchNorm, Chain, Conv, ConvTranspose, CrossCor,
                            DepthwiseConv, Dense, Dropout, Embedding, EmbeddingBag, GlobalMaxPool, GlobalMeanPool,
                            GroupNorm, InstanceNorm, LayerNorm, MaxPool, MeanPool, PixelShuffle, RMSNorm, SkipConnection, Upsample, flatten)
from triflux.moving import move
from .activations import (activation, elu_from_torch, elu_to_torch, gelu_from_torch, gelu_to_torch,
                          leakyrelu_from_torch, leakyrelu_to_torch, logsoftmax_implicit, softmax,
                          softmax_implicit, softplus_from_torch)
from .containers import chain_from_torch, chain_to_torch, skip_from_torch, skip_to_torch, unet_to_torch
from .conversion import (FEEDING_RANKS, Conversion, FromOptions, convert_from, convert_to, install,
                         supported_torch)
from .dense import (dense_from_torch, dense_to_torch, dropout_from_torch, dropout_to_torch, flatten_from_torch,
                    flatten_to_torch)
from .embedding import embedding_bag_from_torch, embedding_bag_to_torch, embedding_from_torch, embedding_to_torch
from .norm import (batchnorm_from_torch, batchnorm_to_torch, groupnorm_from_torch, groupnorm_to_torch,
                   instancenorm_from_torch, instancenorm_to_torch, layernorm_from_torch, layernorm_to_torch,
                   rmsnorm_from_torch, rmsnorm_to_torch)
from .recurrent import RECURRENT, recurrent_from_torch, recurrent_to_torch, sequence_from_torch
from .spatial import (RANKS, adaptive_from_torch, adaptive_to_torch, conv_from_torch, conv_to_torch,
                      conv_transpose_from_torch, conv_transpose_to_torch, maxpool_from_torch, maxpool_to_torch,
                      meanpool_from_torch, meanpool_to_torch, pixel_shuffle_from_torch, pixel_shuffle_to_torch,
                      upsample_from_torch, upsample_to_torch)
from .torch_modules import import_torch

#: Every supported pair, in the order of the error messages. Adding a layer's
#: torch conversion is one entry here.
CONVERSIONS = (
    Conversion(("Sequential",), (Chain,), chain_from_torch, chain_to_torch),
    Conversion(("Linear",), (Dense,), dense_from_torch, dense_to_torch),
    Conversion(("Embedding",), (Embedding,), embedding_from_torch, embedding_to_torch),
    Conversion(("EmbeddingBag",), (EmbeddingBag,), embedding_bag_from_torch, embedding_bag_to_torch),
    Conversion(tuple(f"Conv{r}d" for r in RANKS), (Conv, CrossCor, DepthwiseConv), conv_from_torch,
               conv_to_torch),
    Conversion(tuple(f"ConvTranspose{r}d" for r in RANKS), (ConvTranspose,), conv_transpose_from_torch,
               conv_transpose_to_torch),
    Conversion(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"), (BatchNorm,), batchnorm_from_torch,
               batchnorm_to_torch),
    Conversion(("LayerNorm",), (LayerNorm,), layernorm_from_torch, layernorm_to_torch),
    Conversion(("GroupNorm",), (GroupNorm,), groupnorm_from_torch, groupnorm_to_torch),
    Conversion(tuple(f"InstanceNorm{r}d" for r in RANKS), (InstanceNorm,), instancenorm_from_torch,
               instancenorm_to_torch),
    Conversion(("RMSNorm",), (RMSNorm,), rmsnorm_from_torch, rmsnorm_to_torch),
    Conversion(tuple(f"MaxPool{r}d" for r in RANKS), (MaxPool,), maxpool_from_torch, maxpool_to_torch),
    Conversion(tuple(f"AvgPool{r}d" for r in RANKS), (MeanPool,), meanpool_from_torch, meanpool_to_torch),
    Conversion(tuple(f"AdaptiveAvgPool{r}d" for r in RANKS), (AdaptiveMeanPool, GlobalMeanPool),
               adaptive_from_torch(AdaptiveMeanPool, GlobalMeanPool), adaptive_to_torch("AdaptiveAvgPool")),
    Conversion(tuple(f"AdaptiveMaxPool{r}d" for r in RANKS), (AdaptiveMaxPool, GlobalMaxPool),
               adaptive_from_torch(AdaptiveMaxPool, GlobalMaxPool), adaptive_to_torch("AdaptiveMaxPool")),
    Conversion(("Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"), (Upsample,), upsample_from_torch,
               upsample_to_torch),
    Conversion(("PixelShuffle",), (PixelShuffle,), pixel_shuffle_from_torch, pixel_shuffle_to_torch),
    Conversion(("Dropout",), (Dropout,), dropout_from_torch, dropout_to_torch),
    Conversion(("Flatten",), (flatten,), flatten_from_torch, flatten_to_torch),
    activation("Identity", A.identity),
    activation("ReLU", A.relu),
    activation("Sigmoid", A.sigmoid),
    activation("Tanh", A.tanh),
    Conversion(("GELU",), (A.gelu, A.gelu_erf), gelu_from_torch, gelu_to_torch),
    activation("SiLU", A.swish),
    activation("Softplus", A.softplus, softplus_from_torch),
    Conversion(("ELU",), (A.elu,), elu_from_torch, elu_to_torch),
    Conversion(("LeakyReLU",), (A.leakyrelu,), leakyrelu_from_torch, leakyrelu_to_torch),
    softmax("Softmax", A.softmax, softmax_implicit),
    softmax("LogSoftmax", A.logsoftmax, logsoftmax_implicit),
    Conversion(tuple(RECURRENT), tuple(RECURRENT.values()), recurrent_from_torch, recurrent_to_torch),
    Conversion(("TorchSkipConnection",), (SkipConnection,), skip_from_torch, skip_to_torch,
               shown="SkipConnection(layer, +), SkipConnection(layer, models.cat_channels)"),
    Conversion(("TorchSequence",), (), sequence_from_torch, None),   # to_torch: the RNN, LSTM, GRU entry
    # models.UNet -> its Chain (one way: from torch it is the Chain it holds), by class name so
    # that interop does not import triflux.models
    Conversion((), (), None, unet_to_torch, triflux_names=("triflux.models.UNet",)),
)

install(CONVERSIONS)

#: The torch modules from_torch takes.
SUPPORTED_TORCH = supported_torch()


# --- from_torch -------------------------------------------------------------------------------

def from_torch(module, device=None, *, approximate_gelu=False, pin_modes=False):
    """The triflux model equivalent to ``torch.nn`` module ``module``, with
    copies of its weights on ``device`` (default the CPU device). See
    ``pydoc triflux.interop`` for the supported modules; anything else raises an
    ``InteropError`` naming its path in the tree (``model.3``).

    torch's exact ``GELU()`` becomes ``gelu_erf``; ``approximate_gelu=True``
    makes it the tanh ``gelu`` instead. ``pin_modes=True`` pins BatchNorm, InstanceNorm and Dropout of
    modules in training mode to training behaviour everywhere (as torch runs
    them) instead of triflux's automatic mode; eval-mode ones are pinned to
    test behaviour either way."""
    torch = import_torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    dev = as_device(device)
    layer = convert_from(module, "model", FromOptions(approximate_gelu, True if pin_modes else None))
    return layer if dev.is_cpu else move(layer, dev)


# --- to_torch ---------------------------------------------------------------------------------

def _layers_in_order(x):
    """Every layer of ``x`` (a layer, or lists, tuples and dicts of them), each
    before its children, in the order the model calls them."""
    if is_layer(x):
        yield x
        children = x._children().values()
    elif isinstance(x, (list, tuple)):
        children = x
    elif isinstance(x, dict):
        children = x.values()
    else:
        return
    for v in children:
        yield from _layers_in_order(v)


def _feeding_ranks(model):
    """{id(layer): rank} for the BatchNorms, InstanceNorms and global pools of
    ``model``: the spatial rank of the last layer before each, in the order
    the model calls them (a Dense's output (N, C) is torch's BatchNorm1d, as a
    sequence's (N, C, L))."""
    ranks, last = {}, None
    for x in _layers_in_order(model):
        if isinstance(x, (BatchNorm, InstanceNorm, GlobalMeanPool, GlobalMaxPool)) and last is not None:
            ranks[id(x)] = last
        elif isinstance(x, (Conv, ConvTranspose)):
            last = x.weight.ndim - 2
        elif isinstance(x, (MaxPool, MeanPool)):
            last = len(x.window)
        elif isinstance(x, (AdaptiveMaxPool, AdaptiveMeanPool)):
            last = len(x.out)
        elif isinstance(x, Dense):
            last = 1
    return ranks


def to_torch(model):
    """The ``torch.nn`` module equivalent to triflux ``model`` (a layer, a
    Chain, or an activation function), with copies of its weights on the torch
    device matching their triflux device. Unsupported layers raise an
    ``InteropError`` naming their path (``model.layers[2]``)."""
    import_torch()
    FEEDING_RANKS.clear()
    FEEDING_RANKS.update(_feeding_ranks(model))
    try:
        mod = convert_to(model, "model")
    finally:
        FEEDING_RANKS.clear()
    modes = [x.active for x in _layers_in_order(model) if "active" in vars(x)]
    if modes and all(m is False for m in modes):   # a model in test mode: the whole module in eval mode
        mod.eval()
    return mod
