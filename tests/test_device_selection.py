"""Backend detection (without hardware: the facts detection reads are
replaced), device selection and its log, CUDA_VISIBLE_DEVICES, the backend
preference file, and several (virtual) GPUs."""
import dataclasses
import logging

import numpy as np
import pytest

import importlib

import triflux as tf
from triflux import backend
from triflux.backend import Facts, status_from, visible_ordinals
from triflux.errors import DeviceMismatchError, NoGPUError
from helpers import run_python

devices = importlib.import_module("triflux.devices")   # the module (`triflux.devices` is the function)

# --- detection logic, from facts alone -------------------------------------------------

CUDA_BUILD = Facts(torch_version="2.5.1+cu124", cuda_version="12.4", cuda_available=True, device_count=2,
                   device_names=("NVIDIA H100", "NVIDIA A100"), triton_version="3.6.0")
ROCM_BUILD = Facts(torch_version="2.5.1+rocm6.2", hip_version="6.2.41133", cuda_available=True,
                   device_count=1, device_names=("AMD Instinct MI300X",), triton_version="3.6.0")
CPU_TORCH = Facts(torch_version="2.5.1+cpu", triton_version="3.6.0")
NO_TORCH = Facts(torch_error="No module named 'torch'", triton_version="3.6.0")
NO_TRITON = dataclasses.replace(CUDA_BUILD, triton_version=None, triton_error="No module named 'triton'")
NO_DRIVER = dataclasses.replace(CUDA_BUILD, cuda_available=False, device_count=0, device_names=())
INTERP = Facts(torch_version="2.5.1+cpu", triton_version="3.6.0", interpreter=True)


def st(name, facts, **changes):
    return status_from(name, dataclasses.replace(facts, **changes))


def test_cuda_build_with_gpus():
    ok, why = status_from("CUDA", CUDA_BUILD)
    assert ok and "2 device(s)" in why and "NVIDIA H100" in why and "1: NVIDIA A100" in why
    ok, why = status_from("AMDGPU", CUDA_BUILD)
    assert not ok and "not a ROCm build" in why
    assert status_from("CPU", CUDA_BUILD) == (True, "the NumPy reference always runs")
    ok, why = status_from("Metal", CUDA_BUILD)
    assert not ok and "no Metal backend" in why and "cpu_device()" in why


def test_rocm_build_serves_amdgpu_not_cuda():
    ok, why = status_from("AMDGPU", ROCM_BUILD)
    assert ok and "MI300X" in why
    ok, why = status_from("CUDA", ROCM_BUILD)
    assert not ok and "ROCm build" in why and "AMDGPU" in why
    ok, why = st("AMDGPU", ROCM_BUILD, cuda_available=False, device_count=0, device_names=())
    assert not ok and "AMD GPU" in why and "is_available() is False" in why


def test_cpu_only_torch_no_torch_no_triton_no_driver():
    ok, why = status_from("CUDA", CPU_TORCH)
    assert not ok and "CPU-only build" in why and "torch.version.cuda is None" in why
    ok, why = status_from("CUDA", NO_TORCH)
    assert not ok and "torch is not installed" in why and "pip install triflux[gpu]" in why
    ok, why = status_from("CUDA", NO_TRITON)
    assert not ok and "triton is not installed" in why
    ok, why = status_from("CUDA", NO_DRIVER)
    assert not ok and "NVIDIA GPU driver" in why and "is_available() is False" in why
    ok, why = st("CUDA", CUDA_BUILD, cuda_available=False, torch_error="torch.cuda failed: driver too old")
    assert not ok and "driver too old" in why


@pytest.mark.parametrize("value", ["-1", "", " -1 "])
def test_cuda_visible_devices_hiding_everything(value):
    for facts in (CUDA_BUILD, ROCM_BUILD, INTERP):
        for name in ("CUDA", "AMDGPU"):
            ok, why = st(name, facts, cuda_visible_devices=value)
            assert not ok and "CUDA_VISIBLE_DEVICES" in why and "hides all GPUs" in why


def test_cuda_visible_devices_selecting_none_on_a_real_gpu():
    # torch applied CUDA_VISIBLE_DEVICES=7 on a 2-GPU machine: nothing left
    ok, why = st("CUDA", NO_DRIVER, cuda_visible_devices="7")
    assert not ok and "CUDA_VISIBLE_DEVICES='7' selects none" in why


