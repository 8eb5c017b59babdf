"""Strategies and torch oracles for the pool family (maxpool, meanpool,
lpnormpool, adaptive_maxpool, adaptive_meanpool), any spatial rank.

Every draw picks the spatial rank R in (1, 2, 3) first; inputs are then
(N, C, *spatial) arrays with N in 0..2 (0 one draw in five), C in 1..3 and
spatial sides 1..9 (1..4 for R = 3, with windows, strides and dilations of at
most 2, so that a volume costs about what an image does in the interpreter),
random memory layouts. Fixed windows: sides 1-3, strides 1-3, for max and
Lp-norm pooling a dilation of 1-3 about half the time, ceil_mode half the
time, for mean pooling count_include_pad either way; the padding is
symmetric and at most half the window (what torch's own padding takes) half
the time, else asymmetric (each side at most half the window's extent). The
input is grown where needed until every window holds an input position, and
in ceil mode half the time until torch's rule drops a last window that
would start in the high padding. Adaptive pools: output sides 1..(input side
+ 3), so both downsampling (all 1: a global pool) and upsampling windows
occur. One mean draw in four averages long lines (48-128 positions along the
last axis) of nearly equal positive values, whose sums a 16-bit
accumulation would get visibly wrong (the reference sums along one axis at
a time, so the length along one axis is what counts).

Values: for the max pools, about one draw in two comes from {-1, 0, 1, 2,
NaN} and three in four have a window whose first and last positions are
NaN, so that windows hold ties and several NaN (the backward then pins
torch's rule: the first maximal element in scan order, or the last NaN);
about two draws in three mix in NaN, +inf and -inf (``with_nonfinite``: NaN
must propagate on a GPU, whose max instructions drop it). With asymmetric
padding no -inf is drawn: the oracle then pads with -inf itself, and a
window whose real values are all -inf would tie with that padding in torch
(the reference sends its gradient to the first real position, as torch's
own padding does; so for R = 3 too, whose oracle pads where torch's 3-d
pools refuse an input side below the window).

lpnormpool: p from {1, 1.5, 2, 3, 4, inf} (PyTorch's LPPool module samples use
1.5 and 2; 0.75 now and then, on positive inputs) with (a) positive floats
(the common case, after a relu), (b) the integers -2..2, whose powers and
sums are exact in every dtype, so that negative values (NaN for non-integer
p, signed sums for odd p, NaN where such a sum is negative, p = 1 signed
sums) and windows of zeros (zero sums, whose gradient torch sets to 0) give
the same NaN and zero positions on every side, or (c) floats of both signs
for even p and p = inf; NaN and +-inf mixed in as for the max pools. Values
below 1e-3 in magnitude are drawn as 0: their p-th powers underflow in
float32 (1e-35^2 = 0), so that a window's float32 sum is 0 where float64's
is not, and torch's gradient at a zero sum (0) is not the limit there (the
derivative of |x|, sign(x)); torch in float32 does the same.

Oracles, by rank: torch's max_pool1d/2d/3d / avg_pool1d/2d/3d with its own
padding where that can express the case (symmetric, at most half the
window), else after an explicit ``F.pad`` (-inf for max, 0 for mean; a mean
that does not count the padding divides window sums by counts of real
positions), cropped to the output size (torch's ceil-mode rule on the padded
input keeps windows that start in the high padding, which the rule on the
unpadded input drops); lp_pool1d/2d/3d (zero-padded with F.pad; a dilated
window's sums from a convolution with a dilated window of ones, put through
torch's own formula); adaptive_max_pool1d/2d/3d / adaptive_avg_pool1d/2d/3d.
"""
import math

import numpy as np

from . import Case, finite_max, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

#: the values of a tied draw: windows hold equal maxima, and several NaN
TIES = (-1.0, 0.0, 1.0, 2.0, float("nan"))
#: the non-finite values mixed in (two NaN: a window may hold both)
NONFINITE = (float("nan"), float("inf"), -float("inf"), float("nan"))
#: batch sizes (an empty batch now and then)
BATCH = (1, 2, 0, 1, 2)
#: lpnormpool's p
P_VALUES = (1.0, 1.5, 2.0, 3.0, 4.0, float("inf"))
#: the integers of an exact lpnormpool draw
SMALL_INTS = (-2.0, -1.0, 0.0, 1.0, 2.0)


