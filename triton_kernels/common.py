"""What every kernel family shares: allocation, block sizes, N-d strided
indexing, a strided copy/cast kernel, and the launch wrapper that turns
backend failures into triflux errors.

torch is used here for exactly two things: allocating device memory
(``torch.empty``) and metadata-only views. Everything that computes is Triton.
"""
import functools

import torch
import triton
import triton.language as tl

from triflux import backend
from triflux.errors import NoGPUError, OutOfMemoryError

INTERPRET = backend.interpreter_on()

#: kernels index tensors of up to this many dimensions (after merging)
MAX_DIMS = 6


def numel(shape):
    """Number of elements of ``shape`` (any iterable of sizes)."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def next_pow2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def block_for(n, gpu_block=1024):
    """Elements per program. The interpreter pays ~1 ms per program, so there
    one program takes as much as it can (NumPy vectorises inside it)."""
    if INTERPRET:
        return min(next_pow2(max(n, 1)), 1 << 16)
    return gpu_block


def cdiv(a, b):
    return (a + b - 1) // b


def empty(shape, dtype, device):
    """Uninitialised device memory (``dtype``: a torch dtype). Running out of
    device memory raises triflux's ``OutOfMemoryError`` (bytes asked for,
    bytes free, advice)."""
    try:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    except RuntimeError as e:       # torch.OutOfMemoryError is a RuntimeError
        if not _is_oom(e):
            raise
        raise out_of_memory(e, shape, dtype, device) from None


def _is_oom(exc):
    return isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in str(exc).lower()


def _device_name(device):
    """The triflux name of the torch device ``device``."""
    if device is None:
        return "the GPU"
    device = torch.device(device)
    if device.type == "cpu":
        return "the host memory (the Triton interpreter's device)"
    kind = "AMDGPUDevice" if getattr(torch.version, "hip", None) else "CUDADevice"
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return f"{kind}({idx})"


def _memory_numbers(device):
    """(free, total) bytes of ``device`` (a torch device), ``None`` where unknown."""
    try:
        from triflux.memory import _host_status
        if device is not None and torch.device(device).type == "cpu":
            st = _host_status(None)
            return st.free, st.total
        f, t = torch.cuda.mem_get_info(device)
        return int(f), int(t)
    except Exception:
        return None, None


def out_of_memory(exc, shape=None, dtype=None, device=None, *, asked=None, purpose=None):
    """triflux's ``OutOfMemoryError`` for a failed allocation of a ``shape``
    ``dtype`` tensor on torch device ``device`` (or a failed launch); or of
    ``asked`` bytes for ``purpose`` (e.g. "a DataLoader batch")."""
    from triflux.show import format_bytes
    what = "asked for more memory than is free"
    if asked is not None:
        what = f"asked for {format_bytes(asked)} ({asked} bytes)" + (f" for {purpose}" if purpose else "")
    elif shape is not None:
        asked = numel(shape) * (dtype.itemsize if dtype is not None else 1)
        what = f"asked for {format_bytes(asked)} ({asked} bytes) for a {tuple(int(s) for s in shape)} " \
               f"{str(dtype).replace('torch.', '')} tensor"
    free, total = _memory_numbers(device)
    have = ""
    if free is not None and total is not None:
        have = f"; {format_bytes(free)} ({free} bytes) are free of {format_bytes(total)}"
    where = _device_name(device)
    err = OutOfMemoryError(
        f"out of memory on {where}: {what}{have}. A training step that fails here has not updated the "
        "model's parameters or the optimiser state, so training can go on. To fit: use a smaller batch "
        "(`DataLoader(data, batchsize=...)`); call `triflux.reclaim()` to return cached blocks; keep "
        "parameters and data in float16/bfloat16 (`f16(model)`, `bf16(x)`) to halve the memory; check "
        "with `nvidia-smi` whether other processes hold this GPU's memory.")
    err.asked, err.free, err.total, err.device = asked, free, total, where
    return err


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
        if _is_oom(e):
            idx = _gpu_index(args)
            raise out_of_memory(e, device=None if idx is None else torch.device("cuda", idx)) from None
        raise


# --- N-d strided indexing ------------------------------------------------------------

def broadcast_strides(t, out_shape):
    """Strides (in elements) that read ``t`` broadcast to ``out_shape``."""
    nd = len(out_shape)
    shape = (1,) * (nd - t.dim()) + tuple(t.shape)
    strides = (0,) * (nd - t.dim()) + tuple(t.stride())
    return tuple(0 if (s == 1 and o != 1) else st for s, st, o in zip(shape, strides, out_shape))


def merge_dims(shape, *stride_sets):
    """Drop size-1 dimensions and merge neighbours that are contiguous in
    every stride set, so most tensors index as 1-d or 2-d."""
    dims = [(s, [st[i] for st in stride_sets]) for i, s in enumerate(shape) if s != 1]
    merged = []
    for s, sts in dims:
        if merged:
            ps, psts = merged[-1]
            if all(p == q * s for p, q in zip(psts, sts)):
                merged[-1] = (ps * s, sts)
                continue
        merged.append((s, sts))
    if len(merged) > MAX_DIMS:
        raise NotImplementedError(f"tensors of more than {MAX_DIMS} non-mergeable dimensions")
    shape_out = [1] * (MAX_DIMS - len(merged)) + [s for s, _ in merged]
    strides_out = []
    for k in range(len(stride_sets)):
        strides_out.append([0] * (MAX_DIMS - len(merged)) + [sts[k] for _, sts in merged])
    return shape_out, strides_out


@triton.jit
def nd_offset(lin, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5):
    """Element offset of linear (row-major) index ``lin`` in a 6-d strided
    tensor of sizes (D0, D1, ..., D5); D0 is implied."""
    i5 = lin % D5
    r = lin // D5
    i4 = r % D4
    r = r // D4
    i3 = r % D3
    r = r // D3
    i2 = r % D2
    r = r // D2
    i1 = r % D1
    i0 = r // D1
    return i0 * S0 + i1 * S1 + i2 * S2 + i3 * S3 + i4 * S4 + i5 * S5


@triton.jit
def split_nchw(lin, C, H, W):
    """(n, c, h, w) of the row-major linear index ``lin`` into (N, C, H, W)."""
    w = lin % W
    r = lin // W
    h = r % H
    r = r // H
    c = r % C
    n = r // C
    return n, c, h, w


@triton.jit
def store_value(v, OUT: tl.constexpr, INTERP: tl.constexpr):
    """``v`` (computed in float32/float64 or an integer type) converted for a
    store into an ``OUT`` tensor: booleans as ``v != 0``; bfloat16 through
    float32 with round-to-nearest-even (the interpreter truncates float32 to
    bfloat16 and garbles float64 to bfloat16; GPUs round correctly)."""
    if OUT == tl.int1:
        v = v != 0
    elif OUT == tl.bfloat16:
        v = v.to(tl.float32)
        if INTERP:
            b = v.to(tl.uint32, bitcast=True)
            r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            v = tl.where(v != v, v, r.to(tl.float32, bitcast=True))
    return v.to(OUT)


# --- NaN-propagating minimum and maximum ----------------------------------------------
# Plain tl.minimum / tl.maximum / tl.max compile to PTX min.f32 / max.f32, which
# return the other operand when one is NaN (elu(NaN) would be 0 on a GPU), while
# the interpreter runs np.minimum / np.maximum (NaN) and np.nanmax (no NaN): what
# CI sees is not what a GPU does. Kernels take minima and maxima of floats only
# through these three, which give NaN whenever an operand is NaN, as torch and the
# NumPy references do, on every backend (tests/test_compiled_nan.py checks the PTX).

@triton.jit
def maximum(a, b):
    """max(a, b), NaN if a or b is NaN (PTX max.NaN; integers as usual)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum(a, b):
    """min(a, b), NaN if a or b is NaN (PTX min.NaN; integers as usual)."""
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_along(x, axis: tl.constexpr):
    """max of the float32/float64 tensor ``x`` along ``axis``, NaN if any entry
    is NaN (np.max, torch.amax).

    tl.max drops NaN (PTX max.f32; np.nanmax in the interpreter), so the
    maximum is taken over integers ordered as the floats are: the bit pattern
    for x >= +0 and the pattern with the 63 (31) value bits flipped for x <= -0,
    every NaN made the positive quiet NaN first, whose pattern lies above +inf's."""
    if x.dtype == tl.float64:
        bits = tl.where(x != x, float("nan"), x).to(tl.int64, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFFFFFFFFFF, bits)
        top = tl.max(key, axis)
        return tl.where(top < 0, top ^ 0x7FFFFFFFFFFFFFFF, top).to(tl.float64, bitcast=True)
    else:
        bits = tl.where(x != x, float("nan"), x).to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        top = tl.max(key, axis)
        return tl.where(top < 0, top ^ 0x7FFFFFFF, top).to(tl.float32, bitcast=True)


