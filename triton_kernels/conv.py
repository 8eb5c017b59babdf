"""Convolutions, Triton kernels (forward and backward).

Implicit GEMM, no im2col in device memory. Two kernels do everything:

* ``_gather_conv_kernel``: one program computes a tile of BP output pixels
  (n, p, q flattened) x BC output channels of one group, looping over the
  reduction (input channels of the group x kh x kw, flattened, BK at a time):
  the BP x BK operand is gathered from the input on the fly (zero padding and
  stride by masks), the BK x BC operand read from the weight through its
  strides, and multiplied with ``tl.dot``. With ``TRANSPOSED`` the gather is
  the one of a transposed convolution (input pixel ``(p + top - i*dh) / sh``
  where that divides exactly): conv2d's input gradient and conv_transpose2d's
  forward.
* ``_weight_grad_kernel``: conv2d's weight gradient, a tile of BO output
  channels x BQ (c', i, j) weight entries of one group reduced over the
  N x Ho x Wo output pixels, BM at a time (one program does the whole sum,
  so half-precision weights are rounded once).

conv2d_bias_act is the forward kernel with ``HAS_BIAS`` and an activation
code ``ACT`` (identity, relu, sigmoid, tanh) applied to the accumulator in
the epilogue, before the one store (the plain conv2d passes HAS_BIAS=False,
ACT=0). Its backward is one pass ``_act_grad_kernel`` (gz = G * act'(y) from
the output y, and the per-channel sums of gz for the bias, partial sums and
``_sum_splits_kernel`` on the GPU when there are many pixels: no atomics),
then the two kernels above on gz.

conv_transpose2d is conv2d's adjoint, so it reuses them as in the reference:
forward = conv2d's input gradient, dx = conv2d forward, dw = conv2d weight
gradient with the roles of input and output gradient exchanged.

Dots: float32 with ``input_precision="ieee"``; float16/bfloat16 native with a
float32 accumulator on the GPU and upcast to float32 in the interpreter;
float64 as ``tl.sum`` of products. Inputs are read through their strides
(any layout); outputs are new dense tensors.

A faster version would need: tiles tuned per GPU (and autotuning there), the
channel loop outermost with the (i, j) taps unrolled so weight rows are
contiguous loads, channels-last layouts, and split-K for the weight gradient
when N*Ho*Wo is large.
"""
import torch
import triton
import triton.language as tl

from . import common
from .common import store_value
from .elementwise import _sigmoid, _tanh
from .matmul import _DOT_F32, _DOT_F64, _dot_kind   # the dot kinds and their choice, shared
from ..errors import DTypeError, ShapeError
# the shape arithmetic is the reference's: both sides read attrs the same way
from ..reference.conv import _out_side, _transpose_out_shape, BIAS_ACTIVATIONS


def _dot_kind_of(a, b):
    """The dot kind for operands ``a`` and ``b``: mixed dtypes (a float32
    gradient with float16 weights) compute in the wider type."""
    if a.dtype == b.dtype:
        return _dot_kind(a.dtype)
    return _DOT_F64 if torch.float64 in (a.dtype, b.dtype) else _DOT_F32


@triton.jit
def _mma(acc, a, b, DOT: tl.constexpr):
    if DOT == 2:
        acc += tl.sum(a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :], axis=1)
    elif DOT == 1:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.float32)
    return acc


@triton.jit
def _bias_act(acc, bias, oc, sb, cmask, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, NT: tl.constexpr):
    """The fused epilogue: acc + bias[oc] (HAS_BIAS), then the activation ACT
    (0 identity, 1 relu, 2 sigmoid, 3 tanh) in the accumulator's type."""
    if HAS_BIAS:
        bv = tl.load(bias + oc * sb, mask=cmask, other=0.0).to(acc.dtype)
        acc = acc + bv[None, :]
    if ACT == 1:    # (NaN stays NaN, as torch.relu)
        acc = tl.where(acc < 0, 0.0, acc)
    elif ACT == 2:
        acc = _sigmoid(acc)
    elif ACT == 3:
        acc = _tanh(acc, NT)
    return acc


