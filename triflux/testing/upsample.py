"""Strategies and torch oracles for the upsample family (upsample_nearest2d,
upsample_bilinear2d).

Inputs: NCHW arrays with N in 0..2, C in 1..3 and spatial sides 1..7, random
memory layouts. A quarter of the draws each: an output ``size`` (sides
1..13: larger, equal and smaller than the input, so every index rule and the
m == n and m == 2n special cases occur); a ``scale`` per axis, integers 1-3
or non-integer factors (0.5 to 3.3, both below and above 1; the output is
floor(side * scale), the input grown until that is at least 1); a factor of
1.1-1.3 on sides of 1-3, which keeps the size (torch then copies, whatever
the factor); a width of 1-2 pixels upsampled 48-96 times, so that the
backward sums dozens of gradients per input pixel along one axis (the
reference sums along one axis at a time; a 16-bit accumulation shows there).
Bilinear draws align_corners either way.

Values: about two draws in three mix in NaN (and, for nearest, +-inf:
copies). Bilinear draws no infinity: a weight of exactly 0 times inf is NaN,
and whether a weight rounds to exactly 0 depends on the precision the
weights are computed in (float32 for float32 data, float64 for float64, in
torch as here), so the kernel and the float64 reference could both be right
and still disagree on NaN there.

Oracles: ``F.interpolate`` with the same size or scale_factor (torch uses the
given scale factor in its index rule, as the reference does), mode and
align_corners.
"""
from . import Case, floats, layouts_for
from .elementwise import nonfinite_draw, with_nonfinite

#: the non-integer scale factors drawn (integers 1-3 are drawn too)
SCALES = (0.5, 0.6, 0.75, 1.3, 1.5, 1.7, 2.5, 3.3)
#: factors that leave sides 1-3 as they are (floor(side * scale) == side)
SAME_SIZE = (1.1, 1.2, 1.3)


def _case(draw, st, bilinear):
    import math
    n, c = draw(st.sampled_from((1, 2, 0, 1, 2))), draw(st.integers(1, 3))
    kind = draw(st.sampled_from(("size", "scale", "same size", "long")))
    h, w = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    if kind == "size":
        attrs = {"size": (draw(st.integers(1, 13)), draw(st.integers(1, 13)))}
    elif kind == "scale":
        factor = st.one_of(st.integers(1, 3), st.sampled_from(SCALES))
        scale = (draw(factor), draw(factor))
        h, w = (max(side, math.ceil(1 / s)) for side, s in zip((h, w), scale))   # an output of at least 1
        attrs = {"scale": scale}
    elif kind == "same size":
        # a non-integer scale whose output has the input's size: torch copies (m == n)
        attrs = {"scale": (draw(st.sampled_from(SAME_SIZE)), draw(st.sampled_from(SAME_SIZE)))}
        h, w = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    else:
        # a width of 1-2 upsampled 48-96 times: long sums in the backward
        h, w = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        attrs = ({"size": (draw(st.integers(1, 5)), draw(st.integers(64, 96)))} if draw(st.booleans()) else
                 {"scale": (draw(st.sampled_from((1, 1.5, 2))), draw(st.integers(48, 64)))})
    if bilinear:
        attrs["align_corners"] = draw(st.booleans())
    x = draw(floats((n, c, h, w), extreme=draw(st.booleans())))
    note = ""
    if nonfinite_draw(draw):
        x = with_nonfinite(draw, x, (float("nan"),) if bilinear else (float("nan"), float("inf"), -float("inf")))
        note = " NaN" + ("" if bilinear else "/inf")
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)), note=f"{x.shape} {attrs}" + note)


def upsample_nearest2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(draw, st, False))()


def upsample_bilinear2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(draw, st, True))()


def _interpolate(x, mode, size, scale, **kw):
    import torch.nn.functional as F
    if size is not None:
        return F.interpolate(x, size=tuple(size), mode=mode, **kw)
    return F.interpolate(x, scale_factor=tuple(float(s) for s in scale), mode=mode, **kw)


def upsample_nearest2d_torch(x, size=None, scale=None):
    return _interpolate(x, "nearest", size, scale)


def upsample_bilinear2d_torch(x, size=None, scale=None, align_corners=False):
    return _interpolate(x, "bilinear", size, scale, align_corners=align_corners)
