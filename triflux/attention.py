"""Attention and batched products on Tensors: NNlib's ``dot_product_attention``,
``make_causal_mask``, ``batched_mul``, ``batched_transpose``, and torch's
``scaled_dot_product_attention``.

Both attention functions run the one ``attention`` primitive (fused kernels
on a GPU: the Lq x Lk weights are never stored there; the NumPy reference on
the CPU). They differ in layout and in what they return:

* ``dot_product_attention(q, k, v)`` takes NNlib's layout, row-major:
  ``(N, L, nheads * d)``, each head a contiguous block of features (Julia's
  ``(nheads * d, L, N)`` in the same memory order); heads are split off as
  views. It returns ``(y, weights)`` as NNlib does, ``weights`` of shape (N,
  nheads, Lq, Lk). Only those weights need the Lq x Lk matrix: they come from
  a second primitive (``attention_weights``, the same dropout mask for the
  same seed), computed only when ``need_weights=True`` (the default, as NNlib
  and Flux return them); pass ``need_weights=False`` (then ``weights`` is
  None) and nothing of size Lq x Lk is ever written on a GPU.
* ``scaled_dot_product_attention(q, k, v)`` takes torch's ``(N, H, L, d)``
  (or ``(N, L, d)``) and returns ``y`` only.

Masks are bool with True where a query may attend a key (Flux's and torch's
sdpa convention; torch's ``nn.MultiheadAttention`` and ``key_padding_mask``
use True for *not* allowed: invert those with ``~mask``). A float
``attn_mask``/``bias`` is added to the scaled scores. ``causal`` masking is
top-left aligned (query i sees keys j <= i), as torch's ``is_causal`` and as
``make_causal_mask`` for Lq = Lk. A query that may attend no key gets output
0 and zero gradients (torch 2.13; NNlib gives NaN). Math: reference/attention.py.
"""
import numpy as np

from . import dtypes as _dt
from .arguments import flag_arg, int_arg, normalize_axis, probability_arg
from .constructors import next_seed
from .dispatch import apply, common_device
from .errors import DTypeError, ShapeError
from .operands import cast, floating
from .primitives import REGISTRY
from .specs.attention import attention_spec
from .tensor import Tensor, as_tensor, tensor

__all__ = ["dot_product_attention", "scaled_dot_product_attention", "make_causal_mask", "batched_mul",
           "batched_transpose", "batched_adjoint"]

_P = REGISTRY


def _reshape(x, shape):
    """``x`` in ``shape`` (computed here, so known to fit): the reshape primitive."""
    shape = tuple(int(v) for v in shape)
    return x if shape == x.shape else apply(_P["reshape"], (x,), {"shape": shape}, "reshape")


def _permute(x, axes):
    """``x`` with its axes permuted (a valid permutation, computed here): the transpose primitive."""
    return x if tuple(axes) == tuple(range(x.ndim)) else apply(_P["transpose"], (x,), {"axes": tuple(axes)},
                                                                   "transpose")


def _qkv(name, q, k, v):
    """q, k, v as floating Tensors of one dtype on one device."""
    q, k, v = floating(q, name), floating(k, name), floating(v, name)
    if not (q.dtype == k.dtype == v.dtype):
        raise DTypeError(f"`{name}`: q, k and v have dtypes {q.dtype}, {k.dtype} and {v.dtype}; convert them to "
                         "one floating dtype first (e.g. `f32(x)`)")
    common_device(name, (q, k, v))
    return q, k, v


def _extra(name, what, x, q, bool_only=False):
    """A bias (floating, converted to q's dtype) or a mask (bool) as a Tensor on q's device."""
    if x is None:
        return None
    x = as_tensor(x) if not isinstance(x, (list, tuple)) else tensor(np.asarray(x), device=q._device)
    if isinstance(x, Tensor) and x._device != q._device:
        common_device(name, (q, x))
    if x.dtype == _dt.bool_:
        return x
    if bool_only:
        raise DTypeError(f"`{name}`: {what} must be bool (True where a query may attend a key), got dtype "
                         f"{x.dtype}; convert it, e.g. `{what} != 0`, or pass additive scores as the bias")
    if not _dt.is_floating(x.dtype):
        raise DTypeError(f"`{name}`: {what} of dtype {x.dtype} is neither bool (a mask: True where a query may "
                         "attend) nor floating (an additive bias); convert it first")
    return x if x.dtype == q.dtype else cast(x, q.dtype)


