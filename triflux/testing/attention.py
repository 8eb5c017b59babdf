"""Strategies, torch oracles and tolerance floors for the attention family.

Inputs: q (N, H, Lq, d), k (N, H, Lk, d), v (N, H, Lk, dv) (``attention_weights``:
no v), then an optional floating bias and an optional bool mask of shapes
that broadcast to (N, H, Lq, Lk). The draws cover the bug classes public
attention kernels are known for:

* sequence lengths that are not multiples of any block (primes, 1, a few
  dozen: several blocks of the interpreter's 32 x 16 tiles, so diagonal,
  interior and partial blocks all occur), and Lq != Lk with ``causal``
  (torch's top-left alignment: with Lq < Lk whole key blocks see no query
  and must get dK = dV = 0; with Lq > Lk late rows see every key);
* a backward that ignores the causal mask: causal draws are about half, and
  their gradients are compared element by element with the reference's (the
  family test also checks that dV of a key only later queries see changes
  with the causal flag);
* head dims 16 to 128 (64, 100, 128 in the "wide" draws) and small odd ones (1,
  3, 5, 17), q/k and v head dims that differ, and d = 0 / dv = 0 (empty sums);
* non-contiguous q, k, v, bias and mask (transposed and strided layouts);
* 16-bit rows long enough to expose 16-bit accumulation (the "long" draws:
  a few queries against 150-400 keys);
* broadcast biases and masks ((Lq, Lk), (Lk,), (1, H, 1, Lk), (N, 1, Lq, 1), ...),
  masks with fully masked rows (0 output, torch 2.13's), empty batch, heads
  or sequences;
* logits large enough to overflow exp without the max subtraction (a row
  offset of 100 in the bias, or q scaled up);
* NaN and +-inf in q and in the bias (an all -inf bias row is a fully masked
  row), drawn only without a mask and without ``causal``: with masked pairs
  torch's sdpa adds -inf to a NaN score (NaN) where triflux gives 0 (see
  reference/attention.py), so torch is no oracle there. (With NaN or inf the
  oracle is torch's math path: its fused CPU kernel returns 0 for a NaN row in
  some shapes.)

Degenerate draws are avoided where only rounding noise would be compared: a
bias constant along the keys (its gradient is exactly zero) is not drawn, and
where no row may attend two keys (the q, k and bias gradients vanish) only
v's gradient is compared.

Values are drawn from a NumPy generator seeded by hypothesis (the arrays hold
thousands of entries). Dropout is off (p = 0) in every draw, so the property
suite compares kernel and reference exactly; the family test checks p > 0
(moments, reproducibility, the same mask in y and in the returned weights).

Oracles: torch's ``scaled_dot_product_attention`` (causal and a mask or bias
given together are combined into one float bias, as torch's docs write it) and,
for the weights, torch's own math path ``aten._scaled_dot_product_attention_math``
(its returned attention weights, with its ``_safe_softmax``).
"""
import numpy as np

from . import Case, finite_max, layouts_for

#: head dims of the draws: small odd ones, and the 16..128 that kernels specialise on
SMALL_DIMS = (1, 3, 5, 8, 16, 17)
MEDIUM_DIMS = (8, 16, 17, 24, 32)
WIDE_DIMS = (64, 100, 128)
SCALES = (None, None, 0.3, 1.0, 2.0)


def _sizes(st, draw, kind):
    """(N, H, Lq, Lk, d, dv) of a draw of ``kind``."""
    if kind == "small":
        n, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        lq, lk = draw(st.integers(1, 9)), draw(st.integers(1, 9))
        d = draw(st.sampled_from(SMALL_DIMS))
    elif kind == "medium":
        n, h = draw(st.sampled_from(((1, 1), (1, 2), (2, 1), (1, 3))))
        lq, lk = draw(st.integers(10, 70)), draw(st.integers(10, 70))
        d = draw(st.sampled_from(MEDIUM_DIMS))
    elif kind == "long":
        n, h = 1, 1
        lq, lk = draw(st.integers(1, 6)), draw(st.integers(150, 400))
        d = draw(st.sampled_from((16, 32)))
    elif kind == "wide":
        n, h = 1, 1
        lq, lk = draw(st.integers(5, 40)), draw(st.integers(5, 40))
        d = draw(st.sampled_from(WIDE_DIMS))
    else:                                   # "empty": one side 0
        n, h, lq, lk = 1, 2, draw(st.integers(0, 5)), draw(st.integers(0, 5))
        d = draw(st.sampled_from((0, 3)))
        which = draw(st.sampled_from(("n", "h", "lq", "lk", "d", "dv", "none")))
        n = 0 if which == "n" else n
        h = 0 if which == "h" else h
        lq = 0 if which == "lq" else lq
        lk = 0 if which == "lk" else lk
        d = 0 if which == "d" else d
        dv = 0 if which == "dv" else draw(st.sampled_from((0, 2, 3)))
        return n, h, lq, lk, d, dv
    dv = d if draw(st.booleans()) else draw(st.sampled_from(SMALL_DIMS + (32,) if kind != "wide" else WIDE_DIMS))
    return n, h, lq, lk, d, dv


