"""PyTorch's own sample inputs (OpInfo), translated to triflux's public API.

PyTorch describes every operator with an ``OpInfo`` whose ``sample_inputs``
yields the cases its developers found worth testing: broadcasting, batch
axes, size-0 and 0-d tensors, strides, dilation, ceil mode, negative axes...
Those inputs owe nothing to triflux's own strategies, so they find the
classes of input our strategies forgot. Each entry of
``TRANSLATIONS`` maps an OpInfo (name, variant) to a function with torch's
signature that computes the same thing with triflux's public API, called
with triflux Tensors wherever the sample has tensors. A sample that needs a
feature triflux does not have raises :class:`Unsupported` (counted, never a
pass); anything else that goes wrong is a failure.

Needs ``expecttest`` (PyTorch's test utilities import it).
"""
import numpy as np

import triflux as tf


class Unsupported(Exception):
    """A sample that asks for something triflux deliberately does not offer."""


def _ntuple(v, n):
    """torch's int-or-sequence argument as ``n`` ints (a 1-sequence repeats)."""
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return (int(v[0]),) * n
        return tuple(int(s) for s in v)
    return (int(v),) * n


def _pair(v):
    return _ntuple(v, 2)


def _spatial(fn, x, n_spatial=2):
    """Run ``fn`` on ``x`` with a batch axis added when torch's sample is
    unbatched (C, *spatial): triflux's spatial layers take (N, C, *spatial) only."""
    if x.ndim == n_spatial + 1:
        y = fn(tf.reshape(x, (1,) + x.shape))
        return tf.reshape(y, y.shape[1:])
    if x.ndim != n_spatial + 2:
        raise Unsupported(f"{x.ndim}-d input to a {n_spatial}-d spatial op")
    return fn(x)


# --- layers and functions -----------------------------------------------------------------

