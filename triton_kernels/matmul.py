"""Matrix products, Triton kernels (forward and backward).

One tiled kernel computes every product: a (possibly batched) ``C = A @ B``
in which each operand is read through its own strides, so transposed views
(``a.T``), strided slices and broadcast batch axes (stride 0) need no copy.
The backward pass calls the same kernel on transposed *views*
(``dA = G @ B^T``, ``dB = A^T @ G``) and sums broadcast batch axes away with
``unbroadcast``.

Accumulation is always in float32 (float64 for float64). float32 dots use
``input_precision="ieee"`` (never TF32), so the GPU and the interpreter agree;
float16/bfloat16 feed ``tl.dot`` natively on the GPU and are upcast to
float32 first in the interpreter (whose bfloat16 dot is broken); float64 has
no ``tl.dot`` and uses an explicit multiply-and-sum over the K tile.
"""
import torch
import triton
import triton.language as tl

from . import common
from .common import store_value
from .reduce import unbroadcast
from ..errors import DTypeError, ShapeError

# dot flavours (constexpr)
_DOT_NATIVE = 0   # float16 / bfloat16 on the GPU: tl.dot, float32 accumulator
_DOT_F32 = 1      # float32 (or half upcast in the interpreter): ieee tl.dot
_DOT_F64 = 2      # float64: tl.sum of the outer products


