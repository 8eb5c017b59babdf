"""Operations on Tensors.

Each public function here checks its inputs (devices, dtypes, shapes) and
raises a triflux error that says what is wrong and how to fix it, then
dispatches on the inputs' device to the primitive's reference (CPU) or its
kernel (GPU), and records the call on the autodiff tape when ``gradient`` is
running. Nothing else in triflux calls NumPy or Triton to compute.
"""
import builtins
import operator

import numpy as np

from . import autodiff
from . import dtypes as _dt
from .errors import DeviceMismatchError, DTypeError, ShapeError
from . import primitives  # noqa: F401  (fills the registry)
from .registry import REGISTRY
from .tensor import Tensor, next_seed

_P = REGISTRY


# --- dispatch --------------------------------------------------------------------------

def _mismatch(opname, devices):
    a, b = devices[0], next(d for d in devices if d != devices[0])
    if not a.is_cpu and not b.is_cpu:   # two GPUs
        return DeviceMismatchError(
            f"`{opname}` got tensors on different devices: {a!r} and {b!r}. "
            f"Put them on one device first: `{type(a).__name__}({a.idx})(x)` moves x to the first, "
            f"`{type(b).__name__}({b.idx})(x)` to the second, `cpu(x)` to the CPU.")
    gpu_side = b if a.is_cpu else a
    return DeviceMismatchError(
        f"`{opname}` got tensors on different devices: {a!r} and {b!r}. "
        f"Put them on one device first: `gpu(x)` moves data to {gpu_side!r}, `cpu(x)` to the CPU.")


def apply(prim, inputs, attrs, opname=None, record=True):
    """Run primitive ``prim`` on Tensors ``inputs`` on their (common) device."""
    dev = inputs[0]._device
    for t in inputs:
        if t._device is not dev and t._device != dev:
            raise _mismatch(opname or prim.name, [t._device for t in inputs])
    fn = prim._cache.get(("reference" if dev.is_cpu else "triton_kernels", "forward"))
    if fn is None:
        fn = prim.impl(dev.is_cpu)
    out = Tensor._make(fn(*[t._data for t in inputs], **attrs), dev)
    tape = autodiff.TAPE
    if tape is not None and record:
        tape.record(prim, inputs, out, attrs)
    return out


def _constant(value, dtype, device):
    arr = np.asarray(value, dtype=dtype)
    t = Tensor._make(arr, device)
    if device.is_cpu:
        return t
    key = (type(value), value, dtype, device)
    c = _CONSTANTS.get(key)
    if c is None:
        from .tensor import transfer
        from .devices import CPU
        c = transfer(Tensor._make(arr, CPU), device)
        if len(_CONSTANTS) > 4096:
            _CONSTANTS.clear()
        _CONSTANTS[key] = c
    return c


_CONSTANTS = {}


