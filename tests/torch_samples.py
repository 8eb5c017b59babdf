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


def _pair(v):
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return (int(v[0]), int(v[0]))
        return tuple(int(s) for s in v)
    return (int(v), int(v))


def _spatial(fn, x, n_spatial=2):
    """Run ``fn`` on ``x`` with a batch axis added when torch's sample is
    unbatched (C, H, W): triflux's spatial layers take (N, C, H, W) only."""
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


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif any(s != 1 for s in _pair(stride)):
            raise Unsupported("padding='same' with stride > 1 (torch refuses it too)")
    o, cg, kh, kw = weight.shape
    layer = tf.Conv((kh, kw), cg * groups, o, stride=_pair(stride), pad=padding if padding == "same" else _pair(padding),
                    dilation=_pair(dilation), groups=groups, bias=bias is not None)
    layer.weight = weight
    if bias is not None:
        layer.bias = bias
    return _spatial(layer, input)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    c, og, kh, kw = weight.shape
    layer = tf.ConvTranspose((kh, kw), c, og * groups, stride=_pair(stride), pad=_pair(padding),
                             outpad=_pair(output_padding), dilation=_pair(dilation), groups=groups,
                             bias=bias is not None)
    layer.weight = weight
    if bias is not None:
        layer.bias = bias
    return _spatial(layer, input)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    stride = kernel_size if stride is None or stride == [] else stride
    layer = tf.MaxPool(_pair(kernel_size), stride=_pair(stride), pad=_pair(padding), dilation=_pair(dilation),
                       ceil_mode=bool(ceil_mode))
    return _spatial(layer, input)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if divisor_override is not None:
        raise Unsupported("divisor_override (not in Flux)")
    stride = kernel_size if stride is None or stride == [] else stride
    layer = tf.MeanPool(_pair(kernel_size), stride=_pair(stride), pad=_pair(padding), ceil_mode=bool(ceil_mode),
                        count_include_pad=bool(count_include_pad))
    return _spatial(layer, input)


def _adaptive_size(output_size, x):
    size = output_size if isinstance(output_size, (list, tuple)) else (output_size, output_size)
    if len(size) == 1:
        size = (size[0], size[0])
    return tuple(x.shape[-2 + i] if s is None else int(s) for i, s in enumerate(size))


def adaptive_avg_pool2d(input, output_size):
    return _spatial(tf.AdaptiveMeanPool(_adaptive_size(output_size, input)), input)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    return _spatial(tf.AdaptiveMaxPool(_adaptive_size(output_size, input)), input)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    if mode not in ("nearest", "bilinear"):
        raise Unsupported(f"mode={mode!r}")
    if antialias:
        raise Unsupported("antialias")
    if input.ndim == 3:
        # 1-d resizing of (N, C, L) is the 2-d one of (N, C, 1, L) with the height kept
        wide = lambda v: None if v is None else (1, v[0] if isinstance(v, (list, tuple)) else v)
        y = interpolate(tf.reshape(input, (input.shape[0], input.shape[1], 1, input.shape[2])),
                        wide(size), wide(scale_factor), mode, align_corners, recompute_scale_factor)
        return tf.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    if input.ndim != 4:
        raise Unsupported(f"{input.ndim}-d input (triflux's Upsample is 2-d: (N, C, H, W))")
    if size is not None:
        layer = tf.Upsample(mode, size=_pair(size))
    else:
        if recompute_scale_factor:
            # torch then uses the output size floor(in * scale) as the size
            hs, ws = (scale_factor if isinstance(scale_factor, (list, tuple)) else (scale_factor,) * 2)
            size = (int(np.floor(input.shape[2] * hs)), int(np.floor(input.shape[3] * ws)))
            layer = tf.Upsample(mode, size=size, align_corners=bool(align_corners))  \
                if mode == "bilinear" else tf.Upsample(mode, size=size)
            return layer(input)
        sf = tuple(scale_factor) if isinstance(scale_factor, (list, tuple)) else scale_factor
        layer = tf.Upsample(mode, scale=sf, align_corners=bool(align_corners)) if mode == "bilinear" \
            else tf.Upsample(mode, scale=sf)
        return layer(input)
    if mode == "bilinear":
        layer = tf.Upsample(mode, size=_pair(size), align_corners=bool(align_corners))
    return layer(input)


def upsample_nearest(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, "bilinear", align_corners=True)


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
    ("nn.functional.conv2d", ""): conv2d,
    ("nn.functional.conv_transpose2d", ""): conv_transpose2d,
    ("nn.functional.max_pool2d", ""): max_pool2d,
    ("nn.functional.avg_pool2d", ""): avg_pool2d,
    ("nn.functional.adaptive_avg_pool2d", ""): adaptive_avg_pool2d,
    ("nn.functional.adaptive_max_pool2d", ""): adaptive_max_pool2d,
    ("nn.functional.interpolate", "nearest"): interpolate,
    ("nn.functional.interpolate", "bilinear"): interpolate,
    ("nn.functional.upsample_nearest", ""): upsample_nearest,
    ("nn.functional.upsample_bilinear", ""): upsample_bilinear,
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
