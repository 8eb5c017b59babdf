"""Operations on Tensors.

Each public function here checks its inputs (devices, dtypes, shapes) and
raises a triflux error that says what is wrong and how to fix it, then runs
the primitive with ``triflux.dispatch.apply`` (the reference on the CPU, the
kernel on a GPU, recorded for ``gradient``). The table at the bottom makes
these functions ``Tensor``'s operators and methods (``a + b`` is
``add(a, b)``). Nothing else in triflux calls NumPy or Triton to compute.
"""
import builtins
import math
import operator

import numpy as np

from . import dtypes as _dt
from .arguments import is_real, normalize_axis, not_real, probability_arg, shape_arg
from .constructors import next_seed
from .dispatch import apply, common_device
from .errors import DTypeError, ShapeError
from .operands import cast, floating as _floating, promote as _promote
from .primitives import REGISTRY
from .specs.matmul import dense_bias_act_spec, matmul_spec
from .specs.norm import batchnorm_spec
from .specs.reduce import reduce_spec
from .specs.rnn import recurrent_spec
from .specs.softmax import softmax_spec
from .tensor import Tensor, as_tensor

_P = REGISTRY


def _binary(name, a, b):
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = as_tensor(b, like=a)
    # one storage dtype object: equal dtypes (the common case, without building NumPy dtypes)
    if a._data.dtype is not b._data.dtype and a.dtype != b.dtype:
        a, b = _promote(a, b)
    device = common_device(name, (a, b))
    _broadcast_shape(name, a.shape, b.shape)
    return apply(_P[name], (a, b), {}, name, record=name not in _COMPARISONS, device=device)


_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}


def _broadcast_shape(name, *shapes):
    """The NumPy broadcast of ``shapes`` (pure Python: this runs on every op)."""
    first = shapes[0]
    if shapes.count(first) == len(shapes):     # all equal
        return first
    nd = builtins.max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for k, d in enumerate(s, nd - len(s)):
            if d != out[k]:
                if out[k] != 1 and d != 1:
                    raise ShapeError(f"`{name}`: shapes {' and '.join(map(str, shapes))} do not broadcast "
                                     "(trailing dimensions must be equal or 1)")
                if d != 1:
                    out[k] = d
    return tuple(out)


def _unary(name, x, **attrs):
    x = _floating(x, name)
    return apply(_P[name], (x,), attrs, name)


# --- elementwise (math: reference/elementwise.py) -----------------------------------------------

def _elementwise(name, doc, run):
    """The user function ``name`` (docstring ``doc``) of the elementwise
    primitive of that name: ``run(name, *args)`` (``_binary`` or ``_unary``)."""
    if run is _binary:
        def op(a, b):
            return _binary(name, a, b)
    else:
        def op(x):
            return _unary(name, x)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


add = _elementwise("add", "``a + b`` elementwise, broadcasting as NumPy does: ``add(x, 1.0)``.", _binary)
sub = _elementwise("sub", "``a - b`` elementwise, broadcasting.", _binary)
mul = _elementwise("mul", "``a * b`` elementwise, broadcasting.", _binary)
maximum = _elementwise("maximum", "The larger of ``a`` and ``b`` elementwise (NaN wins), broadcasting.", _binary)
minimum = _elementwise("minimum", "The smaller of ``a`` and ``b`` elementwise (NaN wins), broadcasting.", _binary)
eq = _elementwise("eq", "``a == b`` elementwise: a bool Tensor (not differentiated).", _binary)
ne = _elementwise("ne", "``a != b`` elementwise: a bool Tensor.", _binary)
lt = _elementwise("lt", "``a < b`` elementwise: a bool Tensor.", _binary)
le = _elementwise("le", "``a <= b`` elementwise: a bool Tensor.", _binary)
gt = _elementwise("gt", "``a > b`` elementwise: a bool Tensor.", _binary)
ge = _elementwise("ge", "``a >= b`` elementwise: a bool Tensor.", _binary)

exp = _elementwise("exp", "exp(x) elementwise (integers become float32).", _unary)
log = _elementwise("log", "The natural logarithm of x elementwise.", _unary)
sqrt = _elementwise("sqrt", "√x elementwise.", _unary)
tanh = _elementwise("tanh", "tanh(x) elementwise (``triflux.tanh``'s primitive).", _unary)
sigmoid = _elementwise("sigmoid", "σ(x) = 1 / (1 + exp(-x)) elementwise.", _unary)
relu = _elementwise("relu", "max(x, 0) elementwise.", _unary)
gelu = _elementwise("gelu", "GELU, tanh approximation (NNlib's ``gelu``), elementwise.", _unary)
gelu_erf = _elementwise("gelu_erf", "The exact GELU x·Φ(x) elementwise.", _unary)
swish = _elementwise("swish", "x·σ(x) elementwise.", _unary)
softplus = _elementwise("softplus", "log(1 + exp(x)) elementwise.", _unary)