@triton.jit
def _gather_conv_kernel(x, w, y, bias, sb,
                        H, W, HO, WO, NP, RG, COG,
                        sxn, sxc, sxh, sxw,
                        GS, SWO, SWR, swi, swj,
                        syn, syc, syh, syw,
                        SH, SW, PT, PL, DH, DW,
                        KH: tl.constexpr, KW: tl.constexpr, TRANSPOSED: tl.constexpr,
                        BP: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                        DOT: tl.constexpr, INTERP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, ACT: tl.constexpr, NT: tl.constexpr):
    """y[n, g*COG + c, p, q] = act(sum_{r < RG, i, j} x[n, g*RG + r, h, v] * w(g, c, r, i, j) + bias[g*COG + c])

    forward:    h = p*SH - PT + i*DH                (valid when 0 <= h < H)
    TRANSPOSED: h = (p + PT - i*DH) / SH            (valid when it divides and 0 <= h < H)
    (v likewise with q, SW, PL, DW); w(g, c, r, i, j) = w + g*GS + c*SWO + r*SWR + i*swi + j*swj.
    The bias term only with HAS_BIAS (bias[k] at bias + k*sb); act by ACT (see _bias_act).
    """
    pid_p = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1)
    gi = tl.program_id(2).to(tl.int64)
    rp = pid_p * BP + tl.arange(0, BP)
    pmask = rp < NP
    rp = tl.minimum(rp, NP - 1)
    n = rp // (HO * WO)
    rem = rp % (HO * WO)
    p = rem // WO
    q = rem % WO
    rc = pid_c * BC + tl.arange(0, BC)
    cmask = rc < COG
    K = RG * KH * KW
    if DOT == 2:
        acc = tl.zeros((BP, BC), dtype=tl.float64)
    else:
        acc = tl.zeros((BP, BC), dtype=tl.float32)
    xb = x + n * sxn
    wb = w + gi * GS + rc * SWO
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        r = rk // (KH * KW)
        ij = rk % (KH * KW)
        i = ij // KW
        j = ij % KW
        if TRANSPOSED:
            hn = p[:, None] + PT - i[None, :] * DH
            vn = q[:, None] + PL - j[None, :] * DW
            hn = tl.where(hn >= 0, hn, -1)
            vn = tl.where(vn >= 0, vn, -1)
            ok = (hn >= 0) & (vn >= 0) & (hn % SH == 0) & (vn % SW == 0)
            h = hn // SH
            v = vn // SW
        else:
            h = p[:, None] * SH - PT + i[None, :] * DH
            v = q[:, None] * SW - PL + j[None, :] * DW
            ok = (h >= 0) & (v >= 0)
        ok = ok & (h < H) & (v < W) & pmask[:, None] & kmask[None, :]
        h = tl.where(ok, h, 0)
        v = tl.where(ok, v, 0)
        ch = gi * RG + r
        a = tl.load(xb[:, None] + ch[None, :] * sxc + h * sxh + v * sxw, mask=ok, other=0.0)
        b = tl.load(wb[None, :] + r[:, None] * SWR + i[:, None] * swi + j[:, None] * swj,
                    mask=kmask[:, None] & cmask[None, :], other=0.0)
        acc = _mma(acc, a, b, DOT)
    oc = gi * COG + rc
    acc = _bias_act(acc, bias, oc, sb, cmask, HAS_BIAS, ACT, NT)
    yp = y + n[:, None] * syn + oc[None, :] * syc + p[:, None] * syh + q[:, None] * syw
    tl.store(yp, store_value(acc, y.dtype.element_ty, INTERP), mask=pmask[:, None] & cmask[None, :])