#: shapes (as functions of (N, H, Lq, Lk)) a bias is drawn in. None is constant along the keys: such
#: a bias adds the same to a whole row, which the softmax ignores, so its gradient is exactly zero
#: and a comparison would see only rounding noise
BIAS_SHAPES = (lambda n, h, lq, lk: (n, h, lq, lk),
               lambda n, h, lq, lk: (lq, lk),
               lambda n, h, lq, lk: (lk,),
               lambda n, h, lq, lk: (1, h, 1, lk),
               lambda n, h, lq, lk: (n, 1, 1, lk),
               lambda n, h, lq, lk: (h, lq, lk))
#: shapes a mask is drawn in
MASK_SHAPES = (lambda n, h, lq, lk: (n, h, lq, lk),
               lambda n, h, lq, lk: (lq, lk),
               lambda n, h, lq, lk: (lk,),
               lambda n, h, lq, lk: (1, h, 1, lk),
               lambda n, h, lq, lk: (n, 1, lq, 1),
               lambda n, h, lq, lk: (h, lq, lk))


def _case(st, draw, weights):
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    kind = draw(st.sampled_from(("small", "small", "medium", "medium", "medium", "long", "wide", "empty")))
    n, h, lq, lk, d, dv = _sizes(st, draw, kind)
    causal = draw(st.booleans()) and kind != "long"     # (top-left causal rows of a few queries are short)
    attrs = {"causal": causal, "scale": draw(st.sampled_from(SCALES)), "p": 0.0,
             "seed": draw(st.integers(0, 2 ** 63 - 1))}
    q = rng.standard_normal((n, h, lq, d))
    k = rng.standard_normal((n, h, lk, d))
    v = rng.standard_normal((n, h, lk, dv))
    note = [kind, f"N={n} H={h} Lq={lq} Lk={lk} d={d} dv={dv}"]
    large = draw(st.integers(0, 5)) == 0
    if large and d:
        q *= 4.0                            # scores of tens, up to ~100 with the bias offset
        note.append("large logits")
    bias = mask = None
    if draw(st.integers(0, 1)):
        shape = draw(st.sampled_from(BIAS_SHAPES))(n, h, lq, lk)
        bias = rng.standard_normal(shape) + (100.0 if large else 0.0)
        note.append(f"bias {shape}")
    if draw(st.integers(0, 2)) == 0:
        shape = draw(st.sampled_from(MASK_SHAPES))(n, h, lq, lk)
        mask = rng.random(shape) < draw(st.sampled_from((0.3, 0.7, 0.95)))
        if len(shape) >= 2 and shape[-2] > 1 and draw(st.booleans()):
            mask[..., rng.integers(0, shape[-2]), :] = False          # a fully masked row
            note.append("masked row")
        note.append(f"mask {shape}")
    if mask is None and not causal and draw(st.integers(0, 3)) == 0:
        note.append("NaN/inf")
        q = _with_nonfinite(rng, q)
        if bias is not None and bias.ndim >= 2 and bias.shape[-2] > 1:
            bias[..., rng.integers(0, bias.shape[-2]), :] = -np.inf   # an all -inf row: fully masked
            bias = _with_nonfinite(rng, bias)
    inputs = (q, k) + (() if weights else (v,))
    inputs += tuple(a for a in (bias,) if a is not None) + tuple(a for a in (mask,) if a is not None)
    note.append(f"causal={causal}")
    grad_inputs = tuple(i for i, a in enumerate(inputs) if a.dtype != bool)
    if n * h * lq * lk and _most_allowed(mask, causal, (n, h, lq, lk)) < 2:
        grad_inputs = () if weights else (2,)          # see _most_allowed
        note.append("(one key per row: v's gradient only)")
    return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))), grad_inputs=grad_inputs,
                note=" ".join(note))


