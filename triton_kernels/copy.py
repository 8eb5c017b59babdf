"""Copy, cast and fill kernels: the device-side counterparts of
``np.copyto`` / ``astype`` / ``np.full`` (torch only allocates)."""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from triflux import recording
from triflux.memory import is_out_of_memory, out_of_memory

from . import launch
from .indexing import broadcast_strides, merge_dims, nd_offset
from .numerics import store_value


@triton.jit
def _copy_kernel(src_pointer, src_offset, dst_pointer, dst_offset, n_elements,
                 size1, size2, size3, size4, size5,
                 src_stride0, src_stride1, src_stride2, src_stride3, src_stride4, src_stride5,
                 dst_stride0, dst_stride1, dst_stride2, dst_stride3, dst_stride4, dst_stride5,
                 INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """dst[i] = src[i] for every row-major linear index i, each side read
    through its own strides from its own element offset."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    src_index = nd_offset(index, size1, size2, size3, size4, size5, src_stride0, src_stride1,
                          src_stride2, src_stride3, src_stride4, src_stride5)
    dst_index = nd_offset(index, size1, size2, size3, size4, size5, dst_stride0, dst_stride1,
                          dst_stride2, dst_stride3, dst_stride4, dst_stride5)
    value = tl.load(src_pointer + src_offset + src_index, mask=mask)
    tl.store(dst_pointer + dst_offset + dst_index,
             store_value(value, dst_pointer.dtype.element_ty, INTERPRETER), mask=mask)


def copy_into(dst, src, src_strides=None, src_offset=0, dst_strides=None, dst_offset=0, shape=None):
    """Copy ``src`` into ``dst`` element by element, converting the dtype.

    Strides and offsets are in elements and may be negative (for views torch
    cannot express, such as ``x[::-1]``); by default they are the tensors' own.
    ``src`` may broadcast to ``shape`` (stride 0).
    """
    shape = tuple(dst.shape) if shape is None else tuple(shape)
    src_strides = broadcast_strides(src, shape) if src_strides is None else tuple(src_strides)
    dst_strides = tuple(dst.stride()) if dst_strides is None else tuple(dst_strides)
    n, grid, args, block = _copy_plan(shape, src_strides, dst_strides)
    if n:
        launch.launch(_copy_kernel, grid, src, src_offset, dst, dst_offset, n, *args,
                      INTERPRETER=launch.INTERPRET, BLOCK_SIZE=block)
    return dst


@lru_cache(maxsize=4096)
def _copy_plan(shape, src_strides, dst_strides):
    """(elements, grid, merged sizes and strides, block size) of a copy over
    ``shape``; cached, as it runs on every copy."""
    n = launch.numel(shape)
    if n == 0:
        return 0, None, (), None
    sizes, (src_strides, dst_strides) = merge_dims(shape, src_strides, dst_strides)
    block = launch.block_for(n)
    return n, (launch.cdiv(n, block),), (*sizes[1:], *src_strides, *dst_strides), block


def contiguous(t):
    """``t`` itself when dense row-major, else a dense copy made by a kernel."""
    if t.is_contiguous():
        return t
    out = launch.empty(t.shape, t.dtype, t.device)
    return copy_into(out, t)


def cast(t, dtype):
    """A copy of ``t`` in torch dtype ``dtype`` (``t`` itself if already)."""
    if t.dtype == dtype:
        return t
    out = launch.empty(t.shape, dtype, t.device)
    return copy_into(out, t)


@triton.jit
def _full_kernel(output_pointer, value, value_pointer, n_elements, VALUE_IN_BUFFER: tl.constexpr,
                 INTERPRETER: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output[i] = the fill value: ``value`` (a float32), or with VALUE_IN_BUFFER
    the one element at ``value_pointer``, already of the output's type (a
    float64, or an integer that float32 would round)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if VALUE_IN_BUFFER:
        # Triton passes Python floats as float32: such a value comes in a buffer
        fill = tl.load(value_pointer + index * 0)
        tl.store(output_pointer + index, fill, mask=index < n_elements)
    else:  # via float32: the interpreter cannot convert float64 to bfloat16
        fill = tl.full((BLOCK_SIZE,), value, tl.float32)
        tl.store(output_pointer + index, store_value(fill, output_pointer.dtype.element_ty, INTERPRETER),
                 mask=index < n_elements)


def full(shape, value, dtype, device):
    """A new dense tensor of ``shape`` filled with ``value`` (the kernel
    behind zeros/ones/fill; torch only allocates and copies the one value to
    the device where float32 cannot carry it: float64, and integers of 2**24
    or more). The value is checked against the dtype by the caller
    (``triflux.constructors.full``)."""
    out = launch.empty(shape, dtype, device)
    n = out.numel()
    if n:
        in_buffer = dtype == torch.float64 or (not dtype.is_floating_point and abs(value) >= 2 ** 24)
        if in_buffer:
            try:  # a host-to-device copy of one element
                host = torch.tensor([value], dtype=dtype)
                value_buffer = host.to(out.device)
            except RuntimeError as e:
                if not is_out_of_memory(e):
                    raise
                raise out_of_memory(e, (1,), dtype, out.device) from None
            if recording.ACTIVE is not None:     # a captured step: memory of the step, host data copied
                recording.note_upload(host.numpy())
                recording.note_allocation(value_buffer)
        else:
            value_buffer = out
        block = launch.block_for(n)
        launch.launch(_full_kernel, (launch.cdiv(n, block),), out, 0.0 if in_buffer else float(value),
                      value_buffer, n, VALUE_IN_BUFFER=in_buffer, INTERPRETER=launch.INTERPRET, BLOCK_SIZE=block)
    return out