def _limits(R):
    """(largest side, largest window, largest stride, largest dilation) for rank R."""
    return (4, 2, 2, 2) if R == 3 else (9, 3, 3, 3)


def _spatial_x(draw, st, shape, axes, nonfinite_values):
    """(x, note) for ``shape``: floats, maybe with NaN/inf mixed in. For max
    pools (``axes``: the spec's PoolAxis per spatial axis) also tied values,
    and windows holding two NaN."""
    from hypothesis.extra import numpy as hnp
    tied = axes is not None and draw(st.booleans())
    if tied:
        x = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(TIES)))
    else:
        x = draw(floats(shape, extreme=draw(st.booleans())))
    note = " ties" if tied else ""
    if axes is not None and draw(st.integers(0, 3)) > 0:
        note += _two_nan(draw, st, x, axes)
    if nonfinite_values and nonfinite_draw(draw):
        x = with_nonfinite(draw, x, nonfinite_values)
        note += " NaN/inf"
    return x, note


def _two_nan(draw, st, x, axes):
    """NaN at the first and the last input position (row-major) of a random
    window, in every image of ``x`` (when the window reads two positions)."""
    i = tuple(draw(st.integers(0, a.out - 1)) for a in axes)
    taps = [a.index[j][a.real[j]] for a, j in zip(axes, i)]
    if math.prod(t.size for t in taps) < 2:
        return ""
    x[(slice(None), slice(None)) + tuple(int(t[0]) for t in taps)] = float("nan")
    x[(slice(None), slice(None)) + tuple(int(t[-1]) for t in taps)] = float("nan")
    return f" two NaN in window {i}"


