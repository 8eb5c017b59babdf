"""Convolutions, Triton kernels (forward and backward).

Implicit GEMM, no im2col in device memory. Two kernels do everything:

* ``_gather_conv_kernel``: one program computes a tile of BLOCK_SIZE_PIXELS
  output pixels (n, p, q flattened) x BLOCK_SIZE_CHANNELS output channels of
  one group, looping over the reduction (input channels of the group x kh x
  kw, flattened, BLOCK_SIZE_REDUCTION at a time): the pixels x reduction
  operand is gathered from the input on the fly (zero padding and stride by
  masks), the reduction x channels operand read from the weight through its
  strides, and multiplied with ``numerics.dot``. With ``TRANSPOSED`` the
  gather is the one of a transposed convolution (input pixel
  ``(p + top - i*dh) / sh`` where that divides exactly): conv2d's input
  gradient and conv_transpose2d's forward.
* ``_weight_grad_kernel``: conv2d's weight gradient, a tile of output
  channels x (c', i, j) weight entries of one group reduced over the
  N x Ho x Wo output pixels, BLOCK_SIZE_PIXELS at a time (one program does
  the whole sum, so half-precision weights are rounded once).

conv2d_bias_act is the forward kernel with ``HAS_BIAS`` and an
``ACTIVATION`` (ACT_IDENTITY, ACT_RELU, ACT_SIGMOID, ACT_TANH) applied to the
accumulator in the epilogue, before the one store (the plain conv2d passes
HAS_BIAS=False, ACT_IDENTITY). Its backward is one pass ``_act_grad_kernel``
(gz = G * act'(y) from the output y, and the per-channel sums of gz for the
bias, partial sums and ``_sum_splits_kernel`` on the GPU when there are many
pixels: no atomics), then the two kernels above on gz.

conv_transpose2d is conv2d's adjoint, so it reuses them as in the reference:
forward = conv2d's input gradient, dx = conv2d forward, dw = conv2d weight
gradient with the roles of input and output gradient exchanged.

Dots: ``numerics.dot`` of the kind ``numerics.dot_kind`` picks for the
operands (float32 IEEE, 16-bit native with a float32 accumulator on a GPU,
float64 as sums of products). Shapes and attributes are checked, and the
output shape derived, by the family's spec (``triflux.specs.conv``). Inputs
are read through their strides (any layout); outputs are new dense tensors.

A faster version would need: tiles tuned per GPU (and autotuning there), the
channel loop outermost with the (i, j) taps unrolled so weight rows are
contiguous loads, channels-last layouts, and split-K for the weight gradient
when N*Ho*Wo is large.
"""
import torch
import triton
import triton.language as tl

from . import copy, launch, numerics
from .numerics import DOT_FP64, dot, dot_kind, store_value
from ..errors import DTypeError
from ..specs.conv import conv2d_bias_act_spec, conv2d_spec, conv_transpose2d_spec

# --- the fused activations -------------------------------------------------------------------

#: the ACTIVATION codes of the fused epilogue (_bias_act) and of its gradient (_act_grad_kernel)
ACT_IDENTITY = tl.constexpr(0)
ACT_RELU = tl.constexpr(1)
ACT_SIGMOID = tl.constexpr(2)
ACT_TANH = tl.constexpr(3)

#: activation name (one of the spec's FUSABLE_ACTIVATIONS) -> its ACTIVATION code
_ACT_CODES = {"identity": ACT_IDENTITY.value, "relu": ACT_RELU.value, "sigmoid": ACT_SIGMOID.value,
              "tanh": ACT_TANH.value}


@triton.jit
def _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """The fused epilogue: acc + bias[out_channel] (HAS_BIAS), then the
    ACTIVATION in the accumulator's type."""
    if HAS_BIAS:
        bias_value = tl.load(bias + out_channel * bias_stride, mask=channel_mask, other=0.0).to(acc.dtype)
        acc = acc + bias_value[None, :]
    if ACTIVATION == ACT_RELU:    # (NaN stays NaN, as torch.relu)
        acc = tl.where(acc < 0, 0.0, acc)
    elif ACTIVATION == ACT_SIGMOID:
        acc = numerics.sigmoid(acc)
    elif ACTIVATION == ACT_TANH:
        acc = numerics.tanh(acc)
    return acc


