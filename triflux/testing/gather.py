"""Strategies, torch oracles and tolerance floors for the gather family
(gather, scatter, embedding, embedding_bag).

Indices are drawn as int32 or int64 (either, per draw) from a drawn seed,
uniformly over the valid range of each coordinate, so that small tables get
repeated indices (the reductions' case). Every input draws a memory layout
(the index too: transposed or strided index tensors). The index form is the
row form about two draws in three, else the coordinate form (``coords``:
M coordinates per entry into the first M axes, M from 1 to the table's
rank, the rank itself included: torch's elementwise gather/scatter).

Sizes: tables of 1..12 rows (0 with no entries: an empty table is only
valid with no indices), rows of 0..3 axes of sides 0..5, index shapes of
0..3 axes of sides 0..5 (0-d included: one entry). One draw in four is a
*long* case for the 16-bit checks: several hundred entries over 1..3 rows
of a few values each, so a row's sum adds hundreds of terms (a 16-bit
accumulator would stall; one of one sign in three gradients, by the suite).
Not in float64, where the long case tests nothing more and a forward that
sums hundreds of terms is too noisy for the reference's finite differences.

Values: floats in [-3, 3] with the extremes, and in about two draws in
three NaN and infinities where torch defines the result: anywhere for
gather and embedding (copies; their backward does not read the table), for
scatter add/mean, for embedding_bag sum/mean; scatter max takes NaN and
+inf but no -inf (a row of -inf only would tie with torch's oracle's base,
``include_self=False`` still counts the base in its tie count), min the
mirror; embedding_bag max takes infinities but no NaN (torch's CPU kernel
keeps the first NaN of a bag and drops the others, triflux's maximum
propagates NaN); scatter mul takes none (torch's gradient divides y by
src[k]: inf / inf = NaN where the exact product of the others is finite),
its values in +-[0.5, 1.5] with a few exact zeros (one or two in a group:
the exclusive products are exact there), over groups short enough not to
overflow. scatter max/min draws repeated values about one draw in two:
ties, whose gradient is shared evenly (torch's rule; pinned kernel against
reference, where ties are exact).

``scale_grad_by_freq`` (torch's scaling of a row's gradient by 1 / its
count) and an embedding's ``padding_idx`` that some index names (torch reads
that row but gives it no gradient) are not derivatives: they are drawn in
every dtype but float64, whose draws also feed the finite-difference check
of the reference (a float64 padding_idx names a row no index uses); the
family's tests compare both with torch in float64.

Oracles: torch's indexing (``src[idx]``, coordinates as a tuple of index
tensors), ``scatter_reduce`` along the flattened rows with
``include_self=False`` on a base filled with NNlib's initial value
(sum/prod/amax/amin/mean), ``F.embedding`` and ``F.embedding_bag``.
"""
import math

import numpy as np

from ..specs.gather import SCATTER_INIT, SCATTER_OPS
from . import Case, finite_max, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

INDEX_DTYPES = (np.int32, np.int64)
#: the long case: entries, over this many rows of at most this many values
LONG_ENTRIES = (200, 600)


def _rng(st, draw):
    return np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))


def _shape(st, draw, min_dims=0, max_dims=3, max_side=5):
    return tuple(draw(st.lists(st.integers(0, max_side), min_size=min_dims, max_size=max_dims)))


def _table(st, draw, coords, long):
    """(table_shape, row_shape, entries_shape) of a draw: a long case has
    1..3 rows of 1..4 values and several hundred entries."""
    if long:
        entries = (draw(st.integers(*LONG_ENTRIES)),)
        return (draw(st.integers(1, 3)),), (draw(st.integers(1, 4)),), entries
    entries = _shape(st, draw)
    if not coords:
        rows = draw(st.integers(0, 12)) if math.prod(entries) == 0 else draw(st.integers(1, 12))
        return (rows,), _shape(st, draw, max_dims=2), entries
    rank = draw(st.integers(1, 4))
    m = draw(st.integers(1, rank))
    sides = tuple(draw(st.integers(1, 6)) for _ in range(m))
    return sides, _shape(st, draw, max_dims=rank - m), entries


