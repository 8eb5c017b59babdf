"""Gather family, NumPy reference: gather, scatter, embedding, embedding_bag.

Every primitive moves *rows* of a *table* by integer indices
(``triflux/specs/gather.py`` defines the table, the two index forms and the
shapes): flattened, the table is a matrix T of ``rows`` x ``row_size``, and
entry k of the index (one integer, or M coordinates with ``coords=True``)
names the row r_k of T. Indices are 0-based int32/int64 and checked against
the table before anything is read (``IndexRangeError`` names the range).

Forward and backward are each other's adjoints:

    gather       y_k = T[r_k]                       dT[r] = sum over {k : r_k = r} of dy_k
    scatter add  y[r] = sum over {k : r_k = r} x_k   dx_k = dy[r_k]

so every backward of a gather and every forward of a scatter is a
*segmented reduction*: each row combines the entries that name it, one at a
time in ascending k, starting from the reduction's initial value
(:func:`_segment_reduce`).
The kernels reduce in the very same order (a stable sort of the entries by
row, then a sequential loop over each row's group), so with a float32 (or
float64) accumulator both sides add the same numbers in the same order, bit
for bit, and a repeated index is summed exactly the same way on every run:
no atomics, no order that depends on timing.

16-bit values are reduced in float32 and rounded once at the end
(``triflux.dtypes.compute_dtype``); float64 stays float64.
"""
import numpy as np

from ..specs.gather import (SCATTER_INIT, embedding_bag_spec, embedding_spec, gather_spec, scatter_spec)
from ._util import in_compute_dtype

