"""Strategies and torch oracles for the pool family (maxpool2d, meanpool2d,
adaptive_maxpool2d, adaptive_meanpool2d).

Inputs: NCHW arrays with N in 0..2 (0 one draw in five), C in 1..3 and spatial sides 1..9 (small:
the kernels run in the Triton interpreter), random memory layouts. Fixed
windows: sides 1-3, strides 1-3, for max pooling a dilation of 1-3 about half
the time, ceil_mode half the time, for mean pooling count_include_pad either
way; the padding is symmetric and at most half the window (what torch's own
padding takes) half the time, else asymmetric (each side smaller than the
window's extent). The input is grown where needed until every window holds
an input pixel, and in ceil mode half the time until torch's rule drops a
last window that would start in the bottom/right padding. Adaptive pools: output sides 1..(input side + 3), so both
downsampling (1 x 1: a global pool) and upsampling windows occur. One mean
draw in four averages long rows (48-128 pixels) of nearly equal positive
values, whose sums a 16-bit accumulation would get visibly wrong (the
reference sums along one axis at a time, so the length along one axis is
what counts).

Values: for the max pools, about one draw in two comes from {-1, 0, 1, 2,
NaN} and three in four have a window whose first and last pixels are NaN, so
that windows hold ties and several NaN (the backward then pins torch's rule:
the first maximal element in scan order, or the last NaN);
about two draws in three mix in NaN, +inf and -inf (``with_nonfinite``: NaN
must propagate on a GPU, whose max instructions drop it). With
asymmetric padding no -inf is drawn: the oracle then pads with -inf itself,
and a window whose real pixels are all -inf would tie with that padding in
torch (the reference sends its gradient to the first real pixel, as torch's
own padding does).

Oracles: torch's max_pool2d / avg_pool2d with its own padding where that can
express the case (symmetric, at most half the window), else after an
explicit ``F.pad`` (-inf for max, 0 for mean; a mean that does not count the
padding divides window sums by counts of real pixels, both from
``avg_pool2d(..., divisor_override=1)``), cropped to the output size (torch's
ceil-mode rule on the padded input keeps windows that start in the bottom
padding, which the rule on the unpadded input drops);
adaptive_max_pool2d / adaptive_avg_pool2d.
"""
from . import Case, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

#: the values of a tied draw: windows hold equal maxima, and several NaN
TIES = (-1.0, 0.0, 1.0, 2.0, float("nan"))
#: the non-finite values mixed in (two NaN: a window may hold both)
NONFINITE = (float("nan"), float("inf"), -float("inf"), float("nan"))
#: batch sizes (an empty batch now and then)
BATCH = (1, 2, 0, 1, 2)


def _spatial_x(draw, st, shape, windows, nonfinite_values):
    """(x, note) for ``shape``: floats, maybe with NaN/inf mixed in. For max
    pools (``windows``: the spec's (rows, cols) PoolAxis) also tied values,
    and windows holding two NaN."""
    import numpy as np
    from hypothesis.extra import numpy as hnp
    tied = windows is not None and draw(st.booleans())
    if tied:
        x = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(TIES)))
    else:
        x = draw(floats(shape, extreme=draw(st.booleans())))
    note = " ties" if tied else ""
    if windows is not None and draw(st.integers(0, 3)) > 0:
        note += _two_nan(draw, st, x, *windows)
    if nonfinite_values and nonfinite_draw(draw):
        x = with_nonfinite(draw, x, nonfinite_values)
        note += " NaN/inf"
    return x, note


def _two_nan(draw, st, x, rows, cols):
    """NaN at the first and the last input pixel (row-major) of a random
    window, in every image of ``x`` (when the window reads two pixels)."""
    i, j = draw(st.integers(0, rows.out - 1)), draw(st.integers(0, cols.out - 1))
    r = rows.index[i][rows.real[i]]
    c = cols.index[j][cols.real[j]]
    if r.size * c.size < 2:
        return ""
    x[:, :, r[0], c[0]] = x[:, :, r[-1], c[-1]] = float("nan")
    return f" two NaN in window {(i, j)}"