def _index(st, draw, table_shape, entries, coords):
    rng = _rng(st, draw)
    dtype = draw(st.sampled_from(INDEX_DTYPES))
    if not coords:
        return rng.integers(0, max(table_shape[0], 1), size=entries).astype(dtype)
    cols = [rng.integers(0, n, size=entries) for n in table_shape]
    return np.stack(cols, axis=-1).astype(dtype).reshape(entries + (len(table_shape),))


def _values(st, draw, shape, nonfinite=(np.nan, np.inf, -np.inf), low=-3.0, high=3.0):
    x = draw(floats(shape, low, high, extreme=draw(st.booleans())))
    if nonfinite and nonfinite_draw(draw):
        x = with_nonfinite(draw, x, nonfinite)
    return x


# --- gather ------------------------------------------------------------------------------------

def _gather_case(st, draw):
    coords = draw(st.integers(0, 2)) == 0
    long = not coords and draw(st.integers(0, 3)) == 0
    table_shape, row_shape, entries = _table(st, draw, coords, long)
    idx = _index(st, draw, table_shape, entries, coords)
    src = _values(st, draw, table_shape + row_shape)
    attrs = {"coords": True} if coords else {}
    return Case(inputs=(src, idx), attrs=attrs, layouts=draw(layouts_for(2)), grad_inputs=(0,),
                note=f"src {src.shape} idx {idx.shape} {idx.dtype}{' long' if long else ''}")


def gather_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _gather_case(st, draw))()


def _coordinate_tuple(idx, coords):
    """torch's advanced index for ``idx``: the tensor itself (rows), or one
    index tensor per coordinate."""
    idx = idx.long()
    if not coords:
        return idx
    return tuple(idx[..., m] for m in range(idx.shape[-1]))


def gather_torch(src, idx, coords=False):
    """``src[idx]`` (torch's advanced indexing; its backward accumulates repeated rows)."""
    return src[_coordinate_tuple(idx, coords)]


# --- scatter -----------------------------------------------------------------------------------

#: torch's scatter_reduce name for each op
TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin", "mean": "mean"}
#: the non-finite values each op draws (see the module docstring)
_SCATTER_NONFINITE = {"add": (np.nan, np.inf, -np.inf), "mean": (np.nan, np.inf, -np.inf), "mul": (),
                      "max": (np.nan, np.inf), "min": (np.nan, -np.inf)}


def _mul_values(st, draw, shape):
    rng = _rng(st, draw)
    x = rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    if x.size and draw(st.booleans()):
        x.flat[rng.integers(0, x.size, size=min(2, x.size))] = 0.0
    return x


