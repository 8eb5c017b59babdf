"""Devices and moving structures; the errors the seeds' users needed."""
import re

import numpy as np
import pytest

import triflux as tf
from triflux.errors import DeviceMismatchError, BackendNotSupportedError
from helpers import DEVICES, device, run_python

needs_gpu = pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")


def test_supported_devices_and_cpu():
    assert tf.supported_devices() == ("CUDA", "AMDGPU", "Metal", "CPU")
    assert tf.functional("CPU") and not tf.functional("Metal")
    assert tf.get_device("CPU") == tf.cpu_device() == tf.CPUDevice()
    assert tf.get_device(backend="CPU") == tf.cpu_device()
    if tf.functional("CUDA"):
        assert tf.get_device("CUDA", 0) == tf.get_device(backend="CUDA", idx=0) == tf.CUDADevice(0)
    assert hash(tf.CUDADevice(1)) == hash(tf.CUDADevice(1)) and tf.CUDADevice(1) != tf.CUDADevice(0)
    with pytest.raises(ValueError, match="CUDA, AMDGPU, Metal, CPU"):
        tf.get_device("TPU")


def test_metal_is_a_clear_error():
    with pytest.raises(BackendNotSupportedError, match="Triton has no Metal backend.*CPU"):
        tf.MetalDevice()(np.ones(2))


def test_cpu_device_makes_tensors_from_arrays():
    t = tf.cpu(np.ones((2, 2)))
    assert isinstance(t, tf.Tensor) and t.device == tf.cpu_device() and t.dtype == np.float64


@needs_gpu
def test_gpu_moves_structures_with_cu_rules():
    data = {"x": np.ones((2, 3)), "y": np.arange(3), "m": np.array([True]), "h": np.ones(2, np.float16),
            "nested": (np.zeros(2, np.float32), [np.ones(1)]), "n": 5}
    g = tf.gpu(data)
    gpu = tf.CUDADevice(0)
    assert g["x"].device == gpu and g["x"].dtype == np.float32          # float64 -> float32
    assert g["y"].dtype == np.int64 and g["m"].dtype == np.bool_ and g["h"].dtype == np.float16
    assert isinstance(g["nested"], tuple) and g["nested"][1][0].dtype == np.float32
    assert g["n"] == 5
    back = tf.cpu(g)
    assert back["x"].device == tf.cpu_device()
    np.testing.assert_array_equal(back["y"].numpy(), np.arange(3))
    # a device object keeps the dtype (MLDataDevices semantics)
    assert gpu(np.ones(2)).dtype == np.float64