@triton.jit
def _split_pixels(m, out_height, out_width):
    """(n, p, q) of the flattened output pixels m = (n*out_height + p)*out_width + q."""
    n = m // (out_height * out_width)
    rem = m % (out_height * out_width)
    return n, rem // out_width, rem % out_width


# --- the kernels -----------------------------------------------------------------------------

@triton.jit
def _gather_conv_kernel(x, w, y, bias, bias_stride,
                        in_height, in_width, out_height, out_width, num_pixels,
                        reduce_channels, out_channels_per_group,
                        x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                        w_group_stride, w_out_channel_stride, w_reduce_channel_stride,
                        w_height_stride, w_width_stride,
                        y_batch_stride, y_channel_stride, y_height_stride, y_width_stride,
                        stride_height, stride_width, pad_top, pad_left, dilation_height, dilation_width,
                        KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr, TRANSPOSED: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, BLOCK_SIZE_CHANNELS: tl.constexpr,
                        BLOCK_SIZE_REDUCTION: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """y[n, g*Cout + c, p, q] = act(sum_{r < R, i, j} x[n, g*R + r, h, v] * w(g, c, r, i, j) + bias[g*Cout + c])

    with R = reduce_channels, Cout = out_channels_per_group, g the group (program axis 2),
    forward:    h = p*stride_height - pad_top + i*dilation_height      (valid when 0 <= h < in_height)
    TRANSPOSED: h = (p + pad_top - i*dilation_height) / stride_height  (valid when it divides and 0 <= h < in_height)
    (v likewise along the width); w(g, c, r, i, j) read at w + g*w_group_stride + c*w_out_channel_stride
    + r*w_reduce_channel_stride + i*w_height_stride + j*w_width_stride. The bias term only with
    HAS_BIAS (bias[k] at bias + k*bias_stride); act by ACTIVATION (see _bias_act).
    """
    pid_pixels = tl.program_id(0).to(tl.int64)
    pid_channels = tl.program_id(1)
    group = tl.program_id(2).to(tl.int64)
    pixel = pid_pixels * BLOCK_SIZE_PIXELS + tl.arange(0, BLOCK_SIZE_PIXELS)
    pixel_mask = pixel < num_pixels
    pixel = tl.minimum(pixel, num_pixels - 1)
    n, p, q = _split_pixels(pixel, out_height, out_width)
    channel = pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < out_channels_per_group
    reduction = reduce_channels * KERNEL_HEIGHT * KERNEL_WIDTH
    if DOT == DOT_FP64:
        acc = tl.zeros((BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_SIZE_PIXELS, BLOCK_SIZE_CHANNELS), dtype=tl.float32)
    x_image = x + n * x_batch_stride
    w_channel = w + group * w_group_stride + channel * w_out_channel_stride
    for k0 in range(0, reduction, BLOCK_SIZE_REDUCTION):
        k = k0 + tl.arange(0, BLOCK_SIZE_REDUCTION)           # the flattened (r, i, j)
        k_mask = k < reduction
        r = k // (KERNEL_HEIGHT * KERNEL_WIDTH)
        tap = k % (KERNEL_HEIGHT * KERNEL_WIDTH)
        i = tap // KERNEL_WIDTH
        j = tap % KERNEL_WIDTH
        if TRANSPOSED:
            h_scaled = p[:, None] + pad_top - i[None, :] * dilation_height
            v_scaled = q[:, None] + pad_left - j[None, :] * dilation_width
            h_scaled = tl.where(h_scaled >= 0, h_scaled, -1)
            v_scaled = tl.where(v_scaled >= 0, v_scaled, -1)
            ok = (h_scaled >= 0) & (v_scaled >= 0) & (h_scaled % stride_height == 0) & (v_scaled % stride_width == 0)
            h = h_scaled // stride_height
            v = v_scaled // stride_width
        else:
            h = p[:, None] * stride_height - pad_top + i[None, :] * dilation_height
            v = q[:, None] * stride_width - pad_left + j[None, :] * dilation_width
            ok = (h >= 0) & (v >= 0)
        ok = ok & (h < in_height) & (v < in_width) & pixel_mask[:, None] & k_mask[None, :]
        h = tl.where(ok, h, 0)
        v = tl.where(ok, v, 0)
        in_channel = group * reduce_channels + r
        a = tl.load(x_image[:, None] + in_channel[None, :] * x_channel_stride + h * x_height_stride
                    + v * x_width_stride, mask=ok, other=0.0)
        b = tl.load(w_channel[None, :] + r[:, None] * w_reduce_channel_stride + i[:, None] * w_height_stride
                    + j[:, None] * w_width_stride, mask=k_mask[:, None] & channel_mask[None, :], other=0.0)
        acc = dot(acc, a, b, DOT)
    out_channel = group * out_channels_per_group + channel
    acc = _bias_act(acc, bias, out_channel, bias_stride, channel_mask, HAS_BIAS, ACTIVATION)
    y_pointer = (y + n[:, None] * y_batch_stride + out_channel[None, :] * y_channel_stride
                 + p[:, None] * y_height_stride + q[:, None] * y_width_stride)
    tl.store(y_pointer, store_value(acc, y.dtype.element_ty, INTERP),
             mask=pixel_mask[:, None] & channel_mask[None, :])


@triton.jit
def _weight_grad_kernel(x, g, dw,
                        in_height, in_width, out_height, out_width, num_pixels,
                        in_channels_per_group, out_channels_per_group,
                        x_batch_stride, x_channel_stride, x_height_stride, x_width_stride,
                        g_batch_stride, g_channel_stride, g_height_stride, g_width_stride,
                        dw_out_channel_stride, dw_in_channel_stride, dw_height_stride, dw_width_stride,
                        stride_height, stride_width, pad_top, pad_left, dilation_height, dilation_width,
                        KERNEL_HEIGHT: tl.constexpr, KERNEL_WIDTH: tl.constexpr,
                        BLOCK_SIZE_CHANNELS: tl.constexpr, BLOCK_SIZE_ENTRIES: tl.constexpr,
                        BLOCK_SIZE_PIXELS: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """dw[g*Cout + o, c, i, j] = sum_{n, p, q} g[n, g*Cout + o, p, q] * x[n, g*Cin + c, h, v],
    h = p*stride_height - pad_top + i*dilation_height (v likewise), x read as zero outside its
    bounds; Cout, Cin the channels per group, g the group (program axis 2). A program computes
    BLOCK_SIZE_CHANNELS output channels x BLOCK_SIZE_ENTRIES weight entries (c, i, j) and sums
    all num_pixels = N*out_height*out_width pixels itself."""
    pid_channels = tl.program_id(0)
    pid_entries = tl.program_id(1)
    group = tl.program_id(2).to(tl.int64)
    channel = pid_channels * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < out_channels_per_group
    entry = pid_entries * BLOCK_SIZE_ENTRIES + tl.arange(0, BLOCK_SIZE_ENTRIES)
    entries = in_channels_per_group * KERNEL_HEIGHT * KERNEL_WIDTH
    entry_mask = entry < entries
    c = entry // (KERNEL_HEIGHT * KERNEL_WIDTH)
    tap = entry % (KERNEL_HEIGHT * KERNEL_WIDTH)
    i = tap // KERNEL_WIDTH
    j = tap % KERNEL_WIDTH
    out_channel = group * out_channels_per_group + channel
    in_channel = group * in_channels_per_group + c
    if DOT == DOT_FP64:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_SIZE_CHANNELS, BLOCK_SIZE_ENTRIES), dtype=tl.float32)
    for m0 in range(0, num_pixels, BLOCK_SIZE_PIXELS):
        pixel = m0 + tl.arange(0, BLOCK_SIZE_PIXELS).to(tl.int64)
        pixel_mask = pixel < num_pixels
        n, p, q = _split_pixels(pixel, out_height, out_width)
        a = tl.load(g + n[None, :] * g_batch_stride + out_channel[:, None] * g_channel_stride
                    + p[None, :] * g_height_stride + q[None, :] * g_width_stride,
                    mask=channel_mask[:, None] & pixel_mask[None, :], other=0.0)
        h = p[:, None] * stride_height - pad_top + i[None, :] * dilation_height
        v = q[:, None] * stride_width - pad_left + j[None, :] * dilation_width
        ok = (h >= 0) & (v >= 0) & (h < in_height) & (v < in_width) & pixel_mask[:, None] & entry_mask[None, :]
        h = tl.where(ok, h, 0)
        v = tl.where(ok, v, 0)
        b = tl.load(x + n[:, None] * x_batch_stride + in_channel[None, :] * x_channel_stride
                    + h * x_height_stride + v * x_width_stride, mask=ok, other=0.0)
        acc = dot(acc, a, b, DOT)
    dw_pointer = (dw + out_channel[:, None] * dw_out_channel_stride + c[None, :] * dw_in_channel_stride
                  + i[None, :] * dw_height_stride + j[None, :] * dw_width_stride)
    tl.store(dw_pointer, store_value(acc, dw.dtype.element_ty, INTERP),
             mask=channel_mask[:, None] & entry_mask[None, :])


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
            if ACTIVATION == ACT_RELU:
                d = tl.where(yv <= 0, 0.0, gv)
            elif ACTIVATION == ACT_SIGMOID:
                d = gv * (yv * (1.0 - yv))
            else:
                d = gv * (1.0 - yv * yv)
        if STORE_GZ:
            tl.store(gz + (n[None, :] * channels + channel[:, None]) * image_pixels + pixel[None, :],
                     store_value(d, gz.dtype.element_ty, INTERP), mask=mask)
        acc += d
    tl.store(partial_sums + split * channels + channel,
             store_value(tl.sum(acc, axis=1), partial_sums.dtype.element_ty, INTERP), mask=channel_mask)


