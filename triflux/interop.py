"""PyTorch interop and DLPack: models and tensors to and from torch (and any
DLPack producer or consumer: NumPy, CuPy, JAX).

Models
------
``from_torch(module, device=None)`` translates a ``torch.nn`` module tree into
the equivalent triflux model with copies of its weights (PyTorch's layouts are
triflux's, so nothing is flipped or transposed); ``to_torch(model)`` goes the
other way. One torch module becomes one triflux layer or function (no fusing),
so ``to_torch(from_torch(m))`` has ``m``'s ``state_dict`` keys and values:

================================  ==================================================
torch.nn                          triflux
================================  ==================================================
Sequential                        Chain (children named ``"0", "1", ...`` become a
                                  positional Chain, other names a named one)
Linear                            Dense
Conv1d/2d/3d                      Conv (``padding_mode`` as ``pad_mode``); CrossCor
                                  and DepthwiseConv go to torch as Conv1d/2d/3d too
ConvTranspose1d/2d/3d             ConvTranspose (``output_padding`` kept)
BatchNorm1d/2d/3d                 BatchNorm (``affine`` and ``track_running_stats``
                                  True, a numeric ``momentum``)
MaxPool1d/2d/3d, AvgPool1d/2d/3d  MaxPool, MeanPool (``dilation``, ``ceil_mode``,
                                  ``count_include_pad`` kept; no ``divisor_override``)
AdaptiveAvgPool1d/2d/3d,          AdaptiveMeanPool, AdaptiveMaxPool (any output size,
AdaptiveMaxPool1d/2d/3d           ``None`` sides kept); of size 1: GlobalMeanPool,
                                  GlobalMaxPool (to torch: the rank of the layer
                                  before it, else 2d; BatchNorm likewise)
Upsample, UpsamplingNearest2d,    Upsample (nearest, linear, bilinear, trilinear,
UpsamplingBilinear2d              ``size`` or ``scale_factor``, ``align_corners``
                                  kept; "nearest-exact" only with integer factors)
PixelShuffle                      PixelShuffle (torch's shuffles images only)
Dropout                           Dropout
Flatten (start_dim=1, end_dim=-1) flatten
Identity, ReLU, Sigmoid, Tanh,    identity, relu, sigmoid, tanh, gelu_erf, gelu
GELU(), GELU(approximate="tanh"), (see below), swish, softplus, elu, leakyrelu,
SiLU, Softplus, ELU, LeakyReLU,   softmax, logsoftmax (with their arguments:
Softmax, LogSoftmax               ``leakyrelu(a=0.2)``, ``softmax(dims=-1)``)
================================  ==================================================

torch's default ``GELU()`` is the exact erf form, triflux's (and NNlib's)
``gelu_erf``; ``GELU(approximate="tanh")`` is the tanh approximation,
triflux's (and NNlib's) ``gelu`` (they differ by up to about 5e-4). With
``approximate_gelu=True`` an exact ``GELU()`` becomes the tanh ``gelu`` too.

Modes: a torch module in eval mode (``.training`` False) gives a BatchNorm or
Dropout pinned to test behaviour (``active=False``, as ``testmode``); one in
training mode gives triflux's automatic mode (training inside ``gradient``,
testing outside, as in Flux), or with ``pin_modes=True`` one pinned to
training behaviour (``active=True``, as torch runs it). ``to_torch`` puts layers pinned to test mode
into eval mode and the rest into training mode (torch's default).

``to_torch`` maps a layer with an ``activation`` to ``Sequential(layer,
activation)`` (so a Chain's i-th layer stays the Sequential's i-th module),
``softmax``/``logsoftmax`` without ``dims`` to ``Softmax(dim=1)`` (triflux's
class axis for batched input); ``SkipConnection(layer, +)`` (a residual block, connection
``operator.add``/``triflux.ops.add``) and a UNET's skip (connection
``models.cat_channels``, the concatenation along the channels) become
``TorchSkipConnection``, a small torch module defined here that
``from_torch`` maps back; a ``models.UNet`` becomes the Sequential of its
Chain (which ``from_torch`` returns as that Chain).
``RNN``/``LSTM``/``GRU`` become ``TorchSequence(nn.RNN/LSTM/GRU(..., batch_first=True))``,
which returns the output sequence only (as the triflux layer does, so it
chains with ``Linear``); ``from_torch`` takes ``nn.RNN``/``LSTM``/``GRU``
(``num_layers > 1`` as a Chain, with Dropout between for ``dropout > 0``;
bidirectional, ``proj_size`` and ``bias=False`` are refused) and gives
batch-first layers whatever ``batch_first`` says. Other layers (``Parallel``,
skips with other connections, cells) raise an error naming their place in
the model.

Each supported pair is one ``Conversion`` in ``CONVERSIONS`` (torch module
classes, triflux layer classes or functions, and the functions between them);
``SUPPORTED_TORCH`` and the error messages are read from it, so supporting
another layer is one entry there.

Parameters keep their dtype (float64 stays float64) and are copied to
``device`` (``from_torch``; default the CPU) or to the torch device matching
the parameters' triflux device (``to_torch``: the CPU for the CPU device and
for the Triton interpreter's CUDA device, ``cuda:i`` on a real GPU).

Tensors (DLPack)
----------------
``from_dlpack(obj, device=None)`` accepts any object with ``__dlpack__``
(torch, NumPy >= 1.22, CuPy, JAX arrays) or a DLPack capsule and returns a
triflux ``Tensor`` sharing its memory where the device allows:

* CPU memory goes to ``CPUDevice`` as a NumPy array (``np.from_dlpack``, no
  copy). bfloat16, which NumPy's DLPack refuses, goes through torch and is
  viewed as an ``ml_dtypes.bfloat16`` array, still without a copy.
* CUDA (ROCm) memory goes to ``CUDADevice(id)`` (``AMDGPUDevice(id)``) as a
  torch tensor (``torch.from_dlpack``, no copy).
* Under the Triton interpreter the ``CUDADevice`` stores host memory, so a
  CPU producer may feed either device: by default it goes to ``CPUDevice``;
  ``from_dlpack(x, device=CUDADevice(0))`` gives the interpreter's device,
  still without a copy. Any other ``device`` than the producer's copies.

``to_dlpack(t)`` returns a DLPack capsule of a triflux Tensor (no copy),
``t.__dlpack__()``. Memory of the interpreter's ``CUDADevice`` is host
memory and is exported as kDLCPU.
"""
import importlib
import operator
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from . import activations as A
from . import backend, ops
from . import dtypes as _dt
from .devices import AMDGPUDevice, CUDADevice, as_device
from .errors import DTypeError, InteropError, TrifluxError
from .functor import is_layer, path_join
from .layers import (GRU, LSTM, RNN, AdaptiveMaxPool, AdaptiveMeanPool, BatchNorm, Chain, Conv, ConvTranspose,
                     CrossCor, DepthwiseConv, Dense, Dropout, GlobalMaxPool, GlobalMeanPool, MaxPool, MeanPool,
                     PixelShuffle, SkipConnection, Upsample, flatten)
