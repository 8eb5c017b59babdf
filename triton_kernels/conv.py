"""Convolutions, Triton kernels (forward and backward).

Implicit GEMM, no im2col in device memory. Two kernels do everything:

* ``_gather_conv_kernel``: one program computes a tile of BLOCK_SIZE_PIXELS
  output pixels (n, p, q flattened) x BLOCK_SIZE_CHANNELS output channels of
  one group, looping over the reduction tap-major: for each tap (i, j), over
  the input channels of the group, BLOCK_SIZE_REDUCTION at a time. The
  pixels x channels operand is gathered from the input on the fly (zero
  padding by masks, computed once per pixel and tap), the channels x output
  channels operand read from the weight through its strides, and the two
  multiplied with ``numerics.dot``. With ``TRANSPOSED`` the gather is the
  one of a transposed convolution (input pixel ``(p + top - i*dh) / sh``
  where that divides exactly): conv2d's input gradient and
  conv_transpose2d's forward. Its programs then take the output pixels one
  phase (p mod sh, q mod sw) at a time, for which each tap divides for all
  pixels or for none: a tap that never divides is skipped, not masked.
* ``_weight_grad_kernel``: conv2d's weight gradient, a tile of output
  channels x (c', i, j) weight entries of one group reduced over the
  N x Ho x Wo output pixels, BLOCK_SIZE_PIXELS at a time. When the tiles
  are fewer than the GPU has room for, the pixels are split (split-K): each
  program sums one range of them into a float32 (float64) partial weight
  gradient, and ``bias_act.sum_splits`` adds the partial sums in a second
  pass, rounding once to the weight's dtype (no atomics: the result is the
  same on every run).

conv2d_bias_act is the forward kernel with ``HAS_BIAS`` and an
``ACTIVATION`` (numerics.ACT_IDENTITY, ACT_RELU, ACT_SIGMOID, ACT_TANH) applied to the
accumulator in the epilogue, before the one store (the plain conv2d passes
HAS_BIAS=False, ACT_IDENTITY). Its backward is one pass of
``bias_act.act_grad_and_bias_grad`` (gz = G * act'(y) from the output y, and
the per-channel sums of gz for the bias, split on the GPU when there are
many pixels: no atomics), then the two kernels above on gz.

conv_transpose2d is conv2d's adjoint, so it reuses them as in the reference:
forward = conv2d's input gradient, dx = conv2d forward, dw = conv2d weight
gradient with the roles of input and output gradient exchanged.

Dots: ``numerics.dot`` of the kind ``numerics.dot_kind`` picks for the
operands (float32 IEEE, or TF32 under ``set_matmul_precision("tf32")``,
16-bit native with a float32 accumulator on a GPU, float64 as sums of
products). Shapes and attributes are checked, and the output shape
derived, by the family's spec (``triflux.specs.conv``). Inputs are read
through their strides (any layout); outputs are new dense tensors.

Pixel indices are int32 where they fit (int64 beyond), so the per-pixel
(n, p, q) division is a 32-bit one; addresses are int64 and split into a part
per pixel and a part per channel or weight entry. The GPU tiles are chosen per
dot kind so that no specialization spills registers (``_GATHER_TILES``,
``_WEIGHT_GRAD_TILES``); with ``set_autotune(True)`` the gather kernel's
tile is measured on a real GPU instead (``triton_kernels.tuning``). A faster
version would need: the weight gradient's tiles and splits tuned per GPU,
channels-last layouts, and pipelined 16-bit operand loads.
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from . import copy, launch, numerics, tuning
from .bias_act import act_grad_and_bias_grad, sum_splits
from .numerics import ACT_IDENTITY, ACTIVATION_CODES, DOT_FP64, DOT_NATIVE, dot, dot_kind, store_value
from ..autotuning import get_autotune
from ..errors import DTypeError
from ..specs.conv import conv2d_bias_act_spec, conv2d_spec, conv_transpose2d_spec

@triton.jit
def _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """The fused epilogue: acc + bias[out_channel] (HAS_BIAS), then the
    ACTIVATION in the accumulator's type."""
    if HAS_BIAS:
        bias_value = tl.load(bias + out_channel * bias_stride, mask=channel_mask, other=0.0).to(acc.dtype)
        acc = acc + bias_value[None, :]
    return numerics.activate(acc, ACTIVATION)