def div(a, b):
    """``a / b`` elementwise, broadcasting; integers divide as floats (float32)."""
    a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not _dt.is_floating(a.dtype):
        a = cast(a, _dt.DEFAULT_FLOAT)
    return _binary("div", a, b)


def pow(a, b):
    """``a ** b`` elementwise, broadcasting; integer ``a`` becomes float32."""
    return _binary("pow", _floating(as_tensor(a, like=b if isinstance(b, Tensor) else None), "pow"), b)


def neg(x):
    """``-x`` elementwise."""
    x = as_tensor(x)
    return apply(_P["neg"], (x,), {}, "neg")


def abs(x):
    """``|x|`` elementwise."""
    x = as_tensor(x)
    return apply(_P["abs"], (x,), {}, "abs")


def leakyrelu(x, negative_slope=0.01):
    """x for x > 0, ``negative_slope``·x otherwise, elementwise."""
    return _unary("leakyrelu", x, negative_slope=float(negative_slope))


def elu(x, alpha=1.0):
    """x for x > 0, ``alpha``·(exp(x) - 1) otherwise, elementwise."""
    return _unary("elu", x, alpha=float(alpha))


def where(cond, a, b):
    """Elementwise ``a`` where ``cond`` is true, else ``b`` (broadcasting)."""
    cond = as_tensor(cond)
    if cond.dtype != _dt.bool_:
        raise DTypeError(f"`where` needs a bool condition, got {cond.dtype}; compare first, e.g. `x > 0`")
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    if like is None:
        like = as_tensor(np.asarray(a, dtype=np.result_type(a, b) if not isinstance(a, float) else _dt.DEFAULT_FLOAT))
    a, b = as_tensor(a, like=like), as_tensor(b, like=like)
    a, b = _promote(a, b)
    _broadcast_shape("where", cond.shape, a.shape, b.shape)
    return apply(_P["where"], (cond, a, b), {}, "where")


# --- reductions ----------------------------------------------------------------------------

def _reduction(name, x, axis, keepdims):
    spec = reduce_spec(name, x.shape, x.dtype, axis, keepdims)
    return apply(_P[name], (x,), {"axis": spec.axes, "keepdims": spec.keepdims}, name)


def sum(x, axis=None, keepdims=False):
    """The sum over ``axis`` (None: all; an int or a tuple of ints); ``keepdims``
    keeps the summed axes as size 1: ``sum(x, axis=1)``. Math: reference/reduce.py."""
    return _reduction("sum", as_tensor(x), axis, keepdims)


def mean(x, axis=None, keepdims=False):
    """The mean over ``axis`` (as ``sum``). Math: reference/reduce.py."""
    return _reduction("mean", _floating(x, "mean"), axis, keepdims)


def max(x, axis=None, keepdims=False):
    """The maximum over ``axis`` (as ``sum``; NaN wins; an empty axis is an
    error). Math: reference/reduce.py."""
    return _reduction("max", as_tensor(x), axis, keepdims)


# --- matrix products ---------------------------------------------------------------------

def matmul(a, b):
    """NumPy's ``a @ b``: vectors, matrices, and batches of them with
    broadcasting of the batch dimensions. Math: reference/matmul.py ``matmul_forward``."""
    a, b = as_tensor(a), as_tensor(b)
    if not _dt.is_floating(a.dtype):
        a = cast(a, _dt.DEFAULT_FLOAT)
    if not _dt.is_floating(b.dtype):
        b = cast(b, _dt.DEFAULT_FLOAT)
    a, b = _promote(a, b)
    matmul_spec(a.shape, b.shape, a.dtype, b.dtype)
    return apply(_P["matmul"], (a, b), {}, "matmul")


