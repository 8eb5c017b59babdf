"""conv family: fixed configurations against torch, beyond the property suite.

Forward and both gradients of conv and conv_transpose, reference (float64)
and kernels (float32, float16, float64; the interpreter without a GPU), on
named configurations of rank 2: 'same' padding, stride 2, groups 2 (with stride 1 too), dilation 2,
asymmetric padding, output_padding, an empty batch, transposed/strided
inputs; and of ranks 1 and 3 where the rank-generic code could hide a bug
(strides, asymmetric padding, groups, output_padding and the depth axis of
the kernels' phases); the stride-1 input gradient as a correlation with the
turned kernel (named and drawn configurations, every rank). Also: the
asymmetric-padding oracle of conv_transpose equals torch's own padding where
that is symmetric, error messages (ranks that disagree), the 2-D spec entry
points, and torch doing nothing but allocate and make views in the kernels.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from triflux import backend
from triflux.errors import DTypeError, ShapeError
from triflux.primitives import REGISTRY
from triflux.reference import conv as ref
from triflux.specs.conv import FUSABLE_ACTIVATIONS, conv_spec, conv_transpose_spec

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from triflux.testing import conv as oracle  # noqa: E402

CONV2D = {
    "same3x3": ((2, 3, 7, 6), (4, 3, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "same5x3": ((1, 2, 6, 5), (3, 2, 5, 3), dict(stride=(1, 1), padding=(2, 2, 1, 1), dilation=(1, 1), groups=1)),
    "stride2": ((2, 2, 9, 8), (3, 2, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "groups2": ((2, 4, 5, 6), (6, 2, 3, 2), dict(stride=(1, 2), padding=(1, 0, 0, 1), dilation=(1, 1), groups=2)),
    "groups2_stride1": ((2, 4, 5, 7), (6, 2, 3, 3), dict(stride=(1, 1), padding=(2, 1, 1, 3), dilation=(1, 2), groups=2)),
    "dilation2": ((1, 2, 9, 9), (2, 2, 3, 3), dict(stride=(1, 1), padding=(2, 2, 2, 2), dilation=(2, 2), groups=1)),
    "asymmetric": ((2, 1, 5, 7), (2, 1, 2, 3), dict(stride=(2, 1), padding=(0, 2, 1, 0), dilation=(2, 1), groups=1)),
    "empty_batch": ((0, 2, 5, 5), (2, 2, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "1x1": ((2, 3, 4, 4), (5, 3, 1, 1), dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)),
    # rank 1 and rank 3
    "1d_same": ((2, 3, 11), (3, 3, 3), dict(stride=(1,), padding=(1, 1), dilation=(1,), groups=1)),
    "1d_stride2_groups2": ((2, 4, 13), (6, 2, 3), dict(stride=(2,), padding=(2, 0), dilation=(2,), groups=2)),
    "3d_same": ((2, 2, 4, 5, 3), (3, 2, 3, 3, 2), dict(stride=(1, 1, 1), padding=(1, 1, 1, 1, 0, 1),
                                                       dilation=(1, 1, 1), groups=1)),
    "3d_stride_groups2": ((1, 4, 5, 4, 5), (4, 2, 2, 2, 2), dict(stride=(2, 1, 2), padding=(0, 1, 1, 0, 1, 1),
                                                                 dilation=(1, 2, 1), groups=2)),
}

CONV_T = {
    "same3x3": ((2, 3, 5, 6), (3, 4, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), output_padding=(0, 0), dilation=(1, 1), groups=1)),
    "stride2_up": ((2, 2, 4, 5), (2, 3, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), output_padding=(1, 1), dilation=(1, 1), groups=1)),
    "stride2_k2": ((1, 2, 4, 4), (2, 2, 2, 2), dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0), dilation=(1, 1), groups=1)),
    "groups2": ((2, 4, 4, 3), (4, 1, 3, 2), dict(stride=(2, 1), padding=(1, 0, 0, 1), output_padding=(1, 0), dilation=(1, 1), groups=2)),
    "dilation2": ((1, 2, 4, 4), (2, 2, 3, 3), dict(stride=(1, 2), padding=(2, 1, 0, 2), output_padding=(0, 1), dilation=(2, 2), groups=1)),
    "empty_batch": ((0, 2, 4, 4), (2, 3, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), output_padding=(1, 1), dilation=(1, 1), groups=1)),
    # a 1x1 output of stride 2: three of the output's four phases (p, q mod 2) have no pixel
    "stride_over_output": ((2, 3, 1, 1), (3, 4, 1, 1), dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0), dilation=(1, 1), groups=1)),
    "1d_stride2_up": ((2, 2, 6), (2, 3, 3), dict(stride=(2,), padding=(1, 0), output_padding=(1,), dilation=(1,), groups=1)),
    # every depth phase of a stride-2 depth axis, with output_padding on it
    "3d_stride2_up": ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), dict(stride=(2, 1, 2), padding=(0, 1, 1, 0, 0, 1),
                                                             output_padding=(1, 0, 0), dilation=(1, 1, 1), groups=2)),
}

OPS = {"conv": (CONV2D, oracle.conv_torch), "conv_transpose": (CONV_T, oracle.conv_transpose_torch)}
CASES = [(op, name) for op, (table, _) in OPS.items() for name in table]


def _rand(shape, seed):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


def _torch_all(op, x, w, g, attrs, dtype=torch.float64):
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    wt = torch.tensor(w, dtype=dtype, requires_grad=True)
    y = OPS[op][1](xt, wt, **attrs)
    y.backward(torch.tensor(g, dtype=dtype))
    return y.detach().double().numpy(), xt.grad.double().numpy(), wt.grad.double().numpy()


def _problem(op, name):
    table = OPS[op][0]
    xs, ws, attrs = table[name]
    x, w = _rand(xs, 1), _rand(ws, 2)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    g = _rand(y.shape, 3)
    return x, w, g, attrs


def _close(actual, expected, tol, what):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.size == 0:
        return
    err = np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


def _reference_against_torch(op, name, label):
    """The reference's forward and both gradients of a named case against
    torch's (float64, to 1e-12); returns the case (x, w, g, attrs)."""
    x, w, g, attrs = _problem(op, name)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    dx, dw = getattr(ref, f"{op}_backward")(g, y, x, w, **attrs)
    ty, tdx, tdw = _torch_all(op, x, w, g, attrs)
    for a, e, what in ((y, ty, "y"), (dx, tdx, "dx"), (dw, tdw, "dw")):
        _close(a, e, 1e-12, f"{op} {name} {label} {what}")
        assert np.asarray(a).dtype == np.float64
    return x, w, g, attrs


@pytest.mark.parametrize("op,name", CASES)
def test_reference_matches_torch(op, name):
    _reference_against_torch(op, name, "reference")


TURNED = ["same3x3", "same5x3", "groups2_stride1", "dilation2", "1x1", "empty_batch", "1d_same", "3d_same"]


@pytest.mark.parametrize("op,name", [("conv", n) for n in TURNED] + [("conv_transpose", "same3x3")])
def test_input_gradient_as_a_correlation_with_the_turned_kernel(op, name, monkeypatch):
    """The stride-1 input gradient computed as a forward correlation of g with
    the turned kernel (``_flipped_correlation``: chosen for large batches only,
    forced here for small ones), plain and fused, equals torch's and col2im's."""
    monkeypatch.setattr(ref, "_TURNED_PIXELS", 0)
    x, w, g, attrs = _reference_against_torch(op, name, "turned kernel")
    if op == "conv":
        spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, **attrs)
        assert ref._flipped_correlation(g.shape, w, spec) is not None        # the path under test
        b = _rand((w.shape[0],), 5)
        yb = ref.conv_bias_act_forward(x, w, b, activation="tanh", **attrs)
        turned = ref.conv_bias_act_backward(g, yb, x, w, b, activation="tanh", **attrs)
        monkeypatch.setattr(ref, "_TURNED_PIXELS", float("inf"))
        by_col2im = ref.conv_bias_act_backward(g, yb, x, w, b, activation="tanh", **attrs)
        for a, e, what in zip(turned, by_col2im, ("dx", "dw", "db")):
            _close(a, e, 1e-12, f"conv_bias_act {name} turned kernel {what}")


