"""Helpers shared by the user-level tests: device parametrisation and
running code in a fresh interpreter (for environment variables, preference
files and import-time behaviour)."""
import os
import subprocess
import sys
import textwrap

import pytest

from triflux import backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpu_param():
    ok, why = backend.status("CUDA")
    marks = () if ok else (pytest.mark.skip(reason=f"no functional CUDA backend: {why}"),)
    return pytest.param("cuda", id="cuda", marks=marks)


#: parametrise a test over the CPU device and the (interpreter- or GPU-served) CUDA device
DEVICES = [pytest.param("cpu", id="cpu"), _gpu_param()]


def device(name):
    import triflux as tf
    return tf.cpu_device() if name == "cpu" else tf.CUDADevice(0)


def run_python(code, env=None, cwd=None, timeout=120, unset=()):
    """Run ``code`` in a fresh Python with the source tree importable; returns
    the CompletedProcess (stdout, stderr, returncode)."""
    e = dict(os.environ)
    for k in unset:
        e.pop(k, None)
    e.update(env or {})
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=e, cwd=cwd or ROOT, timeout=timeout)
