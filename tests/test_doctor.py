"""`python -m triflux doctor`: the report's data, its text, and its exit status."""
import dataclasses
import importlib
import json

import numpy as np
import pytest

from triflux import backend
from triflux.workbench import doctor
devices = importlib.import_module("triflux.devices")     # the module; triflux.devices is the function devices()
from triflux.__main__ import main as cli
from helpers import run_python

INTERP = backend.interpreter_on()


@pytest.fixture
def fake(monkeypatch):
    def use(facts, pref=None):
        monkeypatch.setattr(backend, "facts", lambda: facts)
        monkeypatch.setattr(devices, "_preferred_backend", lambda: pref)
        import triflux
        monkeypatch.setattr(triflux, "GPU_BACKEND", pref)
        monkeypatch.setattr(doctor, "read_preference", lambda: pref)
    yield use
    devices._TORCH_DEVICES.clear()


def _backend(r, name):
    return next(b for b in r["backends"] if b["name"] == name)


@pytest.mark.skipif(not INTERP, reason="checks the interpreter's virtual devices")
def test_report_with_two_virtual_devices(fake):
    fake(dataclasses.replace(backend.facts(), interpreter_devices="2"))
    r = doctor.report()
    assert [b["name"] for b in r["backends"]] == ["CUDA", "AMDGPU", "Metal", "CPU"]
    cuda = _backend(r, "CUDA")
    assert cuda["functional"] and "TRITON_INTERPRET=1" in cuda["reason"]
    assert [d["idx"] for d in cuda["devices"]] == [0, 1]
    for d in cuda["devices"]:
        assert d["selftest"]["passed"] and d["selftest"]["max_error"] <= doctor.SELFTEST_TOL
        assert "virtual device" in d["name"]
        m = d["memory"]
        assert m == "unknown" or isinstance(m, str) or m["total"] is None or m["total"] > 0
    amd = _backend(r, "AMDGPU")
    assert not amd["functional"] and "interpreter" in amd["reason"] and amd["devices"] == []
    assert not _backend(r, "Metal")["functional"]
    cpu = _backend(r, "CPU")
    assert cpu["functional"] and cpu["devices"][0]["selftest"]["reference"]
    assert r["preferred"] == "CUDA" and r["preferred_default"] and r["ok"]
    assert r["selected"].startswith("CUDADevice(0)")
    assert r["versions"]["torch"] and r["versions"]["triton"] and r["versions"]["numpy"] == np.__version__
    text = doctor.format_report(r)
    assert text.count("self-test add+matmul+softmax vs CPU reference: PASS") == 2
    assert "CUDADevice(1)" in text and "Preferred backend: CUDA (default, no preference set): OK" in text
    json.dumps(r, default=str)                     # plain data


def test_report_without_triton_fails_with_the_reason(fake, capsys):
    fake(backend.Facts(torch_version="2.5.1+cu124", cuda_version="12.4", cuda_available=True, device_count=1,
                       device_names=("NVIDIA H100",), triton_error="No module named 'triton'"))
    r = doctor.report()
    cuda = _backend(r, "CUDA")
    assert not cuda["functional"] and "triton is not installed" in cuda["reason"]
    assert not r["ok"] and r["selected"] == "CPUDevice()"
    assert doctor.main(["--no-selftest"]) == 1
    out = capsys.readouterr().out
    assert "CUDA    not functional  triton is not installed" in out
    assert "Preferred backend: CUDA (default, no preference set): NOT functional: triton is not installed" in out
    assert "TRITON_INTERPRET=1" in out and 'gpu_backend("CPU")' in out


def test_reasons_for_each_kind_of_machine(fake):
    cases = {
        "torch without CUDA": (backend.Facts(torch_version="2.5.1+cpu", triton_version="3.6.0"), "CPU-only build"),
        "no driver": (backend.Facts(torch_version="2.5.1+cu124", cuda_version="12.4", triton_version="3.6.0"),
                      "no NVIDIA GPU driver or device found"),
        "hidden": (backend.Facts(torch_version="2.5.1+cu124", cuda_version="12.4", triton_version="3.6.0",
                                 cuda_visible_devices="-1"), "CUDA_VISIBLE_DEVICES='-1' hides all GPUs"),
        "no torch": (backend.Facts(torch_error="No module named 'torch'"), "torch is not installed"),
    }
    for what, (facts, reason) in cases.items():
        fake(facts)
        r = doctor.report(run_selftest=False)
        assert reason in _backend(r, "CUDA")["reason"], what
        assert not r["ok"], what


