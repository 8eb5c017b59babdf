"""triflux: Flux.jl's model of GPU support, in Python.

Every primitive has a readable NumPy reference (the CPU backend) and Triton
kernels (the GPU backend); the same code trains on any device.
"""
import os as _os

# In a source checkout the top-level reference/ and triton_kernels/ folders are
# this package's subpackages (setup.cfg installs them as triflux.reference and
# triflux.triton_kernels); make the same names resolve when run from the tree.
_src = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "reference")) and \
        _os.path.isdir(_os.path.join(_src, "reference")) and _src not in __path__:
    __path__.append(_src)

from .version import __version__  # noqa: E402
from . import dtypes  # noqa: E402
from .errors import (TrifluxError, DeviceMismatchError, NoGPUError, BackendNotSupportedError,  # noqa: E402
                     DTypeError, ShapeError, OutOfMemoryError, NonFiniteError, StructureError,
                     GradientError, CheckpointError, InteropError, DistributedError, ArgumentError,
                     IndexRangeError)
from .dtypes import float16, float32, float64, int32, int64, bool_  # noqa: E402
from .devices import (CPUDevice, CUDADevice, AMDGPUDevice, MetalDevice, Device,  # noqa: E402
                      gpu_device, cpu_device, supported_devices, functional, devices, reclaim)
from .preferences import gpu_backend, gpu_backend_preference as _pref  # noqa: E402
from .tensor import Tensor, tensor  # noqa: E402
from .constructors import zeros, ones, rand, randn, full, seed, zeros_like, ones_like  # noqa: E402
from .functor import fmap  # noqa: E402
from . import ops  # noqa: E402
from .ops import (matmul, concat, cat, reshape, transpose, where, maximum, minimum,  # noqa: E402
                  exp, log, sqrt)
from .moving import gpu, cpu, get_device  # noqa: E402
from .activations import (identity, relu, sigmoid, σ, tanh, softmax, logsoftmax, logsumexp,  # noqa: E402
                          leakyrelu, elu, gelu, gelu_erf, swish, softplus)
from .autodiff import gradient, withgradient, ignore_derivatives  # noqa: E402
from .layers import *  # noqa: E402,F401,F403  (every layer: triflux.layers.__all__)
from .data import DataLoader  # noqa: E402
from .memory import memory_status, MemoryStatus  # noqa: E402
from .precision import f32, f64, f16, bf16  # noqa: E402
from .matmul_precision import set_matmul_precision, get_matmul_precision  # noqa: E402
from .autotuning import set_autotune, get_autotune  # noqa: E402
from .modes import trainmode, testmode  # noqa: E402
from .capture import CapturedStep  # noqa: E402
from . import losses, optimise, persistence  # noqa: E402
from .losses import onehotbatch, onecold  # noqa: E402
from .optimise import (setup, update, train, capture_step, adjust, trainables, Descent, Momentum, Nesterov, Adam,  # noqa: E402
                       AdamW, RMSProp, MixedPrecision)
from .persistence import state, loadmodel  # noqa: E402
from .serialization import save, load, save_model, load_model  # noqa: E402
from .model_file import register_layer  # noqa: E402
from .interop import from_torch, to_torch, from_dlpack, to_dlpack  # noqa: E402

GPU_BACKEND = _pref()

#: submodules ``import triflux`` does not load (the package imports every other one)
_LAZY_SUBMODULES = ("models", "testing", "reference", "triton_kernels", "benchmarks", "doctor", "demos",
                    "distributed")


def __getattr__(name):
    if name == "bfloat16":
        return dtypes.bfloat16
    if name in _LAZY_SUBMODULES:  # `import triflux; triflux.models.UNet(...)` works
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'triflux' has no attribute {name!r}")