from .layers.conv import same_padding
from .moving import move
from .show import fname
from .tensor import Tensor, as_tensor, numpy_to_torch, torch_to_numpy, transfer


# --- torch, lazily ----------------------------------------------------------------------------

def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise InteropError("PyTorch interop needs torch; install it (`pip install torch`, or "
                           "`pip install triflux[gpu]`)") from None


def _torch_name(cls):
    torch = _torch()
    name = cls.__name__
    if getattr(torch.nn, name, None) is cls:
        return f"torch.nn.{name}"
    return f"{cls.__module__}.{cls.__qualname__}"


#: The torch modules triflux defines (see _torch_classes).
_OWN_TORCH_MODULES = ("TorchSkipConnection", "TorchSequence")
_TORCH_CLASSES = {}


def _torch_classes():
    """The torch modules triflux defines (created on first use, so that
    importing triflux does not import torch)."""
    if not _TORCH_CLASSES:
        nn, torch_cat = _torch().nn, _torch().cat

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
            cls.__module__ = __name__
            cls.__qualname__ = cls.__name__   # picklable as triflux.interop.<name>
            _TORCH_CLASSES[cls.__name__] = cls
    return _TORCH_CLASSES


def __getattr__(name):   # `triflux.interop.TorchSkipConnection` (also makes it picklable)
    if name in _OWN_TORCH_MODULES:
        return _torch_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_class(name):
    """The torch module class called ``name`` in a Conversion's ``torch``."""
    return _torch_classes()[name] if name in _OWN_TORCH_MODULES else getattr(_torch().nn, name)


# --- activations with arguments ---------------------------------------------------------------

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


def _torch_implicit_softmax_axis(x):
    """torch's (deprecated) axis choice for ``Softmax(dim=None)``."""
    return 0 if x.ndim in (0, 1, 3) else 1


def _softmax_implicit(x):
    x = as_tensor(x)
    return ops.softmax(x, _torch_implicit_softmax_axis(x))


def _logsoftmax_implicit(x):
    x = as_tensor(x)
    return ops.logsoftmax(x, _torch_implicit_softmax_axis(x))


_softmax_implicit.__name__ = "softmax_torch_implicit_dim"
_logsoftmax_implicit.__name__ = "logsoftmax_torch_implicit_dim"


# --- arrays between torch and triflux ---------------------------------------------------------

def _array(p):
    """A NumPy copy of torch tensor ``p`` (bfloat16 as ml_dtypes.bfloat16)."""
    torch = _torch()
    if p.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise DTypeError(f"parameter of torch dtype {p.dtype} is not supported; use a floating dtype")
    return torch_to_numpy(p.detach())


def _tensor(p):
    """A triflux Tensor (CPU) copy of torch tensor ``p``."""
    return Tensor._from_numpy(_array(p))


def _tdev(t):
    """The torch device holding triflux Tensor ``t``'s memory."""
    return _torch().device("cpu") if t.device.is_cpu else t.device.torch_device


def _tdtype(t):
    """Triflux Tensor ``t``'s dtype in torch."""
    if _dt.is_bfloat16(t.dtype):
        return _torch().bfloat16
    return _dt.to_torch(t.dtype)


def _set_params(mod, **tensors):
    """``mod`` with its parameters and buffers ``tensors`` (triflux Tensors, None skipped) copied in."""
    with _torch().no_grad():
        for name, t in tensors.items():
            if t is not None:
                target = getattr(mod, name)
                target.copy_(numpy_to_torch(t.numpy(), target.device))
    return mod


# --- the conversion table ---------------------------------------------------------------------

@dataclass(frozen=True)
class Conversion:
    """One supported pair: the torch modules named in ``torch`` and the triflux
    layer classes (matched by exact type) or functions (matched by identity;
    an ``Activation`` by its ``fn``) in ``triflux``.

    ``from_torch(module, path, options)`` builds the triflux layer (``options``
    is a ``FromOptions``); ``to_torch(x, path)`` builds the torch module. Either
    may be None for a one-way entry. ``path`` names the place in the model for
    errors. ``shown`` lists the triflux side in to_torch's error where its names
    do not say enough."""
    torch: tuple
    triflux: tuple
    from_torch: Optional[Callable]
    to_torch: Optional[Callable]
    shown: str = ""


