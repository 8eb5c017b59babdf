"""Strategies and torch oracles for the reductions (sum, mean, max).

Inputs: 0- to 4-d float64 arrays with awkward sides (0 and 1 included), any
subset of the axes (``()`` and all of them included, as a sorted tuple of
non-negative ints), ``keepdims`` either way, random memory layouts. ``max``
never reduces over an empty axis (the ops layer raises first) and often
draws values on a coarse grid so that tied maxima share the gradient. In
about two draws in three a few entries are NaN, +inf and -inf (a NaN row
maximum, and its NaN gradient, as torch.amax; an infinite sum). Empty
reductions, integer and boolean inputs, long rows and 5-6-d inputs are in
``tests/test_reduce_family.py``.
"""
import numpy as np

from . import Case, layouts_for, shapes
from .elementwise import nonfinite_draw, with_nonfinite

MAX_ELEMENTS = 3000


def _case(name):
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    @st.composite
    def case(draw):
        shape = tuple(draw(shapes(min_dims=0 if draw(st.integers(0, 9)) == 0 else 1,
                                  max_dims=4, min_side=0, max_side=17)))
        size = 1
        for s in shape:
            size *= s
        if size > MAX_ELEMENTS:
            shape = tuple(min(s, 5) for s in shape)
        nd = len(shape)
        mode = draw(st.integers(0, 7)) if nd else 7
        if mode in (0, 4, 5, 6):  # one axis (the common case)
            axis = (draw(st.integers(0, nd - 1)),)
        elif mode == 1:    # any subset
            axis = tuple(sorted(draw(st.sets(st.integers(0, nd - 1), min_size=1, max_size=nd))))
        elif mode == 2:    # all axes
            axis = tuple(range(nd))
        else:              # none: a copy
            axis = ()
        if name == "max":  # the maximum of nothing is undefined: no empty reduced axis
            shape = tuple(1 if (d in axis and s == 0) else s for d, s in enumerate(shape))
        extreme = draw(st.integers(0, 4)) == 0
        grid = name == "max" and draw(st.booleans())
        ordinary = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False, width=64)
        big = 100.0 if name == "sum" else 1e4   # (sums of 1e4s overflow float16)
        elements = st.one_of(ordinary, st.sampled_from([big, -big])) if extreme else ordinary
        x = draw(hnp.arrays(np.float64, shape, elements=elements))
        if grid:
            x = np.round(x * 2) / 2
        nonfinite = nonfinite_draw(draw)
        if nonfinite:
            x = with_nonfinite(draw, x)
        keepdims = draw(st.booleans())
        return Case(inputs=(x,), attrs={"axis": axis, "keepdims": keepdims},
                    layouts=draw(layouts_for(1)),
                    note=f"{shape} axis={axis} keepdims={keepdims}"
                         + (" extreme" if extreme else "") + (" grid (ties)" if grid else "")
                         + (" NaN/inf" if nonfinite else ""))
    return case()


def sum_strategy(dtype):
    return _case("sum")


def mean_strategy(dtype):
    return _case("mean")


def max_strategy(dtype):
    return _case("max")


def _dims(axis):
    return tuple(axis) if axis is not None else None


def sum_torch(x, axis=None, keepdims=False):
    import torch
    if axis is not None and len(axis) == 0:   # torch reads dim=() as "all dims"
        return x.clone()
    return torch.sum(x, dim=_dims(axis), keepdim=keepdims)


def mean_torch(x, axis=None, keepdims=False):
    import torch
    if axis is not None and len(axis) == 0:
        return x.clone()
    return torch.mean(x, dim=_dims(axis), keepdim=keepdims)


def max_torch(x, axis=None, keepdims=False):
    import torch
    if axis is not None and len(axis) == 0:
        return x.clone()
    return torch.amax(x, dim=_dims(axis) if axis is not None else tuple(range(x.dim())),
                      keepdim=keepdims)