@triton.jit
def _matmul_kernel(a, b, c, M, N, K, NB,
                   D1, D2, D3, D4, D5,
                   A0, A1, A2, A3, A4, A5,
                   B0, B1, B2, B3, B4, B5,
                   C0, C1, C2, C3, C4, C5,
                   sam, sak, sbk, sbn, scm, scn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BB: tl.constexpr,
                   GROUP_M: tl.constexpr, DOT: tl.constexpr, INTERP: tl.constexpr):
    """C[i] = A[i] @ B[i] for the NB batch items i (row-major over the batch
    axes D0..D5; A0..A5 etc. are each operand's batch strides, 0 where it
    broadcasts). One program computes one BM x BN output tile of BB batch
    items: BB is 1 on the GPU (2-d tiles, tl.dot) and larger in the
    interpreter, which pays per program (3-d tiles, batched tl.dot)."""
    pid = tl.program_id(0).to(tl.int64)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    tiles = num_m * num_n
    t = pid % tiles
    # grouped ordering: GROUP_M tile rows sweep the columns together (L2 reuse)
    in_group = GROUP_M * num_n
    first_m = (t // in_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pm = first_m + (t % in_group) % group_m
    pn = (t % in_group) // group_m

    bi = (pid // tiles) * BB + tl.arange(0, BB)          # batch items, [BB]
    bmask = bi < NB
    bi = tl.minimum(bi, NB - 1)                           # past the end: reread the last
    a_b = common.nd_offset(bi, D1, D2, D3, D4, D5, A0, A1, A2, A3, A4, A5)
    b_b = common.nd_offset(bi, D1, D2, D3, D4, D5, B0, B1, B2, B3, B4, B5)
    c_b = common.nd_offset(bi, D1, D2, D3, D4, D5, C0, C1, C2, C3, C4, C5)

    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if DOT == 2:
        acc_ty = tl.float64
    else:
        acc_ty = tl.float32

    if BB == 1:
        # masked edges (a modulo would hide the contiguity of the rows from
        # the compiler and cost vectorised loads)
        a_ptrs = a + a_b[:, None] + rm[:, None] * sam + rk[None, :] * sak
        b_ptrs = b + b_b[:, None] + rk[:, None] * sbk + rn[None, :] * sbn
        mmask = (rm < M)[:, None]
        nmask = (rn < N)[None, :]
        acc = tl.zeros((BM, BN), dtype=acc_ty)
        for k in range(0, K, BK):
            kmask = rk < K - k
            av = tl.load(a_ptrs, mask=mmask & kmask[None, :], other=0.0)
            bv = tl.load(b_ptrs, mask=kmask[:, None] & nmask, other=0.0)
            if DOT == 2:
                acc += tl.sum(av.to(tl.float64)[:, :, None] * bv.to(tl.float64)[None, :, :], axis=1)
            elif DOT == 1:
                acc = tl.dot(av.to(tl.float32), bv.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(av, bv, acc, out_dtype=tl.float32)
            a_ptrs += BK * sak
            b_ptrs += BK * sbk
        c_ptrs = c + c_b[:, None] + rm[:, None] * scm + rn[None, :] * scn
        cmask = bmask[:, None] & mmask & nmask
    else:
        # rows/columns past the edge read a valid row/column again (never stored)
        am = (rm % M) * sam
        bn = (rn % N) * sbn
        a_ptrs = a + a_b[:, None, None] + am[None, :, None] + rk[None, None, :] * sak
        b_ptrs = b + b_b[:, None, None] + rk[None, :, None] * sbk + bn[None, None, :]
        acc = tl.zeros((BB, BM, BN), dtype=acc_ty)
        for k in range(0, K, BK):
            kmask = rk < K - k
            av = tl.load(a_ptrs, mask=kmask[None, None, :], other=0.0)
            bv = tl.load(b_ptrs, mask=kmask[None, :, None], other=0.0)
            if DOT == 2:
                acc += tl.sum(av.to(tl.float64)[:, :, :, None] * bv.to(tl.float64)[:, None, :, :],
                              axis=2)
            elif DOT == 1:
                acc = tl.dot(av.to(tl.float32), bv.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(av, bv, acc, out_dtype=tl.float32)
            a_ptrs += BK * sak
            b_ptrs += BK * sbk
        c_ptrs = c + c_b[:, None, None] + rm[None, :, None] * scm + rn[None, None, :] * scn
        cmask = bmask[:, None, None] & (rm < M)[None, :, None] & (rn < N)[None, None, :]
    tl.store(c_ptrs, store_value(acc, c.dtype.element_ty, INTERP), mask=cmask)


def _broadcast_batch(sa, sb):
    nd = max(len(sa), len(sb))
    sa = (1,) * (nd - len(sa)) + tuple(sa)
    sb = (1,) * (nd - len(sb)) + tuple(sb)
    out = []
    for x, y in zip(sa, sb):
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(out)


def _batch_strides(t, batch):
    """Strides of ``t``'s batch axes read broadcast to ``batch`` (0 where
    broadcast)."""
    nb = t.dim() - 2
    lead = len(batch) - nb
    out = [0] * lead
    for i in range(nb):
        out.append(0 if t.shape[i] == 1 and batch[lead + i] != 1 else t.stride(i))
    return out


def _tiles(nbatch, M, N, K, dtype):
    """(BB, BM, BN, BK, num_warps) by hand: no autotuning (it would run every
    config in the interpreter). The interpreter pays ~1 ms per program and
    little per element, so there one program takes tiles as big as the
    problem allows (bounded) and several batch items at once."""
    p2 = common.next_pow2
    if common.INTERPRET:
        bm, bn = min(p2(M), 128), min(p2(N), 128)
        # float64 materialises the BM x BK x BN products: keep them small
        cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
        bk = max(1, min(p2(K), 128, cap // (bm * bn)))
        bb = max(1, min(p2(nbatch), cap // (bm * bn * bk), (1 << 16) // (bm * max(bn, bk))))
        return bb, bm, bn, bk, 4
    if dtype == torch.float64:
        return 1, 32, 32, 8, 4
    return 1, 64, 64, 32, 4


def _dot_kind(dtype):
    if dtype == torch.float64:
        return _DOT_F64
    if dtype == torch.float32 or common.INTERPRET:
        return _DOT_F32
    return _DOT_NATIVE


def _check(a, b):
    if a.dim() == 0 or b.dim() == 0:
        raise ShapeError(f"matmul needs tensors of at least one dimension, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}; use `*` to scale by a scalar")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul of {a.dtype} and {b.dtype}: convert one of them first "
                         "(e.g. `f32(x)`) so both have the same dtype")
    if not a.dtype.is_floating_point:
        raise DTypeError(f"matmul on the GPU needs floating inputs, got {a.dtype}")


def _fold_batch(a, b):
    """``(..., M, K) @ (K, N)``: when ``a``'s batch axes merge with M in a
    view, it is one ``(B*M, K) @ (K, N)`` product (fewer, fuller tiles)."""
    if b.dim() != 2 or a.dim() <= 2:
        return None
    rows = 1
    for s in a.shape[:-1]:
        rows *= s
    try:
        a2 = a.view(rows, a.shape[-1])
    except RuntimeError:
        return None
    return a2


def _mm(a, b, out_dtype=None):
    """``a @ b`` for ``a`` of shape ``(..., M, K)``, ``b`` of shape ``(..., K, N)``
    (at least 2-d each, any strides): a new dense ``(batch..., M, N)`` tensor,
    in ``a``'s dtype or ``out_dtype``."""
    out_dtype = a.dtype if out_dtype is None else out_dtype
    M, K = a.shape[-2], a.shape[-1]
    K2, N = b.shape[-2], b.shape[-1]
    if K != K2:
        raise ShapeError(f"matmul of shapes {tuple(a.shape)} and {tuple(b.shape)}: the inner "
                         f"sizes differ ({K} != {K2})")
    batch = _broadcast_batch(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise ShapeError(f"matmul of shapes {tuple(a.shape)} and {tuple(b.shape)}: the batch "
                         f"axes {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} do not broadcast")
    out_shape = batch + (M, N)
    folded = _fold_batch(a, b)
    if folded is not None:
        return _mm(folded, b, out_dtype).view(out_shape)
    nbatch = 1
    for s in batch:
        nbatch *= s
    if nbatch == 0 or M == 0 or N == 0:
        return common.empty(out_shape, out_dtype, a.device)
    if K == 0:
        return common.full(out_shape, 0.0, out_dtype, a.device)
    c = common.empty(out_shape, out_dtype, a.device)
    dims, (sa, sb, sc) = common.merge_dims(
        batch, _batch_strides(a, batch), _batch_strides(b, batch), list(c.stride()[:-2]))
    bb, bm, bn, bk, warps = _tiles(nbatch, M, N, K, a.dtype)
    grid = (common.cdiv(nbatch, bb) * common.cdiv(M, bm) * common.cdiv(N, bn),)
    common.launch(_matmul_kernel, grid, a, b, c, M, N, K, nbatch, *dims[1:], *sa, *sb, *sc,
                  a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1),
                  c.stride(-2), c.stride(-1),
                  BM=bm, BN=bn, BK=bk, BB=bb, GROUP_M=8, DOT=_dot_kind(a.dtype), INTERP=common.INTERPRET,
                  num_warps=warps)
    return c


def matmul_forward(a, b):
    """C = A @ B with NumPy's ``matmul`` semantics (see the reference).

    Vectors are promoted by metadata-only views (``unsqueeze``) and the
    promoted axis dropped from the (dense) result by a view.
    """
    _check(a, b)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    c = _mm(a2, b2)
    if a.dim() == 1:
        c = c.squeeze(-2)
    if b.dim() == 1:
        c = c.squeeze(-1)
    return c


def _summed_grad(x, y, shape):
    """``x @ y`` summed down to ``shape`` (``unbroadcast``). When a sum is
    needed, the product is kept in float32 for float16/bfloat16 so that the
    result is rounded once, after the sum."""
    wide = None
    summed = _broadcast_batch(x.shape[:-2], y.shape[:-2]) != tuple(shape[:-2])
    if summed and x.dtype in (torch.float16, torch.bfloat16):
        wide = torch.float32
    p = _mm(x, y, out_dtype=wide)
    return unbroadcast(p, tuple(shape), dtype=None if wide is None else x.dtype)


def matmul_backward(grad, out, a, b, needs=(True, True)):
    """dA = G @ B^T, dB = A^T @ G (the reference has the full statement): the
    forward kernel on transposed views, then ``unbroadcast`` over batch axes.
    ``needs`` says which of (dA, dB) to compute; the other is ``None``. A
    transposed matrix operand (Dense's ``weight.T``) gets its gradient in its
    own memory layout, so optimiser updates read dense memory."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a            # (..., M, K)
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b           # (..., K, N)
    g2 = grad
    if a.dim() == 1:
        g2 = g2.unsqueeze(g2.dim() - (0 if b.dim() == 1 else 1))
    if b.dim() == 1:
        g2 = g2.unsqueeze(-1)                             # (batch..., M, N)

    da = _summed_grad(g2, b2.transpose(-1, -2), a2.shape).view(a.shape) if needs[0] else None
    if not needs[1]:
        return da, None

    db = None
    transposed_b = b2.dim() == 2 and b2.stride(0) == 1 and b2.stride(1) != 1
    if b2.dim() == 2 and a2.dim() == 2 and transposed_b:
        db = _mm(g2.transpose(0, 1), a2).transpose(0, 1)     # (G^T A)^T: b's layout
    elif b2.dim() == 2 and a2.dim() > 2:
        # dB = sum over the batch of A_i^T G_i: one product with the batch
        # folded into the contraction (K' = batch * M), when views allow it
        rows = 1
        for s in a2.shape[:-1]:
            rows *= s
        try:
            af = a2.view(rows, a2.shape[-1])
            gf = g2.view(rows, g2.shape[-1])
            db = _mm(gf.transpose(0, 1), af).transpose(0, 1) if transposed_b else _mm(af.transpose(0, 1), gf)
        except RuntimeError:
            db = None
    if db is None:
        db = _summed_grad(a2.transpose(-1, -2), g2, b2.shape)
    return da, db.view(b.shape)
