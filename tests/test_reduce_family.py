"""Edge cases of the reductions (sum, mean, max) and of ``unbroadcast`` that
the generic property suite does not reach: empty reductions, integer and
boolean inputs, keepdims shapes, ties, NaN, non-contiguous 5-6-d inputs,
long rows (the split path), and the GPU block configuration run in the
interpreter. Reference, kernel and torch are compared.
"""
import itertools
import warnings

import numpy as np
import pytest

from triflux.errors import ShapeError
from helpers import f64, tn, tt
from triflux.reference import reduce as R

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.requires_kernels


@pytest.fixture(scope="module")
def K():
    from triflux.triton_kernels import reduce
    return reduce


# --- empty reductions and shapes ------------------------------------------------------------

@pytest.mark.parametrize("keepdims", [False, True])
def test_empty_reductions(K, kernel_device, keepdims):
    x = np.zeros((3, 0, 2))
    xt = tt(x, kernel_device, "float32")
    for axis in [(1,), (0, 1), (0, 1, 2), (0,), (2,), ()]:
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # "Mean of empty slice"
            want_sum = np.sum(x, axis=axis, keepdims=keepdims)
            want_mean = np.mean(x, axis=axis, keepdims=keepdims) if axis else x.copy()
        pairs = ((K.sum_forward(xt, axis, keepdims), R.sum_forward(x, axis, keepdims), want_sum),
                 (K.mean_forward(xt, axis, keepdims), R.mean_forward(x, axis, keepdims), want_mean))
        for k_out, r_out, want in pairs:
            assert tuple(k_out.shape) == want.shape == r_out.shape, axis
            np.testing.assert_array_equal(f64(k_out), want)
            np.testing.assert_array_equal(r_out, want)
    # the sum of nothing is 0, the mean NaN, for each of 3 * 2 rows
    np.testing.assert_array_equal(f64(K.sum_forward(xt, (1,), keepdims)),
                                  np.zeros((3, 1, 2) if keepdims else (3, 2)))
    assert np.isnan(f64(K.mean_forward(xt, (1,), keepdims))).all()
    # gradients of empty inputs are empty
    (g,) = K.sum_backward(tt(np.zeros((3, 2)), kernel_device, "float32"), None, xt, (1,), False)
    assert tuple(g.shape) == (3, 0, 2)
    (g,) = K.mean_backward(tt(np.zeros((3, 2)), kernel_device, "float32"), None, xt, (1,), False)
    assert tuple(g.shape) == (3, 0, 2)


def test_max_over_empty_axis_raises(K, kernel_device):
    x = np.zeros((3, 0))
    with pytest.raises(ShapeError, match="empty"):
        K.max_forward(tt(x, kernel_device), (1,), False)
    with pytest.raises(ShapeError, match="empty"):
        R.max_forward(x, (1,), False)
    # ... but a max over non-empty axes of an empty tensor is an empty result
    assert tuple(K.max_forward(tt(x, kernel_device), (0,), True).shape) == (1, 0)


def test_ops_checks_before_dispatching(monkeypatch):
    """The ops functions raise the spec's errors at the API edge, before any
    reference or kernel runs."""
    from triflux import ops
    monkeypatch.setattr(ops, "apply", lambda *a, **k: pytest.fail("dispatched a bad reduction"))
    with pytest.raises(ShapeError, match="empty"):
        ops.max(np.zeros((3, 0)), 1)
    with pytest.raises(ShapeError, match="out of range"):
        ops.sum(np.zeros((3, 2)), (0, 2))


def test_keepdims_shapes_every_axis_set(K, kernel_device):
    """Every subset of the axes of a 4-d input (keepdims both ways for a third
    of them, alternating for the rest)."""
    x = np.arange(2 * 3 * 1 * 4, dtype=np.float64).reshape(2, 3, 1, 4) - 7
    xt = tt(x, kernel_device)
    every = [a for r in range(5) for a in itertools.combinations(range(4), r)]
    for i, axis in enumerate(every):
        for keepdims in ((False, True) if i % 3 == 0 else (i % 2 == 0,)):
            want = x.sum(axis=axis, keepdims=keepdims)
            got = K.sum_forward(xt, axis, keepdims)
            assert tuple(got.shape) == want.shape
            np.testing.assert_array_equal(f64(got), want)
            np.testing.assert_array_equal(f64(K.max_forward(xt, axis, keepdims)),
                                          x.max(axis=axis, keepdims=keepdims) if axis else x)