def test_visible_ordinals_follow_cuda_rules():
    assert visible_ordinals(None, 3) == [0, 1, 2]
    assert visible_ordinals("1,0", 3) == [1, 0]
    assert visible_ordinals("2", 3) == [2]
    assert visible_ordinals("-1", 3) == [] and visible_ordinals("", 3) == []
    assert visible_ordinals("0,-1,1", 3) == [0]          # stops at the first invalid entry
    assert visible_ordinals("1,5,0", 3) == [1]            # ... an out-of-range one
    assert visible_ordinals("1,1,0", 3) == [1]            # ... a repeated one
    assert visible_ordinals(" 2 , 0 ", 3) == [2, 0]
    assert visible_ordinals("GPU-8932f937", 3) == []


def test_interpreter_serves_virtual_cuda_devices():
    ok, why = status_from("CUDA", INTERP)
    assert ok and "TRITON_INTERPRET=1" in why and "1 virtual device(s)" in why
    ok, why = status_from("AMDGPU", INTERP)
    assert not ok and "interpreter serves the CUDA backend only" in why
    assert status_from("CUDA", dataclasses.replace(INTERP, interpreter_devices="3"))[1].endswith("(3 virtual device(s))")
    ok, why = st("CUDA", INTERP, interpreter_devices="2", cuda_visible_devices="5")
    assert not ok and "CUDA_VISIBLE_DEVICES='5' selects none of the 2 virtual device(s)" in why
    ok, why = st("CUDA", INTERP, interpreter_devices="0")
    assert not ok and "TRIFLUX_INTERPRETER_DEVICES=0" in why
    ok, why = st("CUDA", INTERP, interpreter_devices="two")
    assert not ok and "TRIFLUX_INTERPRETER_DEVICES='two'" in why
    f = dataclasses.replace(INTERP, interpreter_devices="3", cuda_visible_devices="2,0")
    assert [p for p, _ in backend.visible_devices(f)] == [2, 0]
    assert "virtual device 2" in backend.visible_devices(f)[0][1]


def test_interpreter_refuses_a_numpy_its_triton_cannot_run_on():
    """Triton 3.6's interpreter fails with NumPy 2.4 deep inside a launch:
    detection says so, with the fix, instead (setup.cfg accepts both ends)."""
    ok, why = st("CUDA", INTERP, triton_version="3.6.0", numpy_version="2.4.6")
    assert not ok and "Triton 3.6.0's interpreter fails with NumPy 2.4.6" in why and "numpy<2.4" in why
    assert st("CUDA", INTERP, triton_version="3.6.0", numpy_version="2.3.5")[0]
    assert st("CUDA", INTERP, triton_version="3.9.0", numpy_version="2.4.6")[0]
    assert st("CUDA", CUDA_BUILD, triton_version="3.6.0", numpy_version="2.4.6")[0]   # compiled kernels: fine


def test_unknown_backend_names_the_valid_ones():
    with pytest.raises(ValueError, match="CUDA, AMDGPU, Metal, CPU"):
        status_from("TPU", CUDA_BUILD)
    with pytest.raises(ValueError, match="CUDA, AMDGPU, Metal, CPU"):
        tf.functional("TPU")
    assert tf.functional("cpu") and tf.functional("CPU") and not tf.functional("metal")


@pytest.fixture
def fake(monkeypatch):
    """Make this process believe in other facts (and no preference)."""
    def use(facts, pref=None):
        monkeypatch.setattr(backend, "facts", lambda: facts)
        monkeypatch.setattr(devices, "_preferred_backend", lambda: pref)
    yield use
    devices._TORCH_DEVICES.clear()


def test_rocm_build_selects_amdgpu_devices(fake):
    fake(ROCM_BUILD)
    assert tf.functional("AMDGPU") and not tf.functional("CUDA")
    assert tf.get_device() == tf.AMDGPUDevice(0) == tf.gpu_device()
    assert tf.get_device("AMDGPU", 0).name == "AMD Instinct MI300X"
    torch = pytest.importorskip("torch")
    assert tf.AMDGPUDevice(0).torch_device == torch.device("cuda", 0)   # ROCm torch calls AMD GPUs "cuda"
    with pytest.raises(NoGPUError, match="no CUDA GPU backend is functional here: this torch is a ROCm build"):
        tf.get_device("CUDA")
    with pytest.raises(NoGPUError, match=r"AMDGPUDevice\(1\) does not exist: 1 AMDGPU device\(s\) visible"):
        tf.get_device("AMDGPU", 1)