def _torch_out(n, k, s, lo, hi, d, ceil_mode):
    """torch's output size along an axis (pooling_output_shape, written out
    here so that the strategy does not lean on the spec's geometry), and
    whether its ceil-mode rule dropped a last window starting in the padding."""
    span = n + lo + hi - (d * (k - 1) + 1)
    out = (-(-span // s) if ceil_mode else span // s) + 1
    dropped = ceil_mode and (out - 1) * s >= n + lo
    return out - dropped, dropped


def _side(draw, st, k, s, lo, hi, d, ceil_mode, largest):
    """An input side from 1..largest, grown until every window holds an input
    position; in ceil mode half the time also until torch's rule drops the
    last window (it would start inside the high padding), where there is
    such a side close by."""
    n = draw(st.integers(1, largest))
    drop = ceil_mode and draw(st.booleans())
    first = None
    for m in range(n, n + 4 * d * k + 2 * s + 4):
        out, dropped = _torch_out(m, k, s, lo, hi, d, ceil_mode)
        if out < 1 or any(all(not 0 <= i * s - lo + a * d < m for a in range(k)) for i in range(out)):
            continue                                     # no window, or one of padding only
        first = m if first is None else first
        if dropped or not drop:
            return m
    if first is None:
        raise AssertionError(f"no input side fits window {k}, stride {s}, padding ({lo}, {hi}), dilation {d}")
    return first


def _pool_case(draw, st, kind):
    """A maxpool ("max"), meanpool ("mean") or lpnormpool ("lp") case."""
    from ..specs.pool import pool_spec
    R = draw(st.sampled_from((1, 2, 3)))
    if kind == "mean" and draw(st.integers(0, 3)) == 0:
        return _long_mean_case(draw, st, R)
    largest, kmax, smax, dmax = _limits(R)
    window = tuple(draw(st.integers(1, kmax)) for _ in range(R))
    stride = tuple(draw(st.integers(1, smax)) for _ in range(R))
    dilated = kind != "mean" and draw(st.booleans())
    dilation = tuple(draw(st.integers(1, dmax)) for _ in range(R)) if dilated else (1,) * R
    extent = [d * (k - 1) + 1 for k, d in zip(window, dilation)]
    symmetric = draw(st.booleans())
    if symmetric:
        pad = tuple(v for k in window for v in (draw(st.integers(0, k // 2)),) * 2)
    else:
        pad = tuple(draw(st.integers(0, e // 2)) for e in extent for _ in range(2))
    ceil_mode = draw(st.booleans())
    n, c = draw(st.sampled_from(BATCH)), draw(st.integers(1, 2 if R == 3 else 3))   # torch refuses C = 0
    sides = tuple(_side(draw, st, window[a], stride[a], pad[2 * a], pad[2 * a + 1], dilation[a], ceil_mode, largest)
                  for a in range(R))
    shape = (n, c) + sides
    attrs = {"window": window, "stride": stride, "padding": pad, "ceil_mode": ceil_mode}
    if kind == "lp":
        x, note, p = _lp_x(draw, st, shape, draw(st.sampled_from(P_VALUES)))
        attrs = {"p": p, **attrs, "dilation": dilation}
    else:
        name = "maxpool" if kind == "max" else "meanpool"
        values = NONFINITE if symmetric and R < 3 else tuple(v for v in NONFINITE if v != -float("inf"))
        spec = pool_spec(name, shape, "float64", window, stride, pad, dilation if kind == "max" else None, ceil_mode)
        x, note = _spatial_x(draw, st, shape, spec.axes if kind == "max" else None, values)
        if kind == "max":
            attrs["dilation"] = dilation
        else:
            attrs["count_include_pad"] = draw(st.booleans())
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)), note=f"{x.shape} {attrs}" + note)


def _lp_x(draw, st, shape, p):
    """lpnormpool's input for ``p`` (see the module docstring), a note and the p to use."""
    from hypothesis.extra import numpy as hnp
    kind = draw(st.integers(0, 2))
    if kind == 1:
        x = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(SMALL_INTS)))
        note = " small ints"
    elif kind == 2 and (p == float("inf") or p % 2 == 0):
        x = draw(floats(shape, extreme=draw(st.booleans())))
        note = " signed"
    else:
        low = 0.25 if draw(st.integers(0, 3)) == 0 else 0.0
        x = draw(floats(shape, low, 3.0, extreme=draw(st.booleans())))
        note = " positive"
        if low > 0 and draw(st.booleans()):
            x = np.maximum(x, low)                  # (extreme draws add zeros)
            note += ", p = 0.75"
            p = 0.75
    with np.errstate(invalid="ignore"):
        x = np.where(np.abs(x) < 1e-3, 0.0, x)      # (see the module docstring: no underflowing powers)
    if nonfinite_draw(draw, out_of=4):
        x = with_nonfinite(draw, x, NONFINITE)
        note += " NaN/inf"
    return x, note, p


def _long_mean_case(draw, st, R):
    """Means over long lines (windows 48-64 positions along the last axis,
    stride 1 there, so every position is in dozens of windows too) of nearly
    equal positive values: the sums grow with every term, and a 16-bit
    accumulation (the reference sums along one axis at a time) loses several
    units in the last place."""
    window = tuple(draw(st.integers(1, 2 if R == 2 else 1)) for _ in range(R - 1)) + (draw(st.integers(48, 64)),)
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sides = tuple(draw(st.integers(k, k + 2 if R == 2 else k + 1)) for k in window[:-1]) + \
        (draw(st.integers(window[-1] + 16, window[-1] + 32)),)
    x = draw(floats((n, c) + sides, 0.25, 0.35))
    attrs = {"window": window, "stride": (1,) * R, "padding": (0,) * (2 * R),
             "ceil_mode": draw(st.booleans()), "count_include_pad": True}
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)), note=f"{x.shape} {attrs} long windows")


def _adaptive_case(draw, st, is_max):
    from ..specs.pool import adaptive_pool_spec
    R = draw(st.sampled_from((1, 2, 3)))
    n, c = draw(st.sampled_from(BATCH)), draw(st.integers(1, 2 if R == 3 else 3))
    long = not is_max and draw(st.integers(0, 3)) == 0        # means of lines of 96-128 positive values
    if long:
        sides = tuple(draw(st.integers(1, 3 if R == 2 else 2)) for _ in range(R - 1)) + (draw(st.integers(96, 128)),)
        size = sides[:-1] + (draw(st.integers(1, 2)),)
        x = draw(floats((n, c) + sides, 0.25, 0.35))
        return Case(inputs=(x,), attrs={"size": size}, layouts=draw(layouts_for(1)),
                    note=f"{x.shape} -> {size} long windows")
    largest = _limits(R)[0]
    sides = tuple(draw(st.integers(1, largest)) for _ in range(R))
    size = tuple(draw(st.integers(1, s + (1 if R == 3 else 3))) for s in sides)
    axes = adaptive_pool_spec("adaptive_maxpool", (n, c) + sides, "float64", size).axes if is_max else None
    x, note = _spatial_x(draw, st, (n, c) + sides, axes, NONFINITE)
    return Case(inputs=(x,), attrs={"size": size}, layouts=draw(layouts_for(1)), note=f"{x.shape} -> {size}" + note)


def maxpool_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, "max"))()


