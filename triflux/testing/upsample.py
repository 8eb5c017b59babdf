"""Strategies and torch oracles for the upsample family (upsample_nearest,
upsample_linear, pixel_shuffle, pixel_unshuffle), any spatial rank.

Every draw picks the rank R (1, 2 or 3 spatial axes) first; the same number
of examples covers all ranks, with 3-d sides kept tiny so an example costs
about what a 2-d one does in the interpreter.

Upsampling inputs: (N, C, *spatial) arrays with N in 0..2, C in 1..3 and
spatial sides 1..7 (1..4 in 3-d), random memory layouts. A quarter of the
draws each: an output ``size`` (sides 1..13, 1..6 in 3-d: larger, equal and
smaller than the input, so every index rule and the m == n and m == 2n
special cases occur); a ``scale`` per axis (now and then one number for
every axis), integers 1-3 or non-integer factors (0.5 to 3.3, both below
and above 1, PyTorch's OpInfo's 1.7 and 0.6 among them; the output is
floor(side * scale), the input grown until that is at least 1); a factor
of 1.1-1.3 on sides of 1-3, which keeps the size (torch then copies,
whatever the factor); a last axis of 1-2 elements upsampled 48-96 times, so
that the backward sums dozens of gradients per input element along one axis
(the reference sums along one axis at a time; a 16-bit accumulation shows
there). Linear draws align_corners either way.

Nearest in 1-d and 3-d leaves out the rare draws whose source positions
differ between float32 and float64 data (:func:`_same_sources`).

Values: about two draws in three mix in NaN (and, for nearest, +-inf:
copies). Linear draws no infinity: a weight of exactly 0 times inf is NaN,
and whether a weight rounds to exactly 0 depends on the precision the
weights are computed in (float32 for float32 data, float64 for float64, in
torch as here), so the kernel and the float64 reference could both be right
and still disagree on NaN there. For the same reason linear puts its NaN
only where both precisions read it from the same outputs (:func:`_nan_safe`:
a source position within rounding of an integer, as align_corners' last
output always is, reads neighbours that depend on the precision).

Pixel shuffle inputs: factor r in 1..4 (1-d), 1..3 (2-d), 1..2 (3-d); C in
0..3 output channels (shuffle) or input channels (unshuffle), N in 0..2,
spatial sides 0..5 (0..3 in 3-d) on the small side; NaN and +-inf mixed in
(copies).

Oracles: ``F.interpolate`` with the same size or scale_factor (torch uses the
given scale factor in its index rule, as the reference does), mode
"nearest", or "linear" / "bilinear" / "trilinear" by rank, and align_corners
(for 1-d and 3-d nearest, whose backward in torch is not the derivative of
its forward, the source positions of torch's forward gathered with
index_select: :func:`upsample_nearest_torch`);
``F.pixel_shuffle`` / ``F.pixel_unshuffle`` for R = 2 and, as torch has no
other rank, torch's reshape and permute of the same index map for R = 1, 3
(and for empty inputs: torch 2.13's pixel_unshuffle returns an empty input as
it is, in the input's shape instead of (N, C r^R, *s), so pixel_shuffle's
backward fails there).
"""
from . import Case, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

#: the non-integer scale factors drawn (integers 1-3 are drawn too)
SCALES = (0.5, 0.6, 0.75, 1.3, 1.5, 1.7, 2.5, 3.3)
#: factors that leave sides 1-3 as they are (floor(side * scale) == side)
SAME_SIZE = (1.1, 1.2, 1.3)
#: the spatial ranks drawn
RANKS = (1, 2, 3)
#: the largest input side per rank (3-d: tiny)
MAX_SIDE = {1: 7, 2: 7, 3: 4}
#: the largest output side of a drawn size per rank
MAX_SIZE = {1: 13, 2: 13, 3: 6}
#: the largest pixel shuffle factor per rank
MAX_FACTOR = {1: 4, 2: 3, 3: 2}