@st.composite
def _stride1_convs(draw):
    """A stride-1 conv of rank 1, 2 or 3 the turned kernel applies to: any
    groups, kernel, dilation and padding within the kernel's reach on each side."""
    R = draw(st.integers(1, 3))
    G = draw(st.integers(1, 3))
    Cg, Og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(R))
    dilation = tuple(draw(st.integers(1, 3 if R < 3 else 2)) for _ in range(R))
    pads, sides = (), ()
    for k, d in zip(kernel, dilation):
        pads += (draw(st.integers(0, d * (k - 1))), draw(st.integers(0, d * (k - 1))))
        sides += (draw(st.integers(max(1, d * (k - 1) + 1 - pads[-2] - pads[-1]), 7 if R < 3 else 5)),)
    return ((draw(st.integers(1, 3)), G * Cg) + sides, (G * Og, Cg) + kernel,
            dict(stride=(1,) * R, padding=pads, dilation=dilation, groups=G))


@settings(max_examples=40, deadline=None)
@given(case=_stride1_convs(), seed=st.integers(0, 2 ** 16))
def test_turned_kernel_equals_col2im_on_drawn_stride1_convs(case, seed):
    """conv's input gradient and conv_transpose's forward (with an
    output_padding below the dilation where there is room) by the turned kernel
    equal col2im's, on drawn shapes, groups, kernels, dilations and paddings."""
    xs, ws, attrs = case
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, xs), rng.uniform(-1, 1, ws)
    g = rng.uniform(-1, 1, ref.conv_forward(x, w, **attrs).shape)
    op = tuple(d - 1 for d in attrs["dilation"])
    results = []
    for pixels in (0, float("inf")):                 # turned kernel, then col2im
        ref._TURNED_PIXELS, saved = pixels, ref._TURNED_PIXELS
        try:
            results.append((ref.conv_backward(g, None, x, w, **attrs)[0],
                            ref.conv_transpose_forward(g, w, output_padding=op, **attrs)))
        finally:
            ref._TURNED_PIXELS = saved
    for turned, by_col2im in zip(*results):
        np.testing.assert_allclose(turned, by_col2im, rtol=1e-12, atol=1e-12)


def test_the_turned_kernel_is_not_used_where_it_would_differ_or_cost_more(monkeypatch):
    """Infinite weights (the correlation's zero padding would make 0 * inf = NaN
    where col2im has no product), strides, padding past the kernel's reach and
    more output than input channels on wide images keep col2im; the NaN/inf
    pattern of dx with an infinite weight is col2im's (and torch's)."""
    monkeypatch.setattr(ref, "_TURNED_PIXELS", 0)
    x, w, g, attrs = _problem("conv", "same3x3")
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, **attrs)
    w_inf = w.copy()
    w_inf[0, 0, 0, 0] = np.inf
    assert ref._flipped_correlation(g.shape, w_inf, spec) is None
    dx = ref.conv_backward(g, None, x, w_inf, **attrs)[0]
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w_inf)
    F.conv2d(xt, wt, padding=1).backward(torch.tensor(g))
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(xt.grad.numpy()))
    for name in ("stride2", "asymmetric", "1d_stride2_groups2", "3d_stride_groups2"):
        x2, w2, g2, attrs2 = _problem("conv", name)
        assert ref._flipped_correlation(g2.shape, w2, conv_spec(x2.shape, w2.shape, x2.dtype, w2.dtype,
                                                                    **attrs2)) is None
    past = dict(attrs, padding=(3, 1, 1, 1))                          # 3 rows past a 3x3 kernel's reach of 2
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, **past)
    assert ref._flipped_correlation(spec.out_shape, w, spec) is None
    wide = np.zeros((2, 2, 3, 3)), np.zeros((4, 2, 3, 3))             # 2 => 4 channels on a 9- and an 8-wide image
    for width, turned in ((9, False), (8, True)):
        spec = conv_spec((1, 2, 4, width), wide[1].shape, np.float64, np.float64, padding=(1, 1, 1, 1))
        assert (ref._flipped_correlation(spec.out_shape, wide[1], spec) is not None) == turned
    monkeypatch.setattr(ref, "_TURNED_PIXELS", 1024)
    assert ref._flipped_correlation(g.shape, w, conv_spec(x.shape, w.shape, x.dtype, w.dtype, **attrs)) is None


@pytest.mark.parametrize("xs,ws,padding", [
    ((1, 2, 3, 4, 20), (2, 2, 3, 2, 1), (0, 0, 1, 0, 0, 0)),      # 3-D: one output plane along the depth
    ((2, 3, 5, 40), (4, 3, 2, 3), (1, 0, 1, 1)),                   # 2-D: wide rows
    ((2, 3, 5, 6, 7), (3, 3, 2, 2, 2), (1, 0, 0, 1, 1, 1)),        # 3-D, several planes: slice-adds per tap
])
def test_col2im_runs_along_the_rows_where_it_can(xs, ws, padding, monkeypatch):
    """col2im's slice-adds run along the rows laid end to end (a spare row per
    plane) for stride 1 with a single output plane before the last two axes, and
    tap by tap otherwise; both equal torch's input gradient."""
    monkeypatch.setattr(ref, "_TURNED_PIXELS", float("inf"))
    R = len(xs) - 2
    x, w = _rand(xs, 61), _rand(ws, 62)
    attrs = dict(stride=(1,) * R, padding=padding, dilation=(1,) * R, groups=1)
    y = ref.conv_forward(x, w, **attrs)
    g = _rand(y.shape, 63)
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, **attrs)
    assert ref._input_grad_buffer(g, w, spec)[1] == (all(o == 1 for o in y.shape[2:-2]) and xs[-1] > 16)
    dx = ref.conv_backward(g, y, x, w, **attrs, needs=(True, False))[0]
    xt = torch.tensor(x, requires_grad=True)
    oracle.conv_torch(xt, torch.tensor(w), **attrs).backward(torch.tensor(g))
    _close(dx, xt.grad.numpy(), 1e-12, f"col2im {xs} {ws}")


@pytest.mark.parametrize("name", ["same3x3", "1d_same", "3d_same"])
def test_narrow_products_in_column_chunks(name, monkeypatch):
    """Products of few output channels over a long im2col matrix run in column
    chunks (``_product``: forced here on small cases, chunks of 64 columns): the
    forward, and the input gradient as a correlation with the turned kernel, equal torch's."""
    monkeypatch.setattr(ref, "_LONG", 0)
    monkeypatch.setattr(ref, "_CHUNK_VALUES", 1)
    monkeypatch.setattr(ref, "_TURNED_PIXELS", 0)
    xs, ws, attrs = CONV2D[name]
    x, w = _rand(xs, 71), _rand(ws, 72)
    batch = _rand((3,) + xs[1:], 73)                      # more columns than one chunk
    for inputs in ((x, w), (batch, w)):
        y = ref.conv_forward(*inputs, **attrs)
        g = _rand(y.shape, 74)
        dx, dw = ref.conv_backward(g, y, *inputs, **attrs)
        for a, e, what in zip((y, dx, dw), _torch_all("conv", *inputs, g, attrs), ("y", "dx", "dw")):
            _close(a, e, 1e-12, f"chunked {name} {what}")


GRID = ["same3x3", "same5x3", "groups2_stride1", "dilation2", "1x1", "3d_same"]


@pytest.fixture
def any_grid(monkeypatch):
    """The grid for every stride-1 conv of rank 2 or 3, however wasteful
    (``_grid_plan``'s cache cleared before and after)."""
    ref._grid_plan.cache_clear()
    monkeypatch.setattr(ref, "_GRID_WASTE", float("inf"))
    monkeypatch.setattr(ref, "_GRID_RANKS", (2, 3))
    yield
    ref._grid_plan.cache_clear()


