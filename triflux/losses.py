"""Loss functions (``Flux.Losses``), one-hot encoding and decoding.

Every loss is built from ``triflux.ops``, so it differentiates with
``gradient`` and runs on whichever device ``ŷ`` and ``y`` live on (the NumPy
reference on the CPU, the Triton kernels on a GPU).

Conventions, as in Flux:

* ``agg`` reduces the elementwise (or per-sample) losses: ``mean`` by default;
  ``"mean"``, ``"sum"``, ``"none"``, ``mean``/``sum`` functions or any callable
  taking a Tensor are accepted.
* ``dims`` is the class axis of the classification losses: by default 1 for
  batched input ``(N, C, ...)`` (batch first; Flux's ``dims=1`` on its
  ``(C, N)`` layout is the same memory order) and 0 for one unbatched vector.
* ``ŷ`` (the prediction) and ``y`` (the target) must have the same shape;
  integer class labels must be one-hot encoded first
  (``onehotbatch(labels, classes)``).
"""
import builtins
import numbers

import numpy as np

from . import dtypes as _dt
from . import ops
from .activations import class_axis
from .arguments import is_int, normalize_axis
from .devices import as_device, move_code
from .errors import ArgumentError, DeviceMismatchError, ShapeError
from .tensor import Tensor, torch_to_numpy, as_tensor, transfer

__all__ = ["mse", "mae", "crossentropy", "logitcrossentropy", "binarycrossentropy",
           "logitbinarycrossentropy", "dice_coeff_loss", "onehotbatch", "onecold"]


# --- helpers ---------------------------------------------------------------------------------

def _identity(x):
    return x


def _aggregator(agg, name):
    """The reduction named by ``agg``."""
    if agg is None or (isinstance(agg, str) and agg == "mean") or agg is ops.mean or agg is np.mean:
        return ops.mean
    if (isinstance(agg, str) and agg == "sum") or agg is builtins.sum or agg is ops.sum or agg is np.sum:
        return ops.sum
    if isinstance(agg, str) and agg in ("none", "identity"):
        return _identity
    if isinstance(agg, str):
        raise ValueError(f"`{name}`: unknown agg={agg!r}; use 'mean', 'sum', 'none' or a function")
    if not callable(agg):
        raise TypeError(f"`{name}`: agg must be 'mean', 'sum', 'none' or a function of a Tensor, got {agg!r}")
    return agg