def test_cuda_build_with_two_gpus_selects_by_index(fake):
    fake(CUDA_BUILD)
    assert tf.get_device() == tf.CUDADevice(0)
    assert tf.get_device("CUDA", 1) == tf.get_device("cuda:1") == tf.get_device(backend="CUDA", idx=1)
    assert tf.get_device("CUDA", 1).name == "NVIDIA A100"
    assert tf.gpu_device(1) == tf.CUDADevice(1)
    with pytest.raises(NoGPUError) as e:
        tf.get_device("CUDA", 2)
    msg = str(e.value)
    assert "CUDADevice(2) does not exist" in msg and "2 CUDA device(s) visible (indices 0..1)" in msg
    assert "CUDA_VISIBLE_DEVICES is unset" in msg
    fake(dataclasses.replace(CUDA_BUILD, cuda_visible_devices="1,0"))
    with pytest.raises(NoGPUError, match="CUDA_VISIBLE_DEVICES is '1,0'"):
        tf.get_device("CUDA", 2)


def test_devices_and_move_code_on_two_gpus(fake):
    fake(CUDA_BUILD)
    assert tf.devices("CUDA") == [tf.CUDADevice(0), tf.CUDADevice(1)] and tf.devices("AMDGPU") == []
    assert devices.move_code(tf.CUDADevice(0), "m") == "gpu(m)"
    assert devices.move_code(tf.CUDADevice(1), "m") == 'get_device("CUDA", 1)(m)'
    fake(ROCM_BUILD)
    assert tf.devices("AMDGPU") == [tf.AMDGPUDevice(0)] and tf.devices("CUDA") == []


INTERPRETER_ADVICE = "set TRITON_INTERPRET=1 in the environment before importing triflux"


@pytest.mark.parametrize("facts, name, says", [
    (dataclasses.replace(INTERP, cuda_visible_devices="-1"), "CUDA",
     "CUDA_VISIBLE_DEVICES='-1' hides all GPUs and the Triton interpreter's virtual devices. Unset "
     "CUDA_VISIBLE_DEVICES (or list the devices to use, e.g. CUDA_VISIBLE_DEVICES=0), or run on the CPU device"),
    (dataclasses.replace(CUDA_BUILD, cuda_visible_devices="-1"), "CUDA", "hides all GPUs. Unset CUDA_VISIBLE_DEVICES"),
    (NO_TORCH, "CUDA", "Install the GPU extra (`pip install triflux[gpu]`), or run on the CPU device (`cpu(x)`)"),
    (NO_TRITON, "CUDA", "triton is not installed"),
    (INTERP, "AMDGPU", 'Use the CUDA device the interpreter serves (`get_device("CUDA")`)'),
    (dataclasses.replace(INTERP, interpreter_devices="0"), "CUDA", "Set TRIFLUX_INTERPRETER_DEVICES to the number"),
    (dataclasses.replace(INTERP, triton_version="3.6.0", numpy_version="2.4.0"), "CUDA",
     "install `numpy<2.4`, or Triton 3.9. Install versions that work together, or run on the CPU device"),
    (NO_DRIVER, "CUDA", f"Run on the CPU device (`cpu(x)`), or {INTERPRETER_ADVICE} to run the Triton kernels"),
    (CPU_TORCH, "CUDA", INTERPRETER_ADVICE),
    (CUDA_BUILD, "AMDGPU", f"{INTERPRETER_ADVICE} to run the Triton kernels in the interpreter on the CUDA "
                           "device (the interpreter serves CUDA only)"),
])
def test_advice_fits_the_situation(fake, facts, name, says):
    """The interpreter is suggested only where it can help: not when it is on
    already, nor without torch or triton."""
    fake(facts)
    with pytest.raises(NoGPUError) as e:
        tf.get_device(name)
    msg = str(e.value)
    assert says in msg
    if facts.interpreter or facts.torch_version is None or facts.triton_version is None:
        assert "TRITON_INTERPRET=1 in the environment" not in msg


def test_no_gpu_selects_the_cpu_and_force_raises(fake):
    fake(CPU_TORCH)
    assert tf.get_device() == tf.cpu_device() == tf.gpu_device()
    with pytest.raises(NoGPUError) as e:
        tf.gpu_device(force=True)
    msg = str(e.value)
    assert "CUDA: this torch is a CPU-only build" in msg and "Metal: Triton has no Metal backend" in msg
    assert "python -m triflux doctor" in msg


