"""Strategies and the torch oracle for the pad family (pad).

Inputs: arrays of rank 1 to 5 (ranks 2-4 most often), sides 1-13 with the
awkward ones over-drawn (1, primes), the larger ranks with smaller sides,
one draw in eight with an empty axis, in random memory layouts. One mode per draw; per
axis a pad pair (lo, hi), each left at 0, set to the mode's limit
(``triflux.specs.pad.pad_limit``: reflect n - 1, symmetric and circular n:
where the index rules fold over, drawn often), or anything up to it
(replicate and constant, which have no limit, up to 4, and once in a while
a long replicate pad of 9-12 on one side: the backward sums a dozen
gradients into the edge). Pads are dropped from the leading axes until the
output holds at most ``MAX_OUT`` elements, so a draw costs about what a
2-d one does in the interpreter.

Values: one draw in two mixes in NaN and +-inf (copied as they are); the
constant fill is 0 half the time, else a negative, a fraction with a long
binary expansion, +-inf or NaN.

One draw in four crops a side of one axis (a negative pad, torch's
semantics: the spec's docstring) where the mode allows it.

The oracle builds the padding axis by axis from differentiable torch ops, so
torch.autograd gives its gradient for every rank and mode: ``F.pad`` on a
(rows, 1, n) view for constant, reflect, replicate and circular (torch's
kernels, each along the last axis of a 3-d tensor, which they all accept),
and for symmetric, which torch lacks, ``torch.cat`` of flipped slices
(NNlib's pad_symmetric: the first lo elements reversed, x, the last hi
reversed), sliced where a pad is negative.
"""
from ..errors import ShapeError
from ..specs.pad import pad_limit, pad_spec
from . import Case, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

#: the largest output a draw makes (elements)
MAX_OUT = 600
#: side lengths by rank (the larger ranks smaller)
MAX_SIDE = {1: 13, 2: 7, 3: 5, 4: 3, 5: 3}
#: constant fills besides 0
VALUES = (-1.5, 0.1, 3.0, float("inf"), -float("inf"), float("nan"))


def _side(draw, st, rank):
    awkward = tuple(s for s in (5, 3, 2, 7, 1) if s <= MAX_SIDE[rank])
    return draw(st.one_of(st.sampled_from(awkward), st.integers(1, MAX_SIDE[rank])))


def _pad_one(draw, st, mode, n):
    """One side's pad on an axis of n elements."""
    limit = pad_limit(mode, n)
    if limit is None:
        limit = 4
        if mode == "replicate" and draw(st.integers(0, 9)) == 9:
            return draw(st.integers(9, 12))
    kind = draw(st.sampled_from(("limit", "any", "limit", "zero", "any")))
    if kind == "zero" or limit == 0:
        return 0
    return limit if kind == "limit" else draw(st.integers(0, limit))


def _crop(draw, st, mode, shape, pairs):
    """``pairs`` with one side of one axis made negative (a crop of 1..n),
    where the mode allows it and at least one element is left (torch's
    reflect and replicate refuse an empty output)."""
    wide = [k for k, n in enumerate(shape) if n >= 2]        # a crop of 1 leaves nothing of a side of 1
    if not wide:
        return pairs
    k = draw(st.sampled_from(wide))
    n, (lo, hi) = shape[k], pairs[k]
    crop = -draw(st.integers(1, n))
    front = draw(st.booleans())
    for new in [(crop, hi) if front else (lo, crop), (crop, 0) if front else (0, crop)]:
        try:
            pad_spec((n,), "float64", new, mode)
        except ShapeError:
            continue
        if n + sum(new) >= 1:
            return pairs[:k] + [new] + pairs[k + 1:]
    return pairs


def _numel(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def _case(draw, st):
    rank = draw(st.sampled_from((2, 3, 4, 1, 2, 3, 5, 2, 3, 4)))
    mode = draw(st.sampled_from(("reflect", "symmetric", "circular", "replicate", "constant")))
    shape = [_side(draw, st, rank) for _ in range(rank)]
    if draw(st.integers(0, 7)) == 7:
        shape[draw(st.integers(0, rank - 1))] = 0             # an empty axis (padded in mode constant only)
    pairs = []
    for n in shape:
        if draw(st.integers(0, 4)) == 4:
            pairs.append((0, 0))                              # an axis left alone
        else:
            pairs.append((_pad_one(draw, st, mode, n), _pad_one(draw, st, mode, n)))
    for k in range(rank):                                     # keep the output small
        if _numel(n + lo + hi for n, (lo, hi) in zip(shape, pairs)) <= MAX_OUT:
            break
        pairs[k] = (0, 0)
    if draw(st.integers(0, 3)) == 3:
        pairs = _crop(draw, st, mode, shape, pairs)
    padding = tuple(p for pair in pairs for p in pair)
    value = 0.0
    if mode == "constant" and draw(st.booleans()):
        value = draw(st.sampled_from(VALUES))
    shape = tuple(shape)
    x = draw(floats(shape, extreme=draw(st.booleans())))
    note = ""
    if nonfinite_draw(draw, out_of=2):
        x = with_nonfinite(draw, x)
        note = " NaN/inf"
    return Case(inputs=(x,), attrs={"padding": padding, "mode": mode, "value": value},
                layouts=draw(layouts_for(1)), note=f"{x.shape} {mode} {padding} value {value}" + note)


def pad_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(draw, st))()


def _symmetric(t, lo, hi):
    """NNlib's pad_symmetric along the last axis of ``t``: the first lo
    elements reversed, t, the last hi reversed; then negative pads crop
    the result (as torch's reflect does: the rule itself with lo < 0)."""
    import torch
    n = t.shape[-1]
    before, after = max(lo, 0), max(hi, 0)
    parts = [t[..., :before].flip(-1)] if before else []
    parts.append(t)
    if after:
        parts.append(t[..., n - after:].flip(-1))
    out = torch.cat(parts, dim=-1)
    return out[..., max(-lo, 0): out.shape[-1] - max(-hi, 0)]


def _along_last(t, lo, hi, mode, value):
    """``t`` padded by (lo, hi) along its last axis."""
    import torch.nn.functional as F
    if mode == "symmetric":
        return _symmetric(t, lo, hi)
    rows, n = t.shape[:-1], t.shape[-1]
    flat = t.reshape(_numel(rows), 1, n)                     # (batch, 1, n): every mode's F.pad accepts it
    if mode == "constant":
        out = F.pad(flat, (lo, hi), mode="constant", value=value)
    else:
        out = F.pad(flat, (lo, hi), mode=mode)
    return out.reshape(*rows, lo + n + hi)


def pad_torch(x, padding, mode="constant", value=0.0):
    """x padded by ``padding`` ((lo, hi) per axis, in axis order) in
    ``mode``, built one padded axis at a time (moved last, padded there with
    :func:`_along_last`, moved back)."""
    out = x
    for k in range(x.dim()):
        lo, hi = int(padding[2 * k]), int(padding[2 * k + 1])
        if lo == 0 and hi == 0:
            continue
        moved = out.movedim(k, -1)
        out = _along_last(moved, lo, hi, mode, float(value)).movedim(-1, k)
    if out is x:
        out = x.clone()
    return out
