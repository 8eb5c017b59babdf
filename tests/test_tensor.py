"""Tensor: construction, metadata, host access, operators, on every device."""
import numpy as np
import pytest

import triflux as tf
from triflux.errors import TrifluxError, ShapeError, DTypeError
from helpers import DEVICES, device


def test_tensor_from_lists_defaults_to_float32_and_keeps_integers():
    assert tf.tensor([[1.0, 2.0]]).dtype == np.float32
    assert tf.tensor([1, 2, 3]).dtype == np.int64
    assert tf.tensor([True]).dtype == np.bool_
    assert tf.tensor(np.zeros(2)).dtype == np.float64          # arrays keep their dtype
    assert tf.tensor([1, 2], dtype="float16").dtype == np.float16


def test_tensor_rejects_strings():
    with pytest.raises(DTypeError, match="cannot make a Tensor"):
        tf.tensor(["a", "b"])


@pytest.mark.parametrize("dev", DEVICES)
def test_metadata_and_repr(dev):
    d = device(dev)
    t = tf.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=d)
    assert t.shape == (2, 3) and t.ndim == 2 and t.size == 6 and len(t) == 2
    assert t.dtype == np.float32 and t.device == d
    r = repr(t)
    assert "2×3" in r and "float32" in r and repr(d) in r and "5." in r


@pytest.mark.parametrize("dev", DEVICES)
def test_constructors(dev):
    d = device(dev)
    assert tf.zeros(2, 3, device=d).numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
    assert tf.ones((4,), dtype=tf.float64, device=d).numpy().dtype == np.float64
    r = tf.rand(1000, device=d, seed=3).numpy()
    assert r.shape == (1000,) and r.min() >= 0 and r.max() < 1 and 0.4 < r.mean() < 0.6
    n = tf.randn(2000, device=d, seed=4).numpy()
    assert abs(n.mean()) < 0.1 and 0.9 < n.std() < 1.1
    np.testing.assert_array_equal(tf.rand(5, device=d, seed=7).numpy(), tf.rand(5, device=d, seed=7).numpy())
    tf.seed(11)
    a = tf.randn(4, device=d).numpy()
    tf.seed(11)
    np.testing.assert_array_equal(a, tf.randn(4, device=d).numpy())
    with pytest.raises(ShapeError, match="negative"):
        tf.zeros(-1, 2)


@pytest.mark.parametrize("dev", DEVICES)
def test_numpy_is_a_copy(dev):
    t = tf.tensor(np.ones(3, np.float32), device=device(dev))
    a = t.numpy()
    a[0] = 5
    assert t.numpy()[0] == 1


def test_asarray_cpu_and_device_error():
    t = tf.tensor([1.0, 2.0])
    assert np.asarray(t).tolist() == [1.0, 2.0]
    if not tf.functional("CUDA"):
        pytest.skip("no functional CUDA backend")
    g = tf.CUDADevice(0)(t)
    with pytest.raises(TrifluxError, match="cpu"):
        np.asarray(g)
    assert float(g.sum()) == 3.0                       # scalars copy to the host


@pytest.mark.parametrize("dev", DEVICES)
def test_operators_match_numpy(dev):
    d = device(dev)
    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    a, b = tf.tensor(a_np, device=d), tf.tensor(b_np, device=d)
    cases = {
        "a+b": (a + b, a_np + b_np), "a-b": (a - b, a_np - b_np), "a*b": (a * b, a_np * b_np),
        "a/b": (a / b, a_np / b_np), "2*a": (2 * a, 2 * a_np), "a-1": (a - 1, a_np - 1),
        "1-a": (1 - a, 1 - a_np), "-a": (-a, -a_np), "abs": (abs(a), np.abs(a_np)),
        "a**2": (a ** 2, a_np ** 2), "a@b": (a @ b, a_np @ b_np), "a.T": (a.T, a_np.T),
        "sum": (a.sum(axis=1), a_np.sum(1)), "mean": (a.mean(), a_np.mean()),
        "max": (a.max(axis=0, keepdims=True), a_np.max(0, keepdims=True)),
        "reshape": (a.reshape(4, 3), a_np.reshape(4, 3)), "slice": (a[1:, ::2], a_np[1:, ::2]),
        "rev": (a[::-1, 2], a_np[::-1, 2]), "newaxis": (a[None, ..., 1], a_np[None, ..., 1]),
        "transpose": (a.transpose(1, 0), a_np.transpose(1, 0)),
    }
    for name, (got, want) in cases.items():
        assert got.device == d, name
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert ((a > 0).numpy() == (a_np > 0)).all()
    assert (a > 0).dtype == np.bool_


