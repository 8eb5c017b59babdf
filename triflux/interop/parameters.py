"""Parameters between torch and triflux: copies of torch tensors as NumPy
arrays or triflux Tensors (bfloat16 as ``ml_dtypes.bfloat16``), the torch
device and dtype matching a triflux Tensor, and triflux Tensors copied into
a torch module's parameters and buffers."""
from triflux import dtypes as _dt
from triflux.errors import DTypeError
from triflux.tensor import Tensor, numpy_to_torch, torch_to_numpy
from .torch_modules import import_torch


def torch_array(p):
    """A NumPy copy of torch tensor ``p`` (bfloat16 as ml_dtypes.bfloat16)."""
    torch = import_torch()
    if p.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise DTypeError(f"parameter of torch dtype {p.dtype} is not supported; use a floating dtype")
    return torch_to_numpy(p.detach())


def torch_tensor_copy(p):
    """A triflux Tensor (CPU) copy of torch tensor ``p``."""
    return Tensor._from_numpy(torch_array(p))


def torch_device_of(t):
    """The torch device holding triflux Tensor ``t``'s memory."""
    return import_torch().device("cpu") if t.device.is_cpu else t.device.torch_device


def torch_dtype_of(t):
    """Triflux Tensor ``t``'s dtype in torch."""
    if _dt.is_bfloat16(t.dtype):
        return import_torch().bfloat16
    return _dt.to_torch(t.dtype)


def set_params(mod, **tensors):
    """``mod`` with its parameters and buffers ``tensors`` (triflux Tensors, None skipped) copied in."""
    with import_torch().no_grad():
        for name, t in tensors.items():
            if t is not None:
                target = getattr(mod, name)
                target.copy_(numpy_to_torch(t.numpy(), target.device))
    return mod