def linear(input, weight, bias=None):
    layer = tf.Dense(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.weight = weight
    if bias is not None:
        layer.bias = bias
    return layer(input)


def conv(rank):
    """torch's F.conv1d/2d/3d as triflux's Conv with a kernel of ``rank`` entries."""
    def fn(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str):
            if padding == "valid":
                padding = 0
            elif any(s != 1 for s in _ntuple(stride, rank)):
                raise Unsupported("padding='same' with stride > 1 (torch refuses it too)")
        o, cg = weight.shape[:2]
        layer = tf.Conv(tuple(weight.shape[2:]), cg * groups, o, stride=_ntuple(stride, rank),
                        pad=padding if padding == "same" else _ntuple(padding, rank),
                        dilation=_ntuple(dilation, rank), groups=groups, bias=bias is not None)
        layer.weight = weight
        if bias is not None:
            layer.bias = bias
        return _spatial(layer, input, rank)
    return fn


def conv_transpose(rank):
    """torch's F.conv_transpose1d/2d/3d as triflux's ConvTranspose."""
    def fn(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        c, og = weight.shape[:2]
        layer = tf.ConvTranspose(tuple(weight.shape[2:]), c, og * groups, stride=_ntuple(stride, rank),
                                 pad=_ntuple(padding, rank), outpad=_ntuple(output_padding, rank),
                                 dilation=_ntuple(dilation, rank), groups=groups, bias=bias is not None)
        layer.weight = weight
        if bias is not None:
            layer.bias = bias
        return _spatial(layer, input, rank)
    return fn


def max_pool(rank):
    def fn(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        stride = kernel_size if stride is None or stride == [] else stride
        layer = tf.MaxPool(_ntuple(kernel_size, rank), stride=_ntuple(stride, rank), pad=_ntuple(padding, rank),
                           dilation=_ntuple(dilation, rank), ceil_mode=bool(ceil_mode))
        return _spatial(layer, input, rank)
    return fn


def avg_pool(rank):
    def fn(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
           divisor_override=None):
        if divisor_override is not None:
            raise Unsupported("divisor_override (not in Flux)")
        stride = kernel_size if stride is None or stride == [] else stride
        layer = tf.MeanPool(_ntuple(kernel_size, rank), stride=_ntuple(stride, rank), pad=_ntuple(padding, rank),
                            ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))
        return _spatial(layer, input, rank)
    return fn


def lp_pool(rank):
    """torch's F.lp_pool1d/2d/3d as triflux.ops.lpnormpool (NNlib's name)."""
    def fn(input, norm_type, kernel_size, stride=None, ceil_mode=False):
        window = _ntuple(kernel_size, rank)
        stride = window if stride is None or stride == [] else _ntuple(stride, rank)
        return _spatial(lambda x: tf.ops.lpnormpool(x, norm_type, window, stride, ceil_mode=bool(ceil_mode)),
                        input, rank)
    return fn


def _adaptive_size(output_size, x, rank):
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size,) * rank
    if len(size) == 1:
        size = (size[0],) * rank
    return tuple(x.shape[-rank + i] if s is None else int(s) for i, s in enumerate(size))


def adaptive_avg_pool(rank):
    def fn(input, output_size):
        return _spatial(tf.AdaptiveMeanPool(_adaptive_size(output_size, input, rank)), input, rank)
    return fn


def adaptive_max_pool(rank):
    def fn(input, output_size, return_indices=False):
        return _spatial(tf.AdaptiveMaxPool(_adaptive_size(output_size, input, rank)), input, rank)
    return fn


#: torch's interpolation mode -> the spatial rank it needs (nearest: any)
_INTERPOLATE_RANK = {"nearest": None, "linear": 1, "bilinear": 2, "trilinear": 3}


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    if mode not in _INTERPOLATE_RANK:
        raise Unsupported(f"mode={mode!r}")
    if antialias:
        raise Unsupported("antialias")
    rank = input.ndim - 2
    if not 1 <= rank <= 3 or _INTERPOLATE_RANK[mode] not in (None, rank):
        raise Unsupported(f"{input.ndim}-d input to mode {mode!r}")
    linear = mode != "nearest"
    if size is not None:
        return tf.Upsample(mode, size=_ntuple(size, rank), align_corners=bool(align_corners) and linear)(input)
    sf = tuple(float(v) for v in scale_factor) if isinstance(scale_factor, (list, tuple)) \
        else (float(scale_factor),) * rank
    if recompute_scale_factor:
        # torch then uses the output size floor(in * scale) as the size
        size = tuple(int(np.floor(n * f)) for n, f in zip(input.shape[2:], sf))
        return tf.Upsample(mode, size=size, align_corners=bool(align_corners) and linear)(input)
    return tf.Upsample(mode, scale=sf, align_corners=bool(align_corners) and linear)(input)


def upsample_nearest(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, "bilinear", align_corners=True)


def pad(input, pad, mode="constant", value=None):
    """torch's F.pad: ``pad`` lists (lo, hi) pairs from the last axis backwards;
    triflux's ops.pad takes them in axis order, for the axes it is given."""
    pairs = [tuple(pad[i: i + 2]) for i in range(0, len(pad), 2)]
    dims = tuple(range(input.ndim - 1, input.ndim - 1 - len(pairs), -1))
    if mode == "constant":
        return tf.ops.pad(input, tuple(pairs), "constant", 0.0 if value is None else value, dims=dims)
    return tf.ops.pad(input, tuple(pairs), mode, dims=dims)


def _images(fn, x):
    """torch's pixel (un)shuffle reads (*, C, H, W): any leading axes are batch
    axes; triflux's takes (N, C, *spatial), so they become one batch axis."""
    lead = x.shape[:-3]
    y = fn(tf.reshape(x, (int(np.prod(lead)),) + x.shape[-3:]))
    return tf.reshape(y, lead + y.shape[1:])


def pixel_shuffle(input, upscale_factor):
    return _images(lambda x: tf.ops.pixel_shuffle(x, upscale_factor), input)


def pixel_unshuffle(input, downscale_factor):
    return _images(lambda x: tf.ops.pixel_unshuffle(x, downscale_factor), input)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if input.ndim < 2:
        raise Unsupported(f"{input.ndim}-d input (BatchNorm normalises axis 1 of (N, C, ...))")
    c = input.shape[1]
    layer = tf.BatchNorm(c, eps=eps, momentum=momentum, dtype=input.dtype, device=input.device)
    if weight is not None:
        layer.weight = weight
    if bias is not None:
        layer.bias = bias
    if running_mean is not None:
        layer.running_mean = tf.Tensor._make(running_mean._data, running_mean._device)
        layer.running_var = tf.Tensor._make(running_var._data, running_var._device)
    (tf.trainmode if training else tf.testmode)(layer)
    if training and running_mean is None:
        raise Unsupported("training without running statistics")
    return layer(input)


def _dim(dim, x):
    """torch's ``dim`` as a triflux axis: torch lets a 0-d tensor be reduced
    over dim 0 or -1 (as if it were 1-d), NumPy and triflux over no axis."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) or x.ndim == 0:
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def reduction(name):
    def fn(input, dim=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            raise Unsupported("dtype= (accumulate in another dtype)")
        return getattr(input, name)(axis=_dim(dim, input), keepdims=bool(keepdim))
    return fn


def max_reduction(input, dim=None, keepdim=False):
    return input.max(axis=_dim(dim, input), keepdims=bool(keepdim))


def softmax_like(name):
    def fn(input, dim, dtype=None):
        if dtype is not None:
            raise Unsupported("dtype=")
        if input.ndim == 0:
            raise Unsupported("softmax of a 0-d tensor (triflux asks for at least one axis)")
        return getattr(tf, name)(input, dims=dim)
    return fn


def logsumexp(input, dim, keepdim=False):
    dim = _dim(dim, input)
    if isinstance(dim, tuple):
        if len(dim) > 1:
            raise Unsupported("logsumexp over several axes")
        dim = dim[0]
    if dim is None:
        raise Unsupported("logsumexp of a 0-d tensor")
    return tf.logsumexp(input, dims=dim, keepdims=bool(keepdim))


def cat(tensors, dim=0):
    if any(t.shape == (0,) for t in tensors) and any(t.ndim != 1 for t in tensors):
        raise Unsupported("torch's legacy rule that skips 1-d empty tensors in cat")
    return tf.cat(*tensors, dims=dim)


def activation(name, **fixed):
    def fn(input, *args, inplace=False, **kw):
        return getattr(tf, name)(input, *args, **{**fixed, **kw})
    return fn


def gelu(input, approximate="none"):
    return tf.gelu(input) if approximate == "tanh" else tf.gelu_erf(input)


def elu(input, alpha=1.0, inplace=False):
    return tf.elu(input, alpha)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return tf.leakyrelu(input, negative_slope)


def binary(op):
    def fn(input, other, *, alpha=None):
        if alpha is not None:
            raise Unsupported("alpha=")
        return op(input, other)
    return fn


def where(input, condition, other):
    # OpInfo's sample: input is torch.where's first *value*, args (condition, other)
    return tf.where(condition, input, other)


def matmul(input, other):
    return tf.matmul(input, other)


#: tensor leaves (in the order input, args, kwargs) that torch does not differentiate
NO_GRAD = {("nn.functional.batch_norm", ""): {1, 2}}     # the running statistics

#: OpInfo (name, variant) -> triflux translation
TRANSLATIONS = {
    ("nn.functional.linear", ""): linear,
    ("matmul", ""): matmul,
    **{(f"nn.functional.conv{r}d", ""): conv(r) for r in (1, 2, 3)},
    **{(f"nn.functional.conv_transpose{r}d", ""): conv_transpose(r) for r in (1, 2, 3)},
    **{(f"nn.functional.max_pool{r}d", ""): max_pool(r) for r in (1, 2, 3)},
    **{(f"nn.functional.avg_pool{r}d", ""): avg_pool(r) for r in (1, 2, 3)},
    **{(f"nn.functional.lp_pool{r}d", ""): lp_pool(r) for r in (1, 2, 3)},
    **{(f"nn.functional.adaptive_avg_pool{r}d", ""): adaptive_avg_pool(r) for r in (1, 2, 3)},
    **{(f"nn.functional.adaptive_max_pool{r}d", ""): adaptive_max_pool(r) for r in (1, 2, 3)},
    **{("nn.functional.interpolate", mode): interpolate for mode in ("nearest", "linear", "bilinear", "trilinear")},
    ("nn.functional.upsample_nearest", ""): upsample_nearest,
    ("nn.functional.upsample_bilinear", ""): upsample_bilinear,
    **{("nn.functional.pad", mode): pad for mode in ("constant", "reflect", "replicate", "replicate_negative",
                                                     "circular")},
    ("nn.functional.pixel_shuffle", ""): pixel_shuffle,
    ("nn.functional.pixel_unshuffle", ""): pixel_unshuffle,
    ("nn.functional.batch_norm", ""): batch_norm,
    ("sum", ""): reduction("sum"),
    ("mean", ""): reduction("mean"),
    ("amax", ""): reduction("max"),
    ("max", "reduction_with_dim"): max_reduction,
    ("softmax", ""): softmax_like("softmax"),
    ("log_softmax", ""): softmax_like("logsoftmax"),
    ("logsumexp", ""): logsumexp,
    ("cat", ""): cat,
    ("nn.functional.relu", ""): activation("relu"),
    ("nn.functional.gelu", ""): gelu,
    ("nn.functional.elu", ""): elu,
    ("nn.functional.leaky_relu", ""): leaky_relu,
    ("nn.functional.silu", ""): activation("swish"),
    ("sigmoid", ""): activation("sigmoid"),
    ("tanh", ""): activation("tanh"),
    ("exp", ""): activation("exp"),
    ("log", ""): activation("log"),
    ("sqrt", ""): activation("sqrt"),
    ("abs", ""): lambda input: abs(input),
    ("neg", ""): lambda input: -input,
    ("add", ""): binary(lambda a, b: a + b),
    ("sub", ""): binary(lambda a, b: a - b),
    ("mul", ""): binary(lambda a, b: a * b),
    ("div", "no_rounding_mode"): lambda input, other, rounding_mode=None: input / other,
    ("pow", ""): binary(lambda a, b: a ** b),
    ("maximum", ""): binary(tf.maximum),
    ("minimum", ""): binary(tf.minimum),
    ("where", ""): where,
}


# --- attention and batched products (family attention; the functions live in triflux.attention) -------

def _attention_module():
    from triflux import attention
    return attention


def _broadcast_batch(tensors):
    """q, k, v with their batch axes (all but the last two) broadcast together,
    as torch's sdpa broadcasts them (triflux's functions want equal ones)."""
    batch = np.broadcast_shapes(*[t.shape[:-2] for t in tensors])
    return [t if t.shape[:-2] == batch else
            tf.ops.broadcast_to(tf.reshape(t, (1,) * (len(batch) - len(t.shape[:-2])) + t.shape), batch + t.shape[-2:])
            for t in tensors]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    if dropout_p > 0:
        raise Unsupported("dropout_p > 0: triflux draws its own dropout mask (tests/test_attention_family.py "
                          "checks its moments)")
    if enable_gqa:
        raise Unsupported("enable_gqa (grouped-query attention)")
    q, k, v = _broadcast_batch([query, key, value])
    if len(q.shape) not in (3, 4):
        raise Unsupported(f"{len(q.shape) - 2} batch axes (triflux takes (N, L, d) or (N, H, L, d))")
    return _attention_module().scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal),
                                                            scale=scale)


def bmm(input, mat2):
    return _attention_module().batched_mul(input, mat2)


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                                 bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
                                 training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
                                 v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
                                 is_causal=False):
    """torch's functional multi-head attention ((L, N, E) inputs, packed or separate
    projection weights, bias_k/bias_v appended as one more key and value, a float
    attn_mask added to the scores) with triflux's batched_mul and softmax.

    With need_weights=True (the sample's) torch computes the weights explicitly
    (scaled q times k^T, + attn_mask, softmax, then times v), and so does this,
    rather than through the fused attention: torch's samples (entries up to 9,
    two or four features) give score gaps of 16 to 3000 in every row, a softmax
    one-hot to float32's precision, whose q and k gradients are rounding noise
    that depends on the formula (the fused kernels take D = dO . y as
    FlashAttention does). The fused attention meets torch's samples through
    scaled_dot_product_attention, and its property suite."""
    if training and dropout_p > 0:
        raise Unsupported("dropout in training: triflux draws its own dropout mask")
    if add_zero_attn or static_k is not None or static_v is not None or key_padding_mask is not None or is_causal:
        raise Unsupported("add_zero_attn, static_k/v, key_padding_mask or is_causal")
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        raise Unsupported("a bool attn_mask (torch's: True where not allowed)")
    low = query.dtype
    if low.itemsize == 2:
        # 16-bit: computed in float32 and rounded once at the end. Torch's 16-bit samples round
        # scores of 10^2..10^4 to a few units, so which key each one-hot row picks, and every
        # gradient through it, is decided by where an implementation rounds (torch's own
        # bfloat16 error on them reaches 25x the result): nothing to compare a 16-bit one with
        return _attention_in_float32(
            multi_head_attention_forward, low, query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
            in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=training,
            attn_mask=attn_mask, use_separate_proj_weight=use_separate_proj_weight, q_proj_weight=q_proj_weight,
            k_proj_weight=k_proj_weight, v_proj_weight=v_proj_weight)
    att = _attention_module()
    unbatched = len(query.shape) == 2
    if unbatched:
        query, key, value = (tf.reshape(t, (t.shape[0], 1, t.shape[1])) for t in (query, key, value))
    e = query.shape[2]
    if use_separate_proj_weight:
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        wq, wk, wv = in_proj_weight[0:e], in_proj_weight[e:2 * e], in_proj_weight[2 * e:3 * e]
    bq, bk, bv = ((in_proj_bias[0:e], in_proj_bias[e:2 * e], in_proj_bias[2 * e:3 * e]) if in_proj_bias is not None
                  else (None, None, None))

    def project(x, w, b):
        y = tf.matmul(tf.transpose(x, (1, 0, 2)), tf.transpose(w))        # (L, N, E) -> (N, L, E)
        return y if b is None else y + b
    q, k, v = project(query, wq, bq), project(key, wk, bk), project(value, wv, bv)
    n = q.shape[0]
    mask = attn_mask
    if bias_k is not None:
        k = tf.cat(k, tf.ops.broadcast_to(tf.reshape(bias_k, (1, 1, e)), (n, 1, e)), dims=1)
        v = tf.cat(v, tf.ops.broadcast_to(tf.reshape(bias_v, (1, 1, e)), (n, 1, e)), dims=1)
        if mask is not None:
            mask = tf.cat(mask, mask[..., 0:1] * 0, dims=len(mask.shape) - 1)
    if mask is not None and len(mask.shape) == 3:           # (N * H, L, S), batch-major
        mask = tf.reshape(mask, (n, num_heads) + mask.shape[1:])
    d = e // num_heads

    def heads(t):
        return tf.transpose(tf.reshape(t, (n, t.shape[1], num_heads, d)), (0, 2, 1, 3))
    scores = att.batched_mul(heads(q) * (1 / np.sqrt(d)), att.batched_transpose(heads(k)))
    if mask is not None:
        scores = scores + mask
    y = att.batched_mul(tf.ops.softmax(scores, axis=-1), heads(v))
    y = tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (n, q.shape[1], e))
    out = tf.matmul(y, tf.transpose(out_proj_weight))
    if out_proj_bias is not None:
        out = out + out_proj_bias
    out = tf.transpose(out, (1, 0, 2))
    return tf.reshape(out, (out.shape[0], e)) if unbatched else out


def _attention_in_float32(fn, low, *args, **kwargs):
    """fn on float32 copies of the floating Tensors among args/kwargs, its result back in ``low``."""
    def up(x):
        return x.astype(np.float32) if isinstance(x, tf.Tensor) and x.dtype.kind in "fV" else x
    return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()}).astype(low)


TRANSLATIONS.update({
    ("nn.functional.scaled_dot_product_attention", ""): scaled_dot_product_attention,
    ("bmm", ""): bmm,
    ("nn.functional.multi_head_attention_forward", ""): multi_head_attention_forward,
})


# --- per-sample normalisation (triflux/normalisation.py: family layernorm) --------------------------

def _normalisation():
    from triflux import normalisation
    return normalisation


def _sizes(shape):
    """torch's normalized_shape (an int, a list, a tuple or a torch.Size) as a tuple of ints."""
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _normalisation().layer_norm(input, _sizes(normalized_shape), weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return _normalisation().rms_norm(input, _sizes(normalized_shape), weight, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return _normalisation().group_norm(input, num_groups, weight, bias, eps)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    return _normalisation().instance_norm(input, running_mean, running_var, weight, bias, use_input_stats,
                                          momentum, eps)


NO_GRAD[("nn.functional.instance_norm", "")] = {1, 2}       # the running statistics, when the sample has them
def _in_float32(fn, low, *args, **kwargs):
    """fn on float32 copies of the floating Tensors among args/kwargs, its result back in ``low``."""
    def up(x):
        return x.astype(np.float32) if isinstance(x, tf.Tensor) and x.dtype.kind in "fV" else x
    return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()}).astype(low)


