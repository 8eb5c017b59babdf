"""Bad input at the API's edge (tensors, fills, devices, DataLoader) is a
clear triflux error, the same on every device; valid edge cases work."""
import math
import re

import numpy as np
import pytest

import triflux as tf
from triflux.devices import move_code
from triflux.errors import ArgumentError, DTypeError, OutOfMemoryError, ShapeError, StructureError
from helpers import DEVICES, device

# --- fills: sizes and values -------------------------------------------------------------------

BAD_SIZES = [None, math.nan, math.inf, 2.5, 2.0, "3", True, (2, (3,))]


@pytest.mark.parametrize("dev", DEVICES)
def test_sizes_must_be_ints_on_every_device(dev):
    d = device(dev)
    for make in (tf.zeros, tf.ones, tf.rand, tf.randn):
        name = make.__name__
        for size in BAD_SIZES:
            with pytest.raises(ShapeError, match=f"`{name}`: every size .* must be a non-negative int, got"):
                make(size, device=d)
        with pytest.raises(ShapeError, match=rf"`{name}`: every size \(in shape \(2, -1\)\) must be a non-negative"):
            make(2, -1, device=d)
    with pytest.raises(ShapeError, match="`full`: the shape must be an int or a tuple of ints, got None"):
        tf.full(None, 1.0, device=d)
    with pytest.raises(ShapeError, match=r"`full`: every size \(in shape \(2, 2.5\)\) .* got 2.5 \(float\)"):
        tf.full((2, 2.5), 1.0, device=d)
    assert tf.full(np.int64(2), 1.0, device=d).shape == (2,) and tf.zeros((), device=d).shape == ()
    assert tf.ones([2, np.int32(3)], device=d).shape == (2, 3)


@pytest.mark.parametrize("dev", DEVICES)
def test_fill_values_that_do_not_fit_the_dtype_raise_the_same_on_every_device(dev):
    d = device(dev)
    for dtype, value, holds in [("uint8", 300, "whole numbers from 0 to 255"), ("uint8", -1, "from 0 to 255"),
                                ("int8", -129, "from -128 to 127"), ("int16", 2**15, "to 32767"),
                                ("int32", 2**31, "to 2147483647"), ("int64", 2**63, "to 9223372036854775807"),
                                ("int32", 1.5, "whole numbers"), ("int64", math.nan, "whole numbers"),
                                ("bool", 2, "0/1 or False/True"), ("bool", -1, "0/1")]:
        with pytest.raises(DTypeError, match=f"`full`: the fill value {value!r} does not fit dtype {dtype}, "
                                             f"which holds .*{holds}"):
            tf.full((2,), value, dtype=dtype, device=d)
    for dtype, value in [("float16", 1e5), ("float32", -1e40)]:
        with pytest.raises(DTypeError, match=f"beyond the largest {dtype} .* would become inf"):
            tf.full((2,), value, dtype=dtype, device=d)
    with pytest.raises(ArgumentError, match="`full`: the fill value must be a number, got 'a' \\(str\\)"):
        tf.full((2,), "a", device=d)
    with pytest.raises(DTypeError, match="is complex, but dtype float32 holds real numbers"):
        tf.full((2,), 1j, device=d)
    # the edges of each range, inf and NaN for floats, NumPy and 0-d values
    for dtype, value, want in [("uint8", 255, 255), ("int8", -128, -128), ("bool", 1, True), ("int32", 7.0, 7),
                               ("float32", np.float32(-2.5), -2.5), ("float16", math.inf, math.inf),
                               ("float32", tf.tensor(3.0), 3.0)]:
        assert tf.full((2,), value, dtype=dtype, device=d).numpy().tolist() == [want, want]
    assert np.isnan(tf.full((1,), math.nan, device=d).numpy()).all()


@pytest.mark.parametrize("dev", DEVICES)
def test_an_allocation_too_large_is_out_of_memory_on_every_device(dev):
    d = device(dev)
    with pytest.raises(OutOfMemoryError) as e:
        tf.zeros(10**7, 10**7, device=d)
    msg = str(e.value)
    assert "(400000000000000 bytes) for a (10000000, 10000000) float32 tensor" in msg and "smaller batch" in msg
    if dev == "cpu":
        assert msg.startswith("out of memory on the host memory (CPUDevice())") and "`free -h`" in msg
    with pytest.raises(OutOfMemoryError, match="out of memory on .*float64 tensor"):
        tf.randn(10**7, 10**7, dtype="float64", device=d)


# --- arrays that are not numbers -----------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_strings_and_objects_never_become_tensors(dev):
    d = device(dev)
    for arr, what in [(np.array(["a"]), "strings"), (np.array([None, 1]), "Python objects"),
                      (np.array([b"x"]), "bytes"), (np.array(["2020-01-01"], dtype="datetime64[D]"), "dates")]:
        for make in (tf.Tensor, tf.tensor, d, lambda a: d({"x": [a]})):
            with pytest.raises(DTypeError, match=f"cannot make a Tensor of {what} .* a Tensor holds numbers"):
                make(arr)
    # a Python list is a structure: gpu/cpu move its arrays and leave other values alone
    assert d(["a", 1.5]) == ["a", 1.5]