def _case(draw, st, linear):
    import math
    rank = draw(st.sampled_from(RANKS))
    n, c = draw(st.sampled_from((1, 2, 0, 1, 2))), draw(st.integers(1, 3))
    kind = draw(st.sampled_from(("size", "scale", "same size", "long")))
    sides = [draw(st.integers(1, MAX_SIDE[rank])) for _ in range(rank)]
    if kind == "size":
        attrs = {"size": tuple(draw(st.integers(1, MAX_SIZE[rank])) for _ in range(rank))}
    elif kind == "scale":
        factor = st.one_of(st.integers(1, 3), st.sampled_from(SCALES))
        if draw(st.integers(0, 3)) == 0:                    # one number for every axis
            one = draw(factor)
            scale, factors = one, (one,) * rank
        else:
            scale = factors = tuple(draw(factor) for _ in range(rank))
        sides = [max(side, math.ceil(1 / s)) for side, s in zip(sides, factors)]   # an output of at least 1
        attrs = {"scale": scale}
    elif kind == "same size":
        # a non-integer scale whose output has the input's size: torch copies (m == n)
        attrs = {"scale": tuple(draw(st.sampled_from(SAME_SIZE)) for _ in range(rank))}
        sides = [draw(st.integers(1, 3)) for _ in range(rank)]
    else:
        # a last axis of 1-2 upsampled 48-96 times: long sums in the backward
        lead = 3 if rank < 3 else 2
        sides = [draw(st.integers(1, lead)) for _ in range(rank - 1)] + [draw(st.integers(1, 2))]
        if draw(st.booleans()):
            attrs = {"size": tuple(draw(st.integers(1, 5 if rank < 3 else 3)) for _ in range(rank - 1))
                     + (draw(st.integers(64, 96)),)}
        else:
            attrs = {"scale": tuple(draw(st.sampled_from((1, 1.5, 2))) for _ in range(rank - 1))
                     + (draw(st.integers(48, 64)),)}
    if linear:
        attrs["align_corners"] = draw(st.booleans())
    elif rank != 2:
        from hypothesis import assume
        assume(_same_sources((n, c, *sides), attrs))
    x = draw(floats((n, c, *sides), extreme=draw(st.booleans())))
    note = ""
    if nonfinite_draw(draw):
        if linear:
            x = _with_safe_nan(draw, st, x, attrs)
            note = " NaN"
        else:
            x = with_nonfinite(draw, x, (float("nan"), float("inf"), -float("inf")))
            note = " NaN/inf"
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)), note=f"{x.shape} {attrs}" + note)


def _same_sources(shape, attrs):
    """Whether nearest reads the same source positions computed in float32
    (float32, float16 and bfloat16 data) and in float64: torch's 1-d and 3-d
    rule, floor(float32(d * r)), forms d * r in the data's precision, so
    where d * r lies within rounding of an integer float32 data may read the
    element before the one float64 data reads. Both are torch's answers; the
    tests compare every dtype with the reference on float64 copies, so such
    draws are left out here (tests/test_upsample_family.py checks those
    positions against torch in both precisions)."""
    import numpy as np
    from ..specs.upsample import upsample_spec
    a32, a64 = (upsample_spec("upsample_nearest", shape, dt, **attrs).axes for dt in ("float32", "float64"))
    return all(np.array_equal(p.i0, q.i0) for p, q in zip(a32, a64))


def _nan_safe(shape, attrs):
    """Where (a boolean array of ``shape``) a NaN in a linear upsampling's
    input reaches the same outputs whether the source positions are computed
    in float32 (float32, float16 and bfloat16 data, as in torch) or float64
    (the reference the tests compare with): an output position d whose
    s(d) lies within rounding of an integer p (align_corners' last output,
    always) reads (p - 1, p) in one precision and (p, p + 1) in the other,
    so a NaN at p - 1 or p + 1 would reach it in one only; both answers are
    right, and the NaN positions would differ."""
    import numpy as np
    from ..specs.upsample import upsample_spec
    specs = [upsample_spec("upsample_linear", shape, dt, **attrs) for dt in ("float32", "float64")]
    safe = np.ones(shape[2:], bool)
    for k, (a32, a64) in enumerate(zip(specs[0].axes, specs[1].axes)):
        reads = []
        for a in (a32, a64):
            m = np.zeros((a.out, a.size), bool)
            m[np.arange(a.out), a.i0] = True
            m[np.arange(a.out), a.i1] = True
            reads.append(m)
        along = (reads[0] == reads[1]).all(axis=0)
        safe &= along.reshape((1,) * k + (-1,) + (1,) * (len(shape) - 3 - k))
    return np.broadcast_to(safe, shape)


def _with_safe_nan(draw, st, x, attrs):
    """x with NaN at 1-3 random positions of :func:`_nan_safe` (none if there is none)."""
    import numpy as np
    x = np.array(x, dtype=np.float64)
    where = np.flatnonzero(_nan_safe(x.shape, attrs)) if x.size else np.zeros(0, int)
    if where.size == 0:
        return x
    for i in draw(st.lists(st.integers(0, where.size - 1), min_size=1, max_size=min(3, where.size), unique=True)):
        x.flat[where[i]] = np.nan
    return x


def upsample_nearest_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(draw, st, False))()


def upsample_linear_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(draw, st, True))()