def meanpool_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, "mean"))()


def lpnormpool_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, "lp"))()


def adaptive_maxpool_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _adaptive_case(draw, st, True))()


def adaptive_meanpool_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _adaptive_case(draw, st, False))()


def lpnormpool_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """The size of the terms lpnormpool adds up: the same computation on |x|
    (and |g|). With p = 1 or odd p over values of both signs the window sums
    cancel, and the sum of |x|^p is what a rounding error is relative to."""
    x = np.abs(inputs[0])
    if direction == "forward":
        return finite_max(reference(x, **attrs))
    return (finite_max(reference(np.abs(grad), None, x, **attrs)[0]),)


# --- oracles -------------------------------------------------------------------------------------

def _fn(kind, R):
    import torch.nn.functional as F
    return getattr(F, f"{kind}{R}d")


def _torch_padding(window, padding):
    """torch's own padding (one per axis) for ``padding`` when it can express
    it (symmetric, at most half the window: torch checks the window's extent
    for a non-empty batch but its size for an empty one), else None."""
    lo, hi = padding[0::2], padding[1::2]
    if lo == hi and all(2 * p <= k for p, k in zip(lo, window)):
        return tuple(lo)
    return None


def _torch_pads(padding):
    """``padding`` (lo_0, hi_0, lo_1, hi_1, ...) in F.pad's order (the last axis first)."""
    R = len(padding) // 2
    return tuple(v for a in reversed(range(R)) for v in (padding[2 * a], padding[2 * a + 1]))


def _out_size(x, window, stride, padding, dilation, ceil_mode):
    """torch's output size for the unpadded input (the oracle does not lean on the spec's geometry)."""
    return tuple(_torch_out(int(x.shape[2 + a]), window[a], stride[a], padding[2 * a], padding[2 * a + 1],
                            dilation[a], ceil_mode)[0] for a in range(len(window)))


def _crop(y, sides):
    return y[(slice(None), slice(None)) + tuple(slice(0, s) for s in sides)]


def _padded(x, padding, sides, window, stride, dilation, value):
    """x padded by ``padding`` with ``value``, and past the high padding by
    as much as the last of ``sides`` windows reads there (a ceil-mode window):
    torch's pools then need neither their ceil mode nor their own padding
    (torch's 3-d pools refuse an input side below the window, padding or not)."""
    import torch.nn.functional as F
    R = len(window)
    xp = F.pad(x, _torch_pads(padding), value=value)
    extra = [max(0, (o - 1) * s + d * (k - 1) + 1 - n)
             for o, s, k, d, n in zip(sides, stride, window, dilation, xp.shape[2:])]
    if any(extra):
        xp = F.pad(xp, tuple(v for a in reversed(range(R)) for v in (0, extra[a])), value=value)
    return xp


def maxpool_torch(x, window, stride, padding, dilation=None, ceil_mode=False):
    R = len(window)
    window, stride = tuple(window), tuple(stride)
    dilation = (1,) * R if dilation is None else tuple(dilation)
    pool = _fn("max_pool", R)
    own = _torch_padding(window, padding)
    if own is not None:
        try:
            return pool(x, window, stride, own, dilation, ceil_mode=ceil_mode)
        except RuntimeError:    # torch's 3-d pools refuse an input side below the window, padding or not
            pass
    sides = _out_size(x, window, stride, padding, dilation, ceil_mode)
    xp = _padded(x, padding, sides, window, stride, dilation, -float("inf"))
    return _crop(pool(xp, window, stride, 0, dilation), sides)


