"""Convolutions of any spatial rank, Triton kernels (forward and backward).

Implicit GEMM, no im2col in device memory. Every rank runs in one canonical
3-D geometry (D, H, W): a 1-D or 2-D conv has size-1 axes in front (kernel 1,
stride 1, no padding), and the kernels' ``DEPTH`` constexpr (true for R = 3
only) leaves the depth axis out of the arithmetic, so a 2-D launch compiles to
the 2-D kernel it was (Triton also specializes the size-1 ints to constants).
Two kernels do everything:

* ``_gather_conv_kernel``: one program computes a tile of BLOCK_SIZE_PIXELS
  output positions (n, r, p, q flattened) x BLOCK_SIZE_CHANNELS output
  channels of one group, looping over the reduction tap-major: for each tap
  (a, i, j), over the input channels of the group, BLOCK_SIZE_REDUCTION at a
  time. The positions x channels operand is gathered from the input on the
  fly (zero padding by masks, computed once per position and tap), the
  channels x output channels operand read from the weight through its
  strides, and the two multiplied with ``numerics.dot``. With ``TRANSPOSED``
  the gather is the one of a transposed convolution (input position
  ``(p + top - i*dh) / sh`` where that divides exactly, on each axis): conv's
  input gradient and conv_transpose's forward. Its programs then take the
  output positions one phase (each position modulo the stride) at a time,
  for which each tap divides for all positions or for none: a tap that never
  divides is skipped, not masked. A launch of few positions and many reduced
  channels (a UNet's deepest levels) splits the channels into ranges (split-K,
  ``SPLIT``): each program sums one range into a float32 (float64) partial
  output, and ``bias_act.sum_splits`` adds them in a second pass.
* ``_weight_grad_kernel``: conv's weight gradient, a tile of output
  channels x (c', a, i, j) weight entries of one group reduced over the
  N x Do x Ho x Wo output positions, BLOCK_SIZE_PIXELS at a time. When the
  tiles do not fill whole rounds of the GPU, the positions are split
  (split-K): each program sums one range of them into a float32 (float64)
  partial weight gradient, and ``bias_act.sum_splits`` adds the partial sums
  in a second pass, rounding once to the weight's dtype (no atomics: the
  result is the same on every run).

How many splits, for either kernel: the count whose predicted time, launch
and sum pass together, is least by the kernel report's model
(``_split_time``: the rounds of the GPU the grid takes, each as long as a
program's share, against the bytes the partial sums add), and only where that
saves ``_MIN_SPLIT_SAVING_US`` (``_fastest_split``).

conv_bias_act is the forward kernel with ``HAS_BIAS`` and an ``ACTIVATION``
(numerics.ACT_IDENTITY, ACT_RELU, ACT_SIGMOID, ACT_TANH) applied to the
accumulator in the epilogue, before the one store (the plain conv passes
HAS_BIAS=False, ACT_IDENTITY). Its backward is one pass of
``bias_act.act_grad_and_bias_grad`` (gz = G * act'(y) from the output y, and
the per-channel sums of gz for the bias, split on the GPU when there are
many positions: no atomics), then the two kernels above on gz.

conv_transpose is conv's adjoint, so it reuses them as in the reference:
forward = conv's input gradient, dx = conv forward, dw = conv weight
gradient with the roles of input and output gradient exchanged.

Dots: ``numerics.dot`` of the kind ``numerics.dot_kind`` picks for the
operands (float32 IEEE, or TF32 under ``set_matmul_precision("tf32")``,
16-bit native with a float32 accumulator on a GPU, float64 as sums of
products). Shapes and attributes are checked, and the output shape
derived, by the family's spec (``triflux.specs.conv``). Inputs are read
through their strides (any layout); outputs are new dense tensors.

Position indices are int32 where they fit (int64 beyond), so the per-position
(n, r, p, q) division is a 32-bit one; addresses are int64 and split into a part
per pixel and a part per channel or weight entry. The GPU tiles are chosen per
dot kind so that no specialization spills registers (``_GATHER_TILES``,
``_WEIGHT_GRAD_TILES``, ``FEW_OUT_CHANNELS``); with ``set_autotune(True)`` the gather kernel's
tile is measured on a real GPU instead (``triton_kernels.tuning``; it does not
split). A faster version would need: the weight gradient's tiles tuned per GPU,
channels-last layouts (16-byte operand loads), and pipelined 16-bit operand loads.
"""
import math
from functools import lru_cache

import torch
import triton
import triton.language as tl

from . import copy, launch, numerics, tuning
from .bias_act import act_grad_and_bias_grad, sum_splits, sum_splits_programs
from .numerics import (ACT_IDENTITY, ACTIVATION_CODES, DOT_FP64, DOT_NATIVE, DOT_TF32, dot, dot_kind,
                       store_value)
from ..autotuning import get_autotune
from ..matmul_precision import get_matmul_precision
from ..errors import DTypeError
from ..gpus import ASSUMED_GPU, GPUS
from ..specs.conv import conv_bias_act_spec, conv_spec, conv_transpose_spec

@triton.jit
def _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """The fused epilogue: acc + bias[out_channel] (HAS_BIAS), then the
    ACTIVATION in the accumulator's type."""
    if HAS_BIAS:
        bias_value = tl.load(bias + out_channel * bias_stride, mask=channel_mask, other=0.0).to(acc.dtype)
        acc = acc + bias_value[None, :]
    return numerics.activate(acc, ACTIVATION)


@triton.jit
def _split_pixels(m, out_depth, out_height, out_width, DEPTH: tl.constexpr):
    """(n, r, p, q) of the flattened output positions m = ((n*out_depth + r)*out_height + p)*out_width + q
    (r = 0 without DEPTH, whose out_depth is 1: no division for it)."""
    plane = out_height * out_width
    if DEPTH:
        n = m // (out_depth * plane)
        rem = m % (out_depth * plane)
        r = rem // plane
        rem = rem % plane
    else:
        n = m // plane
        rem = m % plane
        r = tl.zeros_like(m)
    return n, r, rem // out_width, rem % out_width


@triton.jit
def _split_tap(tap, KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr, DEPTH: tl.constexpr):
    """(a, i, j) of the flattened kernel tap (a*KERNEL_HEIGHT + i)*KERNEL_WIDTH + j (divisions by constants)."""
    j = tap % KERNEL_WIDTH
    rest = tap // KERNEL_WIDTH
    if DEPTH:
        i = rest % KERNEL_HEIGHT
        a = rest // KERNEL_HEIGHT
    else:
        i = rest
        a = rest * 0
    return a, i, j


