"""Attention, NumPy reference: scaled dot-product attention with the score
matrix written out (the kernels never store it; see triton_kernels/attention.py).

Shapes (``triflux.specs.attention``): q (N, H, Lq, d), k (N, H, Lk, d), v (N,
H, Lk, dv); an optional floating ``bias`` and an optional bool ``mask``, both
broadcastable to (N, H, Lq, Lk), passed after v in that order. A pair (i, j)
is *allowed* when mask[i, j] is True (no mask: always) and, with ``causal``,
j <= i (torch's ``is_causal``: top-left aligned, for Lq != Lk too). With s the
``scale`` (default 1/sqrt(d)), per batch and head::

    S[i, j] = s * q_i . k_j + bias[i, j]     where (i, j) is allowed, -inf elsewhere
    P[i, j] = exp(S[i, j] - m_i) / l_i,      m_i = max_j S[i, j],  l_i = sum_j exp(S[i, j] - m_i)
    Pd      = P * M / (1 - p)                dropout: M[i, j] ~ Bernoulli(1 - p) from ``seed``
    y_i     = sum_j Pd[i, j] v_j             (attention: y = Pd V)

``attention_weights`` returns Pd itself (NNlib's returned weights α, after
dropout, as NNlib applies ``fdrop`` before returning them).

Masked pairs. P[i, j] is exactly 0 where (i, j) is not allowed, whatever the
scores there (a NaN score at a masked pair does not reach y). A *fully
masked* row (no allowed pair, or only -inf scores) has l_i = 0: its weights
and its output are 0, and so are its gradients. This is torch 2.13's
``scaled_dot_product_attention`` (its ``_safe_softmax``, since torch 2.5;
torch 2.0-2.4 and NNlib give NaN there). Elsewhere NaN and inf follow the
arithmetic: a NaN score or an allowed +inf score makes its row NaN. A NaN in
a key or a value reaches the queries masked from it (0 * NaN in P V) here,
but the kernels skip the key blocks a causal mask hides, so that case is not
specified (torch's fused kernels differ on it too).

Dropout uses :func:`triflux.reference.dropout.dropout_mask` on the shape (N,
H, Lq, Lk), i.e. u[n, h, i, j] from ``np.random.default_rng(seed)`` in
row-major order; the kernels draw Triton's Philox numbers for the same linear
index, so the two sides agree in distribution, not in numbers (compare at p = 0).

Backward (g = dL/dy, all products per batch and head)::

    dV  = Pd^T g
    dPd = g V^T,   dP = dPd * M / (1 - p)
    D_i = sum_j dP[i, j] P[i, j]             (= g_i . y_i)
    dS  = P * (dP - D)                       (0 where (i, j) is not allowed)
    dq  = s dS k,   dk = s dS^T q,   dbias = dS summed over the axes bias was broadcast along

and for ``attention_weights`` (G = dL/dPd) the same with dP = G * M / (1 - p).
The bool mask has no gradient (None). float16/bfloat16 compute in float32 and
round once; the output is laid out as (N, Lq, H, dv) in memory (a transposed
view), so that NNlib's (N, Lq, H*dv) layout is a free reshape of it.
"""
import numpy as np

from ..specs.attention import attention_spec
from ..specs.dropout import keep_scale
from ._util import in_compute_dtype, unbroadcast
from .dropout import dropout_mask


def _spec(primitive, arrays, causal, scale, p, seed):
    return attention_spec(primitive, tuple(np.shape(a) for a in arrays),
                          tuple(np.asarray(a).dtype for a in arrays), causal, scale, p, seed)


def _extras(spec, arrays):
    """(bias, mask) among ``arrays`` (None where not given)."""
    bias = arrays[spec.bias_index] if spec.has_bias else None
    mask = arrays[spec.mask_index] if spec.has_mask else None
    return bias, mask


def _allowed(spec, mask):
    """The bool array (broadcastable to (N, H, Lq, Lk)) of the allowed pairs, or None: all allowed."""
    allowed = None
    if spec.causal:
        allowed = np.tri(spec.q_len, spec.kv_len, dtype=bool)        # j <= i
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        allowed = mask if allowed is None else (mask & allowed)
    return allowed


def _scores(spec, q, k, bias, allowed):
    """S = scale q k^T + bias (N, H, Lq, Lk) in the compute dtype, -inf where not allowed."""
    qc, kc = in_compute_dtype(q, k)
    # q scaled before the product, as torch's math path (and its multi-head attention) does
    s = np.matmul(qc * qc.dtype.type(spec.scale), np.swapaxes(kc, -1, -2))
    if bias is not None:
        s += np.asarray(bias).astype(s.dtype, copy=False)
    if allowed is not None:
        s = np.where(allowed, s, s.dtype.type(-np.inf))
    return s