TRANSLATIONS.update({
    ("nn.functional.layer_norm", ""): layer_norm,
    ("nn.functional.rms_norm", ""): rms_norm,
    ("nn.functional.group_norm", ""): group_norm,
    ("nn.functional.instance_norm", ""): instance_norm,
})


def _normalisation_floors(primitive):
    """A FLOAT64_FLOORS entry: per tensor leaf of a sample, the size of the
    terms its float64 gradient adds up (triflux.testing.layernorm.term_sizes)."""
    def floors(sample, arrays, g):
        from triflux.testing.layernorm import term_sizes
        x, rest = arrays[0], list(arrays[1:])
        eps = sample.kwargs.get("eps", 1e-5)
        if primitive == "instancenorm_train":
            running = 2 if sample.kwargs.get("running_mean") is not None else 0
            params = rest[running:]
            if len(params) == 1:                                 # a weight without a bias
                params = params + [np.zeros_like(params[0])]
            found = term_sizes(primitive, "backward", [x] + params, {"affine": bool(params), "eps": eps}, g, g,
                               centring=True)
            return dict(zip([0] + [1 + running + i for i in range(len(rest) - running)], found))
        if primitive == "groupnorm":
            attrs = {"groups": int(sample.args[0]), "eps": eps}
        else:
            attrs = {"normalised_ndim": len(_sizes(sample.args[0])), "eps": eps}
            if primitive == "rmsnorm" and sample.kwargs.get("eps") is None:
                attrs["eps"] = float(np.finfo(np.float64).eps)
        return dict(enumerate(term_sizes(primitive, "backward", [x] + rest, attrs, g, g, centring=True)))
    return floors