@pytest.mark.parametrize("name", GRID)
@pytest.mark.parametrize("columns,values", [(1, 1 << 18), (7, 1), (7, 1 << 18), (256, 1 << 18)])
def test_stride1_convs_on_the_grid(name, columns, values, monkeypatch, any_grid):
    """Stride-1 convs computed on the grid (``_grid_plan``: the padded input laid
    out flat, each tap a constant offset; forced here on small cases, in blocks
    of one column, of 7 (a narrower last block) and of 256, one block or many
    per call), the forward, the input gradient as a correlation
    with the turned kernel and the weight gradient (narrow: one product per tap;
    else whole im2col), one sample per group and the whole batch in one, plain
    and fused, equal torch's; and the same with the channels last (``_WIDE``:
    the row-tap products of :func:`_rows_conv`, in chunks of the fewest rows or
    of many)."""
    monkeypatch.setattr(ref, "_BLOCK_COLUMNS", columns)
    monkeypatch.setattr(ref, "_GIL_VALUES", values)
    monkeypatch.setattr(ref, "_BLOCK_VALUES", 1)
    monkeypatch.setattr(ref, "_TAP_VALUES", 1)
    monkeypatch.setattr(ref, "_TURNED_PIXELS", 0)
    xs, ws, attrs = CONV2D[name]
    spec = conv_spec(xs, ws, np.float64, np.float64, **attrs)
    assert ref._grid_plan(spec, xs[0]) is not None                     # the path under test
    monkeypatch.setattr(ref, "_ROWS_VALUES", values)
    # narrow (blocks per call, per-tap weight gradient), then not; then the channels last
    for narrow, wide in ((16, 1 << 30), (0, 1 << 30), (16, 1)):
        monkeypatch.setattr(ref, "_NARROW", narrow)
        monkeypatch.setattr(ref, "_TAP_CHANNELS", narrow)
        monkeypatch.setattr(ref, "_WIDE", wide)
        for pixels, threads in ((1, 2), (1 << 20, 1)):                # a group per sample, then one group
            monkeypatch.setattr(ref, "_GROUP_PIXELS", pixels)
            monkeypatch.setattr(ref, "thread_count", lambda: threads)
            x, w, g, _ = _reference_against_torch("conv", name, f"grid {columns} {narrow} {pixels}")
            b = _rand((w.shape[0],), 5)
            y = ref.conv_bias_act_forward(x, w, b, activation="tanh", **attrs)
            yt = torch.tanh(oracle.conv_torch(torch.tensor(x), torch.tensor(w), **attrs)
                            + torch.tensor(b).reshape((1, -1) + (1,) * (x.ndim - 2)))
            _close(y, yt.numpy(), 1e-12, f"grid {name} fused y")
    monkeypatch.setattr(ref, "_GROUP_PIXELS", 1)
    _reference_against_torch("conv_transpose", "same3x3", "grid")


def test_the_grid_weight_gradient_keeps_infinite_inputs_exact(any_grid):
    """A grid column of no output position still reads the input, times a zero
    output gradient: with an infinite input that would be 0 * inf = NaN where
    the weight gradient has no such product, so such inputs take im2col, and the
    NaN/inf pattern of dw is torch's."""
    xs, ws, attrs = CONV2D["same3x3"]
    x, w = _rand(xs, 81), _rand(ws, 82)
    x[0, 0, 0, 0] = np.inf
    g = _rand(ref.conv_forward(x, w, **attrs).shape, 83)
    dw = ref.conv_backward(g, None, x, w, **attrs)[1]
    xt, wt = torch.tensor(x), torch.tensor(w, requires_grad=True)
    oracle.conv_torch(xt, wt, **attrs).backward(torch.tensor(g))
    np.testing.assert_array_equal(np.isnan(dw), np.isnan(wt.grad.numpy()))
    np.testing.assert_array_equal(np.isinf(dw), np.isinf(wt.grad.numpy()))
    finite = np.isfinite(dw)
    np.testing.assert_allclose(dw[finite], wt.grad.numpy()[finite], rtol=1e-12, atol=1e-12)


def test_the_grid_serves_stride1_convs_with_little_waste():
    """The grid serves stride 1 in 3 dimensions where it has at most
    ``_GRID_WASTE`` positions per output position (a 3-D UNet's 32^3, 16^3 and
    8^3 levels: 9^3 positions for 8^3, one gap of padding a line; not 4^3),
    never strides, 1-D or 2-D convs."""
    for sides, grid in (((32, 32, 32), True), ((16, 16, 16), True), ((8, 8, 8), True), ((4, 4, 4), False),
                        ((48, 48), False), ((2048,), False)):
        R = len(sides)
        spec = conv_spec((2, 8) + sides, (8, 8) + (3,) * R, np.float32, np.float32, padding=(1, 1) * R)
        assert (ref._grid_plan(spec, 2) is not None) == grid
    spec = conv_spec((2, 8, 32, 32, 32), (8, 8, 3, 3, 3), np.float32, np.float32, stride=(2, 2, 2),
                     padding=(1, 1) * 3)
    assert ref._grid_plan(spec, 2) is None


def test_reference_keeps_dtype():
    for name in ("groups2", "1d_stride2_groups2", "3d_same"):
        x, w, g, attrs = _problem("conv", name)
        for dt in (np.float32, np.float16):
            y = ref.conv_forward(x.astype(dt), w.astype(dt), **attrs)
            dx, dw = ref.conv_backward(g.astype(dt), y, x.astype(dt), w.astype(dt), **attrs)
            assert y.dtype == dx.dtype == dw.dtype == dt


def test_transpose_oracle_matches_torch_symmetric_padding():
    """The F.pad-cropping oracle equals torch's own padding/output_padding."""
    x, w = _rand((2, 2, 4, 5), 4), _rand((2, 3, 3, 3), 5)
    for s, p, op, d in (((2, 2), 1, (1, 1), (1, 1)), ((2, 1), 2, (1, 0), (2, 1)), ((1, 1), 1, (0, 0), (1, 1))):
        xt, wt = torch.tensor(x), torch.tensor(w)
        mine = oracle.conv_transpose_torch(xt, wt, stride=s, padding=(p, p, p, p), output_padding=op,
                                           dilation=d)
        theirs = F.conv_transpose2d(xt, wt, stride=s, padding=p, output_padding=op, dilation=d)
        assert torch.equal(mine, theirs)
    # and ranks 1 and 3
    x1, w1 = torch.tensor(_rand((2, 2, 5), 6)), torch.tensor(_rand((2, 3, 3), 7))
    assert torch.equal(oracle.conv_transpose_torch(x1, w1, stride=(2,), padding=(1, 1), output_padding=(1,),
                                                   dilation=(1,)),
                       F.conv_transpose1d(x1, w1, stride=2, padding=1, output_padding=1))
    x3, w3 = torch.tensor(_rand((1, 2, 3, 2, 3), 8)), torch.tensor(_rand((2, 2, 2, 3, 2), 9))
    assert torch.equal(oracle.conv_transpose_torch(x3, w3, stride=(2, 1, 2), padding=(1, 1, 0, 0, 1, 1),
                                                   output_padding=(1, 0, 1), dilation=(1, 1, 1)),
                       F.conv_transpose3d(x3, w3, stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 1)))


def test_reference_errors():
    x, w = np.zeros((1, 4, 5, 5)), np.zeros((2, 3, 3, 3))
    with pytest.raises(ShapeError, match="groups=3"):
        ref.conv_forward(x, w, groups=3)
    with pytest.raises(ShapeError, match="input channels"):
        ref.conv_forward(x, w)
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        ref.conv_forward(np.zeros((1, 3, 2, 2)), np.zeros((2, 3, 3, 3)))
    with pytest.raises(ShapeError, match=r"smaller than the dilated kernel \(3, 3, 5\)"):
        ref.conv_forward(np.zeros((1, 3, 4, 4, 4)), np.zeros((2, 3, 3, 3, 3)), dilation=(1, 1, 2))
    with pytest.raises(DTypeError):
        ref.conv_forward(x.astype(np.float32), np.zeros((2, 4, 3, 3)))
    with pytest.raises(ShapeError, match="output_padding"):
        ref.conv_transpose_forward(np.zeros((1, 2, 3, 3)), np.zeros((2, 2, 3, 3)), stride=(1, 1),
                                   output_padding=(1, 0))


@pytest.mark.parametrize("name", ["conv", "conv_bias_act", "conv_transpose"])
def test_ranks_that_disagree_are_shape_errors_naming_both(name):
    """x of one rank with a weight or per-axis attributes of another, and a
    padding of the wrong length: a ShapeError that names the primitive, the
    expected and actual lengths and the fix, from the spec, before any work."""
    f = getattr(ref, f"{name}_forward")
    bias = (np.zeros(2),) if name == "conv_bias_act" else ()
    x2, x3 = np.zeros((1, 2, 5, 5)), np.zeros((1, 2, 4, 4, 4))
    w2 = np.zeros((2, 2, 3, 3))
    with pytest.raises(ShapeError, match=rf"{name}: x \(1, 2, 4, 4, 4\) is \(N, C, D, H, W\), 3 spatial axes, so w "
                                         r"needs 5 dimensions .* got 4: \(2, 2, 3, 3\); give a kernel of 3 sides"):
        f(x3, w2, *bias)
    with pytest.raises(ShapeError, match=rf"{name}: stride must have 2 entries, one per spatial axis of x "
                                         r"\(1, 2, 5, 5\), got 3: \(1, 1, 1\); pass an int or an 2-tuple"):
        f(x2, w2, *bias, stride=(1, 1, 1))
    with pytest.raises(ShapeError, match=rf"{name}: padding must have 4 entries \(lo, hi per spatial axis of x "
                                         r"\(1, 2, 5, 5\)\), got 2: \(1, 1\)"):
        f(x2, w2, *bias, padding=(1, 1))
    with pytest.raises(ShapeError, match=rf"{name}: x must be \(N, C, \*spatial\) with 1, 2 or 3 spatial axes, "
                                         r"got 6 dimensions"):
        f(np.zeros((1, 2, 3, 3, 3, 3)), np.zeros((2, 2, 1, 1, 1, 1)), *bias)
    if name == "conv_transpose":
        with pytest.raises(ShapeError, match=r"output_padding must have 2 entries"):
            f(x2, w2, output_padding=(0,))