@triton.jit
def _sum_splits_kernel(partial_sums, db, num_splits, channels, COMPUTE_TYPE: tl.constexpr, INTERP: tl.constexpr,
                       BLOCK_SIZE_SPLITS: tl.constexpr, BLOCK_SIZE_CHANNELS: tl.constexpr):
    """db[o] = sum_{s < num_splits} partial_sums[s, o] (partial_sums dense (num_splits, channels))."""
    channel = tl.program_id(0).to(tl.int64) * BLOCK_SIZE_CHANNELS + tl.arange(0, BLOCK_SIZE_CHANNELS)
    channel_mask = channel < channels
    acc = tl.zeros((BLOCK_SIZE_SPLITS, BLOCK_SIZE_CHANNELS), dtype=COMPUTE_TYPE)
    for s0 in range(0, num_splits, BLOCK_SIZE_SPLITS):
        split = s0 + tl.arange(0, BLOCK_SIZE_SPLITS)
        acc += tl.load(partial_sums + split[:, None] * channels + channel[None, :],
                       mask=(split < num_splits)[:, None] & channel_mask[None, :], other=0.0).to(COMPUTE_TYPE)
    tl.store(db + channel, store_value(tl.sum(acc, axis=0), db.dtype.element_ty, INTERP), mask=channel_mask)