def _scatter_case(st, draw, dtype):
    op = draw(st.sampled_from(SCATTER_OPS))
    coords = draw(st.integers(0, 2)) == 0
    long = dtype != "float64" and not coords and op in ("add", "mean") and draw(st.integers(0, 2)) == 0
    table_shape, row_shape, entries = _table(st, draw, coords, long)
    if op == "mul":
        entries = entries[:2]        # short groups: products of at most a few dozen values
    idx = _index(st, draw, table_shape, entries, coords)
    shape = entries + row_shape
    if op == "mul":
        src = _mul_values(st, draw, shape)
    else:
        src = _values(st, draw, shape, _SCATTER_NONFINITE[op])
        if op in ("max", "min") and src.size > 1 and draw(st.booleans()):
            rng = _rng(st, draw)
            src.flat[rng.integers(0, src.size, size=src.size // 2)] = src.flat[0]      # ties
    attrs = {"op": op, "dstsize": table_shape + row_shape}
    if coords:
        attrs["coords"] = True
    return Case(inputs=(src, idx), attrs=attrs, layouts=draw(layouts_for(2)), grad_inputs=(0,),
                note=f"{op} src {src.shape} idx {idx.shape} {idx.dtype} dstsize {attrs['dstsize']}"
                     f"{' long' if long else ''}")


def scatter_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _scatter_case(st, draw, dtype))()


def _linear_rows(idx, table_shape, coords):
    """The linear row of every entry (a long tensor)."""
    idx = idx.long()
    if not coords:
        return idx.reshape(-1)
    rows = idx.reshape(-1, idx.shape[-1])
    out = rows[:, 0]
    for m in range(1, rows.shape[1]):
        out = out * table_shape[m] + rows[:, m]
    return out


def scatter_torch(src, idx, op="add", dstsize=None, coords=False):
    """NNlib's scatter as torch's ``scatter_reduce(include_self=False)`` on a
    base of NNlib's initial values, over the flattened rows."""
    import torch
    dstsize = tuple(dstsize)
    m = idx.shape[-1] if coords else 1
    table_shape, rows_count = dstsize[:m], math.prod(dstsize[:m])
    f = math.prod(dstsize[m:])
    base = torch.full((rows_count, f), SCATTER_INIT[op], dtype=src.dtype)
    rows = _linear_rows(idx, table_shape, coords)
    values = src.reshape(rows.numel(), f)
    if rows.numel() == 0 or f == 0:
        return base.reshape(dstsize) + values.sum() * 0
    out = base.scatter_reduce(0, rows[:, None].expand(rows.numel(), f), values, TORCH_REDUCE[op], include_self=False)
    return out.reshape(dstsize)


def scatter_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """add and mean forward: a row's sum may cancel, so its rounding error is
    measured against the same sum of |src| (the scatter of |src|). The other
    directions are a product, a maximum, a minimum or a copy per entry: no
    cancellation, no floor."""
    if direction == "forward" and attrs.get("op", "add") in ("add", "mean"):
        src, idx = inputs
        return finite_max(reference(np.abs(src), idx, **attrs))
    return None if direction == "forward" else (None, None)


# --- embedding ---------------------------------------------------------------------------------

def _embedding_case(st, draw, dtype):
    long = draw(st.integers(0, 3)) == 0
    if long:
        vocab, dim = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        entries = (draw(st.integers(*LONG_ENTRIES)),)
    else:
        entries = _shape(st, draw)
        vocab = draw(st.integers(0 if math.prod(entries) == 0 else 1, 12))
        dim = draw(st.integers(0, 9))
    idx = _index(st, draw, (vocab,), entries, False)
    weight = _values(st, draw, (vocab, dim))
    attrs = {}
    if vocab and draw(st.booleans()):
        pad = draw(st.integers(-vocab, vocab - 1))
        if dtype != "float64" or not np.any(idx == pad % vocab):
            attrs["padding_idx"] = pad
    if dtype != "float64" and draw(st.integers(0, 2)) == 0:
        attrs["scale_grad_by_freq"] = True
    return Case(inputs=(weight, idx), attrs=attrs, layouts=draw(layouts_for(2)), grad_inputs=(0,),
                note=f"weight {weight.shape} idx {idx.shape} {idx.dtype}{' long' if long else ''}")


def embedding_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _embedding_case(st, draw, dtype))()


def embedding_torch(weight, idx, padding_idx=None, scale_grad_by_freq=False):
    """torch's ``F.embedding``."""
    import torch
    return torch.nn.functional.embedding(idx.long(), weight, padding_idx=padding_idx,
                                         scale_grad_by_freq=scale_grad_by_freq)


# --- embedding_bag -----------------------------------------------------------------------------

def _bag_offsets(st, draw, n, bags, include_last):
    """B offsets from 0, non-decreasing, at most n (+ n itself with include_last_offset)."""
    rng = _rng(st, draw)
    cuts = np.sort(rng.integers(0, n + 1, size=max(bags - 1, 0))) if bags else np.zeros(0, np.int64)
    offsets = np.concatenate(([0], cuts)) if bags else np.zeros(0, np.int64)
    if include_last:
        offsets = np.append(offsets, n)
    return offsets