def test_the_2d_spec_entry_points_are_the_generic_specs():
    """conv2d_spec and friends (2-D defaults) build the rank-generic specs."""
    from triflux.specs import conv as specs
    s = specs.conv2d_spec((1, 2, 5, 5), (3, 2, 3, 3), np.float32, np.float32)
    assert s is specs.conv_spec((1, 2, 5, 5), (3, 2, 3, 3), np.float32, np.float32, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert s.rank == 2 and s.out_shape == (1, 3, 3, 3) and s.lifted.x_shape == (1, 2, 1, 5, 5)
    t = specs.conv_transpose2d_spec((1, 2, 3, 3), (2, 4, 2, 2), np.float32, np.float32, stride=(2, 2))
    assert t.rank == 2 and t.out_shape == (1, 4, 6, 6) and t.extra == (0, 0)
    b = specs.conv2d_bias_act_spec((1, 2, 5, 5), (3, 2, 3, 3), (3,), np.float32, np.float32, np.float32,
                                   activation="relu")
    assert b.activation == "relu" and b.out_shape == (1, 3, 3, 3)
    one = conv_spec((2, 3, 10), (4, 3, 3), np.float64, np.float64, (2,), (1, 0), (1,), 1)
    assert one.rank == 1 and one.out_shape == (2, 4, 5) and one.lifted.stride == (1, 1, 2)
    three = conv_transpose_spec((1, 2, 3, 3, 3), (2, 1, 2, 2, 2), np.float32, np.float32, (2, 2, 2), (0,) * 6,
                                (1, 0, 0), (1, 1, 1), 1)
    assert three.rank == 3 and three.out_shape == (1, 1, 7, 6, 6) and three.extra == (0, 0, 0)


# --- kernels -------------------------------------------------------------------------------

needs_kernels = pytest.mark.skipif(not backend.functional("CUDA"),
                                   reason="no functional GPU backend (set TRITON_INTERPRET=1)")


def _kernels():
    from triflux.triton_kernels import launch
    from triflux.triton_kernels import conv as kc
    return kc, ("cpu" if launch.INTERPRET else "cuda")


def _layout(t, how):
    if how == "transposed":
        axes = tuple(reversed(range(t.dim())))
        return t.permute(axes).contiguous().permute(axes)
    if how == "strided":
        wide = torch.empty(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t


TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


#: the kernel cases: the 2-D ones in every dtype, ranks 1 and 3 in float32 and float16 (the
#: property suite draws every rank in every dtype)
KERNEL_CASES = [(op, name, dtype) for op, name in CASES
                for dtype in ((torch.float32, torch.float16) if name.startswith(("1d", "3d"))
                              else (torch.float32, torch.float16, torch.float64, torch.bfloat16))]


@needs_kernels
@pytest.mark.parametrize("op,name,dtype", KERNEL_CASES)
def test_kernel_matches_torch(op, name, dtype):
    kc, dev = _kernels()
    x, w, g, attrs = _problem(op, name)
    # round the inputs to the dtype; the float64 torch result on those values is exact enough
    xr, wr, gr = (torch.tensor(a).to(dtype).double().numpy() for a in (x, w, g))
    ty, tdx, tdw = _torch_all(op, xr, wr, gr, attrs)
    layouts = {"same3x3": ("transposed", "strided"), "groups2": ("strided", "transposed"),
               "3d_same": ("transposed", "strided"), "1d_stride2_groups2": ("strided", "transposed"),
               "3d_stride2_up": ("strided", "transposed")}.get(name, ("contiguous",) * 2)
    xt = _layout(torch.tensor(xr).to(dtype).to(dev), layouts[0])
    wt = _layout(torch.tensor(wr).to(dtype).to(dev), layouts[1])
    gt = _layout(torch.tensor(gr).to(dtype).to(dev), layouts[0])
    y = getattr(kc, f"{op}_forward")(xt, wt, **attrs)
    dx, dw = getattr(kc, f"{op}_backward")(gt, y, xt, wt, **attrs)
    for a, e, ref_t, what in ((y, ty, xt, "y"), (dx, tdx, xt, "dx"), (dw, tdw, wt, "dw")):
        assert a.dtype == dtype and a.is_contiguous()
        _close(a.detach().to("cpu").double().numpy(), e, TOL[dtype], f"{op} {name} {dtype} kernel {what}")


#: weight gradients long enough to split on a GPU: (op, x shape, w shape, attributes)
SPLIT_CASES = {
    "conv 3x3": ("conv", (2, 3, 14, 12), (4, 3, 3, 3),
                 dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "conv groups2 stride2": ("conv", (2, 4, 17, 15), (6, 2, 3, 2),
                             dict(stride=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 1), groups=2)),
    "conv_transpose stride2": ("conv_transpose", (2, 4, 9, 10), (4, 3, 2, 2),
                               dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0), dilation=(1, 1),
                                    groups=1)),
    "conv 3-D stride2": ("conv", (2, 2, 4, 5, 6), (3, 2, 2, 2, 3),
                         dict(stride=(2, 1, 1), padding=(1, 1, 0, 1, 0, 2), dilation=(1, 1, 1), groups=1)),
}


@needs_kernels
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_weight_gradient_in_splits(case, monkeypatch):
    """On a GPU, a weight gradient of few tiles sums its pixels in several
    programs (split-K) into float32/float64 partial sums and a second launch
    adds them (no atomics). Forced here in the interpreter (GPU tiles, three
    splits: problems this small gain nothing from a split on a GPU): it matches
    the one-program sum (and torch), and a second run gives the same bits."""
    kc, dev = _kernels()
    from triflux.triton_kernels import bias_act, launch
    monkeypatch.setattr(kc, "_weight_grad_splits", lambda *args: 3)
    op, xs, ws, attrs = SPLIT_CASES[case]
    x, w = _rand(xs, 31), _rand(ws, 32)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    g = _rand(y.shape, 33)
    for dtype in (torch.float32, torch.float64):
        xt, wt, gt = (torch.tensor(a).to(dtype).to(dev) for a in (x, w, g))
        dw_whole = getattr(kc, f"{op}_backward")(gt, None, xt, wt, **attrs)[1]
        launched, real_launch = [], launch.launch
        monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (launched.append((k, grid)),
                                                                        real_launch(k, grid, *a, **m))[1])
        monkeypatch.setattr(launch, "INTERPRET", False)
        dw_split = [getattr(kc, f"{op}_backward")(gt, None, xt, wt, **attrs)[1] for _ in range(2)]
        monkeypatch.setattr(launch, "INTERPRET", True)
        monkeypatch.setattr(launch, "launch", real_launch)
        grids = [grid for k, grid in launched if k is kc._weight_grad_kernel]
        assert len(grids) == 2 and grids[0][2] > attrs["groups"], f"{case}: not split: {launched}"
        assert sum(k is bias_act._sum_splits_kernel for k, _ in launched) == 2, launched
        assert torch.equal(dw_split[0], dw_split[1]), f"{case} {dtype}: two runs differ"
        assert dw_split[0].dtype == dtype and dw_split[0].shape == wt.shape
        _close(dw_split[0].to("cpu").double().numpy(), dw_whole.to("cpu").double().numpy(), TOL[dtype],
               f"{case} {dtype} dw split vs whole")
        _close(dw_split[0].to("cpu").double().numpy(), _torch_all(op, x, w, g, attrs)[2], TOL[dtype],
               f"{case} {dtype} dw split vs torch")


#: gathers of more reduced channels than two BLOCK_SIZE_REDUCTION blocks (16 in float32 and
#: float64 GPU tiles), so that their reduction can be split: (op, x shape, w shape, attributes)
GATHER_SPLIT_CASES = {
    "conv groups2 stride2": ("conv", (2, 68, 5, 4), (68, 34, 3, 2),
                             dict(stride=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 1), groups=2)),
    "conv_transpose stride2": ("conv_transpose", (1, 34, 3, 4), (34, 34, 2, 2),
                               dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0), dilation=(1, 1),
                                    groups=1)),
    "conv 3-D stride2": ("conv", (1, 34, 3, 4, 3), (34, 34, 2, 2, 1),
                         dict(stride=(2, 1, 1), padding=(1, 1, 0, 1, 0, 0), dilation=(1, 1, 1), groups=1)),
}