#: (name, variant) -> floors(sample, arrays, g): {leaf index: the size of the terms of its float64
#: gradient}, for operators whose gradients cancel by design (a normalised row of one or two values
#: has dx of 0 or nearly: torch's float64 roundoff there, 1e-16 of the terms, is not 1e-10 of the result)
FLOAT64_FLOORS = {
    ("nn.functional.layer_norm", ""): _normalisation_floors("layernorm"),
    ("nn.functional.rms_norm", ""): _normalisation_floors("rmsnorm"),
    ("nn.functional.group_norm", ""): _normalisation_floors("groupnorm"),
    ("nn.functional.instance_norm", ""): _normalisation_floors("instancenorm_train"),
}


# --- gather, scatter, embeddings (the gather family: triflux/embedding.py) ------------------------------
# torch's gather, scatter_add and scatter_reduce index elementwise along a dim: element (i_0, .., i_n) of
# index names input[i_0, .., index[i], .., i_n]. That is triflux's coordinate form with one coordinate
# per axis: the index's own position on every other axis, its value on dim (built here on the host from
# the index's values: test code). scatter_reduce's include_self combines the input with the scatter of
# src (NNlib's initial values where no index lands) elementwise; index_select is a gather of rows along
# dim (dim moved to the front and back).

def _gather_family():
    from triflux import embedding as module
    return module