def _most_allowed(mask, causal, shape):
    """The most keys any row may attend. When no row may attend two keys (Lk =
    1, say) the gradients of q, k and a bias vanish identically (a softmax over
    one entry) and torch's rounding noise (1e-17) is all a comparison of them
    would see: such a draw compares v's gradient only."""
    allowed = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)
    if causal:
        allowed = allowed & np.tri(shape[2], shape[3], dtype=bool)
    return int(allowed.sum(axis=-1).max()) if allowed.size else 0


def _with_nonfinite(rng, x):
    """x with NaN, +inf and -inf at up to three random positions (x itself when empty)."""
    x = np.array(x, dtype=np.float64)
    if x.size:
        for value in (np.nan, np.inf, -np.inf):
            x.flat[rng.integers(0, x.size)] = value
    return x


def _attention_draw(draw):
    from hypothesis import strategies as st
    return _case(st, draw, weights=False)


def _weights_draw(draw):
    from hypothesis import strategies as st
    return _case(st, draw, weights=True)


def attention_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(_attention_draw)()


def attention_weights_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(_weights_draw)()


# --- oracles ---------------------------------------------------------------------------------

def _torch_mask(q, k, extras, causal):
    """torch's ``attn_mask`` for the extras (bias and/or bool mask) and whether
    is_causal is still to be passed: causal with an explicit mask or bias is
    folded into it (torch refuses both), a bias with a mask becomes one float
    bias with -inf where not allowed."""
    import torch
    # torch's sdpa wants a mask of two dimensions at least (NumPy broadcasting allows one)
    extras = [t.reshape((1,) * (2 - t.dim()) + tuple(t.shape)) if t.dim() < 2 else t for t in extras]
    bias = next((t for t in extras if t.dtype != torch.bool), None)
    mask = next((t for t in extras if t.dtype == torch.bool), None)
    if causal and (bias is not None or mask is not None):
        tri = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask = tri if mask is None else (mask & tri)
        causal = False
    if bias is not None and mask is not None:
        return torch.where(mask, bias, torch.tensor(-float("inf"), dtype=bias.dtype)), causal
    return (bias if bias is not None else mask), causal


def attention_torch(q, k, v, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """torch's ``F.scaled_dot_product_attention`` (its dropout, seeded from
    ``seed``, has torch's own mask: compare moments only for p > 0). With NaN
    or inf among the inputs, torch's math path (``aten._scaled_dot_product_attention_math``):
    torch 2.13's fused CPU kernel turns a NaN row into 0 for some shapes (d = dv
    and Lk <= 3) and into NaN for others, its math path always into NaN."""
    import torch
    attn_mask, causal = _torch_mask(q, k, bias_mask, causal)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        if not all(bool(torch.isfinite(t).all()) for t in (q, k, v) + tuple(b for b in bias_mask
                                                                          if b.dtype != torch.bool)):
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, -float("inf"))
            return torch.ops.aten._scaled_dot_product_attention_math(
                q, k, v, attn_mask=attn_mask, dropout_p=float(p), is_causal=bool(causal), scale=scale)[0]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=float(p),
                                                                 is_causal=bool(causal), scale=scale)


