"""The gather family's specs: gather, scatter, embedding and embedding_bag,
the primitives that move rows of a table by integer indices, checked once.

The table. Every primitive of the family reads or writes a *table*: ``src``
for gather (read), the destination of shape ``dstsize`` for scatter
(written), the ``weight`` (V, D) of the embeddings (read; its gradient
written). An index addresses the table's first M axes, ``table_shape``; what
follows, ``row_shape``, is one *row* that moves as a whole. Flattened, the
table is a matrix of ``rows`` = prod(table_shape) rows of ``row_size`` =
prod(row_shape) values, and an index is the linear row number

    row = ((c_0 * n_1 + c_1) * n_2 + c_2) ... ,   (c_0, ..., c_{M-1}) its coordinates,
                                                   (n_0, ..., n_{M-1}) = table_shape

Two index forms (the attr ``coords``):

* ``coords=False`` (NNlib's integer indices, row-major): ``idx`` of any
  shape K holds one integer per entry, the position along axis 0 (M = 1);
* ``coords=True`` (NNlib's tuple / CartesianIndex indices): ``idx`` of shape
  (*K, M) holds M coordinates per entry, into the first M axes of the table,
  in axis order. NNlib's tuple ``(i_1, ..., i_M)`` addresses the *last* M
  axes of a column-major array; read row-major, that is ``(i_M, ..., i_1)``
  on the first M axes, 0-based. With M = the table's rank every entry is one
  element, which is how torch's elementwise ``gather``/``scatter_add``/
  ``scatter_reduce`` along a ``dim`` are expressed (the test suite's
  translations of PyTorch's samples build such coordinates).

Either way K is the *entries* shape, n = prod(K) the number of entries.
Indices are 0-based and integers (int32 or int64); each coordinate c_m must
satisfy 0 <= c_m < n_m. The range is checked on the values, before any work
reads the table (the reference with NumPy, the kernels with a small
reduction whose result the host reads): :meth:`Table.check_range` raises
:class:`IndexRangeError`, naming the valid range.

Shapes per primitive (inputs first):

* ``gather(src, idx)``: out = K + src.shape[M:], out[k] = src[idx[k]];
* ``scatter(src, idx; op, dstsize)``: src = K + row_shape, out = dstsize,
  dstsize[M:] = row_shape; out[r] = op over the entries k with idx[k] = r
  of src[k] (``SCATTER_OPS``; rows no entry reaches hold NNlib's initial
  value, ``SCATTER_INIT``);
* ``embedding(weight, idx; padding_idx, scale_grad_by_freq)``: weight (V, D),
  out = K + (D,);
* ``embedding_bag(weight, idx, offsets[, per_sample_weights]; mode,
  padding_idx, include_last_offset, scale_grad_by_freq)``: idx (n,), offsets
  (B,) or (B + 1,) (``include_last_offset``), per_sample_weights (n,), out
  (B, D): bag b holds the entries offsets[b] <= i < offsets[b + 1]
  (offsets[B] = n unless the last offset is given).
"""
import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import as_dtype, compute_dtype, is_floating
from ..errors import ArgumentError, DTypeError, IndexRangeError, ShapeError
from . import cached_on_arguments

#: the integer types an index may have
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
#: scatter's reductions (NNlib's +, *, max, min, mean)
SCATTER_OPS = ("add", "mul", "max", "min", "mean")
#: what a row of scatter's output holds when no entry reaches it (NNlib's ``scatter_empty``:
#: the identity of the reduction; mean's 0, as NNlib's safe division by a count of 0)
SCATTER_INIT = {"add": 0.0, "mul": 1.0, "max": -math.inf, "min": math.inf, "mean": 0.0}
#: embedding_bag's reductions of a bag (torch's modes)
EMBEDDING_BAG_MODES = ("sum", "mean", "max")
#: the most coordinates an index of the coordinate form may have
MAX_COORDS = 8