def _shuffle_case(draw, st, shuffle):
    rank = draw(st.sampled_from(RANKS))
    r = draw(st.integers(1, MAX_FACTOR[rank]))
    n = draw(st.sampled_from((1, 2, 0, 1, 2)))
    c = draw(st.sampled_from((1, 2, 3, 1, 2, 3, 0)))
    small = tuple(draw(st.integers(0, 5 if rank < 3 else 3)) for _ in range(rank))
    shape = (n, c * r ** rank) + small if shuffle else (n, c) + tuple(s * r for s in small)
    x = draw(floats(shape, extreme=draw(st.booleans())))
    note = ""
    if nonfinite_draw(draw):
        x = with_nonfinite(draw, x)
        note = " NaN/inf"
    return Case(inputs=(x,), attrs={"factor": r}, layouts=draw(layouts_for(1)), note=f"{x.shape} r={r}" + note)


def pixel_shuffle_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _shuffle_case(draw, st, True))()


def pixel_unshuffle_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _shuffle_case(draw, st, False))()


# --- oracles ---------------------------------------------------------------------------------------

#: F.interpolate's linear mode by spatial rank
LINEAR_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _interpolate(x, mode, size, scale, **kw):
    import torch.nn.functional as F
    if size is not None:
        return F.interpolate(x, size=tuple(size) if isinstance(size, (tuple, list)) else int(size), mode=mode, **kw)
    scale = tuple(float(s) for s in scale) if isinstance(scale, (tuple, list)) else float(scale)
    return F.interpolate(x, scale_factor=scale, mode=mode, **kw)


def upsample_nearest_torch(x, size=None, scale=None):
    """F.interpolate(mode="nearest"). For 1-d and 3-d, torch's CPU backward
    (``nearest_idx``: copies when the size is kept, halves when it doubles)
    is not the derivative of its forward (the generic kernel, which has no
    such cases: 3 elements scaled by 1.1 read (0, 0, 1), and the backward
    sends the gradients to (0, 1, 2)); so there the oracle reads the source
    positions torch's forward uses (F.interpolate of a ramp along each axis,
    in the precision torch computes them in) and gathers them with
    index_select, whose gradient is the true one."""
    rank = x.ndim - 2
    if rank == 2:
        return _interpolate(x, "nearest", size, scale)
    import torch
    ramp_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    spatial = tuple(x.shape[2:])
    y = x
    for k in range(rank):
        shape = [1, 1] + [1] * rank
        shape[2 + k] = spatial[k]
        ramp = torch.arange(spatial[k], dtype=ramp_dtype).reshape(shape).expand((1, 1) + spatial).contiguous()
        src = _interpolate(ramp, "nearest", size, scale)
        index = src.movedim(2 + k, -1).reshape(-1, src.shape[2 + k])[0].to(torch.int64)
        y = y.index_select(2 + k, index.to(x.device))
    return y


def upsample_linear_torch(x, size=None, scale=None, align_corners=False):
    return _interpolate(x, LINEAR_MODES[x.ndim - 2], size, scale, align_corners=bool(align_corners))


def pixel_shuffle_torch(x, factor):
    """torch's F.pixel_shuffle (2-d); for 1-d and 3-d the same index map by reshape and permute."""
    import torch.nn.functional as F
    rank, r = x.ndim - 2, int(factor)
    if rank == 2 and x.numel() > 0:       # (its backward, pixel_unshuffle, fails on empty inputs in torch 2.13)
        return F.pixel_shuffle(x, r)
    n, cr, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
    c = cr // r ** rank
    y = x.reshape((n, c) + (r,) * rank + spatial)
    y = y.permute((0, 1) + tuple(a for k in range(rank) for a in (2 + rank + k, 2 + k)))
    return y.reshape((n, c) + tuple(s * r for s in spatial))


def pixel_unshuffle_torch(x, factor):
    """torch's F.pixel_unshuffle (2-d); for 1-d and 3-d the same index map by reshape and permute."""
    import torch.nn.functional as F
    rank, r = x.ndim - 2, int(factor)
    if rank == 2 and x.numel() > 0:       # (torch 2.13 returns an empty input unchanged, in its own shape)
        return F.pixel_unshuffle(x, r)
    n, c, spatial = x.shape[0], x.shape[1], tuple(s // r for s in x.shape[2:])
    y = x.reshape((n, c) + tuple(a for s in spatial for a in (s, r)))
    y = y.permute((0, 1) + tuple(3 + 2 * k for k in range(rank)) + tuple(2 + 2 * k for k in range(rank)))
    return y.reshape((n, c * r ** rank) + spatial)