@needs_gpu
def test_gpu_moves_models_without_touching_the_original():
    m = tf.Chain(tf.Dense(3, 2, tf.relu), tf.Dense(2, 1))
    g = tf.gpu(m)
    assert tf.get_device(g) == tf.CUDADevice(0) and tf.get_device(m) == tf.cpu_device()
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(g(tf.gpu(x)).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert "Dense(3 => 2, relu)" in repr(g)


@needs_gpu
def test_device_mismatch_names_both_devices_and_the_fix():
    a, b = tf.ones(2), tf.gpu(tf.ones(2))
    with pytest.raises(DeviceMismatchError) as e:
        a + b
    msg = str(e.value)
    assert "CPUDevice()" in msg and "CUDADevice(0)" in msg and "gpu(x)" in msg and "`add`" in msg


@needs_gpu
def test_layer_names_itself_on_device_mismatch():
    m = tf.gpu(tf.Dense(3, 2))
    with pytest.raises(DeviceMismatchError) as e:
        m(np.ones((1, 3), np.float32))
    msg = str(e.value)
    assert "Dense(3 => 2)" in msg and "CUDADevice(0)" in msg and "CPUDevice()" in msg
    assert "gpu(x)" in msg or "CUDADevice(0)(x)" in msg


def test_get_device_of_objects():
    m = tf.Dense(2, 2)
    assert tf.get_device(m) == tf.cpu_device()
    assert tf.get_device(tf.relu) is None
    if tf.functional("CUDA"):
        m.bias = tf.gpu(m.bias)
        with pytest.raises(DeviceMismatchError, match="different devices"):
            tf.get_device(m)


def test_mixed_devices_message_gives_code_that_runs():
    """The fix in a device-mismatch message is valid code for each side."""
    if not tf.functional("CUDA"):
        pytest.skip("needs a CUDA device (real, or the interpreter's)")
    a, b = tf.cpu(np.ones(3, np.float32)), tf.gpu(np.ones(3, np.float32))
    with pytest.raises(DeviceMismatchError) as err:
        a + b
    snippets = re.findall(r"`([^`]+)` moves x to", str(err.value))
    assert snippets == ["cpu(x)", "gpu(x)"], str(err.value)
    for code, target in zip(snippets, (a, b)):
        moved = eval(code, {"cpu": tf.cpu, "gpu": tf.gpu, "x": np.ones(2, np.float32)})
        assert moved.device == target.device


def test_without_a_gpu_backend():
    """CUDA_VISIBLE_DEVICES=-1, no interpreter (one subprocess for three checks):
    `gpu` is a no-op; asking for a CUDA device gives a triflux error; even a
    direct kernel call (bypassing device checks) never shows Triton's
    '0 active drivers'."""
    r = run_python("""
        import numpy as np, triflux as tf
        x = np.ones(3)
        assert tf.gpu(x) is x
        assert not tf.functional("CUDA")
        print("OK", tf.get_device())
        try:
            tf.CUDADevice(0)(np.ones(3))
        except tf.NoGPUError as e:
            print("ERR1", e)
        import torch
        from triflux.triton_kernels import copy
        try:
            copy.full((3,), 1.0, torch.float32, "cpu")
        except tf.NoGPUError as e:
            print("ERR2", e)
    """, unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert r.returncode == 0, r.stderr
    assert "OK CPUDevice()" in r.stdout
    assert "ERR1 no CUDA GPU backend is functional here: CUDA_VISIBLE_DEVICES='-1' hides all GPUs" in r.stdout
    assert "ERR2 no GPU backend is functional" in r.stdout, r.stdout + r.stderr
    assert "active drivers" not in r.stdout + r.stderr


def test_cuda_visible_devices_minus_one_disables_the_interpreter_too():
    r = run_python("""
        import triflux as tf
        print(tf.functional('CUDA'), tf.devices('CUDA'))
        try:
            tf.get_device("CUDA")
        except tf.NoGPUError as e:
            print(e)
    """, env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "-1"})
    out = r.stdout.splitlines()
    assert out[0] == "False []", r.stderr
    assert "hides all GPUs and the Triton interpreter's virtual devices. Unset CUDA_VISIBLE_DEVICES" in out[1]
    assert "TRITON_INTERPRET=1" not in out[1]         # it is set already: no advice to set it


def test_gpu_backend_preference_roundtrip(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[other]\nkeep = 1\n')
    r = run_python("import triflux as tf; tf.gpu_backend('amdgpu')", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "restart" in r.stdout.lower()
    text = (tmp_path / "LocalPreferences.toml").read_text()
    assert 'gpu_backend = "AMDGPU"' in text and "[triflux]" in text and "keep = 1" in text
    r = run_python("import triflux as tf; print(tf.GPU_BACKEND)", cwd=tmp_path)
    assert r.stdout.strip() == "AMDGPU", r.stderr
    r = run_python("import triflux as tf; tf.gpu_backend('TPU')", cwd=tmp_path)
    assert r.returncode != 0 and "CUDA, AMDGPU, Metal, CPU" in r.stderr


def test_cpu_preference_selects_the_cpu(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[triflux]\ngpu_backend = "CPU"\n')
    r = run_python("import triflux as tf; print(tf.get_device(verbose=True))", cwd=tmp_path,
                   env={"TRITON_INTERPRET": "1"})
    assert r.stdout.strip().endswith("CPUDevice()"), r.stdout + r.stderr


@pytest.mark.parametrize("dev", DEVICES)
def test_fmap_rebuilds(dev):
    d = device(dev)
    m = d(tf.Chain(tf.Dense(2, 2), tf.flatten))
    doubled = tf.fmap(lambda t: t * 2, m)
    assert doubled is not m and doubled[1] is tf.flatten
    np.testing.assert_allclose(doubled[0].weight.numpy(), 2 * m[0].weight.numpy())


@needs_gpu
def test_out_of_memory_becomes_a_triflux_error_and_leaves_the_model_intact(monkeypatch):
    torch = pytest.importorskip("torch")
    from triflux.triton_kernels import launch
    m = tf.gpu(tf.Dense(3, 2))
    x = tf.gpu(np.ones((4, 3), np.float32))
    before = m.weight.numpy()

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32 bytes")
    monkeypatch.setattr(launch.torch, "empty", no_memory)
    with pytest.raises(tf.OutOfMemoryError) as e:
        m(x)
    monkeypatch.undo()
    msg = str(e.value)
    assert "out of memory" in msg and "32 bytes" in msg and "smaller batch" in msg
    np.testing.assert_array_equal(m.weight.numpy(), before)
    assert m(x).shape == (4, 2)                       # and it works again afterwards


def test_reclaim_is_safe_anywhere():
    tf.reclaim()
    if tf.functional("CUDA"):
        x = tf.gpu(np.ones(3, np.float32))
        tf.reclaim()
        assert x.numpy().tolist() == [1.0, 1.0, 1.0]
