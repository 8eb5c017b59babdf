"""PyTorch's OpInfo sample inputs through triflux's public API, on both devices
(an outside suite finds the classes of input our strategies miss).

For every translated operator (tests/torch_samples.py), dtype and device:
the forward and the gradients of ``sum(f(x) * G)`` for a random ``G``,
computed by triflux in the dtype, are compared with torch's in float64 on
the same (rounded) values, with the tolerance table of tests/tolerances.py
(torch's own error in the dtype as the ratio reference). Every failing
sample is listed, not just the first; unsupported samples are counted and
must stay a minority.
"""
import importlib.util
import os

import numpy as np
import pytest

import tolerances as tol
import triflux as tf
from helpers import DEVICES, device
from triflux import dtypes as tfd

pytestmark = pytest.mark.skipif(importlib.util.find_spec("expecttest") is None or
                                importlib.util.find_spec("torch") is None,
                                reason="PyTorch's OpInfo samples need torch and expecttest")

DTYPES = ("float32", "float64", "float16", "bfloat16")
#: TRIFLUX_TORCH_SAMPLES=full: every sample, every dtype on both devices (long in the
#: interpreter). By default, samples per (operator, dtype, device) are evenly spread over
#: torch's list (max_pool2d has 1,440), and the interpreter's CUDA device, whose kernels
#: run slowly, takes float32 and bfloat16 (the harness covers the kernels in every dtype)
FULL = os.environ.get("TRIFLUX_TORCH_SAMPLES", "") == "full"
MAX_SAMPLES = {"cpu": 48, "cuda": 8}
KERNEL_DTYPES = DTYPES if FULL else ("float32", "bfloat16")


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return {(o.name, o.variant_test_name): o for o in op_db}


def _translations():
    import torch_samples
    return torch_samples


def _params():
    import torch_samples
    return [pytest.param(name, variant, dt, dev.values[0],
                         id=f"{name}{'-' + variant if variant else ''}-{dt}-{dev.id}", marks=dev.marks)
            for (name, variant) in torch_samples.TRANSLATIONS for dev in DEVICES
            for dt in (DTYPES if dev.values[0] == "cpu" else KERNEL_DTYPES)]


def _map(x, fn):
    import torch
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _leaves(sample):
    import torch
    out = []
    _map((sample.input, sample.args, sample.kwargs), lambda t: out.append(t) or t)
    return [t for t in out if isinstance(t, torch.Tensor)]


def _np(t):
    from triflux.testing import to_numpy
    import torch
    t = t.detach()
    if t.layout != torch.strided:              # a sparse gradient (embedding's sparse=True): its dense values
        t = t.to_dense()
    return to_numpy(t)


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _run_torch(op, sample, arrays, float_idx, g):
    """torch's forward and gradients on the given NumPy leaves (in their dtype)."""
    import torch
    from triflux.testing import to_torch_layout
    ts = [to_torch_layout(a.reshape(1), "contiguous").reshape(()) if a.ndim == 0 else to_torch_layout(a, "contiguous")
          for a in arrays]
    for i in float_idx:
        ts[i] = ts[i].detach().requires_grad_(True)
    it = iter(ts)
    inp, args, kwargs = _map((sample.input, sample.args, sample.kwargs), lambda _: next(it))
    y = _first(op.op(inp, *args, **kwargs))
    grads = {}
    diff = [i for i in float_idx if ts[i].requires_grad]
    if diff and y.requires_grad and y.numel():
        gt = to_torch_layout(g, "contiguous") if g.ndim else torch.tensor(g, dtype=y.dtype)
        res = torch.autograd.grad(y, [ts[i] for i in diff], grad_outputs=gt.to(y.dtype), allow_unused=True)
        grads = {i: (np.zeros(arrays[i].shape) if r is None else _np(r)) for i, r in zip(diff, res)}
    return _np(y), grads


def _run_triflux(fn, sample, arrays, float_idx, g, dev):
    it = iter([dev(a) if a.ndim else tf.tensor(a, device=dev) for a in arrays])
    inp, args, kwargs = _map((sample.input, sample.args, sample.kwargs), lambda _: next(it))
    tensors = list(_flat((inp, args, kwargs)))
    y = fn(inp, *args, **kwargs)
    grads = {}
    if float_idx and y.size and tfd.is_floating(y.dtype):
        G = dev(g.astype(tfd.as_dtype(y.dtype))) if g.ndim else tf.tensor(g, dtype=y.dtype, device=dev)

        def loss(*ts):
            it2 = iter(ts)
            sub = {id(tensors[i]): next(it2) for i in float_idx}
            a2, r2, k2 = _rebuild((inp, args, kwargs), sub)
            return (fn(a2, *r2, **k2) * G).sum()
        res = tf.gradient(loss, *[tensors[i] for i in float_idx])
        grads = {i: (None if r is None else r.numpy()) for i, r in zip(float_idx, res)}
    return y.numpy(), grads