@dataclass(frozen=True)
class FromOptions:
    """from_torch's options, passed down the module tree."""
    approximate_gelu: bool = False
    train_active: Optional[bool] = None   # the mode of BatchNorm/Dropout in training mode: automatic or pinned


def _refuse_from(path, m, what, fix=""):
    raise InteropError(f"{path} ({_torch_name(type(m))}): {what} is not supported by triflux"
                       + (f"; {fix}" if fix else ""))


def _refuse_to(path, what, fix=""):
    raise InteropError(f"{path} ({what}) cannot be translated to torch" + (f"; {fix}" if fix else ""))


def _mode(m, options):
    """``active`` of the triflux layer for torch module ``m``: pinned to test
    behaviour in eval mode, ``options.train_active`` in training mode."""
    return options.train_active if m.training else False


def _with_activation(mod, layer, path):
    """``mod``, followed by ``layer``'s activation when it has one."""
    act = getattr(layer, "activation", None)
    if act is None or act is A.identity:
        return mod
    return _torch().nn.Sequential(mod, _to(act, f"{path}.activation"))


def _arguments(x, path, *names):
    """The keyword arguments of activation ``x``: none for the bare function,
    an ``Activation``'s own when they are among ``names`` (refused otherwise)."""
    if not isinstance(x, Activation):
        return {}
    if names and set(x.kwargs) <= set(names):
        return x.kwargs
    _refuse_to(path, f"activation {x.__name__}")


# Sequential <-> Chain

def _chain_from_torch(m, path, options):
    names = [n for n, _ in m.named_children()]
    layers = [_from(c, f"{path}.{n}", options) for n, c in m.named_children()]
    if names == [str(i) for i in range(len(names))]:
        return Chain(*layers)
    return Chain(**dict(zip(names, layers)))


def _chain_to_torch(x, path):
    nn = _torch().nn
    if isinstance(x.layers, dict):
        return nn.Sequential(OrderedDict((k, _to(v, path_join(path + ".layers", k))) for k, v in x.layers.items()))
    return nn.Sequential(*[_to(v, f"{path}.layers[{i}]") for i, v in enumerate(x.layers)])


# Linear <-> Dense

def _dense_from_torch(m, path, options):
    w = _array(m.weight)
    layer = Dense(m.in_features, m.out_features, init=lambda *s: w, dtype=w.dtype, bias=m.bias is not None)
    if m.bias is not None:
        layer.bias = _tensor(m.bias)
    return layer


def _dense_to_torch(x, path):
    w = x.weight
    mod = _torch().nn.Linear(w.shape[1], w.shape[0], bias=x.bias is not None, dtype=_tdtype(w), device=_tdev(w))
    return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)


# Conv1d/2d/3d <-> Conv (CrossCor, DepthwiseConv), ConvTranspose1d/2d/3d <-> ConvTranspose

#: the spatial ranks of torch's rank-specific modules ("Conv1d", "MaxPool3d", ...)
_RANKS = (1, 2, 3)


def _rank_of(m):
    """The spatial rank of torch module ``m`` of a rank-specific class (``Conv3d``: 3)."""
    return int(type(m).__name__[-2])


