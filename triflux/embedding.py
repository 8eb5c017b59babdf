"""Moving rows of a table by integer indices: NNlib's ``gather`` and
``scatter`` (row-major), and torch's ``embedding`` and ``embedding_bag``.

Each function checks what it is given (an error names the function, what it
got, what it expects and the fix), then runs one registered primitive of the
``gather`` family; ``triflux/specs/gather.py`` describes the table, the two
index forms and the shapes, ``reference/gather.py`` the math. Indices are
0-based int32/int64 (NNlib's and Flux's are 1-based: index i there is i - 1
here); an index outside the table raises ``IndexRangeError`` naming the
valid range, on every device, before anything reads the table. Indices get
no gradient; the table (or src) does, with repeated indices summed in a
fixed order, the same on every run.

NumPy arrays and lists given as indices are moved to the device of the
table (NNlib does the same for a CPU index of a GPU array); a Tensor index
must already be there.
"""
import math
import numbers

import numpy as np

from . import dtypes as _dt
from .dispatch import apply, common_device
from .errors import ArgumentError, ShapeError
from .operands import cast
from .primitives import REGISTRY as _P
from .specs.gather import (EMBEDDING_BAG_MODES, SCATTER_OPS, IndexRangeError, check_index_dtype,
                           embedding_bag_spec, embedding_spec, gather_spec, scatter_spec)
from .tensor import Tensor, as_tensor, tensor, transfer

__all__ = ["gather", "scatter", "embedding", "embedding_bag", "IndexRangeError"]


def _reshape(x, shape):
    """``x`` in ``shape`` (same size; no -1), through the reshape primitive
    (this module stays below ``triflux.ops``, which re-exports it)."""
    shape = tuple(int(s) for s in shape)
    return x if x.shape == shape else apply(_P["reshape"], (x,), {"shape": shape}, "reshape")


def _table(x, who, name):
    """``x`` as a Tensor (NumPy arrays and lists become CPU Tensors)."""
    if isinstance(x, Tensor):
        return x
    try:
        return as_tensor(np.asarray(x))
    except Exception:
        raise ArgumentError(f"`{who}`: {name} must be an array of numbers, got {type(x).__name__}") from None


def _index(idx, like, who, name="idx"):
    """``idx`` as an int32/int64 Tensor on ``like``'s device: Tensors as they
    are (another device is an error, at the call), arrays and lists moved
    there (other integer types of theirs widened to int64). Floats and bools
    are refused, never rounded."""
    if isinstance(idx, Tensor):
        check_index_dtype(idx.dtype, who, name)
        return idx
    arr = np.asarray(idx)
    if arr.dtype.kind in "iu" and arr.dtype not in (np.int32, np.int64):
        arr = arr.astype(np.int64)
    check_index_dtype(arr.dtype if arr.dtype.kind != "O" else tensor(arr).dtype, who, name)
    return transfer(tensor(arr), like._device)


def _coordinates(idx, like, who):
    """NNlib's tuple indices: a tuple of M integer index arrays of one
    shape K, one per axis, stacked into the coordinate form (*K, M)."""
    parts = [_index(i, like, who) for i in idx]
    shape = parts[0].shape
    if any(p.shape != shape for p in parts):
        raise ShapeError(f"`{who}`: the index arrays of a tuple index must have one shape (one entry each), got "
                         f"{[p.shape for p in parts]}")
    dtype = _dt.int64 if any(p.dtype == _dt.int64 for p in parts) else _dt.int32
    parts = [_reshape(cast(p, dtype), shape + (1,)) for p in parts]
    return apply(_P["concat"], tuple(parts), {"axis": len(shape)}, "gather") if len(parts) > 1 else parts[0]


def _index_form(idx, like, who, coords):
    """(index Tensor, coords): a tuple of index arrays is the coordinate form."""
    if isinstance(idx, tuple) and idx and all(isinstance(i, (Tensor, np.ndarray, list)) for i in idx):
        if coords:
            raise ArgumentError(f"`{who}`: give the coordinates either as a tuple of index arrays or as one "
                                "array (*K, M) with coords=True, not both")
        return _coordinates(idx, like, who), True
    return _index(idx, like, who), bool(coords)


def gather(src, idx, *, coords=False):
    """Rows of ``src`` by integer indices, NNlib's ``gather`` in row-major
    form: ``y[k] = src[idx[k]]``.

    * ``idx`` of any shape K (ints, 0-based): rows along axis 0, ``y`` of
      shape ``K + src.shape[1:]`` (``src[idx]`` in NumPy);
    * ``coords=True``: ``idx`` of shape ``(*K, M)`` holds M coordinates per
      entry into src's first M axes, ``y`` of shape ``K + src.shape[M:]``;
      a tuple of M index arrays of one shape K (NNlib's tuple indices, NumPy's
      ``src[i, j]``) is the same. With M = src.ndim every entry picks one
      element (torch's ``gather`` along a dim builds such coordinates).

    The gradient of src adds each output gradient into the row it came from::

        gather(table, [2, 0, 2])          # rows 2, 0 and 2 of table
        gather(image, (rows, cols))       # image[rows[k], cols[k], ...]

    Math: reference/gather.py ``gather_forward``."""
    src = _table(src, "gather", "src")
    idx, coords = _index_form(idx, src, "gather", coords)
    gather_spec(src.shape, idx.shape, src.dtype, idx.dtype, coords)
    return apply(_P["gather"], (src, idx), {"coords": coords}, "gather")