def test_zero_d_input(K, kernel_device):
    x = np.array(2.5)
    for name in ("sum", "mean", "max"):
        got = getattr(K, name + "_forward")(tt(x, kernel_device), (), False)
        ref = getattr(R, name + "_forward")(x, (), False)
        assert tuple(got.shape) == () and isinstance(ref, np.ndarray) and ref.shape == ()
        assert float(f64(got)) == 2.5 == float(ref)


# --- integer and boolean inputs -----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_and_bool_reductions(K, kernel_device, dtype):
    rng = np.random.default_rng(0)
    x = rng.integers(-1000, 1000, (5, 7, 3)).astype(dtype)
    if dtype == "int64":
        x[0, 0, 0] = 2 ** 40
    xt = tt(x, kernel_device).permute(2, 0, 1).contiguous().permute(1, 2, 0)   # non-contiguous
    for axis in [(0,), (1, 2), (0, 1, 2), (2,)]:
        for keepdims in (False, True):
            want = np.sum(x, axis=axis, keepdims=keepdims)
            assert want.dtype == np.int64
            for got in (tn(K.sum_forward(xt, axis, keepdims)), R.sum_forward(x, axis, keepdims)):
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, want)
            want = np.max(x, axis=axis, keepdims=keepdims)
            for got in (tn(K.max_forward(xt, axis, keepdims)), R.max_forward(x, axis, keepdims)):
                assert got.dtype == x.dtype
                np.testing.assert_array_equal(got, want)
            want = np.mean(x, axis=axis, keepdims=keepdims)
            for got in (tn(K.mean_forward(xt, axis, keepdims)), R.mean_forward(x, axis, keepdims)):
                assert got.dtype == np.float64
                np.testing.assert_allclose(got, want, rtol=1e-14)
    tw = torch.from_numpy(x).sum(dim=(1, 2))
    np.testing.assert_array_equal(tn(K.sum_forward(xt, (1, 2), False)), tw.numpy())
    # no gradients for integers
    assert K.sum_backward(K.sum_forward(xt, (0,), False), None, xt, (0,), False) == (None,)
    assert R.max_backward(None, None, x, (0,), False) == (None,)


def test_int32_sum_does_not_overflow(K, kernel_device):
    x = np.full(70000, 2 ** 30, dtype=np.int32)
    got = tn(K.sum_forward(tt(x, kernel_device), (0,), False))
    assert got.dtype == np.int64 and int(got) == 70000 * 2 ** 30 == int(R.sum_forward(x, (0,)))


# --- ties and NaN ---------------------------------------------------------------------------

def test_max_backward_splits_ties_like_amax(K, kernel_device):
    x = np.array([[[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]],
                  [[5.0, -1.0, 5.0, 5.0], [0.0, 1.0, 0.0, 1.0]]])
    for axis, keepdims in [((2,), False), ((0, 2), True), ((0, 1, 2), False), ((1,), False)]:
        xa = torch.tensor(x, requires_grad=True)
        out = torch.amax(xa, dim=axis, keepdim=keepdims)
        g = torch.arange(1.0, out.numel() + 1, dtype=torch.float64).reshape(out.shape)
        out.backward(g)
        for dtype in ("float64", "float32", "bfloat16"):
            xt = tt(x, kernel_device, dtype)
            y = K.max_forward(xt, axis, keepdims)
            (gx,) = K.max_backward(tt(g.numpy(), kernel_device, dtype), y, xt, axis, keepdims)
            np.testing.assert_allclose(f64(gx), xa.grad.numpy(), err_msg=f"{axis} {dtype}",
                                       rtol={"float64": 1e-15, "float32": 1e-7, "bfloat16": 4e-3}[dtype])
        (gr,) = R.max_backward(g.numpy(), R.max_forward(x, axis, keepdims), x, axis, keepdims)
        np.testing.assert_array_equal(gr, xa.grad.numpy())