def _window_sums(x, window, stride, dilation=None):
    """sum over each (floor-mode) window of x: torch's avg_pool with divisor 1
    (1-d through avg_pool2d, which has it), or for dilated windows a
    convolution with a dilated window of ones."""
    import torch
    R = len(window)
    if dilation is not None and any(d != 1 for d in dilation):
        N, C = x.shape[:2]
        ones = torch.ones((1, 1) + tuple(window), dtype=x.dtype)
        y = _fn("conv", R)(x.reshape((N * C, 1) + tuple(x.shape[2:])), ones, stride=stride, dilation=dilation)
        return y.reshape((N, C) + tuple(y.shape[2:]))
    if R == 1:
        y = _fn("avg_pool", 2)(x.unsqueeze(-2), (1,) + tuple(window), (1,) + tuple(stride), 0, divisor_override=1)
        return y.squeeze(-2)
    return _fn("avg_pool", R)(x, tuple(window), tuple(stride), 0, divisor_override=1)


def _counts(x, padding, sides, window, stride, dilation, real_only):
    """The taps of each window inside the padded input (or inside the input, ``real_only``)."""
    import torch
    import torch.nn.functional as F
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
    if not real_only:
        ones = F.pad(ones, _torch_pads(padding), value=1.0)
        padding = (0,) * len(padding)
    return _window_sums(_padded(ones, padding, sides, window, stride, dilation, 0.0), window, stride, dilation)


def meanpool_torch(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    R = len(window)
    window, stride = tuple(window), tuple(stride)
    own = _torch_padding(window, padding)
    if own is not None:
        try:
            return _fn("avg_pool", R)(x, window, stride, own, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
        except RuntimeError:    # (as maxpool_torch)
            pass
    sides = _out_size(x, window, stride, padding, (1,) * R, ceil_mode)
    sums = _window_sums(_padded(x, padding, sides, window, stride, (1,) * R, 0.0), window, stride)
    counts = _counts(x, padding, sides, window, stride, (1,) * R, not count_include_pad)
    return _crop(sums, sides) / _crop(counts, sides)


def lpnormpool_torch(x, p, window, stride, padding, dilation=None, ceil_mode=False):
    """torch's lp_pool1d/2d/3d: of x itself where torch can express the case,
    else of the zero-padded x; where torch's lp_pool cannot (a dilated window,
    a 3-d input side below the window) through torch's own formula, avg =
    window sums of x^p / the window's taps inside the padded input, then
    (sign(avg) relu(|avg|) prod(k))^(1/p)."""
    import torch
    import torch.nn.functional as F
    R = len(window)
    window, stride = tuple(window), tuple(stride)
    dilation = (1,) * R if dilation is None else tuple(dilation)
    def lp_pool(x, p, window, stride, ceil_mode):
        if R == 1:                  # (lp_pool1d takes ints)
            return F.lp_pool1d(x, p, window[0], stride[0], ceil_mode)
        return _fn("lp_pool", R)(x, p, window, stride, ceil_mode)
    sides = _out_size(x, window, stride, padding, dilation, ceil_mode)
    if dilation == (1,) * R:
        try:
            if not any(padding):
                return lp_pool(x, p, window, stride, ceil_mode)
            return _crop(lp_pool(F.pad(x, _torch_pads(padding)), p, window, stride, ceil_mode), sides)
        except RuntimeError:    # (as maxpool_torch)
            pass
    xp = _padded(x, padding, sides, window, stride, dilation, 0.0)
    if p == float("inf"):
        return _crop(_fn("max_pool", R)(xp.abs(), window, stride, 0, dilation), sides)
    sums = _window_sums(xp.pow(p), window, stride, dilation)
    avg = _crop(sums, sides) / _crop(_counts(x, padding, sides, window, stride, dilation, False), sides)
    return (torch.sign(avg) * F.relu(torch.abs(avg))).mul(math.prod(window)).pow(1.0 / p)


def adaptive_maxpool_torch(x, size):
    return _fn("adaptive_max_pool", len(size))(x, tuple(size))


def adaptive_meanpool_torch(x, size):
    return _fn("adaptive_avg_pool", len(size))(x, tuple(size))
