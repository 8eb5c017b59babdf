"""N-d strided indexing shared by the kernels: strides that broadcast,
dimensions merged until most tensors index as 1-d or 2-d, the test for a
tensor that is read at the linear index itself, and the one strided-offset
helper (``nd_offset``) that maps a row-major linear index to an element
offset."""
from functools import lru_cache

import triton
import triton.language as tl  # noqa: F401  (the interpreter looks for tl in a jit function's module)

#: kernels index tensors of up to this many dimensions (after merging)
MAX_DIMS = 6


def broadcast_strides(t, out_shape):
    """Strides (in elements) that read ``t`` broadcast to ``out_shape``."""
    return _broadcast_strides(t.shape, t.stride(), tuple(out_shape))


@lru_cache(maxsize=4096)
def _broadcast_strides(shape, strides, out_shape):
    pad = len(out_shape) - len(shape)
    shape = (1,) * pad + tuple(shape)
    strides = (0,) * pad + tuple(strides)
    return tuple(0 if (s == 1 and o != 1) else st for s, st, o in zip(shape, strides, out_shape))


def layout(t):
    """``t``'s (shape, strides): with its dtype, all that a launch's host side reads of a tensor."""
    return t.shape, t.stride()


@lru_cache(maxsize=4096)
def strided_layout(shape, layouts):
    """How a kernel reads tensors of ``layouts`` (a tuple of :func:`layout`)
    broadcast at ``shape``: the merged sizes after the first (``nd_offset``'s
    size1..size5), every tensor's merged strides (six each, one after the
    other), and each tensor's ``DENSE`` flag (:func:`dense_strides`). Cached:
    it runs on every launch, and a training step repeats a few hundred layouts."""
    sizes, stride_sets = merge_dims(shape, *[_broadcast_strides(s, st, shape) for s, st in layouts])
    return (tuple(sizes[1:]) + tuple(x for strides in stride_sets for x in strides),
            tuple(dense_strides(sizes, strides) for strides in stride_sets))


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


def dense_strides(shape, strides):
    """Whether ``strides`` (from :func:`merge_dims`) are those of a dense
    row-major tensor of ``shape``: such a tensor is read at the linear index
    itself (``nd_offset(..., DENSE=True)``), saving the divisions."""
    expect = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expect:
            return False
        expect *= size
    return True


@triton.jit
def nd_offset(index, size1, size2, size3, size4, size5,
              stride0, stride1, stride2, stride3, stride4, stride5, DENSE: tl.constexpr = False):
    """Element offset of the row-major linear ``index`` in a 6-d strided
    tensor of sizes (size0, size1, ..., size5) (size0 is implied) and
    strides (stride0, ..., stride5); ``index`` itself when ``DENSE`` (the
    host found the strides dense with :func:`dense_strides`)."""
    if DENSE:
        offset = index
    else:
        i5 = index % size5
        rest = index // size5
        i4 = rest % size4
        rest = rest // size4
        i3 = rest % size3
        rest = rest // size3
        i2 = rest % size2
        rest = rest // size2
        i1 = rest % size1
        i0 = rest // size1
        offset = i0 * stride0 + i1 * stride1 + i2 * stride2 + i3 * stride3 + i4 * stride4 + i5 * stride5
    return offset


@triton.jit
def split_ncdhw(index, channels, depth, height, width):
    """(n, c, d, h, w) of the row-major linear ``index`` into (N, C, D, H, W):
    the spatial families' canonical 3-D geometry (size-1 leading axes for
    fewer spatial axes)."""
    w = index % width
    rest = index // width
    h = rest % height
    rest = rest // height
    d = rest % depth
    rest = rest // depth
    c = rest % channels
    n = rest // channels
    return n, c, d, h, w
