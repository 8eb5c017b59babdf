"""NumPy, threadpoolctl (the reference's threads) and safetensors (for files)
are the only dependencies of the CPU path: in a virtual environment without
torch, triton or ml_dtypes, `import triflux`, CPU training (dense and
convolutional, whose reference runs on threads), save and load work and
import none of them."""
import os
import subprocess
import sys
import textwrap

import numpy as np

from helpers import ROOT

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import triflux as tf
    from triflux import optimise, losses
    assert not tf.functional("CUDA")
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    y = losses.onehotbatch((x[:, 0] > 0).astype(int), [0, 1])
    m = tf.Chain(tf.Dense(4, 8, tf.relu), tf.Dense(8, 2))
    assert tf.gpu(m) is m                       # no GPU: gpu is a no-op
    opt = optimise.setup(optimise.Adam(0.01), m)
    first = None
    for _ in range(30):
        l, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), m)
        optimise.update(opt, m, g)
        first = float(l) if first is None else first
    assert float(l) < first, (first, float(l))
    images = np.random.default_rng(1).standard_normal((4, 2, 8, 8)).astype(np.float32)
    c = tf.Chain(tf.Conv((3, 3), 2, 4, tf.relu, pad=1), tf.MaxPool((2, 2)), tf.flatten, tf.Dense(64, 2))
    copt = optimise.setup(optimise.Adam(0.01), c)
    for step in range(5):
        cl, (g,) = tf.withgradient(lambda c: losses.logitcrossentropy(c(images), y[:4]), c)
        optimise.update(copt, c, g)
        cfirst = float(cl) if step == 0 else cfirst
    assert float(cl) < cfirst, (cfirst, float(cl))
    tf.save("model.safetensors", {"model": m, "opt": opt})
    back = tf.load("model.safetensors")
    tf.loadmodel(m, back["model"])
    np.testing.assert_array_equal(back["model"]["layers"][0]["weight"], m.layers[0].weight.numpy())
    for mod in ("torch", "triton", "ml_dtypes", "hypothesis"):
        assert mod not in sys.modules, mod + " was imported"
    try:
        tf.bfloat16
    except tf.DTypeError as e:
        assert "ml_dtypes" in str(e)
    try:
        tf.CUDADevice(0)(x)
    except tf.NoGPUError as e:
        assert "torch is not installed" in str(e) and "pip install triflux[gpu]" in str(e)
    print("CPU-ONLY OK", round(first, 3), round(float(l), 3))
""")


def test_cpu_path_needs_only_numpy(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # The venv sees NumPy, threadpoolctl and safetensors (only) and the source tree: link those in.
    deps = tmp_path / "deps"
    deps.mkdir()
    os.symlink(os.path.dirname(np.__file__), deps / "numpy")
    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    if os.path.isdir(libs):
        os.symlink(libs, deps / "numpy.libs")
    import safetensors
    import threadpoolctl
    os.symlink(os.path.dirname(safetensors.__file__), deps / "safetensors")
    os.symlink(threadpoolctl.__file__, deps / "threadpoolctl.py")
    with open(os.path.join(site, "triflux_test.pth"), "w") as f:
        f.write(f"{deps}\n{ROOT}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    r = subprocess.run([str(venv / "bin" / "python"), "-c", SCRIPT], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CPU-ONLY OK" in r.stdout