def _along(dim, index, device, ndim=None):
    """torch's elementwise ``index`` along ``dim`` as coordinates (*index.shape, ndim), int64 (an empty
    index may have another rank than the input, as torch allows)."""
    idx = index.numpy().astype(np.int64)
    if idx.size == 0:
        return tf.tensor(np.zeros(idx.shape + (ndim or idx.ndim,), np.int64), device=device)
    grids = np.indices(idx.shape, dtype=np.int64)
    grids[dim] = idx
    return tf.tensor(np.stack(list(grids), axis=-1).reshape(idx.shape + (idx.ndim,)), device=device)


def _as_1d(*tensors):
    """0-d tensors as (1,) ones (torch lets dim 0 index a 0-d tensor)."""
    return [tf.reshape(t, (1,)) if t.ndim == 0 else t for t in tensors]


def _head(src, shape):
    """src's leading block of ``shape`` (torch's scatter reads src only where index has elements)."""
    if tuple(src.shape) == tuple(shape):
        return src
    return src[tuple(slice(0, n) for n in shape)]


def gather_along(input, dim, index, *, sparse_grad=False):
    """torch.gather: out[i] = input[i with index[i] on dim], out of index's shape."""
    shape = index.shape
    x, = _as_1d(input)
    if index.ndim == 0:
        index = tf.reshape(index, (1,))
    dim = dim % x.ndim
    out = _gather_family().gather(x, _along(dim, index, x.device, x.ndim), coords=True)
    return tf.reshape(out, shape)


