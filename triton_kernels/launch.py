"""How kernels get memory and run: allocation, block sizes and the launch
wrapper that turns backend failures into triflux errors.

torch is used here for exactly two things: allocating device memory
(``torch.empty``) and, in ``launch``, selecting the GPU that holds the
arguments. Everything that computes is Triton.
"""
import torch

from triflux import backend
from triflux.errors import NoGPUError
from triflux.memory import is_out_of_memory, out_of_memory

INTERPRET = backend.interpreter_on()


def numel(shape):
    """Number of elements of ``shape`` (any iterable of sizes)."""
    n = 1
    for size in shape:
        n *= int(size)
    return n


def next_pow2(n):
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def block_for(n, gpu_block=1024):
    """Elements per program. The interpreter pays ~1 ms per program, so there
    one program takes as much as it can (NumPy vectorises inside it)."""
    if INTERPRET:
        return min(next_pow2(max(n, 1)), 1 << 16)
    return gpu_block


def cdiv(a, b):
    """ceil(a / b) for positive integers: the programs that cover ``a`` items ``b`` at a time."""
    return (a + b - 1) // b


def empty(shape, dtype, device):
    """Uninitialised device memory (``dtype``: a torch dtype). Running out of
    device memory raises triflux's ``OutOfMemoryError`` (bytes asked for,
    bytes free, advice)."""
    try:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    except RuntimeError as e:       # torch.OutOfMemoryError is a RuntimeError
        if not is_out_of_memory(e):
            raise
        raise out_of_memory(e, shape, dtype, device) from None


#: more than one GPU visible (then ``launch`` selects the tensors' GPU); None until first asked
_MULTI_GPU = None


def _multi_gpu():
    global _MULTI_GPU
    if _MULTI_GPU is None:
        try:
            _MULTI_GPU = (not INTERPRET) and torch.cuda.is_available() and torch.cuda.device_count() > 1
        except Exception:
            _MULTI_GPU = False
    return _MULTI_GPU


def _gpu_index(args):
    """The GPU index of the first tensor among ``args`` (``None``: none on a GPU)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            i = a.get_device()          # -1 on the CPU; cheaper than building a.device
            return i if i >= 0 else None
    return None


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)`` on the GPU that holds the tensor
    arguments (with several GPUs), with backend failures made readable."""
    try:
        if _MULTI_GPU or (_MULTI_GPU is None and _multi_gpu()):
            idx = _gpu_index(args)
            if idx is not None and idx != torch.cuda.current_device():
                with torch.cuda.device(idx):
                    return kernel[grid](*args, **meta)
        return kernel[grid](*args, **meta)
    except RuntimeError as e:
        msg = str(e)
        if "active drivers" in msg or "no CUDA-capable device" in msg or "driver" in msg.lower() and "found" in msg.lower():
            raise NoGPUError(
                "no GPU backend is functional here (Triton found no GPU driver). "
                "Use the CPU device (`cpu(x)`), or set TRITON_INTERPRET=1 before importing "
                "triflux to run the kernels in the Triton interpreter.") from None
        if is_out_of_memory(e):
            idx = _gpu_index(args)
            raise out_of_memory(e, device=None if idx is None else torch.device("cuda", idx)) from None
        raise