def _ntuple(v, rank):
    """A torch module's int-or-tuple option as ``rank`` entries."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * rank


def _symmetric(pad):
    """One padding per axis where a flat (lo, hi, ...) padding is symmetric, else None."""
    lo, hi = pad[::2], pad[1::2]
    return tuple(lo) if lo == hi else None


def _conv_from_torch(m, path, options):
    rank = _rank_of(m)
    pad = {"same": "same", "valid": 0}[m.padding] if isinstance(m.padding, str) else _ntuple(m.padding, rank)
    w = _array(m.weight)
    layer = Conv(_ntuple(m.kernel_size, rank), m.in_channels, m.out_channels, stride=_ntuple(m.stride, rank),
                 pad=pad, dilation=_ntuple(m.dilation, rank), groups=m.groups, bias=m.bias is not None,
                 init=lambda *s: w, dtype=w.dtype, pad_mode=m.padding_mode)
    if m.bias is not None:
        layer.bias = _tensor(m.bias)
    return layer


def _conv_to_torch(x, path):
    w = x.weight
    rank, kernel = w.ndim - 2, tuple(w.shape[2:])
    padding = _symmetric(x.pad)
    if padding is None:
        if all(s == 1 for s in x.stride) and x.pad == same_padding(kernel, x.dilation):
            padding = "same"
        else:
            _refuse_to(path, f"{type(x).__name__} with asymmetric pad={x.pad}",
                       f"torch's Conv{rank}d pads symmetrically (or 'same')")
    mod = getattr(_torch().nn, f"Conv{rank}d")(w.shape[1] * x.groups, w.shape[0], kernel, stride=x.stride,
                                               padding=padding, dilation=x.dilation, groups=x.groups,
                                               bias=x.bias is not None, padding_mode=x.pad_mode,
                                               dtype=_tdtype(w), device=_tdev(w))
    return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)


def _conv_transpose_from_torch(m, path, options):
    rank = _rank_of(m)
    if m.padding_mode != "zeros":
        _refuse_from(path, m, f"padding_mode={m.padding_mode!r}", f"ConvTranspose{rank}d only has 'zeros'")
    w = _array(m.weight)
    layer = ConvTranspose(_ntuple(m.kernel_size, rank), m.in_channels, m.out_channels,
                          stride=_ntuple(m.stride, rank), pad=_ntuple(m.padding, rank),
                          outpad=_ntuple(m.output_padding, rank), dilation=_ntuple(m.dilation, rank),
                          groups=m.groups, bias=m.bias is not None, init=lambda *s: w, dtype=w.dtype)
    if m.bias is not None:
        layer.bias = _tensor(m.bias)
    return layer


def _conv_transpose_to_torch(x, path):
    w = x.weight
    rank = w.ndim - 2
    padding = _symmetric(x.pad)
    if padding is None:
        _refuse_to(path, f"ConvTranspose with asymmetric pad={x.pad}",
                   f"torch's ConvTranspose{rank}d pads symmetrically")
    mod = getattr(_torch().nn, f"ConvTranspose{rank}d")(
        w.shape[0], w.shape[1] * x.groups, tuple(w.shape[2:]), stride=x.stride, padding=padding,
        output_padding=x.outpad, groups=x.groups, bias=x.bias is not None, dilation=x.dilation,
        dtype=_tdtype(w), device=_tdev(w))
    return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)


# BatchNorm1d/2d/3d <-> BatchNorm

def _batchnorm_from_torch(m, path, options):
    if not m.affine:
        _refuse_from(path, m, "affine=False", "use affine=True (triflux's BatchNorm always has γ and β)")
    if not m.track_running_stats:
        _refuse_from(path, m, "track_running_stats=False",
                     "use track_running_stats=True (triflux's BatchNorm keeps running statistics)")
    if m.momentum is None:
        _refuse_from(path, m, "momentum=None (a cumulative average)", "give a number, e.g. momentum=0.1")
    w = _array(m.weight)
    layer = BatchNorm(m.num_features, eps=m.eps, momentum=m.momentum, dtype=w.dtype)
    layer.weight, layer.bias = Tensor._from_numpy(w), _tensor(m.bias)
    layer.running_mean, layer.running_var = _tensor(m.running_mean), _tensor(m.running_var)
    layer.active = _mode(m, options)
    # kept for to_torch (torch only reads it when momentum is None)
    layer._torch = {"class": type(m).__name__, "num_batches_tracked": int(m.num_batches_tracked)}
    return layer


def _batchnorm_to_torch(x, path):
    w = x.weight
    info = getattr(x, "_torch", {})
    # torch's class by the rank of what feeds it (a triflux BatchNorm takes any): the one it came
    # from, else that of the layer before it in the model (Dense: 1d, Conv((3, 3, 3)): 3d), else 2d
    cls = getattr(_torch().nn, info.get("class", f"BatchNorm{_FEEDING_RANKS.get(id(x), 2)}d"))
    mod = cls(w.shape[0], eps=x.eps, momentum=x.momentum, dtype=_tdtype(w), device=_tdev(w))
    _set_params(mod, weight=w, bias=x.bias, running_mean=x.running_mean, running_var=x.running_var)
    mod.num_batches_tracked.fill_(info.get("num_batches_tracked", 0))
    mod.train(x.active is not False)
    return _with_activation(mod, x, path)


# MaxPool1d/2d/3d <-> MaxPool, AvgPool1d/2d/3d <-> MeanPool

def _maxpool_from_torch(m, path, options):
    if m.return_indices:
        _refuse_from(path, m, "return_indices=True")
    rank = _rank_of(m)
    window = _ntuple(m.kernel_size, rank)
    return MaxPool(window, stride=_ntuple(m.stride, rank) if m.stride is not None else window,
                   pad=_ntuple(m.padding, rank), dilation=_ntuple(m.dilation, rank), ceil_mode=m.ceil_mode)


def _meanpool_from_torch(m, path, options):
    if getattr(m, "divisor_override", None) is not None:
        _refuse_from(path, m, f"divisor_override={m.divisor_override}",
                     "MeanPool divides by the window's size (count_include_pad=True) or its pixels inside the input")
    rank = _rank_of(m)
    window = _ntuple(m.kernel_size, rank)
    return MeanPool(window, stride=_ntuple(m.stride, rank) if m.stride is not None else window,
                    pad=_ntuple(m.padding, rank), ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)


def _torch_pool_padding(x, path):
    """torch's ``padding`` for pool layer ``x``: symmetric and at most half the window."""
    name = type(x).__name__
    padding = _symmetric(x.pad)
    if padding is None:
        _refuse_to(path, f"{name} with asymmetric pad={x.pad}", "torch pools pad symmetrically")
    if any(2 * p > k for p, k in zip(padding, x.window)):
        _refuse_to(path, f"{name} with pad={x.pad} more than half the window {x.window}", "torch refuses such padding")
    return padding


def _maxpool_to_torch(x, path):
    return getattr(_torch().nn, f"MaxPool{len(x.window)}d")(x.window, stride=x.stride,
                                                           padding=_torch_pool_padding(x, path),
                                                           dilation=x.dilation, ceil_mode=x.ceil_mode)


def _meanpool_to_torch(x, path):
    return getattr(_torch().nn, f"AvgPool{len(x.window)}d")(x.window, stride=x.stride,
                                                           padding=_torch_pool_padding(x, path),
                                                           ceil_mode=x.ceil_mode, count_include_pad=x.count_include_pad)


# AdaptiveAvgPool1d/2d/3d <-> AdaptiveMeanPool (GlobalMeanPool from and to the 2-d one of size 1),
# AdaptiveMaxPool1d/2d/3d <-> AdaptiveMaxPool (GlobalMaxPool likewise)

def _adaptive_from_torch(adaptive, global_):
    """from_torch for an adaptive pool: ``global_()`` for the 2-d one of output
    size 1 (as Flux's global pools serve images), else ``adaptive(output_size)``."""
    def from_torch(m, path, options):
        if getattr(m, "return_indices", False):
            _refuse_from(path, m, "return_indices=True")
        rank = _rank_of(m)
        size = _ntuple(m.output_size, rank)
        if size == (1,) * rank:
            return global_()
        return adaptive(size)
    return from_torch