@triton.jit
def _weight_grad_kernel(x, g, dw,
                        H, W, HO, WO, NM, CG, OG,
                        sxn, sxc, sxh, sxw,
                        sgn, sgc, sgh, sgw,
                        sdo, sdc, sdi, sdj,
                        SH, SW, PT, PL, DH, DW,
                        KH: tl.constexpr, KW: tl.constexpr,
                        BO: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr,
                        DOT: tl.constexpr, INTERP: tl.constexpr):
    """dw[gi*OG + o, c, i, j] = sum_{n, p, q} g[n, gi*OG + o, p, q] * x[n, gi*CG + c, p*SH - PT + i*DH, q*SW - PL + j*DW]
    (x read as zero outside its bounds); one program sums all NM = N*HO*WO pixels."""
    pid_o = tl.program_id(0)
    pid_q = tl.program_id(1)
    gi = tl.program_id(2).to(tl.int64)
    ro = pid_o * BO + tl.arange(0, BO)
    omask = ro < OG
    rq = pid_q * BQ + tl.arange(0, BQ)
    Q = CG * KH * KW
    qmask = rq < Q
    c = rq // (KH * KW)
    ij = rq % (KH * KW)
    i = ij // KW
    j = ij % KW
    oc = gi * OG + ro
    ch = gi * CG + c
    if DOT == 2:
        acc = tl.zeros((BO, BQ), dtype=tl.float64)
    else:
        acc = tl.zeros((BO, BQ), dtype=tl.float32)
    for m0 in range(0, NM, BM):
        rm = m0 + tl.arange(0, BM).to(tl.int64)
        mmask = rm < NM
        n = rm // (HO * WO)
        rem = rm % (HO * WO)
        p = rem // WO
        q = rem % WO
        a = tl.load(g + n[None, :] * sgn + oc[:, None] * sgc + p[None, :] * sgh + q[None, :] * sgw,
                    mask=omask[:, None] & mmask[None, :], other=0.0)
        h = p[:, None] * SH - PT + i[None, :] * DH
        v = q[:, None] * SW - PL + j[None, :] * DW
        ok = (h >= 0) & (v >= 0) & (h < H) & (v < W) & mmask[:, None] & qmask[None, :]
        h = tl.where(ok, h, 0)
        v = tl.where(ok, v, 0)
        b = tl.load(x + n[:, None] * sxn + ch[None, :] * sxc + h * sxh + v * sxw, mask=ok, other=0.0)
        acc = _mma(acc, a, b, DOT)
    dp = dw + oc[:, None] * sdo + c[None, :] * sdc + i[None, :] * sdi + j[None, :] * sdj
    tl.store(dp, store_value(acc, dw.dtype.element_ty, INTERP), mask=omask[:, None] & qmask[None, :])


@triton.jit
def _act_grad_kernel(g, y, gz, part, O, NPIX, WO, NM, chunk,
                     sgn, sgc, sgh, sgw, syn, syc, syh, syw,
                     ACT: tl.constexpr, STORE: tl.constexpr, CT: tl.constexpr, INTERP: tl.constexpr,
                     BO: tl.constexpr, BM: tl.constexpr):
    """gz[n, o, p, q] = g[n, o, p, q] * act'(y[n, o, p, q]) into a dense gz (only with
    STORE; identity leaves g as it is) and part[s, o] = sum_{pixels m = (n, p, q) of
    split s} gz[n, o, p, q], split s covering m in [s*chunk, (s+1)*chunk) of NM = N*HO*WO.
    act' from y: identity 1, relu [not y <= 0] (0 at 0, 1 at NaN: torch's threshold_backward),
    sigmoid y (1 - y), tanh 1 - y^2."""
    pid_o = tl.program_id(0)
    pid_s = tl.program_id(1).to(tl.int64)
    ro = (pid_o * BO + tl.arange(0, BO)).to(tl.int64)
    omask = ro < O
    m_lo = pid_s * chunk
    m_hi = tl.minimum(m_lo + chunk, NM)
    acc = tl.zeros((BO, BM), dtype=CT)
    for m0 in range(m_lo, m_hi, BM):
        rm = m0 + tl.arange(0, BM)
        mmask = rm < m_hi
        n = rm // NPIX
        pix = rm % NPIX
        p = pix // WO
        q = pix % WO
        mask = omask[:, None] & mmask[None, :]
        gv = tl.load(g + n[None, :] * sgn + ro[:, None] * sgc + p[None, :] * sgh + q[None, :] * sgw,
                     mask=mask, other=0.0).to(CT)
        if ACT == 0:
            d = gv
        else:
            yv = tl.load(y + n[None, :] * syn + ro[:, None] * syc + p[None, :] * syh + q[None, :] * syw,
                         mask=mask, other=0.0).to(CT)
            if ACT == 1:
                d = tl.where(yv <= 0, 0.0, gv)
            elif ACT == 2:
                d = gv * (yv * (1.0 - yv))
            else:
                d = gv * (1.0 - yv * yv)
        if STORE:
            tl.store(gz + (n[None, :] * O + ro[:, None]) * NPIX + pix[None, :],
                     store_value(d, gz.dtype.element_ty, INTERP), mask=mask)
        acc += d
    tl.store(part + pid_s * O + ro, store_value(tl.sum(acc, axis=1), part.dtype.element_ty, INTERP),
             mask=omask)


