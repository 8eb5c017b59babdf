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
Conv2d                            Conv (``padding_mode="zeros"`` only)
ConvTranspose2d                   ConvTranspose (``output_padding`` kept)
BatchNorm1d/2d/3d                 BatchNorm (``affine`` and ``track_running_stats``
                                  True, a numeric ``momentum``)
MaxPool2d, AvgPool2d              MaxPool, MeanPool (``dilation``, ``ceil_mode``,
                                  ``count_include_pad`` kept; no ``divisor_override``)
AdaptiveAvgPool2d, -MaxPool2d     AdaptiveMeanPool, AdaptiveMaxPool (any output size,
                                  ``None`` sides kept); of size 1: GlobalMeanPool,
                                  GlobalMaxPool
Upsample, UpsamplingNearest2d,    Upsample (nearest or bilinear, ``size`` or
UpsamplingBilinear2d              ``scale_factor``, ``align_corners`` kept;
                                  "nearest-exact" only with integer factors)
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
``operator.add``/``triflux.ops.add``) becomes ``TorchSkipConnection``, a
small torch module defined here that ``from_torch`` maps back.
``RNN``/``LSTM``/``GRU`` become ``TorchSequence(nn.RNN/LSTM/GRU(..., batch_first=True))``,
which returns the output sequence only (as the triflux layer does, so it
chains with ``Linear``); ``from_torch`` takes ``nn.RNN``/``LSTM``/``GRU``
(``num_layers > 1`` as a Chain, with Dropout between for ``dropout > 0``;
bidirectional, ``proj_size`` and ``bias=False`` are refused) and gives
batch-first layers whatever ``batch_first`` says. Other layers (``Parallel``,
skips with other connections, ``UNet``, cells) raise an error naming their
place in the model.

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

``to_dlpack(t)`` returns a DLPack capsule of a triflux Tensor (no copy);
``tensor_dlpack(t, ...)`` and ``tensor_dlpack_device(t)`` implement the
``__dlpack__`` / ``__dlpack_device__`` protocol for ``Tensor``. Memory of the
interpreter's ``CUDADevice`` is host memory and is exported as kDLCPU.
"""
import importlib
import operator

import numpy as np

from . import dtypes as _dt
from .errors import DTypeError, InteropError, TrifluxError


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


_TORCH_CLASSES = {}


def _torch_classes():
    """The torch modules triflux defines (created on first use, so that
    importing triflux does not import torch)."""
    if not _TORCH_CLASSES:
        nn = _torch().nn

        class TorchSkipConnection(nn.Module):
            """``layer(x) + x``: triflux's ``SkipConnection(layer, +)`` in torch."""

            def __init__(self, layer):
                super().__init__()
                self.layer = layer

            def forward(self, x):
                return self.layer(x) + x

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
    if name in ("TorchSkipConnection", "TorchSequence"):
        return _torch_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from . import ops
    x = ops.as_tensor(x)
    return ops.softmax(x, _torch_implicit_softmax_axis(x))


def _logsoftmax_implicit(x):
    from . import ops
    x = ops.as_tensor(x)
    return ops.logsoftmax(x, _torch_implicit_softmax_axis(x))


_softmax_implicit.__name__ = "softmax_torch_implicit_dim"
_logsoftmax_implicit.__name__ = "logsoftmax_torch_implicit_dim"


# --- arrays between torch and triflux ---------------------------------------------------------

def _array(p):
    """A NumPy copy of torch tensor ``p`` (bfloat16 as ml_dtypes.bfloat16)."""
    from .tensor import _torch_to_numpy
    if p.dtype not in _torch_float_dtypes():
        raise DTypeError(f"parameter of torch dtype {p.dtype} is not supported; use a floating dtype")
    return _torch_to_numpy(p.detach())


