"""Strategies and torch oracles for the ``conv`` family, any spatial rank.

Each draw picks the spatial rank R (1, 2 or 3; 2 in half the draws) first, then a small problem
for the interpreter: N <= 2 (0 included), channels per group 1-2 with
groups 1-2, sides up to 9 (1-D: 18; 3-D: 4, so a 3-D example costs about
what a 2-D one does), kernels up to 3 (3-D: 2), strides and dilations 1-2,
asymmetric padding (lo, hi per axis) in 0..2 (3-D: 0..1), output_padding
below the stride or the dilation, and random layouts for x and w.

Oracles, chosen by rank: ``torch.nn.functional.conv1d/2d/3d`` on the input
padded by ``F.pad`` (asymmetric padding); ``conv_transpose`` is computed by
torch's conv_transpose1d/2d/3d with no padding and then cropped by ``F.pad``
with negative widths (lo, and hi minus output_padding, per axis), which is
exactly torch's own padding/output_padding semantics generalised to
asymmetric padding; for symmetric padding it equals torch's
``F.conv_transpose2d(..., padding=p, output_padding=op)`` (checked in
tests/test_conv_family.py). ``conv_bias_act`` is that conv oracle plus the
bias and torch's relu/sigmoid/tanh (autograd's backward of which also reads
the output).
"""
import numpy as np

from ..reference.conv import conv_backward
from ..specs.conv import FUSABLE_ACTIVATIONS
from . import Case, finite_max, floats, layouts_for, through_activation_terms, torch_activated
from .elementwise import nonfinite_draw, with_nonfinite

#: per rank: (largest side, largest kernel side, largest padding on one side)
_LIMITS = {1: (18, 3, 2), 2: (9, 3, 2), 3: (4, 2, 1)}


def _common(draw, st):
    """The rank (2-D, the common case and hypothesis's simplest, in half the
    draws), then groups, batch, kernel, stride, dilation and padding (2R entries)."""
    R = draw(st.sampled_from((2, 1, 2, 3)))
    _, max_kernel, max_pad = _LIMITS[R]
    groups = draw(st.sampled_from((1, 1, 2)))
    n = draw(st.sampled_from((0, 1, 1, 2, 2)))
    kernel = tuple(draw(st.integers(1, max_kernel)) for _ in range(R))
    stride = tuple(draw(st.integers(1, 2)) for _ in range(R))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(R))
    padding = tuple(draw(st.integers(0, max_pad)) for _ in range(2 * R))
    return R, groups, n, kernel, stride, dilation, padding


def _max_side(R, max_side):
    """``max_side`` (the 2-D largest side) for rank R: twice it in 1-D, the 3-D limit in 3-D."""
    return {1: 2 * max_side, 2: max_side, 3: _LIMITS[3][0]}[R]


def _conv_problem(draw, st, max_side, w_range):
    """x, w and conv's attrs, with sides up to ``max_side`` (scaled by rank) and
    weights in [-w_range, w_range]; the padded input holds at least one dilated kernel."""
    R, groups, n, kernel, stride, dilation, padding = _common(draw, st)
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    top = _max_side(R, max_side)
    sides = []
    for a in range(R):
        least = max(1, dilation[a] * (kernel[a] - 1) + 1 - padding[2 * a] - padding[2 * a + 1])
        sides.append(draw(st.integers(least, max(least, top))))
    x = draw(floats((n, cg * groups) + tuple(sides), -2.0, 2.0))
    w = draw(floats((og * groups, cg) + kernel, -w_range, w_range))
    return x, w, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def conv_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        x, w, attrs = _conv_problem(draw, st, max_side=9, w_range=2.0)
        return Case(inputs=(x, w), attrs=attrs, layouts=draw(layouts_for(2)),
                    note=f"x {x.shape} w {w.shape} {attrs}")

    return case()


def conv_transpose_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        R, groups, n, kernel, stride, dilation, padding = _common(draw, st)
        cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        # torch allows output_padding below the stride *or* the dilation
        output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation))
        top = {1: 14, 2: 7, 3: 3}[R]
        sides = []
        for a in range(R):
            # the output side (h - 1)*s - lo - hi + d*(k - 1) + op + 1 must be >= 1
            h = draw(st.integers(1, top))
            while ((h - 1) * stride[a] + dilation[a] * (kernel[a] - 1) + output_padding[a] + 1
                   - padding[2 * a] - padding[2 * a + 1] < 1):
                h += 1
            sides.append(h)
        x = draw(floats((n, cg * groups) + tuple(sides), -2.0, 2.0))
        w = draw(floats((cg * groups, og) + kernel, -2.0, 2.0))
        attrs = dict(stride=stride, padding=padding, output_padding=output_padding,
                     dilation=dilation, groups=groups)
        return Case(inputs=(x, w), attrs=attrs, layouts=draw(layouts_for(2)),
                    note=f"x {x.shape} w {w.shape} {attrs}")

    return case()


