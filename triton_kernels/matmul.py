"""Matrix products, Triton kernels (forward and backward).

One tiled kernel computes every product: a (possibly batched) ``C = A @ B``
in which each operand is read through its own strides, so transposed views
(``a.T``), strided slices and broadcast batch axes (stride 0) need no copy.
The backward pass calls the same kernel on transposed *views*
(``dA = G @ B^T``, ``dB = A^T @ G``) and sums broadcast batch axes away with
``unbroadcast``.

The products are ``numerics.dot``'s, accumulated in float32 (float64 for
float64). float32 dots use ``input_precision="ieee"``, so the GPU and the
interpreter agree, unless ``set_matmul_precision("tf32")`` asks for TF32
tensor cores (``numerics.DOT_TF32``);
float16/bfloat16 feed ``tl.dot`` natively on the GPU and are upcast to
float32 first in the interpreter (whose bfloat16 dot is broken); float64 has
no ``tl.dot`` and uses an explicit multiply-and-sum over the K tile.

dense_bias_act is the same kernel on x (rows, K) and the weight's transposed
view, with the bias and the activation applied in its epilogue (``HAS_BIAS``,
``ACTIVATION``); its backward is ``bias_act.act_grad_and_bias_grad`` (gz =
G act'(y) and the bias gradient in one pass), then two products on gz.
"""
from functools import lru_cache

import torch
import triton
import triton.language as tl

from . import copy, indexing, launch, numerics, tuning
from .bias_act import act_grad_and_bias_grad
from .numerics import ACT_IDENTITY, ACTIVATION_CODES, store_value
from .reduce import unbroadcast
from ..autotuning import get_autotune
from ..dtypes import to_torch
from ..errors import DTypeError
from ..specs.matmul import dense_bias_act_spec, matmul_spec