def check_index_dtype(dtype, who, what="idx"):
    """The index dtype ``dtype`` as a NumPy dtype, or a DTypeError: indices
    are int32 or int64 (floats are refused, never rounded)."""
    dtype = as_dtype(dtype)
    if dtype in INDEX_DTYPES:
        return dtype
    if is_floating(dtype):
        raise DTypeError(f"`{who}`: the indices `{what}` must be integers (int32 or int64), got {dtype}; a float is "
                         f"never rounded to an index: convert whole-number indices with `{what}.astype('int64')`"
                         + (" (the Embedding layer takes a float one-hot input (..., vocab_size) instead)"
                            if who == "embedding" else ""))
    if dtype.kind in "iu":
        raise DTypeError(f"`{who}`: the indices `{what}` must be int32 or int64, got {dtype}: convert them with "
                         f"`{what}.astype('int64')`")
    raise DTypeError(f"`{who}`: the indices `{what}` must be integers (int32 or int64), got {dtype}"
                     + (" (a boolean mask is not an index: use the positions of its True entries)"
                        if dtype.kind == "b" else ""))


def _check_values(dtype, who, what, floating=True):
    dtype = as_dtype(dtype)
    if floating and not is_floating(dtype):
        raise DTypeError(f"`{who}`: `{what}` must be floating point (float32, float64, float16 or bfloat16), "
                         f"got {dtype}: convert it with `{what}.astype('float32')`")
    if not floating and dtype.kind not in "fiuV":
        raise DTypeError(f"`{who}`: `{what}` must hold numbers, got {dtype}")
    return dtype


def _shape(shape):
    return tuple(int(s) for s in shape)