def _adaptive_to_torch(torch_prefix):
    def to_torch(x, path):
        if isinstance(x, (GlobalMeanPool, GlobalMaxPool)):
            # the rank of what feeds it (2 when nothing says): torch's adaptive pools are rank-specific
            return getattr(_torch().nn, f"{torch_prefix}{_FEEDING_RANKS.get(id(x), 2)}d")(1)
        return getattr(_torch().nn, f"{torch_prefix}{len(x.out)}d")(x.out)
    return to_torch


# Upsample, UpsamplingNearest2d, UpsamplingBilinear2d <-> Upsample

#: torch's interpolation modes triflux's Upsample has
_UPSAMPLE_MODES = ("nearest", "linear", "bilinear", "trilinear")


def _upsample_from_torch(m, path, options):
    mode = m.mode
    if mode == "nearest-exact":        # the same index rule as "nearest" for integer factors only
        sf = m.scale_factor if isinstance(m.scale_factor, tuple) else (m.scale_factor,)
        if m.scale_factor is None or any(float(s) != int(s) for s in sf):
            _refuse_from(path, m, "mode='nearest-exact' with a size or a non-integer scale_factor",
                         "use mode='nearest' (torch's nearest index rule) or an integer scale_factor")
        mode = "nearest"
    if mode not in _UPSAMPLE_MODES:
        _refuse_from(path, m, f"mode={m.mode!r}", f"use one of {', '.join(_UPSAMPLE_MODES)}")
    if m.scale_factor is not None and m.recompute_scale_factor:
        _refuse_from(path, m, "recompute_scale_factor=True",
                     "triflux's Upsample(scale=...) uses the given factor, as torch's default; give size=(...) "
                     "for the output-size rule")
    return Upsample(mode, size=m.size, scale=m.scale_factor,
                    align_corners=bool(m.align_corners) if mode != "nearest" else False)


def _upsample_to_torch(x, path):
    scale = None if x.scale is None else tuple(float(s) for s in x.scale) if isinstance(x.scale, tuple) \
        else float(x.scale)
    if x.mode != "nearest":
        return _torch().nn.Upsample(size=x.size, scale_factor=scale, mode=x.mode, align_corners=x.align_corners)
    return _torch().nn.Upsample(size=x.size, scale_factor=scale, mode="nearest")


# PixelShuffle <-> PixelShuffle (torch's shuffles the last two axes: images)

def _pixel_shuffle_from_torch(m, path, options):
    return PixelShuffle(m.upscale_factor)


def _pixel_shuffle_to_torch(x, path):
    return _torch().nn.PixelShuffle(x.r)


# Dropout <-> Dropout

def _dropout_from_torch(m, path, options):
    layer = Dropout(m.p)
    layer.active = _mode(m, options)
    return layer


def _dropout_to_torch(x, path):
    mod = _torch().nn.Dropout(x.p)
    mod.train(x.active is not False)
    return mod


# Flatten <-> flatten

def _flatten_from_torch(m, path, options):
    if m.start_dim != 1 or m.end_dim != -1:
        _refuse_from(path, m, f"start_dim={m.start_dim}, end_dim={m.end_dim}",
                     "triflux's flatten keeps axis 0 and flattens the rest (start_dim=1, end_dim=-1)")
    return flatten


def _flatten_to_torch(x, path):
    return _torch().nn.Flatten()


# activations

def _activation(torch_name, fn, from_torch=None):
    """The Conversion of an activation without arguments: ``torch_name()``
    <-> ``fn`` (``from_torch`` checks the torch module's options, if any)."""
    def to_torch(x, path):
        _arguments(x, path)
        return getattr(_torch().nn, torch_name)()
    return Conversion((torch_name,), (fn,), from_torch or (lambda m, path, options: fn), to_torch)


def _gelu_from_torch(m, path, options):
    if m.approximate == "tanh" or options.approximate_gelu:
        return A.gelu
    if m.approximate == "none":
        return A.gelu_erf
    _refuse_from(path, m, f"GELU(approximate={m.approximate!r})", "use approximate='none' or 'tanh'")


def _gelu_to_torch(x, path):
    _arguments(x, path)
    return _torch().nn.GELU(approximate="tanh") if x is A.gelu else _torch().nn.GELU()


def _softplus_from_torch(m, path, options):
    if m.beta != 1:
        _refuse_from(path, m, f"beta={m.beta}", "triflux's softplus has beta=1")
    return A.softplus


def _elu_from_torch(m, path, options):
    return A.elu if m.alpha == 1.0 else Activation(A.elu, alpha=float(m.alpha))


def _elu_to_torch(x, path):
    return _torch().nn.ELU(_arguments(x, path, "alpha").get("alpha", 1.0))


def _leakyrelu_from_torch(m, path, options):
    return A.leakyrelu if m.negative_slope == 0.01 else Activation(A.leakyrelu, a=float(m.negative_slope))


def _leakyrelu_to_torch(x, path):
    return _torch().nn.LeakyReLU(_arguments(x, path, "a").get("a", 0.01))


def _softmax(torch_name, fn, implicit):
    """The Conversion torch_name(dim) <-> fn(dims=dim); ``dim=None`` (torch's
    deprecated implicit axis) <-> ``implicit``, and ``fn`` itself to dim=1
    (triflux's class axis for batched input)."""
    def from_torch(m, path, options):
        return implicit if m.dim is None else Activation(fn, dims=int(m.dim))

    def to_torch(x, path):
        cls = getattr(_torch().nn, torch_name)
        if x is implicit:
            return cls()
        dims = _arguments(x, path, "dims").get("dims")
        return cls(dim=1 if dims is None else dims)
    return Conversion((torch_name,), (fn, implicit), from_torch, to_torch)


# RNN, LSTM, GRU <-> RNN, LSTM, GRU (as TorchSequence)