def index_select(input, dim, index):
    """torch.index_select: rows of input along dim (a gather along axis 0 with dim moved first)."""
    if input.ndim == 0:
        return tf.reshape(_gather_family().gather(tf.reshape(input, (1,)), index), ())
    dim = dim % input.ndim
    order = [dim] + [a for a in range(input.ndim) if a != dim]
    picked = _gather_family().gather(tf.ops.transpose(input, tuple(order)), index)
    return tf.ops.transpose(picked, tuple(int(a) for a in np.argsort(order)))


def _scattered(op, input, dim, index, src):
    """(the scatter of src's block by index along dim into input's shape, how many entries land on each element)."""
    shape = input.shape
    x, idx, s = _as_1d(input, index, src)
    dim = dim % x.ndim
    coords = _along(dim, idx, x.device, x.ndim)
    part = _head(s, idx.shape)
    out = _gather_family().scatter(op, part, coords, tuple(x.shape), coords=True)
    counts = np.zeros(x.shape, np.int64)
    np.add.at(counts, tuple(coords.numpy().reshape(-1, x.ndim).T), 1)
    return x, tf.reshape(out, x.shape), counts, shape


def scatter_add(input, dim, index, src):
    x, added, _, shape = _scattered("add", input, dim, index, src)
    return tf.reshape(x + added, shape)