def _torch_float_dtypes():
    torch = _torch()
    return (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _ttensor(t, tdev):
    """A torch copy of triflux Tensor ``t`` on torch device ``tdev``."""
    from .tensor import _numpy_to_torch
    return _numpy_to_torch(t.numpy(), tdev)


# --- from_torch -------------------------------------------------------------------------------

SUPPORTED_TORCH = ("Sequential", "Linear", "Conv2d", "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d",
                   "BatchNorm3d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "Upsample",
                   "UpsamplingNearest2d", "UpsamplingBilinear2d", "Dropout", "Flatten", "Identity", "ReLU", "Sigmoid", "Tanh",
                   "GELU", "SiLU", "Softplus", "ELU", "LeakyReLU", "Softmax", "LogSoftmax",
                   "RNN", "LSTM", "GRU", "triflux.interop.TorchSkipConnection",
                   "triflux.interop.TorchSequence")


def _refuse(path, m, what, fix=""):
    raise InteropError(f"{path} ({_torch_name(type(m))}): {what} is not supported by triflux"
                       + (f"; {fix}" if fix else ""))


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
    from .devices import move
    from .tensor import as_device
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    dev = as_device(device)
    layer = _from(module, "model", approximate_gelu, True if pin_modes else None)
    return layer if dev.is_cpu else move(layer, dev)


def _from(m, path, approximate_gelu, train_active=None):
    from . import activations as A
    from .layers import (Chain, Dense, Conv, ConvTranspose, BatchNorm, Dropout, MaxPool, MeanPool,
                         GlobalMeanPool, Upsample, SkipConnection, flatten)
    from .layers import AdaptiveMaxPool, AdaptiveMeanPool, GlobalMaxPool
    from .tensor import Tensor
    nn = _torch().nn
    T = type(m)

    def tensor(p):
        return Tensor._from_numpy(_array(p))

    if T is nn.Sequential:
        names = [n for n, _ in m.named_children()]
        layers = [_from(c, f"{path}.{n}", approximate_gelu, train_active) for n, c in m.named_children()]
        if names == [str(i) for i in range(len(names))]:
            return Chain(*layers)
        return Chain(**dict(zip(names, layers)))
    if T is _torch_classes()["TorchSkipConnection"]:
        return SkipConnection(_from(m.layer, f"{path}.layer", approximate_gelu, train_active), operator.add)

    if T in (nn.RNN, nn.LSTM, nn.GRU):
        return _recurrent_from_torch(m, path, train_active)
    if T is _torch_classes()["TorchSequence"]:
        return _recurrent_from_torch(m.rnn, f"{path}.rnn", train_active)

    if T is nn.Linear:
        w = _array(m.weight)
        layer = Dense(m.in_features, m.out_features, init=lambda *s: w, dtype=w.dtype,
                      bias=m.bias is not None)
        if m.bias is not None:
            layer.bias = tensor(m.bias)
        return layer

    if T is nn.Conv2d:
        if m.padding_mode != "zeros":
            _refuse(path, m, f"padding_mode={m.padding_mode!r}", "only 'zeros' padding exists in triflux's Conv")
        pad = {"same": "same", "valid": 0}.get(m.padding, m.padding) if isinstance(m.padding, str) else m.padding
        w = _array(m.weight)
        layer = Conv(m.kernel_size, m.in_channels, m.out_channels, stride=m.stride, pad=pad,
                     dilation=m.dilation, groups=m.groups, bias=m.bias is not None, init=lambda *s: w,
                     dtype=w.dtype)
        if m.bias is not None:
            layer.bias = tensor(m.bias)
        return layer

    if T is nn.ConvTranspose2d:
        if m.padding_mode != "zeros":
            _refuse(path, m, f"padding_mode={m.padding_mode!r}", "ConvTranspose2d only has 'zeros'")
        w = _array(m.weight)
        layer = ConvTranspose(m.kernel_size, m.in_channels, m.out_channels, stride=m.stride, pad=m.padding,
                              outpad=m.output_padding, dilation=m.dilation, groups=m.groups,
                              bias=m.bias is not None, init=lambda *s: w, dtype=w.dtype)
        if m.bias is not None:
            layer.bias = tensor(m.bias)
        return layer

    if T in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d):
        if not m.affine:
            _refuse(path, m, "affine=False", "use affine=True (triflux's BatchNorm always has γ and β)")
        if not m.track_running_stats:
            _refuse(path, m, "track_running_stats=False",
                    "use track_running_stats=True (triflux's BatchNorm keeps running statistics)")
        if m.momentum is None:
            _refuse(path, m, "momentum=None (a cumulative average)", "give a number, e.g. momentum=0.1")
        w = _array(m.weight)
        layer = BatchNorm(m.num_features, eps=m.eps, momentum=m.momentum, dtype=w.dtype)
        layer.weight, layer.bias = Tensor._from_numpy(w), tensor(m.bias)
        layer.running_mean, layer.running_var = tensor(m.running_mean), tensor(m.running_var)
        layer.active = train_active if m.training else False
        # kept for to_torch (torch only reads it when momentum is None)
        layer._torch = {"class": T.__name__, "num_batches_tracked": int(m.num_batches_tracked)}
        return layer

    if T is nn.MaxPool2d:
        if m.return_indices:
            _refuse(path, m, "return_indices=True")
        return MaxPool(m.kernel_size, stride=m.stride if m.stride is not None else m.kernel_size,
                       pad=m.padding, dilation=m.dilation, ceil_mode=m.ceil_mode)

    if T is nn.AvgPool2d:
        if m.divisor_override is not None:
            _refuse(path, m, f"divisor_override={m.divisor_override}",
                    "MeanPool divides by the window's size (count_include_pad=True) or its pixels inside the input")
        return MeanPool(m.kernel_size, stride=m.stride if m.stride is not None else m.kernel_size,
                        pad=m.padding, ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)

    if T in (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d):
        if getattr(m, "return_indices", False):
            _refuse(path, m, "return_indices=True")
        is_max = T is nn.AdaptiveMaxPool2d
        if m.output_size in (1, (1, 1)):
            return GlobalMaxPool() if is_max else GlobalMeanPool()
        return (AdaptiveMaxPool if is_max else AdaptiveMeanPool)(m.output_size)

    if T in (nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d):
        mode = m.mode
        if mode == "nearest-exact":        # the same index rule as "nearest" for integer factors only
            sf = m.scale_factor if isinstance(m.scale_factor, tuple) else (m.scale_factor,) * 2
            if m.scale_factor is None or any(float(s) != int(s) for s in sf):
                _refuse(path, m, "mode='nearest-exact' with a size or a non-integer scale_factor",
                        "use mode='nearest' (torch's nearest index rule) or an integer scale_factor")
            mode = "nearest"
        if mode not in ("nearest", "bilinear"):
            _refuse(path, m, f"mode={m.mode!r}", "use 'nearest' or 'bilinear'")
        if m.scale_factor is not None and m.recompute_scale_factor:
            _refuse(path, m, "recompute_scale_factor=True",
                    "triflux's Upsample(scale=...) uses the given factor, as torch's default; give size=(H, W) "
                    "for the output-size rule")
        return Upsample(mode, size=m.size, scale=m.scale_factor,
                        align_corners=bool(m.align_corners) if mode == "bilinear" else False)

    if T is nn.Dropout:
        layer = Dropout(m.p)
        layer.active = train_active if m.training else False
        return layer

    if T is nn.Flatten:
        if m.start_dim != 1 or m.end_dim != -1:
            _refuse(path, m, f"start_dim={m.start_dim}, end_dim={m.end_dim}",
                    "triflux's flatten keeps axis 0 and flattens the rest (start_dim=1, end_dim=-1)")
        return flatten

    simple = {nn.Identity: A.identity, nn.ReLU: A.relu, nn.Sigmoid: A.sigmoid, nn.Tanh: A.tanh,
              nn.SiLU: A.swish}
    if T in simple:
        return simple[T]
    if T is nn.GELU:
        if m.approximate == "tanh" or approximate_gelu:
            return A.gelu
        if m.approximate == "none":
            return A.gelu_erf
        _refuse(path, m, f"GELU(approximate={m.approximate!r})", "use approximate='none' or 'tanh'")
    if T is nn.LeakyReLU:
        return A.leakyrelu if m.negative_slope == 0.01 else Activation(A.leakyrelu, a=float(m.negative_slope))
    if T is nn.ELU:
        return A.elu if m.alpha == 1.0 else Activation(A.elu, alpha=float(m.alpha))
    if T is nn.Softplus:
        if m.beta != 1:
            _refuse(path, m, f"beta={m.beta}", "triflux's softplus has beta=1")
        return A.softplus
    if T in (nn.Softmax, nn.LogSoftmax):
        fn = A.softmax if T is nn.Softmax else A.logsoftmax
        if m.dim is None:
            return _softmax_implicit if T is nn.Softmax else _logsoftmax_implicit
        return Activation(fn, dims=int(m.dim))

    raise InteropError(f"{path} ({_torch_name(T)}) is not supported yet; supported: "
                       f"{', '.join(SUPPORTED_TORCH)}. Translate that part by hand (triflux layers take "
                       "PyTorch's weight layouts) or wrap the rest around it.")