@triton.jit
def _copy_kernel(src, src_off, dst, dst_off, n,
                 D1, D2, D3, D4, D5,
                 A0, A1, A2, A3, A4, A5,
                 B0, B1, B2, B3, B4, B5,
                 INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    so = nd_offset(lin, D1, D2, D3, D4, D5, A0, A1, A2, A3, A4, A5)
    do = nd_offset(lin, D1, D2, D3, D4, D5, B0, B1, B2, B3, B4, B5)
    x = tl.load(src + src_off + so, mask=mask)
    tl.store(dst + dst_off + do, store_value(x, dst.dtype.element_ty, INTERP), mask=mask)


def copy_into(dst, src, src_strides=None, src_offset=0, dst_strides=None, dst_offset=0, shape=None):
    """Copy ``src`` into ``dst`` element by element, converting the dtype.

    Strides and offsets are in elements and may be negative (for views torch
    cannot express, such as ``x[::-1]``); by default they are the tensors' own.
    ``src`` may broadcast to ``shape`` (stride 0).
    """
    shape = tuple(dst.shape) if shape is None else tuple(shape)
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return dst
    a = broadcast_strides(src, shape) if src_strides is None else tuple(src_strides)
    b = tuple(dst.stride()) if dst_strides is None else tuple(dst_strides)
    mshape, (a, b) = merge_dims(shape, a, b)
    block = block_for(n)
    launch(_copy_kernel, (cdiv(n, block),), src, src_offset, dst, dst_offset, n,
           *mshape[1:], *a, *b, INTERP=INTERPRET, BLOCK=block)
    return dst


def contiguous(t):
    """``t`` itself when dense row-major, else a dense copy made by a kernel."""
    if t.is_contiguous():
        return t
    out = empty(t.shape, t.dtype, t.device)
    return copy_into(out, t)


def cast(t, dtype):
    """A copy of ``t`` in torch dtype ``dtype`` (``t`` itself if already)."""
    if t.dtype == dtype:
        return t
    out = empty(t.shape, dtype, t.device)
    return copy_into(out, t)


@functools.lru_cache(maxsize=None)
def compute_type(dtype):
    """The Triton type kernels compute in: float64 stays, everything else float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


@triton.jit
def _full_kernel(dst, hi, src, n, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if dst.dtype.element_ty == tl.float64:
        # Triton passes Python floats as float32: a float64 value comes in a buffer
        v = tl.load(src + lin * 0)
    else:  # via float32: the interpreter cannot convert float64 to bfloat16
        v = tl.full((BLOCK,), hi, tl.float32)
    tl.store(dst + lin, store_value(v, dst.dtype.element_ty, INTERP), mask=lin < n)


def full(shape, value, dtype, device):
    """A new dense tensor of ``shape`` filled with ``value`` (the kernel
    behind zeros/ones/fill; torch only allocates)."""
    out = empty(shape, dtype, device)
    n = out.numel()
    if n:
        if not dtype.is_floating_point and abs(value) >= 2 ** 24:
            raise ValueError(f"fill value {value} is not exact through float32; integer fills must be below 2**24")
        if dtype == torch.float64:
            try:
                src = torch.tensor([float(value)], dtype=torch.float64).to(out.device)  # a host->device copy
            except RuntimeError as e:
                if not _is_oom(e):
                    raise
                raise out_of_memory(e, (1,), torch.float64, out.device) from None
        else:
            src = out
        block = block_for(n)
        launch(_full_kernel, (cdiv(n, block),), out, float(value) if dtype != torch.float64 else 0.0, src, n,
               INTERP=INTERPRET, BLOCK=block)
    return out