def _force_gather_splits(kc, monkeypatch, splits=3):
    """Make conv._gather_gpu_plan cut every splittable reduction into about ``splits`` ranges
    of whole BLOCK_SIZE_REDUCTION blocks (its own tile kept); returns the [splits] it chose."""
    from triflux.triton_kernels import launch
    plan, chosen = kc._gather_gpu_plan, []

    def forced(kind, num_pixels, channels, reduce_channels, grid_z, splittable, *rest):
        tile = plan(kind, num_pixels, channels, reduce_channels, grid_z, splittable, *rest)[0]
        per_split = launch.cdiv(launch.cdiv(reduce_channels, tile[0][2]), splits) * tile[0][2]
        count = launch.cdiv(reduce_channels, per_split) if splittable else 1
        chosen.append(count)
        return tile, count, per_split if count > 1 else reduce_channels
    monkeypatch.setattr(kc, "_gather_gpu_plan", forced)
    return chosen


@needs_kernels
@pytest.mark.parametrize("case", list(GATHER_SPLIT_CASES))
def test_gather_in_splits(case, monkeypatch):
    """On a GPU, a gather of few positions and many reduced channels (a UNet's
    deepest levels) splits its reduction over the channels into float32/float64
    partial sums and a second launch adds them (no atomics): the forward, the
    input gradient and the transposed gather of every rank. Forced here in the
    interpreter (GPU tiles; float64 in one case, the interpreter being slow):
    the same as one program's sum (and torch), the same bits on a second run; a
    fused bias and activation never split."""
    kc, dev = _kernels()
    from triflux.triton_kernels import bias_act, launch
    op, xs, ws, attrs = GATHER_SPLIT_CASES[case]
    x, w = _rand(xs, 51), _rand(ws, 52)
    y = getattr(ref, f"{op}_forward")(x, w, **attrs)
    g = _rand(y.shape, 53)
    expected = _torch_all(op, x, w, g, attrs)[:2]
    for dtype in (torch.float32, torch.float64) if case == "conv groups2 stride2" else (torch.float32,):
        xt, wt, gt = (torch.tensor(a).to(dtype).to(dev) for a in (x, w, g))
        whole = (getattr(kc, f"{op}_forward")(xt, wt, **attrs),
                 getattr(kc, f"{op}_backward")(gt, None, xt, wt, needs=(True, False), **attrs)[0])
        launched, real_launch = [], launch.launch
        monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (launched.append((k, grid)),
                                                                        real_launch(k, grid, *a, **m))[1])
        monkeypatch.setattr(launch, "INTERPRET", False)
        chosen = _force_gather_splits(kc, monkeypatch)
        in_splits = (getattr(kc, f"{op}_forward")(xt, wt, **attrs),
                     getattr(kc, f"{op}_backward")(gt, None, xt, wt, needs=(True, False), **attrs)[0])
        again = getattr(kc, f"{op}_forward")(xt, wt, **attrs)
        monkeypatch.undo()
        # (the forward run again reuses its host plan, made once per layout: the splits are chosen twice)
        assert chosen == [chosen[0], chosen[1]] and min(chosen) > 1, f"{case}: not split: {chosen}"
        assert sum(k is bias_act._sum_splits_kernel for k, _ in launched) == 3, launched
        assert torch.equal(in_splits[0], again), f"{case} {dtype}: two runs differ"
        for split, one, e, what in zip(in_splits, whole, expected, ("y", "dx")):
            assert split.dtype == dtype and split.shape == one.shape and split.is_contiguous()
            _close(split.to("cpu").double().numpy(), one.to("cpu").double().numpy(), TOL[dtype],
                   f"{case} {dtype} {what} split vs whole")
            _close(split.to("cpu").double().numpy(), e, TOL[dtype], f"{case} {dtype} {what} split vs torch")
    if op == "conv":       # the fused bias and activation: one launch, no split
        bias = torch.tensor(_rand((ws[0],), 54))
        launched.clear()
        monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (launched.append((k, grid)),
                                                                        real_launch(k, grid, *a, **m))[1])
        monkeypatch.setattr(launch, "INTERPRET", False)
        _force_gather_splits(kc, monkeypatch)
        fused = kc.conv_bias_act_forward(torch.tensor(x).to(dev), torch.tensor(w).to(dev), bias.to(dev),
                                         activation="relu", **attrs)
        monkeypatch.undo()
        assert [k for k, _ in launched] == [kc._gather_conv_kernel], launched
        _close(fused.to("cpu").numpy(), np.maximum(expected[0] + bias.numpy().reshape((-1,) + (1,) * (len(xs) - 2)),
                                                   0), TOL[torch.float64], f"{case} conv_bias_act, no split")


@needs_kernels
def test_deep_gathers_split_over_their_channels(monkeypatch):
    """The convolutions of a UNet's deepest levels (few positions, 512 to 1024
    channels) fill at least 90% of their rounds of an H100's 132 SMs (the wave
    model) on a GPU, their reduction split over the input channels, with one
    sum_splits launch each; the wide levels above are not split (kernels not run)."""
    from triflux.triton_kernels import bias_act, launch
    from triflux.triton_kernels import conv as kc
    launched = []
    monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: launched.append((k, grid, m.get("num_warps"))))
    monkeypatch.setattr(launch, "INTERPRET", False)
    for dtype in (torch.float32, torch.bfloat16):
        for batch, cin, cout, side, split in ((4, 1024, 1024, 4, True), (4, 512, 1024, 4, True),
                                              (2, 1024, 512, (4, 4, 4), True), (4, 64, 64, 64, False)):
            sides = side if isinstance(side, tuple) else (side, side)
            x, w = torch.empty((batch, cin) + sides, dtype=dtype), torch.empty((cout, cin) + (3,) * len(sides),
                                                                                   dtype=dtype)
            launched.clear()
            kc.conv_forward(x, w, padding=(1,) * 2 * len(sides))
            (kernel, grid, warps), *rest = launched
            assert kernel is kc._gather_conv_kernel
            if split:
                programs = grid[0] * grid[1] * grid[2]
                assert launch.wave_efficiency(programs, warps, kc._GPU_REGISTERS, 132) >= 0.9 and grid[2] > 1, \
                    (dtype, cin, cout, side, grid, warps)
                assert [k for k, _, _ in rest] == [bias_act._sum_splits_kernel]
            else:
                assert grid[2] == 1 and rest == [], (dtype, cin, cout, side, launched)


@needs_kernels
def test_int64_pixel_indices(monkeypatch):
    """Beyond 2^31 output pixels the kernels index pixels in int64: the same
    results, forced here on a small problem (split and transposed paths too)."""
    kc, dev = _kernels()
    import triton.language as tl
    from triflux.triton_kernels import launch
    monkeypatch.setattr(kc, "_pixel_index_type", lambda num_pixels, block: tl.int64)
    op, xs, ws, attrs = SPLIT_CASES["conv_transpose stride2"]
    x, w = _rand(xs, 41), _rand(ws, 42)
    g = _rand(getattr(ref, f"{op}_forward")(x, w, **attrs).shape, 43)
    expected = _torch_all(op, x, w, g, attrs)
    xt, wt, gt = (torch.tensor(a).to(dev) for a in (x, w, g))
    for interpret in (True, False):         # False: GPU tiles, the weight gradient in splits
        monkeypatch.setattr(launch, "INTERPRET", interpret)
        y = kc.conv_transpose_forward(xt, wt, **attrs)
        dx, dw = kc.conv_transpose_backward(gt, y, xt, wt, **attrs)
        for a, e, what in zip((y, dx, dw), expected, ("y", "dx", "dw")):
            _close(a.to("cpu").numpy(), e, TOL[torch.float64], f"int64 indices, interpreter tiles {interpret}: {what}")