def _recurrent_from_torch(m, path, train_active):
    """torch.nn.RNN/LSTM/GRU as triflux's layer of the same name (a Chain of
    them, with Dropout between, for ``num_layers > 1``). triflux's layers are
    batch-first and return the output sequence only, whatever ``batch_first``
    says: feed them (N, L, in)."""
    from . import activations as A
    from .layers import GRU, LSTM, RNN, Chain, Dropout
    from .tensor import Tensor
    nn = _torch().nn
    T = type(m)
    if m.bidirectional:
        _refuse(path, m, "bidirectional=True", "triflux's recurrent layers run forward in time; run a second "
                "layer on the time-reversed sequence and concat the outputs")
    if getattr(m, "proj_size", 0):
        _refuse(path, m, f"proj_size={m.proj_size}")
    if not m.bias:
        _refuse(path, m, "bias=False", "triflux's recurrent layers have bias_ih and bias_hh")
    layers = []
    for k in range(m.num_layers):
        ins = m.input_size if k == 0 else m.hidden_size
        w = _array(getattr(m, f"weight_ih_l{k}"))
        if T is nn.RNN:
            layer = RNN(ins, m.hidden_size, {"tanh": A.tanh, "relu": A.relu}[m.nonlinearity], dtype=w.dtype)
        else:
            layer = (LSTM if T is nn.LSTM else GRU)(ins, m.hidden_size, dtype=w.dtype)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(layer, name, Tensor._from_numpy(_array(getattr(m, f"{name}_l{k}"))))
        if k and m.dropout:
            drop = Dropout(m.dropout)
            drop.active = train_active if m.training else False
            layers.append(drop)
        layers.append(layer)
    return layers[0] if len(layers) == 1 else Chain(*layers)


