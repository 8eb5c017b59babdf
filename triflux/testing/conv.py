"""Strategies and torch oracles for the ``conv`` family.

Small NCHW problems for the interpreter: N <= 2 (0 included), channels per
group 1-2 with groups 1-2, sides up to 9 (1 included), kernels up to 3,
strides and dilations 1-2, asymmetric padding (top, bottom, left, right) in
0..2, output_padding below the stride, and random layouts for x and w.

Oracles: ``torch.nn.functional.conv2d`` on the input padded by ``F.pad``
(asymmetric padding); ``conv_transpose2d`` is computed by torch with no
padding and then cropped by ``F.pad`` with negative widths (top/left and
bottom/right minus output_padding), which is exactly torch's own
padding/output_padding semantics generalised to asymmetric padding; for
symmetric padding it equals ``F.conv_transpose2d(..., padding=p,
output_padding=op)`` (checked in tests/test_conv_family.py).
``conv2d_bias_act`` is that conv2d oracle plus the bias and torch's
relu/sigmoid/tanh (autograd's backward of which also reads the output).
"""
import numpy as np

from ..reference.conv import conv2d_backward
from ..specs.conv import FUSABLE_ACTIVATIONS
from . import Case, finite_max, floats, layouts_for, through_activation_terms, torch_activated
from .elementwise import nonfinite_draw, with_nonfinite


def _common(draw, st):
    groups = draw(st.sampled_from((1, 1, 2)))
    n = draw(st.sampled_from((0, 1, 1, 2, 2)))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    return groups, n, (kh, kw), stride, dilation, padding


def _conv2d_problem(draw, st, max_side, w_range):
    """x, w and conv2d's attrs, with sides up to ``max_side`` and weights in
    [-w_range, w_range]; the padded input holds at least one dilated kernel."""
    groups, n, (kh, kw), stride, dilation, padding = _common(draw, st)
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pt, pb, pl, pr = padding
    min_h = max(1, dilation[0] * (kh - 1) + 1 - pt - pb)
    min_w = max(1, dilation[1] * (kw - 1) + 1 - pl - pr)
    h = draw(st.integers(min_h, max(min_h, max_side)))
    w_ = draw(st.integers(min_w, max(min_w, max_side)))
    x = draw(floats((n, cg * groups, h, w_), -2.0, 2.0))
    w = draw(floats((og * groups, cg, kh, kw), -w_range, w_range))
    return x, w, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def conv2d_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        x, w, attrs = _conv2d_problem(draw, st, max_side=9, w_range=2.0)
        return Case(inputs=(x, w), attrs=attrs, layouts=draw(layouts_for(2)),
                    note=f"x {x.shape} w {w.shape} {attrs}")

    return case()


def conv_transpose2d_strategy(dtype):
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        groups, n, (kh, kw), stride, dilation, padding = _common(draw, st)
        cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        # torch allows output_padding below the stride *or* the dilation
        output_padding = (draw(st.integers(0, max(stride[0], dilation[0]) - 1)),
                          draw(st.integers(0, max(stride[1], dilation[1]) - 1)))
        pt, pb, pl, pr = padding
        # the output side (h - 1)*s - pt - pb + d*(k - 1) + op + 1 must be >= 1
        h = draw(st.integers(1, 7))
        w_ = draw(st.integers(1, 7))
        while (h - 1) * stride[0] + dilation[0] * (kh - 1) + output_padding[0] + 1 - pt - pb < 1:
            h += 1
        while (w_ - 1) * stride[1] + dilation[1] * (kw - 1) + output_padding[1] + 1 - pl - pr < 1:
            w_ += 1
        x = draw(floats((n, cg * groups, h, w_), -2.0, 2.0))
        w = draw(floats((cg * groups, og, kh, kw), -2.0, 2.0))
        attrs = dict(stride=stride, padding=padding, output_padding=output_padding,
                     dilation=dilation, groups=groups)
        return Case(inputs=(x, w), attrs=attrs, layouts=draw(layouts_for(2)),
                    note=f"x {x.shape} w {w.shape} {attrs}")

    return case()


def conv2d_torch(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """The oracle: ``F.conv2d`` on ``F.pad(x)`` (torch's padding is symmetric only)."""
    import torch.nn.functional as F
    pt, pb, pl, pr = padding
    return F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, stride=tuple(stride), dilation=tuple(dilation),
                    groups=groups)


def conv_transpose2d_torch(x, w, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                           dilation=(1, 1), groups=1):
    """The oracle: ``F.conv_transpose2d`` without padding, then cropped by
    ``F.pad`` with negative widths: top/left by the padding, bottom/right by
    the padding less output_padding (torch's semantics, made asymmetric)."""
    import torch.nn.functional as F
    pt, pb, pl, pr = padding
    oh, ow = output_padding
    y = F.conv_transpose2d(x, w, stride=tuple(stride), dilation=tuple(dilation), groups=groups)
    return F.pad(y, (-pl, ow - pr, -pt, oh - pb))


def conv2d_bias_act_strategy(dtype):
    """conv2d's cases, a bias of O entries and one of the fusable activations;
    smaller (sides <= 7, no groups beyond 2) to keep the interpreter fast. In
    about three draws in four some entries of x and of the bias are NaN, +inf
    and -inf, with relu (whose NaN branch a GPU's max or a comparison can get
    wrong; torch's relu'(NaN) = 1) in half of those draws."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        x, w, attrs = _conv2d_problem(draw, st, max_side=7, w_range=1.0)
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


def conv2d_bias_act_torch(x, w, b, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                          activation="identity"):
    """The oracle: torch's conv2d (as ``conv2d_torch``), ``+ b`` per channel,
    then ``torch.relu`` / ``torch.sigmoid`` / ``torch.tanh``."""
    z = conv2d_torch(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return torch_activated(z + b.reshape(1, -1, 1, 1), activation)


def conv2d_bias_act_magnitude(direction, *, inputs, attrs, out=None, grad=None, reference=None):
    """Forward: a sum of products (the conv) through a monotone activation,
    bounded by the same computation on |x|, |w|, |b|.
    Backward: it reads the output y rounded to the dtype, and act'(y) moves
    by |d act'/dy| u |y| (sigmoid: |1 - 2y|, tanh: 2|y|), so gz = G act'(y)
    carries terms of size |G| (|act'(y)| + |d act'/dy| |y|); dx, dw and db
    then sum those like conv2d's backward (on |x|, |w|)."""
    x, w, b = (np.abs(np.asarray(a, dtype=np.float64)) for a in inputs)
    if direction == "forward":
        return finite_max(reference(x, w, b, **attrs))
    gz = through_activation_terms(grad, out, attrs["activation"], "conv2d_bias_act_magnitude")
    conv_attrs = {k: v for k, v in attrs.items() if k != "activation"}
    dx, dw = conv2d_backward(gz, gz, x, w, **conv_attrs)
    return (finite_max(dx), finite_max(dw), finite_max(gz.sum(axis=(0, 2, 3))))
