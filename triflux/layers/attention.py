"""MultiHeadAttention: Flux's multi-head dot-product attention layer."""
from .. import dtypes as _dt
from ..arguments import int_arg, probability_arg
from ..attention import dot_product_attention
from ..errors import ArgumentError, ShapeError
from ..modes import is_active
from .base import Layer, layer_name
from .dense import Dense
from .initialisers import glorot_uniform
from .inputs import check_input

__all__ = ["MultiHeadAttention"]


def _int_or_tuple(v, n, who, what):
    """An int, or a tuple of ``n`` ints (each >= 1), as a tuple of ``n`` ints."""
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ArgumentError(f"{who}: {what} must be an int or {n} ints, got {v!r}")
        return tuple(int_arg(x, who, what, low=1) for x in v)
    return (int_arg(v, who, what, low=1),) * n


def _dims(dims, who="MultiHeadAttention"):
    """Flux's dims forms as (q_in, k_in, v_in, qk, v, out): an int, ``(in, qkv, out)``,
    ``(in, (qk, v), out)`` or ``((q_in, k_in, v_in), (qk, v), out)`` (Flux's
    ``in => qkv => out``)."""
    if isinstance(dims, (tuple, list)):
        if len(dims) != 3:
            raise ArgumentError(f"{who}: dims must be an int or (in, qkv, out) with in an int or (q_in, k_in, v_in) "
                                f"and qkv an int or (qk, v) (Flux's in => qkv => out), got {dims!r}")
        q_in, k_in, v_in = _int_or_tuple(dims[0], 3, who, "the input dims")
        qk, v = _int_or_tuple(dims[1], 2, who, "the qkv dims")
        out = int_arg(dims[2], who, "the output dim", low=1)
        return q_in, k_in, v_in, qk, v, out
    d = int_arg(dims, who, "dims", low=1)
    return (d,) * 6


class MultiHeadAttention(Layer):
    """The multi-head dot-product attention layer of Transformers (Flux's).

    ``dims``: an int (every dim), ``(in, qkv, out)``, ``(in, (qk, v), out)`` or
    ``((q_in, k_in, v_in), (qk, v), out)`` (Flux's ``in => qkv => out`` forms);
    ``nheads`` divides qk and v; ``bias``: whether the four projections have
    biases; ``init`` their weights' initialiser; ``dropout_prob`` dropout on
    the attention weights, active in training (inside ``gradient``, or after
    ``trainmode``), as Flux's Dropout. Fields ``q_proj`` (q_in => qk),
    ``k_proj`` (k_in => qk), ``v_proj`` (v_in => v) and ``out_proj`` (v => out),
    all Dense.

    Called as ``mha(q)`` (self-attention), ``mha(q, kv)`` (keys and values from
    one input) or ``mha(q, k, v, bias=None, *, mask=None)`` on (N, L, features)
    inputs (Flux's (features, L, N) row-major). ``mask`` is bool, True where a
    query may attend a key (Flux's; torch's nn.MultiheadAttention uses the
    opposite: pass ``~attn_mask`` from there), ``bias`` floating; both
    broadcast to (N, nheads, Lq, Lk). ``causal=True`` makes a decoder causal
    as ``mask=make_causal_mask(q)`` does, and lets the fused kernels skip the
    key blocks a causal mask hides (a mask Tensor is read block by block).
    Returns ``(y, weights)``: y (N, Lq, out), weights (N, nheads, Lq, Lk), as
    Flux. ``need_weights=False`` returns ``(y, None)`` and keeps the fused
    kernels from ever writing the Lq x Lk weights (what a Transformer's
    training step wants: ``mha(x, causal=True, need_weights=False)``)::

        mha = MultiHeadAttention(64, nheads=8)
        y, a = mha(tf.randn(32, 10, 64))        # y (32, 10, 64), a (32, 8, 10, 10)

    Math: q, k, v = the projections of the inputs; ``dot_product_attention(q,
    k, v, bias, mask=mask, nheads=nheads)`` (triflux.attention); y =
    ``out_proj`` of its output.
    """

    def __init__(self, dims, *, nheads=8, bias=False, init=glorot_uniform, dropout_prob=0.0, dtype=_dt.float32,
                 device=None):
        who = "MultiHeadAttention"
        q_in, k_in, v_in, qk, v, out = _dims(dims, who)
        self.nheads = int_arg(nheads, who, "nheads", low=1)
        for what, size in (("qk", qk), ("v", v)):
            if size % self.nheads:
                raise ShapeError(f"{who}: the {what} dim {size} is not divisible by nheads={self.nheads}; each head "
                                 f"takes {what}/nheads features (choose nheads dividing {size})")
        if bias not in (True, False):
            raise ArgumentError(f"{who}: bias must be True or False, got {bias!r}")
        self.dropout_prob = probability_arg(dropout_prob, who, "dropout_prob")
        self.active = None
        self.q_proj = Dense(q_in, qk, bias=bias, init=init, dtype=dtype, device=device)
        self.k_proj = Dense(k_in, qk, bias=bias, init=init, dtype=dtype, device=device)
        self.v_proj = Dense(v_in, v, bias=bias, init=init, dtype=dtype, device=device)
        self.out_proj = Dense(v, out, bias=bias, init=init, dtype=dtype, device=device)

    def __call__(self, q, k=None, v=None, bias=None, *, mask=None, causal=False, need_weights=True):
        if k is None:
            k = q
        if v is None:
            v = k
        name = layer_name(self)
        q = check_input(self, q, self.q_proj.weight, expected=self.q_proj.in_features)
        k = check_input(self, k, self.k_proj.weight, expected=self.k_proj.in_features)
        v = check_input(self, v, self.v_proj.weight, expected=self.v_proj.in_features)
        for what, x in (("query", q), ("key", k), ("value", v)):
            if x.ndim != 3:
                raise ShapeError(f"{name} expects query, key and value as (N, L, features) (Flux's (features, L, N) "
                                 f"row-major), but the {what} has shape {x.shape}")
        if k.shape[:2] != v.shape[:2]:
            raise ShapeError(f"{name}: the key {k.shape} and value {v.shape} must have the same batch size and "
                             "length (N, Lk)")
        if q.shape[0] != k.shape[0]:
            raise ShapeError(f"{name}: the query {q.shape} and key {k.shape} must have the same batch size N")
        p = self.dropout_prob if is_active(self) else 0.0
        x, weights = dot_product_attention(self.q_proj(q), self.k_proj(k), self.v_proj(v), bias, mask=mask,
                                           nheads=self.nheads, dropout=p, need_weights=need_weights, causal=causal)
        return self.out_proj(x), weights

    def _signature(self):
        q_in, k_in, v_in = self.q_proj.in_features, self.k_proj.in_features, self.v_proj.in_features
        qk, v, out = self.q_proj.out_features, self.v_proj.out_features, self.out_proj.out_features
        if q_in == k_in == v_in == qk == v == out:
            s = f"{q_in}"
        elif q_in == k_in == v_in and qk == v:
            s = f"{q_in} => {qk} => {out}"
        elif q_in == k_in == v_in:
            s = f"{q_in} => ({qk}, {v}) => {out}"
        else:
            s = f"({q_in}, {k_in}, {v_in}) => ({qk}, {v}) => {out}"
        s += f"; nheads={self.nheads}"
        if self.q_proj.bias is not None:
            s += ", bias=true"
        if self.dropout_prob:
            s += f", dropout_prob={self.dropout_prob}"
        return s