def test_cpu_preference_passes_and_metal_preference_fails(fake):
    facts = backend.Facts(torch_version="2.5.1+cpu", triton_version="3.6.0")
    fake(facts, pref="CPU")
    r = doctor.report(run_selftest=False)
    assert r["preferred"] == "CPU" and not r["preferred_default"] and r["ok"]
    fake(facts, pref="Metal")
    r = doctor.report(run_selftest=False)
    assert not r["ok"] and "Preferred backend: Metal (from the preference): NOT functional: Triton has no Metal" \
        in doctor.format_report(r)


def test_failing_selftest_is_reported_and_fails(fake, monkeypatch, capsys):
    if not backend.functional("CUDA"):
        pytest.skip("needs a functional CUDA backend")
    fake(backend.facts())
    real = doctor._selftest_compute

    def broken(dev, a, b, w):
        outs = real(dev, a, b, w)
        if not dev.is_cpu:
            outs[1] = outs[1] + 0.5                  # a wrong matmul
        return outs
    monkeypatch.setattr(doctor, "_selftest_compute", broken)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "self-test add+matmul+softmax vs CPU reference: FAIL (max error 0.5)" in out
    assert "FAILS its self-test" in out

    def crash(dev, a, b, w):
        if not dev.is_cpu:
            raise RuntimeError("illegal memory access")
        return real(dev, a, b, w)
    monkeypatch.setattr(doctor, "_selftest_compute", crash)
    t = doctor.selftest(devices.CUDADevice(0))
    assert not t["passed"] and t["error"] == "RuntimeError: illegal memory access"


def test_memory_falls_back_to_unknown(monkeypatch):
    def broken(dev):
        raise RuntimeError("no driver")
    monkeypatch.setattr(doctor, "memory_status", broken)       # a memory query never breaks the report
    assert doctor._memory(devices.CPU) == "unknown (RuntimeError: no driver)"
    assert "memory: unknown" in doctor.format_report(
        {**doctor.report(run_selftest=False), "backends": [{"name": "CPU", "functional": True, "reason": "r",
                                                             "devices": [{"device": "CPUDevice()", "idx": None,
                                                                          "name": "host", "physical": None,
                                                                          "memory": "unknown",
                                                                          "selftest": None}]}],
         "preferred": "CPU"})


def test_help_and_bad_arguments(capsys):
    assert cli(["doctor", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m triflux doctor" in out and "Exit status: 0 when the preferred backend" in out
    assert cli(["doctor", "--frobnicate"]) == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err
    assert cli(["--help"]) == 0
    out = capsys.readouterr().out
    assert "doctor" in out and "demo mlp" in out


def test_command_line_without_a_gpu_exits_1(tmp_path):
    r = run_python("import sys; from triflux.__main__ import main; sys.exit(main(['doctor']))", cwd=tmp_path,
                   unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CUDA    not functional  CUDA_VISIBLE_DEVICES='-1' hides all GPUs" in r.stdout
    assert "CPU     functional" in r.stdout and "get_device() selects: CPUDevice()" in r.stdout
    assert "Environment: CUDA_VISIBLE_DEVICES='-1'" in r.stdout


def test_json_with_cpu_preference(fake, capsys):
    fake(backend.Facts(torch_version="2.5.1+cpu", triton_version="3.6.0", cuda_visible_devices="-1"), pref="CPU")
    assert cli(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["preference"]["in_file"] == data["preference"]["active"] == "CPU"
    assert data["preferred"] == "CPU" and data["ok"] and data["selected"] == "CPUDevice()"
    assert [b["functional"] for b in data["backends"]] == [False, False, False, True]


def test_command_line_with_interpreter_devices_and_a_stale_preference(tmp_path):
    (tmp_path / "LocalPreferences.toml").write_text('[triflux]\ngpu_backend = "CUDA"\n')
    r = run_python("""
        import sys, triflux as tf
        from triflux.__main__ import main
        tf.gpu_backend("AMDGPU")              # written now, active only after a restart
        sys.exit(main(['doctor']))
    """, cwd=tmp_path, env={"TRITON_INTERPRET": "1", "TRIFLUX_INTERPRETER_DEVICES": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": PASS (max error") == 2
    assert "the file says 'AMDGPU' but this process started with 'CUDA'" in r.stdout
    assert "Preferred backend: CUDA (from the preference): OK" in r.stdout