def dense_bias_act(x, w, b, *, activation="identity"):
    """``activation(matmul(x, w.T) + b)`` as one fused primitive (a Dense
    layer's forward): ``x`` (..., K), ``w`` (O, K) in torch's Linear layout,
    ``b`` (O,), result (..., O); ``activation`` one of the primitive's
    ``fusable_activations``, "identity", "relu", "sigmoid", "tanh" (those
    whose derivative follows from the output). Math: reference/matmul.py
    ``dense_bias_act_forward``."""
    x, w = _promote(_floating(x, "dense_bias_act"), _floating(w, "dense_bias_act"))
    b = as_tensor(b)
    if b.dtype != x.dtype:  # promote as matmul(x, w.T) + b would
        b = _floating(b, "dense_bias_act")
        x, b = _promote(x, b)
        w = cast(w, x.dtype)
    dense_bias_act_spec(x.shape, w.shape, b.shape, x.dtype, w.dtype, b.dtype, activation)
    return apply(_P["dense_bias_act"], (x, w, b), {"activation": activation}, "dense_bias_act")


# --- softmax family ---------------------------------------------------------------------------

def softmax(x, axis=-1):
    """exp(x) / Σ exp(x) along one ``axis`` (the last by default; the
    activation ``triflux.softmax`` picks the class axis). Math: reference/softmax.py."""
    x = _floating(x, "softmax")
    return apply(_P["softmax"], (x,), {"axis": softmax_spec("softmax", x.shape, x.dtype, axis).axis}, "softmax")


def logsoftmax(x, axis=-1):
    """x - log Σ exp(x) along one ``axis``. Math: reference/softmax.py."""
    x = _floating(x, "logsoftmax")
    spec = softmax_spec("logsoftmax", x.shape, x.dtype, axis)
    return apply(_P["logsoftmax"], (x,), {"axis": spec.axis}, "logsoftmax")


def logsumexp(x, axis=-1, keepdims=False):
    """log Σ exp(x) along one ``axis``, without overflow. Math: reference/softmax.py."""
    x = _floating(x, "logsumexp")
    spec = softmax_spec("logsumexp", x.shape, x.dtype, axis, keepdims)
    return apply(_P["logsumexp"], (x,), {"axis": spec.axis, "keepdims": bool(keepdims)}, "logsumexp")


# --- shape --------------------------------------------------------------------------------------