def test_max_propagates_nan(K, kernel_device):
    x = np.array([[1.0, np.nan, 3.0], [np.nan, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf]])
    for axis in [(1,), (0,), (0, 1)]:
        want = np.max(x, axis=axis)
        np.testing.assert_array_equal(f64(K.max_forward(tt(x, kernel_device, "float32"), axis, False)), want)
        np.testing.assert_array_equal(R.max_forward(x, axis), want)


def test_max_nan_rows_as_amax_forward_and_backward(K, kernel_device):
    """A row whose maximum is NaN: NaN, and torch.amax's gradient (g / k) [x == y]
    gives every entry of it NaN; +-inf maxima and all -inf rows (a tie) as
    amax; also over a long row (the GPU's two-pass split in the interpreter)."""
    x = np.array([[1.0, np.nan, 3.0, 3.0], [np.nan, -np.inf, 0.0, np.inf], [-np.inf] * 4,
                  [np.inf, 2.0, np.inf, -1.0], [0.5, -2.0, 7.0, 7.0]])
    long = np.random.default_rng(0).uniform(-1, 1, (2, 9000))
    long[0, 8500] = np.nan
    long[1, 4] = np.inf
    for arr, axis in ((x, (1,)), (x, (0,)), (x, (0, 1)), (long, (1,))):
        xa = torch.tensor(arr, requires_grad=True)
        out = torch.amax(xa, dim=axis)
        g = torch.arange(1.0, out.numel() + 1, dtype=torch.float64).reshape(out.shape)
        out.backward(g)
        want_y, want_g = out.detach().numpy(), xa.grad.numpy()
        y_ref = R.max_forward(arr, axis)
        np.testing.assert_array_equal(y_ref, want_y)
        np.testing.assert_array_equal(R.max_backward(g.numpy(), y_ref, arr, axis)[0], want_g)
        for dtype in ("float32", "float64"):
            xt = tt(arr, kernel_device, dtype)
            y = K.max_forward(xt, axis, False)
            (gx,) = K.max_backward(tt(g.numpy(), kernel_device, dtype), y, xt, axis, False)
            np.testing.assert_array_equal(f64(y), want_y, err_msg=f"{axis} {dtype}")
            np.testing.assert_allclose(f64(gx), want_g, rtol=1e-6, err_msg=f"{axis} {dtype}")


# --- layouts, ranks, long rows ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_high_rank_non_contiguous_multi_axis(K, kernel_device, dtype):
    rng = np.random.default_rng(5)
    base = rng.uniform(-2, 2, (4, 3, 5, 2, 6, 3))
    xt = tt(base, kernel_device, dtype).permute(4, 1, 0, 5, 3, 2)[::2, :, 1:, :, :, ::2]  # 6-d view
    x = f64(xt)
    assert not xt.is_contiguous()
    tol = {"float64": 1e-13, "float32": 1e-6, "float16": 1e-3}[dtype]
    for axis in [(0, 2, 5), (1, 3), (0, 1, 2, 3, 4, 5), (5,), (0,), (2, 3, 4)]:
        for keepdims in (False, True):
            for name, npf in (("sum", np.sum), ("mean", np.mean), ("max", np.max)):
                got = getattr(K, name + "_forward")(xt, axis, keepdims)
                want = npf(x, axis=axis, keepdims=keepdims)
                assert tuple(got.shape) == want.shape
                np.testing.assert_allclose(f64(got), want, rtol=tol, atol=tol * np.abs(want).max(),
                                           err_msg=f"{name} {axis} {keepdims}")
            g = rng.standard_normal(want.shape)
            gt = tt(g, kernel_device, dtype)
            (gk,) = K.mean_backward(gt, None, xt, axis, keepdims)
            (gr,) = R.mean_backward(f64(gt), None, x, axis, keepdims)
            np.testing.assert_allclose(f64(gk), gr, rtol=tol)