@dataclass(frozen=True)
class Table:
    """The table an index addresses (see the module docstring): its first
    ``len(table_shape)`` axes are indexed, ``row_shape`` moves as one row."""
    table_shape: tuple
    row_shape: tuple
    #: what the messages call the indexed axes ("the rows of src", "the vocabulary")
    name: str = "the table"

    @property
    def ncoords(self):
        """M: the coordinates of one index."""
        return len(self.table_shape)

    @property
    def rows(self):
        """prod(table_shape): the rows of the flattened table."""
        return math.prod(self.table_shape)

    @property
    def row_size(self):
        """prod(row_shape): the values of one row."""
        return math.prod(self.row_shape)

    def multipliers(self):
        """The linear row of coordinates c is sum c_m * multipliers[m]."""
        out, step = [], 1
        for n in reversed(self.table_shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

    def check_range(self, who, lows, highs):
        """Raise :class:`IndexRangeError` unless lows[m] >= 0 and highs[m] <
        table_shape[m] for every coordinate m (``lows``/``highs``: the least
        and the largest value of each coordinate over the entries)."""
        for m, (lo, hi, n) in enumerate(zip(lows, highs, self.table_shape)):
            lo, hi = int(lo), int(hi)
            if lo >= 0 and hi < n:
                continue
            bad = lo if lo < 0 else hi
            axis = f" (coordinate {m}, axis {m} of size {n})" if self.ncoords > 1 else ""
            valid = f"0 to {n - 1}" if n > 0 else "none: the axis is empty"
            hint = (" Indices are 0-based (NNlib's and Flux's 1-based index i is i - 1 here)" if bad == n else
                    " Negative indices do not count from the end here, as in torch's gather" if bad < 0 else "")
            raise IndexRangeError(f"`{who}`: index {bad} is outside {self.name}{axis}: the valid indices are "
                                  f"{valid}.{hint}.")


def _index_form(who, idx_shape, coords, rank, what):
    """(K, M): the entries shape and the coordinates of an index of
    ``idx_shape`` into a table of ``rank`` axes (``what`` names it)."""
    if not coords:
        if rank < 1:
            raise ShapeError(f"`{who}`: {what} must have at least one axis to index, got a 0-d one; "
                             "reshape it to (1,) first")
        return idx_shape, 1
    if len(idx_shape) < 1 or idx_shape[-1] < 1:
        raise ShapeError(f"`{who}` with coords=True takes idx of shape (*K, M), M >= 1 coordinates per entry on "
                         f"its last axis, got shape {idx_shape}")
    m = idx_shape[-1]
    if m > rank or m > MAX_COORDS:
        raise ShapeError(f"`{who}`: idx has {m} coordinates per entry (its last axis, shape {idx_shape}), but "
                         f"{what} has {rank} axes" + (f" (at most {MAX_COORDS} coordinates)" if m > MAX_COORDS
                                                      else "") + "; give at most one coordinate per axis")
    return idx_shape[:-1], m


@dataclass(frozen=True)
class GatherSpec:
    """``gather(src, idx)``: out[k] = src[idx[k]] (rows of src)."""
    src_shape: tuple
    idx_shape: tuple
    dtype: object
    idx_dtype: object
    coords: bool
    entries_shape: tuple
    table: Table
    out_shape: tuple

    @property
    def compute_dtype(self):
        return compute_dtype(self.dtype)

    @property
    def entries(self):
        """n: the indices (entries) of idx."""
        return math.prod(self.entries_shape)


@cached_on_arguments
def gather_spec(src_shape, idx_shape, dtype, idx_dtype, coords=False, who="gather"):
    """The spec of ``gather(src, idx)``; raises DTypeError for indices that
    are not int32/int64 (or a src that holds no numbers), ShapeError for an
    index form that does not fit src."""
    src_shape, idx_shape = _shape(src_shape), _shape(idx_shape)
    dtype = _check_values(dtype, who, "src", floating=False)
    idx_dtype = check_index_dtype(idx_dtype, who)
    coords = bool(coords)
    entries, m = _index_form(who, idx_shape, coords, len(src_shape), "src")
    table = Table(src_shape[:m], src_shape[m:], "the rows of src" if not coords else "src")
    return GatherSpec(src_shape, idx_shape, dtype, idx_dtype, coords, entries, table,
                      entries + src_shape[m:])


@dataclass(frozen=True)
class ScatterSpec:
    """``scatter(src, idx; op, dstsize)``: out[r] = op over the entries k with idx[k] = r of src[k]."""
    src_shape: tuple
    idx_shape: tuple
    dtype: object
    idx_dtype: object
    op: str
    coords: bool
    entries_shape: tuple
    table: Table
    out_shape: tuple

    @property
    def compute_dtype(self):
        return compute_dtype(self.dtype)

    @property
    def entries(self):
        return math.prod(self.entries_shape)

    @property
    def init(self):
        """What a row no entry reaches holds (``SCATTER_INIT``)."""
        return SCATTER_INIT[self.op]


@cached_on_arguments
def scatter_spec(src_shape, idx_shape, dtype, idx_dtype, op, dstsize, coords=False, who="scatter"):
    """The spec of ``scatter(src, idx; op, dstsize)``: ``op`` one of
    ``SCATTER_OPS``; ``dstsize`` the output's shape, whose first M sides are
    the table the indices address and whose rest must be src's shape after
    the entries' (NNlib's ``dstsize``)."""
    src_shape, idx_shape = _shape(src_shape), _shape(idx_shape)
    dtype = _check_values(dtype, who, "src")
    idx_dtype = check_index_dtype(idx_dtype, who)
    if op not in SCATTER_OPS:
        raise ArgumentError(f"`{who}`: op must be one of {', '.join(map(repr, SCATTER_OPS))} (NNlib's +, *, max, "
                            f"min, mean), got {op!r}")
    if dstsize is None or isinstance(dstsize, (str, bytes)) or not hasattr(dstsize, "__len__"):
        raise ShapeError(f"`{who}`: the primitive needs dstsize, the output's shape as a tuple of ints, got "
                         f"{dstsize!r} (ops.scatter takes its default from the largest index)")
    dstsize = _shape(dstsize)
    if any(s < 0 for s in dstsize):
        raise ShapeError(f"`{who}`: dstsize must hold sizes >= 0, got {dstsize}")
    coords = bool(coords)
    entries, m = _index_form(who, idx_shape, coords, len(dstsize), "the output (dstsize)")
    rest = dstsize[m:]
    if src_shape != entries + rest:
        k = len(entries)
        raise ShapeError(f"`{who}`: src must have shape idx's entries {entries} followed by the row shape "
                         f"dstsize[{m}:] = {rest}, that is {entries + rest}, got {src_shape}"
                         + (f" (src's rows are {src_shape[k:]}: give dstsize = (..., *{src_shape[k:]}))"
                            if src_shape[:k] == entries else ""))
    table = Table(dstsize[:m], rest, "the rows of the output (dstsize)" if not coords else "the output (dstsize)")
    return ScatterSpec(src_shape, idx_shape, dtype, idx_dtype, op, coords, entries, table, dstsize)


def _padding(who, padding_idx, vocab):
    """padding_idx as an int in 0..V-1 (a negative one counts from the end, as torch's), or None."""
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)):
        raise ArgumentError(f"`{who}`: padding_idx must be an int or None, got {padding_idx!r}")
    p = int(padding_idx)
    if not -vocab <= p < vocab:
        raise ArgumentError(f"`{who}`: padding_idx {p} is outside the vocabulary of {vocab} rows: give one in "
                            f"0 to {vocab - 1} (or -{vocab} to -1, counting from the end)")
    return p % vocab