def ops_pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# --- to_torch ---------------------------------------------------------------------------------

def to_torch(model):
    """The ``torch.nn`` module equivalent to triflux ``model`` (a layer, a
    Chain, or an activation function), with copies of its weights on the torch
    device matching their triflux device. Unsupported layers raise an
    ``InteropError`` naming their path (``model.layers[2]``)."""
    _torch()
    mod = _to(model, "model")
    from .functor import is_layer
    modes = []

    def walk(x):
        if is_layer(x):
            if "active" in vars(x):
                modes.append(x.active)
            for v in x._children().values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
    walk(model)
    if modes and all(m is False for m in modes):   # a model in test mode: the whole module in eval mode
        mod.eval()
    return mod


def _tdev(t):
    return _torch().device("cpu") if t.device.is_cpu else t.device.torch_device


def _tdtype(t):
    if _dt.is_bfloat16(t.dtype):
        return _torch().bfloat16
    return _dt.to_torch(t.dtype)


def _with_activation(mod, layer, path):
    act = getattr(layer, "activation", None)
    from .activations import identity
    if act is None or act is identity:
        return mod
    return _torch().nn.Sequential(mod, _to(act, f"{path}.activation"))


def _set_params(mod, **tensors):
    torch = _torch()
    with torch.no_grad():
        for name, t in tensors.items():
            if t is not None:
                getattr(mod, name).copy_(_ttensor(t, getattr(mod, name).device))
    return mod


