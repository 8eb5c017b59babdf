"""The examples/ scripts run, learn, behave the same on every device and write
under their output folder; the README lists them and cites only what exists."""
import importlib.util
import os
import re
import shutil
import subprocess

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


def test_rnn_sine_writes_under_its_output_folder_and_says_where(tmp_path, capsys):
    ex = _load("rnn_sine")
    assert ex.OUTPUT == os.path.join(ROOT, "examples", "output")
    if shutil.which("git") and os.path.isdir(os.path.join(ROOT, ".git")):
        ignored = subprocess.run(["git", "check-ignore", "-q", "examples/output/rnn_sine.png"], cwd=ROOT)
        assert ignored.returncode == 0, "git does not ignore examples/output/"
    out = tmp_path / "new" / "folder"
    assert ex.main(["--device", "cpu", "--epochs", "2", "--out", str(out)]) == 0
    path = out / "rnn_sine.png"
    assert f"wrote {path}" in capsys.readouterr().out and path.read_bytes()[:4] == b"\x89PNG"


#: paths the README names that a run creates (the environment, the examples' and the demo's output)
MADE_BY_RUNS = (".venv/", "examples/output/", "runs/")


def test_readme_lists_every_example_and_cites_only_what_exists():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = text.split("| example | what it shows |", 1)[1].split("\n\n", 1)[0]
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if name.endswith(".py"):
            assert f"examples/{name}" in table, f"the README's examples table misses examples/{name}"
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    paths = {p for s in spans for p in re.findall(r"(?<![\w:/.])\.?[\w.-]+(?:/[\w.*-]*)+", s)}
    assert "triflux/registry.py" in paths
    missing = [p for p in paths if not p.startswith(MADE_BY_RUNS) and not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"the README cites paths that are not in the repository: {missing}"
    makefile = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    for target in {s.split()[1] for s in spans if s.startswith("make ")}:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no `make {target}`"
    sections = set(re.findall(r"^#+ (.+)$", text, re.M))
    for name in ["README.md"] + [f"examples/{n}" for n in os.listdir(os.path.join(ROOT, "examples"))]:
        words = " ".join(open(os.path.join(ROOT, name), encoding="utf-8").read().split())
        for cited in re.findall(r'section "([^"]+)"|"([^"]+)" below', words):
            assert "".join(cited) in sections, f"{name} cites a README section that does not exist: {cited}"