# --- the kernels -----------------------------------------------------------------------------

@triton.jit
def _gather_conv_kernel(x, w, y, bias, bias_stride,
                        in_depth, in_height, in_width, out_depth, out_height, out_width, batch,
                        reduce_channels, out_channels_per_group, phase_depths, phase_rows, phase_cols,
                        x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                        w_group_stride, w_out_channel_stride, w_reduce_channel_stride,
                        w_depth_stride, w_height_stride, w_width_stride,
                        y_batch_stride, y_channel_stride, y_depth_stride, y_height_stride, y_width_stride,
                        stride_depth, stride_height, stride_width, pad_front, pad_top, pad_left,
                        dilation_depth, dilation_height, dilation_width, num_splits, split_channels, y_split_stride,
                        KERNEL_DEPTH: tl.constexpr, KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr,
                        DEPTH: tl.constexpr, TRANSPOSED: tl.constexpr, PIXEL_INDEX_TYPE: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, BLOCK_SIZE_CHANNELS: tl.constexpr,
                        BLOCK_SIZE_REDUCTION: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, SPLIT: tl.constexpr):
    """y[n, g*Cout + c, r, p, q] = act(sum_{k < K, a, i, j} x[n, g*K + k, e, h, v] * w(g, c, k, a, i, j) + bias[g*Cout + c])

    the canonical 3-D geometry of every rank (a 1-D or 2-D conv has size-1
    axes in front, and without DEPTH the depth axis is left out of the
    arithmetic altogether), with K = reduce_channels, Cout = out_channels_per_group, g the group,
    forward:    h = p*stride_height - pad_top + i*dilation_height      (valid when 0 <= h < in_height)
    TRANSPOSED: h = (p + pad_top - i*dilation_height) / stride_height  (valid when it divides and 0 <= h < in_height)
    (e along the depth and v along the width likewise); w(g, c, k, a, i, j) read at w + g*w_group_stride
    + c*w_out_channel_stride + k*w_reduce_channel_stride + a*w_depth_stride + i*w_height_stride
    + j*w_width_stride. The bias term only with HAS_BIAS (bias[o] at bias + o*bias_stride); act by
    ACTIVATION (see _bias_act).

    Tap-major: the reduction runs over the taps (a, i, j), and for each tap over
    the channels k, BLOCK_SIZE_REDUCTION at a time, so (e, h, v) and their masks
    are per output position, not per position and reduction entry. A program's
    positions share one phase (r mod phase_depths, p mod phase_rows, q mod phase_cols):
    program axis 2 is g*phases + phase, and the program's positions are
    p = p'*phase_rows + phase_row (r, q likewise) for (n, r', p', q') flattened on
    axis 0. A TRANSPOSED conv gets the strides as phases: within a phase the
    divisibility of each tap is the same for every position, taps that never
    divide are skipped, and h = p' + (phase_row + pad_top - i*dilation_height) / stride_height.

    Split-K (SPLIT, no bias or activation): program axis 2 is (g*phases + phase)*num_splits
    + s, split s sums the reduced channels k in [s*split_channels, (s+1)*split_channels) only, and
    writes its partial sum (y's type, float32 or float64) at y + s*y_split_stride; a second pass
    adds the splits up. A launch of few output positions (a UNet's deepest levels) gets its
    programs this way.
    """
    pid_pixels = tl.program_id(0)
    pid_channels = tl.program_id(1)
    phases = phase_depths * phase_rows * phase_cols
    if SPLIT:
        split = tl.program_id(2) % num_splits
        group_phase = tl.program_id(2) // num_splits
        k_lo = split * split_channels                       # this split's reduced channels [k_lo, k_hi)
        k_hi = tl.minimum(k_lo + split_channels, reduce_channels)
        y += split.to(tl.int64) * y_split_stride
    else:
        group_phase = tl.program_id(2)
        k_lo = 0
        k_hi = reduce_channels
    group = (group_phase // phases).to(tl.int64)
    phase = group_phase % phases
    phase_col = phase % phase_cols
    if DEPTH:
        phase_row = (phase // phase_cols) % phase_rows
        phase_depth = phase // (phase_cols * phase_rows)
        sub_depth = (out_depth - phase_depth + phase_depths - 1) // phase_depths
    else:
        phase_row = phase // phase_cols
        phase_depth = 0
        sub_depth = 1
    sub_height = (out_height - phase_row + phase_rows - 1) // phase_rows    # rows p of this phase
    sub_width = (out_width - phase_col + phase_cols - 1) // phase_cols
    num_pixels = batch * sub_depth * sub_height * sub_width
    pixel = pid_pixels.to(PIXEL_INDEX_TYPE) * BLOCK_SIZE_PIXELS + tl.arange(0, BLOCK_SIZE_PIXELS)
    pixel_mask = pixel < num_pixels
    # (a phase can have no positions: an output smaller than the stride)
    sub_height = tl.maximum(sub_height, 1)
    sub_width = tl.maximum(sub_width, 1)
    if DEPTH:
        sub_depth = tl.maximum(sub_depth, 1)
    pixel = tl.minimum(pixel, tl.maximum(num_pixels - 1, 0))
    n, r_sub, p_sub, q_sub = _split_pixels(pixel, sub_depth, sub_height, sub_width, DEPTH)
    r = r_sub * phase_depths + phase_depth
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
    for tap in range(0, KERNEL_DEPTH * KERNEL_HEIGHT * KERNEL_WIDTH):
        a, i, j = _split_tap(tap, KERNEL_HEIGHT, KERNEL_WIDTH, DEPTH)
        if TRANSPOSED:
            rows_back = phase_row + pad_top - i * dilation_height
            cols_back = phase_col + pad_left - j * dilation_width
            divides = (rows_back % stride_height == 0) & (cols_back % stride_width == 0)
            h = p_sub + rows_back // stride_height
            v = q_sub + cols_back // stride_width
            if DEPTH:
                depths_back = phase_depth + pad_front - a * dilation_depth
                divides = divides & (depths_back % stride_depth == 0)
                e = r_sub + depths_back // stride_depth
            reduce_end = tl.where(divides, k_hi, k_lo)   # a tap no position of the phase reaches: no loop
        else:
            h = p * stride_height - pad_top + i * dilation_height
            v = q * stride_width - pad_left + j * dilation_width
            if DEPTH:
                e = r * stride_depth - pad_front + a * dilation_depth
            reduce_end = k_hi
        ok = (h >= 0) & (h < in_height) & (v >= 0) & (v < in_width) & pixel_mask
        x_pixel = x_image + h.to(tl.int64) * x_height_stride + v.to(tl.int64) * x_width_stride
        w_tap = w_channel + i * w_height_stride + j * w_width_stride
        if DEPTH:
            ok = ok & (e >= 0) & (e < in_depth)
            x_pixel += e.to(tl.int64) * x_depth_stride
            w_tap += a * w_depth_stride
        for k0 in range(k_lo, reduce_end, BLOCK_SIZE_REDUCTION):
            k = k0 + tl.arange(0, BLOCK_SIZE_REDUCTION)
            k_mask = k < k_hi
            lhs = tl.load(x_pixel[:, None] + k[None, :].to(tl.int64) * x_channel_stride,
                          mask=ok[:, None] & k_mask[None, :], other=0.0)
            rhs = tl.load(w_tap[None, :] + k[:, None] * w_reduce_channel_stride,
                          mask=k_mask[:, None] & channel_mask[None, :], other=0.0)
            acc = dot(acc, lhs, rhs, DOT)
    out_channel = group * out_channels_per_group + channel
    acc = _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS, ACTIVATION)
    y_pixel = (y + n.to(tl.int64) * y_batch_stride + p.to(tl.int64) * y_height_stride
               + q.to(tl.int64) * y_width_stride)
    if DEPTH:
        y_pixel += r.to(tl.int64) * y_depth_stride
    tl.store(y_pixel[:, None] + out_channel[None, :] * y_channel_stride, store_value(acc, y.dtype.element_ty, INTERP),
             mask=pixel_mask[:, None] & channel_mask[None, :])


@triton.jit
def _weight_grad_kernel(x, g, dw, in_depth, in_height, in_width, out_depth, out_height, out_width, num_pixels,
                        num_splits, groups, in_channels_per_group, out_channels_per_group,
                        x_batch_stride, x_channel_stride, x_depth_stride, x_height_stride, x_width_stride,
                        g_batch_stride, g_channel_stride, g_depth_stride, g_height_stride, g_width_stride,
                        dw_split_stride, dw_out_channel_stride, dw_in_channel_stride, dw_depth_stride,
                        dw_height_stride, dw_width_stride,
                        stride_depth, stride_height, stride_width, pad_front, pad_top, pad_left,
                        dilation_depth, dilation_height, dilation_width,
                        KERNEL_DEPTH: tl.constexpr, KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr,
                        DEPTH: tl.constexpr, PIXEL_INDEX_TYPE: tl.constexpr,
                        BLOCK_SIZE_CHANNELS: tl.constexpr, BLOCK_SIZE_ENTRIES: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """dw[s, g*Cout + o, c, a, i, j] = sum_{m = (n, r, p, q) of split s} g[n, g*Cout + o, r, p, q] * x[n, g*Cin + c, e, h, v],
    h = p*stride_height - pad_top + i*dilation_height (e, v likewise), x read as zero outside its
    bounds; Cout, Cin the channels per group, g the group; the canonical 3-D geometry of every
    rank (without DEPTH the depth axis is left out of the arithmetic). The num_pixels =
    N*out_depth*out_height*out_width positions m are cut into num_splits ranges
    [s*num_pixels // num_splits, (s+1)*num_pixels // num_splits) (split-K: the sum over s is a
    second pass; with one split dw is the weight gradient itself). A program computes
    BLOCK_SIZE_CHANNELS output channels x BLOCK_SIZE_ENTRIES weight entries (c, a, i, j) of one
    group and one split (program axis 2 = s*groups + g)."""
    pid_channels = tl.program_id(0)
    pid_entries = tl.program_id(1)
    group = (tl.program_id(2) % groups).to(tl.int64)
    split = (tl.program_id(2) // groups).to(tl.int64)
    channel = pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < out_channels_per_group
    entry = pid_entries * BLOCK_SIZE_ENTRIES + tl.arange(0, BLOCK_SIZE_ENTRIES)
    entry_mask = entry < in_channels_per_group * KERNEL_DEPTH * KERNEL_HEIGHT * KERNEL_WIDTH
    c = entry // (KERNEL_DEPTH * KERNEL_HEIGHT * KERNEL_WIDTH)
    a, i, j = _split_tap(entry % (KERNEL_DEPTH * KERNEL_HEIGHT * KERNEL_WIDTH), KERNEL_HEIGHT, KERNEL_WIDTH, DEPTH)
    out_channel = group * out_channels_per_group + channel
    tap_rows = i * dilation_height      # h = (p*stride_height - pad_top) + tap_rows
    tap_cols = j * dilation_width
    # the addresses split into a part per position and a part per channel or entry
    g_channel = g + out_channel * g_channel_stride
    x_entry = (x + (group * in_channels_per_group + c) * x_channel_stride + tap_rows.to(tl.int64) * x_height_stride
               + tap_cols.to(tl.int64) * x_width_stride)
    if DEPTH:
        tap_depths = a * dilation_depth
        x_entry += tap_depths.to(tl.int64) * x_depth_stride
    m_lo = (split * num_pixels // num_splits).to(PIXEL_INDEX_TYPE)
    m_hi = ((split + 1) * num_pixels // num_splits).to(PIXEL_INDEX_TYPE)
    if DOT == DOT_FP64:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float32)
    for m0 in range(m_lo, m_hi, BLOCK_SIZE_PIXELS):
        pixel = m0 + tl.arange(0, BLOCK_SIZE_PIXELS)
        pixel_mask = pixel < m_hi
        n, r, p, q = _split_pixels(pixel, out_depth, out_height, out_width, DEPTH)
        n = n.to(tl.int64)
        g_pixel = n * g_batch_stride + p.to(tl.int64) * g_height_stride + q.to(tl.int64) * g_width_stride
        if DEPTH:
            g_pixel += r.to(tl.int64) * g_depth_stride
        lhs = tl.load(g_channel[:, None] + g_pixel[None, :],
                      mask=channel_mask[:, None] & pixel_mask[None, :], other=0.0)
        top = p * stride_height - pad_top
        left = q * stride_width - pad_left
        h = top[:, None] + tap_rows[None, :]
        v = left[:, None] + tap_cols[None, :]
        ok = (h >= 0) & (h < in_height) & (v >= 0) & (v < in_width) & pixel_mask[:, None] & entry_mask[None, :]
        x_pixel = n * x_batch_stride + top.to(tl.int64) * x_height_stride + left.to(tl.int64) * x_width_stride
        if DEPTH:
            front = r * stride_depth - pad_front
            e = front[:, None] + tap_depths[None, :]
            ok = ok & (e >= 0) & (e < in_depth)
            x_pixel += front.to(tl.int64) * x_depth_stride
        rhs = tl.load(x_entry[None, :] + x_pixel[:, None], mask=ok, other=0.0)
        acc = dot(acc, lhs, rhs, DOT)
    dw_pointer = (dw + split * dw_split_stride + out_channel[:, None] * dw_out_channel_stride
                  + c[None, :] * dw_in_channel_stride + i[None, :] * dw_height_stride + j[None, :] * dw_width_stride)
    if DEPTH:
        dw_pointer += a[None, :] * dw_depth_stride
    tl.store(dw_pointer, store_value(acc, dw.dtype.element_ty, INTERP),
             mask=channel_mask[:, None] & entry_mask[None, :])


# --- launch helpers ---------------------------------------------------------------------------

#: programs a launch aims at, per SM of the GPU (launch.sm_count): with 8-warp programs,
#: 16 warps on each SM, enough to keep its FMA pipes busy
PROGRAMS_PER_SM = 2
#: the fewest pixels one split of a weight gradient sums
MIN_PIXELS_PER_SPLIT = 32
#: the most registers per thread a conv tile below takes on sm_90 (``python -m triflux kernels``;
#: a few 8-warp float32 and bias-and-activation tiles take more), for the wave model: 8-warp
#: programs run two to an SM, 4-warp ones four
_GPU_REGISTERS = 128
#: the fixed cost of a launch (µs; the kernel report's ``LAUNCH_LATENCY_US``): the least a
#: split's second pass (``sum_splits``) adds
_LAUNCH_US = 2.0
#: grids of more rounds of the GPU than this are not split further (a split's plan is cached:
#: the candidates are tried once per shape)
_MAX_ROUNDS = 16
#: the least predicted time (µs) a split must save to be taken: its second launch also costs
#: the host a launch (several µs in an eager step), which the device time does not show
_MIN_SPLIT_SAVING_US = 4.0

# GPU tiles by dot kind, ((block sizes), num_warps, num_stages): among the tiles that compile
# without a register spill for sm_90 and for sm_80 (every specialization of the UNet training
# steps, float32, 16-bit and float64), those with the most multiply-adds per instruction in the
# hot loop. The entry None: float32 (FFMA, also mixed 16-bit/float32 operands, and TF32).
#: _gather_conv_kernel: (BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS, BLOCK_SIZE_REDUCTION), the
#: first tile that makes _target_programs programs, else the last (smaller) one, unless another
#: is much faster split (_gather_gpu_plan)
_GATHER_TILES = {DOT_NATIVE.value: [((128, 64, 32), 8, 3), ((64, 32, 32), 4, 3)],
                 DOT_FP64.value: [((32, 16, 16), 8, 2)],
                 None: [((64, 64, 16), 8, 1), ((64, 32, 16), 8, 1)]}
#: the register cap of a split float32 (FFMA) gather: left to itself, ptxas held the split
#: 64 x 32 tile to 64 registers and spilled 8 bytes on sm_90 (the 3-D UNet's deepest levels);
#: capped at 128 it takes 94 and spills nothing (two 8-warp programs to an SM, as at 64 to 128)
FFMA_SPLIT_REGISTERS = 128
# Whether a gather launch takes the last (smaller) FFMA tile whatever its programs: the
# transposed gathers of 1-D convs in float32 (64 x 64 spilled 4 bytes on sm_90 for a
# stride-2 ConvTranspose with 2 taps; 64 x 32 does not).
def _smaller_gather_tile(kind, rank, transposed):
    return kind not in _GATHER_TILES and rank == 1 and transposed


#: _weight_grad_kernel: (BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES, BLOCK_SIZE_PIXELS); split-K
#: makes the programs
_WEIGHT_GRAD_TILES = {DOT_NATIVE.value: ((64, 64, 32), 8, 3), DOT_FP64.value: ((32, 16, 16), 4, 3),
                      None: ((64, 64, 16), 8, 2)}
#: _weight_grad_kernel in float32 for at most this many output channels per group (a
#: classifier's last 1x1 conv): BLOCK_SIZE_CHANNELS 32, half the tile's idle rows (the 64-row
#: tile spilled 12 bytes on sm_90 for the 3-D UNet's 64 => 2 1x1x1 conv)
FEW_OUT_CHANNELS = 32


def _p2(n):
    return launch.next_pow2(max(int(n), 1))


def _pixel_index_type(num_pixels, block):
    """The Triton integer type of pixel indices: int32 where every index (and
    a block's overhang) fits, which keeps the per-pixel division cheap; int64 beyond."""
    return tl.int32 if num_pixels + block < 2 ** 31 else tl.int64


def _target_programs(device):
    """Programs a launch on ``device`` aims at: PROGRAMS_PER_SM per SM."""
    return PROGRAMS_PER_SM * launch.sm_count(device.index)


def _gather_gpu_tile(kind, num_pixels, channels, grid_z, target_programs, last_only=False):
    """The tile ``(block sizes, num_warps, num_stages)`` of
    _gather_conv_kernel on a GPU for dot kind ``kind``: the first of
    ``_GATHER_TILES`` with ``target_programs`` programs, else the last (the
    last at once with ``last_only``: see ``_smaller_gather_tile``)."""
    tiles = _GATHER_TILES.get(kind, _GATHER_TILES[None])
    for tile in tiles[-1:] if last_only else tiles:
        blocks = tile[0]
        if launch.cdiv(num_pixels, blocks[0]) * launch.cdiv(channels, blocks[1]) * grid_z >= target_programs:
            break
    return tile


#: a gather takes another tile than the one of ``_gather_gpu_tile`` only when that is predicted
#: faster by more than this factor (those tiles are the ones checked for spills launch by launch)
_OTHER_TILE_GAIN = 1.1


@lru_cache(maxsize=4096)
def _gather_gpu_plan(kind, num_pixels, channels, reduce_channels, grid_z, splittable, last_only, sms, flops,
                     in_bytes, out_values, out_itemsize):
    """(tile, splits, reduced channels per split) of _gather_conv_kernel on a GPU of ``sms`` SMs
    for ``num_pixels`` positions (of the largest phase) x ``channels`` output channels x
    ``grid_z`` groups and phases: for each tile of ``_GATHER_TILES`` (the last only with
    ``last_only``: see ``_smaller_gather_tile``), the fewest splits of the reduced channels, in
    blocks of BLOCK_SIZE_REDUCTION, within 2% of its least predicted time (:func:`_fastest_split`;
    one split unless ``splittable``); then the tile :func:`_gather_gpu_tile` picks by its
    programs, unless another is faster by more than _OTHER_TILE_GAIN. A launch of few positions
    and many channels (a UNet's deepest levels) gets its programs from the splits."""
    tiles = _GATHER_TILES.get(kind, _GATHER_TILES[None])
    options = {}
    for tile in tiles[-1:] if last_only else tiles:
        (bp, bc, bk), warps, _ = tile
        rows = launch.cdiv(num_pixels, bp) * launch.cdiv(channels, bc) * grid_z
        units = max(1, launch.cdiv(reduce_channels, bk))
        time, splits, per_split = _fastest_split(rows, units, units if splittable else 1, warps, sms, flops, kind,
                                                 in_bytes, out_values, out_itemsize)
        options[tile] = (time, splits, per_split * bk if splits > 1 else reduce_channels)
    tile = _gather_gpu_tile(kind, num_pixels, channels, grid_z, PROGRAMS_PER_SM * sms, last_only)
    fastest = min(options, key=lambda t: options[t][0])
    if options[fastest][0] * _OTHER_TILE_GAIN < options[tile][0]:
        tile = fastest
    return (tile,) + options[tile][1:]


#: the constexprs a gather-conv tile sets
GATHER_TUNED_NAMES = ("BLOCK_SIZE_PIXELS", "BLOCK_SIZE_CHANNELS", "BLOCK_SIZE_REDUCTION")


@lru_cache(maxsize=None)
def _tuned_gather():
    """_gather_conv_kernel under triton.autotune (``set_autotune``), keyed on the sizes, kernel and dot kind."""
    return tuning.Tuned(_gather_conv_kernel, GATHER_TUNED_NAMES, _GATHER_TILES,
                        key=["batch", "out_depth", "out_height", "out_width", "reduce_channels",
                             "out_channels_per_group", "phase_depths", "phase_rows", "phase_cols", "KERNEL_DEPTH",
                             "KERNEL_HEIGHT", "KERNEL_WIDTH", "DEPTH", "DOT"])


def _interpreter_tiles(M, N, K, dtype, n_cap=64, k_cap=256):
    """(BM, BN, BK) for an M x N output tile reduced over K in the
    interpreter, which pays per program and per loop step: as big as NumPy
    handles well (the product tile of float64 is materialised), at least 16
    each (tl.dot's minimum)."""
    bm, bn = max(16, min(_p2(M), 512)), max(16, min(_p2(N), n_cap))
    cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
    return bm, bn, max(16, min(_p2(K), k_cap, cap // (bm * bn)))


def _lift(values, fill):
    """A rank-R tuple (sides, strides) as rank 3: ``fill`` for the axes in front."""
    values = tuple(values)
    return (fill,) * (3 - len(values)) + values


def _geometry(spec):
    """The canonical 3-D geometry of ``spec`` (any rank): kernel, stride, padding
    before each axis, dilation (3-tuples), and DEPTH (whether the depth axis is real);
    the spec derives it once."""
    return spec.geometry3


def _layout(t):
    """What a host plan reads of a tensor: its shape, strides and dtype (hashable)."""
    return t.shape, t.stride(), t.dtype


def _dense_strides(shape):
    """The strides of a dense row-major tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _choosers():
    """What a host plan is made from besides the tensors and the spec: the
    interpreter and autotuning flags, the float32 matmul precision (the dot
    kind), and the functions that choose tiles, splits and grids. A plan is
    cached on them too, so changing one (``set_matmul_precision``, a test
    forcing splits, the kernel report modelling another GPU's SMs) takes
    effect at the next launch."""
    return (launch.INTERPRET, get_autotune(), get_matmul_precision(), launch.sm_count, _interpreter_tiles,
            _gather_gpu_tile, _gather_gpu_plan, _smaller_gather_tile, _pixel_index_type, _weight_grad_gpu_tile,
            _weight_grad_splits, _target_programs)


class _Launch:
    """A host plan: the grid, the arguments after the tensors, the constexprs
    and options, and the partial sums a split launch needs (``splits``
    copies of the output, float32 or float64), decided once per layout."""
    __slots__ = ("grid", "scalars", "meta", "splits", "partials_shape", "partials_dtype", "tuned")

    def __init__(self, grid, scalars, meta, splits=1, partials_shape=None, partials_dtype=None, tuned=None):
        self.grid, self.scalars, self.meta, self.splits = grid, scalars, meta, splits
        self.partials_shape, self.partials_dtype, self.tuned = partials_shape, partials_dtype, tuned


def _gather_conv(x, w, y, spec, reduce_channels, out_channels_per_group, w_strides, transposed,
                 bias=None, activation=ACT_IDENTITY.value):
    """y from x by _gather_conv_kernel with the spec's attributes (any rank, as
    rank 3); ``w_strides`` (group, output channel, reduced channel) say how
    the kernel reads w. A transposed conv runs its output positions by phase
    (each position modulo the stride). The launch is planned once per layout
    of the tensors (:func:`_gather_plan`)."""
    has_bias = bias is not None
    plan = _gather_plan(spec, reduce_channels, out_channels_per_group, w_strides, transposed,
                        bias.stride(0) if has_bias else None, activation, _layout(x), _layout(w), _layout(y),
                        x.get_device(), _choosers())
    if plan is None:
        return y
    # with splits, the kernel writes float32 (float64) partial sums, one y per split
    out = y if plan.splits == 1 else launch.empty(plan.partials_shape, plan.partials_dtype, y.device)
    args = (x, w, out, bias if has_bias else out) + plan.scalars
    if plan.tuned is not None:
        grid, ranked = plan.tuned
        _tuned_gather().launch(grid, ranked, *args, **plan.meta)
        return y
    launch.launch(_gather_conv_kernel, plan.grid, *args, **plan.meta)
    if plan.splits > 1:
        sum_splits(out.view(plan.splits, -1), y.view(-1))
    return y


@lru_cache(maxsize=4096)
def _gather_plan(spec, reduce_channels, out_channels_per_group, w_strides, transposed, bias_stride, activation,
                 x_layout, w_layout, y_layout, device_index, choosers):
    """The :class:`_Launch` of :func:`_gather_conv` for tensors of these
    layouts (None: nothing to launch), as the :func:`_choosers` decide."""
    tuned = get_autotune() and not launch.INTERPRET
    (x_shape, x_stride, x_dtype), (w_shape, w_stride, w_dtype), (y_shape, y_stride, y_dtype) = \
        x_layout, w_layout, y_layout
    N = x_shape[0]
    D, H, W = _lift(x_shape[2:], 1)
    DO, HO, WO = _lift(y_shape[2:], 1)
    if N * DO * HO * WO == 0 or out_channels_per_group == 0:
        return None
    (kd, kh, kw), (sd, sh, sw), (pf, pt, pl), (dd, dh, dw), depth = _geometry(spec)
    phase_depths, phase_rows, phase_cols = (sd, sh, sw) if transposed else (1, 1, 1)
    # positions of the largest phase
    NP = N * launch.cdiv(DO, phase_depths) * launch.cdiv(HO, phase_rows) * launch.cdiv(WO, phase_cols)
    kind = dot_kind(x_dtype, w_dtype)
    phases = phase_depths * phase_rows * phase_cols
    grid_z = spec.groups * phases
    has_bias = bias_stride is not None
    splits, split_channels = 1, reduce_channels
    device = None if device_index < 0 else device_index
    if launch.INTERPRET:
        (bp, bc, bk), options = _interpreter_tiles(NP, out_channels_per_group, reduce_channels, x_dtype), {}
    else:
        last_only = _smaller_gather_tile(kind, spec.rank, transposed)
        if tuned:
            tile = _gather_gpu_tile(kind, NP, out_channels_per_group, grid_z,
                                    _target_programs(torch.device("cuda", device or 0)), last_only)
        else:
            # split-K only where the epilogue is a plain store into a dense y (sum_splits adds the splits)
            splittable = not has_bias and activation == ACT_IDENTITY.value and y_stride == _dense_strides(y_shape)
            # (a transposed conv's position takes one tap in ``phases`` on average)
            flops = 2.0 * N * DO * HO * WO * spec.groups * out_channels_per_group * reduce_channels * kd * kh * kw
            tile, splits, split_channels = _gather_gpu_plan(
                kind, NP, out_channels_per_group, reduce_channels, grid_z, splittable, last_only,
                launch.sm_count(device), flops / phases,
                math.prod(x_shape) * x_dtype.itemsize + math.prod(w_shape) * w_dtype.itemsize, math.prod(y_shape),
                y_dtype.itemsize)
        (bp, bc, bk), options = tile[0], dict(num_warps=tile[1], num_stages=tile[2])
        if splits > 1 and kind not in _GATHER_TILES:
            options["maxnreg"] = FFMA_SPLIT_REGISTERS
    partials_shape = partials_dtype = None
    if splits == 1:
        out_strides = (0,) + tuple(y_stride)
    else:
        partials_shape = (splits,) + tuple(y_shape)
        partials_dtype = torch.float64 if kind == DOT_FP64.value else torch.float32
        out_strides = _dense_strides(partials_shape)
    scalars = (0 if bias_stride is None else bias_stride,
               D, H, W, DO, HO, WO, N, reduce_channels, out_channels_per_group, phase_depths, phase_rows, phase_cols,
               *x_stride[:2], *_lift(x_stride[2:], 0), *w_strides, *_lift(w_stride[2:], 0),
               *out_strides[1:3], *_lift(out_strides[3:], 0), sd, sh, sw, pf, pt, pl, dd, dh, dw,
               splits, split_channels, out_strides[0])
    meta = dict(KERNEL_DEPTH=kd, KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, DEPTH=depth, TRANSPOSED=transposed, DOT=kind,
                INTERP=launch.INTERPRET, HAS_BIAS=has_bias, ACTIVATION=activation, SPLIT=splits > 1)
    if tuned:
        tiles = _GATHER_TILES.get(kind, _GATHER_TILES[None])
        meta["PIXEL_INDEX_TYPE"] = _pixel_index_type(NP, max(t[0][0] for t in tiles))
        grid = (lambda t: (launch.cdiv(NP, t["BLOCK_SIZE_PIXELS"]),
                           launch.cdiv(out_channels_per_group, t["BLOCK_SIZE_CHANNELS"]), grid_z))
        return _Launch(None, scalars, meta, tuned=(grid, tuning.ranked(tiles, tile)))
    meta.update(PIXEL_INDEX_TYPE=_pixel_index_type(NP, bp), BLOCK_SIZE_PIXELS=bp, BLOCK_SIZE_CHANNELS=bc,
                BLOCK_SIZE_REDUCTION=bk, **options)
    grid = (launch.cdiv(NP, bp), launch.cdiv(out_channels_per_group, bc), grid_z * splits)
    return _Launch(grid, scalars, meta, splits, partials_shape, partials_dtype)


def _check_floating(x, name):
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{name} on the GPU needs floating inputs, got {x.dtype}")


def _conv(x, w, spec, bias=None, activation=ACT_IDENTITY.value):
    """The spec's conv forward of x into a new dense tensor (the reference's
    formula); with ``bias`` and an ``activation`` code the fused act(conv + bias)."""
    Cg, Cout = spec.in_channels_per_group, spec.out_channels_per_group
    y = launch.empty(spec.out_shape, x.dtype, x.device)
    if Cg == 0 and bias is None and activation == ACT_IDENTITY.value:
        return copy.full(y.shape, 0.0, x.dtype, x.device) if y.numel() else y
    # weight entry (g, c, k) = w[g*Cout + c, k]  (Cg == 0: an empty reduction, acc stays 0)
    return _gather_conv(x, w, y, spec, Cg, Cout, (Cout * w.stride(0), w.stride(0), w.stride(1)),
                        transposed=False, bias=bias, activation=activation)


def _conv_input_grad(g, w, spec, dtype):
    """The spec's conv input gradient (= conv_transpose forward) into a new
    dense tensor of the spec's input shape."""
    O, Cg = spec.w_shape[:2]
    dx = launch.empty(spec.x_shape, dtype, g.device)
    if dx.numel() == 0:
        return dx
    if O == 0 or math.prod(g.shape[2:]) == 0:      # (no output position: g[0, 0] is empty)
        return copy.full(spec.x_shape, 0.0, dtype, g.device)
    # output channel c of group g reduces over k < Cout: weight (g, c, k) = w[g*Cout + k, c]
    Cout = spec.out_channels_per_group
    return _gather_conv(g, w, dx, spec, Cout, Cg, (Cout * w.stride(0), w.stride(1), w.stride(0)), transposed=True)


def _rates(kind):
    """(FLOP/s of a dot of ``kind``, bytes/s) of the assumed GPU (``triflux.gpus``): what
    weighs the bytes a split adds against the rounds it saves (an H200 computes as fast
    and moves bytes faster, so there a split costs a little less than counted)."""
    gpu = GPUS[ASSUMED_GPU]
    peak = {DOT_NATIVE.value: gpu.bf16, DOT_TF32.value: gpu.tf32, DOT_FP64.value: gpu.fp64}.get(kind, gpu.ffma)
    return peak, gpu.bandwidth


def _split_time(rows, units, splits, num_warps, sms, flops, kind, in_bytes, out_values, out_itemsize):
    """(predicted seconds, splits, units per split) of a launch of ``rows`` programs that each
    sum ``units`` work units (pixel blocks of a weight gradient, channel blocks of a gather)
    cut into about ``splits`` ranges (split-K), by the kernel report's model: the launch's
    time at the full rate, max(flops / peak, bytes / bandwidth), stretched to whole rounds of
    the GPU (``launch.wave_efficiency``), each as long as a program's units; with several
    splits the output's bytes are float32 (float64) partial sums, one per split, and the
    second pass adds a launch and those bytes read again."""
    peak, bandwidth = _rates(kind)
    per_split = launch.cdiv(units, splits)
    splits = launch.cdiv(units, per_split)
    programs = rows * splits
    rounds_time = programs / launch.wave_efficiency(programs, num_warps, _GPU_REGISTERS, sms)
    stretch = rounds_time * per_split / (rows * units)
    acc_itemsize = 8 if kind == DOT_FP64.value else 4
    out_bytes = out_values * (out_itemsize if splits == 1 else splits * acc_itemsize)
    seconds = max(flops / peak, (in_bytes + out_bytes) / bandwidth) * stretch
    if splits > 1:
        summed = (out_bytes + out_values * out_itemsize) / bandwidth
        seconds += _LAUNCH_US * 1e-6 + summed / launch.wave_efficiency(sum_splits_programs(out_values, sms), 4, 32,
                                                                        sms)
    return seconds, splits, per_split


def _fastest_split(rows, units, max_splits, num_warps, sms, flops, kind, in_bytes, out_values, out_itemsize,
                   tolerance=1.02):
    """(predicted seconds, splits, units per split) of the fewest splits whose
    :func:`_split_time` is within ``tolerance`` of the least (every split adds partial sums to
    combine), among grids of at most ``_MAX_ROUNDS`` rounds where that allows a split; one split
    unless that saves _MIN_SPLIT_SAVING_US."""
    per_round = round(1 / launch.wave_efficiency(1, num_warps, _GPU_REGISTERS, sms))
    most = max(1, min(max_splits, units, launch.cdiv(_MAX_ROUNDS * per_round, max(rows, 1))))
    options = {}
    for splits in range(1, most + 1):
        time, actual, per_split = _split_time(rows, units, splits, num_warps, sms, flops, kind, in_bytes,
                                              out_values, out_itemsize)
        options.setdefault(actual, (time, actual, per_split))
    best = min(time for time, _, _ in options.values())
    choice = next(options[s] for s in sorted(options) if options[s][0] <= best * tolerance)
    return choice if options[1][0] - choice[0] >= _MIN_SPLIT_SAVING_US * 1e-6 else options[1]


@lru_cache(maxsize=4096)
def _weight_grad_splits(rows, num_pixels, block_pixels, num_warps, sms, flops, kind, in_bytes, out_values,
                        out_itemsize):
    """How many position ranges (splits) a weight gradient of ``rows`` tiles sums
    separately on a GPU of ``sms`` SMs: :func:`_fastest_split` over its blocks of
    ``block_pixels`` positions, each split at least MIN_PIXELS_PER_SPLIT positions."""
    return _fastest_split(rows, launch.cdiv(num_pixels, block_pixels), num_pixels // MIN_PIXELS_PER_SPLIT,
                          num_warps, sms, flops, kind, in_bytes, out_values, out_itemsize)[1]


def _weight_grad_gpu_tile(kind, out_channels_per_group):
    """The GPU tile ``(block sizes, num_warps, num_stages)`` of _weight_grad_kernel:
    ``_WEIGHT_GRAD_TILES`` for the dot kind, with BLOCK_SIZE_CHANNELS 32 in float32
    (FFMA) for FEW_OUT_CHANNELS or fewer output channels per group."""
    (bo, bq, bm), warps, stages = _WEIGHT_GRAD_TILES.get(kind, _WEIGHT_GRAD_TILES[None])
    if kind not in _WEIGHT_GRAD_TILES and out_channels_per_group <= FEW_OUT_CHANNELS:
        bo = min(bo, FEW_OUT_CHANNELS)
    return (bo, bq, bm), warps, stages


def _conv_weight_grad(x, g, spec, dtype):
    """The spec's conv weight gradient into a new dense tensor of the spec's
    weight shape: _weight_grad_kernel, split over the positions into float32
    (float64) partial sums and sum_splits when it has few tiles. The launch
    is planned once per layout of the tensors (:func:`_weight_grad_plan`)."""
    dw = launch.empty(spec.w_shape, dtype, x.device)
    if dw.numel() == 0:
        return dw
    plan = _weight_grad_plan(spec, _layout(x), _layout(g), dtype, x.get_device(), _choosers())
    if plan is None:
        return copy.full(spec.w_shape, 0.0, dtype, x.device)
    # one split: the kernel writes dw itself (a dense (1, *w_shape) view of the same memory)
    partial_sums = dw if plan.splits == 1 else launch.empty(plan.partials_shape, plan.partials_dtype, x.device)
    launch.launch(_weight_grad_kernel, plan.grid, x, g, partial_sums, *plan.scalars, **plan.meta)
    if plan.splits > 1:
        sum_splits(partial_sums.view(plan.splits, -1), dw.view(-1))
    return dw


@lru_cache(maxsize=4096)
def _weight_grad_plan(spec, x_layout, g_layout, dtype, device_index, choosers):
    """The :class:`_Launch` of :func:`_conv_weight_grad` for tensors of these
    layouts and a weight gradient of ``dtype`` (None: no output position, a
    zero gradient), as the :func:`_choosers` decide."""
    (x_shape, x_stride, x_dtype), (g_shape, g_stride, g_dtype) = x_layout, g_layout
    O, Cg = spec.w_shape[:2]
    taps = math.prod(spec.kernel_size)
    N = x_shape[0]
    D, H, W = _lift(x_shape[2:], 1)
    DO, HO, WO = _lift(g_shape[2:], 1)
    NM = N * DO * HO * WO
    if NM == 0:
        return None
    OG = spec.out_channels_per_group
    Q = Cg * taps
    kind = dot_kind(x_dtype, g_dtype)
    if launch.INTERPRET:
        (bo, bq, bm), options = _interpreter_tiles(OG, Q, NM, x_dtype, n_cap=128, k_cap=1024), {}
    else:
        (bo, bq, bm), warps, stages = _weight_grad_gpu_tile(kind, OG)
        options = dict(num_warps=warps, num_stages=stages)
    tiles = (launch.cdiv(OG, bo), launch.cdiv(Q, bq))
    splits = 1
    if not launch.INTERPRET:     # (the interpreter pays per program: one split)
        in_bytes = math.prod(x_shape) * x_dtype.itemsize + math.prod(g_shape) * g_dtype.itemsize
        splits = _weight_grad_splits(tiles[0] * tiles[1] * spec.groups, NM, bm, options["num_warps"],
                                     launch.sm_count(None if device_index < 0 else device_index), 2.0 * O * Q * NM,
                                     kind, in_bytes, math.prod(spec.w_shape), dtype.itemsize)
    partials_shape = (splits,) + tuple(spec.w_shape)
    partials_dtype = dtype if splits == 1 else torch.float64 if kind == DOT_FP64.value else torch.float32
    (kd, kh, kw), (sd, sh, sw), (pf, pt, pl), (dd, dh, dwl), depth = _geometry(spec)
    ps = _dense_strides(partials_shape)
    scalars = (D, H, W, DO, HO, WO, NM, splits, spec.groups, Cg, OG,
               *x_stride[:2], *_lift(x_stride[2:], 0), *g_stride[:2], *_lift(g_stride[2:], 0),
               *ps[:3], *_lift(ps[3:], 0), sd, sh, sw, pf, pt, pl, dd, dh, dwl)
    meta = dict(KERNEL_DEPTH=kd, KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, DEPTH=depth,
                PIXEL_INDEX_TYPE=_pixel_index_type(NM, bm),
                BLOCK_SIZE_CHANNELS=bo, BLOCK_SIZE_ENTRIES=bq, BLOCK_SIZE_PIXELS=bm, DOT=kind,
                INTERP=launch.INTERPRET, **options)
    return _Launch(tiles + (spec.groups * splits,), scalars, meta, splits, partials_shape, partials_dtype)


def conv_forward(x, w, stride=None, padding=None, dilation=None, groups=1):
    """y = conv(x, w), any spatial rank (see the reference for the formula)."""
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    _check_floating(x, "conv")
    return _conv(x, w, spec)


def conv_backward(grad, out, x, w, stride=None, padding=None, dilation=None, groups=1, needs=(True, True)):
    """dx = the transposed-conv gather of G with w; dw = the reduction of G x
    im2col(x) over the batch and the output positions (see the reference);
    only those in ``needs``."""
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    dx = _conv_input_grad(grad, w, spec, x.dtype) if needs[0] else None
    dw = _conv_weight_grad(x, grad, spec, w.dtype) if needs[1] else None
    return dx, dw


def conv_transpose_forward(x, w, stride=None, padding=None, output_padding=None, dilation=None, groups=1):
    """y = conv_transpose(x, w): its adjoint conv's input gradient (see the reference)."""
    spec = conv_transpose_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                               groups)
    _check_floating(x, "conv_transpose")
    return _conv_input_grad(x, w, spec.adjoint, x.dtype)


def conv_transpose_backward(grad, out, x, w, stride=None, padding=None, output_padding=None, dilation=None,
                            groups=1, needs=(True, True)):
    """dx = conv(G, w); dw = conv's weight gradient with input G and output
    gradient x; only those in ``needs``."""
    spec = conv_transpose_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                               groups)
    # output_padding of a stride or more adds positions no input reaches (see the reference)
    sides = tuple(x.shape[2:])
    if not needs[0]:
        dx = None
    elif x.numel() == 0:
        dx = launch.empty(tuple(x.shape), x.dtype, x.device)
    else:
        dx = _conv(grad, w, spec.adjoint)
        if any(spec.extra):     # positions no input reaches: cut off
            dx = copy.contiguous(dx[(slice(None),) * 2 + tuple(slice(0, n) for n in sides)])
    if not needs[1]:
        return dx, None
    if any(spec.extra):
        padded = copy.full(tuple(x.shape[:2]) + tuple(n + e for n, e in zip(sides, spec.extra)), 0, x.dtype,
                           x.device)
        copy.copy_into(padded[(slice(None),) * 2 + tuple(slice(0, n) for n in sides)], x)
        x = padded
    dw = _conv_weight_grad(grad, x, spec.adjoint, w.dtype)
    return dx, dw


# --- conv with bias and activation fused ----------------------------------------------------

def _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation):
    return conv_bias_act_spec(x.shape, w.shape, b.shape, x.dtype, w.dtype, b.dtype, stride, padding, dilation,
                              groups, activation)


def conv_bias_act_forward(x, w, b, stride=None, padding=None, dilation=None, groups=1, activation="identity"):
    """y = act(conv(x, w) + b) (see the reference): the conv kernel with the
    bias and the activation applied in its epilogue, before the one store."""
    spec = _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation)
    _check_floating(x, "conv_bias_act")
    if b.device != x.device:
        raise ValueError(f"conv_bias_act: the bias is on {b.device} but x on {x.device}")
    return _conv(x, w, spec, bias=b, activation=ACTIVATION_CODES[activation])


def conv_bias_act_backward(grad, out, x, w, b, stride=None, padding=None, dilation=None, groups=1,
                           activation="identity", needs=(True, True, True)):
    """gz = G * act'(y) and db = sum_{n, p} gz in one kernel (from the output
    y alone), then conv's input- and weight-gradient kernels on gz (those in
    ``needs``; db comes with gz whether needed or not)."""
    spec = _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation)
    gz, db = act_grad_and_bias_grad(grad, out, b, ACTIVATION_CODES[activation])
    dx = _conv_input_grad(gz, w, spec, x.dtype) if needs[0] else None
    dw = _conv_weight_grad(x, gz, spec, w.dtype) if needs[1] else None
    return dx, dw, db if needs[2] else None