@triton.jit
def _sum_splits_kernel(part, db, S, O, CT: tl.constexpr, INTERP: tl.constexpr,
                       BS: tl.constexpr, BO: tl.constexpr):
    """db[o] = sum_{s < S} part[s, o] (part dense (S, O))."""
    ro = tl.program_id(0).to(tl.int64) * BO + tl.arange(0, BO)
    omask = ro < O
    acc = tl.zeros((BS, BO), dtype=CT)
    for s0 in range(0, S, BS):
        rs = s0 + tl.arange(0, BS)
        acc += tl.load(part + rs[:, None] * O + ro[None, :], mask=(rs < S)[:, None] & omask[None, :],
                       other=0.0).to(CT)
    tl.store(db + ro, store_value(tl.sum(acc, axis=0), db.dtype.element_ty, INTERP), mask=omask)


# --- launch helpers ---------------------------------------------------------------------------

def _p2(n):
    return common.next_pow2(max(int(n), 1))


def _tiles(M, N, K, dtype):
    """(BM, BN, BK) by hand for an M x N output tile reduced over K: at least
    16 each (tl.dot's minimum); big tiles in the interpreter (it pays per
    program), small for float64 (whose product tile is materialised)."""
    if common.INTERPRET:
        bm, bn = max(16, min(_p2(M), 512)), max(16, min(_p2(N), 64))
        cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
        bk = max(16, min(_p2(K), 256, cap // (bm * bn)))
        return bm, bn, bk
    if dtype == torch.float64:
        return 32, 16, 16
    return 64, 32, 32


def _gather_conv(x, w, y, ci_per_group, co_per_group, groups, w_strides, stride, padding, dilation,
                 transposed, bias=None, act=0):
    N, _, H, W = x.shape
    _, _, HO, WO = y.shape
    kh, kw = w.shape[2], w.shape[3]
    NP = N * HO * WO
    if NP == 0 or co_per_group == 0:
        return y
    bp, bc, bk = _tiles(NP, co_per_group, ci_per_group * kh * kw, x.dtype)
    grid = (common.cdiv(NP, bp), common.cdiv(co_per_group, bc), groups)
    (sh, sw), (pt, _, pl, _), (dh, dw) = stride, padding, dilation
    has_bias = bias is not None
    common.launch(_gather_conv_kernel, grid, x, w, y, bias if has_bias else y,
                  bias.stride(0) if has_bias else 0,
                  H, W, HO, WO, NP, ci_per_group, co_per_group,
                  *x.stride(), *w_strides, w.stride(2), w.stride(3), *y.stride(),
                  sh, sw, pt, pl, dh, dw,
                  KH=kh, KW=kw, TRANSPOSED=transposed, BP=bp, BC=bc, BK=bk,
                  DOT=_dot_kind_of(x, w), INTERP=common.INTERPRET,
                  HAS_BIAS=has_bias, ACT=act, NT=17 if x.dtype == torch.float64 else 9)
    return y


def _check(x, w, groups):
    if x.dim() != 4 or w.dim() != 4:
        raise ShapeError(f"conv needs x of shape (N, C, H, W) and w of 4 dimensions, got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise DTypeError(f"conv of {x.dtype} and {w.dtype}: convert one of them first")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"conv on the GPU needs floating inputs, got {x.dtype}")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise ShapeError(f"groups={groups} must divide the channels of x {tuple(x.shape)} and of "
                         f"w {tuple(w.shape)}")


def _conv2d(x, w, stride, padding, dilation, groups, bias=None, act=0):
    """conv2d forward into a new dense tensor (the reference's formula); with
    ``bias`` and ``act`` (an ACT code) the fused act(conv2d + bias)."""
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, padding, dilation
    Ho, Wo = _out_side(H, pt, pb, kh, sh, dh), _out_side(W, pl, pr, kw, sw, dw)
    if Ho < 1 or Wo < 1:
        raise ShapeError(f"conv: the padded input {tuple(x.shape)} is smaller than the dilated kernel "
                         f"{(kh, kw)} (dilation {dilation}, padding {padding})")
    y = common.empty((N, O, Ho, Wo), x.dtype, x.device)
    if Cg == 0 and bias is None and act == 0:
        return common.full(y.shape, 0.0, x.dtype, x.device) if y.numel() else y
    # weight entry (g, c, r) = w[g*O/G + c, r]  (Cg == 0: an empty reduction, acc stays 0)
    return _gather_conv(x, w, y, Cg, O // groups, groups,
                        ((O // groups) * w.stride(0), w.stride(0), w.stride(1)),
                        stride, padding, dilation, transposed=False, bias=bias, act=act)


def _conv2d_input_grad(g, w, x_shape, stride, padding, dilation, groups, dtype):
    """conv2d's input gradient (= conv_transpose2d forward) into a new dense tensor."""
    O, Cg, kh, kw = w.shape
    dx = common.empty(x_shape, dtype, g.device)
    if dx.numel() == 0:
        return dx
    if O == 0 or g.shape[2] == 0 or g.shape[3] == 0:
        return common.full(x_shape, 0.0, dtype, g.device)
    # output channel c of group gi reduces over r < O/G: weight (gi, c, r) = w[gi*O/G + r, c]
    return _gather_conv(g, w, dx, O // groups, Cg, groups,
                        ((O // groups) * w.stride(0), w.stride(1), w.stride(0)),
                        stride, padding, dilation, transposed=True)


def _conv2d_weight_grad(x, g, w_shape, stride, padding, dilation, groups, dtype):
    """conv2d's weight gradient into a new dense tensor of ``w_shape``."""
    O, Cg, kh, kw = w_shape
    N, _, H, W = x.shape
    _, _, HO, WO = g.shape
    dw = common.empty(w_shape, dtype, x.device)
    if dw.numel() == 0:
        return dw
    NM = N * HO * WO
    if NM == 0:
        return common.full(w_shape, 0.0, dtype, x.device)
    OG = O // groups
    Q = Cg * kh * kw
    bo, bq, bm = _tiles(OG, Q, NM, x.dtype)
    if common.INTERPRET:
        bo, bq = max(16, min(_p2(OG), 64)), max(16, min(_p2(Q), 128))
        cap = (1 << 18) if x.dtype == torch.float64 else (1 << 21)
        bm = max(16, min(_p2(NM), 1024, cap // (bo * bq)))
    (sh, sw), (pt, _, pl, _), (dh, dwl) = stride, padding, dilation
    grid = (common.cdiv(OG, bo), common.cdiv(Q, bq), groups)
    common.launch(_weight_grad_kernel, grid, x, g, dw, H, W, HO, WO, NM, Cg, OG,
                  *x.stride(), *g.stride(), *dw.stride(), sh, sw, pt, pl, dh, dwl,
                  KH=kh, KW=kw, BO=bo, BQ=bq, BM=bm, DOT=_dot_kind_of(x, g), INTERP=common.INTERPRET)
    return dw


def _attrs(stride, padding, dilation):
    return tuple(int(s) for s in stride), tuple(int(p) for p in padding), tuple(int(d) for d in dilation)


def conv2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """y = conv2d(x, w) (see the reference for the formula)."""
    _check(x, w, groups)
    if x.shape[1] // groups != w.shape[1]:
        raise ShapeError(f"conv2d: w {tuple(w.shape)} needs C/groups = {x.shape[1] // groups} "
                         "input channels")
    stride, padding, dilation = _attrs(stride, padding, dilation)
    return _conv2d(x, w, stride, padding, dilation, groups)


def conv2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """dx = the transposed-conv gather of G with w; dw = the reduction of G x
    im2col(x) over N x Ho x Wo (see the reference)."""
    stride, padding, dilation = _attrs(stride, padding, dilation)
    dx = _conv2d_input_grad(grad, w, tuple(x.shape), stride, padding, dilation, groups, x.dtype)
    dw = _conv2d_weight_grad(x, grad, tuple(w.shape), stride, padding, dilation, groups, w.dtype)
    return dx, dw


def conv_transpose2d_forward(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                             dilation=(1, 1), groups=1):
    """y = conv_transpose2d(x, w): conv2d's input gradient (see the reference)."""
    _check(x, w, groups)
    if x.shape[1] != w.shape[0]:
        raise ShapeError(f"conv_transpose2d: w {tuple(w.shape)} needs {x.shape[1]} input channels first")
    stride, padding, dilation = _attrs(stride, padding, dilation)
    output_padding = tuple(int(o) for o in output_padding)
    shape = _transpose_out_shape(x, w, stride, padding, output_padding, dilation, groups)
    return _conv2d_input_grad(x, w, shape, stride, padding, dilation, groups, x.dtype)


def conv_transpose2d_backward(grad, out, x, w, stride=(1, 1), padding=(0, 0, 0, 0),
                              output_padding=(0, 0), dilation=(1, 1), groups=1):
    """dx = conv2d(G, w); dw = conv2d's weight gradient with input G and output gradient x."""
    stride, padding, dilation = _attrs(stride, padding, dilation)
    # output_padding of a stride or more adds positions no input reaches (see the reference)
    H, W = x.shape[2:]
    extra = (int(output_padding[0]) // stride[0], int(output_padding[1]) // stride[1])
    if x.numel() == 0:
        dx = common.empty(tuple(x.shape), x.dtype, x.device)
    else:
        dx = common.contiguous(_conv2d(grad, w, stride, padding, dilation, groups)[:, :, :H, :W])
    if extra != (0, 0):
        padded = common.full((x.shape[0], x.shape[1], H + extra[0], W + extra[1]), 0, x.dtype, x.device)
        x = common.copy_into(padded[:, :, :H, :W], x)
        x = padded
    dw = _conv2d_weight_grad(grad, x, tuple(w.shape), stride, padding, dilation, groups, w.dtype)
    return dx, dw


# --- conv2d with bias and activation fused --------------------------------------------------

#: activation name -> the ACT code of _bias_act / _act_grad_kernel
_ACT_CODES = {name: code for code, name in enumerate(BIAS_ACTIVATIONS)}


def _check_bias_act(x, w, b, activation):
    if activation not in _ACT_CODES:
        raise ValueError(f"conv2d_bias_act: activation must be one of {BIAS_ACTIVATIONS} (those whose "
                         f"derivative follows from the output), got {activation!r}; apply other "
                         "activations after conv2d")
    if b.dim() != 1 or b.shape[0] != w.shape[0]:
        raise ShapeError(f"conv2d_bias_act: the bias must have shape ({w.shape[0]},) (one entry per "
                         f"output channel of w {tuple(w.shape)}), got {tuple(b.shape)}")
    if b.dtype != x.dtype:
        raise DTypeError(f"conv2d_bias_act: the bias is {b.dtype} but x is {x.dtype}; convert one of "
                         "them first")
    if b.device != x.device:
        raise ValueError(f"conv2d_bias_act: the bias is on {b.device} but x on {x.device}")


def _act_grad_and_bias_grad(grad, out, b, act):
    """(gz, db): gz = G * act'(y) as a new dense tensor (G itself for identity;
    relu in G's dtype, sigmoid/tanh in the compute type) and db = its per-channel sum in b's dtype, in one pass over
    G and y (float32/float64 accumulation, no atomics: with several splits per
    channel, partial sums and a second small launch)."""
    N, O, HO, WO = out.shape
    NPIX, NM = HO * WO, N * HO * WO
    store = act != 0
    acc_dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    # relu's gz is exactly G or 0 in G's dtype; sigmoid's and tanh's is kept in
    # the compute type (float32 for half precision), not rounded before the convs
    gz_dtype = grad.dtype if act == 1 else acc_dtype
    gz = common.empty(tuple(out.shape), gz_dtype, out.device) if store else grad
    if O == 0:
        return gz, common.empty((0,), b.dtype, b.device)
    if NM == 0:
        return gz, common.full((O,), 0.0, b.dtype, b.device)
    ct = common.compute_type(out.dtype)
    if common.INTERPRET:
        bo = max(2, min(_p2(O), 64))
        bm = max(16, min(_p2(NM), (1 << 16) // bo))
        splits = 1
    else:
        bo, bm = 4, 256
        # enough programs to fill the GPU, each with at least a few thousand pixels
        splits = max(1, min(common.cdiv(NM, 4096), common.cdiv(1024, common.cdiv(O, bo))))
    chunk = common.cdiv(common.cdiv(NM, splits), bm) * bm
    splits = common.cdiv(NM, chunk)
    db = common.empty((O,), b.dtype, b.device)
    part = db if splits == 1 else common.empty((splits, O), acc_dtype, b.device)
    common.launch(_act_grad_kernel, (common.cdiv(O, bo), splits), grad, out, gz, part, O, NPIX, WO, NM,
                  chunk, *grad.stride(), *out.stride(), ACT=act, STORE=store, CT=ct,
                  INTERP=common.INTERPRET, BO=bo, BM=bm)
    if splits > 1:
        bo2 = 64
        common.launch(_sum_splits_kernel, (common.cdiv(O, bo2),), part, db, splits, O, CT=ct,
                      INTERP=common.INTERPRET, BS=16, BO=bo2)
    return gz, db


def conv2d_bias_act_forward(x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                            activation="identity"):
    """y = act(conv2d(x, w) + b) (see the reference): the conv kernel with the
    bias and the activation applied in its epilogue, before the one store."""
    _check(x, w, groups)
    if x.shape[1] // groups != w.shape[1]:
        raise ShapeError(f"conv2d: w {tuple(w.shape)} needs C/groups = {x.shape[1] // groups} "
                         "input channels")
    _check_bias_act(x, w, b, activation)
    stride, padding, dilation = _attrs(stride, padding, dilation)
    return _conv2d(x, w, stride, padding, dilation, groups, bias=b, act=_ACT_CODES[activation])


def conv2d_bias_act_backward(grad, out, x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                             groups=1, activation="identity"):
    """gz = G * act'(y) and db = sum_{n, p, q} gz in one kernel (from the output
    y alone), then conv2d's input- and weight-gradient kernels on gz."""
    stride, padding, dilation = _attrs(stride, padding, dilation)
    gz, db = _act_grad_and_bias_grad(grad, out, b, _ACT_CODES[activation])
    dx = _conv2d_input_grad(gz, w, tuple(x.shape), stride, padding, dilation, groups, x.dtype)
    dw = _conv2d_weight_grad(x, gz, tuple(w.shape), stride, padding, dilation, groups, w.dtype)
    return dx, dw, db