#: the convolutions of a UNet(3, 2) (depth 4, 64 base channels) at 2^depth levels below
#: ``size``: (op, input channels, output channels, kernel, stride, input size)
def _unet_convs(size):
    convs = [("conv", 3, 64, 3, 1, size), ("conv", 64, 2, 1, 1, size)]
    for d in range(5):
        c, s = 64 * 2 ** d, size >> d
        convs += [("conv", c, c, 3, 1, s)]
        if d > 0:
            convs += [("conv", c // 2, c, 3, 1, s),                     # down: the level's first conv
                      ("conv_transpose", c, c // 2, 2, 2, s),            # up, to the level above
                      ("conv", c, c // 2, 3, 1, 2 * s)]                  # the merge after the skip
    return convs


def _record_unet_weight_gradients(batch, size, monkeypatch):
    """The weight gradients of a UNet(3, 2) step in float32 at ``batch``, ``size`` x ``size`` on
    an H100 (GPU tiles, kernels not run): per conv, the arguments and the choice of
    conv._weight_grad_splits, and the launched grids."""
    from triflux.triton_kernels import conv as kc
    from triflux.triton_kernels import launch
    launched, choices, choose = [], [], kc._weight_grad_splits
    monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: launched.append((k, grid)))
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(kc, "_weight_grad_splits", lambda *a: choices.append((a, choose(*a))) or choices[-1][1])
    for op, cin, cout, k, stride, s in _unet_convs(size):
        pad = (k // 2,) * 4 if stride == 1 else (0,) * 4
        if op == "conv":
            x, w = torch.empty((batch, cin, s, s)), torch.empty((cout, cin, k, k))
            g = torch.empty((batch, cout, s, s))
            kc.conv_backward(g, None, x, w, padding=pad)
        else:
            x, w = torch.empty((batch, cin, s, s)), torch.empty((cin, cout, k, k))
            g = torch.empty((batch, cout, s * stride, s * stride))
            kc.conv_transpose_backward(g, None, x, w, stride=(stride, stride), padding=pad)
    return choices, [grid for kernel, grid in launched if kernel is kc._weight_grad_kernel]


@pytest.mark.parametrize("batch,size", [(32, 128), (4, 64)])
def test_weight_gradients_fill_the_gpu(batch, size, monkeypatch):
    """Every conv weight gradient of a UNet(3, 2) training step at batch 32,
    128x128 (and batch 4, 64x64) on an H100 is predicted (the kernel report's wave
    model, conv._split_time: the launch and its sum pass) within 1.25x of its work
    at the GPU's full rate plus three launches: split over the positions where its
    tiles are few, not where the partial sums would cost more than the rounds they
    fill (one or two programs a launch took 16 ms of a 131 ms step once)."""
    pytest.importorskip("triton")
    from triflux.triton_kernels import conv as kc
    from triflux.triton_kernels import launch
    choices, grids = _record_unet_weight_gradients(batch, size, monkeypatch)
    assert len(grids) == len(choices) == len(_unet_convs(size))
    for conv, ((rows, pixels, block, warps, sms, flops, kind, in_bytes, out_values, out_itemsize), splits), grid \
            in zip(_unet_convs(size), choices, grids):
        assert grid[2] == splits and sms == 132
        seconds = kc._split_time(rows, launch.cdiv(pixels, block), splits, warps, sms, flops, kind, in_bytes,
                                 out_values, out_itemsize)[0]
        peak, bandwidth = kc._rates(kind)
        at_full_rate = max(flops / peak, (in_bytes + out_values * out_itemsize) / bandwidth)
        assert seconds <= 1.25 * at_full_rate + 3 * kc._LAUNCH_US * 1e-6, \
            f"{conv}, batch {batch}: {splits} splits, {seconds * 1e6:.1f} us against {at_full_rate * 1e6:.1f} us"


@needs_kernels
def test_kernel_errors():
    kc, dev = _kernels()
    x = torch.zeros((1, 4, 5, 5), device=dev)
    with pytest.raises(ShapeError, match="groups=3"):
        kc.conv_forward(x, torch.zeros((2, 3, 3, 3), device=dev), groups=3)
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        kc.conv_forward(torch.zeros((1, 4, 2, 2), device=dev), torch.zeros((2, 4, 3, 3), device=dev))
    with pytest.raises(DTypeError):
        kc.conv_forward(x, torch.zeros((2, 4, 3, 3), dtype=torch.float64, device=dev))
    with pytest.raises(ShapeError, match="3 spatial axes, so w needs 5 dimensions"):
        kc.conv_transpose_forward(torch.zeros((1, 4, 3, 3, 3), device=dev), torch.zeros((4, 2, 3, 3), device=dev))


@needs_kernels
def test_kernels_use_torch_only_for_memory():
    from torch_ops import assert_torch_only_moves_memory
    kc, dev = _kernels()
    x = torch.tensor(_rand((2, 4, 5, 6), 0), dtype=torch.float32).to(dev)
    w = torch.tensor(_rand((4, 2, 3, 3), 1), dtype=torch.float32).to(dev)
    a = dict(stride=(2, 1), padding=(1, 1, 0, 2), dilation=(1, 1), groups=2)
    at = dict(stride=(2, 1), padding=(1, 1, 0, 2), output_padding=(1, 0), dilation=(1, 1), groups=2)

    x3 = torch.tensor(_rand((1, 4, 3, 4, 3), 2), dtype=torch.float32).to(dev)
    w3 = torch.tensor(_rand((4, 2, 2, 3, 2), 3), dtype=torch.float32).to(dev)
    a3 = dict(stride=(2, 1, 1), padding=(1, 0, 1, 1, 0, 1), dilation=(1, 1, 1), groups=2)

    def work():
        y = kc.conv_forward(x.transpose(2, 3).transpose(2, 3), w, **a)
        kc.conv_backward(y, y, x, w, **a)
        z = kc.conv_transpose_forward(x, w, **at)
        kc.conv_transpose_backward(z, z, x, w, **at)
        y3 = kc.conv_forward(x3, w3, **a3)
        kc.conv_backward(y3, y3, x3, w3, **a3)
    ops = assert_torch_only_moves_memory(work, "the conv kernels")
    assert "empty.memory_format" in ops


# --- conv_bias_act: act(conv(x, w) + b), fused ---------------------------------------------

#: the activations conv_bias_act fuses, as declared with the primitive
ACTS = FUSABLE_ACTIVATIONS
BIAS_ACT = {
    "groups2": ((2, 4, 5, 6), (6, 2, 3, 2), dict(stride=(1, 2), padding=(1, 0, 0, 1), dilation=(1, 1), groups=2)),
    "stride2": ((2, 2, 7, 6), (3, 2, 3, 3), dict(stride=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    "empty_batch": ((0, 2, 5, 5), (2, 2, 3, 3), dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)),
    # ranks 1 and 3: the kernels run these with one activation only (the one that stores gz)
    "1d": ((2, 3, 9), (4, 3, 3), dict(stride=(2,), padding=(1, 2), dilation=(1,), groups=1)),
    "3d_groups2": ((1, 4, 2, 4, 3), (4, 2, 2, 1, 2), dict(stride=(1, 2, 1), padding=(1, 0, 1, 1, 0, 1),
                                                          dilation=(1, 1, 2), groups=2)),
}
#: the BIAS_ACT names the kernel tests run for every activation
BIAS_ACT_2D = [name for name in BIAS_ACT if not name.startswith(("1d", "3d"))]


def _bias_act_problem(name, act, scale=2.0):
    xs, ws, attrs = BIAS_ACT[name]
    x, w, b = _rand(xs, 11) * scale, _rand(ws, 12), _rand((ws[0],), 13)
    y = ref.conv_bias_act_forward(x, w, b, activation=act, **attrs)
    return x, w, b, _rand(y.shape, 14), dict(attrs, activation=act)


def _torch_bias_act(x, w, b, g, attrs, dtype=torch.float64):
    ts = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (x, w, b)]
    y = oracle.conv_bias_act_torch(*ts, **attrs)
    y.backward(torch.tensor(g, dtype=dtype))
    return (y.detach().double().numpy(),) + tuple(t.grad.double().numpy() for t in ts)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("name", list(BIAS_ACT))
def test_bias_act_reference_matches_torch(name, act):
    x, w, b, g, attrs = _bias_act_problem(name, act)
    y = ref.conv_bias_act_forward(x, w, b, **attrs)
    dx, dw, db = ref.conv_bias_act_backward(g, y, x, w, b, **attrs)
    for a, e, what in zip((y, dx, dw, db), _torch_bias_act(x, w, b, g, attrs), ("y", "dx", "dw", "db")):
        _close(a, e, 1e-12, f"conv_bias_act {name} {act} reference {what}")
        assert np.asarray(a).dtype == np.float64


def test_bias_act_reference_is_conv2d_then_bias_then_activation():
    """The fused reference equals the unfused composition (and keeps float32)."""
    x, w, b, g, attrs = _bias_act_problem("groups2", "tanh")
    a = {k: v for k, v in attrs.items() if k != "activation"}
    z = ref.conv_forward(x, w, **a) + b.reshape(1, -1, 1, 1)
    _close(ref.conv_bias_act_forward(x, w, b, **attrs), np.tanh(z), 1e-14, "tanh(conv2d + b)")
    y32 = ref.conv_bias_act_forward(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), **attrs)
    grads = ref.conv_bias_act_backward(g.astype(np.float32), y32, x.astype(np.float32), w.astype(np.float32),
                                         b.astype(np.float32), **attrs)
    assert y32.dtype == np.float32 and all(gr.dtype == np.float32 for gr in grads)


def test_relu_at_zero_preactivation_has_zero_derivative_everywhere():
    """relu'(0) = 0 (torch's convention) in the reference, the kernels and torch:
    pre-activations that are exactly 0 (x = 0 rows, zero bias, integer data
    that cancels exactly) pass no gradient."""
    x = np.zeros((1, 2, 4, 4))
    x[0, 0, :2] = 1.0
    x[0, 1, :2] = 1.0                                    # channel 0 cancels channel 1 below
    w = np.zeros((3, 2, 1, 1))
    w[0, :, 0, 0] = (1.0, -1.0)                          # z = 0 exactly at every pixel
    w[1, :, 0, 0] = (1.0, 1.0)                           # z = 2 on the first rows, 0 elsewhere
    w[2, :, 0, 0] = (-1.0, 0.0)                          # z = -1 + 1 = 0 on the first rows
    b = np.array([0.0, 0.0, 1.0])
    attrs = dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, activation="relu")
    g = np.ones((1, 3, 4, 4))
    y = ref.conv_bias_act_forward(x, w, b, **attrs)
    z = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b.reshape(1, -1, 1, 1)
    assert np.count_nonzero(z == 0) > 16                 # the case is really at the kink
    dx, dw, db = ref.conv_bias_act_backward(g, y, x, w, b, **attrs)
    mask = (z > 0).astype(np.float64)                    # relu'(z) = [z > 0]
    np.testing.assert_array_equal(db, (g * mask).sum(axis=(0, 2, 3)))
    ty, tdx, tdw, tdb = _torch_bias_act(x, w, b, g, attrs)
    for a, e, what in ((y, ty, "y"), (dx, tdx, "dx"), (dw, tdw, "dw"), (db, tdb, "db")):
        np.testing.assert_array_equal(a, e, err_msg=f"reference vs torch at relu's kink: {what}")
    if backend.functional("CUDA"):
        kc, dev = _kernels()
        for dtype in (torch.float32, torch.float16):
            kx, kw, kb, kg = (torch.tensor(a).to(dtype).to(dev) for a in (x, w, b, g))
            ky = kc.conv_bias_act_forward(kx, kw, kb, **attrs)
            grads = kc.conv_bias_act_backward(kg, ky, kx, kw, kb, **attrs)
            for a, e, what in zip((ky,) + tuple(grads), (y, dx, dw, db), ("y", "dx", "dw", "db")):
                np.testing.assert_array_equal(a.to("cpu").double().numpy(), e,
                                              err_msg=f"kernel {dtype} vs reference at relu's kink: {what}")


def test_bias_act_reference_errors():
    x, w, b = np.zeros((1, 2, 5, 5)), np.zeros((3, 2, 3, 3)), np.zeros(3)
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.conv_bias_act_forward(x, w, b, activation="gelu")
    with pytest.raises(ShapeError, match=r"bias must have shape \(3,\)"):
        ref.conv_bias_act_forward(x, w, np.zeros(2))
    with pytest.raises(DTypeError, match="bias is float32"):
        ref.conv_bias_act_forward(x, w, np.zeros(3, dtype=np.float32))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("act", ACTS)
def test_bias_act_kernel_matches_torch(act, dtype):
    kc, dev = _kernels()
    for name in BIAS_ACT if act == "sigmoid" else BIAS_ACT_2D:
        x, w, b, g, attrs = _bias_act_problem(name, act, scale=1.0)
        xr, wr, br, gr = (torch.tensor(a).to(dtype).double().numpy() for a in (x, w, b, g))
        expected = _torch_bias_act(xr, wr, br, gr, attrs)
        layouts = {"groups2": ("strided", "transposed"), "stride2": ("transposed", "strided"),
                   "3d_groups2": ("strided", "transposed")}.get(name, ("contiguous",) * 2)
        xt = _layout(torch.tensor(xr).to(dtype).to(dev), layouts[0])
        wt = _layout(torch.tensor(wr).to(dtype).to(dev), layouts[1])
        bt = _layout(torch.tensor(br).to(dtype).to(dev), "strided")
        gt = _layout(torch.tensor(gr).to(dtype).to(dev), layouts[1])
        y = kc.conv_bias_act_forward(xt, wt, bt, **attrs)
        grads = kc.conv_bias_act_backward(gt, y, xt, wt, bt, **attrs)
        # the backward sees y rounded to dtype: sigmoid's y(1 - y) and tanh's 1 - y^2 inherit it
        tol = TOL[dtype] * (1 if act in ("identity", "relu") or dtype in (torch.float32, torch.float64) else 2)
        for a, e, t, what in zip((y,) + tuple(grads), expected, (xt, xt, wt, bt), ("y", "dx", "dw", "db")):
            assert a.dtype == dtype and a.is_contiguous(), f"{what}: {a.dtype}, contiguous {a.is_contiguous()}"
            assert what == "y" or a.shape == t.shape, f"{what}: shape {tuple(a.shape)} != {tuple(t.shape)}"
            _close(a.detach().to("cpu").double().numpy(), e, tol, f"conv_bias_act {name} {act} {dtype} {what}")


@needs_kernels
def test_bias_act_bias_gradient_in_splits(monkeypatch):
    """On a GPU, many pixels per channel are summed in several programs and a
    second launch (no atomics): forced here in the interpreter."""
    kc, dev = _kernels()
    from triflux.triton_kernels import bias_act, launch
    g = _rand((2, 3, 48, 50), 21)
    y = 1 / (1 + np.exp(-_rand((2, 3, 48, 50), 22)))
    for dtype in (torch.float32, torch.float64):
        gt, yt = (torch.tensor(a).to(dtype).to(dev) for a in (g, y))
        bt = torch.tensor(_rand((3,), 23)).to(dtype).to(dev)
        launched, real_launch = [], launch.launch
        monkeypatch.setattr(launch, "launch", lambda k, grid, *a, **m: (launched.append((k, grid)),
                                                                        real_launch(k, grid, *a, **m))[1])
        monkeypatch.setattr(launch, "INTERPRET", False)
        gz, db = bias_act.act_grad_and_bias_grad(gt, yt, bt, kc.ACTIVATION_CODES["sigmoid"])
        monkeypatch.setattr(launch, "INTERPRET", True)
        monkeypatch.setattr(launch, "launch", real_launch)
        assert [k for k, _ in launched] == [bias_act._act_grad_kernel, bias_act._sum_splits_kernel], launched
        assert launched[0][1][1] > 1, f"one split only: {launched}"
        gz64 = g * y * (1 - y) if dtype == torch.float64 else (gt.double() * (yt.double() * (1 - yt.double()))).numpy()
        _close(gz.to("cpu").double().numpy(), gz64, TOL[dtype], f"{dtype} gz")
        _close(db.to("cpu").double().numpy(), gz64.sum(axis=(0, 2, 3)), 4 * TOL[dtype], f"{dtype} db in splits")


@needs_kernels
def test_bias_act_kernel_errors():
    kc, dev = _kernels()
    x, w = torch.zeros((1, 2, 5, 5), device=dev), torch.zeros((3, 2, 3, 3), device=dev)
    with pytest.raises(ValueError, match="activation must be one of"):
        kc.conv_bias_act_forward(x, w, torch.zeros(3, device=dev), activation="softplus")
    with pytest.raises(ShapeError, match=r"bias must have shape \(3,\)"):
        kc.conv_bias_act_forward(x, w, torch.zeros((1, 3), device=dev))
    with pytest.raises(DTypeError, match="bias is float64"):
        kc.conv_bias_act_forward(x, w, torch.zeros(3, dtype=torch.float64, device=dev))


@needs_kernels
def test_bias_act_kernels_use_torch_only_for_memory():
    from torch_ops import assert_torch_only_moves_memory
    kc, dev = _kernels()
    x = torch.tensor(_rand((2, 4, 5, 6), 0), dtype=torch.float16).to(dev)
    w = torch.tensor(_rand((4, 2, 3, 3), 1), dtype=torch.float16).to(dev)
    b = torch.tensor(_rand((4,), 2), dtype=torch.float16).to(dev)
    a = dict(stride=(2, 1), padding=(1, 1, 0, 2), dilation=(1, 1), groups=2)

    def work():
        for act in ACTS:
            y = kc.conv_bias_act_forward(x, w, b, activation=act, **a)
            kc.conv_bias_act_backward(y.transpose(2, 3).transpose(2, 3), y, x, w, b, activation=act, **a)
    assert_torch_only_moves_memory(work, "the conv_bias_act kernels")


@pytest.mark.parametrize("name", [p.name for p in REGISTRY.values() if p.fusable_activations])
def test_fusable_activations_are_the_declared_ones(name):
    """The activations a primitive applies itself are declared once, with the
    primitive; the layers (layers/fusion.py), the kernels' ACTIVATION codes,
    the reference and the testing part know each of them (the reference and
    the oracles are held to torch on each by the property suite, which draws
    them from the declaration)."""
    from triflux import activations, testing
    from triflux.layers.fusion import fused_activation
    from triflux.reference import _activation
    declared = REGISTRY[name].fusable_activations
    assert "relu" in declared and "identity" in declared
    for act in declared:
        assert fused_activation(getattr(activations, act), name) == act
        y = np.array([-0.5, 0.0, 0.25, 0.75])
        assert np.all(np.isfinite(_activation.through_activation(np.ones_like(y), y, act)))
    assert fused_activation(lambda v: activations.relu(v), name) is None
    assert sorted(testing._ACTIVATION_SENSITIVITY) == sorted(declared)
    if backend.functional("CUDA"):
        from triflux.triton_kernels import numerics
        assert sorted(numerics.ACTIVATION_CODES) == sorted(declared)


def test_ops_check_the_spec_before_dispatch(monkeypatch):
    """ops build the family's spec at the API edge: a call it refuses never reaches a device."""
    import triflux as tf
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a call the spec refuses"))
    x = tf.tensor(np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(ShapeError, match="groups=3"):
        ops.conv2d(x, tf.tensor(np.zeros((3, 1, 3, 3), np.float32)), groups=3)
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        ops.conv2d(x, tf.tensor(np.zeros((2, 4, 3, 3), np.float32)), dilation=3)
    with pytest.raises(ShapeError, match="output_padding"):
        ops.conv_transpose2d(x, tf.tensor(np.zeros((4, 2, 3, 3), np.float32)), output_padding=1)
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.conv2d_bias_act(x, tf.tensor(np.zeros((2, 4, 3, 3), np.float32)), tf.tensor(np.zeros(2, np.float32)),
                            activation="gelu")


# --- the Conv layer uses the fused primitive ---------------------------------------------------

@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_conv_layer_records_one_fused_primitive(dev):
    import triflux as tf
    if dev == "cuda" and not backend.functional("CUDA"):
        pytest.skip("no functional CUDA backend (set TRITON_INTERPRET=1)")
    from helpers import device, recorded_primitives
    d = device(dev)
    x = d(tf.tensor(np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)))
    for act, name in ((tf.relu, "relu"), (tf.sigmoid, "sigmoid"), (tf.σ, "sigmoid"), (tf.tanh, "tanh"),
                      (tf.identity, "identity")):
        layer = d(tf.Conv((3, 3), 3, 4, act, pad=1))
        assert recorded_primitives(layer, x) == ["conv_bias_act"], f"Conv with {name}: not fused"
    # activations whose derivative needs the input, and no bias: the unfused path
    names = recorded_primitives(d(tf.Conv((3, 3), 3, 4, tf.leakyrelu, pad=1)), x)
    assert names[0] == "conv" and names[-1] == "leakyrelu" and "add" in names, names
    assert recorded_primitives(d(tf.Conv((3, 3), 3, 4, tf.relu, pad=1, bias=False)), x) == ["conv", "relu"]


def test_ops_conv2d_bias_act_checks_and_matches_the_unfused_ops():
    import triflux as tf
    from triflux import ops
    rng = np.random.default_rng(5)
    x = tf.tensor(rng.standard_normal((2, 4, 5, 5)).astype(np.float32))
    w = tf.tensor(rng.standard_normal((6, 2, 3, 3)).astype(np.float32))
    b = tf.tensor(rng.standard_normal(6).astype(np.float32))
    y = ops.conv2d_bias_act(x, w, b, stride=2, padding=1, groups=2, activation="sigmoid")
    z = ops.conv2d(x, w, stride=2, padding=1, groups=2) + ops.reshape(b, (1, -1, 1, 1))
    np.testing.assert_allclose(y.numpy(), ops.sigmoid(z).numpy(), rtol=1e-6, atol=1e-7)
    # a float64 bias promotes as conv2d(x, w) + b would
    assert ops.conv2d_bias_act(x, w, tf.tensor(np.zeros(6)), groups=2).dtype == np.float64
    with pytest.raises(ValueError, match=r"activation must be one of \('identity', 'relu', 'sigmoid', 'tanh'\)"):
        ops.conv2d_bias_act(x, w, b, groups=2, activation="gelu")
    with pytest.raises(ShapeError, match=r"bias must have shape \(6,\)"):
        ops.conv2d_bias_act(x, w, tf.tensor(np.zeros(4, dtype=np.float32)), groups=2)
    with pytest.raises(ShapeError, match="input channels"):
        ops.conv2d_bias_act(x, w, b)


#: (primitive, inputs' shapes, attrs) for the partial backward: only the gradients asked for
PARTIAL_CASES = [
    ("conv", ((2, 3, 7, 6), (4, 3, 3, 3)), dict(stride=(1, 1), padding=(1, 1, 1, 1))),
    ("conv_transpose", ((2, 4, 5, 4), (4, 3, 2, 2)), dict(stride=(2, 2))),
    ("conv_bias_act", ((2, 3, 7, 6), (4, 3, 3, 3), (4,)), dict(padding=(1, 1, 1, 1), activation="relu")),
]


@pytest.mark.parametrize("name,shapes,attrs", PARTIAL_CASES, ids=[c[0] for c in PARTIAL_CASES])
def test_partial_backward_computes_only_what_is_needed(name, shapes, attrs):
    """Declared partial_backward: given ``needs``, the reference and the kernel
    return None for a gradient nobody needs (a first layer's input gradient)
    and the same values as the full backward for the others."""
    inputs = [_rand(s, 30 + i) for i, s in enumerate(shapes)]
    sides = [(getattr(ref, f"{name}_forward"), getattr(ref, f"{name}_backward"), lambda a: a, lambda a: a)]
    if backend.functional("CUDA"):
        kc, dev = _kernels()
        sides.append((getattr(kc, f"{name}_forward"), getattr(kc, f"{name}_backward"),
                      lambda a: torch.tensor(a).to(dev), lambda t: t.detach().to("cpu").numpy()))
    for forward, backward, to, back in sides:
        xs = [to(a) for a in inputs]
        y = forward(*xs, **attrs)
        g = to(_rand(tuple(y.shape), 40))
        full = backward(g, y, *xs, **attrs)
        for i in range(len(inputs)):
            needs = tuple(j != i for j in range(len(inputs)))
            part = backward(g, y, *xs, **attrs, needs=needs)
            assert part[i] is None, f"{name}: gradient {i} computed though not needed"
            for j in range(len(inputs)):
                if j != i:
                    np.testing.assert_array_equal(back(part[j]), back(full[j]), err_msg=f"{name} gradient {j}")


@needs_kernels
def test_a_training_step_skips_the_input_gradient_of_the_first_layer(monkeypatch):
    """The images are not trained: the first conv's backward launches no input
    gradient (one gather fewer per step, the largest-resolution one)."""
    import triflux as tf
    from triflux.triton_kernels import launch
    dev = tf.CUDADevice(0)
    model = dev(tf.Chain(tf.Conv((3, 3), 3, 4, tf.relu, pad=1), tf.Conv((3, 3), 4, 2, pad=1)))
    x = dev(_rand((2, 3, 6, 6), 50).astype(np.float32))
    gathers, real = [], launch.launch

    def recording(kernel, grid, *args, **meta):
        if kernel.__name__ == "_gather_conv_kernel":
            gathers.append(meta["TRANSPOSED"])
        return real(kernel, grid, *args, **meta)
    monkeypatch.setattr(launch, "launch", recording)
    tf.gradient(lambda m: (m(x) ** 2).sum(), model)
    # forward: two plain gathers; backward: the second layer's input gradient only
    assert gathers == [False, False, True], gathers
