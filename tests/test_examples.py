"""The examples/ scripts run, learn, and behave the same on every device."""
import importlib.util
import os

import numpy as np
import pytest

from .helpers import DEVICES, ROOT, device, run_python


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unet_chain_learns_on_cpu():
    ex = _load("unet_chain")
    history = ex.train(device("cpu"), steps=8, image_size=16, batch=2, lr=3e-3, say=lambda *a: None)
    assert all(np.isfinite(history))
    assert history[-1] < 0.9 * history[0], history


@pytest.mark.parametrize("dev", DEVICES)
def test_unet_chain_same_losses_on_every_device(dev):
    ex = _load("unet_chain")
    ref = ex.train(device("cpu"), steps=2, image_size=8, batch=1, say=lambda *a: None)
    got = ex.train(device(dev), steps=2, image_size=8, batch=1, say=lambda *a: None)
    np.testing.assert_allclose(got, ref, rtol=2e-4)


@pytest.mark.parametrize("dev", DEVICES)
def test_unet_chain_pitfalls_are_answered(dev):
    import triflux as tf
    ex = _load("unet_chain")
    seen = ex.pitfalls(device(dev), say=lambda *a: None)
    if dev != "cpu":
        msg = seen["device"]
        assert "CPUDevice()" in msg and "CUDADevice(0)" in msg and "Conv((3, 3), 3 => 64" in msg
    out_dtype, warned = seen["float64"]
    assert out_dtype == tf.float32
    assert seen["param_dtypes"] == {tf.float32}


def test_unet_chain_script_runs():
    r = run_python("import runpy, sys; sys.argv = ['unet_chain.py', '--device', 'cpu', '--steps', '2', "
                   "'--image-size', '8']; runpy.run_path('examples/unet_chain.py', run_name='__main__')")
    assert r.returncode == 0, r.stderr
    assert "loss" in r.stdout and "in 2 steps on CPUDevice()" in r.stdout
    bad = run_python("import runpy, sys; sys.argv = ['unet_chain.py', '--image-size', '10']; "
                     "runpy.run_path('examples/unet_chain.py', run_name='__main__')")
    assert bad.returncode == 2 and "multiple of 4" in bad.stderr


def test_rnn_sine_learns_the_wave_on_the_cpu(tmp_path):
    ex = _load("rnn_sine")
    model, history, _ = ex.train(device("cpu"), epochs=150, say=lambda *a: None)
    assert history[-1] < 0.02 * history[0], (history[0], history[-1])
    _, _, y = ex.sine_data()
    assert np.max(np.abs(ex.predict(model, device("cpu")) - y.reshape(-1))) < 0.15
    path = ex.plot(str(tmp_path / "sine.png"), ex.predict(model, device("cpu")))
    with open(path, "rb") as f:
        assert f.read(4) == b"\x89PNG"


@pytest.mark.parametrize("dev", DEVICES)
def test_rnn_sine_same_code_same_losses_on_every_device(dev):
    ex = _load("rnn_sine")
    _, ref, _ = ex.train(device("cpu"), epochs=3, say=lambda *a: None)
    _, got, _ = ex.train(device(dev), epochs=3, say=lambda *a: None)
    np.testing.assert_allclose(got, ref, rtol=1e-4)