def _torch_out(n, k, s, lo, hi, d, ceil_mode):
    """torch's output size along an axis (pooling_output_shape, written out
    here so that the strategy does not lean on the spec's geometry), and
    whether its ceil-mode rule dropped a last window starting in the padding."""
    span = n + lo + hi - (d * (k - 1) + 1)
    out = (-(-span // s) if ceil_mode else span // s) + 1
    dropped = ceil_mode and (out - 1) * s >= n + lo
    return out - dropped, dropped


def _side(draw, st, k, s, lo, hi, d, ceil_mode):
    """An input side from 1..9, grown until every window holds an input
    position; in ceil mode half the time also until torch's rule drops the
    last window (it would start inside the bottom/right padding), where
    there is such a side close by."""
    n = draw(st.integers(1, 9))
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


def _pool_case(draw, st, is_max):
    from ..specs.pool import pool2d_spec
    if not is_max and draw(st.integers(0, 3)) == 0:
        return _long_mean_case(draw, st)
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dilated = is_max and draw(st.booleans())
    dh, dw = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if dilated else (1, 1)
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    symmetric = draw(st.booleans())
    if symmetric:
        ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
        pad = (ph, ph, pw, pw)
    else:
        pad = (draw(st.integers(0, eh - 1)), draw(st.integers(0, eh - 1)),
               draw(st.integers(0, ew - 1)), draw(st.integers(0, ew - 1)))
    ceil_mode = draw(st.booleans())
    n, c = draw(st.sampled_from(BATCH)), draw(st.integers(1, 3))     # torch refuses C = 0 (the family tests cover it)
    h = _side(draw, st, kh, sh, pad[0], pad[1], dh, ceil_mode)
    w = _side(draw, st, kw, sw, pad[2], pad[3], dw, ceil_mode)
    values = NONFINITE if symmetric else tuple(v for v in NONFINITE if v != -float("inf"))
    spec = pool2d_spec("maxpool2d" if is_max else "meanpool2d", (n, c, h, w), "float64", (kh, kw), (sh, sw), pad,
                       (dh, dw), ceil_mode)
    windows = (spec.rows, spec.cols) if is_max else None
    x, note = _spatial_x(draw, st, (n, c, h, w), windows, values)
    attrs = {"window": (kh, kw), "stride": (sh, sw), "padding": pad, "ceil_mode": ceil_mode}
    if is_max:
        attrs["dilation"] = (dh, dw)
    else:
        attrs["count_include_pad"] = draw(st.booleans())
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)),
                note=f"{x.shape} {attrs}" + note)


def _long_mean_case(draw, st):
    """Means over long rows (windows 48-64 pixels wide, stride 1 along W, so
    every pixel is in dozens of windows too) of nearly equal positive values:
    the sums grow with every term, and a 16-bit accumulation (the reference
    sums along one axis at a time) loses several units in the last place."""
    kh, kw = draw(st.integers(1, 2)), draw(st.integers(48, 64))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h, w = draw(st.integers(kh, kh + 2)), draw(st.integers(kw + 16, kw + 32))
    x = draw(floats((n, c, h, w), 0.25, 0.35))
    attrs = {"window": (kh, kw), "stride": (1, 1), "padding": (0, 0, 0, 0),
             "ceil_mode": draw(st.booleans()), "count_include_pad": True}
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)), note=f"{x.shape} {attrs} long windows")


