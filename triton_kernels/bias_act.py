"""The backward of a fused bias and activation, y = act(z + b[o]), Triton
kernels shared by conv_bias_act ((N, O, *spatial), the bias per channel o) and
dense_bias_act ((rows, O), the bias per column o, as N = rows images of
1 x 1 pixels):

* ``_act_grad_kernel``: gz = G * act'(y) from the output y alone (the
  activations of ``numerics.through_activation``), stored dense, and in the
  same pass the per-channel sums of gz, the bias gradient; split over the
  pixels into partial sums on the GPU when there are many;
* ``_sum_splits_kernel``: the second pass of split sums (these, and the
  conv weight gradient's split-K partial sums): no atomics, so the result
  is the same on every run.

The reference does the same in NumPy: ``reference/_activation.py``
``through_activation``, then a sum.
"""
import torch
import triton
import triton.language as tl

from . import copy, launch, numerics
from .numerics import ACT_IDENTITY, ACT_RELU, store_value
from ..gpus import SATURATING_WARPS


@triton.jit
def _act_grad_kernel(g, y, gz, partial_sums, channels, image_pixels, out_width, num_pixels, split_size,
                     g_batch_stride, g_channel_stride, g_height_stride, g_width_stride,
                     y_batch_stride, y_channel_stride, y_height_stride, y_width_stride,
                     ACTIVATION: tl.constexpr, STORE_GZ: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                     INTERP: tl.constexpr, BLOCK_SIZE_CHANNELS: tl.constexpr, BLOCK_SIZE_PIXELS: tl.constexpr):
    """gz[n, o, p, q] = g[n, o, p, q] * act'(y[n, o, p, q]) into a dense gz (only with
    STORE_GZ; identity leaves g as it is) and partial_sums[s, o] = sum_{pixels m = (n, p, q)
    of split s} gz[n, o, p, q], split s covering m in [s*split_size, (s+1)*split_size) of
    num_pixels = N*Ho*Wo (image_pixels = Ho*Wo per image). act' from y: identity 1, relu
    [not y <= 0] (0 at 0, 1 at NaN: torch's threshold_backward), sigmoid y (1 - y), tanh 1 - y^2."""
    pid_channels = tl.program_id(0)
    split = tl.program_id(1).to(tl.int64)
    channel = (pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)).to(tl.int64)
    channel_mask = channel < channels
    m_lo = split * split_size
    m_hi = tl.minimum(m_lo + split_size, num_pixels)
    acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_PIXELS), dtype=COMPUTE_TYPE)
    for m0 in range(m_lo, m_hi, BLOCK_SIZE_PIXELS):
        m = m0 + tl.arange(0, BLOCK_SIZE_PIXELS)
        pixel_mask = m < m_hi
        n = m // image_pixels
        pixel = m % image_pixels
        p = pixel // out_width
        q = pixel % out_width
        mask = channel_mask[:, None] & pixel_mask[None, :]
        gv = tl.load(g + n[None, :] * g_batch_stride + channel[:, None] * g_channel_stride
                     + p[None, :] * g_height_stride + q[None, :] * g_width_stride,
                     mask=mask, other=0.0).to(COMPUTE_TYPE)
        if ACTIVATION == ACT_IDENTITY:
            d = gv
        else:
            yv = tl.load(y + n[None, :] * y_batch_stride + channel[:, None] * y_channel_stride
                         + p[None, :] * y_height_stride + q[None, :] * y_width_stride,
                         mask=mask, other=0.0).to(COMPUTE_TYPE)
            d = numerics.through_activation(gv, yv, ACTIVATION)
        if STORE_GZ:
            tl.store(gz + (n[None, :] * channels + channel[:, None]) * image_pixels + pixel[None, :],
                     store_value(d, gz.dtype.element_ty, INTERP), mask=mask)
        acc += d
    tl.store(partial_sums + split * channels + channel,
             store_value(tl.sum(acc, axis=1), partial_sums.dtype.element_ty, INTERP), mask=channel_mask)


@triton.jit
def _sum_splits_kernel(partial_sums, total, num_splits, size, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                       BLOCK_SIZE_SPLITS: tl.constexpr, BLOCK_SIZE_COLUMNS: tl.constexpr):
    """total[k] = sum_{s < num_splits} partial_sums[s, k] for k < size (partial_sums dense
    (num_splits, size), total dense): the second pass of the split sums, bias and weight gradients."""
    column = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_COLUMNS + tl.arange(0, BLOCK_SIZE_COLUMNS)
    column_mask = column < size
    acc = tl.zeros((BLOCK_SIZE_SPLITS, BLOCK_SIZE_COLUMNS), dtype=COMPUTE_TYPE)
    for s0 in range(0, num_splits, BLOCK_SIZE_SPLITS):
        split = s0 + tl.arange(0, BLOCK_SIZE_SPLITS)
        acc += tl.load(partial_sums + split[:, None] * size + column[None, :],
                       mask=(split < num_splits)[:, None] & column_mask[None, :], other=0.0).to(COMPUTE_TYPE)
    tl.store(total + column, store_value(tl.sum(acc, axis=0), total.dtype.element_ty, INTERP), mask=column_mask)