@triton.jit
def _split_pixels(m, out_height, out_width):
    """(n, p, q) of the flattened output pixels m = (n*out_height + p)*out_width + q."""
    n = m // (out_height * out_width)
    rem = m % (out_height * out_width)
    return n, rem // out_width, rem % out_width


# --- the kernels -----------------------------------------------------------------------------

@triton.jit
def _gather_conv_kernel(x, w, y, bias, bias_stride,
                        in_height, in_width, out_height, out_width, batch,
                        reduce_channels, out_channels_per_group, phase_rows, phase_cols,
                        x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                        w_group_stride, w_out_channel_stride, w_reduce_channel_stride,
                        w_height_stride, w_width_stride,
                        y_batch_stride, y_channel_stride, y_height_stride, y_width_stride,
                        stride_height, stride_width, pad_top, pad_left, dilation_height, dilation_width,
                        KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr, TRANSPOSED: tl.constexpr,
                        PIXEL_INDEX_TYPE: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, BLOCK_SIZE_CHANNELS: tl.constexpr,
                        BLOCK_SIZE_REDUCTION: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """y[n, g*Cout + c, p, q] = act(sum_{r < R, i, j} x[n, g*R + r, h, v] * w(g, c, r, i, j) + bias[g*Cout + c])

    with R = reduce_channels, Cout = out_channels_per_group, g the group,
    forward:    h = p*stride_height - pad_top + i*dilation_height      (valid when 0 <= h < in_height)
    TRANSPOSED: h = (p + pad_top - i*dilation_height) / stride_height  (valid when it divides and 0 <= h < in_height)
    (v likewise along the width); w(g, c, r, i, j) read at w + g*w_group_stride + c*w_out_channel_stride
    + r*w_reduce_channel_stride + i*w_height_stride + j*w_width_stride. The bias term only with
    HAS_BIAS (bias[k] at bias + k*bias_stride); act by ACTIVATION (see _bias_act).

    Tap-major: the reduction runs over the taps (i, j), and for each tap over
    the channels r, BLOCK_SIZE_REDUCTION at a time, so (h, v) and their masks
    are per pixel, not per pixel and reduction entry. A program's pixels share
    one phase (p mod phase_rows, q mod phase_cols): program axis 2 is
    g*phase_rows*phase_cols + phase, and the program's pixels are
    p = p'*phase_rows + phase_row (q likewise) for (n, p', q') flattened on
    axis 0. A TRANSPOSED conv gets phase_rows = stride_height (and
    phase_cols = stride_width): within a phase the divisibility of each tap is
    the same for every pixel, taps that never divide are skipped, and
    h = p' + (phase_row + pad_top - i*dilation_height) / stride_height.
    """
    pid_pixels = tl.program_id(0)
    pid_channels = tl.program_id(1)
    phases = phase_rows * phase_cols
    group = (tl.program_id(2) // phases).to(tl.int64)
    phase = tl.program_id(2) % phases
    phase_row = phase // phase_cols
    phase_col = phase % phase_cols
    sub_height = (out_height - phase_row + phase_rows - 1) // phase_rows    # rows p of this phase
    sub_width = (out_width - phase_col + phase_cols - 1) // phase_cols
    num_pixels = batch * sub_height * sub_width
    pixel = pid_pixels.to(PIXEL_INDEX_TYPE) * BLOCK_SIZE_PIXELS + tl.arange(0, BLOCK_SIZE_PIXELS)
    pixel_mask = pixel < num_pixels
    # (a phase can have no pixels: an output smaller than the stride)
    sub_height = tl.maximum(sub_height, 1)
    sub_width = tl.maximum(sub_width, 1)
    pixel = tl.minimum(pixel, tl.maximum(num_pixels - 1, 0))
    n, p_sub, q_sub = _split_pixels(pixel, sub_height, sub_width)
    p = p_sub * phase_rows + phase_row
    q = q_sub * phase_cols + phase_col
    channel = pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < out_channels_per_group
    if DOT == DOT_FP64:
        acc = tl.zeros((BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS), dtype=tl.float32)
    x_image = x + n.to(tl.int64) * x_batch_stride + group * reduce_channels * x_channel_stride
    w_channel = w + group * w_group_stride + channel * w_out_channel_stride
    for tap in range(0, KERNEL_HEIGHT * KERNEL_WIDTH):
        i = tap // KERNEL_WIDTH
        j = tap % KERNEL_WIDTH
        if TRANSPOSED:
            rows_back = phase_row + pad_top - i * dilation_height
            cols_back = phase_col + pad_left - j * dilation_width
            divides = (rows_back % stride_height == 0) & (cols_back % stride_width == 0)
            h = p_sub + rows_back // stride_height
            v = q_sub + cols_back // stride_width
            reduce_end = tl.where(divides, reduce_channels, 0)   # a tap no pixel of the phase reaches: no loop
        else:
            h = p * stride_height - pad_top + i * dilation_height
            v = q * stride_width - pad_left + j * dilation_width
            reduce_end = reduce_channels
        ok = (h >= 0) & (h < in_height) & (v >= 0) & (v < in_width) & pixel_mask
        x_pixel = x_image + h.to(tl.int64) * x_height_stride + v.to(tl.int64) * x_width_stride
        w_tap = w_channel + i * w_height_stride + j * w_width_stride
        for r0 in range(0, reduce_end, BLOCK_SIZE_REDUCTION):
            r = r0 + tl.arange(0, BLOCK_SIZE_REDUCTION)
            r_mask = r < reduce_channels
            a = tl.load(x_pixel[:, None] + r[None, :].to(tl.int64) * x_channel_stride,
                        mask=ok[:, None] & r_mask[None, :], other=0.0)
            b = tl.load(w_tap[None, :] + r[:, None] * w_reduce_channel_stride,
                        mask=r_mask[:, None] & channel_mask[None, :], other=0.0)
            acc = dot(acc, a, b, DOT)
    out_channel = group * out_channels_per_group + channel
    acc = _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS, ACTIVATION)
    y_pixel = (y + n.to(tl.int64) * y_batch_stride + p.to(tl.int64) * y_height_stride
               + q.to(tl.int64) * y_width_stride)
    tl.store(y_pixel[:, None] + out_channel[None, :] * y_channel_stride, store_value(acc, y.dtype.element_ty, INTERP),
             mask=pixel_mask[:, None] & channel_mask[None, :])


@triton.jit
def _weight_grad_kernel(x, g, dw, in_height, in_width, out_height, out_width, num_pixels, num_splits, groups,
                        in_channels_per_group, out_channels_per_group,
                        x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                        g_batch_stride, g_channel_stride, g_height_stride, g_width_stride,
                        dw_split_stride, dw_out_channel_stride, dw_in_channel_stride, dw_height_stride,
                        dw_width_stride,
                        stride_height, stride_width, pad_top, pad_left, dilation_height, dilation_width,
                        KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr, PIXEL_INDEX_TYPE: tl.constexpr,
                        BLOCK_SIZE_CHANNELS: tl.constexpr, BLOCK_SIZE_ENTRIES: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """dw[s, g*Cout + o, c, i, j] = sum_{m = (n, p, q) of split s} g[n, g*Cout + o, p, q] * x[n, g*Cin + c, h, v],
    h = p*stride_height - pad_top + i*dilation_height (v likewise), x read as zero outside its
    bounds; Cout, Cin the channels per group, g the group. The num_pixels = N*out_height*out_width
    pixels m are cut into num_splits ranges [s*num_pixels // num_splits, (s+1)*num_pixels // num_splits)
    (split-K: the sum over s is a second pass; with one split dw is the weight gradient itself).
    A program computes BLOCK_SIZE_CHANNELS output channels x BLOCK_SIZE_ENTRIES weight entries
    (c, i, j) of one group and one split (program axis 2 = s*groups + g)."""
    pid_channels = tl.program_id(0)
    pid_entries = tl.program_id(1)
    group = (tl.program_id(2) % groups).to(tl.int64)
    split = (tl.program_id(2) // groups).to(tl.int64)
    channel = pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < out_channels_per_group
    entry = pid_entries * BLOCK_SIZE_ENTRIES + tl.arange(0, BLOCK_SIZE_ENTRIES)
    entry_mask = entry < in_channels_per_group * KERNEL_HEIGHT * KERNEL_WIDTH
    c = entry // (KERNEL_HEIGHT * KERNEL_WIDTH)
    tap = entry % (KERNEL_HEIGHT * KERNEL_WIDTH)
    i = tap // KERNEL_WIDTH
    j = tap % KERNEL_WIDTH
    out_channel = group * out_channels_per_group + channel
    tap_rows = i * dilation_height      # h = (p*stride_height - pad_top) + tap_rows
    tap_cols = j * dilation_width
    # the addresses split into a part per pixel and a part per channel or entry
    g_channel = g + out_channel * g_channel_stride
    x_entry = (x + (group * in_channels_per_group + c) * x_channel_stride + tap_rows.to(tl.int64) * x_height_stride
               + tap_cols.to(tl.int64) * x_width_stride)
    m_lo = (split * num_pixels // num_splits).to(PIXEL_INDEX_TYPE)
    m_hi = ((split + 1) * num_pixels // num_splits).to(PIXEL_INDEX_TYPE)
    if DOT == DOT_FP64:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float32)
    for m0 in range(m_lo, m_hi, BLOCK_SIZE_PIXELS):
        pixel = m0 + tl.arange(0, BLOCK_SIZE_PIXELS)
        pixel_mask = pixel < m_hi
        n, p, q = _split_pixels(pixel, out_height, out_width)
        n = n.to(tl.int64)
        a = tl.load(g_channel[:, None] + (n * g_batch_stride + p.to(tl.int64) * g_height_stride
                                          + q.to(tl.int64) * g_width_stride)[None, :],
                    mask=channel_mask[:, None] & pixel_mask[None, :], other=0.0)
        top = p * stride_height - pad_top
        left = q * stride_width - pad_left
        h = top[:, None] + tap_rows[None, :]
        v = left[:, None] + tap_cols[None, :]
        ok = (h >= 0) & (h < in_height) & (v >= 0) & (v < in_width) & pixel_mask[:, None] & entry_mask[None, :]
        x_pixel = n * x_batch_stride + top.to(tl.int64) * x_height_stride + left.to(tl.int64) * x_width_stride
        b = tl.load(x_entry[None, :] + x_pixel[:, None], mask=ok, other=0.0)
        acc = dot(acc, a, b, DOT)
    dw_pointer = (dw + split * dw_split_stride + out_channel[:, None] * dw_out_channel_stride
                  + c[None, :] * dw_in_channel_stride + i[None, :] * dw_height_stride + j[None, :] * dw_width_stride)
    tl.store(dw_pointer, store_value(acc, dw.dtype.element_ty, INTERP),
             mask=channel_mask[:, None] & entry_mask[None, :])


# --- launch helpers ---------------------------------------------------------------------------

#: programs a launch aims at, per SM of the GPU (launch.sm_count): with 8-warp programs,
#: 16 warps on each SM, enough to keep its FMA pipes busy
PROGRAMS_PER_SM = 2
#: the fewest pixels one split of a weight gradient sums
MIN_PIXELS_PER_SPLIT = 32

# GPU tiles by dot kind, ((block sizes), num_warps, num_stages): among the tiles that compile
# without a register spill for sm_90 and for sm_80 (every specialization of the UNet training
# steps, float32, 16-bit and float64), those with the most multiply-adds per instruction in the
# hot loop. The entry None: float32 (FFMA, also mixed 16-bit/float32 operands, and TF32).
#: _gather_conv_kernel: (BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS, BLOCK_SIZE_REDUCTION), the
#: first tile that makes _target_programs programs, else the last (smaller) one
_GATHER_TILES = {DOT_NATIVE.value: [((128, 64, 32), 8, 3), ((64, 32, 32), 4, 3)],
                 DOT_FP64.value: [((32, 16, 16), 8, 2)],
                 None: [((64, 64, 16), 8, 1), ((64, 32, 16), 8, 1)]}
#: _weight_grad_kernel: (BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES, BLOCK_SIZE_PIXELS); split-K
#: makes the programs
_WEIGHT_GRAD_TILES = {DOT_NATIVE.value: ((64, 64, 32), 8, 3), DOT_FP64.value: ((32, 16, 16), 4, 3),
                      None: ((64, 64, 16), 8, 2)}


def _p2(n):
    return launch.next_pow2(max(int(n), 1))


def _pixel_index_type(num_pixels, block):
    """The Triton integer type of pixel indices: int32 where every index (and
    a block's overhang) fits, which keeps the per-pixel division cheap; int64 beyond."""
    return tl.int32 if num_pixels + block < 2 ** 31 else tl.int64


def _target_programs(device):
    """Programs a launch on ``device`` aims at: PROGRAMS_PER_SM per SM."""
    return PROGRAMS_PER_SM * launch.sm_count(device.index)


def _gather_gpu_tile(kind, num_pixels, channels, grid_z, target_programs):
    """The tile ``(block sizes, num_warps, num_stages)`` of
    _gather_conv_kernel on a GPU for dot kind ``kind``: the first of
    ``_GATHER_TILES`` with ``target_programs`` programs, else the last."""
    for tile in _GATHER_TILES.get(kind, _GATHER_TILES[None]):
        blocks = tile[0]
        if launch.cdiv(num_pixels, blocks[0]) * launch.cdiv(channels, blocks[1]) * grid_z >= target_programs:
            break
    return tile


#: the constexprs a gather-conv tile sets
GATHER_TUNED_NAMES = ("BLOCK_SIZE_PIXELS", "BLOCK_SIZE_CHANNELS", "BLOCK_SIZE_REDUCTION")


@lru_cache(maxsize=None)
def _tuned_gather():
    """_gather_conv_kernel under triton.autotune (``set_autotune``), keyed on the sizes, kernel and dot kind."""
    return tuning.Tuned(_gather_conv_kernel, GATHER_TUNED_NAMES, _GATHER_TILES,
                        key=["batch", "out_height", "out_width", "reduce_channels", "out_channels_per_group",
                             "phase_rows", "phase_cols", "KERNEL_HEIGHT", "KERNEL_WIDTH", "DOT"])


def _interpreter_tiles(M, N, K, dtype, n_cap=64, k_cap=256):
    """(BM, BN, BK) for an M x N output tile reduced over K in the
    interpreter, which pays per program and per loop step: as big as NumPy
    handles well (the product tile of float64 is materialised), at least 16
    each (tl.dot's minimum)."""
    bm, bn = max(16, min(_p2(M), 512)), max(16, min(_p2(N), n_cap))
    cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
    return bm, bn, max(16, min(_p2(K), k_cap, cap // (bm * bn)))


def _gather_conv(x, w, y, spec, reduce_channels, out_channels_per_group, w_strides, transposed,
                 bias=None, activation=ACT_IDENTITY.value):
    """y from x by _gather_conv_kernel with the spec's attributes; ``w_strides``
    (group, output channel, reduced channel) say how the kernel reads w. A
    transposed conv runs its output pixels by phase (p mod stride, q mod stride)."""
    N, _, H, W = x.shape
    _, _, HO, WO = y.shape
    kh, kw = spec.kernel_size
    if N * HO * WO == 0 or out_channels_per_group == 0:
        return y
    (sh, sw), (pt, _, pl, _), (dh, dw) = spec.stride, spec.padding, spec.dilation
    phase_rows, phase_cols = (sh, sw) if transposed else (1, 1)
    NP = N * launch.cdiv(HO, phase_rows) * launch.cdiv(WO, phase_cols)     # pixels of the largest phase
    kind = dot_kind(x.dtype, w.dtype)
    grid_z = spec.groups * phase_rows * phase_cols
    if launch.INTERPRET:
        (bp, bc, bk), options = _interpreter_tiles(NP, out_channels_per_group, reduce_channels, x.dtype), {}
    else:
        tile = _gather_gpu_tile(kind, NP, out_channels_per_group, grid_z, _target_programs(x.device))
        (bp, bc, bk), options = tile[0], dict(num_warps=tile[1], num_stages=tile[2])
    has_bias = bias is not None
    args = (x, w, y, bias if has_bias else y, bias.stride(0) if has_bias else 0,
            H, W, HO, WO, N, reduce_channels, out_channels_per_group, phase_rows, phase_cols,
            *x.stride(), *w_strides, w.stride(2), w.stride(3), *y.stride(), sh, sw, pt, pl, dh, dw)
    meta = dict(KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, TRANSPOSED=transposed, DOT=kind, INTERP=launch.INTERPRET,
                HAS_BIAS=has_bias, ACTIVATION=activation)
    if get_autotune() and not launch.INTERPRET:
        tiles = _GATHER_TILES.get(kind, _GATHER_TILES[None])
        _tuned_gather().launch(
            lambda t: (launch.cdiv(NP, t["BLOCK_SIZE_PIXELS"]), launch.cdiv(out_channels_per_group,
                                                                             t["BLOCK_SIZE_CHANNELS"]), grid_z),
            tuning.ranked(tiles, tile), *args,
            PIXEL_INDEX_TYPE=_pixel_index_type(NP, max(t[0][0] for t in tiles)), **meta)
        return y
    grid = (launch.cdiv(NP, bp), launch.cdiv(out_channels_per_group, bc), grid_z)
    launch.launch(_gather_conv_kernel, grid, *args, PIXEL_INDEX_TYPE=_pixel_index_type(NP, bp),
                  BLOCK_SIZE_PIXELS=bp, BLOCK_SIZE_CHANNELS=bc, BLOCK_SIZE_REDUCTION=bk, **meta, **options)
    return y


def _check_floating(x):
    if not x.dtype.is_floating_point:
        raise DTypeError(f"conv on the GPU needs floating inputs, got {x.dtype}")


def _conv2d(x, w, spec, bias=None, activation=ACT_IDENTITY.value):
    """The spec's conv2d forward of x into a new dense tensor (the reference's
    formula); with ``bias`` and an ``activation`` code the fused act(conv2d + bias)."""
    Cg, Cout = spec.in_channels_per_group, spec.out_channels_per_group
    y = launch.empty(spec.out_shape, x.dtype, x.device)
    if Cg == 0 and bias is None and activation == ACT_IDENTITY.value:
        return copy.full(y.shape, 0.0, x.dtype, x.device) if y.numel() else y
    # weight entry (g, c, r) = w[g*Cout + c, r]  (Cg == 0: an empty reduction, acc stays 0)
    return _gather_conv(x, w, y, spec, Cg, Cout, (Cout * w.stride(0), w.stride(0), w.stride(1)),
                        transposed=False, bias=bias, activation=activation)


def _conv2d_input_grad(g, w, spec, dtype):
    """The spec's conv2d input gradient (= conv_transpose2d forward) into a
    new dense tensor of the spec's input shape."""
    O, Cg = spec.w_shape[:2]
    dx = launch.empty(spec.x_shape, dtype, g.device)
    if dx.numel() == 0:
        return dx
    if O == 0 or g.shape[2] == 0 or g.shape[3] == 0:
        return copy.full(spec.x_shape, 0.0, dtype, g.device)
    # output channel c of group g reduces over r < Cout: weight (g, c, r) = w[g*Cout + r, c]
    Cout = spec.out_channels_per_group
    return _gather_conv(g, w, dx, spec, Cout, Cg, (Cout * w.stride(0), w.stride(1), w.stride(0)), transposed=True)


def _weight_grad_splits(programs, num_pixels, target_programs):
    """How many pixel ranges (splits) a weight gradient of ``programs`` tiles
    sums separately: enough that the launch has ``target_programs`` programs,
    each split at least MIN_PIXELS_PER_SPLIT pixels; one in the interpreter
    (which pays per program)."""
    if launch.INTERPRET or programs >= target_programs:
        return 1
    return max(1, min(launch.cdiv(target_programs, programs), num_pixels // MIN_PIXELS_PER_SPLIT))


def _conv2d_weight_grad(x, g, spec, dtype):
    """The spec's conv2d weight gradient into a new dense tensor of the spec's
    weight shape: _weight_grad_kernel, split over the pixels into float32
    (float64) partial sums and sum_splits when it has few tiles."""
    O, Cg, kh, kw = spec.w_shape
    N, _, H, W = x.shape
    _, _, HO, WO = g.shape
    dw = launch.empty(spec.w_shape, dtype, x.device)
    if dw.numel() == 0:
        return dw
    NM = N * HO * WO
    if NM == 0:
        return copy.full(spec.w_shape, 0.0, dtype, x.device)
    OG = spec.out_channels_per_group
    Q = Cg * kh * kw
    kind = dot_kind(x.dtype, g.dtype)
    if launch.INTERPRET:
        (bo, bq, bm), options = _interpreter_tiles(OG, Q, NM, x.dtype, n_cap=128, k_cap=1024), {}
    else:
        (bo, bq, bm), warps, stages = _WEIGHT_GRAD_TILES.get(kind, _WEIGHT_GRAD_TILES[None])
        options = dict(num_warps=warps, num_stages=stages)
    tiles = (launch.cdiv(OG, bo), launch.cdiv(Q, bq))
    splits = _weight_grad_splits(tiles[0] * tiles[1] * spec.groups, NM, _target_programs(x.device))
    if splits == 1:
        partial_sums = dw.unsqueeze(0)
    else:
        acc_dtype = torch.float64 if kind == DOT_FP64.value else torch.float32
        partial_sums = launch.empty((splits,) + tuple(spec.w_shape), acc_dtype, x.device)
    (sh, sw), (pt, _, pl, _), (dh, dwl) = spec.stride, spec.padding, spec.dilation
    launch.launch(_weight_grad_kernel, tiles + (spec.groups * splits,), x, g, partial_sums,
                  H, W, HO, WO, NM, splits, spec.groups, Cg, OG,
                  *x.stride(), *g.stride(), *partial_sums.stride(), sh, sw, pt, pl, dh, dwl,
                  KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, PIXEL_INDEX_TYPE=_pixel_index_type(NM, bm),
                  BLOCK_SIZE_CHANNELS=bo, BLOCK_SIZE_ENTRIES=bq, BLOCK_SIZE_PIXELS=bm, DOT=kind,
                  INTERP=launch.INTERPRET, **options)
    if splits > 1:
        sum_splits(partial_sums.view(splits, -1), dw.view(-1))
    return dw


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w) (see the reference for the formula)."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    _check_floating(x)
    return _conv2d(x, w, spec)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                    needs=(True, True)):
    """dx = the transposed-conv gather of G with w; dw = the reduction of G x
    im2col(x) over N x Ho x Wo (see the reference); only those in ``needs``."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    dx = _conv2d_input_grad(grad, w, spec, x.dtype) if needs[0] else None
    dw = _conv2d_weight_grad(x, grad, spec, w.dtype) if needs[1] else None
    return dx, dw


def conv_transpose2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                             dilation=(1, 1), groups=1):
    """y = conv_transpose2d(x, w): its adjoint conv2d's input gradient (see the reference)."""
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    _check_floating(x)
    return _conv2d_input_grad(x, w, spec.adjoint, x.dtype)


def conv_transpose2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0),
                              output_padding=(0, 0), dilation=(1, 1), groups=1, needs=(True, True)):
    """dx = conv2d(G, w); dw = conv2d's weight gradient with input G and output
    gradient x; only those in ``needs``."""
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    # output_padding of a stride or more adds positions no input reaches (see the reference)
    H, W = x.shape[2:]
    if not needs[0]:
        dx = None
    elif x.numel() == 0:
        dx = launch.empty(tuple(x.shape), x.dtype, x.device)
    else:
        dx = copy.contiguous(_conv2d(grad, w, spec.adjoint)[:, :, :H, :W])
    if not needs[1]:
        return dx, None
    if spec.extra != (0, 0):
        padded = copy.full((x.shape[0], x.shape[1], H + spec.extra[0], W + spec.extra[1]), 0, x.dtype, x.device)
        copy.copy_into(padded[:, :, :H, :W], x)
        x = padded
    dw = _conv2d_weight_grad(grad, x, spec.adjoint, w.dtype)
    return dx, dw


# --- conv2d with bias and activation fused --------------------------------------------------

def _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation):
    return conv2d_bias_act_spec(x.shape, w.shape, b.shape, x.dtype, w.dtype, b.dtype, stride, padding, dilation,
                                groups, activation)


def conv2d_bias_act_forward(x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                            activation="identity"):
    """y = act(conv2d(x, w) + b) (see the reference): the conv kernel with the
    bias and the activation applied in its epilogue, before the one store."""
    spec = _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation)
    _check_floating(x)
    if b.device != x.device:
        raise ValueError(f"conv2d_bias_act: the bias is on {b.device} but x on {x.device}")
    return _conv2d(x, w, spec, bias=b, activation=ACTIVATION_CODES[activation])


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity", needs=(True, True, True)):
    """gz = G * act'(y) and db = sum_{n, p, q} gz in one kernel (from the output
    y alone), then conv2d's input- and weight-gradient kernels on gz (those in
    ``needs``; db comes with gz whether needed or not)."""
    spec = _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation)
    gz, db = act_grad_and_bias_grad(grad, out, b, ACTIVATION_CODES[activation])
    dx = _conv2d_input_grad(gz, w, spec, x.dtype) if needs[0] else None
    dw = _conv2d_weight_grad(x, gz, spec, w.dtype) if needs[1] else None
    return dx, dw, db if needs[2] else None