_RECURRENT = {"RNN": RNN, "LSTM": LSTM, "GRU": GRU}   # torch.nn's name: triflux's layer
_RNN_NONLINEARITIES = {"tanh": A.tanh, "relu": A.relu}


def _recurrent_from_torch(m, path, options):
    """torch.nn.RNN/LSTM/GRU as triflux's layer of the same name (a Chain of
    them, with Dropout between, for ``num_layers > 1``). triflux's layers are
    batch-first and return the output sequence only, whatever ``batch_first``
    says: feed them (N, L, in)."""
    cls = _RECURRENT[type(m).__name__]
    if m.bidirectional:
        _refuse_from(path, m, "bidirectional=True", "triflux's recurrent layers run forward in time; run a "
                     "second layer on the time-reversed sequence and concat the outputs")
    if getattr(m, "proj_size", 0):
        _refuse_from(path, m, f"proj_size={m.proj_size}")
    if not m.bias:
        _refuse_from(path, m, "bias=False", "triflux's recurrent layers have bias_ih and bias_hh")
    layers = []
    for k in range(m.num_layers):
        ins = m.input_size if k == 0 else m.hidden_size
        w = _array(getattr(m, f"weight_ih_l{k}"))
        activation = (_RNN_NONLINEARITIES[m.nonlinearity],) if cls is RNN else ()
        layer = cls(ins, m.hidden_size, *activation, dtype=w.dtype)
        for field in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(layer, field, _tensor(getattr(m, f"{field}_l{k}")))
        if k and m.dropout:
            drop = Dropout(m.dropout)
            drop.active = _mode(m, options)
            layers.append(drop)
        layers.append(layer)
    return layers[0] if len(layers) == 1 else Chain(*layers)


def _recurrent_to_torch(x, path):
    nn = _torch().nn
    name = type(x).__name__
    if x.return_state:
        _refuse_to(path, f"{name} with return_state=True", "a layer returning its state does not chain; "
                   "use return_state=False and call the torch module directly for the state")
    w = x.weight_ih
    kw = dict(batch_first=True, dtype=_tdtype(w), device=_tdev(w))
    if type(x) is RNN:
        nonlinearity = {f: n for n, f in _RNN_NONLINEARITIES.items()}[x.activation]
        mod = nn.RNN(x.in_features, x.out_features, nonlinearity=nonlinearity, **kw)
    else:
        mod = getattr(nn, name)(x.in_features, x.out_features, **kw)
    _set_params(mod, weight_ih_l0=x.weight_ih, weight_hh_l0=x.weight_hh, bias_ih_l0=x.bias_ih,
                bias_hh_l0=x.bias_hh)
    return _torch_classes()["TorchSequence"](mod)


def _sequence_from_torch(m, path, options):
    return _recurrent_from_torch(m.rnn, f"{path}.rnn", options)


# TorchSkipConnection <-> SkipConnection(layer, +) and SkipConnection(layer, models.cat_channels)

def _cat_channels():
    from .models import cat_channels     # models imports layers only when a UNET is converted
    return cat_channels


def _skip_from_torch(m, path, options):
    connection = _cat_channels() if getattr(m, "connection", "add") == "cat" else operator.add
    return SkipConnection(_from(m.layer, f"{path}.layer", options), connection)


def _skip_to_torch(x, path):
    if x.connection in (operator.add, ops.add):
        connection = "add"
    elif x.connection is _cat_channels():
        connection = "cat"
    else:
        _refuse_to(path, f"SkipConnection with connection {fname(x.connection)}",
                   "only `+` (operator.add / triflux.ops.add) and a UNET's channel concatenation "
                   "(triflux.models.cat_channels) translate, to triflux.interop.TorchSkipConnection")
    return _torch_classes()["TorchSkipConnection"](_to(x.layer, f"{path}.layer"), connection)


# models.UNet -> its Chain (a UNET is a Chain of Conv, BatchNorm, MaxPool, ConvTranspose and skips)

def _unet_to_torch(x, path):
    return _to(x.net, f"{path}.net")