def test_comparisons_and_where_with_integers():
    y = tf.tensor([0, 2, 1])
    assert (y == 2).numpy().tolist() == [False, True, False]
    w = tf.where(y > 0, tf.tensor([1.0, 2.0, 3.0]), 0.0)
    assert w.numpy().tolist() == [0.0, 2.0, 3.0]
    with pytest.raises(tf.DTypeError, match="bool condition"):
        tf.where(y, 1.0, 0.0)


def test_shape_errors_name_both_shapes():
    a, b = tf.zeros(2, 3), tf.zeros(4, 5)
    with pytest.raises(ShapeError, match=r"\(2, 3\) and \(4, 5\)"):
        a @ b
    with pytest.raises(ShapeError, match=r"do not broadcast"):
        a + tf.zeros(4)
    with pytest.raises(ShapeError, match="cannot reshape"):
        a.reshape(4, 2)
    with pytest.raises(IndexError, match="out of bounds"):
        a[5]
    with pytest.raises(TypeError, match="advanced"):
        a[[0, 1]]
    with pytest.raises(ShapeError, match="empty axis"):
        tf.zeros(0, 3).max(axis=0)


def test_mixed_dtypes_promote():
    a = tf.ones(2, dtype=tf.float16)
    assert (a + tf.ones(2, dtype=tf.float32)).dtype == np.float32
    assert (a * 2.0).dtype == np.float16                 # Python scalars do not promote
    assert (tf.tensor([1, 2]) * 0.5).dtype == np.float32


@pytest.mark.parametrize("dev", DEVICES)
def test_item_float_bool(dev):
    t = tf.tensor([2.5], device=device(dev))
    assert t.item() == 2.5 and float(t) == 2.5 and bool(t)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(tf.zeros(2))


def test_dtype_errors_say_what_to_do():
    with pytest.raises(DTypeError, match="floating point"):
        tf.rand(3, dtype=tf.int32)
    with pytest.raises(DTypeError, match="unknown dtype"):
        tf.zeros(2, dtype="float8")
    if tf.functional("CUDA"):
        with pytest.raises(DTypeError, match="no device"):
            tf.gpu(np.ones(2, dtype=np.complex64))


# --- conversions to NumPy and Python numbers, on every device ---------------------------------

def _edge_tensors(d):
    return {
        "0-d float32": tf.tensor(np.float32(2.5), device=d),
        "1-element bfloat16": tf.bf16(tf.tensor([1.5], device=d)),
        "0-d bfloat16": tf.bf16(tf.tensor(np.float32(-3.0), device=d)),
        "0-d int64": tf.tensor(np.array(7), device=d),
        "1x1 bool": tf.tensor(np.array([[True]]), device=d),
        "float16": tf.tensor(np.array([0.5], np.float16), device=d),
    }