# --- launch helpers ---------------------------------------------------------------------------

def _p2(n):
    return launch.next_pow2(max(int(n), 1))


def _tiles(M, N, K, dtype):
    """(BM, BN, BK) by hand for an M x N output tile reduced over K: at least
    16 each (tl.dot's minimum); big tiles in the interpreter (it pays per
    program), small for float64 (whose product tile is materialised)."""
    if launch.INTERPRET:
        bm, bn = max(16, min(_p2(M), 512)), max(16, min(_p2(N), 64))
        cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
        bk = max(16, min(_p2(K), 256, cap // (bm * bn)))
        return bm, bn, bk
    if dtype == torch.float64:
        return 32, 16, 16
    return 64, 32, 32


def _gather_conv(x, w, y, spec, reduce_channels, out_channels_per_group, w_strides, transposed,
                 bias=None, activation=ACT_IDENTITY.value):
    """y from x by _gather_conv_kernel with the spec's attributes; ``w_strides``
    (group, output channel, reduced channel) say how the kernel reads w."""
    N, _, H, W = x.shape
    _, _, HO, WO = y.shape
    kh, kw = spec.kernel_size
    NP = N * HO * WO
    if NP == 0 or out_channels_per_group == 0:
        return y
    bp, bc, bk = _tiles(NP, out_channels_per_group, reduce_channels * kh * kw, x.dtype)
    grid = (launch.cdiv(NP, bp), launch.cdiv(out_channels_per_group, bc), spec.groups)
    (sh, sw), (pt, _, pl, _), (dh, dw) = spec.stride, spec.padding, spec.dilation
    has_bias = bias is not None
    launch.launch(_gather_conv_kernel, grid, x, w, y, bias if has_bias else y,
                  bias.stride(0) if has_bias else 0,
                  H, W, HO, WO, NP, reduce_channels, out_channels_per_group,
                  *x.stride(), *w_strides, w.stride(2), w.stride(3), *y.stride(),
                  sh, sw, pt, pl, dh, dw,
                  KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, TRANSPOSED=transposed,
                  BLOCK_SIZE_PIXELS=bp, BLOCK_SIZE_CHANNELS=bc, BLOCK_SIZE_REDUCTION=bk,
                  DOT=dot_kind(x.dtype, w.dtype), INTERP=launch.INTERPRET,
                  HAS_BIAS=has_bias, ACTIVATION=activation)
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


def _conv2d_weight_grad(x, g, spec, dtype):
    """The spec's conv2d weight gradient into a new dense tensor of the spec's weight shape."""
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
    bo, bq, bm = _tiles(OG, Q, NM, x.dtype)
    if launch.INTERPRET:
        bo, bq = max(16, min(_p2(OG), 64)), max(16, min(_p2(Q), 128))
        cap = (1 << 18) if x.dtype == torch.float64 else (1 << 21)
        bm = max(16, min(_p2(NM), 1024, cap // (bo * bq)))
    (sh, sw), (pt, _, pl, _), (dh, dwl) = spec.stride, spec.padding, spec.dilation
    grid = (launch.cdiv(OG, bo), launch.cdiv(Q, bq), spec.groups)
    launch.launch(_weight_grad_kernel, grid, x, g, dw, H, W, HO, WO, NM, Cg, OG,
                  *x.stride(), *g.stride(), *dw.stride(), sh, sw, pt, pl, dh, dwl,
                  KERNEL_HEIGHT=kh, KERNEL_WIDTH=kw, BLOCK_SIZE_CHANNELS=bo, BLOCK_SIZE_ENTRIES=bq,
                  BLOCK_SIZE_PIXELS=bm, DOT=dot_kind(x.dtype, g.dtype), INTERP=launch.INTERPRET)
    return dw


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w) (see the reference for the formula)."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    _check_floating(x)
    return _conv2d(x, w, spec)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """dx = the transposed-conv gather of G with w; dw = the reduction of G x
    im2col(x) over N x Ho x Wo (see the reference)."""
    spec = conv2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    dx = _conv2d_input_grad(grad, w, spec, x.dtype)
    dw = _conv2d_weight_grad(x, grad, spec, w.dtype)
    return dx, dw


def conv_transpose2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                             dilation=(1, 1), groups=1):
    """y = conv_transpose2d(x, w): its adjoint conv2d's input gradient (see the reference)."""
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    _check_floating(x)
    return _conv2d_input_grad(x, w, spec.adjoint, x.dtype)


def conv_transpose2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0),
                              output_padding=(0, 0), dilation=(1, 1), groups=1):
    """dx = conv2d(G, w); dw = conv2d's weight gradient with input G and output gradient x."""
    spec = conv_transpose2d_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                                 groups)
    # output_padding of a stride or more adds positions no input reaches (see the reference)
    H, W = x.shape[2:]
    if x.numel() == 0:
        dx = launch.empty(tuple(x.shape), x.dtype, x.device)
    else:
        dx = copy.contiguous(_conv2d(grad, w, spec.adjoint)[:, :, :H, :W])
    if spec.extra != (0, 0):
        padded = copy.full((x.shape[0], x.shape[1], H + spec.extra[0], W + spec.extra[1]), 0, x.dtype, x.device)
        copy.copy_into(padded[:, :, :H, :W], x)
        x = padded
    dw = _conv2d_weight_grad(grad, x, spec.adjoint, w.dtype)
    return dx, dw