def as_tensor(x, like=None):
    """``x`` as a Tensor: Tensors pass; NumPy arrays become CPU Tensors;
    Python numbers become constants of ``like``'s dtype and device."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number, np.bool_)) and like is not None:
        ld = like.dtype
        if _dt.is_floating(ld):
            dt = ld
        elif isinstance(x, (bool, np.bool_)):
            dt = ld
        elif isinstance(x, (int, np.integer)):
            dt = ld if ld.kind in "iu" else _dt.int64
        else:
            dt = _dt.DEFAULT_FLOAT
        return _constant(x, dt, like._device)
    if isinstance(x, np.ndarray):
        return Tensor._from_numpy(x)
    from .tensor import tensor
    if like is not None and isinstance(x, (list, tuple)):
        return tensor(x, device=like._device)
    return tensor(x)


def _promote(a, b):
    if a.dtype == b.dtype:
        return a, b
    fa, fb = _dt.is_floating(a.dtype), _dt.is_floating(b.dtype)
    # integers meeting floats take the float's type (int64 * float32 stays float32)
    dt = a.dtype if fa and not fb else b.dtype if fb and not fa else np.promote_types(a.dtype, b.dtype)
    return cast(a, dt), cast(b, dt)


def _binary(name, a, b):
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = as_tensor(b, like=a)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    if a._device is not b._device and a._device != b._device:
        raise _mismatch(name, [a._device, b._device])
    _broadcast_shape(name, a.shape, b.shape)
    return apply(_P[name], (a, b), {}, name, record=name not in _COMPARISONS)


_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}


def _broadcast_shape(name, *shapes):
    """The NumPy broadcast of ``shapes`` (pure Python: this runs on every op)."""
    first = shapes[0]
    if all(s == first for s in shapes):
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


def _floating(x, name):
    x = as_tensor(x)
    if not _dt.is_floating(x.dtype):
        x = cast(x, _dt.DEFAULT_FLOAT)
    return x


def _unary(name, x, **attrs):
    x = _floating(x, name)
    return apply(_P[name], (x,), attrs, name)


# --- elementwise ---------------------------------------------------------------------------

def add(a, b): return _binary("add", a, b)
def sub(a, b): return _binary("sub", a, b)
def mul(a, b): return _binary("mul", a, b)
def div(a, b):
    a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not _dt.is_floating(a.dtype):
        a = cast(a, _dt.DEFAULT_FLOAT)
    return _binary("div", a, b)
def pow(a, b): return _binary("pow", _floating(as_tensor(a, like=b if isinstance(b, Tensor) else None), "pow"), b)
def maximum(a, b): return _binary("maximum", a, b)
def minimum(a, b): return _binary("minimum", a, b)
def eq(a, b): return _binary("eq", a, b)
def ne(a, b): return _binary("ne", a, b)
def lt(a, b): return _binary("lt", a, b)
def le(a, b): return _binary("le", a, b)
def gt(a, b): return _binary("gt", a, b)
def ge(a, b): return _binary("ge", a, b)


def neg(x):
    x = as_tensor(x)
    return apply(_P["neg"], (x,), {}, "neg")


def abs(x):
    x = as_tensor(x)
    return apply(_P["abs"], (x,), {}, "abs")


def exp(x): return _unary("exp", x)
def log(x): return _unary("log", x)
def sqrt(x): return _unary("sqrt", x)
def tanh(x): return _unary("tanh", x)
def sigmoid(x): return _unary("sigmoid", x)
def relu(x): return _unary("relu", x)
def gelu(x): return _unary("gelu", x)
def gelu_erf(x): return _unary("gelu_erf", x)
def swish(x): return _unary("swish", x)
def softplus(x): return _unary("softplus", x)
def leakyrelu(x, negative_slope=0.01): return _unary("leakyrelu", x, negative_slope=float(negative_slope))
def elu(x, alpha=1.0): return _unary("elu", x, alpha=float(alpha))


def cast(x, dtype):
    """``x`` converted to ``dtype`` (differentiable between floating types)."""
    x = as_tensor(x)
    dtype = _dt.as_dtype(dtype)
    if x.dtype == dtype:
        return x
    return apply(_P["cast"], (x,), {"dtype": dtype}, "cast",
                 record=_dt.is_floating(dtype) and _dt.is_floating(x.dtype))


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

def normalize_axes(axis, ndim, opname):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"`{opname}`: axis {a} is out of range for a {ndim}-d tensor")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def normalize_axis(axis, ndim, opname):
    a = operator.index(axis)
    if not -ndim <= a < ndim:
        raise ShapeError(f"`{opname}`: axis {a} is out of range for a {ndim}-d tensor")
    return a % ndim


def sum(x, axis=None, keepdims=False):
    x = as_tensor(x)
    return apply(_P["sum"], (x,), {"axis": normalize_axes(axis, x.ndim, "sum"), "keepdims": bool(keepdims)}, "sum")


def mean(x, axis=None, keepdims=False):
    x = _floating(x, "mean")
    return apply(_P["mean"], (x,), {"axis": normalize_axes(axis, x.ndim, "mean"), "keepdims": bool(keepdims)}, "mean")


def max(x, axis=None, keepdims=False):
    x = as_tensor(x)
    axes = normalize_axes(axis, x.ndim, "max")
    if any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"`max` over an empty axis of a tensor of shape {x.shape}: the maximum of nothing is undefined")
    return apply(_P["max"], (x,), {"axis": axes, "keepdims": bool(keepdims)}, "max")


# --- matrix products ---------------------------------------------------------------------

def matmul(a, b):
    """NumPy's ``a @ b``: vectors, matrices, and batches of them with
    broadcasting of the batch dimensions."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"`matmul` needs tensors of at least 1 dimension, got shapes {a.shape} and {b.shape}; use `*` for scalars")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ShapeError(f"`matmul`: shapes {a.shape} and {b.shape} do not fit: "
                         f"{ka} columns of the first against {kb} rows of the second")
    if a.ndim > 2 or b.ndim > 2:
        _broadcast_shape("matmul (batch dimensions)", a.shape[:-2], b.shape[:-2] if b.ndim >= 2 else ())
    if not _dt.is_floating(a.dtype):
        a = cast(a, _dt.DEFAULT_FLOAT)
    if not _dt.is_floating(b.dtype):
        b = cast(b, _dt.DEFAULT_FLOAT)
    a, b = _promote(a, b)
    return apply(_P["matmul"], (a, b), {}, "matmul")