def _to(x, path):
    from . import activations as A
    from . import ops
    from .functor import is_layer, path_join
    from .layers import (Chain, Dense, Conv, ConvTranspose, BatchNorm, Dropout, MaxPool, MeanPool,
                         GlobalMeanPool, Upsample, SkipConnection, flatten, RNN, LSTM, GRU)
    from .layers import AdaptiveMaxPool, AdaptiveMeanPool, GlobalMaxPool
    from .layers.conv import _same_padding
    nn = _torch().nn
    T = type(x)

    def refuse(what, fix=""):
        raise InteropError(f"{path} ({what}) cannot be translated to torch" + (f"; {fix}" if fix else ""))

    if T is Chain:
        if isinstance(x.layers, dict):
            from collections import OrderedDict
            return nn.Sequential(OrderedDict((k, _to(v, path_join(path + ".layers", k)))
                                             for k, v in x.layers.items()))
        return nn.Sequential(*[_to(v, f"{path}.layers[{i}]") for i, v in enumerate(x.layers)])

    if T is Dense:
        w = x.weight
        mod = nn.Linear(w.shape[1], w.shape[0], bias=x.bias is not None, dtype=_tdtype(w), device=_tdev(w))
        return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)

    if T is Conv:
        w = x.weight
        t, b, l, r = x.pad
        kernel = tuple(w.shape[2:])
        if t == b and l == r:
            padding = (t, l)
        elif x.stride == (1, 1) and x.pad == _same_padding(kernel, x.dilation):
            padding = "same"
        else:
            refuse(f"Conv with asymmetric pad={x.pad}", "torch's Conv2d pads symmetrically (or 'same')")
        mod = nn.Conv2d(w.shape[1] * x.groups, w.shape[0], kernel, stride=x.stride, padding=padding,
                        dilation=x.dilation, groups=x.groups, bias=x.bias is not None, dtype=_tdtype(w),
                        device=_tdev(w))
        return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)

    if T is ConvTranspose:
        w = x.weight
        t, b, l, r = x.pad
        if t != b or l != r:
            refuse(f"ConvTranspose with asymmetric pad={x.pad}", "torch's ConvTranspose2d pads symmetrically")
        mod = nn.ConvTranspose2d(w.shape[0], w.shape[1] * x.groups, tuple(w.shape[2:]), stride=x.stride,
                                 padding=(t, l), output_padding=x.outpad, groups=x.groups,
                                 bias=x.bias is not None, dilation=x.dilation, dtype=_tdtype(w),
                                 device=_tdev(w))
        return _with_activation(_set_params(mod, weight=w, bias=x.bias), x, path)

    if T is BatchNorm:
        w = x.weight
        info = getattr(x, "_torch", {})
        cls = getattr(nn, info.get("class", "BatchNorm2d"))
        mod = cls(w.shape[0], eps=x.eps, momentum=x.momentum, dtype=_tdtype(w), device=_tdev(w))
        _set_params(mod, weight=w, bias=x.bias, running_mean=x.running_mean, running_var=x.running_var)
        mod.num_batches_tracked.fill_(info.get("num_batches_tracked", 0))
        mod.train(x.active is not False)
        return _with_activation(mod, x, path)

    if T is Dropout:
        mod = nn.Dropout(x.p)
        mod.train(x.active is not False)
        return mod

    if T in (RNN, LSTM, GRU):
        if x.return_state:
            refuse(f"{T.__name__} with return_state=True", "a layer returning its state does not chain; "
                   "use return_state=False and call the torch module directly for the state")
        w = x.weight_ih
        kw = dict(batch_first=True, dtype=_tdtype(w), device=_tdev(w))
        if T is RNN:
            nonlinearity = {A.tanh: "tanh", A.relu: "relu"}[x.activation]
            mod = nn.RNN(x.in_features, x.out_features, nonlinearity=nonlinearity, **kw)
        else:
            mod = getattr(nn, T.__name__)(x.in_features, x.out_features, **kw)
        _set_params(mod, weight_ih_l0=x.weight_ih, weight_hh_l0=x.weight_hh, bias_ih_l0=x.bias_ih,
                    bias_hh_l0=x.bias_hh)
        return _torch_classes()["TorchSequence"](mod)

    if T in (MaxPool, MeanPool):
        t, b, l, r = x.pad
        name = "MaxPool" if T is MaxPool else "MeanPool"
        if t != b or l != r:
            refuse(f"{name} with asymmetric pad={x.pad}", "torch pools pad symmetrically")
        if 2 * t > x.window[0] or 2 * l > x.window[1]:
            refuse(f"{name} with pad={x.pad} more than half the window {x.window}", "torch refuses such padding")
        if T is MaxPool:
            return nn.MaxPool2d(x.window, stride=x.stride, padding=(t, l), dilation=x.dilation,
                                ceil_mode=x.ceil_mode)
        return nn.AvgPool2d(x.window, stride=x.stride, padding=(t, l), ceil_mode=x.ceil_mode,
                            count_include_pad=x.count_include_pad)

    if T is GlobalMeanPool:
        return nn.AdaptiveAvgPool2d(1)
    if T is GlobalMaxPool:
        return nn.AdaptiveMaxPool2d(1)
    if T is AdaptiveMeanPool:
        return nn.AdaptiveAvgPool2d(x.out)
    if T is AdaptiveMaxPool:
        return nn.AdaptiveMaxPool2d(x.out)

    if T is Upsample:
        scale = None if x.scale is None else tuple(float(s) for s in x.scale)
        if x.mode == "bilinear":
            return nn.Upsample(size=x.size, scale_factor=scale, mode="bilinear", align_corners=x.align_corners)
        return nn.Upsample(size=x.size, scale_factor=scale, mode="nearest")

    if T is SkipConnection:
        if x.connection not in (operator.add, ops.add):
            from .show import fname
            refuse(f"SkipConnection with connection {fname(x.connection)}",
                   "only `+` (operator.add / triflux.ops.add) connections translate, to "
                   "triflux.interop.TorchSkipConnection")
        return _torch_classes()["TorchSkipConnection"](_to(x.layer, f"{path}.layer"))

    # functions
    if x is flatten:
        return nn.Flatten()
    simple = {A.identity: nn.Identity, A.relu: nn.ReLU, A.sigmoid: nn.Sigmoid, A.tanh: nn.Tanh,
              A.swish: nn.SiLU, A.softplus: nn.Softplus, A.elu: nn.ELU, A.leakyrelu: nn.LeakyReLU}
    if callable(x) and not is_layer(x):
        try:
            if x in simple:
                return simple[x]()
        except TypeError:   # unhashable callables
            pass
    if x is A.gelu:
        return nn.GELU(approximate="tanh")
    if x is A.gelu_erf:
        return nn.GELU()
    if x is A.softmax:
        return nn.Softmax(dim=1)
    if x is A.logsoftmax:
        return nn.LogSoftmax(dim=1)
    if x is _softmax_implicit:
        return nn.Softmax()
    if x is _logsoftmax_implicit:
        return nn.LogSoftmax()
    if isinstance(x, Activation):
        kw = x.kwargs
        if x.fn is A.leakyrelu and set(kw) <= {"a"}:
            return nn.LeakyReLU(kw.get("a", 0.01))
        if x.fn is A.elu and set(kw) <= {"alpha"}:
            return nn.ELU(kw.get("alpha", 1.0))
        if x.fn in (A.softmax, A.logsoftmax) and set(kw) <= {"dims"}:
            dims = kw.get("dims")
            cls = nn.Softmax if x.fn is A.softmax else nn.LogSoftmax
            return cls(dim=1 if dims is None else dims)
        refuse(f"activation {x.__name__}")

    from .show import fname
    what = f"{type(x).__module__}.{type(x).__qualname__}" if is_layer(x) else f"function {fname(x)}"
    refuse(what, "supported: Chain, Dense, Conv, ConvTranspose, BatchNorm, Dropout, MaxPool, MeanPool, "
                 "AdaptiveMaxPool, AdaptiveMeanPool, GlobalMaxPool, GlobalMeanPool, Upsample, RNN, LSTM, GRU, SkipConnection(layer, +), flatten and the activations identity, "
                 "relu, sigmoid, tanh, gelu, gelu_erf, swish, softplus, elu, leakyrelu, softmax, logsoftmax")


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
    from . import backend
    return device is not None and not device.is_cpu and backend.interpreter_on() and \
        device.torch_device.type == "cpu"


