"""The reference's relu (reference/_activation.py): np.maximum against a kept,
read-only array of zeros that grows with the inputs. It must be max(x, 0) with
torch's NaN and infinity rules for every length, dtype and layout, and never
let a caller write into the shared zeros."""
import numpy as np
import pytest

from triflux.reference import _activation as A
from triflux.reference import elementwise as R

SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0])


def expected(x):
    """max(x, 0) as torch.relu: NaN stays NaN, -inf gives 0."""
    x = np.asarray(x, np.float64)
    return np.where(np.isnan(x) | (x > 0), x, 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_relu_is_max_with_zero_as_the_zero_array_grows(dtype):
    rng = np.random.default_rng(0)
    A._ZEROS.pop(np.dtype(dtype), None)
    for n in (0, 1, 7, 10, 1000, 3, 70000, 50):        # grows, then serves shorter inputs from its start
        x = rng.standard_normal(n).astype(dtype)
        x[: min(n, len(SPECIALS))] = SPECIALS[: min(n, len(SPECIALS))]
        y = A.relu(x)
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(y.astype(np.float64), expected(x))
    zeros = A._ZEROS[np.dtype(dtype)]
    assert zeros.size >= 70000 and not zeros.any() and not zeros.flags.writeable


def test_relu_of_views_into_out_and_in_place():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 5, 8)).astype(np.float32)
    for view in (base.transpose(2, 0, 1), base[:, ::2, 1::3], base[..., 0]):
        np.testing.assert_array_equal(A.relu(view), expected(view))
        out = np.full(view.shape, 7.0, np.float32)
        assert A.relu(view, out=out) is out
        np.testing.assert_array_equal(out, expected(view))
    x = base.copy()
    A.relu(x, out=x)                                   # in place, as the fused layers call it
    np.testing.assert_array_equal(x, expected(base))
    assert not A._ZEROS[np.dtype(np.float32)].any()


def test_relu_beyond_the_zero_array_limit_and_other_dtypes(monkeypatch):
    monkeypatch.setattr(A, "_MOST_ZEROS", 100)
    A._ZEROS.pop(np.dtype(np.float64), None)
    x = np.linspace(-1, 1, 1001)
    np.testing.assert_array_equal(A.relu(x), expected(x))
    assert np.dtype(np.float64) not in A._ZEROS            # too long to keep zeros for
    ints = np.arange(-5, 5, dtype=np.int32)
    np.testing.assert_array_equal(A.relu(ints), np.maximum(ints, 0))


def test_elementwise_relu_and_the_fused_activation_use_it():
    x = SPECIALS.astype(np.float32)
    np.testing.assert_array_equal(R.relu_forward(x), expected(x))
    np.testing.assert_array_equal(A.activate(x.copy(), "relu"), expected(x))