def _adaptive_case(draw, st, is_max):
    from ..specs.pool import adaptive_pool2d_spec
    n, c = draw(st.sampled_from(BATCH)), draw(st.integers(1, 3))
    long = not is_max and draw(st.integers(0, 3)) == 0        # means of rows of 96-128 positive values
    h, w = (draw(st.integers(2, 4)), draw(st.integers(96, 128))) if long else \
        (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    size = (h, draw(st.integers(1, 2))) if long else (draw(st.integers(1, h + 3)), draw(st.integers(1, w + 3)))
    if long:
        x = draw(floats((n, c, h, w), 0.25, 0.35))
        return Case(inputs=(x,), attrs={"size": size}, layouts=draw(layouts_for(1)),
                    note=f"{x.shape} -> {size} long windows")
    windows = None
    if is_max:
        spec = adaptive_pool2d_spec("adaptive_maxpool2d", (n, c, h, w), "float64", size)
        windows = (spec.rows, spec.cols)
    x, note = _spatial_x(draw, st, (n, c, h, w), windows, NONFINITE)
    return Case(inputs=(x,), attrs={"size": size}, layouts=draw(layouts_for(1)),
                note=f"{x.shape} -> {size}" + note)


def maxpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, True))()


def meanpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, False))()


def adaptive_maxpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _adaptive_case(draw, st, True))()


def adaptive_meanpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _adaptive_case(draw, st, False))()


# --- oracles -------------------------------------------------------------------------------------

def _torch_padding(window, padding):
    """torch's own (ph, pw) for ``padding`` when it can express it (symmetric,
    at most half the window: torch checks the window's extent for a
    non-empty batch but its size for an empty one), else None."""
    pt, pb, pl, pr = padding
    if pt == pb and pl == pr and 2 * pt <= window[0] and 2 * pl <= window[1]:
        return (pt, pl)
    return None


def _out_size(x, window, stride, padding, dilation, ceil_mode):
    """torch's output size for the unpadded input (the oracle does not lean on the spec's geometry)."""
    return tuple(_torch_out(int(x.shape[2 + a]), window[a], stride[a], padding[2 * a], padding[2 * a + 1],
                            dilation[a], ceil_mode)[0] for a in range(2))


def maxpool2d_torch(x, window, stride, padding, dilation=(1, 1), ceil_mode=False):
    import torch.nn.functional as F
    own = _torch_padding(window, padding)
    if own is not None:
        return F.max_pool2d(x, tuple(window), tuple(stride), own, tuple(dilation), ceil_mode=ceil_mode)
    Ho, Wo = _out_size(x, window, stride, padding, dilation, ceil_mode)
    pt, pb, pl, pr = padding
    xp = F.pad(x, (pl, pr, pt, pb), value=-float("inf"))
    return F.max_pool2d(xp, tuple(window), tuple(stride), 0, tuple(dilation), ceil_mode=ceil_mode)[:, :, :Ho, :Wo]


def meanpool2d_torch(x, window, stride, padding, ceil_mode=False, count_include_pad=True):
    import torch
    import torch.nn.functional as F
    own = _torch_padding(window, padding)
    if own is not None:
        return F.avg_pool2d(x, tuple(window), tuple(stride), own, ceil_mode=ceil_mode,
                            count_include_pad=count_include_pad)
    Ho, Wo = _out_size(x, window, stride, padding, (1, 1), ceil_mode)
    pt, pb, pl, pr = padding
    pads = (pl, pr, pt, pb)
    if count_include_pad:       # the padded input's zeros count; torch clips a ceil window to it
        out = F.avg_pool2d(F.pad(x, pads, value=0.0), tuple(window), tuple(stride), 0, ceil_mode=ceil_mode)
        return out[:, :, :Ho, :Wo]
    sums = F.avg_pool2d(F.pad(x, pads, value=0.0), tuple(window), tuple(stride), 0, ceil_mode=ceil_mode,
                        divisor_override=1)
    real = F.pad(torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype), pads, value=0.0)
    counts = F.avg_pool2d(real, tuple(window), tuple(stride), 0, ceil_mode=ceil_mode, divisor_override=1)
    return (sums / counts)[:, :, :Ho, :Wo]


def adaptive_maxpool2d_torch(x, size):
    import torch.nn.functional as F
    return F.adaptive_max_pool2d(x, tuple(size))


def adaptive_meanpool2d_torch(x, size):
    import torch.nn.functional as F
    return F.adaptive_avg_pool2d(x, tuple(size))