def _probabilities(s, allowed):
    """The softmax of each row of S, exactly 0 where not allowed and on fully
    masked rows (l = 0), NaN on rows holding NaN or an allowed +inf."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True) if s.shape[-1] else np.zeros(s.shape[:-1] + (1,), s.dtype)
        shift = np.where(np.isneginf(m), s.dtype.type(0), m)
        e = np.exp(s - shift)
        if allowed is not None:
            e = np.where(allowed, e, s.dtype.type(0))
        l = e.sum(axis=-1, keepdims=True)
        return np.where(l == 0, s.dtype.type(0), e / l)


def _dropout_factor(spec, dtype):
    """M / (1 - p) over (N, H, Lq, Lk) in ``dtype``, or None for p = 0."""
    if spec.p == 0:
        return None
    return (dropout_mask(spec.scores_shape, spec.p, spec.seed) * keep_scale(spec.p)).astype(dtype)


def _weights(spec, q, k, bias, mask):
    """(P, Pd, allowed, dropout factor): the weights before and after dropout."""
    allowed = _allowed(spec, mask)
    P = _probabilities(_scores(spec, q, k, bias, allowed), allowed)
    factor = _dropout_factor(spec, P.dtype)
    return P, (P if factor is None else P * factor), allowed, factor


def attention_forward(q, k, v, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """y = Pd V with Pd the (dropped-out) softmax weights of S = scale q k^T +
    bias, masked (module docstring). Returns (N, H, Lq, dv), laid out as (N, Lq, H, dv)."""
    spec = _spec("attention", (q, k, v) + bias_mask, causal, scale, p, seed)
    bias, mask = _extras(spec, (q, k, v) + bias_mask)
    _, pd, _, _ = _weights(spec, q, k, bias, mask)
    vc, = in_compute_dtype(v)
    N, H, Lq, dv = spec.out_shape
    out = np.empty((N, Lq, H, dv), dtype=spec.dtype).transpose(0, 2, 1, 3)
    out[...] = np.matmul(pd.astype(vc.dtype, copy=False), vc)
    return out


def _score_gradients(spec, q, k, bias, dS, needs):
    """(dq, dk, dbias) from dS = dL/dS: dq = scale dS k, dk = scale dS^T q,
    dbias = dS summed over bias's broadcast axes."""
    qc, kc = in_compute_dtype(q, k)
    s = dS.dtype.type(spec.scale)
    dq = (np.matmul(dS, kc) * s).astype(spec.dtype, copy=False) if needs[0] else None
    dk = (np.matmul(np.swapaxes(dS, -1, -2), qc) * s).astype(spec.dtype, copy=False) if needs[1] else None
    dbias = None
    if bias is not None and needs[spec.bias_index]:
        dbias = unbroadcast(dS, np.shape(bias)).astype(spec.dtype, copy=False)
    return dq, dk, dbias


def _dS(P, dP, allowed):
    """dS = P (dP - D), D_i = sum_j dP[i, j] P[i, j]; 0 where not allowed."""
    with np.errstate(invalid="ignore"):
        D = np.sum(dP * P, axis=-1, keepdims=True)
        dS = P * (dP - D)
    if allowed is not None:
        dS = np.where(allowed, dS, dS.dtype.type(0))
    return dS


def _needs(needs, n):
    return (True,) * n if needs is None else tuple(bool(x) for x in needs)


def attention_backward(grad, out, q, k, v, *bias_mask, causal=False, scale=None, p=0.0, seed=0, needs=None):
    """With g = dL/dy (module docstring): dV = Pd^T g; dP = (g V^T) M/(1-p);
    dS = P (dP - D), D_i = sum_j dP P; dq = scale dS k; dk = scale dS^T q;
    dbias = dS summed over bias's broadcast axes; no gradient for the mask.
    P is recomputed from the inputs. ``needs``: which gradients to compute."""
    inputs = (q, k, v) + bias_mask
    spec = _spec("attention", inputs, causal, scale, p, seed)
    needs = _needs(needs, len(inputs))
    bias, mask = _extras(spec, inputs)
    P, pd, allowed, factor = _weights(spec, q, k, bias, mask)
    g, vc = in_compute_dtype(np.asarray(grad), v)
    g = g.astype(P.dtype, copy=False)
    vc = vc.astype(P.dtype, copy=False)
    dv = np.matmul(np.swapaxes(pd, -1, -2), g).astype(spec.dtype, copy=False) if needs[2] else None
    dq = dk = dbias = None
    if needs[0] or needs[1] or (bias is not None and needs[spec.bias_index]):
        dP = np.matmul(g, np.swapaxes(vc, -1, -2))
        if factor is not None:
            dP *= factor
        dq, dk, dbias = _score_gradients(spec, q, k, bias, _dS(P, dP, allowed), needs)
    grads = [dq, dk, dv] + [None] * len(bias_mask)
    if bias is not None:
        grads[spec.bias_index] = dbias
    return tuple(grads)


def attention_weights_forward(q, k, *bias_mask, causal=False, scale=None, p=0.0, seed=0):
    """Pd = softmax(S) * M / (1 - p), (N, H, Lq, Lk): the weights ``attention``
    multiplies V by (the same dropout mask for the same seed)."""
    spec = _spec("attention_weights", (q, k) + bias_mask, causal, scale, p, seed)
    bias, mask = _extras(spec, (q, k) + bias_mask)
    _, pd, _, _ = _weights(spec, q, k, bias, mask)
    return pd.astype(spec.dtype, copy=False)


def attention_weights_backward(grad, out, q, k, *bias_mask, causal=False, scale=None, p=0.0, seed=0,
                               needs=None):
    """With G = dL/dPd: dP = G M/(1-p); dS = P (dP - D), D_i = sum_j dP P;
    dq = scale dS k; dk = scale dS^T q; dbias = dS summed over bias's
    broadcast axes; no gradient for the mask. ``needs``: which gradients to compute."""
    inputs = (q, k) + bias_mask
    spec = _spec("attention_weights", inputs, causal, scale, p, seed)
    needs = _needs(needs, len(inputs))
    bias, mask = _extras(spec, inputs)
    P, _, allowed, factor = _weights(spec, q, k, bias, mask)
    dP, = in_compute_dtype(np.asarray(grad))
    dP = dP.astype(P.dtype, copy=True)
    if factor is not None:
        dP *= factor
    dq, dk, dbias = _score_gradients(spec, q, k, bias, _dS(P, dP, allowed), needs)
    grads = [dq, dk] + [None] * len(bias_mask)
    if bias is not None:
        grads[spec.bias_index] = dbias
    return tuple(grads)