#: columns a _sum_splits_kernel program adds up on a GPU (a 16 x 64 float32 tile: 16-byte loads
#: along its rows), down to _SUM_SPLITS_FEWEST_COLUMNS for sums of few columns (a split weight
#: gradient of a few thousand entries), so that these still spread over as many of the 4-warp
#: programs as the GPU runs at full rate (SATURATING_WARPS / 4 per SM)
_SUM_SPLITS_COLUMNS = 64
_SUM_SPLITS_FEWEST_COLUMNS = 16
_SUM_SPLITS_WARPS = 4             # Triton's default, which the launch takes


def _sum_splits_columns(size, sms):
    """BLOCK_SIZE_COLUMNS of a sum of ``size`` columns on a GPU of ``sms`` SMs (see _SUM_SPLITS_COLUMNS)."""
    if launch.INTERPRET:
        return _SUM_SPLITS_COLUMNS
    block = launch.next_pow2(launch.cdiv(max(size, 1), sms * (SATURATING_WARPS // _SUM_SPLITS_WARPS)))
    return max(_SUM_SPLITS_FEWEST_COLUMNS, min(_SUM_SPLITS_COLUMNS, block))


def sum_splits_programs(size, sms):
    """Programs of the sum_splits launch of ``size`` columns on a GPU of ``sms`` SMs."""
    return launch.cdiv(size, _sum_splits_columns(size, sms))


def sum_splits(partial_sums, total):
    """total[k] = sum_s partial_sums[s, k] by _sum_splits_kernel (both dense;
    summed in the partial sums' type, rounded once to total's dtype)."""
    num_splits, size = partial_sums.shape
    block = _sum_splits_columns(size, launch.sm_count(partial_sums.device.index))
    launch.launch(_sum_splits_kernel, (launch.cdiv(size, block),), partial_sums, total, num_splits, size,
                  COMPUTE_TYPE=numerics.compute_type(partial_sums.dtype), INTERP=launch.INTERPRET,
                  BLOCK_SIZE_SPLITS=16, BLOCK_SIZE_COLUMNS=block)   # (Triton's default 4 warps)
    return total


def _as_4d(t):
    """An (N, O, *spatial) tensor of 1 to 3 spatial axes as (N, O, Ho, Wo): a
    view (the depth and height of a 3-D one merged where its strides allow,
    else a dense copy)."""
    if t.dim() == 4:
        return t
    if t.dim() == 3:
        return t.unsqueeze(2)
    N, O, D, H, W = t.shape
    try:
        return t.view(N, O, D * H, W)
    except RuntimeError:
        return copy.contiguous(t).view(N, O, D * H, W)


def act_grad_and_bias_grad(grad, out, b, activation):
    """(gz, db) for the output y = ``out`` (N, O, *spatial) (conv_bias_act of
    any rank, read as (N, O, Ho, Wo)) and its gradient G = ``grad`` (a
    (rows, O) matrix as (rows, O, 1, 1)): gz = G * act'(y) as a
    new dense tensor (G itself for identity; relu in G's dtype, sigmoid/tanh
    in the compute type) and db = its per-channel sum in b's dtype, in one
    pass over G and y (float32/float64 accumulation, no atomics: with several
    splits per channel, partial sums and a second small launch);
    ``activation`` an ACTIVATION code."""
    store = activation != ACT_IDENTITY.value
    acc_dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    # relu's gz is exactly G or 0 in G's dtype; sigmoid's and tanh's is kept in
    # the compute type (float32 for half precision), not rounded before the products
    gz_dtype = grad.dtype if activation == ACT_RELU.value else acc_dtype
    gz = launch.empty(tuple(out.shape), gz_dtype, out.device) if store else grad
    grad, out = _as_4d(grad), _as_4d(out)
    N, O, HO, WO = out.shape
    NPIX, NM = HO * WO, N * HO * WO
    if O == 0:
        return gz, launch.empty((0,), b.dtype, b.device)
    if NM == 0:
        return gz, copy.full((O,), 0.0, b.dtype, b.device)
    ct = numerics.compute_type(out.dtype)
    if launch.INTERPRET:
        bo = max(2, min(launch.next_pow2(O), 64))
        bm = max(16, min(launch.next_pow2(NM), (1 << 16) // bo))
        splits = 1
    else:
        # channels x pixels a program reads at a time, and the fewest pixels a split sums: 4 x 256,
        # 4096, where the pixels are contiguous (NCHW); 32 x 32, 64, where the channels are (a
        # (rows, O) matrix: 128-byte row segments)
        bo, bm, least = (32, 32, 64) if NPIX == 1 else (4, 256, 4096)
        # enough programs to fill the GPU
        splits = max(1, min(launch.cdiv(NM, least), launch.cdiv(1024, launch.cdiv(O, bo))))
    chunk = launch.cdiv(launch.cdiv(NM, splits), bm) * bm
    splits = launch.cdiv(NM, chunk)
    db = launch.empty((O,), b.dtype, b.device)
    part = db if splits == 1 else launch.empty((splits, O), acc_dtype, b.device)
    launch.launch(_act_grad_kernel, (launch.cdiv(O, bo), splits), grad, out, gz, part, O, NPIX, WO, NM,
                  chunk, *grad.stride(), *out.stride(), ACTIVATION=activation, STORE_GZ=store, COMPUTE_TYPE=ct,
                  INTERP=launch.INTERPRET, BLOCK_SIZE_CHANNELS=bo, BLOCK_SIZE_PIXELS=bm)
    if splits > 1:
        sum_splits(part, db)
    return gz, db