#: torch's scatter_reduce names -> NNlib's ops
_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "mean"}


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """torch.scatter_reduce: the input combined with (include_self) or replaced by (not) the reduction of
    the src elements that land on each element; elements nothing lands on keep the input."""
    op = _REDUCE[reduce]
    x, reduced, counts, shape = _scattered(op, input, dim, index, src)
    touched = tf.tensor(counts > 0, device=x.device)
    if include_self:
        if op == "mean":
            _, total, _, _ = _scattered("add", input, dim, index, src)
            out = (x + total) / tf.tensor((counts + 1).astype(np.float64), dtype=x.dtype, device=x.device)
        else:
            out = {"add": tf.ops.add, "mul": tf.ops.mul, "max": tf.ops.maximum, "min": tf.ops.minimum}[op](x, reduced)
    else:
        out = tf.where(touched, reduced, x)
    return tf.reshape(out, shape)


def embedding(weight, idx, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    if max_norm is not None:
        raise Unsupported("max_norm (torch renormalises the weight in place; Flux's Embedding has none)")
    return _gather_family().embedding(idx, weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq,
                                      sparse=sparse)


def embedding_bag(weight, idx, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    if max_norm is not None:
        raise Unsupported("max_norm (torch renormalises the weight in place; Flux's EmbeddingBag has none)")
    return _gather_family().embedding_bag(idx, weight, offsets, scale_grad_by_freq=scale_grad_by_freq, mode=mode,
                                          sparse=sparse, per_sample_weights=per_sample_weights,
                                          include_last_offset=include_last_offset, padding_idx=padding_idx)


def _in_float32(fn, low, *args, **kwargs):
    """fn on float32 copies of the floating Tensors among args/kwargs, its result back in ``low``."""
    def up(x):
        return x.astype(np.float32) if isinstance(x, tf.Tensor) and x.dtype.kind in "fV" else x
    return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()}).astype(low)


TRANSLATIONS.update({
    ("gather", ""): gather_along,
    ("index_select", ""): index_select,
    ("scatter_add", ""): scatter_add,
    **{("scatter_reduce", reduce): scatter_reduce for reduce in _REDUCE},
    ("nn.functional.embedding", ""): embedding,
    ("nn.functional.embedding_bag", ""): embedding_bag,
})