def attention_weights_torch(q, k, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """The attention weights of torch's math path (``aten._scaled_dot_product_attention_math``
    returns them after its ``_safe_softmax`` and dropout), with a bool mask given
    as the -inf bias torch's ``scaled_dot_product_attention`` turns it into."""
    import torch
    attn_mask, causal = _torch_mask(q, k, bias_mask, causal)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(~attn_mask, -float("inf"))
    v = torch.zeros(q.shape[:-2] + (k.shape[-2], 1), dtype=q.dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=attn_mask, dropout_p=float(p),
                                                                 is_causal=bool(causal), scale=scale)[1]


# --- tolerance floors ---------------------------------------------------------------------------

def _pieces(inputs, attrs, weights):
    """(spec, P, Pd, allowed, dropout factor) of the reference on float64 inputs."""
    from ..reference import attention as ref
    spec = ref._spec("attention_weights" if weights else "attention", inputs, attrs.get("causal", False),
                     attrs.get("scale"), attrs.get("p", 0.0), attrs.get("seed", 0))
    bias, mask = ref._extras(spec, inputs)
    with np.errstate(all="ignore"):
        P, pd, allowed, factor = ref._weights(spec, np.asarray(inputs[0], np.float64),
                                              np.asarray(inputs[1], np.float64), bias, mask)
    return spec, P, pd, allowed, factor, bias


def _score_floors(spec, T, inputs, bias):
    """(dq, dk, dbias) floors from T = the sizes of the terms of dS: scale T |k|,
    scale T^T |q|, and T summed over the bias's broadcast axes."""
    from ..reference._util import unbroadcast
    T = np.where(np.isfinite(T), T, 0.0)
    qa, ka = np.abs(np.nan_to_num(inputs[0], posinf=0, neginf=0)), np.abs(np.nan_to_num(inputs[1], posinf=0,
                                                                                        neginf=0))
    dq = finite_max(abs(spec.scale) * np.matmul(T, ka))
    dk = finite_max(abs(spec.scale) * np.matmul(np.swapaxes(T, -1, -2), qa))
    dbias = finite_max(unbroadcast(T, np.shape(bias))) if bias is not None else None
    return dq, dk, dbias


def attention_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """The kernels round P (and dS) to a 16-bit input dtype before their
    tensor-core products, as FlashAttention does: y = P v then carries errors
    of u |P| |v| per term, which cancel no better than the terms do, so the
    floor of y is max (P |v|) (>= |y|). Backward: dv's terms are Pd |g|; dS's
    terms P (|dP| + |D|) (D = g . y, computed from the rounded y), so dq and
    dk get scale T |k| and scale T^T |q| with T = P (|g v^T| + |g| . |y|), and
    dbias T summed over its broadcast axes."""
    spec, P, pd, allowed, factor, bias = _pieces(inputs, attrs, weights=False)
    v = np.abs(np.nan_to_num(np.asarray(inputs[2], np.float64), posinf=0, neginf=0))
    pd_abs = np.abs(np.where(np.isfinite(pd), pd, 0.0))
    if direction == "forward":
        return finite_max(np.matmul(pd_abs, v))
    g = np.abs(np.asarray(grad, np.float64))
    y = np.abs(np.nan_to_num(np.asarray(out, np.float64), posinf=0, neginf=0))
    dv = finite_max(np.matmul(np.swapaxes(pd_abs, -1, -2), g))
    dP = np.matmul(g, np.swapaxes(v, -1, -2))
    if factor is not None:
        dP = dP * np.abs(factor)
    T = np.abs(np.where(np.isfinite(P), P, 0.0)) * (dP + np.sum(g * y, axis=-1, keepdims=True))
    dq, dk, dbias = _score_floors(spec, T, inputs, bias)
    floors = [dq, dk, dv] + [None] * (len(inputs) - 3)
    if bias is not None:
        floors[spec.bias_index] = dbias
    return tuple(floors)


def attention_weights_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: none (each weight is rounded once). Backward: dS's terms are
    P (|G| + |D|) with D_i = sum_j G W (read from the rounded weights W), and
    the kernels round dS to a 16-bit dtype before the products with k and q:
    the floors of dq, dk and dbias follow from T = P (|G| + sum_j |G| W) as in
    ``attention_magnitude``."""
    if direction == "forward":
        return None
    spec, P, pd, allowed, factor, bias = _pieces(inputs, attrs, weights=True)
    g = np.abs(np.asarray(grad, np.float64))
    if factor is not None:
        g = g * np.abs(factor)
    Pa = np.abs(np.where(np.isfinite(P), P, 0.0))
    T = Pa * (g + np.sum(g * Pa, axis=-1, keepdims=True))
    dq, dk, dbias = _score_floors(spec, T, inputs, bias)
    floors = [dq, dk] + [None] * (len(inputs) - 2)
    if bias is not None:
        floors[spec.bias_index] = dbias
    return tuple(floors)