#: Every supported pair, in the order of the error messages. Adding a layer's
#: torch conversion is one entry here.
CONVERSIONS = (
    Conversion(("Sequential",), (Chain,), _chain_from_torch, _chain_to_torch),
    Conversion(("Linear",), (Dense,), _dense_from_torch, _dense_to_torch),
    Conversion(tuple(f"Conv{r}d" for r in _RANKS), (Conv, CrossCor, DepthwiseConv), _conv_from_torch,
               _conv_to_torch),
    Conversion(tuple(f"ConvTranspose{r}d" for r in _RANKS), (ConvTranspose,), _conv_transpose_from_torch,
               _conv_transpose_to_torch),
    Conversion(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"), (BatchNorm,), _batchnorm_from_torch,
               _batchnorm_to_torch),
    Conversion(tuple(f"MaxPool{r}d" for r in _RANKS), (MaxPool,), _maxpool_from_torch, _maxpool_to_torch),
    Conversion(tuple(f"AvgPool{r}d" for r in _RANKS), (MeanPool,), _meanpool_from_torch, _meanpool_to_torch),
    Conversion(tuple(f"AdaptiveAvgPool{r}d" for r in _RANKS), (AdaptiveMeanPool, GlobalMeanPool),
               _adaptive_from_torch(AdaptiveMeanPool, GlobalMeanPool), _adaptive_to_torch("AdaptiveAvgPool")),
    Conversion(tuple(f"AdaptiveMaxPool{r}d" for r in _RANKS), (AdaptiveMaxPool, GlobalMaxPool),
               _adaptive_from_torch(AdaptiveMaxPool, GlobalMaxPool), _adaptive_to_torch("AdaptiveMaxPool")),
    Conversion(("Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"), (Upsample,), _upsample_from_torch,
               _upsample_to_torch),
    Conversion(("PixelShuffle",), (PixelShuffle,), _pixel_shuffle_from_torch, _pixel_shuffle_to_torch),
    Conversion(("Dropout",), (Dropout,), _dropout_from_torch, _dropout_to_torch),
    Conversion(("Flatten",), (flatten,), _flatten_from_torch, _flatten_to_torch),
    _activation("Identity", A.identity),
    _activation("ReLU", A.relu),
    _activation("Sigmoid", A.sigmoid),
    _activation("Tanh", A.tanh),
    Conversion(("GELU",), (A.gelu, A.gelu_erf), _gelu_from_torch, _gelu_to_torch),
    _activation("SiLU", A.swish),
    _activation("Softplus", A.softplus, _softplus_from_torch),
    Conversion(("ELU",), (A.elu,), _elu_from_torch, _elu_to_torch),
    Conversion(("LeakyReLU",), (A.leakyrelu,), _leakyrelu_from_torch, _leakyrelu_to_torch),
    _softmax("Softmax", A.softmax, _softmax_implicit),
    _softmax("LogSoftmax", A.logsoftmax, _logsoftmax_implicit),
    Conversion(tuple(_RECURRENT), tuple(_RECURRENT.values()), _recurrent_from_torch, _recurrent_to_torch),
    Conversion(("TorchSkipConnection",), (SkipConnection,), _skip_from_torch, _skip_to_torch,
               shown="SkipConnection(layer, +), SkipConnection(layer, models.cat_channels)"),
    Conversion(("TorchSequence",), (), _sequence_from_torch, None),   # to_torch: the RNN, LSTM, GRU entry
)


def _index(pairs):
    """{key: Conversion} from (key, Conversion) pairs; a key in two entries is a mistake in the table."""
    index = {}
    for key, c in pairs:
        if key in index:
            raise TypeError(f"{getattr(key, '__name__', key)} is in two entries of triflux.interop.CONVERSIONS")
        index[key] = c
    return index


_FROM_TORCH = _index((name, c) for c in CONVERSIONS if c.from_torch for name in c.torch)
_TO_TORCH = _index((key, c) for c in CONVERSIONS if c.to_torch for key in c.triflux)

#: The torch modules from_torch takes.
SUPPORTED_TORCH = tuple(f"{__name__}.{name}" if name in _OWN_TORCH_MODULES else name for name in _FROM_TORCH)


@lru_cache(maxsize=None)
def _from_torch_classes():
    """{torch module class: its Conversion}, built on first use (it imports torch)."""
    return {_torch_class(name): c for name, c in _FROM_TORCH.items()}


def _supported_triflux():
    """What to_torch takes, as its error lists it."""
    layers, functions, activations = [], [], []
    for c in CONVERSIONS:
        if c.to_torch is None:
            continue
        if c.shown:
            (layers if isinstance(c.triflux[0], type) else functions).append(c.shown)
            continue
        for key in c.triflux:
            if getattr(key, "__module__", None) == __name__:   # made here (torch's implicit softmax axis)
                continue
            (layers if isinstance(key, type) else activations if key.__module__ == A.__name__
             else functions).append(key.__name__)
    return f"{', '.join(layers + functions)} and the activations {', '.join(activations)}"


# --- from_torch -------------------------------------------------------------------------------

