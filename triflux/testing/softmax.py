"""Strategies and torch oracles for the softmax family (softmax, logsoftmax,
logsumexp).

Inputs: 1- to 4-d arrays with awkward sides (0 and 1 included), a random
axis (first, middle, last; sometimes negative), random memory layouts, and in
about one draw in four extreme logits of +-1e4 mixed with ordinary ones (the
case a naive ``exp`` overflows on). In about two draws in three a few entries
are NaN, +inf and -inf, and in half of those one row is all -inf (a fully
masked row): torch's results there are NaN (softmax, logsoftmax) and -inf or
+inf (logsumexp), and a GPU's row maximum must not drop a NaN.
"""
import math

import numpy as np

from ..specs.softmax import softmax_spec
from . import Case, finite_max, layouts_for, shapes
from .elementwise import nonfinite_draw, with_nonfinite

#: the extreme logit a naive exp(x) / sum(exp(x)) overflows on
EXTREME = 1e4


def _logits(shape, extreme):
    import numpy as np
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    ordinary = st.floats(-4.0, 4.0, allow_nan=False, allow_infinity=False, width=64)
    if extreme:
        elements = st.one_of(ordinary, ordinary, st.sampled_from([EXTREME, -EXTREME]))
    else:
        elements = ordinary
    return hnp.arrays(np.float64, shape, elements=elements)


def _case(st, draw, with_keepdims):
    shape = draw(shapes(min_dims=1, max_dims=4, min_side=0, max_side=17))
    size = 1
    for s in shape:
        size *= s
    if size > 3000:                       # keep the interpreter fast
        shape = tuple(min(s, 5) for s in shape)
    nd = len(shape)
    axis = draw(st.integers(0, nd - 1))
    if draw(st.integers(0, 5)) == 0:
        axis -= nd                        # the negative spelling, now and then
    extreme = draw(st.integers(0, 3)) == 0
    x = draw(_logits(shape, extreme))
    nonfinite = nonfinite_draw(draw)
    masked_row = nonfinite and x.size > 0 and draw(st.booleans())
    if nonfinite:
        x = with_nonfinite(draw, x)
    if masked_row:   # one whole row along the axis -inf
        row = [draw(st.integers(0, s - 1)) for s in shape]
        row[axis % nd] = slice(None)
        x[tuple(row)] = -float("inf")
    attrs = {"axis": axis}
    if with_keepdims:
        attrs["keepdims"] = draw(st.booleans())
    return Case(inputs=(x,), attrs=attrs, layouts=draw(layouts_for(1)),
                note=f"{shape} axis={axis}" + (" extreme" if extreme else "")
                + (" NaN/inf" if nonfinite else "") + (" an all -inf row" if masked_row else ""))


def softmax_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, False))()


def logsoftmax_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, False))()


def logsumexp_strategy(dtype):
    from hypothesis import strategies as st
    return st.composite(lambda draw: _case(st, draw, True))()


def softmax_torch(x, axis):
    import torch
    return torch.softmax(x, axis)


def logsoftmax_torch(x, axis):
    import torch
    return torch.log_softmax(x, axis)


def logsumexp_torch(x, axis, keepdims=False):
    import torch
    return torch.logsumexp(x, axis, keepdim=keepdims)


# --- tolerance floors: the sums that cancel ------------------------------------------------

def softmax_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Backward: dx = y * (g - sum_j g_j y_j) cancels to zero for a constant g;
    its terms have size y * (|g| + sum_j |g_j| y_j)."""
    if direction != "backward":
        return None
    x = np.asarray(inputs[0])
    axis = softmax_spec("softmax", x.shape, x.dtype, attrs["axis"]).axis
    y, g = np.abs(out), np.abs(grad)
    return (finite_max(y * (g + (g * y).sum(axis=axis, keepdims=True))),)


def logsoftmax_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: y = x - m - log(sum exp(x - m)) has absolute error ~ u (|x - m| + log K).
    Backward: dx = g - exp(y) * sum_j g_j cancels likewise; its terms are
    |g| + exp(y) sum_j |g_j|."""
    x = np.asarray(inputs[0], dtype=np.float64)
    spec = softmax_spec("logsoftmax", x.shape, x.dtype, attrs["axis"])
    if direction == "forward":
        return 2 * finite_max(x) + math.log(max(spec.row_length, 1))
    g = np.abs(grad)
    return (finite_max(g + np.exp(out) * g.sum(axis=spec.axis, keepdims=True)),)


def logsumexp_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: y = m + log(sum exp(x - m)) cancels when m ~ -log(sum ...); the
    terms are |m| and log K at most."""
    if direction != "forward":
        return None
    x = np.asarray(inputs[0], dtype=np.float64)
    spec = softmax_spec("logsumexp", x.shape, x.dtype, attrs["axis"])
    return finite_max(x) + math.log(max(spec.row_length, 1))