#: the names of NNlib's reduction functions (and their triflux/NumPy/Python namesakes) -> op
_OP_NAMES = {"add": "add", "+": "add", "sum": "add", "mul": "mul", "*": "mul", "prod": "mul", "max": "max",
             "maximum": "max", "amax": "max", "min": "min", "minimum": "min", "amin": "min", "mean": "mean"}


def _scatter_op(op):
    name = op if isinstance(op, str) else getattr(op, "__name__", None)
    if name not in _OP_NAMES:
        raise ArgumentError(f"`scatter`: op must be one of {', '.join(map(repr, SCATTER_OPS))} (or NNlib's "
                            f"functions +, *, max, min, mean: operator.add, operator.mul, max, min, np.mean), got "
                            f"{op!r}")
    return _OP_NAMES[name]


def _default_dstsize(src, idx, coords):
    """NNlib's default: each indexed side one more than its largest index,
    then src's row shape (the largest index is read back to the host)."""
    m = idx.shape[-1] if coords else 1
    entries = idx.shape[:-1] if coords else idx.shape
    if math.prod(entries) == 0:
        raise ShapeError("`scatter`: with no indices the output's size cannot be inferred; give dstsize")
    largest = apply(_P["max"], (_reshape(idx, (math.prod(entries), m)),), {"axis": (0,), "keepdims": False},
                    "scatter").numpy()
    return tuple(int(v) + 1 for v in np.atleast_1d(largest)) + tuple(src.shape[len(entries):])


def scatter(op, src, idx, dstsize=None, *, init=None, coords=False):
    """NNlib's ``scatter(op, src, idx; init, dstsize)`` in row-major form:
    the rows of ``src`` (shape ``K + row_shape``) combined into the rows of a
    new array that ``idx`` (entries K) names,

        y[r] = op over the entries k with idx[k] = r of src[k]

    ``op``: "add", "mul", "max", "min" or "mean" (or NNlib's functions:
    ``operator.add``, ``operator.mul``, ``max``, ``min``, ``np.mean``); max and
    min propagate NaN. A row no index names holds op's initial value, 0, 1,
    -inf, +inf and 0 (mean), or ``init``, which every row also combines with
    (NNlib's: ``scatter("mul", src, idx, init=10)`` multiplies each row by 10).
    ``dstsize``: the output's shape, by default each indexed side one more
    than its largest index (that reads the indices back to the host), then
    src's row shape. ``coords`` (or a tuple of index arrays): M coordinates
    per entry, as :func:`gather`'s.

    Gradients (src): torch's scatter_reduce's with include_self=False: a sum
    hands each entry its row's gradient, a mean that over the row's count, a
    product that times the product of the row's other values, max and min to
    the entries that attain the extreme, shared evenly among ties::

        scatter("add", values, labels, (10,))   # per-class sums of the rows of values

    Math: reference/gather.py ``scatter_forward``."""
    op = _scatter_op(op)
    src = _table(src, "scatter", "src")
    idx, coords = _index_form(idx, src, "scatter", coords)
    common_device("scatter", (src, idx))
    if dstsize is None:
        dstsize = _default_dstsize(src, idx, coords)
    elif isinstance(dstsize, numbers.Integral):
        dstsize = (int(dstsize),) + tuple(src.shape[len(idx.shape) - coords:])
    else:
        dstsize = tuple(int(s) for s in dstsize)
    scatter_spec(src.shape, idx.shape, src.dtype, idx.dtype, op, dstsize, coords)
    y = apply(_P["scatter"], (src, idx), {"op": op, "dstsize": dstsize, "coords": coords}, "scatter")
    if init is None:
        return y
    init = as_tensor(init, like=y)
    combine = {"add": "add", "mean": "add", "mul": "mul", "max": "maximum", "min": "minimum"}[op]
    return apply(_P[combine], (y, init), {}, "scatter")


def _no_max_norm(who, max_norm):
    if max_norm is not None:
        raise ArgumentError(f"`{who}`: max_norm is not supported: torch's rescales the rows of the weight in place "
                            "at every call; renormalise the weight explicitly (Flux's Embedding has no max_norm)")