def _weight(who, weight_shape, dtype):
    weight_shape = _shape(weight_shape)
    if len(weight_shape) != 2:
        raise ShapeError(f"`{who}`: the weight must be (vocab_size, dim), got shape {weight_shape}")
    return weight_shape, _check_values(dtype, who, "weight")


@dataclass(frozen=True)
class EmbeddingSpec:
    """``embedding(weight, idx)``: out[k] = weight[idx[k]]; rows at padding_idx get no gradient."""
    weight_shape: tuple
    idx_shape: tuple
    dtype: object
    idx_dtype: object
    padding_idx: object          #: None or an int in 0..V-1
    scale_grad_by_freq: bool
    table: Table
    out_shape: tuple

    @property
    def compute_dtype(self):
        return compute_dtype(self.dtype)

    @property
    def entries(self):
        return math.prod(self.idx_shape)


@cached_on_arguments
def embedding_spec(weight_shape, idx_shape, dtype, idx_dtype, padding_idx=None, scale_grad_by_freq=False,
                   who="embedding"):
    """The spec of ``embedding(weight, idx)``: weight (V, D), idx of any shape."""
    weight_shape, dtype = _weight(who, weight_shape, dtype)
    idx_dtype = check_index_dtype(idx_dtype, who)
    v, d = weight_shape
    table = Table((v,), (d,), f"the vocabulary ({v} rows of the weight)")
    return EmbeddingSpec(weight_shape, _shape(idx_shape), dtype, idx_dtype, _padding(who, padding_idx, v),
                         bool(scale_grad_by_freq), table, _shape(idx_shape) + (d,))


@dataclass(frozen=True)
class EmbeddingBagSpec:
    """``embedding_bag(weight, idx, offsets[, per_sample_weights])``: out[b]
    = the mode's reduction of weight[idx[i]] over the entries i of bag b."""
    weight_shape: tuple
    entries: int
    bags: int
    dtype: object
    mode: str
    per_sample_weights: bool
    padding_idx: object
    include_last_offset: bool
    scale_grad_by_freq: bool
    table: Table

    @property
    def compute_dtype(self):
        return compute_dtype(self.dtype)

    @property
    def out_shape(self):
        return (self.bags, self.weight_shape[1])

    def check_offsets(self, offsets, who="embedding_bag"):
        """Raise IndexRangeError unless ``offsets`` (NumPy) start at 0, never
        decrease and end at most at n = len(idx) (torch's rules); with
        ``include_last_offset`` the last one must be n itself (the CSR layout
        torch documents; its CPU kernel ends the last bag at n whatever it says)."""
        offsets = np.asarray(offsets).astype(np.int64)
        if offsets.size == 0:
            return
        if offsets[0] != 0:
            raise IndexRangeError(f"`{who}`: offsets[0] must be 0 (the first bag starts at the first index), got "
                                  f"{int(offsets[0])}")
        steps = np.diff(offsets)
        if steps.size and steps.min() < 0:
            at = int(np.argmax(steps < 0))
            raise IndexRangeError(f"`{who}`: offsets must not decrease (each is where a bag starts), but offsets["
                                  f"{at}] = {int(offsets[at])} > offsets[{at + 1}] = {int(offsets[at + 1])}")
        if offsets[-1] > self.entries:
            raise IndexRangeError(f"`{who}`: the last offset {int(offsets[-1])} is past the end of idx, which holds "
                                  f"{self.entries} indices")
        if self.include_last_offset and offsets[-1] != self.entries:
            raise IndexRangeError(f"`{who}`: with include_last_offset=True the last offset is the end of the last "
                                  f"bag, len(idx) = {self.entries} (torch's CSR layout), got {int(offsets[-1])}; "
                                  "drop the indices past it, or set the last offset to len(idx)")