# --- devices -----------------------------------------------------------------------------------

def test_device_indices_must_be_ints():
    for idx in ("x", 1.5, True, -1):
        for call in (lambda: tf.get_device("cuda", idx), lambda: tf.CUDADevice(idx)):
            with pytest.raises(ArgumentError, match=f"device index must be an int >= 0 .*got {idx!r}"):
                call()
    with pytest.raises(ValueError, match="bad device name 'cuda:x'; write it like 'cuda:1'"):
        tf.get_device("cuda:x")


def test_devices_lists_the_devices_of_a_backend():
    assert tf.devices("CPU") == tf.devices("cpu") == [tf.CPUDevice()]
    assert tf.devices("Metal") == []
    n = len(tf.devices("CUDA"))
    assert tf.devices("cuda") == [tf.CUDADevice(k) for k in range(n)]
    assert (n > 0) == tf.functional("CUDA")
    with pytest.raises(ValueError, match="unknown backend 'TPU'; valid backends are CUDA, AMDGPU, Metal, CPU"):
        tf.devices("TPU")


@pytest.mark.parametrize("dev", DEVICES)
def test_move_code_is_code_that_moves(dev):
    d = device(dev)
    code = move_code(d, "arr")
    assert code == ("cpu(arr)" if dev == "cpu" else "gpu(arr)")
    moved = eval(code, {**vars(tf), "arr": np.ones(2, np.float32)})
    assert moved.device == d
    assert move_code(tf.CUDADevice(3), "opt_state") == 'get_device("CUDA", 3)(opt_state)'


@pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")
def test_update_messages_give_code_that_runs():
    d = tf.CUDADevice(0)
    m_cpu = tf.Dense(2, 1)
    st = tf.setup(tf.Adam(), m_cpu)
    m = d(m_cpu)
    (g,) = tf.gradient(lambda mm: mm(d(np.ones((1, 2), np.float32))).sum(), m)
    with pytest.raises(tf.DeviceMismatchError) as e:
        tf.update(st, m, g)
    assert "Move the state too (`gpu(opt_state)`)" in str(e.value)
    (g_cpu,) = tf.gradient(lambda mm: mm(np.ones((1, 2), np.float32)).sum(), m_cpu)
    with pytest.raises(tf.DeviceMismatchError, match=r"on one device \(`gpu\(x\)`\)"):
        tf.update(tf.setup(tf.Adam(), m), m, g_cpu)


def test_device_call_and_gpu_document_the_float64_difference():
    assert "float64" in tf.CUDADevice.__call__.__doc__ and "gpu(x)" in tf.CUDADevice.__call__.__doc__
    assert "keeps every dtype" in tf.gpu.__doc__


@pytest.mark.parametrize("dev", DEVICES)
def test_structures_that_contain_themselves_are_a_clear_error(dev):
    d = device(dev)
    cyclic = [np.ones(2)]
    cyclic.append(cyclic)
    chain = tf.Chain(tf.Dense(2, 2))
    chain.layers.append(chain)
    for x, where in [(cyclic, r"x\[1\] is x"), ({"a": cyclic}, r"x.a\[1\] is x.a"), (chain, r"x.layers\[1\] is x")]:
        with pytest.raises(StructureError, match=f"contains itself \\({where}\\)"):
            d(x)
        with pytest.raises(StructureError, match=f"get_device\\(x\\): the structure contains itself \\({where}\\)"):
            tf.get_device(x)
        with pytest.raises(StructureError, match=f"fmap: the structure contains itself \\({where}\\)"):
            tf.f32(x)


# --- DataLoader arguments ------------------------------------------------------------------------

def test_dataloader_arguments_are_checked():
    data = np.ones((4, 2))
    for bad in (None, math.nan, [2], 0, -1, True, 2.5, "2"):
        with pytest.raises(ShapeError, match=f"DataLoader: batchsize .* must be a positive int, got {re.escape(repr(bad))}"):
            tf.DataLoader(data, batchsize=bad)
    for bad in ("abc", -1, 1.5, True):
        with pytest.raises(ArgumentError, match=f"DataLoader: rng must be a NumPy Generator .* got {bad!r}"):
            tf.DataLoader(data, rng=bad)
    for name in ("shuffle", "partial"):
        with pytest.raises(ArgumentError, match=f"DataLoader: {name} must be True or False, got 'yes'"):
            tf.DataLoader(data, **{name: "yes"})
    assert len(tf.DataLoader(data, batchsize=np.int64(3), shuffle=np.bool_(True), rng=np.uint8(1))) == 2


# --- detach ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES)
def test_detach_shares_memory_and_stops_the_gradient(dev):
    d = device(dev)
    x = tf.tensor(np.array([1.0, 2.0, 3.0], np.float32), device=d)
    y = x.detach()
    assert y is not x and y._data is x._data and y.device == d and y.dtype == x.dtype
    (g,) = tf.gradient(lambda t: (t * t).sum(), x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0, 6.0])
    (g,) = tf.gradient(lambda t: (t.detach() * t).sum(), x)           # the detached factor is a constant
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0, 3.0])
