"""Strategies and torch oracles for the pool family (maxpool2d, meanpool2d,
upsample_nearest2d, upsample_bilinear2d).

Inputs: NCHW arrays with N in 0..2, C in 1..3 and spatial sides 1..9 (small:
the kernels run in the Triton interpreter); windows 1-3, strides 1-3,
asymmetric padding smaller than the window (and a padded input at least as
large as the window), scales 1-3; random memory layouts. For max pooling,
about one draw in three takes its values from a small set ({-1, 0, 1, 2})
so that windows hold ties (the backward then pins torch's tie rule: the
first maximal element in scan order).

Oracles: torch's max_pool2d / avg_pool2d after an explicit ``F.pad`` (value
-inf for max, 0 for mean; torch's own padding is symmetric only), and
``F.interpolate(..., scale_factor, align_corners=False)``.
"""
from . import Case, floats, layouts_for


def _x(st, draw, ties=False, min_side=1):
    import numpy as np
    from hypothesis.extra import numpy as hnp

    n = draw(st.integers(0, 2))
    c = draw(st.integers(1, 3))          # torch refuses C = 0 (the family tests cover it)
    h = draw(st.integers(min_side, 9))
    w = draw(st.integers(min_side, 9))
    shape = (n, c, h, w)
    tied = ties and draw(st.integers(0, 2)) == 0
    if tied:
        x = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([-1.0, 0.0, 1.0, 2.0])))
    else:
        x = draw(floats(shape, extreme=draw(st.booleans())))
    return x, tied


def _pool_case(draw, st, ties):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pad = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kh - 1)),
           draw(st.integers(0, kw - 1)), draw(st.integers(0, kw - 1)))
    x, tied = _x(st, draw, ties)
    n, c, h, w = x.shape
    # the padded input must hold one window
    h2 = max(h, kh - pad[0] - pad[1])
    w2 = max(w, kw - pad[2] - pad[3])
    if (h2, w2) != (h, w):
        x = draw(floats((n, c, h2, w2)))
        tied = False
    attrs = {"window": (kh, kw), "stride": (sh, sw), "padding": pad}
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)),
                note=f"{x.shape} window={(kh, kw)} stride={(sh, sw)} padding={pad}" + (" ties" if tied else ""))


def _upsample_case(draw, st):
    x, _ = _x(st, draw)
    scale = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    return Case(inputs=(x,), attrs={"scale": scale}, layouts=draw(layouts_for(1)),
                note=f"{x.shape} scale={scale}")


def maxpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, True))()


def meanpool2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _pool_case(draw, st, False))()


def upsample_nearest2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _upsample_case(draw, st))()


def upsample_bilinear2d_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _upsample_case(draw, st))()


def maxpool2d_torch(x, window, stride, padding):
    import torch.nn.functional as F
    pt, pb, pl, pr = padding
    xp = F.pad(x, (pl, pr, pt, pb), value=-float("inf"))
    return F.max_pool2d(xp, tuple(window), tuple(stride), padding=0)


def meanpool2d_torch(x, window, stride, padding):
    import torch.nn.functional as F
    pt, pb, pl, pr = padding
    xp = F.pad(x, (pl, pr, pt, pb), value=0.0)
    return F.avg_pool2d(xp, tuple(window), tuple(stride), padding=0)


def upsample_nearest2d_torch(x, scale):
    import torch.nn.functional as F
    return F.interpolate(x, scale_factor=tuple(float(s) for s in scale), mode="nearest")


def upsample_bilinear2d_torch(x, scale):
    import torch.nn.functional as F
    return F.interpolate(x, scale_factor=tuple(float(s) for s in scale), mode="bilinear",
                         align_corners=False)