# --- conv2d with bias and activation fused --------------------------------------------------

def _act_grad_and_bias_grad(grad, out, b, activation):
    """(gz, db): gz = G * act'(y) as a new dense tensor (G itself for identity;
    relu in G's dtype, sigmoid/tanh in the compute type) and db = its
    per-channel sum in b's dtype, in one pass over G and y (float32/float64
    accumulation, no atomics: with several splits per channel, partial sums
    and a second small launch); ``activation`` an ACTIVATION code."""
    N, O, HO, WO = out.shape
    NPIX, NM = HO * WO, N * HO * WO
    store = activation != ACT_IDENTITY.value
    acc_dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    # relu's gz is exactly G or 0 in G's dtype; sigmoid's and tanh's is kept in
    # the compute type (float32 for half precision), not rounded before the convs
    gz_dtype = grad.dtype if activation == ACT_RELU.value else acc_dtype
    gz = launch.empty(tuple(out.shape), gz_dtype, out.device) if store else grad
    if O == 0:
        return gz, launch.empty((0,), b.dtype, b.device)
    if NM == 0:
        return gz, copy.full((O,), 0.0, b.dtype, b.device)
    ct = numerics.compute_type(out.dtype)
    if launch.INTERPRET:
        bo = max(2, min(_p2(O), 64))
        bm = max(16, min(_p2(NM), (1 << 16) // bo))
        splits = 1
    else:
        bo, bm = 4, 256
        # enough programs to fill the GPU, each with at least a few thousand pixels
        splits = max(1, min(launch.cdiv(NM, 4096), launch.cdiv(1024, launch.cdiv(O, bo))))
    chunk = launch.cdiv(launch.cdiv(NM, splits), bm) * bm
    splits = launch.cdiv(NM, chunk)
    db = launch.empty((O,), b.dtype, b.device)
    part = db if splits == 1 else launch.empty((splits, O), acc_dtype, b.device)
    launch.launch(_act_grad_kernel, (launch.cdiv(O, bo), splits), grad, out, gz, part, O, NPIX, WO, NM,
                  chunk, *grad.stride(), *out.stride(), ACTIVATION=activation, STORE_GZ=store, COMPUTE_TYPE=ct,
                  INTERP=launch.INTERPRET, BLOCK_SIZE_CHANNELS=bo, BLOCK_SIZE_PIXELS=bm)
    if splits > 1:
        bo2 = 64
        launch.launch(_sum_splits_kernel, (launch.cdiv(O, bo2),), part, db, splits, O, COMPUTE_TYPE=ct,
                      INTERP=launch.INTERPRET, BLOCK_SIZE_SPLITS=16, BLOCK_SIZE_CHANNELS=bo2)
    return gz, db


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
    return _conv2d(x, w, spec, bias=b, activation=_ACT_CODES[activation])


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity"):
    """gz = G * act'(y) and db = sum_{n, p, q} gz in one kernel (from the output
    y alone), then conv2d's input- and weight-gradient kernels on gz."""
    spec = _bias_act_spec(x, w, b, stride, padding, dilation, groups, activation)
    gz, db = _act_grad_and_bias_grad(grad, out, b, _ACT_CODES[activation])
    dx = _conv2d_input_grad(gz, w, spec, x.dtype)
    dw = _conv2d_weight_grad(x, gz, spec, w.dtype)
    return dx, dw, db
