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


def tt(a, device, dtype=None):
    """A contiguous torch tensor on ``device`` holding NumPy array ``a``
    (converted to ``dtype`` first when given; bfloat16 and 0-d included)."""
    import numpy as np
    from triflux import dtypes as tfd
    from triflux.testing import to_torch_layout
    a = np.asarray(a if dtype is None else np.asarray(a).astype(tfd.as_dtype(dtype)))
    if a.ndim == 0:
        return to_torch_layout(a.reshape(1), "contiguous", device).reshape(())
    return to_torch_layout(a, "contiguous", device)


def tn(t):
    """A torch tensor as a NumPy array (bfloat16 included)."""
    from triflux.testing import to_numpy
    return to_numpy(t)


def f64(t):
    """A torch tensor as a float64 NumPy array."""
    import numpy as np
    return tn(t).astype(np.float64)


# --- family tests against torch (pool, upsample) -----------------------------------------------

def rnd(shape, seed):
    """Uniform values in [-3, 3] of ``shape`` (float64), from ``seed``."""
    import numpy as np
    return np.random.default_rng(seed).uniform(-3, 3, shape)


def rel(a, b):
    """Normwise relative difference of ``a`` from ``b`` (NaN positions must agree)."""
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    assert np.array_equal(np.isnan(a), np.isnan(b)), "NaN positions differ"
    ok = ~np.isnan(b)
    return float(np.max(np.abs(a[ok] - b[ok]), initial=0) / max(np.max(np.abs(b[ok]), initial=0), 1e-30))


def call(module, name, direction, *args, **attrs):
    """``module.<name>_<direction>(*args, **attrs)``: a reference or kernel function by name."""
    return getattr(module, f"{name}_{direction}")(*args, **attrs)


def assert_bit_identical(a, b, path="state"):
    """Two nested structures of dicts, lists and NumPy arrays (``state(...)``)
    equal bit for bit, NaN payloads included; the message names the path."""
    import numpy as np
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            assert_bit_identical(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            assert_bit_identical(u, v, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), f"{path} differs (by up to {np.nanmax(np.abs(a - b))})"
    else:
        assert a == b, path


def recorded_primitives(layer, x):
    """Names of the primitives the tape records for ``layer(x)`` (a fused
    layer records one)."""
    from triflux import tape as tapes
    tape = tapes.Tape([x, layer.weight] + ([layer.bias] if layer.bias is not None else []))
    outer, tapes.TAPE = tapes.TAPE, tape
    try:
        layer(x)
    finally:
        tapes.TAPE = outer
    return [prim.name for prim, *_ in tape.nodes]


# --- layers against torch.nn -------------------------------------------------------------------

def compare_layer_with_torch(layer, tlayer, x_np, dev, rtol=1e-4, atol=1e-5):
    """``layer`` on device ``dev`` against torch module ``tlayer`` given its
    weights (in float64): the output's shape, sum(y^2) and its gradients with
    respect to the input, the weight and the bias."""
    import numpy as np
    import torch
    import triflux as tf
    d = device(dev)
    tlayer = tlayer.double()
    if hasattr(layer, "weight"):
        with torch.no_grad():
            tlayer.weight.copy_(torch.from_numpy(layer.weight.numpy().astype(np.float64)))
            if getattr(layer, "bias", None) is not None:
                tlayer.bias.copy_(torch.from_numpy(layer.bias.numpy().astype(np.float64)))
    layer = d(layer)
    x = d(x_np)
    y, (g, gx) = tf.withgradient(lambda m, x: (m(x) * m(x)).sum(), layer, x)
    tx = torch.from_numpy(x_np.astype(np.float64)).requires_grad_()
    ty = tlayer(tx)
    (ty * ty).sum().backward()
    assert layer(x).shape == tuple(ty.shape)
    np.testing.assert_allclose(float(y), float((ty * ty).sum().detach()), rtol=rtol)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)
    if hasattr(layer, "weight"):
        np.testing.assert_allclose(g["weight"].numpy(), tlayer.weight.grad.numpy(), rtol=rtol, atol=atol)
        if g.get("bias") is not None:
            np.testing.assert_allclose(g["bias"].numpy(), tlayer.bias.grad.numpy(), rtol=rtol, atol=atol)