def epseltype(dtype):
    """Machine epsilon of a floating dtype (Flux's ``epseltype``):
    1.19e-7 for float32, 2.2e-16 for float64, 9.8e-4 for float16, 7.8e-3 for bfloat16."""
    dtype = _dt.as_dtype(dtype)
    if _dt.is_bfloat16(dtype):
        import ml_dtypes
        return float(ml_dtypes.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def _as_tensor(x, name, what):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return Tensor._from_numpy(x)
    if isinstance(x, (list, tuple)):
        return as_tensor(np.asarray(x))
    raise TypeError(f"`{name}`: {what} must be a Tensor or an array, got {type(x).__name__}")


def _check_device(name, yhat, y):
    if y._device is not yhat._device and y._device != yhat._device:
        raise DeviceMismatchError(
            f"`{name}`: the prediction ŷ is on {yhat._device!r} but the target y is on {y._device!r}. "
            f"Put both on one device: `{move_code(yhat._device, 'y')}` moves the target to the prediction's "
            "device (move data with the same device object as the model).")


def _prepare(name, yhat, y, *, labels_hint=False):
    """Check and convert ``(ŷ, y)``: Tensors, one device, one floating dtype
    (ŷ's), equal shapes, non-empty. Errors name the loss and both shapes."""
    yhat = _as_tensor(yhat, name, "the prediction ŷ")
    if not _dt.is_floating(yhat.dtype):
        yhat = ops.cast(yhat, _dt.DEFAULT_FLOAT)
    if isinstance(y, (bool, int, float, np.number, np.bool_)):
        y = as_tensor(y, like=yhat)          # a scalar target broadcasts
        scalar_target = True
    else:
        y = _as_tensor(y, name, "the target y")
        scalar_target = False
    _check_device(name, yhat, y)
    if labels_hint and y.dtype.kind in "iu" and y.shape != yhat.shape:
        raise ShapeError(
            f"`{name}`: the target y looks like integer class indices (dtype {y.dtype}, shape {y.shape}) "
            f"but the prediction ŷ has shape {yhat.shape}. {name} takes one-hot (or probability) targets "
            f"of ŷ's shape: one-hot them first with `triflux.onehotbatch(labels, classes)` "
            f"(e.g. `onehotbatch(y, range(num_classes))`).")
    if not scalar_target and y.shape != yhat.shape:
        hint = ""
        if labels_hint and yhat.ndim >= 1 and y.ndim == yhat.ndim - 1:
            hint = (" If y holds class indices, one-hot them first with "
                    "`triflux.onehotbatch(labels, classes)`.")
        raise ShapeError(
            f"`{name}`: the prediction ŷ has shape {yhat.shape} but the target y has shape {y.shape}; "
            f"a loss needs them to be the same shape (Flux: size(ŷ) == size(y)).{hint}")
    if yhat.size == 0:
        raise ShapeError(
            f"`{name}`: the batch is empty (ŷ has shape {yhat.shape}); a loss over no samples is "
            "undefined. Check the slicing or the DataLoader that produced this batch.")
    if y.dtype != yhat.dtype:
        y = ops.cast(y, yhat.dtype)
    return yhat, y


def _class_axis(name, yhat, dims):
    d = class_axis(yhat, dims)
    return normalize_axis(d, builtins.max(yhat.ndim, 1), name)


def _xlogy(x, y):
    """x·log(y), defined as 0 where x == 0 (Flux's ``xlogy``)."""
    return ops.where(x == 0, 0, x * ops.log(y))


# --- regression -------------------------------------------------------------------------------

def mse(yhat, y, *, agg="mean"):
    """Mean squared error: ``agg((ŷ - y)²)``.

    >>> mse(tensor([1.1, 1.9, 3.1]), tensor([1.0, 2.0, 3.0]))   # ≈ 0.01
    """
    yhat, y = _prepare("mse", yhat, y)
    d = yhat - y
    return _aggregator(agg, "mse")(d * d)


def mae(yhat, y, *, agg="mean"):
    """Mean absolute error: ``agg(|ŷ - y|)``."""
    yhat, y = _prepare("mae", yhat, y)
    return _aggregator(agg, "mae")(ops.abs(yhat - y))


# --- classification ------------------------------------------------------------------------------

def crossentropy(yhat, y, *, dims=None, agg="mean", eps=None):
    """Cross entropy between probability distributions along the class axis:
    ``agg(-sum(xlogy(y, ŷ + ϵ); dims))`` with ``ϵ = eps(eltype(ŷ))``.

    ``ŷ`` holds probabilities (e.g. a ``softmax`` output) and ``y`` one-hot
    or probability targets of the same shape; prefer ``logitcrossentropy``
    on logits, which is more stable. As Flux's and torch's ``nll_loss``, it
    does not check that ``ŷ`` holds probabilities (that would wait for the
    device on every call): given logits it returns NaN (``train`` then stops
    with ``NonFiniteError``) or a meaningless value."""
    yhat, y = _prepare("crossentropy", yhat, y, labels_hint=True)
    d = _class_axis("crossentropy", yhat, dims)
    e = epseltype(yhat.dtype) if eps is None else float(eps)
    per_sample = -ops.sum(_xlogy(y, yhat + e), axis=d, keepdims=True)
    return _aggregator(agg, "crossentropy")(per_sample)


def logitcrossentropy(yhat, y, *, dims=None, agg="mean"):
    """Cross entropy on logits: ``agg(-sum(y .* logsoftmax(ŷ; dims); dims))``,
    equal to ``crossentropy(softmax(ŷ), y)`` but numerically stable."""
    yhat, y = _prepare("logitcrossentropy", yhat, y, labels_hint=True)
    d = _class_axis("logitcrossentropy", yhat, dims)
    per_sample = -ops.sum(y * ops.logsoftmax(yhat, d), axis=d, keepdims=True)
    return _aggregator(agg, "logitcrossentropy")(per_sample)


def binarycrossentropy(yhat, y, *, agg="mean", eps=None):
    """Binary cross entropy of probabilities ``ŷ`` against targets ``y`` in [0, 1]:
    ``agg(-xlogy(y, ŷ + ϵ) - xlogy(1 - y, 1 - ŷ + ϵ))``."""
    yhat, y = _prepare("binarycrossentropy", yhat, y)
    e = epseltype(yhat.dtype) if eps is None else float(eps)
    loss = -_xlogy(y, yhat + e) - _xlogy(1 - y, (1 - yhat) + e)
    return _aggregator(agg, "binarycrossentropy")(loss)


def logitbinarycrossentropy(yhat, y, *, agg="mean"):
    """Binary cross entropy on logits, stable for any logit:
    ``agg((1 - y)·ŷ - logσ(ŷ)) = agg((1 - y)·ŷ + softplus(-ŷ))``."""
    yhat, y = _prepare("logitbinarycrossentropy", yhat, y)
    loss = (1 - y) * yhat + ops.softplus(-yhat)
    return _aggregator(agg, "logitbinarycrossentropy")(loss)


def dice_coeff_loss(yhat, y, *, smooth=1.0):
    """Dice coefficient loss (V-Net), over the whole batch:
    ``1 - (2·sum(y .* ŷ) + smooth) / (sum(y²) + sum(ŷ²) + smooth)``."""
    yhat, y = _prepare("dice_coeff_loss", yhat, y)
    s = float(smooth)
    num = 2 * ops.sum(y * yhat) + s
    den = ops.sum(y * y) + ops.sum(yhat * yhat) + s
    return 1 - num / den


# --- one-hot encoding -------------------------------------------------------------------------------

def _host_labels(labels):
    if isinstance(labels, Tensor):
        return labels.numpy(), labels._device
    if type(labels).__module__.startswith("torch"):
        return torch_to_numpy(labels), None
    return np.asarray(labels), None


def onehotbatch(labels, classes, *, default=None, dtype=_dt.float32, device=None):
    """One-hot encode ``labels`` against ``classes``: an ``(N, C)`` float32
    Tensor with ``out[i, j] = 1`` where ``labels[i] == classes[j]`` (Flux's
    ``onehotbatch``, batch first).

    ``classes`` is any sequence of class labels (``range(10)``, ``"abc"``,
    ``["cat", "dog"]``), or an int ``C`` meaning ``range(C)``. A label not in
    ``classes`` raises, unless ``default`` names the class to use instead.
    The result lives on ``labels``' device when ``labels`` is a Tensor (or on
    ``device`` if given), else on the CPU. Labels of any shape ``S`` give
    ``S + (C,)``."""
    if is_int(classes):
        if classes < 1:
            raise ArgumentError(f"onehotbatch: classes must be a number of classes (an int >= 1) or a sequence "
                                f"of labels, got {classes!r}")
        classes = range(int(classes))
    elif isinstance(classes, (bool, np.bool_, numbers.Number)) or not hasattr(classes, "__iter__"):
        raise ArgumentError(f"onehotbatch: classes must be a number of classes (an int >= 1) or a sequence of "
                            f"labels (range(10), ['cat', 'dog']), got {classes!r} ({type(classes).__name__})")
    classes = list(classes)
    if not classes:
        raise ValueError("onehotbatch: `classes` is empty; pass the list of class labels, e.g. range(10)")
    host, dev = _host_labels(labels)
    index = {}
    for j, c in enumerate(classes):
        index.setdefault(c.item() if isinstance(c, np.generic) else c, j)
    if default is not None and default not in index:
        raise ValueError(f"onehotbatch: default={default!r} is not one of the classes {classes}")
    flat = host.reshape(-1)
    cols = np.empty(flat.shape[0], dtype=np.int64)
    for i, v in enumerate(flat.tolist()):
        j = index.get(v)
        if j is None:
            if default is None:
                raise ValueError(f"onehotbatch: label {v!r} (at position {i}) is not one of the classes "
                                 f"{classes}; pass `default=` to map unknown labels to a class")
            j = index[default]
        cols[i] = j
    out = np.zeros((flat.shape[0], len(classes)), dtype=_dt.as_dtype(dtype))
    out[np.arange(flat.shape[0]), cols] = 1
    out = out.reshape(tuple(host.shape) + (len(classes),))
    t = Tensor._from_numpy(out)
    target = as_device(device) if device is not None else dev
    return transfer(t, target) if target is not None else t


def onecold(y, classes=None, *, dims=None):
    """The inverse of ``onehotbatch``: the class with the largest score along
    the class axis (``dims``; 1 for batched ``(N, C, ...)``, 0 for one vector),
    as a NumPy array of labels from ``classes`` (of indices when ``classes``
    is None). Works on Tensors on any device and on NumPy arrays."""
    if isinstance(y, Tensor):
        host = y.numpy()
    else:
        host = np.asarray(y)
    if host.dtype.name == "bfloat16" or host.dtype == np.float16:
        host = host.astype(np.float32)
    if host.ndim == 0:
        raise ShapeError("onecold needs at least one dimension (the class axis), got a 0-d array")
    d = dims if dims is not None else (1 if host.ndim >= 2 else 0)
    d = normalize_axis(d, host.ndim, "onecold")
    if host.shape[d] == 0:
        raise ShapeError(f"onecold: the class axis {d} of shape {host.shape} is empty")
    idx = np.argmax(host, axis=d)
    if classes is None:
        return idx
    if isinstance(classes, (int, np.integer)):
        classes = range(int(classes))
    if isinstance(classes, str):
        classes = list(classes)
    classes = list(classes)
    if len(classes) != host.shape[d]:
        raise ShapeError(f"onecold: {len(classes)} classes given but the class axis {d} has "
                         f"{host.shape[d]} entries (shape {host.shape})")
    return np.asarray(classes)[idx]