def test_five_d_reference_vs_torch(kernel_device):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 1, 4, 5))
    for axis in [(0, 3), (1, 2, 4), (4,)]:
        xa = torch.tensor(x, requires_grad=True)
        out = torch.sum(xa, dim=axis, keepdim=False)
        g = rng.standard_normal(tuple(out.shape))
        out.backward(torch.tensor(g))
        np.testing.assert_allclose(R.sum_forward(x, axis), out.detach().numpy(), rtol=1e-13)
        np.testing.assert_allclose(R.sum_backward(g, None, x, axis)[0], xa.grad.numpy())


def test_long_rows_accumulate_in_float32(K, kernel_device):
    # 1e6 float32 ones sum exactly; 5000 float16 0.1s stay near 500 (a float16
    # accumulator would stall at 256)
    n = 1_000_000
    ones = K.sum_forward(_ones(kernel_device, (n,), torch.float32), (0,), False)
    assert float(f64(ones)) == float(n)
    tenths = tt(np.full((2, 5000), 0.1), kernel_device, "float16")
    got = f64(K.sum_forward(tenths, (1,), False))
    np.testing.assert_allclose(got, [5000 * float(np.float16(0.1))] * 2, rtol=1e-3)
    got = f64(K.mean_forward(tenths.t(), (0,), False))
    np.testing.assert_allclose(got, [float(np.float16(0.1))] * 2, rtol=1e-3)


def _ones(device, shape, dtype):
    from triflux.triton_kernels import copy
    return copy.full(shape, 1.0, dtype, device)


@pytest.mark.parametrize("splits", [3])
def test_split_reduction_path(K, kernel_device, splits, monkeypatch):
    """Long rows are split among programs, then the partials reduced again
    (small interpreter tiles, so that the rows span several chunks)."""
    monkeypatch.setattr(K, "_INTERP_TILE", 256)
    rng = np.random.default_rng(7)
    x = rng.uniform(-3, 3, (2, 1501))
    x[1, 234] = 50.0
    x[1, 1400] = 50.0                  # a tie split between chunks
    xt = tt(x, kernel_device, "float32").t().contiguous().t()
    xf = f64(xt)
    for op, npf in ((K.REDUCE_SUM, np.sum), (K.REDUCE_MAX, np.max)):
        got = K._reduce(xt, (1,), op, torch.float32, splits=splits)
        np.testing.assert_allclose(f64(got), npf(xf, axis=1), rtol=1e-6,
                                   atol=1e-6 * np.abs(xf).sum(axis=1).max())
    y = K._reduce(xt, (1,), K.REDUCE_MAX, torch.float32, keepdims=True, splits=splits)
    cnt = K._reduce(xt, (1,), K.REDUCE_COUNT_EQUAL, torch.int32, keepdims=True, reference_values=y, splits=splits)
    np.testing.assert_array_equal(tn(cnt).ravel(), [1, 2])
    mean = K._reduce(xt, (1,), K.REDUCE_SUM, torch.float32, mean=True, splits=splits)
    np.testing.assert_allclose(f64(mean), xf.mean(axis=1), rtol=1e-5)


def test_gpu_block_configuration_in_the_interpreter(K, kernel_device, monkeypatch):
    """The GPU tile shapes and the automatic split (chosen only when not
    interpreting) computed by the same kernels, here in the interpreter."""
    from triflux.triton_kernels import launch
    rng = np.random.default_rng(8)
    cases = [((2, 9000), (1,)), ((9000, 3), (0,)), ((40, 33, 5), (0, 2)), ((5, 300), (1,)),
             ((6000,), (0,))]
    arrays = [(rng.uniform(-1, 1, shape), axis) for shape, axis in cases]
    monkeypatch.setattr(launch, "INTERPRET", False)
    for x, axis in arrays:
        xt = tt(x, kernel_device, "float32")
        for name, npf in (("sum", np.sum), ("max", np.max)):
            got = f64(getattr(K, name + "_forward")(xt, axis, False))
            np.testing.assert_allclose(got, npf(x.astype(np.float32), axis=axis), rtol=1e-5,
                                       atol=1e-4, err_msg=f"{name} {x.shape} {axis}")