def _flat(x):
    if isinstance(x, tf.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _flat(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flat(v)


def _rebuild(x, sub):
    if isinstance(x, tf.Tensor):
        return sub.get(id(x), x)
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuild(v, sub) for v in x)
    if isinstance(x, dict):
        return {k: _rebuild(v, sub) for k, v in x.items()}
    return x


@pytest.mark.parametrize("name,variant,dtype,dev", _params())
def test_torch_sample_inputs(name, variant, dtype, dev):
    import torch
    import torch_samples
    op = _op_db().get((name, variant))
    if op is None:
        pytest.skip(f"this torch has no OpInfo {name!r} ({variant!r})")
    fn = torch_samples.TRANSLATIONS[(name, variant)]
    d = device(dev)
    tdt = tfd.to_torch(tfd.as_dtype(dtype))
    if tdt not in op.supported_dtypes("cpu"):
        pytest.skip(f"torch's {name} does not support {dtype} on the CPU")
    samples = list(op.sample_inputs("cpu", tdt, requires_grad=False))
    if not FULL:
        cap = MAX_SAMPLES[dev]
        samples = samples[:: max(1, len(samples) // cap)][:cap]
    rng = np.random.default_rng(0)
    failures, ran, unsupported = [], 0, []
    for k, sample in enumerate(samples):
        leaves = _leaves(sample)
        arrays = [_np(t) for t in leaves]
        float_idx = [i for i, a in enumerate(arrays) if tfd.is_floating(a.dtype)
                     and i not in torch_samples.NO_GRAD.get((name, variant), ())]
        what = (f"{name}{'/' + variant if variant else ''} [{dtype}, {dev}] sample {k}: "
                f"{[a.shape for a in arrays]} args {[a for a in sample.args if not isinstance(a, torch.Tensor)]} "
                f"kwargs {sample.kwargs}")
        floating = [i for i, a in enumerate(arrays) if tfd.is_floating(a.dtype)]
        try:
            y64, _ = _run_torch(op, sample, [a.astype(np.float64) if i in floating else a
                                             for i, a in enumerate(arrays)], [], None)
        except Exception:
            continue          # torch itself refuses the sample in float64 (an error-input sample)
        # the output gradient, rounded to the dtype under test (every side uses the same values)
        g = rng.standard_normal(y64.shape)
        if floating:
            g = g.astype(arrays[floating[0]].dtype).astype(np.float64)
        try:
            y_low, g_low = _run_torch(op, sample, arrays, float_idx, g.astype(arrays[floating[0]].dtype)
                                      if floating else g)
        except Exception:
            y_low, g_low = None, {}
        try:
            _, g64 = _run_torch(op, sample, [a.astype(np.float64) if i in floating else a
                                             for i, a in enumerate(arrays)], float_idx, g)
        except RuntimeError as e:
            # torch has no backward for a few samples (embedding: scale_grad_by_freq with sparse=True);
            # any other refusal is a failure of the harness, not a pass
            if not (sample.kwargs.get("sparse") and sample.kwargs.get("scale_grad_by_freq")):
                raise
            g64 = {}
        try:
            y, grads = _run_triflux(fn, sample, arrays, float_idx, g, d)
        except torch_samples.Unsupported as e:
            unsupported.append(f"{what}: {e}")
            continue
        except Exception as e:
            failures.append(f"{what}: triflux raised {type(e).__name__}: {e}")
            continue
        ran += 1
        out_dtype = tol.coarsest(dtype) if tfd.is_floating(np.asarray(y).dtype) else None
        # float64: two independent float64 implementations, as the reference-vs-torch checks
        rtol = tol.TORCH_F64_RTOL if dtype == "float64" else None
        # gradients that cancel by design: floors from the size of their terms (torch_samples.FLOAT64_FLOORS)
        floors_of = torch_samples.FLOAT64_FLOORS.get((name, variant)) if dtype == "float64" else None
        floors = floors_of(sample, arrays, g) if floors_of else None
        try:
            tol.assert_close(y, y64, out_dtype or dtype, what=f"{what}: forward", ratio_reference=y_low, rtol=rtol,
                             k=max([1] + [a.size for a in arrays]))
            for i, gi in grads.items():
                if i not in g64:
                    continue
                assert gi is not None, f"{what}: no gradient for input {i}"
                tol.assert_close(gi, g64[i], dtype, what=f"{what}: gradient of input {i}",
                                 ratio_reference=g_low.get(i), rtol=rtol, k=max([1] + [a.size for a in arrays] + [g.size]),
                                 scale=floors.get(i) if floors else None)
        except AssertionError as e:
            failures.append(str(e).split("\n")[0])
    assert not failures, f"{len(failures)} of {ran + len(failures)} samples fail:\n" + "\n".join(failures[:20])
    assert ran > 0 or not samples, \
        f"no sample ran, {len(unsupported)} unsupported:\n" + "\n".join(unsupported[:10])
