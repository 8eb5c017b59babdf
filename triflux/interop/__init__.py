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
Embedding, EmbeddingBag           Embedding, EmbeddingBag (the table as it is, its
                                  padding row included; ``padding_idx``,
                                  ``scale_grad_by_freq``, the bag's ``mode`` and
                                  ``include_last_offset`` kept; no ``max_norm``)
Conv1d/2d/3d                      Conv (``padding_mode`` as ``pad_mode``); CrossCor
                                  and DepthwiseConv go to torch as Conv1d/2d/3d too
ConvTranspose1d/2d/3d             ConvTranspose (``output_padding`` kept)
BatchNorm1d/2d/3d                 BatchNorm (``affine`` and ``track_running_stats``
                                  True, a numeric ``momentum``)
LayerNorm, RMSNorm                LayerNorm, RMSNorm (``elementwise_affine`` as
                                  ``affine``; LayerNorm's ``bias``, RMSNorm's
                                  ``eps=None`` kept)
GroupNorm                         GroupNorm (torch's ``(num_groups, num_channels)``
                                  is Flux's ``(channels, groups)``; ``affine``)
InstanceNorm1d/2d/3d              InstanceNorm (``affine``, ``track_running_stats``
                                  as ``track_stats``, a numeric ``momentum``; to
                                  torch: the class it came from, else the rank of
                                  the layer before it, else 2d, as BatchNorm)
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

Modes: a torch module in eval mode (``.training`` False) gives a BatchNorm,
InstanceNorm or Dropout pinned to test behaviour (``active=False``, as ``testmode``); one in
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
classes, triflux layer classes or functions, and the functions between them;
:mod:`triflux.interop.table`); ``SUPPORTED_TORCH`` and the error messages are
read from it, so supporting another layer is one entry there.

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

The modules
-----------
* :mod:`.torch_modules`: torch, imported on first use; the torch modules
  triflux defines (``TorchSkipConnection``, ``TorchSequence``);
* :mod:`.parameters`: parameters copied between torch and triflux;
* :mod:`.conversion`: the ``Conversion`` record and the walk over a model;
* :mod:`.activation_arguments`: ``Activation``, an activation with arguments;
* the conversions by family: :mod:`.containers` (Sequential, skips, UNet),
  :mod:`.dense` (Linear, Dropout, Flatten), :mod:`.embedding` (Embedding,
  EmbeddingBag), :mod:`.spatial` (convolutions,
  pools, upsampling, pixel shuffle), :mod:`.norm` (BatchNorm, LayerNorm,
  GroupNorm, InstanceNorm, RMSNorm),
  :mod:`.recurrent` (RNN, LSTM, GRU), :mod:`.activations`;
* :mod:`.table`: ``CONVERSIONS``, ``from_torch`` and ``to_torch``;
* :mod:`.dlpack`: ``from_dlpack`` and ``to_dlpack``.
"""
from .activation_arguments import Activation
from .conversion import Conversion, FromOptions
from .dlpack import from_dlpack, kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged, kDLROCM, to_dlpack
from .table import CONVERSIONS, SUPPORTED_TORCH, from_torch, to_torch
from .torch_modules import OWN_TORCH_MODULES, torch_classes

__all__ = ["Activation", "Conversion", "FromOptions", "CONVERSIONS", "SUPPORTED_TORCH", "from_torch", "to_torch",
           "from_dlpack", "to_dlpack", "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLROCM", "kDLCUDAManaged"]


def __getattr__(name):
    """``triflux.interop.TorchSkipConnection`` and ``TorchSequence``, created on
    first use (importing triflux does not import torch); their classes name
    this package as their module, so pickles of models holding them load."""
    if name in OWN_TORCH_MODULES:
        return torch_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