@pytest.mark.parametrize("gpu,splits", [("H100", 16), ("A100", 13)])
def test_gpu_split_by_the_wave_model(K, gpu, splits, monkeypatch):
    """On a GPU, 64 rows of 65,536 contiguous columns (16 programs of 4 rows,
    64 column blocks each) are split as the GPU's SMs make best by the wave
    model (two 8-warp programs per SM saturate it): 16 splits are one round of
    an H100's 264 programs, where an A100 (216) takes 13 of 5 blocks; rows
    that fill the GPU on their own are not split."""
    import triton.language as tl
    from triflux.gpus import GPUS
    from triflux.triton_kernels import launch
    monkeypatch.setattr(launch, "INTERPRET", False)
    K._reduce_grid.cache_clear()
    try:
        sms = GPUS[gpu].sms
        assert K._reduce_grid(64, 65536, 65536, 1, tl.float32, None, sms)[3] == splits
        assert K._reduce_grid(4096, 8192, 8192, 1, tl.float32, None, sms)[3] == 1
    finally:
        K._reduce_grid.cache_clear()


# --- unbroadcast ----------------------------------------------------------------------------

def test_unbroadcast(K, kernel_device):
    rng = np.random.default_rng(9)
    g = rng.standard_normal((4, 3, 5))
    gt = tt(g, kernel_device)
    assert K.unbroadcast(gt, (4, 3, 5)) is gt
    for shape in [(5,), (3, 1), (1, 3, 5), (4, 1, 1), (), (1,), (1, 1, 1), (4, 3, 1)]:
        got = K.unbroadcast(gt, shape)
        from triflux.reference._util import unbroadcast as ref_unbroadcast
        want = ref_unbroadcast(g, shape)
        assert tuple(got.shape) == tuple(shape) == want.shape
        np.testing.assert_allclose(f64(got), want, rtol=1e-13)
    # a strided gradient, a dtype change (float64 -> bfloat16 through float32)
    got = K.unbroadcast(gt.transpose(0, 2), (5, 1, 1), torch.bfloat16)
    assert got.dtype == torch.bfloat16
    np.testing.assert_allclose(f64(got), g.transpose(2, 1, 0).sum(axis=(1, 2), keepdims=True), rtol=8e-3)
    # zero-sized broadcast dims sum to zeros
    z = K.unbroadcast(tt(np.zeros((0, 3)), kernel_device, "float16"), (1, 3))
    assert z.dtype == torch.float16
    np.testing.assert_array_equal(f64(z), np.zeros((1, 3)))
    with pytest.raises(ShapeError):
        K.unbroadcast(gt, (2, 5))
    # a target with extra leading size-1 axes
    got = K.unbroadcast(gt, (1, 1, 4, 1, 5))
    np.testing.assert_allclose(f64(got), g.sum(axis=1, keepdims=True)[None, None], rtol=1e-13)


def test_kernels_use_torch_only_for_memory(K, kernel_device):
    from torch_ops import assert_torch_only_moves_memory
    rng = np.random.default_rng(10)
    x = tt(rng.standard_normal((3, 4, 5)), kernel_device, "bfloat16").transpose(0, 2)

    def work():
        for name in ("sum", "mean", "max"):
            y = getattr(K, name + "_forward")(x, (0, 2), False)
            getattr(K, name + "_backward")(y, y, x, (0, 2), False)
        K._reduce(x, (1,), K.REDUCE_SUM, torch.float32, splits=2)
        K.unbroadcast(x, (1, 4, 1))
        K.sum_forward(tt(np.zeros((0, 3)), kernel_device), (0,), False)   # full(0)

    assert_torch_only_moves_memory(work, "the reduction kernels")
