"""Fill family: constant fills, and the statistics and reproducibility of
the random fills on both sides (the reference and the kernels use different
generators, so they are compared in distribution, not value by value).

Statistical bounds are about 5 standard errors wide, and the seeds are fixed,
so these tests are deterministic and pass with a wide margin.
"""
import math

import numpy as np
import pytest

from triflux import dtypes
from triflux.errors import DTypeError
from triflux.reference import fill as ref

pytestmark = pytest.mark.requires_kernels

DTYPES = ("float32", "float16", "bfloat16", "float64")
N_STAT = 1 << 16
#: Kolmogorov-Smirnov distance bound at the 0.01% level
KS_BOUND = 2.2 / math.sqrt(N_STAT)


@pytest.fixture(scope="module")
def K():
    from triflux.triton_kernels import fill
    return fill


def N(t):
    from triflux.testing import to_numpy
    return to_numpy(t)


def f64(a):
    return np.asarray(a).astype(np.float64)


def ulp_at_one(dtype):
    """Spacing just below 1: the most rounding to ``dtype`` can shift a value
    in [0, 1). (The interpreter rounds float32 to bfloat16 by truncation, so
    a mean can move by up to about half of this.)"""
    return {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float64": 2.0 ** -53}[dtype]


# --- fill --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_exact_values(K, kernel_device, dtype):
    d = dtypes.as_dtype(dtype)
    for value in (0.0, -0.0, 1.0, -2.5, 0.375, 1024.0, float("inf"), float("-inf")):
        r = ref.fill_forward(shape=(3, 0, 2) if value == 1.0 else (2, 3), value=value, dtype=d)
        k = K.fill_forward(shape=r.shape, value=value, dtype=d, device=None)
        assert N(k).dtype == r.dtype == d and N(k).shape == r.shape
        np.testing.assert_array_equal(f64(N(k)), f64(r))
    nan = K.fill_forward(shape=(4,), value=float("nan"), dtype=d)
    assert np.isnan(f64(N(nan))).all()
    assert np.isnan(f64(ref.fill_forward(shape=(4,), value=float("nan"), dtype=d))).all()


def test_fill_scalar_shape_integers_and_device_object(K, kernel_device):
    from triflux.devices import CUDADevice
    dev = CUDADevice(0)
    out = K.fill_forward(shape=(), value=7.0, dtype=dtypes.float32, device=dev)
    assert out.device == dev.torch_device and tuple(out.shape) == () and N(out).item() == 7.0
    assert ref.fill_forward(shape=(), value=7.0, dtype=dtypes.float32, device=dev).shape == ()
    i = K.fill_forward(shape=(5,), value=7, dtype=dtypes.int32)
    np.testing.assert_array_equal(N(i), np.full(5, 7, np.int32))
    np.testing.assert_array_equal(ref.fill_forward(shape=(5,), value=7, dtype=dtypes.int32), np.full(5, 7, np.int32))
    # integers that float32 would round travel to the device as themselves, as on the CPU
    for value, dtype in ((2 ** 40 + 3, "int64"), (2 ** 31 - 1, "int32"), (-(2 ** 24) - 1, "int32")):
        big = K.fill_forward(shape=(3,), value=value, dtype=dtypes.as_dtype(dtype))
        np.testing.assert_array_equal(N(big), np.full(3, value, dtype))


# --- random fills: reproducibility -------------------------------------------------------------

@pytest.mark.parametrize("name", ["rand_uniform", "rand_normal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_reproducible_and_seed_dependent(K, kernel_device, name, dtype):
    d = dtypes.as_dtype(dtype)
    kf, rf = getattr(K, f"{name}_forward"), getattr(ref, f"{name}_forward")
    for side, fn in (("kernel", lambda **a: N(kf(**a))), ("reference", rf)):
        a = fn(shape=(7, 13), dtype=d, seed=42)
        b = fn(shape=(7, 13), dtype=d, seed=42)
        c = fn(shape=(7, 13), dtype=d, seed=43)
        assert a.dtype == d and a.shape == (7, 13), side
        np.testing.assert_array_equal(f64(a), f64(b), err_msg=side)
        assert np.mean(f64(a) != f64(c)) > 0.9, side
        assert len(np.unique(f64(a))) > 50, side  # not a constant or a short cycle
        assert fn(shape=(3, 0), dtype=d, seed=1).shape == (3, 0)
    # Philox is counter-based: element i depends only on (seed, i)
    long = N(kf(shape=(1000,), dtype=d, seed=5))
    np.testing.assert_array_equal(f64(N(kf(shape=(10, 10), dtype=d, seed=5))).ravel(), f64(long[:100]))
    # and large seeds work
    big = N(kf(shape=(64,), dtype=d, seed=2 ** 63 - 1))
    assert np.isfinite(f64(big)).all()


def test_uniform_and_normal_streams_are_independent(K, kernel_device):
    u = f64(N(K.rand_uniform_forward(shape=(N_STAT,), dtype=dtypes.float32, seed=9)))
    z = f64(N(K.rand_normal_forward(shape=(N_STAT,), dtype=dtypes.float32, seed=9)))
    corr = np.corrcoef(u, z)[0, 1]
    assert abs(corr) < 5 / math.sqrt(N_STAT)
    # the normal's Box-Muller radius must not be a function of the uniform
    assert abs(np.corrcoef(u, np.abs(z))[0, 1]) < 5 / math.sqrt(N_STAT)


def test_random_errors(K, kernel_device):
    for fn in (ref.rand_uniform_forward, ref.rand_normal_forward, K.rand_uniform_forward, K.rand_normal_forward):
        with pytest.raises(ValueError):
            fn(shape=(3,), dtype=dtypes.float32, seed=-1)
        with pytest.raises(ValueError):
            fn(shape=(3,), dtype=dtypes.float32, seed=2 ** 63)
        with pytest.raises(TypeError):
            fn(shape=(3,), dtype=dtypes.float32, seed=1.5)
        with pytest.raises(DTypeError):
            fn(shape=(3,), dtype=dtypes.int32, seed=1)
        with pytest.raises(ValueError):
            fn(shape=(-1,), dtype=dtypes.float32, seed=1)


# --- random fills: statistics --------------------------------------------------------------------

def _ks_statistic(sample, cdf):
    s = np.sort(sample)
    n = len(s)
    c = cdf(s)
    return max(np.max(np.arange(1, n + 1) / n - c), np.max(c - np.arange(n) / n))


def _normal_cdf(x):
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _sides(K, name, dtype, seed):
    """(label, float64 sample) from the kernel, the reference and torch."""
    from triflux.testing import fill as oracles
    d = dtypes.as_dtype(dtype)
    attrs = dict(shape=(N_STAT,), dtype=d, seed=seed)
    kernel = N(getattr(K, f"{name}_forward")(**attrs))
    reference = getattr(ref, f"{name}_forward")(**attrs)
    torch_draw = N(getattr(oracles, f"{name}_torch")(**attrs))
    for a in (kernel, reference, torch_draw):
        assert a.dtype == d and a.shape == (N_STAT,)
    return [("kernel", f64(kernel)), ("reference", f64(reference)), ("torch", f64(torch_draw))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_statistics(K, kernel_device, dtype):
    se = 5 / math.sqrt(N_STAT)
    slack = ulp_at_one(dtype)
    for label, u in _sides(K, "rand_uniform", dtype, seed=20240601):
        msg = f"{label} {dtype}"
        assert u.min() >= 0.0 and u.max() < 1.0, msg
        assert u.min() < 1e-3 and u.max() > 1 - 1e-3 - slack, msg  # covers the interval
        assert abs(u.mean() - 0.5) < se * math.sqrt(1 / 12) + slack, msg
        assert abs(u.var() - 1 / 12) < se * math.sqrt(1 / 180) + slack, msg
        assert _ks_statistic(u, lambda s: s) < KS_BOUND + slack, msg
        assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 0.09 * N_STAT, msg
    if dtype == "float64":  # 53 random bits, not a float32 number widened
        kernel = _sides(K, "rand_uniform", dtype, seed=3)[0][1]
        assert np.mean(kernel != kernel.astype(np.float32)) > 0.99


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_statistics(K, kernel_device, dtype):
    se = 5 / math.sqrt(N_STAT)
    slack = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 0.0}[dtype]
    for label, z in _sides(K, "rand_normal", dtype, seed=777):
        msg = f"{label} {dtype}"
        assert np.isfinite(z).all(), msg
        assert abs(z.mean()) < se + slack, msg
        assert abs(z.std() - 1.0) < se * math.sqrt(0.5) + slack, msg
        skew = np.mean(z ** 3) / z.std() ** 3
        kurt = np.mean(z ** 4) / z.var() ** 2
        assert abs(skew) < se * math.sqrt(6), msg
        assert abs(kurt - 3.0) < se * math.sqrt(24) + 4 * slack, msg
        assert abs(np.mean(np.abs(z) < 1) - 0.682689) < se * 0.47, msg
        assert 3.5 < np.abs(z).max() < 6.5, msg  # tails are there, and not absurd
        if dtype in ("float32", "float64"):
            assert _ks_statistic(z, _normal_cdf) < KS_BOUND, msg


# --- torch only allocates and makes views --------------------------------------------------------

from torch_ops import assert_torch_only_moves_memory  # noqa: E402


def test_torch_only_allocates(K, kernel_device):
    def work():
        K.fill_forward(shape=(3, 4), value=2.0, dtype=dtypes.float16)
        for d in (dtypes.float32, dtypes.float64, dtypes.as_dtype("bfloat16")):
            K.rand_uniform_forward(shape=(5, 3), dtype=d, seed=1)
            K.rand_normal_forward(shape=(5, 3), dtype=d, seed=1)

    assert_torch_only_moves_memory(work, "these kernels")