def test_verbose_logs_choice_and_skipped_backends(fake, caplog):
    fake(ROCM_BUILD)
    with caplog.at_level(logging.INFO, logger="triflux"):
        assert tf.get_device(verbose=True) == tf.AMDGPUDevice(0)
    msgs = [r.getMessage() for r in caplog.records if r.name == "triflux"]
    assert msgs[0].startswith("Skipping CUDA: this torch is a ROCm build")
    assert msgs[1] == "Using backend: AMDGPU, device 0 (AMD Instinct MI300X)."
    caplog.clear()
    fake(CPU_TORCH, pref="CUDA")
    with caplog.at_level(logging.INFO, logger="triflux"):
        assert tf.get_device(verbose=True) == tf.cpu_device()
    recs = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "triflux"]
    assert recs[0] == ("INFO", "Using backend set in preferences: CUDA.")
    assert recs[1][0] == "WARNING" and recs[1][1].startswith(
        "Trying to use backend: CUDA but it is not functional here: this torch is a CPU-only build")
    assert "gpu_backend" in recs[1][1]
    assert recs[2] == ("INFO", "Skipping AMDGPU: this torch is not a ROCm build (torch.version.hip is None); "
                               "AMDGPU needs torch built for ROCm.")
    assert recs[3][1].startswith("Skipping Metal: Triton has no Metal backend")
    assert recs[4:] == [("INFO", "No functional GPU backend found! Defaulting to CPU."),
                        ("INFO", "Using backend: CPU.")]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="triflux"):
        tf.get_device()                                   # not verbose: silent
    assert not [r for r in caplog.records if r.name == "triflux"]


def test_preference_wins_when_functional(fake, caplog):
    fake(CUDA_BUILD, pref="CPU")
    with caplog.at_level(logging.INFO, logger="triflux"):
        assert tf.get_device(verbose=True) == tf.cpu_device()
    assert [r.getMessage() for r in caplog.records] == ["Using backend set in preferences: CPU."]
    fake(ROCM_BUILD, pref="AMDGPU")
    assert tf.get_device() == tf.AMDGPUDevice(0)
    fake(CUDA_BUILD, pref="Metal")                        # cannot be honoured: automatic
    assert tf.get_device() == tf.CUDADevice(0)


def test_metal_is_a_device_that_explains_itself():
    m = tf.get_device("Metal")
    assert m == tf.MetalDevice()
    with pytest.raises(tf.BackendNotSupportedError, match="Triton has no Metal backend.*cpu_device"):
        m(np.ones(2))


# --- the real process: environment variables and preference files (subprocesses) -------