def _attend(name, q, k, v, bias, mask, causal, scale, dropout, seed, need_weights):
    """The attention primitive (and, with ``need_weights``, the weights) on (N, H, L, d) Tensors."""
    extras = tuple(t for t in (bias, mask) if t is not None)
    p = probability_arg(dropout, f"`{name}`", "dropout")
    if seed is None:
        seed = next_seed() if p > 0 else 0
    attrs = {"causal": bool(causal), "scale": None if scale is None else float(scale), "p": p, "seed": int(seed)}
    inputs = (q, k, v) + extras
    attention_spec("attention", tuple(t.shape for t in inputs), tuple(t.dtype for t in inputs), **attrs)
    y = apply(_P["attention"], inputs, attrs, name)
    weights = apply(_P["attention_weights"], (q, k) + extras, attrs, name) if need_weights else None
    return y, weights


def dot_product_attention(q, k, v, bias=None, *, mask=None, nheads=1, dropout=0.0, scale=None, need_weights=True,
                          causal=False, seed=None):
    """NNlib's multi-head dot-product attention on ``(N, L, nheads * d)`` inputs:
    ``q`` (N, Lq, nheads*d), ``k`` (N, Lk, nheads*d), ``v`` (N, Lk, nheads*dv);
    each head a contiguous block of d features. Per head, ``weights = softmax(q
    k^T * scale + bias)`` over the keys (``scale`` 1/sqrt(d) by default),
    dropped out with probability ``dropout`` (triflux's seeded stream, or
    ``seed``), and ``y = weights v``.

    ``bias`` (floating) and ``mask`` (bool, True where a query may attend) are
    broadcastable to (N, nheads, Lq, Lk) (NNlib's (kv_len, q_len, nheads,
    batch) read row-major); ``make_causal_mask(q)`` gives the causal one.

    ``causal=True`` (an extension of NNlib's) masks keys after each query as
    ``mask=make_causal_mask(q)`` does (top-left for Lq != Lk), combined with any
    mask given; the fused kernels then skip the key blocks no query of a
    block may see, where a mask Tensor is read block by block.

    Returns ``(y, weights)``: y (N, Lq, nheads*dv) and the weights (N, nheads,
    Lq, Lk) after dropout, as NNlib returns them. ``need_weights=False``
    returns ``(y, None)`` and never materialises the Lq x Lk weights on a GPU
    (module docstring). Math: reference/attention.py."""
    name = "dot_product_attention"
    q, k, v = _qkv(name, q, k, v)
    nheads = int_arg(nheads, f"`{name}`", "nheads", low=1)
    for what, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 3:
            raise ShapeError(f"`{name}`: {what} must be (N, L, nheads * d) (NNlib's (features, L, N) row-major), "
                             f"got shape {t.shape}; torch's (N, H, L, d) layout is "
                             "`scaled_dot_product_attention`'s")
        if t.shape[2] % nheads:
            raise ShapeError(f"`{name}`: {what} has {t.shape[2]} features, not a multiple of nheads={nheads} "
                             f"(shape {t.shape}); each head takes a block of features/nheads")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ShapeError(f"`{name}`: q, k and v have batch sizes {q.shape[0]}, {k.shape[0]} and {v.shape[0]} "
                         f"(shapes {q.shape}, {k.shape}, {v.shape}); they must be equal")
    if q.shape[2] != k.shape[2]:
        raise ShapeError(f"`{name}`: q has {q.shape[2]} features but k has {k.shape[2]} (shapes {q.shape} and "
                         f"{k.shape}); q k^T needs the same head dim")
    if k.shape[1] != v.shape[1]:
        raise ShapeError(f"`{name}`: k has {k.shape[1]} keys but v has {v.shape[1]} values (shapes {k.shape} and "
                         f"{v.shape}); they must have the same length")
    n, lq = q.shape[0], q.shape[1]

    def heads(t):
        return _permute(_reshape(t, (t.shape[0], t.shape[1], nheads, t.shape[2] // nheads)), (0, 2, 1, 3))

    bias = _extra(name, "bias", bias, q)
    mask = _extra(name, "mask", mask, q, bool_only=True)
    if bias is not None and bias.dtype == _dt.bool_:
        raise DTypeError(f"`{name}`: the bias is bool; pass a bool mask as `mask=` (True where a query may attend)")
    causal = flag_arg(causal, f"`{name}`", "causal")
    y, weights = _attend(name, heads(q), heads(k), heads(v), bias, mask, causal, scale, dropout, seed,
                         need_weights)
    y = _reshape(_permute(y, (0, 2, 1, 3)), (n, lq, v.shape[2]))
    return y, weights


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *,
                                 seed=None):
    """torch's ``F.scaled_dot_product_attention``: ``q`` (N, H, Lq, d), ``k`` (N,
    H, Lk, d), ``v`` (N, H, Lk, dv) (or (N, L, d) without the heads axis);
    ``softmax(q k^T * scale + attn_mask) v`` with ``scale`` 1/sqrt(d) by default.

    ``attn_mask``: bool (True where a query may attend, torch's sdpa convention)
    or floating (added to the scores), broadcastable to (N, H, Lq, Lk).
    ``is_causal``: query i attends keys j <= i (top-left, as torch), and
    unlike torch it may be combined with ``attn_mask`` (both apply).
    ``dropout_p``: dropout on the weights, its mask from triflux's seeded
    stream (or ``seed``). Returns y (N, H, Lq, dv). A query that may attend
    no key gets 0 (torch 2.13). Math: reference/attention.py."""
    name = "scaled_dot_product_attention"
    q, k, v = _qkv(name, q, k, v)
    flag_arg(is_causal, f"`{name}`", "is_causal")
    three = q.ndim == 3
    if three:
        if k.ndim != 3 or v.ndim != 3:
            raise ShapeError(f"`{name}`: q is 3-d (N, L, d) but k and v have shapes {k.shape} and {v.shape}; give "
                             "all three as (N, L, d) or as (N, H, L, d)")
        q, k, v = (_reshape(t, (t.shape[0], 1) + t.shape[1:]) for t in (q, k, v))
    extras = _extra(name, "attn_mask", attn_mask, q)
    if three and extras is not None and extras.ndim == 3:
        extras = _reshape(extras, (extras.shape[0], 1) + extras.shape[1:])
    bias = mask = None
    if extras is not None:
        if extras.dtype == _dt.bool_:
            mask = extras
        else:
            bias = extras
    y, _ = _attend(name, q, k, v, bias, mask, is_causal, scale, dropout_p, seed, False)
    if three:
        y = _reshape(y, (y.shape[0],) + y.shape[2:])
    return y


def make_causal_mask(x, dims=1):
    """NNlib's causal mask for the sequence axis ``dims`` of ``x`` (axis 1 of
    (N, L, features)): a bool (L, L) Tensor on x's device, ``m[i, j] = j <= i``
    (query i may attend keys up to itself); pass it as ``mask=``. No gradient."""
    x = as_tensor(x)
    axis = normalize_axis(dims, x.ndim, "make_causal_mask")
    n = x.shape[axis]
    return tensor(np.tri(n, n, dtype=bool), device=x._device)


def _matrices(name, a, what):
    a = as_tensor(a)
    if a.ndim < 2:
        raise ShapeError(f"`{name}`: {what} must be a matrix or a batch of matrices (B, M, K), got shape "
                         f"{a.shape}; for vectors use `matmul`")
    return a


def batched_mul(a, b):
    """NNlib's ``batched_mul`` (⊠) row-major: ``c[i] = a[i] @ b[i]`` for
    batches of matrices a (B, M, K) and b (B, K, N), batch first (Julia's (M,
    K, B) in the same memory order). A batch of 1, or a plain matrix, is
    shared by the whole batch; more leading batch axes broadcast as in
    ``matmul``, which this is (math: reference/matmul.py)."""
    a, b = _matrices("batched_mul", a, "a"), _matrices("batched_mul", b, "b")
    if max(a.ndim, b.ndim) < 3:
        raise ShapeError(f"`batched_mul` multiplies batches of matrices, (B, M, K) and (B, K, N), got shapes "
                         f"{a.shape} and {b.shape}; two matrices are `matmul(a, b)`")
    return a @ b           # the matmul primitive (Tensor.__matmul__)


def batched_transpose(a):
    """NNlib's ``batched_transpose``: every matrix of a batch (…, M, N)
    transposed, (…, N, M): the last two axes swapped (a view on a GPU)."""
    a = _matrices("batched_transpose", a, "a")
    axes = tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2)
    return _permute(a, axes)


def batched_adjoint(a):
    """NNlib's ``batched_adjoint``: for real numbers, :func:`batched_transpose`."""
    return batched_transpose(a)