# --- softmax family ---------------------------------------------------------------------------

def softmax(x, axis=-1):
    x = _floating(x, "softmax")
    return apply(_P["softmax"], (x,), {"axis": normalize_axis(axis, builtins.max(x.ndim, 1), "softmax")}, "softmax")


def logsoftmax(x, axis=-1):
    x = _floating(x, "logsoftmax")
    return apply(_P["logsoftmax"], (x,), {"axis": normalize_axis(axis, builtins.max(x.ndim, 1), "logsoftmax")}, "logsoftmax")


def logsumexp(x, axis=-1, keepdims=False):
    x = _floating(x, "logsumexp")
    return apply(_P["logsumexp"], (x,), {"axis": normalize_axis(axis, builtins.max(x.ndim, 1), "logsumexp"),
                                         "keepdims": bool(keepdims)}, "logsumexp")


# --- shape --------------------------------------------------------------------------------------

def reshape(x, shape):
    x = as_tensor(x)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    n = x.size
    if shape.count(-1) > 1:
        raise ShapeError(f"`reshape`: at most one -1 in the new shape, got {shape}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if known == 0 or n % known:
            raise ShapeError(f"`reshape`: cannot reshape a tensor of shape {x.shape} ({n} elements) into {shape}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    if int(np.prod(shape)) != n:
        raise ShapeError(f"`reshape`: cannot reshape a tensor of shape {x.shape} ({n} elements) into {shape}")
    if shape == x.shape:
        return x
    return apply(_P["reshape"], (x,), {"shape": shape}, "reshape")


def transpose(x, axes=None):
    x = as_tensor(x)
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    axes = tuple(normalize_axis(a, x.ndim, "transpose") for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"`transpose`: {axes} is not a permutation of the {x.ndim} axes of shape {x.shape}")
    if axes == tuple(range(x.ndim)):
        return x
    return apply(_P["transpose"], (x,), {"axes": axes}, "transpose")


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
            out.append(slice(*(None if v is None else operator.index(v) for v in (i.start, i.stop, i.step))))
        elif i is None or i is Ellipsis:
            out.append(i)
        else:
            out.append(operator.index(i))
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
    x = as_tensor(x)
    shape = tuple(int(s) for s in shape)
    if _broadcast_shape("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"`broadcast_to`: cannot broadcast shape {x.shape} to {shape}")
    if shape == x.shape:
        return x
    return apply(_P["broadcast_to"], (x,), {"shape": shape}, "broadcast_to")


def contiguous(x):
    return apply(_P["contiguous"], (as_tensor(x),), {}, "contiguous")


# --- fills ----------------------------------------------------------------------------------

def _no_input(name, device, attrs):
    prim = _P[name]
    fn = prim.impl(device.is_cpu)
    return Tensor._make(fn(**attrs, device=device), device)


def fill(shape, value, dtype=_dt.float32, device=None):
    from .tensor import as_device
    device = as_device(device)
    return _no_input("fill", device, {"shape": tuple(shape), "value": value, "dtype": _dt.as_dtype(dtype)})


def random(name, shape, dtype, device, seed=None):
    dtype = _dt.as_dtype(dtype)
    if not _dt.is_floating(dtype):
        raise DTypeError(f"random numbers are floating point; got dtype {dtype}")
    return _no_input(name, device, {"shape": tuple(shape), "dtype": dtype,
                                    "seed": next_seed() if seed is None else int(seed)})


def zeros_like(x):
    return fill(x.shape, 0, x.dtype, x.device)


def ones_like(x):
    return fill(x.shape, 1, x.dtype, x.device)


# --- convolution, pooling, normalisation, dropout (NCHW) ------------------------------------

def pair(v, name="value"):
    """``v`` as a pair of ints: 3 -> (3, 3); (2, 3) stays."""
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    v = tuple(int(e) for e in v)
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v}")
    return v


def quad(pad, name="pad"):
    """Padding as (top, bottom, left, right): an int, (h, w) or the four."""
    if isinstance(pad, (int, np.integer)):
        return (int(pad),) * 4
    pad = tuple(int(p) for p in pad)
    if len(pad) == 2:
        return (pad[0], pad[0], pad[1], pad[1])
    if len(pad) == 4:
        return pad
    raise ValueError(f"{name} must be an int, (h, w) or (top, bottom, left, right), got {pad}")


def _spatial_input(name, x, channels=None):
    x = _floating(x, name)
    if x.ndim != 4:
        raise ShapeError(f"`{name}` expects a 4-d (N, C, H, W) input, got shape {x.shape}")
    if channels is not None and x.shape[1] != channels:
        raise ShapeError(f"`{name}` expects {channels} input channels (axis 1), got shape {x.shape}")
    return x


def conv2d(x, w, *, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation of ``x`` (N, C, H, W) with ``w`` (O, C/groups, kh, kw)."""
    w = _floating(w, "conv2d")
    x = _spatial_input("conv2d", x, w.shape[1] * groups if w.ndim == 4 else None)
    x, w = _promote(x, w)
    return apply(_P["conv2d"], (x, w), {"stride": pair(stride, "stride"), "padding": quad(padding),
                                         "dilation": pair(dilation, "dilation"), "groups": int(groups)}, "conv2d")


def conv2d_bias_act(x, w, b, *, stride=1, padding=0, dilation=1, groups=1, activation="identity"):
    """``activation(conv2d(x, w) + b)`` as one fused primitive: ``x`` (N, C, H, W),
    ``w`` (O, C/groups, kh, kw), ``b`` (O,); ``activation`` one of "identity",
    "relu", "sigmoid", "tanh" (those whose derivative follows from the output)."""
    if activation not in ("identity", "relu", "sigmoid", "tanh"):
        raise ValueError(f"`conv2d_bias_act`: activation must be 'identity', 'relu', 'sigmoid' or 'tanh', "
                         f"got {activation!r}; for another activation use `conv2d`, add the bias and apply it")
    w = _floating(w, "conv2d_bias_act")
    x = _spatial_input("conv2d_bias_act", x, w.shape[1] * groups if w.ndim == 4 else None)
    x, w = _promote(x, w)
    b = as_tensor(b)
    if b.ndim != 1 or w.ndim < 1 or b.shape[0] != w.shape[0]:
        raise ShapeError(f"`conv2d_bias_act`: the bias must have shape ({w.shape[0] if w.ndim else '?'},) "
                         f"(one entry per output channel of w {w.shape}), got {b.shape}")
    if b.dtype != x.dtype:  # promote as conv2d(x, w) + b would
        b = _floating(b, "conv2d_bias_act")
        x, b = _promote(x, b)
        w = cast(w, x.dtype)
    return apply(_P["conv2d_bias_act"], (x, w, b),
                 {"stride": pair(stride, "stride"), "padding": quad(padding),
                  "dilation": pair(dilation, "dilation"), "groups": int(groups),
                  "activation": activation}, "conv2d_bias_act")


def conv_transpose2d(x, w, *, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """The adjoint of ``conv2d``: ``x`` (N, C, H, W), ``w`` (C, O/groups, kh, kw)."""
    w = _floating(w, "conv_transpose2d")
    x = _spatial_input("conv_transpose2d", x, w.shape[0] if w.ndim == 4 else None)
    x, w = _promote(x, w)
    return apply(_P["conv_transpose2d"], (x, w),
                 {"stride": pair(stride, "stride"), "padding": quad(padding),
                  "output_padding": pair(output_padding, "output_padding"),
                  "dilation": pair(dilation, "dilation"), "groups": int(groups)}, "conv_transpose2d")


def maxpool2d(x, window, stride=None, padding=0, dilation=1, ceil_mode=False):
    """torch's ``max_pool2d`` on (N, C, H, W); ``padding`` an int, (h, w) or
    (top, bottom, left, right); ``stride`` defaults to the window."""
    x = _spatial_input("maxpool2d", x)
    window = pair(window, "window")
    return apply(_P["maxpool2d"], (x,), {"window": window, "stride": pair(stride or window, "stride"),
                                         "padding": quad(padding), "dilation": pair(dilation, "dilation"),
                                         "ceil_mode": bool(ceil_mode)}, "maxpool2d")


def meanpool2d(x, window, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """torch's ``avg_pool2d`` on (N, C, H, W) (arguments as ``maxpool2d``)."""
    x = _spatial_input("meanpool2d", x)
    window = pair(window, "window")
    return apply(_P["meanpool2d"], (x,), {"window": window, "stride": pair(stride or window, "stride"),
                                          "padding": quad(padding), "ceil_mode": bool(ceil_mode),
                                          "count_include_pad": bool(count_include_pad)}, "meanpool2d")


def adaptive_maxpool2d(x, size):
    """torch's ``adaptive_max_pool2d``: (N, C, H, W) to (N, C, *size); a
    ``None`` side keeps the input's."""
    x = _spatial_input("adaptive_maxpool2d", x)
    return apply(_P["adaptive_maxpool2d"], (x,), {"size": adaptive_size(size, x.shape)}, "adaptive_maxpool2d")


def adaptive_meanpool2d(x, size):
    """torch's ``adaptive_avg_pool2d`` (arguments as ``adaptive_maxpool2d``)."""
    x = _spatial_input("adaptive_meanpool2d", x)
    return apply(_P["adaptive_meanpool2d"], (x,), {"size": adaptive_size(size, x.shape)}, "adaptive_meanpool2d")


def adaptive_size(size, shape):
    """The (Ho, Wo) of an adaptive pooling of ``shape`` to ``size`` (an int,
    or a pair whose ``None`` entries keep the input's side)."""
    size = (size, size) if size is None or isinstance(size, (int, np.integer)) else tuple(size)
    if len(size) != 2:
        raise ShapeError(f"adaptive pooling: the output size must be an int or a pair, got {size}")
    return tuple(int(shape[2 + i]) if s is None else int(s) for i, s in enumerate(size))


def upsample(x, scale=None, mode="nearest", *, size=None, align_corners=False):
    """torch's ``F.interpolate`` (modes "nearest" and "bilinear") on (N, C, H, W):
    to ``size`` (Ho, Wo), or by ``scale`` (a number or one per axis, ints or
    floats; the output is floor(H * scale)). Neither given: ``scale=2``."""
    x = _spatial_input("upsample", x)
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"upsample mode must be 'nearest' or 'bilinear', got {mode!r}")
    if scale is None and size is None:
        scale = 2
    attrs = {"size": None if size is None else pair(size, "size"),
             "scale": None if scale is None else _scale_pair(scale)}
    if mode == "bilinear":
        attrs["align_corners"] = bool(align_corners)
    elif align_corners:
        raise ShapeError("`upsample`: align_corners applies to mode='bilinear' only; drop it or use mode='bilinear'")
    return apply(_P[f"upsample_{mode}2d"], (x,), attrs, f"upsample_{mode}2d")


def _scale_pair(scale):
    """Scale factors as a pair of Python numbers: ints stay ints (2 -> (2, 2))."""
    s = tuple(scale) if isinstance(scale, (tuple, list)) else (scale, scale)
    if len(s) != 2:
        raise ShapeError(f"`upsample`: scale must be a number or a pair, got {scale}")
    return tuple(int(v) if float(v).is_integer() else float(v) for v in s)


def batchnorm(x, gamma, beta, mean=None, var=None, eps=1e-5):
    """Batch normalisation over axis 1: with the batch's statistics when
    ``mean``/``var`` are None, else with the given ones."""
    x = _floating(x, "batchnorm")
    if x.ndim < 2:
        raise ShapeError(f"`batchnorm` expects (N, C, ...) input, got shape {x.shape}")
    if mean is None:
        return apply(_P["batchnorm_train"], (x, gamma, beta), {"eps": float(eps)}, "batchnorm")
    return apply(_P["batchnorm_test"], (x, gamma, beta, mean, var), {"eps": float(eps)}, "batchnorm")


def dropout(x, p, seed=None):
    """Zero each element with probability ``p``, scale the rest by 1/(1-p)."""
    x = _floating(x, "dropout")
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    return apply(_P["dropout"], (x,), {"p": float(p), "seed": next_seed() if seed is None else int(seed)}, "dropout")