def _embedding_bag_case(st, draw, dtype):
    mode = draw(st.sampled_from(("sum", "mean", "max")))
    long = dtype != "float64" and mode != "max" and draw(st.integers(0, 3)) == 0
    if long:
        vocab, dim, n, bags = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(*LONG_ENTRIES)), 1
    else:
        vocab, dim = draw(st.integers(1, 12)), draw(st.integers(0, 8))
        n, bags = draw(st.integers(0, 20)), draw(st.integers(0, 5))
    include_last = bags > 0 and draw(st.booleans())
    offsets = _bag_offsets(st, draw, n, bags, include_last).astype(draw(st.sampled_from(INDEX_DTYPES)))
    idx = _index(st, draw, (vocab,), (n,), False)
    weight = _values(st, draw, (vocab, dim), (np.inf, -np.inf) if mode == "max" else (np.nan, np.inf, -np.inf))
    if mode == "max" and vocab > 1 and dim and draw(st.booleans()):
        weight[1] = weight[0]                       # equal rows: ties, the first entry gets the gradient
    inputs = (weight, idx, offsets)
    attrs = {"mode": mode}
    if mode == "sum" and draw(st.booleans()):
        inputs += (draw(floats((n,), -2.0, 2.0)),)
    if draw(st.booleans()):
        attrs["padding_idx"] = draw(st.integers(-vocab, vocab - 1))
    if include_last:
        attrs["include_last_offset"] = True
    if dtype != "float64" and mode != "max" and draw(st.integers(0, 3)) == 0:
        attrs["scale_grad_by_freq"] = True
    grads = (0, 3) if len(inputs) == 4 else (0,)
    return Case(inputs=inputs, attrs=attrs, layouts=draw(layouts_for(len(inputs))), grad_inputs=grads,
                note=f"weight {weight.shape} idx {idx.shape} {idx.dtype} offsets {offsets.tolist()}"
                     f"{' weighted' if len(inputs) == 4 else ''}{' long' if long else ''}")


def embedding_bag_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _embedding_bag_case(st, draw, dtype))()


def embedding_bag_torch(weight, idx, offsets, per_sample_weights=None, mode="mean", padding_idx=None,
                        include_last_offset=False, scale_grad_by_freq=False):
    """torch's ``F.embedding_bag`` (indices and offsets as int64: torch
    wants one dtype for both); no bags or rows of no values (D = 0), where
    torch crashes (no bags but some indices) or refuses: an empty result."""
    import torch
    bags = offsets.numel() - bool(include_last_offset)
    if weight.shape[1] == 0 or bags == 0:
        zero = weight.sum() * 0 + (0 if per_sample_weights is None else per_sample_weights.sum() * 0)
        return zero + torch.zeros((bags, weight.shape[1]), dtype=weight.dtype)
    return torch.nn.functional.embedding_bag(idx.long(), weight, offsets.long(), mode=mode,
                                             per_sample_weights=per_sample_weights, padding_idx=padding_idx,
                                             include_last_offset=include_last_offset,
                                             scale_grad_by_freq=scale_grad_by_freq)


def embedding_bag_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """sum and mean: a bag's sum (forward), a row's gradient (sum of the
    contributions of its entries) and a per-sample weight's gradient (a dot
    product over D) may cancel: each is measured against the same sum of
    absolute terms (the reference on |weight|, |per_sample_weights|, |grad|,
    the max mode keeping the actual weight and output, which choose the
    winners)."""
    weight, idx, offsets = inputs[:3]
    psw = inputs[3] if len(inputs) > 3 else None
    abs_psw = () if psw is None else (np.abs(psw),)
    if direction == "forward":
        if attrs.get("mode", "mean") == "max":
            return None
        return finite_max(reference(np.abs(weight), idx, offsets, *abs_psw, **attrs))
    g = np.abs(grad)
    dweight = reference(g, out, weight if attrs.get("mode", "mean") == "max" else np.abs(weight), idx, offsets,
                        *abs_psw, **attrs)[0]
    floors = (finite_max(dweight), None, None)
    if psw is None:
        return floors
    dpsw = reference(g, out, np.abs(weight), idx, offsets, *abs_psw, **attrs)[3]
    return floors + (finite_max(dpsw),)
