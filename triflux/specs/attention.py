"""The attention spec: scaled dot-product attention on (N, H, L, d) tensors.

Inputs of ``attention`` (and ``attention_weights``, which has no ``v``)::

    q (N, H, Lq, d)     k (N, H, Lk, d)     v (N, H, Lk, dv)
    [bias]  floating, broadcastable to (N, H, Lq, Lk)
    [mask]  bool, broadcastable to (N, H, Lq, Lk): True where a query may attend (Flux's and
            torch's sdpa convention; torch's nn.MultiheadAttention uses the opposite)

N batch, H heads, Lq queries, Lk keys, d the query/key head dim, dv the value
head dim (torch's sdpa layout; NNlib's (N, L, H*d) feature blocks are views of
it). The optional inputs follow q, k, v in the order bias, mask; each is
recognised by its dtype (floating: the bias, bool: the mask), so a call with a
mask and no bias passes the mask fourth.

Attributes: ``causal`` (top-left aligned as torch's ``is_causal``: query i
attends keys j <= i, also when Lq != Lk), ``scale`` (None: 1/sqrt(d), and 1
for d = 0, where every score is an empty sum 0), ``p`` (dropout probability on
the attention weights) and ``seed`` (its mask, triflux's seed stream).

A pair (i, j) is *allowed* when the mask (if any) is True there and, if
causal, j <= i. Checked here once, for ops, the reference and the kernels
alike: ranks, equal batch and head counts, q and k head dims, k and v
lengths, one floating dtype for q, k, v and the bias, a bool mask, shapes
that broadcast, a probability p and a seed.
"""
import functools
import math
from dataclasses import dataclass

from ..dtypes import as_dtype, compute_dtype, is_floating
from ..errors import ArgumentError, DTypeError, ShapeError, TrifluxError
from .dropout import check_p
from .fill import check_seed


@dataclass(frozen=True)
class AttentionSpec:
    """The geometry of one attention call (see the module docstring)."""
    primitive: str           #: "attention" or "attention_weights"
    batch: int               #: N
    heads: int               #: H
    q_len: int               #: Lq
    kv_len: int              #: Lk
    qk_dim: int              #: d
    v_dim: int               #: dv (0 for attention_weights)
    dtype: object            #: q's NumPy dtype (k, v and a bias have it too)
    compute_dtype: object    #: float32 for 16-bit inputs, else the dtype
    bias_shape: tuple        #: the bias's shape, or None
    mask_shape: tuple        #: the mask's shape, or None
    causal: bool
    scale: float             #: the resolved scale of q k^T
    p: float                 #: dropout probability on the weights
    seed: int

    @property
    def has_bias(self):
        return self.bias_shape is not None

    @property
    def has_mask(self):
        return self.mask_shape is not None

    @property
    def scores_shape(self):
        """(N, H, Lq, Lk): the shape of the weights and of what bias and mask broadcast to."""
        return (self.batch, self.heads, self.q_len, self.kv_len)

    @property
    def out_shape(self):
        """attention: (N, H, Lq, dv); attention_weights: (N, H, Lq, Lk)."""
        if self.primitive == "attention_weights":
            return self.scores_shape
        return (self.batch, self.heads, self.q_len, self.v_dim)

    @property
    def bias_index(self):
        """The bias's position among the inputs (3 for attention, 2 for attention_weights), or None."""
        return self._first_extra if self.has_bias else None

    @property
    def mask_index(self):
        """The mask's position among the inputs, or None."""
        return (self._first_extra + self.has_bias) if self.has_mask else None

    @property
    def _first_extra(self):
        return 2 if self.primitive == "attention_weights" else 3


def _broadcasts(shape, target):
    if len(shape) > len(target):
        return False
    return all(s == t or s == 1 for s, t in zip(reversed(shape), reversed(target)))


def attention_spec(primitive, shapes, dtypes, causal=False, scale=None, p=0.0, seed=0):
    """The spec of ``primitive`` ("attention": inputs q, k, v[, bias][, mask];
    "attention_weights": q, k[, bias][, mask]) on inputs of ``shapes`` and
    ``dtypes`` (NumPy or torch dtypes, one per input); raises ShapeError,
    DTypeError or ArgumentError naming what it got, what it expects and the fix."""
    try:
        return _attention_spec(primitive, tuple(tuple(int(s) for s in shape) for shape in shapes),
                               tuple(as_dtype(d) for d in dtypes), causal, scale, p, seed)
    except TypeError as e:
        if isinstance(e, TrifluxError):
            raise
        raise ArgumentError(f"`{primitive}`: {e}") from None