def embedding(input, weight, padding_idx=None, max_norm=None, scale_grad_by_freq=False, sparse=False):
    """torch's ``F.embedding(input, weight, padding_idx, ...)``: the rows of
    ``weight`` (V, D) that the integer indices ``input`` (any shape K, in
    0..V-1) name, of shape ``K + (D,)``.

    ``padding_idx`` (an int, negative counting from the end, or None): that
    row is returned as it is but gets no gradient (the Embedding layer keeps
    it zero). ``scale_grad_by_freq``: each row's gradient divided by how
    often it occurs in ``input``. Repeated indices' gradients are summed in a
    fixed order. ``sparse`` is accepted for torch's signature; gradients are
    dense either way. ``max_norm`` (torch renormalises the weight in place)
    is refused.

    Math: reference/gather.py ``embedding_forward``."""
    _no_max_norm("embedding", max_norm)
    weight = _table(weight, "embedding", "weight")
    idx = _index(input, weight, "embedding", "input")
    spec = embedding_spec(weight.shape, idx.shape, weight.dtype, idx.dtype, padding_idx, scale_grad_by_freq)
    return apply(_P["embedding"], (weight, idx), {"padding_idx": spec.padding_idx,
                                                 "scale_grad_by_freq": spec.scale_grad_by_freq}, "embedding")


def _bags_of(idx, offsets, psw, who):
    """(1-D indices, offsets, 1-D per-sample weights, the batch shape of the
    output or None): bags of equal length L along the last axis of an N-d
    index (..., L) become offsets 0, L, 2L, ...; a 1-D index without
    offsets is one bag (Flux's), whose result has shape (D,)."""
    if offsets is not None:
        if idx.ndim != 1:
            raise ShapeError(f"`{who}`: with offsets the indices must be 1-D (the bags one after the other), got "
                             f"shape {idx.shape}; for bags of equal length pass the (B, L) indices without offsets")
        return idx, offsets, psw, None
    if idx.ndim == 0:
        raise ShapeError(f"`{who}`: a bag is an array of indices, got one index (shape ()); pass [i]")
    lead, length = idx.shape[:-1], idx.shape[-1]
    bags = math.prod(lead)
    offsets = transfer(tensor(np.arange(bags, dtype=np.int64) * length), idx._device)
    flat = _reshape(idx, (bags * length,))
    if psw is not None:
        if psw.shape != idx.shape:
            raise ShapeError(f"`{who}`: per_sample_weights must have the indices' shape {idx.shape}, got "
                             f"{psw.shape}")
        psw = _reshape(psw, (bags * length,))
    return flat, offsets, psw, lead


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                  mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """torch's ``F.embedding_bag``: bags of rows of ``weight`` (V, D), each
    reduced to one row by ``mode`` ("sum", "mean", "max"; max propagates NaN,
    its gradient goes to the first entry that attains the maximum).

    * ``input`` 1-D with ``offsets`` (B,): bag b holds input[offsets[b] :
      offsets[b + 1]] (the last to the end; ``include_last_offset``: offsets
      has B + 1 entries, the last len(input)); offsets start at 0 and never
      decrease (an empty bag gives zeros). Result (B, D).
    * ``input`` (..., L) without offsets: bags of L indices along the last
      axis, result (..., D); a 1-D input without offsets is one bag, result
      (D,) (Flux's EmbeddingBag).

    ``per_sample_weights`` (input's shape; mode "sum"): each row is weighted
    before the sum, and gets a gradient. ``padding_idx``: entries naming that
    row are left out of their bag (not counted by a mean). ``max_norm`` is
    refused (torch renormalises in place), ``sparse`` accepted (dense
    gradients either way).

    Math: reference/gather.py ``embedding_bag_forward``."""
    _no_max_norm("embedding_bag", max_norm)
    who = "embedding_bag"
    weight = _table(weight, who, "weight")
    idx = _index(input, weight, who, "input")
    if offsets is not None:
        offsets = _index(offsets, weight, who, "offsets")
    psw = None if per_sample_weights is None else _table(per_sample_weights, who, "per_sample_weights")
    idx, offsets, psw, lead = _bags_of(idx, offsets, psw, who)
    if mode not in EMBEDDING_BAG_MODES:
        mode = getattr(mode, "__name__", mode)
        mode = {"add": "sum", "amax": "max", "maximum": "max"}.get(mode, mode)
    inputs = (weight, idx, offsets) + (() if psw is None else (psw,))
    spec = embedding_bag_spec(weight.shape, idx.shape, offsets.shape, None if psw is None else psw.shape,
                              weight.dtype, idx.dtype, offsets.dtype, None if psw is None else psw.dtype, mode,
                              padding_idx, include_last_offset, scale_grad_by_freq)
    y = apply(_P["embedding_bag"], inputs, {"mode": spec.mode, "padding_idx": spec.padding_idx,
                                            "include_last_offset": spec.include_last_offset,
                                            "scale_grad_by_freq": spec.scale_grad_by_freq}, who)
    if lead is None:
        return y
    return _reshape(y, tuple(lead) + (weight.shape[1],))