def test_verbose_log_lines_on_stderr_without_logging_configured(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[triflux]\ngpu_backend = "CUDA"\n')
    r = run_python("import triflux as tf; print(tf.get_device(verbose=True))", cwd=tmp_path,
                   unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "CPUDevice()"
    err = r.stderr.splitlines()
    assert err[0] == "[ Info: Using backend set in preferences: CUDA."
    assert err[1].startswith("[ Warning: Trying to use backend: CUDA but it is not functional here: "
                             "CUDA_VISIBLE_DEVICES='-1' hides all GPUs")
    assert err[2].startswith("[ Info: Skipping AMDGPU: CUDA_VISIBLE_DEVICES='-1'")
    assert err[-2:] == ["[ Info: No functional GPU backend found! Defaulting to CPU.", "[ Info: Using backend: CPU."]


def test_cuda_visible_devices_renumbers_interpreter_devices():
    r = run_python("""
        import triflux as tf
        from triflux import backend
        print(backend.device_count("CUDA"), tf.get_device("CUDA", 0).name, "|", tf.get_device("CUDA", 1).name)
        assert tf.devices("CUDA") == [tf.CUDADevice(0), tf.CUDADevice(1)]
        x = tf.get_device("CUDA", 1)(tf.ones(2))
        print(tf.get_device(x))
        try:
            tf.get_device("CUDA", 2)
        except tf.NoGPUError as e:
            print("ERR", e)
    """, env={"TRITON_INTERPRET": "1", "TRIFLUX_INTERPRETER_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "2,0"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("2 Triton interpreter virtual device 2") and "| Triton interpreter virtual device 0" in lines[0]
    assert lines[1].startswith("CUDADevice(1)")
    assert "ERR CUDADevice(2) does not exist: 2 CUDA device(s) visible" in lines[2]
    assert "CUDA_VISIBLE_DEVICES is '2,0'" in lines[2] and "TRIFLUX_INTERPRETER_DEVICES" in lines[2]


def test_gpu_backend_keeps_other_content_and_says_when_nothing_changes(tmp_path, capsys):
    path = tmp_path / "LocalPreferences.toml"
    path.write_text('# my project\n[other]\nkeep = 1  # note\n\n[triflux]\ngpu_backend = "CUDA"\nextra = true\n')
    assert tf.gpu_backend("cpu", directory=str(tmp_path)) == "CPU"
    out = capsys.readouterr().out
    assert "New GPU backend set: 'CPU'" in out and "Restart Python" in out
    text = path.read_text()
    assert text == '# my project\n[other]\nkeep = 1  # note\n\n[triflux]\ngpu_backend = "CPU"\nextra = true\n'
    from triflux.preferences import read_preference
    assert read_preference(str(tmp_path)) == "CPU"
    # a file without the section gets one; a new file is created
    (tmp_path / "a").mkdir()
    tf.gpu_backend("AMDGPU", directory=str(tmp_path / "a"))
    assert (tmp_path / "a" / "LocalPreferences.toml").read_text() == '[triflux]\ngpu_backend = "AMDGPU"\n'
    path.write_text('[deps]\nx = 1\n')
    tf.gpu_backend("Metal", directory=str(tmp_path))
    assert path.read_text() == '[deps]\nx = 1\n\n[triflux]\ngpu_backend = "Metal"\n'
    with pytest.raises(ValueError, match="unknown GPU backend 'TPU'; valid backends are CUDA, AMDGPU, Metal, CPU"):
        tf.gpu_backend("TPU", directory=str(tmp_path))
    path.write_text("[triflux\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        tf.gpu_backend("CPU", directory=str(tmp_path))


def test_gpu_backend_already_set(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[triflux]\ngpu_backend = "CPU"\n')
    r = run_python("import triflux as tf; print(tf.GPU_BACKEND); tf.gpu_backend('CPU')", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "CPU" and "already set to 'CPU'" in r.stdout


def test_bad_preference_value_is_ignored_with_a_warning(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[triflux]\ngpu_backend = "TPU"\n')
    with pytest.warns(UserWarning, match="'TPU' is not one of CUDA, AMDGPU, Metal, CPU; ignored"):
        from triflux.preferences import read_preference
        assert read_preference(str(tmp_path)) is None


# --- several GPUs (virtual under the interpreter, real ones with TRIFLUX_TEST_REAL_GPU=1) --

@pytest.fixture
def two_gpus(monkeypatch):
    """CUDADevice(0) and CUDADevice(1): two virtual devices of the Triton
    interpreter, or two real GPUs."""
    f = backend.facts()
    if f.interpreter:
        monkeypatch.setattr(backend, "facts", lambda: dataclasses.replace(f, interpreter_devices="2"))
    elif backend.device_count("CUDA") < 2:
        pytest.skip("needs two GPUs (or the Triton interpreter)")
    devices._TORCH_DEVICES.clear()
    yield tf.get_device("CUDA", 0), tf.get_device("CUDA", 1)
    devices._TORCH_DEVICES.clear()


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    y = tf.losses.onehotbatch(rng.integers(0, 2, 6), range(2))
    return x, y


def test_models_move_between_gpus(two_gpus):
    d0, d1 = two_gpus
    m = tf.Chain(tf.Dense(3, 4, tf.relu), tf.Dense(4, 2))
    m0 = d0(m)
    m1 = d1(m0)
    assert tf.get_device(m0) == d0 and tf.get_device(m1) == d1 and tf.get_device(m) == tf.cpu_device()
    assert m1[0].weight.device.idx == 1
    np.testing.assert_array_equal(m1[0].weight.numpy(), m[0].weight.numpy())
    x, _ = _data()
    y1 = m1(d1(x))
    assert y1.device == d1                                  # results land on the inputs' device
    np.testing.assert_allclose(y1.numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    for y in (d1(x) + 1, tf.softmax(d1(x)), d1(x) @ d1(x).T, d1(x).sum(), tf.zeros(2, device="cuda:1"),
              tf.randn(3, device=d1), tf.zeros_like(d1(x))):
        assert y.device == d1
    back = d0(m1)
    assert tf.get_device(back) == d0


def test_printing_a_model_on_the_second_gpu(two_gpus):
    _, d1 = two_gpus
    m1 = d1(tf.Chain(tf.Dense(3, 4, tf.relu), tf.Dense(4, 2)))
    text = repr(m1)
    assert "Dense(3 => 4, relu)" in text and "26 parameters" in text
    t = repr(m1[0].weight)
    assert t.startswith("4×3 Tensor{float32} on CUDADevice(1)")
    np.testing.assert_array_equal(m1[0].weight.numpy(), tf.cpu(m1)[0].weight.numpy())


def test_gpus_do_not_mix(two_gpus):
    d0, d1 = two_gpus
    with pytest.raises(DeviceMismatchError) as e:
        d0(np.ones(2, np.float32)) + d1(np.ones(2, np.float32))
    msg = str(e.value)
    # valid code for each side: the default GPU device is gpu(x), the other one by name
    assert "CUDADevice(0)" in msg and "CUDADevice(1)" in msg and "`gpu(x)`" in msg and '`get_device("CUDA", 1)(x)`' in msg
    m1 = d1(tf.Dense(3, 2))
    with pytest.raises(DeviceMismatchError) as e:
        m1(d0(np.ones((1, 3), np.float32)))
    msg = str(e.value)
    assert "Dense(3 => 2)" in msg and "CUDADevice(0)" in msg and "CUDADevice(1)" in msg
    m1.bias = d0(m1.bias)
    with pytest.raises(DeviceMismatchError, match="different devices"):
        tf.get_device(m1)


def test_training_on_the_second_gpu_matches_the_cpu(two_gpus):
    _, d1 = two_gpus
    x, y = _data()

    def train(dev):
        tf.seed(3)
        m = dev(tf.Chain(tf.Dense(3, 8, tf.relu), tf.Dense(8, 2)))
        opt = tf.optimise.setup(tf.optimise.Adam(0.05), m)
        xb, yb = dev(x), dev(y)
        losses = []
        for _ in range(3):
            loss, (g,) = tf.withgradient(lambda mm: tf.losses.logitcrossentropy(mm(xb), yb), m)
            if dev != tf.cpu_device():
                assert tf.get_device(g) == dev and loss.device == dev
            tf.optimise.update(opt, m, g)
            losses.append(float(loss))
        assert tf.get_device(m) == dev and tf.get_device(opt) == dev
        return np.array(losses)

    np.testing.assert_allclose(train(d1), train(tf.cpu_device()), rtol=1e-4, atol=1e-5)


def test_dataloader_on_the_second_gpu(two_gpus):
    _, d1 = two_gpus
    x, y = _data()
    for xb, yb in d1(tf.DataLoader((x, y), batchsize=4)):
        assert xb.device == d1 and yb.device == d1


def test_kernels_launch_on_the_inputs_gpu():
    """On a real machine with two GPUs: with GPU 0 current, work on GPU 1 must
    launch there (launch.launch selects the inputs' device) and be right."""
    torch = pytest.importorskip("torch")
    if backend.facts().interpreter or backend.device_count("CUDA") < 2:
        pytest.skip("needs two real GPUs")
    torch.cuda.set_device(0)
    d1 = tf.get_device("CUDA", 1)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 33)).astype(np.float32)
    b = rng.standard_normal((33, 17)).astype(np.float32)
    got = tf.softmax(d1(a) @ d1(b) + 1)
    assert got.device == d1 and got._data.device == torch.device("cuda", 1)
    want = tf.softmax(tf.cpu(a) @ tf.cpu(b) + 1)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    assert torch.cuda.current_device() == 0


def test_read_facts_reads_this_process(monkeypatch):
    f = backend.read_facts()
    assert f.interpreter == backend.interpreter_on()
    if backend.has_module("torch"):
        import torch
        assert f.torch_version == torch.__version__ and f.cuda_version == torch.version.cuda
        assert f.hip_version == getattr(torch.version, "hip", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setenv("TRIFLUX_INTERPRETER_DEVICES", "2")
    real = backend._import
    monkeypatch.setattr(backend, "_import", lambda name: ImportError(f"No module named {name!r}")
                        if name in ("torch", "triton") else real(name))
    f = backend.read_facts()
    assert f.torch_version is None and "No module named 'torch'" in f.torch_error
    assert f.triton_version is None and f.cuda_visible_devices == "1,0" and f.interpreter_devices == "2"
    assert status_from("CUDA", f) == (False, "torch is not installed (install the GPU extra: "
                                             "`pip install triflux[gpu]` (torch and triton))")