def from_torch(module, device=None, *, approximate_gelu=False, pin_modes=False):
    """The triflux model equivalent to ``torch.nn`` module ``module``, with
    copies of its weights on ``device`` (default the CPU device). See this
    module's docstring for the supported modules; anything else raises an
    ``InteropError`` naming its path in the tree (``model.3``).

    torch's exact ``GELU()`` becomes ``gelu_erf``; ``approximate_gelu=True``
    makes it the tanh ``gelu`` instead. ``pin_modes=True`` pins BatchNorm and Dropout of
    modules in training mode to training behaviour everywhere (as torch runs
    them) instead of triflux's automatic mode; eval-mode ones are pinned to
    test behaviour either way."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    dev = as_device(device)
    layer = _from(module, "model", FromOptions(approximate_gelu, True if pin_modes else None))
    return layer if dev.is_cpu else move(layer, dev)


def _from(m, path, options):
    conversion = _from_torch_classes().get(type(m))
    if conversion is None:
        raise InteropError(f"{path} ({_torch_name(type(m))}) is not supported yet; supported: "
                           f"{', '.join(SUPPORTED_TORCH)}. Translate that part by hand (triflux layers take "
                           "PyTorch's weight layouts) or wrap the rest around it.")
    return conversion.from_torch(m, path, options)


# --- to_torch ---------------------------------------------------------------------------------

#: id(BatchNorm or global pool) -> the spatial rank of its input, for the model being translated
#: (:func:`_feeding_ranks`)
_FEEDING_RANKS = {}


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
    """{id(layer): rank} for the BatchNorms and global pools of ``model``: the
    spatial rank of the last layer before each, in the order the model calls
    them (a Dense's output (N, C) is torch's BatchNorm1d, as a sequence's
    (N, C, L))."""
    ranks, last = {}, None
    for x in _layers_in_order(model):
        if isinstance(x, (BatchNorm, GlobalMeanPool, GlobalMaxPool)) and last is not None:
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
    _torch()
    _FEEDING_RANKS.clear()
    _FEEDING_RANKS.update(_feeding_ranks(model))
    try:
        mod = _to(model, "model")
    finally:
        _FEEDING_RANKS.clear()
    modes = [x.active for x in _layers_in_order(model) if "active" in vars(x)]
    if modes and all(m is False for m in modes):   # a model in test mode: the whole module in eval mode
        mod.eval()
    return mod


#: models.UNet's conversion (one way: from torch it is the Chain it holds), looked up by class name
#: so that interop does not import triflux.models
_UNET = Conversion((), (), None, _unet_to_torch)


def _to_torch_conversion(x):
    """The Conversion for triflux layer or function ``x``, or None."""
    if is_layer(x):
        if type(x).__name__ == "UNet" and type(x).__module__ == "triflux.models":
            return _UNET
        return _TO_TORCH.get(type(x))
    if isinstance(x, type):
        return None
    try:
        return _TO_TORCH.get(x.fn if isinstance(x, Activation) else x)
    except TypeError:   # unhashable callables
        return None


def _to(x, path):
    conversion = _to_torch_conversion(x)
    if conversion is not None:
        return conversion.to_torch(x, path)
    if isinstance(x, Activation):
        _refuse_to(path, f"activation {x.__name__}")
    what = f"{type(x).__module__}.{type(x).__qualname__}" if is_layer(x) else f"function {fname(x)}"
    _refuse_to(path, what, f"supported: {_supported_triflux()}")


# --- DLPack -----------------------------------------------------------------------------------

#: DLPack device types (dlpack.h DLDeviceType)
kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM, kDLCUDAManaged = 1, 2, 3, 10, 13


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _dlpack_device(obj):
    if hasattr(obj, "__dlpack_device__"):
        kind, idx = obj.__dlpack_device__()
        return int(kind), int(idx)
    return None


def _on_interpreter_device(device):
    """Whether ``device`` is a Triton-interpreter device (host memory)."""
    return device is not None and not device.is_cpu and backend.interpreter_on() and \
        device.torch_device.type == "cpu"


def _check_torch_dtype(t):
    if t.dtype != _torch().bfloat16:
        _dt.from_torch(t.dtype)   # a DTypeError for complex and other unsupported dtypes


def _from_torch_tensor(t, device):
    """A triflux Tensor over torch tensor ``t``'s memory (no copy where the
    device allows), on ``device`` or else the device ``t`` lives on."""
    t = t.detach()
    _check_torch_dtype(t)
    if t.device.type == "cpu":
        if _on_interpreter_device(device):
            return Tensor._make(t, device)
        out = Tensor._from_numpy(_torch_cpu_to_numpy_view(t))
    elif t.device.type != "cuda":    # torch's ROCm builds call their devices "cuda" too
        raise TrifluxError(f"arrays on torch device {t.device} have no triflux device; copy them to the CPU first")
    else:
        if backend.interpreter_on():
            raise TrifluxError(f"a {t.device} array cannot become a triflux Tensor while the Triton "
                               "interpreter serves the CUDA device (TRITON_INTERPRET=1); copy it to the "
                               "CPU first")
        cls = AMDGPUDevice if getattr(_torch().version, "hip", None) else CUDADevice
        out = Tensor._make(t, cls(t.device.index or 0))
    return out if device is None else transfer(out, device)


def _torch_cpu_to_numpy_view(t):
    """A NumPy array over torch CPU tensor ``t``'s memory (bfloat16 viewed as
    ml_dtypes.bfloat16)."""
    torch = _torch()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_dt.bfloat16)
    return t.numpy()


def from_dlpack(obj, device=None):
    """A triflux Tensor over the memory of ``obj`` (any object with
    ``__dlpack__``, or a DLPack capsule), without a copy where possible. See
    this module's docstring for which device it lands on; ``device`` asks for
    one (copying unless it holds the producer's memory)."""
    dev = None if device is None else as_device(device)
    if isinstance(obj, Tensor):
        return obj if dev is None else transfer(obj, dev)
    if type(obj).__module__.startswith("torch") and hasattr(obj, "__dlpack__"):
        return _from_torch_tensor(obj, dev)
    if isinstance(obj, np.ndarray) and _dt.is_bfloat16(obj.dtype):   # not a DLPack dtype; shared all the same
        obj = Tensor._from_numpy(obj)
        return obj if dev is None else transfer(obj, dev)
    if _is_capsule(obj):
        return _from_torch_tensor(_torch().utils.dlpack.from_dlpack(obj), dev)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__ (a torch, NumPy, CuPy or JAX array) or a "
                        f"DLPack capsule, got {type(obj).__name__}")
    kind = _dlpack_device(obj)
    if kind is not None and kind[0] not in (kDLCPU, kDLCUDAHost):   # device memory: through torch
        return _from_torch_tensor(_torch().from_dlpack(obj), dev)
    try:
        arr = np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError) as e:   # bfloat16 and friends: through torch
        try:
            torch = _torch()
        except InteropError:
            raise DTypeError(f"NumPy cannot import this array through DLPack ({e}); with torch installed "
                             "triflux imports bfloat16 arrays too") from None
        return _from_torch_tensor(torch.from_dlpack(obj), dev)
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"dtype {arr.dtype} is not supported by triflux; use a float, integer or bool array")
    if _on_interpreter_device(dev):
        return Tensor._make(_torch().from_numpy(arr), dev)
    out = Tensor._from_numpy(arr)
    return out if dev is None else transfer(out, dev)


def to_dlpack(t):
    """A DLPack capsule over triflux Tensor ``t``'s memory (no copy), the
    legacy exchange (``torch.from_dlpack(capsule)``, CuPy's and older JAX's
    ``from_dlpack``). Consumers that want an object with ``__dlpack__``
    (``np.from_dlpack``, newer JAX) take the Tensor itself, whose protocol
    methods are ``Tensor.__dlpack__`` and ``Tensor.__dlpack_device__``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"to_dlpack expects a triflux Tensor, got {type(t).__name__}")
    return t.__dlpack__()