def _check_torch_dtype(t):
    if t.dtype != _torch().bfloat16:
        _dt.from_torch(t.dtype)   # a DTypeError for complex and other unsupported dtypes


def _from_torch_tensor(t, device):
    """A triflux Tensor over torch tensor ``t``'s memory (no copy where the
    device allows), on ``device`` or else the device ``t`` lives on."""
    from .devices import CUDADevice, AMDGPUDevice
    from .tensor import Tensor, transfer
    from . import backend
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
    from .tensor import Tensor, as_device, transfer
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


def _producer(t):
    """The array whose ``__dlpack__`` exports triflux Tensor ``t``'s memory."""
    data = t._data
    if isinstance(data, np.ndarray) and _dt.is_bfloat16(data.dtype):
        try:
            torch = _torch()
        except InteropError:
            raise DTypeError("NumPy's DLPack cannot export bfloat16; installing torch lets triflux export "
                             "bfloat16 CPU tensors without a copy") from None
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return data


def tensor_dlpack(t, stream=None, **kwargs):
    """``Tensor.__dlpack__``: a DLPack capsule over ``t``'s memory (no copy).
    ``stream`` and the newer keywords (``max_version``, ``dl_device``,
    ``copy``) are passed to the storage's own ``__dlpack__``."""
    p = _producer(t)
    if stream is not None:
        kwargs["stream"] = stream
    try:
        return p.__dlpack__(**kwargs)
    except TypeError:
        if "max_version" in kwargs:   # an older producer: the legacy protocol
            kwargs.pop("max_version")
            return p.__dlpack__(**kwargs)
        raise


def tensor_dlpack_device(t):
    """``Tensor.__dlpack_device__``: ``(device_type, device_id)``; the Triton
    interpreter's CUDADevice holds host memory and reports kDLCPU."""
    kind, idx = _producer(t).__dlpack_device__()
    return (int(kind), int(idx))


def to_dlpack(t):
    """A DLPack capsule over triflux Tensor ``t``'s memory (no copy), the
    legacy exchange (``torch.from_dlpack(capsule)``, CuPy's and older JAX's
    ``from_dlpack``). Consumers that want an object with ``__dlpack__``
    (``np.from_dlpack``, newer JAX) take the Tensor itself, whose protocol
    methods are :func:`tensor_dlpack` and :func:`tensor_dlpack_device`."""
    from .tensor import Tensor
    if not isinstance(t, Tensor):
        raise TypeError(f"to_dlpack expects a triflux Tensor, got {type(t).__name__}")
    return tensor_dlpack(t)