@pytest.mark.parametrize("dev", DEVICES)
def test_scalar_conversions_copy_from_any_device(dev):
    d = device(dev)
    t = _edge_tensors(d)
    assert t["0-d float32"].item() == 2.5 and float(t["0-d float32"]) == 2.5 and int(t["0-d float32"]) == 2
    assert t["1-element bfloat16"].item() == 1.5 and isinstance(t["1-element bfloat16"].item(), float)
    assert float(t["0-d bfloat16"]) == -3.0 and int(t["0-d bfloat16"]) == -3 and bool(t["0-d bfloat16"])
    assert t["0-d int64"].item() == 7 and isinstance(t["0-d int64"].item(), int)
    assert [10, 20, 30, 40, 50, 60, 70, 80][t["0-d int64"]] == 80          # __index__
    assert t["1x1 bool"].item() is True and bool(t["1x1 bool"]) and float(t["1x1 bool"]) == 1.0
    assert float(t["float16"]) == 0.5
    assert f"{t['0-d float32']:.3f}" == "2.500" and f"{t['0-d int64']:d}" == "7"
    assert float(tf.tensor([1.0, 2.0], device=d).sum()) == 3.0
    with pytest.raises(TypeError, match="index"):
        [1, 2][t["0-d float32"]]


@pytest.mark.parametrize("dev", DEVICES)
def test_conversions_of_empty_and_bigger_tensors_raise_clearly(dev):
    d = device(dev)
    e = tf.tensor(np.zeros((0, 3), np.float32), device=d)
    for f, what in ((float, "float()"), (int, "int()"), (lambda t: t.item(), "item()")):
        with pytest.raises(ValueError, match=r"exactly one element.*\(0, 3\)") as info:
            f(e)
        assert what in str(info.value)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(e)
    with pytest.raises(ValueError, match=r"exactly one element.*\(2,\)"):
        float(tf.tensor([1.0, 2.0], device=d))
    with pytest.raises(TypeError, match="one element"):
        f"{tf.tensor([1.0, 2.0], device=d):.2f}"
    assert e.tolist() == [] and e.numpy().shape == (0, 3)
    assert "0×3" in repr(e) and repr(d) in repr(e)
    assert f"{e}" == str(e)


@pytest.mark.parametrize("dev", DEVICES)
def test_tolist_numpy_and_repr_on_edge_tensors(dev):
    d = device(dev)
    for name, t in _edge_tensors(d).items():
        r = repr(t)
        assert repr(d) in r and str(t.dtype) in r, name
        assert np.asarray(t.numpy()).shape == t.shape, name
    t = _edge_tensors(d)
    assert t["1-element bfloat16"].tolist() == [1.5] and t["0-d bfloat16"].tolist() == -3.0
    assert t["1x1 bool"].tolist() == [[True]] and t["0-d int64"].tolist() == 7
    assert "1.5" in repr(t["1-element bfloat16"]) and "2.5" in repr(t["0-d float32"])
    big = tf.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=d)
    assert big.tolist() == np.arange(12).reshape(3, 4).tolist()
    assert "11." in repr(big)


def test_asarray_of_a_device_tensor_raises_devicemismatch_naming_the_fix():
    from triflux.errors import DeviceMismatchError
    t = tf.tensor([1.0, 2.0])
    a = np.asarray(t)
    assert a.tolist() == [1.0, 2.0] and np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.array(t, copy=True) is not t._data
    with pytest.raises(ValueError, match="copy"):
        np.asarray(t, dtype=np.float64, copy=False)
    if not tf.functional("CUDA"):
        pytest.skip("no functional CUDA backend")
    dev = tf.CUDADevice(0)
    for g in (dev(t), dev(np.zeros((0, 2), np.float32)), tf.bf16(dev(t)), dev(np.array(1.0, np.float32))):
        assert g.device == dev
        with pytest.raises(DeviceMismatchError) as e:
            np.asarray(g)
        msg = str(e.value)
        assert repr(dev) in msg and "`cpu(t)`" in msg and "`t.numpy()`" in msg
        with pytest.raises(DeviceMismatchError):
            np.array(g)
    assert np.asarray(tf.cpu(dev(t))).tolist() == [1.0, 2.0]