_REDUCERS = {"add": np.add, "mean": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


# --- shared pieces -----------------------------------------------------------------------------

def _entry_rows(idx, table, who, coords):
    """The row r_k of every entry k of ``idx`` (int64, (n,)), after checking
    each coordinate against the table (``Table.check_range``)."""
    idx = np.asarray(idx)
    c = idx.reshape(-1, table.ncoords) if coords else idx.reshape(-1, 1)
    if c.shape[0]:
        table.check_range(who, c.min(axis=0), c.max(axis=0))
    c = c.astype(np.int64, copy=False)
    if table.ncoords == 1:
        return c[:, 0].copy()
    return c @ np.asarray(table.multipliers(), dtype=np.int64)


def _matrix(a, rows, row_size):
    """``a`` viewed (or copied) as the (rows, row_size) matrix of its table."""
    return np.reshape(a, (rows, row_size))


def _segments(rows):
    """The entries grouped by row: ``order`` (a stable argsort of ``rows``:
    within a group the entries keep their order), the rows that receive
    entries (ascending), where each group starts in ``order`` and its size."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    n = sorted_rows.size
    if n == 0:
        empty = np.zeros(0, np.int64)
        return order, empty, empty, empty
    starts = np.concatenate(([0], np.flatnonzero(sorted_rows[1:] != sorted_rows[:-1]) + 1))
    counts = np.diff(np.append(starts, n))
    return order, sorted_rows[starts], starts, counts


def _segment_reduce(values, rows, n_rows, op):
    """out[r] = op over the entries k with rows[k] = r of values[k] (a
    (n, F) matrix), in ascending k: a sum (add), product (mul), maximum or
    minimum (NaN wins), or mean (the sum divided by the count). A row no
    entry reaches holds op's initial value (``SCATTER_INIT``).

    Each row combines its entries one at a time in ascending k, from the
    initial value: exactly the kernels' sequential loop over a row's group.
    Two ways, the same numbers: the entries grouped by row (a stable sort),
    then for j = 0, 1, ... the j-th entry of every row that has one, in one
    vectorised step (fast when rows repeat evenly); or ``ufunc.at``, which
    applies the entries in index order one by one (for a few very long rows)."""
    init = SCATTER_INIT[op]
    shape = (n_rows, values.shape[1])
    out = np.zeros(shape, values.dtype) if init == 0 else np.full(shape, init, values.dtype)
    n = rows.size
    if n == 0:
        return out
    ufunc = _REDUCERS[op]
    order, present, starts, counts = _segments(rows)
    longest = int(counts.max())
    if longest * 8 > n:
        ufunc.at(out, rows, values)
    else:
        acc = np.full((present.size, values.shape[1]), init, values.dtype)
        group = np.repeat(np.arange(present.size), counts)          # each sorted entry's row, numbered
        for at in _by_position(np.arange(n) - np.repeat(starts, counts), longest):
            g = group[at]
            acc[g] = ufunc(acc[g], values[order[at]])
        out[present] = acc
    if op == "mean":
        out /= np.maximum(np.bincount(rows, minlength=n_rows), 1).astype(values.dtype)[:, None]
    return out


def _by_position(position, longest):
    """For j = 0 .. longest - 1, the entries whose ``position`` is j (a list of index arrays)."""
    order = np.argsort(position, kind="stable")
    bounds = np.searchsorted(position[order], np.arange(longest + 1))
    return [order[bounds[j]:bounds[j + 1]] for j in range(longest)]


def _product_of_others(values, rows):
    """For every entry k, the product of the values of the *other* entries
    of its row (1 for an entry alone): the exclusive prefix product times
    the exclusive suffix product along the row's entries in ascending k, so
    zeros, infinities and signs are exact (no division by x_k)."""
    order, present, starts, counts = _segments(rows)
    v = values[order]
    n = v.shape[0]
    position = np.arange(n) - np.repeat(starts, counts)            # j: the entry's place in its row
    after = np.repeat(counts, counts) - 1 - position                # entries of its row after it
    longest = int(counts.max()) if counts.size else 0
    prefix, suffix = np.ones_like(v), np.ones_like(v)
    for j, at in enumerate(_by_position(position, longest)):
        if j:
            prefix[at] = prefix[at - 1] * v[at - 1]
    for j, at in enumerate(_by_position(after, longest)):
        if j:
            suffix[at] = suffix[at + 1] * v[at + 1]
    out = np.empty_like(v)
    out[order] = prefix * suffix
    return out


# --- gather ------------------------------------------------------------------------------------

def _gather_spec(src, idx, coords):
    return gather_spec(np.shape(src), np.shape(idx), np.asarray(src).dtype, np.asarray(idx).dtype, coords)


def gather_forward(src, idx, coords=False):
    """y[k] = src[idx[k]] (NNlib's ``gather`` in row-major form): with
    integer indices idx of shape K, rows of src along axis 0, y of shape
    K + src.shape[1:]; with ``coords=True``, idx (*K, M) holds M coordinates
    per entry into src's first M axes, y of shape K + src.shape[M:]. A copy:
    values (NaN, inf) are moved, never computed on."""
    spec = _gather_spec(src, idx, coords)
    rows = _entry_rows(idx, spec.table, "gather", spec.coords)
    table = _matrix(np.asarray(src), spec.table.rows, spec.table.row_size)
    return table[rows].reshape(spec.out_shape)


def gather_backward(grad, out, src, idx, coords=False):
    """The adjoint of gather, a scatter-add of the output gradient:

        dsrc[r] = sum over the entries k with idx[k] = r of dy[k]

    (zero for rows no index names), each row's terms added in ascending k
    (the module docstring); no gradient for idx (None)."""
    spec = _gather_spec(src, idx, coords)
    rows = _entry_rows(idx, spec.table, "gather", spec.coords)
    (g,) = in_compute_dtype(np.reshape(grad, (spec.entries, spec.table.row_size)))
    dsrc = _segment_reduce(g, rows, spec.table.rows, "add")
    return dsrc.reshape(spec.src_shape).astype(spec.dtype, copy=False), None


# --- scatter -----------------------------------------------------------------------------------

def _scatter_spec(src, idx, op, dstsize, coords):
    return scatter_spec(np.shape(src), np.shape(idx), np.asarray(src).dtype, np.asarray(idx).dtype, op,
                        dstsize, coords)


def scatter_forward(src, idx, op="add", dstsize=None, coords=False):
    """NNlib's ``scatter(op, src, idx; dstsize)`` in row-major form: with
    src of shape K + row_shape and idx of entries K (integers, or M
    coordinates each with ``coords=True``), the output of shape ``dstsize``
    (= table_shape + row_shape) holds per row r

        y[r] = op over the entries k with idx[k] = r of src[k]

    op "add" (sum), "mul" (product), "max", "min" (NaN wins, as torch's
    amax/amin) or "mean" (sum / count); a row no entry reaches holds NNlib's
    initial value: 0 (add, mean), 1 (mul), -inf (max), +inf (min). The
    entries of a row are combined in ascending k."""
    spec = _scatter_spec(src, idx, op, dstsize, coords)
    rows = _entry_rows(idx, spec.table, "scatter", spec.coords)
    (v,) = in_compute_dtype(np.reshape(src, (spec.entries, spec.table.row_size)))
    out = _segment_reduce(v, rows, spec.table.rows, spec.op)
    return out.reshape(spec.out_shape).astype(spec.dtype, copy=False)


def scatter_backward(grad, out, src, idx, op="add", dstsize=None, coords=False):
    """With g = dL/dy and r = idx[k] the row of entry k (its group: the
    entries with the same row):

        add   dsrc[k] = g[r]
        mean  dsrc[k] = g[r] / (size of k's group)
        mul   dsrc[k] = g[r] * (product of src over the *other* entries of the group)
        max, min
              dsrc[k] = g[r] / t_r where src[k] = y[r] (t_r: how many entries of the
              group tie at the extreme), 0 for the others; NaN for every entry of a
              group whose result y[r] is NaN

    which are torch's scatter_reduce gradients (include_self=False): ties
    share the gradient evenly, and a NaN result gives NaN (torch's 0 * (g / 0));
    the product of the others is taken exactly (prefix times suffix products,
    no division), where torch divides y by src[k] (which differs only where
    src holds an infinity). ``out`` is the forward's output y (recomputed if None).
    No gradient for idx (None)."""
    spec = _scatter_spec(src, idx, op, dstsize, coords)
    rows = _entry_rows(idx, spec.table, "scatter", spec.coords)
    f = spec.table.row_size
    g, v = in_compute_dtype(np.reshape(grad, (spec.table.rows, f)), np.reshape(src, (spec.entries, f)))
    g_k = g[rows]
    if spec.op == "add":
        d = g_k
    elif spec.op == "mean":
        counts = np.bincount(rows, minlength=spec.table.rows).astype(g.dtype)
        d = g_k / counts[rows][:, None]
    elif spec.op == "mul":
        d = g_k * _product_of_others(v, rows)
    else:
        if out is None:
            out = scatter_forward(src, idx, op, dstsize, coords)
        (y,) = in_compute_dtype(np.reshape(out, (spec.table.rows, f)))
        y_k = y[rows]
        wins = v == y_k
        ties = _segment_reduce(wins.astype(g.dtype), rows, spec.table.rows, "add")
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(wins, g_k / ties[rows], 0.0)
        d = np.where(np.isnan(y_k), np.nan, d)
    return d.reshape(spec.src_shape).astype(spec.dtype, copy=False), None


# --- embedding ---------------------------------------------------------------------------------

def _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq):
    return embedding_spec(np.shape(weight), np.shape(idx), np.asarray(weight).dtype, np.asarray(idx).dtype,
                          padding_idx, scale_grad_by_freq)


def embedding_forward(weight, idx, padding_idx=None, scale_grad_by_freq=False):
    """y[k] = weight[idx[k]]: the rows of the table weight (V, D) named by
    idx (any shape K, integers in 0..V-1), y of shape K + (D,), as torch's
    ``F.embedding`` (the row at ``padding_idx`` is returned as it is; the
    layer keeps it zero)."""
    spec = _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq)
    rows = _entry_rows(idx, spec.table, "embedding", False)
    return np.asarray(weight)[rows].reshape(spec.out_shape)


def embedding_backward(grad, out, weight, idx, padding_idx=None, scale_grad_by_freq=False):
    """dweight[v] = sum over the entries k with idx[k] = v of dy[k] (gather's
    adjoint, repeated indices added in ascending k); with
    ``scale_grad_by_freq`` divided by how often v occurs in idx (torch's);
    dweight[padding_idx] = 0: the padding row gets no gradient. None for idx."""
    spec = _embedding_spec(weight, idx, padding_idx, scale_grad_by_freq)
    rows = _entry_rows(idx, spec.table, "embedding", False)
    v, d = spec.weight_shape
    (g,) = in_compute_dtype(np.reshape(grad, (spec.entries, d)))
    dweight = _segment_reduce(g, rows, v, "add")
    if spec.scale_grad_by_freq:
        counts = np.bincount(rows, minlength=v).astype(g.dtype)
        dweight /= np.maximum(counts, 1)[:, None]
    if spec.padding_idx is not None:
        dweight[spec.padding_idx] = 0
    return dweight.astype(spec.dtype, copy=False), None


# --- embedding_bag -----------------------------------------------------------------------------

def _bag_spec(weight, idx, offsets, per_sample_weights, mode, padding_idx, include_last_offset,
              scale_grad_by_freq):
    psw = per_sample_weights
    return embedding_bag_spec(np.shape(weight), np.shape(idx), np.shape(offsets),
                              None if psw is None else np.shape(psw), np.asarray(weight).dtype,
                              np.asarray(idx).dtype, np.asarray(offsets).dtype,
                              None if psw is None else np.asarray(psw).dtype, mode, padding_idx,
                              include_last_offset, scale_grad_by_freq)


def _bags(spec, idx, offsets):
    """(rows, bag_of, valid): each entry's row of the weight, its bag (-1
    when there are no bags) and whether it counts (in a bag and not the
    padding row); the offsets checked first."""
    offsets = np.asarray(offsets).astype(np.int64)
    spec.check_offsets(offsets)
    rows = _entry_rows(idx, spec.table, "embedding_bag", False)
    n, b = spec.entries, spec.bags
    entry = np.arange(n)
    bag_of = np.searchsorted(offsets[:b], entry, side="right") - 1 if b else np.full(n, -1)
    valid = bag_of >= 0
    if spec.padding_idx is not None:
        valid &= rows != spec.padding_idx
    return rows, bag_of, valid


def embedding_bag_forward(weight, idx, offsets, per_sample_weights=None, mode="mean", padding_idx=None,
                          include_last_offset=False, scale_grad_by_freq=False):
    """torch's ``F.embedding_bag`` with 1-D indices: bag b holds the entries
    offsets[b] <= i < offsets[b + 1] (the last bag ends at len(idx), or at
    the last offset with ``include_last_offset``); entries whose index is
    ``padding_idx`` are left out of their bag. Per bag, over its entries i
    in order, with w_i = weight[idx[i]] (D,):

        sum   y[b] = sum w_i * p_i      (p_i = per_sample_weights[i], or 1)
        mean  y[b] = sum w_i / (entries counted)
        max   y[b] = the elementwise maximum of the w_i (NaN wins)

    and an empty bag gives zeros (every mode)."""
    spec = _bag_spec(weight, idx, offsets, per_sample_weights, mode, padding_idx, include_last_offset,
                     scale_grad_by_freq)
    rows, bag_of, valid = _bags(spec, idx, offsets)
    (w,) = in_compute_dtype(weight)
    keep = np.flatnonzero(valid)
    values = w[rows[keep]]
    if per_sample_weights is not None:
        (p,) = in_compute_dtype(per_sample_weights)
        values = values * p[keep][:, None]
    bags = bag_of[keep]
    y = _segment_reduce(values, bags, spec.bags, "max" if spec.mode == "max" else spec.mode.replace("sum", "add"))
    y[np.bincount(bags, minlength=spec.bags) == 0] = 0                   # an empty bag: zeros
    return y.astype(spec.dtype, copy=False)


def embedding_bag_backward(grad, out, weight, idx, offsets, per_sample_weights=None, mode="mean",
                           padding_idx=None, include_last_offset=False, scale_grad_by_freq=False):
    """With g = dL/dy (B, D), entry i counted in bag b = bag(i), w_i = weight[idx[i]]:

        dweight[v] = sum over the counted entries i with idx[i] = v of c_i, in ascending i,
          sum   c_i = g[b] * p_i
          mean  c_i = g[b] / (entries counted in b)
          max   c_i[d] = g[b, d] if i is the first entry of b with w_i[d] = y[b, d]
                (or both NaN), else 0: the gradient of a maximum goes to the first
                entry that attains it, as torch's
        dp_i = sum_d g[b, d] w_i[d]   (per_sample_weights; 0 for an entry not counted)

    then, as embedding's, divided by how often v occurs in idx with
    ``scale_grad_by_freq``, and zero at ``padding_idx``. ``out`` is the
    forward's y (max mode reads it; recomputed if None). None for idx and
    offsets."""
    spec = _bag_spec(weight, idx, offsets, per_sample_weights, mode, padding_idx, include_last_offset,
                     scale_grad_by_freq)
    rows, bag_of, valid = _bags(spec, idx, offsets)
    v, d = spec.weight_shape
    g, w = in_compute_dtype(np.reshape(grad, spec.out_shape), weight)
    if spec.bags == 0:                      # no bags: no entry counts, no gradient
        zeros = (np.zeros((v, d), spec.dtype), None, None)
        return zeros if per_sample_weights is None else zeros + (np.zeros(spec.entries, spec.dtype),)
    b = np.where(valid, bag_of, 0)
    contributions = np.where(valid[:, None], g[b], 0.0)
    if spec.mode == "sum" and per_sample_weights is not None:
        (p,) = in_compute_dtype(per_sample_weights)
        contributions = contributions * p[:, None]
    elif spec.mode == "mean":
        counted = np.bincount(bag_of[valid], minlength=spec.bags).astype(g.dtype)
        contributions = contributions / np.maximum(counted, 1)[b][:, None]
    elif spec.mode == "max":
        if out is None:
            out = embedding_bag_forward(weight, idx, offsets, per_sample_weights, mode, padding_idx,
                                        include_last_offset, scale_grad_by_freq)
        (y,) = in_compute_dtype(np.reshape(out, spec.out_shape))
        w_i, y_b = w[rows], y[b]
        hits = valid[:, None] & ((w_i == y_b) | (np.isnan(w_i) & np.isnan(y_b)))
        seen = np.cumsum(hits, axis=0)
        start = np.asarray(offsets).astype(np.int64)[b]
        before = np.where((start > 0)[:, None], seen[np.maximum(start - 1, 0)], 0)
        contributions = np.where(hits & (seen - before == 1), contributions, 0.0)
    dweight = _segment_reduce(contributions.astype(g.dtype, copy=False), rows, v, "add")
    if spec.scale_grad_by_freq:
        dweight /= np.maximum(np.bincount(rows, minlength=v), 1).astype(g.dtype)[:, None]
    if spec.padding_idx is not None:
        dweight[spec.padding_idx] = 0
    grads = (dweight.astype(spec.dtype, copy=False), None, None)
    if per_sample_weights is None:
        return grads
    dp = np.where(valid, np.einsum("id,id->i", g[b], w[rows]), 0.0)
    return grads + (dp.astype(spec.dtype, copy=False),)