def _torch_pad(padding):
    """F.pad's widths (last axis first) for the flat (lo_0, hi_0, lo_1, hi_1, ...)."""
    out = []
    for a in reversed(range(len(padding) // 2)):
        out += [padding[2 * a], padding[2 * a + 1]]
    return tuple(out)


def conv_torch(x, w, stride=None, padding=None, dilation=None, groups=1):
    """The oracle: ``F.conv1d/2d/3d`` (by rank) on ``F.pad(x)`` (torch's padding is symmetric only)."""
    import torch.nn.functional as F
    R = x.dim() - 2
    conv = (F.conv1d, F.conv2d, F.conv3d)[R - 1]
    padding = (0,) * (2 * R) if padding is None else padding
    return conv(F.pad(x, _torch_pad(padding)), w, stride=tuple(stride or (1,) * R),
                dilation=tuple(dilation or (1,) * R), groups=groups)


def conv_transpose_torch(x, w, stride=None, padding=None, output_padding=None, dilation=None, groups=1):
    """The oracle: ``F.conv_transpose1d/2d/3d`` (by rank) without padding, then
    cropped by ``F.pad`` with negative widths: lo by the padding, hi by the
    padding less output_padding (torch's semantics, made asymmetric)."""
    import torch.nn.functional as F
    R = x.dim() - 2
    transpose = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[R - 1]
    padding = (0,) * (2 * R) if padding is None else padding
    output_padding = (0,) * R if output_padding is None else output_padding
    y = transpose(x, w, stride=tuple(stride or (1,) * R), dilation=tuple(dilation or (1,) * R), groups=groups)
    crop = []
    for a in range(R):
        crop += [-padding[2 * a], output_padding[a] - padding[2 * a + 1]]
    return F.pad(y, _torch_pad(tuple(crop)))


def conv_bias_act_strategy(dtype):
    """conv's cases, a bias of O entries and one of the fusable activations;
    smaller (sides <= 7 in 2-D, no groups beyond 2) to keep the interpreter
    fast. In about three draws in four some entries of x and of the bias are
    NaN, +inf and -inf, with relu (whose NaN branch a GPU's max or a
    comparison can get wrong; torch's relu'(NaN) = 1) in half of those draws."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        x, w, attrs = _conv_problem(draw, st, max_side=7, w_range=1.0)
        nonfinite = nonfinite_draw(draw, out_of=4)
        activations = (("relu",) * 3 + tuple(a for a in FUSABLE_ACTIVATIONS if a != "relu") if nonfinite
                       else FUSABLE_ACTIVATIONS)
        attrs["activation"] = draw(st.sampled_from(activations))
        b = draw(floats((w.shape[0],), -1.0, 1.0))
        if nonfinite:   # NaN/inf outputs, and whole output channels of them
            x, b = with_nonfinite(draw, x), with_nonfinite(draw, b)
        return Case(inputs=(x, w, b), attrs=attrs, layouts=draw(layouts_for(3)),
                    note=f"x {x.shape} w {w.shape} b {b.shape} {attrs}" + (" NaN/inf" if nonfinite else ""))

    return case()


def conv_bias_act_torch(x, w, b, stride=None, padding=None, dilation=None, groups=1, activation="identity"):
    """The oracle: torch's conv (as ``conv_torch``), ``+ b`` per channel,
    then ``torch.relu`` / ``torch.sigmoid`` / ``torch.tanh``."""
    z = conv_torch(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return torch_activated(z + b.reshape((1, -1) + (1,) * (x.dim() - 2)), activation)


def conv_bias_act_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: a sum of products (the conv) through a monotone activation,
    bounded by the same computation on |x|, |w|, |b|.
    Backward: it reads the output y rounded to the dtype, and act'(y) moves
    by |d act'/dy| u |y| (sigmoid: |1 - 2y|, tanh: 2|y|), so gz = G act'(y)
    carries terms of size |G| (|act'(y)| + |d act'/dy| |y|); dx, dw and db
    then sum those like conv's backward (on |x|, |w|)."""
    x, w, b = (np.abs(np.asarray(a, dtype=np.float64)) for a in inputs)
    if direction == "forward":
        return finite_max(reference(x, w, b, **attrs))
    gz = through_activation_terms(grad, out, attrs["activation"], "conv_bias_act_magnitude")
    conv_attrs = {k: v for k, v in attrs.items() if k != "activation"}
    dx, dw = conv_backward(gz, gz, x, w, **conv_attrs)
    return (finite_max(dx), finite_max(dw), finite_max(gz.sum(axis=(0,) + tuple(range(2, gz.ndim)))))