@cached_on_arguments
def embedding_bag_spec(weight_shape, idx_shape, offsets_shape, psw_shape, dtype, idx_dtype, offsets_dtype,
                       psw_dtype=None, mode="mean", padding_idx=None, include_last_offset=False,
                       scale_grad_by_freq=False, who="embedding_bag"):
    """The spec of ``embedding_bag``: weight (V, D), idx (n,), offsets (B,)
    (or (B + 1,) with ``include_last_offset``), per_sample_weights (n,) or
    None (``psw_shape`` None; only for mode "sum", as torch)."""
    weight_shape, dtype = _weight(who, weight_shape, dtype)
    idx_shape, offsets_shape = _shape(idx_shape), _shape(offsets_shape)
    check_index_dtype(idx_dtype, who)
    check_index_dtype(offsets_dtype, who, "offsets")
    if mode not in EMBEDDING_BAG_MODES:
        raise ArgumentError(f"`{who}`: mode must be one of {', '.join(map(repr, EMBEDDING_BAG_MODES))}, got {mode!r}")
    if len(idx_shape) != 1:
        raise ShapeError(f"`{who}`: the primitive takes 1-D indices with offsets, got idx of shape {idx_shape} "
                         "(ops.embedding_bag and EmbeddingBag take (B, L) bags of equal length too)")
    if len(offsets_shape) != 1:
        raise ShapeError(f"`{who}`: offsets must be 1-D (where each bag starts), got shape {offsets_shape}")
    include_last_offset = bool(include_last_offset)
    bags = offsets_shape[0] - include_last_offset
    if bags < 0:
        raise ShapeError(f"`{who}`: with include_last_offset=True offsets holds B + 1 entries (the last is the end "
                         "of the last bag), got none")
    if psw_shape is not None:
        psw_shape = _shape(psw_shape)
        if mode != "sum":
            raise ArgumentError(f"`{who}`: per_sample_weights are only for mode 'sum' (as torch), got mode {mode!r}")
        if psw_shape != idx_shape:
            raise ShapeError(f"`{who}`: per_sample_weights must have idx's shape {idx_shape}, got {psw_shape}")
        if as_dtype(psw_dtype) != dtype:
            raise DTypeError(f"`{who}`: per_sample_weights must have the weight's dtype {dtype}, got "
                             f"{as_dtype(psw_dtype)}: convert them with `.astype('{dtype}')`")
    v, d = weight_shape
    table = Table((v,), (d,), f"the vocabulary ({v} rows of the weight)")
    return EmbeddingBagSpec(weight_shape, idx_shape[0], bags, dtype, mode, psw_shape is not None,
                            _padding(who, padding_idx, v), include_last_offset, bool(scale_grad_by_freq), table)


def gather_flops(name, direction, inputs, out_shape, attrs, largest):
    """The floating-point operations of a call (the kernel report's roofline):
    gather and embedding copy forward (0) and add each gradient value into its
    row backward (one per value of the output); scatter combines each src
    value once forward and once backward (twice for mul, whose gradient takes
    products of the others); embedding_bag combines each gathered value once
    (twice with per-sample weights) forward and spreads it back with as many
    (plus the per-sample weights' dot products)."""
    def size(shape):
        return math.prod(shape) if shape is not None else 0
    if name in ("gather", "embedding"):
        return 0 if direction == "forward" else size(out_shape)
    if name == "scatter":
        values = size(inputs[0])
        return values * (2 if attrs.get("op") == "mul" and direction == "backward" else 1)
    # embedding_bag: every entry's row of D values
    entries = size(inputs[1])
    d = inputs[0][1] if len(inputs[0]) == 2 else 1
    weighted = len(inputs) > 3 and inputs[3] is not None
    return entries * d * ((2 if weighted else 1) if direction == "forward" else (3 if weighted else 1))