@triton.jit
def _matmul_kernel(a, b, c, bias, M, N, K, batch_size,
                   batch_size1, batch_size2, batch_size3, batch_size4, batch_size5,
                   a_batch_stride0, a_batch_stride1, a_batch_stride2,
                   a_batch_stride3, a_batch_stride4, a_batch_stride5,
                   b_batch_stride0, b_batch_stride1, b_batch_stride2,
                   b_batch_stride3, b_batch_stride4, b_batch_stride5,
                   c_batch_stride0, c_batch_stride1, c_batch_stride2,
                   c_batch_stride3, c_batch_stride4, c_batch_stride5,
                   a_stride_m, a_stride_k, b_stride_k, b_stride_n, c_stride_m, c_stride_n, bias_stride,
                   HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                   BLOCK_SIZE_BATCH: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                   DOT: tl.constexpr, INTERP: tl.constexpr):
    """C[i] = A[i] @ B[i] for the ``batch_size`` batch items i (row-major over
    up to six merged batch axes of sizes (batch_size0, ..., batch_size5);
    each operand's batch strides are 0 where it broadcasts). One program
    computes one BLOCK_SIZE_M x BLOCK_SIZE_N output tile of BLOCK_SIZE_BATCH
    batch items: one on the GPU (2-d tiles, tl.dot) and more in the
    interpreter, which pays per program (3-d tiles, batched tl.dot).
    The epilogue, on the accumulator before the one store: + bias[j] on column
    j (HAS_BIAS, bias read through ``bias_stride``), then the ACTIVATION
    (``numerics.activate``; ACT_IDENTITY for a plain product): dense_bias_act."""
    pid = tl.program_id(0)                 # tile arithmetic in 32 bits, offsets in 64
    num_tiles_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles = num_tiles_m * num_tiles_n
    tile = pid % tiles
    # grouped ordering: GROUP_SIZE_M tile rows sweep the columns together (L2 reuse)
    tiles_in_group = GROUP_SIZE_M * num_tiles_n
    first_tile_m = (tile // tiles_in_group) * GROUP_SIZE_M
    group_size_m = tl.minimum(num_tiles_m - first_tile_m, GROUP_SIZE_M)
    tile_m = first_tile_m + (tile % tiles_in_group) % group_size_m
    tile_n = (tile % tiles_in_group) // group_size_m

    items = (pid // tiles).to(tl.int64) * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    items_mask = items < batch_size
    items = tl.minimum(items, batch_size - 1)                  # past the end: reread the last
    a_item = indexing.nd_offset(items, batch_size1, batch_size2, batch_size3, batch_size4, batch_size5,
                                a_batch_stride0, a_batch_stride1, a_batch_stride2,
                                a_batch_stride3, a_batch_stride4, a_batch_stride5)
    b_item = indexing.nd_offset(items, batch_size1, batch_size2, batch_size3, batch_size4, batch_size5,
                                b_batch_stride0, b_batch_stride1, b_batch_stride2,
                                b_batch_stride3, b_batch_stride4, b_batch_stride5)
    c_item = indexing.nd_offset(items, batch_size1, batch_size2, batch_size3, batch_size4, batch_size5,
                                c_batch_stride0, c_batch_stride1, c_batch_stride2,
                                c_batch_stride3, c_batch_stride4, c_batch_stride5)

    rows = tile_m.to(tl.int64) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    cols = tile_n.to(tl.int64) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    inner = tl.arange(0, BLOCK_SIZE_K)
    if DOT == numerics.DOT_FP64:
        acc_type = tl.float64
    else:
        acc_type = tl.float32

    if BLOCK_SIZE_BATCH == 1:
        # masked edges (a modulo would hide the contiguity of the rows from
        # the compiler and cost vectorised loads)
        a_ptrs = a + a_item[:, None] + rows[:, None] * a_stride_m + inner[None, :] * a_stride_k
        b_ptrs = b + b_item[:, None] + inner[:, None] * b_stride_k + cols[None, :] * b_stride_n
        rows_mask = (rows < M)[:, None]
        cols_mask = (cols < N)[None, :]
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=acc_type)
        for k in range(0, K, BLOCK_SIZE_K):
            inner_mask = inner < K - k
            a_block = tl.load(a_ptrs, mask=rows_mask & inner_mask[None, :], other=0.0)
            b_block = tl.load(b_ptrs, mask=inner_mask[:, None] & cols_mask, other=0.0)
            acc = numerics.dot(acc, a_block, b_block, DOT)
            a_ptrs += BLOCK_SIZE_K * a_stride_k
            b_ptrs += BLOCK_SIZE_K * b_stride_k
        c_ptrs = c + c_item[:, None] + rows[:, None] * c_stride_m + cols[None, :] * c_stride_n
        c_mask = items_mask[:, None] & rows_mask & cols_mask
    else:
        # rows/columns past the edge read a valid row/column again (never stored)
        a_rows = (rows % M) * a_stride_m
        b_cols = (cols % N) * b_stride_n
        a_ptrs = a + a_item[:, None, None] + a_rows[None, :, None] + inner[None, None, :] * a_stride_k
        b_ptrs = b + b_item[:, None, None] + inner[None, :, None] * b_stride_k + b_cols[None, None, :]
        acc = tl.zeros((BLOCK_SIZE_BATCH, BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=acc_type)
        for k in range(0, K, BLOCK_SIZE_K):
            inner_mask = inner < K - k
            a_block = tl.load(a_ptrs, mask=inner_mask[None, None, :], other=0.0)
            b_block = tl.load(b_ptrs, mask=inner_mask[None, :, None], other=0.0)
            acc = numerics.dot(acc, a_block, b_block, DOT)
            a_ptrs += BLOCK_SIZE_K * a_stride_k
            b_ptrs += BLOCK_SIZE_K * b_stride_k
        c_ptrs = c + c_item[:, None, None] + rows[None, :, None] * c_stride_m + cols[None, None, :] * c_stride_n
        c_mask = items_mask[:, None, None] & (rows < M)[None, :, None] & (cols < N)[None, None, :]
    if HAS_BIAS:
        bias_values = tl.load(bias + cols * bias_stride, mask=cols < N, other=0.0).to(acc_type)
        if BLOCK_SIZE_BATCH == 1:
            acc += bias_values[None, :]
        else:
            acc += bias_values[None, None, :]
    acc = numerics.activate(acc, ACTIVATION)
    tl.store(c_ptrs, store_value(acc, c.dtype.element_ty, INTERP), mask=c_mask)


def _batch_strides(shape, strides, batch):
    """Strides of the batch axes of a tensor of ``shape`` and ``strides``
    read broadcast to ``batch`` (0 where broadcast)."""
    nb = len(shape) - 2
    lead = len(batch) - nb
    out = [0] * lead
    for i in range(nb):
        out.append(0 if shape[i] == 1 and batch[lead + i] != 1 else strides[i])
    return out


# GPU tiles by dot kind, largest first: ((BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K), num_warps,
# num_stages, registers per thread). Every entry compiles without a register spill for sm_90 and
# sm_80 in the specializations the MLP, LSTM and demo UNet steps launch (float32 and bfloat16);
# ``registers`` is the most any of them takes there (``python -m triflux kernels``). The 16-bit
# tiles are 64 rows tall, the least a 4-warp wgmma takes on sm_90; num_stages > 1 pipelines the
# operand loads through shared memory (cp.async). The entry None: float32 FFMA (and TF32).
_GPU_TILES = {numerics.DOT_NATIVE.value: [((64, 64, 64), 4, 3, 128), ((64, 32, 32), 4, 3, 80)],
              numerics.DOT_FP64.value: [((32, 32, 8), 4, 3, 128)],
              None: [((64, 64, 32), 4, 2, 168), ((32, 32, 32), 4, 3, 72)]}


def best_tile(tiles, programs_of, sms, tolerance=1.1):
    """The tile of ``tiles`` (largest first; (blocks, num_warps, num_stages,
    registers)) that a GPU of ``sms`` SMs runs fastest by
    :func:`launch.wave_efficiency` of its grid (``programs_of(blocks)`` programs),
    the largest within ``tolerance`` of the fastest: with the same rounds, a
    larger tile reuses each loaded operand more."""
    efficiency = [launch.wave_efficiency(programs_of(blocks), warps, registers, sms)
                  for blocks, warps, _, registers in tiles]
    best = max(efficiency)
    return next(tile for tile, e in zip(tiles, efficiency) if e * tolerance >= best)


@lru_cache(maxsize=1024)
def _tiles(nbatch, M, N, K, dtype, sms):
    """(BLOCK_SIZE_BATCH, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, launch
    options) of a product of operands of NumPy ``dtype``, by a model, not autotuning (it would run every config in the
    interpreter). The interpreter pays ~1 ms per program and little per
    element, so there one program takes tiles as big as the problem allows
    (bounded) and several batch items at once. A GPU of ``sms`` SMs gets the
    :func:`best_tile` of ``_GPU_TILES`` for the dot kind."""
    p2 = launch.next_pow2
    dtype = to_torch(dtype)
    if launch.INTERPRET:
        bm, bn = min(p2(M), 128), min(p2(N), 128)
        # float64 materialises the BLOCK_SIZE_M x BLOCK_SIZE_K x BLOCK_SIZE_N products: keep them small
        cap = (1 << 18) if dtype == torch.float64 else (1 << 21)
        bk = max(1, min(p2(K), 128, cap // (bm * bn)))
        bb = max(1, min(p2(nbatch), cap // (bm * bn * bk), (1 << 16) // (bm * max(bn, bk))))
        return bb, bm, bn, bk, dict(num_warps=4)
    kind = numerics.dot_kind(dtype)
    tiles = _GPU_TILES.get(kind, _GPU_TILES[None])
    (bm, bn, bk), warps, stages, _ = best_tile(
        tiles, lambda blocks: nbatch * launch.cdiv(M, blocks[0]) * launch.cdiv(N, blocks[1]), sms)
    return 1, bm, bn, bk, dict(num_warps=warps, num_stages=stages)


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


def matrix_product(a, b, out_dtype=None, bias=None, activation=ACT_IDENTITY.value):
    """``a @ b`` for ``a`` of shape ``(..., M, K)``, ``b`` of shape ``(..., K, N)``
    (at least 2-d each, one dtype, any strides): a new dense
    ``(batch..., M, N)`` tensor, in ``a``'s dtype or ``out_dtype``; with a
    ``bias`` (N,) and an ``activation`` code, act(a @ b + bias) in the same
    launch."""
    out_dtype = a.dtype if out_dtype is None else out_dtype
    spec = matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
    folded = _fold_batch(a, b)
    if folded is not None:
        return matrix_product(folded, b, out_dtype, bias, activation).view(spec.out_shape)
    if spec.batch_size == 0 or spec.m == 0 or spec.n == 0:
        return launch.empty(spec.out_shape, out_dtype, a.device)
    if spec.k == 0 and bias is None and activation == ACT_IDENTITY.value:
        return copy.full(spec.out_shape, 0.0, out_dtype, a.device)
    c = launch.empty(spec.out_shape, out_dtype, a.device)
    sms = launch.sm_count(a.device.index)
    grid, args, meta = _product_plan(spec, a.stride(), b.stride(), sms)
    bias_pointer, bias_stride = (c, 0) if bias is None else (bias, bias.stride(0))    # (no bias: c, never read)
    epilogue = dict(HAS_BIAS=bias is not None, ACTIVATION=activation)
    kind = numerics.dot_kind(a.dtype)
    if get_autotune() and not launch.INTERPRET:
        M, N, nbatch = spec.m, spec.n, spec.batch_size
        tiles = _GPU_TILES.get(kind, _GPU_TILES[None])
        chosen = tuple(meta.pop(name) for name in TUNED_NAMES)       # the plan's tile: the model's pick
        pick = next(tile for tile in tiles if tile[0] == chosen)
        meta.pop("num_warps", None)
        meta.pop("num_stages", None)
        _tuned_matmul().launch(
            lambda tile: (nbatch * launch.cdiv(M, tile["BLOCK_SIZE_M"]) * launch.cdiv(N, tile["BLOCK_SIZE_N"]),),
            tuning.ranked(tiles, pick), a, b, c, bias_pointer, *args, bias_stride, **meta, **epilogue, DOT=kind)
        return c
    launch.launch(_matmul_kernel, grid, a, b, c, bias_pointer, *args, bias_stride, **meta, **epilogue, DOT=kind)
    return c


#: the constexprs a matmul tile sets
TUNED_NAMES = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")


@lru_cache(maxsize=None)
def _tuned_matmul():
    """_matmul_kernel under triton.autotune (``set_autotune``), keyed on the sizes and the dot kind."""
    return tuning.Tuned(_matmul_kernel, TUNED_NAMES, _GPU_TILES, key=["M", "N", "K", "batch_size", "DOT"])


@lru_cache(maxsize=4096)
def _product_plan(spec, a_strides, b_strides, sms):
    """(grid, size and stride arguments, constexprs but DOT) of ``spec``'s
    product of operands of ``a_strides`` and ``b_strides`` into a dense
    result on a GPU of ``sms`` SMs: they depend on nothing else, and a
    training step repeats a few."""
    batch, M, K, N = spec.batch, spec.m, spec.k, spec.n
    c_strides = [1] * len(spec.out_shape)
    for i in range(len(c_strides) - 2, -1, -1):
        c_strides[i] = c_strides[i + 1] * spec.out_shape[i + 1]
    dims, (a_batch, b_batch, c_batch) = indexing.merge_dims(
        batch, _batch_strides(spec.a_matrix, a_strides, batch), _batch_strides(spec.b_matrix, b_strides, batch),
        c_strides[:-2])
    bb, bm, bn, bk, options = _tiles(spec.batch_size, M, N, K, spec.dtype, sms)
    grid = (launch.cdiv(spec.batch_size, bb) * launch.cdiv(M, bm) * launch.cdiv(N, bn),)
    args = (M, N, K, spec.batch_size, *dims[1:], *a_batch, *b_batch, *c_batch,
            a_strides[-2], a_strides[-1], b_strides[-2], b_strides[-1], c_strides[-2], c_strides[-1])
    return grid, args, dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, BLOCK_SIZE_BATCH=bb, GROUP_SIZE_M=8,
                            INTERP=launch.INTERPRET, **options)


def _check_floating(a):
    if not a.dtype.is_floating_point:
        raise DTypeError(f"matmul on the GPU needs floating inputs, got {a.dtype}")


def matmul_forward(a, b):
    """C = A @ B with NumPy's ``matmul`` semantics (see the reference).

    Vectors are promoted by metadata-only views and the promoted axes
    dropped from the (dense) result by a view.
    """
    spec = matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
    _check_floating(a)
    return _view(matrix_product(_view(a, spec.a_matrix), _view(b, spec.b_matrix)), spec.out_shape)


def _view(t, shape):
    """``t.view(shape)``, or ``t`` itself when it has that shape already (a view costs microseconds)."""
    return t if t.shape == shape else t.view(shape)


def _summed_grad(x, y, shape):
    """``x @ y`` summed down to ``shape`` (``unbroadcast``). When a sum is
    needed, the product is kept in float32 for float16/bfloat16 so that the
    result is rounded once, after the sum."""
    wide = None
    summed = matmul_spec(x.shape, y.shape, x.dtype, y.dtype).batch != tuple(shape[:-2])
    if summed and x.dtype in (torch.float16, torch.bfloat16):
        wide = torch.float32
    p = matrix_product(x, y, out_dtype=wide)
    return unbroadcast(p, tuple(shape), dtype=None if wide is None else x.dtype)


def matmul_backward(grad, out, a, b, needs=(True, True)):
    """dA = G @ B^T, dB = A^T @ G (the reference has the full statement): the
    forward kernel on transposed views, then ``unbroadcast`` over batch axes.
    ``needs`` says which of (dA, dB) to compute; the other is ``None``. A
    transposed matrix operand (Dense's ``weight.T``) gets its gradient in its
    own memory layout, so optimiser updates read dense memory."""
    spec = matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
    a2 = a.view(spec.a_matrix)                            # (..., M, K)
    b2 = b.view(spec.b_matrix)                            # (..., K, N)
    g2 = grad.view(spec.out_matrix)                       # (batch..., M, N)

    da = _summed_grad(g2, b2.transpose(-1, -2), a2.shape).view(a.shape) if needs[0] else None
    if not needs[1]:
        return da, None

    db = None
    transposed_b = b2.dim() == 2 and b2.stride(0) == 1 and b2.stride(1) != 1
    if b2.dim() == 2 and a2.dim() == 2 and transposed_b:
        db = matrix_product(g2.transpose(0, 1), a2).transpose(0, 1)     # (G^T A)^T: b's layout
    elif b2.dim() == 2 and a2.dim() > 2:
        # dB = sum over the batch of A_i^T G_i: one product with the batch
        # folded into the contraction (K' = batch * M), when views allow it
        rows = 1
        for s in a2.shape[:-1]:
            rows *= s
        try:
            af = a2.view(rows, a2.shape[-1])
            gf = g2.view(rows, g2.shape[-1])
            db = (matrix_product(gf.transpose(0, 1), af).transpose(0, 1) if transposed_b
                  else matrix_product(af.transpose(0, 1), gf))
        except RuntimeError:
            db = None
    if db is None:
        db = _summed_grad(a2.transpose(-1, -2), g2, b2.shape)
    return da, db.view(b.shape)


# --- Dense: the product, the bias and the activation fused --------------------------------

def _rows(t, rows, features):
    """``t`` (..., features) as a (rows, features) matrix: a view where its
    strides allow one, else a dense copy."""
    try:
        return t.view(rows, features)
    except RuntimeError:
        return copy.contiguous(t).view(rows, features)


def _dense_spec(x, w, b, activation):
    spec = dense_bias_act_spec(x.shape, w.shape, b.shape, x.dtype, w.dtype, b.dtype, activation)
    _check_floating(x)
    if not x.device == w.device == b.device:
        raise ValueError(f"dense_bias_act: x is on {x.device}, w on {w.device}, b on {b.device}; put all three "
                         "on one device first")
    return spec


def dense_bias_act_forward(x, w, b, activation="identity"):
    """y = act(x @ w^T + b) (see the reference): one product of x as a
    (rows, K) matrix and ``w.T`` (a view), the bias and the activation
    applied in its epilogue, before the one store."""
    spec = _dense_spec(x, w, b, activation)
    y = matrix_product(_rows(x, spec.rows, spec.in_features), w.transpose(0, 1), bias=b,
                       activation=ACTIVATION_CODES[activation])
    return y.view(spec.out_shape)


def dense_bias_act_backward(grad, out, x, w, b, activation="identity", needs=(True, True, True)):
    """gz = G * act'(y) and db = its column sums in one kernel (from the
    output y alone), then dx = gz @ w and dw = gz^T @ x (in w's layout, for
    the optimiser's dense updates) on x as a (rows, K) matrix; db comes with
    gz whether needed or not."""
    spec = _dense_spec(x, w, b, activation)
    rows, K, O = spec.rows, spec.in_features, spec.out_features
    g4, y4 = (_rows(t, rows, O).view(rows, O, 1, 1) for t in (grad, out))
    gz, db = act_grad_and_bias_grad(g4, y4, b, ACTIVATION_CODES[activation])
    gz = gz.view(rows, O)
    # a 16-bit relu keeps gz in the input's dtype, sigmoid's and tanh's stay in float32
    operand = gz if gz.dtype == x.dtype else copy.cast(gz, x.dtype)
    dx = matrix_product(operand, w).view(x.shape) if needs[0] else None
    dw = matrix_product(operand.transpose(0, 1), _rows(x, rows, K)) if needs[1] else None
    return dx, dw, db if needs[2] else None