@functools.lru_cache(maxsize=1024)
def _attention_spec(primitive, shapes, dtypes, causal, scale, p, seed):
    who = f"`{primitive}`"
    named = ("q", "k", "v") if primitive == "attention" else ("q", "k")
    if len(shapes) < len(named):
        raise ArgumentError(f"{who} takes {', '.join(named)} and then an optional bias and mask; got "
                            f"{len(shapes)} inputs")
    for name, shape in zip(named, shapes):
        if len(shape) != 4:
            raise ShapeError(f"{who}: {name} must be (N, H, L, d) (batch, heads, length, head dim, torch's sdpa "
                             f"layout), got shape {shape}; for (N, L, nheads*d) inputs use "
                             "`dot_product_attention(q, k, v, nheads=...)`")
    q, k = shapes[0], shapes[1]
    v = shapes[2] if primitive == "attention" else None
    for name, shape in zip(named[1:], shapes[1:len(named)]):
        if shape[:2] != q[:2]:
            raise ShapeError(f"{who}: q has batch and heads {q[:2]} but {name} has {shape[:2]} (shape {shape}); "
                             "q, k and v must have the same batch size N and number of heads H")
    if k[3] != q[3]:
        raise ShapeError(f"{who}: the head dims of q and k differ ({q[3]} and {k[3]}; shapes {q} and {k}): "
                         "q k^T needs the same d")
    if v is not None and v[2] != k[2]:
        raise ShapeError(f"{who}: k has {k[2]} keys but v has {v[2]} values (shapes {k} and {v}); "
                         "they must have the same length Lk")
    dtype = dtypes[0]
    if not is_floating(dtype):
        raise DTypeError(f"{who}: q must be floating (float32, float64, float16 or bfloat16), got {dtype}; "
                         "convert it first, e.g. `f32(q)`")
    for name, d in zip(named[1:], dtypes[1:len(named)]):
        if d != dtype:
            raise DTypeError(f"{who}: q is {dtype} but {name} is {d}; convert them to one floating dtype first")
    scores = (q[0], q[1], q[2], k[2])
    bias_shape = mask_shape = None
    for shape, d in zip(shapes[len(named):], dtypes[len(named):]):
        if d.kind == "b":
            if mask_shape is not None:
                raise ArgumentError(f"{who}: got two bool masks; combine them first (`mask1 & mask2`)")
            mask_shape, what = shape, "mask"
        elif is_floating(d):
            if mask_shape is not None or bias_shape is not None:
                raise ArgumentError(f"{who}: the optional inputs come in the order bias (floating), mask (bool); "
                                    f"got a floating input after a {'mask' if mask_shape else 'bias'}")
            if d != dtype:
                raise DTypeError(f"{who}: the bias is {d} but q is {dtype}; convert the bias to {dtype}")
            bias_shape, what = shape, "bias"
        else:
            raise DTypeError(f"{who}: a mask must be bool (True where a query may attend), got {d}; convert it, "
                             "e.g. `mask != 0`; an additive bias must be floating")
        if not _broadcasts(shape, scores):
            raise ShapeError(f"{who}: the {what} of shape {shape} does not broadcast to (N, H, Lq, Lk) = {scores}; "
                             f"give it shape (Lq, Lk) = {scores[2:]}, (N or 1, H or 1, Lq, Lk) or any shape "
                             "NumPy broadcasts there")
    if causal not in (True, False):
        raise ArgumentError(f"{who}: causal must be True or False, got {causal!r}")
    if scale is None:
        scale_value = 1.0 / math.sqrt(q[3]) if q[3] > 0 else 1.0
    else:
        try:
            scale_value = float(scale)
        except (TypeError, ValueError):
            raise ArgumentError(f"{who}: scale must be a number (None: 1/sqrt(d)), got {scale!r}") from None
    try:
        p = check_p(p)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"{who}: {e}") from None
    try:
        seed = check_seed(seed)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"{who}: {e}") from None
    return AttentionSpec(primitive=primitive, batch=q[0], heads=q[1], q_len=q[2], kv_len=k[2], qk_dim=q[3],
                         v_dim=0 if v is None else v[3], dtype=dtype, compute_dtype=compute_dtype(dtype),
                         bias_shape=bias_shape, mask_shape=mask_shape, causal=bool(causal), scale=scale_value,
                         p=p, seed=seed)


def allowed_pairs(spec):
    """The number of (query, key) pairs per (batch, head) that causal masking
    leaves (the bool mask is not counted): Lq Lk, or sum_i min(i + 1, Lk)."""
    lq, lk = spec.q_len, spec.kv_len
    if not spec.causal:
        return lq * lk
    full = max(0, min(lq, lk))              # rows i < Lk see i + 1 keys
    return full * (full + 1) // 2 + max(0, lq - lk) * lk


def attention_flops(name, direction, inputs, out_shape, attrs, largest):
    """Floating-point operations of a call, the convention of the FlashAttention
    papers (products only, 2 per multiply-add, over the pairs causal masking
    leaves): forward 2 P (d + dv) (q k^T and P v); backward 2 P (3 d + 2 dv)
    (q k^T recomputed, dP = dO v^T, dV = P^T dO, dQ = dS k, dK = dS^T q), 2.5x
    the forward for d = dv. ``attention_weights``: 2 P d forward (q k^T), 2 P 3d
    backward (q k^T recomputed, dQ, dK). P = N H pairs."""
    shapes = [tuple(s) for s in inputs]
    q, k = shapes[0], shapes[1]
    d = q[3]
    dv = shapes[2][3] if name == "attention" else 0
    pairs = q[0] * q[1] * allowed_pairs(_Pairs(q[2], k[2], bool(attrs.get("causal", False))))
    if name == "attention":
        per = (d + dv) if direction == "forward" else (3 * d + 2 * dv)
    else:
        per = d if direction == "forward" else 3 * d
    return 2.0 * pairs * per


@dataclass(frozen=True)
class _Pairs:
    q_len: int
    kv_len: int
    causal: bool