def reshape(x, shape):
    """``x``'s elements (row-major) in a new ``shape`` of the same size; one
    entry may be -1: ``reshape(x, (n, -1))``."""
    x = as_tensor(x)
    shape = shape_arg(shape, "`reshape`")
    n = math.prod(x._data.shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"`reshape`: at most one -1 in the new shape, got {shape}")
    if -1 in shape:
        known = math.prod([s for s in shape if s != -1])
        if known == 0 or n % known:
            raise ShapeError(f"`reshape`: cannot reshape a tensor of shape {x.shape} ({n} elements) into {shape}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    if math.prod(shape) != n:
        raise ShapeError(f"`reshape`: cannot reshape a tensor of shape {x.shape} ({n} elements) into {shape}")
    if shape == x._data.shape:
        return x
    return apply(_P["reshape"], (x,), {"shape": shape}, "reshape")


def transpose(x, axes=None):
    """``x`` with its axes permuted by ``axes`` (reversed when None, as
    NumPy): ``transpose(x, (3, 2, 1, 0))`` turns Flux's (W, H, C, N) into (N, C, H, W)."""
    x = as_tensor(x)
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    axes = tuple(normalize_axis(a, x.ndim, "transpose") for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"`transpose`: {axes} is not a permutation of the {x.ndim} axes of shape {x.shape}")
    if axes == tuple(range(x.ndim)):
        return x
    return apply(_P["transpose"], (x,), {"axes": axes}, "transpose")


def _index(v, part):
    """``v`` (an int, or what ``operator.index`` takes) as an int; ``part``
    is the index's part that holds it, for the message."""
    try:
        return operator.index(v)
    except TypeError:
        raise IndexError(f"a Tensor index is made of ints, slices of ints, None and `...`; got {part!r} "
                         f"({type(v).__name__})") from None


def _normalize_index(index, shape):
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, (Tensor, np.ndarray, list)):
            raise TypeError("advanced (array) indexing is not supported; use basic slicing "
                            "(ints, slices, None, ...), or `where` for masks")
        if isinstance(i, (bool, np.bool_)):
            raise TypeError("boolean indexing is not supported; use `where`")
        if isinstance(i, slice):
            out.append(slice(*(None if v is None else _index(v, i) for v in (i.start, i.stop, i.step))))
        elif i is None or i is Ellipsis:
            out.append(i)
        else:
            out.append(_index(i, i))
    if out.count(Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = builtins.sum(1 for i in out if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for a tensor of shape {shape}")
    if Ellipsis in out:
        k = out.index(Ellipsis)
        out[k:k + 1] = [slice(None)] * (len(shape) - n_real)
    dim = 0
    for j, i in enumerate(out):
        if i is None:
            continue
        if isinstance(i, int):
            if not -shape[dim] <= i < shape[dim]:
                raise IndexError(f"index {i} is out of bounds for axis {dim} of size {shape[dim]} (shape {shape})")
            out[j] = i % shape[dim]
        elif isinstance(i, slice) and i.step == 0:
            raise ValueError("slice step cannot be zero")
        dim += 1
    return tuple(out)


def getitem(x, index):
    """``x[index]`` with basic indexing: ints, slices, None and ``...``."""
    x = as_tensor(x)
    index = _normalize_index(index, x.shape)
    return apply(_P["getitem"], (x,), {"index": index}, "getitem")


def concat(xs, axis=0):
    """Join tensors along an existing ``axis`` (Flux's ``cat(xs...; dims)``)."""
    xs = [as_tensor(x) for x in xs]
    if not xs:
        raise ShapeError("`concat` needs at least one tensor")
    nd = xs[0].ndim
    axis = normalize_axis(axis, builtins.max(nd, 1), "concat")
    for x in xs[1:]:
        if x.ndim != nd or builtins.any(s != t for k, (s, t) in enumerate(zip(x.shape, xs[0].shape)) if k != axis):
            raise ShapeError(f"`concat` along axis {axis}: shapes {xs[0].shape} and {x.shape} "
                             "must agree on every other axis")
    dt = np.result_type(*[x.dtype for x in xs]) if len({x.dtype for x in xs}) > 1 else xs[0].dtype
    xs = [cast(x, dt) for x in xs]
    return apply(_P["concat"], tuple(xs), {"axis": axis}, "concat")


def cat(*xs, dims=None, axis=None):
    """Flux's ``cat(xs...; dims)``: ``cat(a, b, c, dims=1)`` joins ``a``, ``b``,
    ``c`` along axis ``dims`` (0-based, as every triflux axis; negative counts
    from the end). ``cat([a, b], dims=1)`` and ``axis=`` work too; with neither
    keyword the tensors join along axis 0, as ``concat``."""
    if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
        xs = tuple(xs[0])
    if dims is not None and axis is not None and dims != axis:
        raise TypeError(f"`cat` got dims={dims!r} and axis={axis!r}; give one of them (they mean the same)")
    if not xs:
        raise ShapeError("`cat` needs at least one tensor: `cat(a, b, dims=1)`")
    return concat(xs, axis=dims if dims is not None else (axis if axis is not None else 0))


def broadcast_to(x, shape):
    """``x`` repeated along its size-1 (or missing leading) axes to ``shape``."""
    x = as_tensor(x)
    shape = shape_arg(shape, "`broadcast_to`")
    if _broadcast_shape("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"`broadcast_to`: cannot broadcast shape {x.shape} to {shape}")
    if shape == x.shape:
        return x
    return apply(_P["broadcast_to"], (x,), {"shape": shape}, "broadcast_to")


def contiguous(x):
    """``x`` with its elements in row-major order in memory."""
    return apply(_P["contiguous"], (as_tensor(x),), {}, "contiguous")


# --- normalisation, dropout (convolution, pooling, resampling and padding: triflux/spatial.py) ---

def batchnorm(x, gamma, beta, mean=None, var=None, eps=1e-5, *, running=None, momentum=0.1,
              activation="identity", moved=None):
    """Batch normalisation over axis 1: with the batch's statistics when
    ``mean``/``var`` are None, else with the given ones. With the batch's
    statistics, ``running=(running_mean, running_var)`` also moves those in
    place, in the same kernels: running = (1 - momentum) * running +
    momentum * the batch's mean (unbiased variance); given ``moved=(mean,
    var)`` too, the moved values go there instead and ``running`` stays as it
    is. ``activation`` (a name: identity, relu, sigmoid or tanh) is applied to
    the output in the same kernels. Math: reference/norm.py."""
    x = _floating(x, "batchnorm")
    running = tuple(running) if running is not None and mean is None else ()
    if running and moved is not None:
        running += tuple(moved)
    per_channel = ((gamma, beta) if mean is None else (gamma, beta, mean, var)) + running
    spec = batchnorm_spec(x._data.shape, tuple([v._data.shape for v in per_channel]), x._data.dtype, eps, activation)
    attrs = {"eps": spec.eps}
    if spec.activation != "identity":
        attrs["activation"] = spec.activation
    if mean is None:
        if running:
            attrs["momentum"] = float(momentum)
        return apply(_P["batchnorm_train"], (x, gamma, beta) + running, attrs, "batchnorm")
    return apply(_P["batchnorm_test"], (x, gamma, beta, mean, var), attrs, "batchnorm")


def dropout(x, p, seed=None):
    """Zero each element with probability ``p`` (in [0, 1]), scale the rest by
    1/(1-p); ``seed`` picks the mask (triflux's seeded stream by default).
    Math: reference/dropout.py ``dropout_forward``."""
    x = _floating(x, "dropout")
    p = probability_arg(p, "`dropout`")
    return apply(_P["dropout"], (x,), {"p": p, "seed": next_seed() if seed is None else int(seed)}, "dropout")


# --- recurrent sequences (batch first; torch.nn.RNN/LSTM/GRU's weights and gate order) ------

def _sequence(name, inputs, attrs):
    inputs = tuple(as_tensor(t) for t in inputs)
    recurrent_spec(name, tuple(t.shape for t in inputs), tuple(t.dtype for t in inputs), attrs.get("activation"))
    return apply(_P[name], inputs, attrs, name)


def rnn_sequence(x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """An Elman RNN over ``x`` (N, L, in) from ``h0`` (N, H), ``activation``
    "tanh" or "relu": every hidden state, (N, L, H)."""
    return _sequence("rnn_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), {"activation": activation})


def lstm_sequence(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """An LSTM over ``x`` (N, L, in) from ``(h0, c0)`` (N, H) each: every
    state [h_t, c_t], (N, L, 2H)."""
    return _sequence("lstm_sequence", (x, h0, c0, w_ih, w_hh, b_ih, b_hh), {})


def gru_sequence(x, h0, w_ih, w_hh, b_ih, b_hh):
    """A GRU over ``x`` (N, L, in) from ``h0`` (N, H): every hidden state, (N, L, H)."""
    return _sequence("gru_sequence", (x, h0, w_ih, w_hh, b_ih, b_hh), {})


# --- Tensor's operators and methods: these functions ----------------------------------------

def _swapped(f):
    """``f`` with its two arguments swapped: the reflected operators (``2 - x``)."""
    return lambda self, other: f(other, self)


def _reshape_method(self, *shape):
    """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return reshape(self, shape)


def _transpose_method(self, *axes):
    """``t.transpose()``, ``t.transpose(1, 0)`` or ``t.transpose((1, 0))``."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return transpose(self, axes or None)


Tensor.__add__, Tensor.__radd__ = add, _swapped(add)
Tensor.__sub__, Tensor.__rsub__ = sub, _swapped(sub)
Tensor.__mul__, Tensor.__rmul__ = mul, _swapped(mul)
Tensor.__truediv__, Tensor.__rtruediv__ = div, _swapped(div)
Tensor.__pow__, Tensor.__rpow__ = pow, _swapped(pow)
Tensor.__matmul__, Tensor.__rmatmul__ = matmul, _swapped(matmul)
Tensor.__neg__, Tensor.__abs__ = neg, abs
Tensor.__eq__, Tensor.__ne__ = eq, ne
Tensor.__lt__, Tensor.__le__, Tensor.__gt__, Tensor.__ge__ = lt, le, gt, ge
Tensor.__getitem__ = getitem
Tensor.sum, Tensor.mean, Tensor.max = sum, mean, max
Tensor.reshape, Tensor.transpose = _reshape_method, _transpose_method
Tensor.T = property(lambda self: transpose(self, None))
Tensor.astype = cast
Tensor.exp, Tensor.log, Tensor.sqrt, Tensor.tanh = exp, log, sqrt, tanh

# the operations on spatial axes, any rank (conv, pooling, resampling, padding); imported last:
# triflux/spatial.py builds on the helpers above
from .spatial import *  # noqa: E402,F401,F403
from .spatial import adaptive_size  # noqa: E402,F401
# the per-sample normalisations (layer_norm, rms_norm, group_norm, instance_norm): triflux/normalisation.py
from .normalisation import *  # noqa: E402,F401,F403
# gather, scatter and the embeddings (rows of a table by integer indices): triflux/embedding.py
from .embedding import embedding, embedding_bag, gather, scatter  # noqa: E402,F401
# attention and batched products (dot_product_attention, scaled_dot_product_attention, ...): triflux/attention.py
from .attention import *  # noqa: E402,F401,F403
