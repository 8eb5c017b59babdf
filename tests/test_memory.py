"""memory_status, reclaim, and out-of-memory errors: the error says what was
asked and what is free, and a training step that runs out of memory changes
nothing, so training goes on with a smaller batch."""
import numpy as np
import pytest

import triflux as tf
from triflux import losses, optimise
from triflux.errors import OutOfMemoryError
from triflux.memory import MemoryStatus

from helpers import assert_bit_identical

needs_cuda = pytest.mark.skipif(not tf.functional("CUDA"), reason="no functional CUDA backend")


def _kernels_launch():
    from triflux.triton_kernels import launch
    return launch


def test_memory_status_cpu_fields_and_str():
    st = tf.memory_status("cpu")
    assert isinstance(st, MemoryStatus) and st.device == tf.cpu_device()
    assert st.total is not None and st.free is not None and 0 < st.free <= st.total
    assert st.allocated is not None and 0 < st.allocated < st.total     # this process's resident memory
    assert st.reserved is None
    s = str(st)
    assert "CPUDevice()" in s and "allocated" in s and "free of" in s and "iB" in s
    assert tf.memory_status(tf.cpu_device()) .total == st.total


def test_memory_status_default_device_and_reclaim():
    st = tf.memory_status()
    assert st.device == tf.gpu_device()
    tf.reclaim()                                   # safe anywhere
    assert tf.memory_status(st.device).total == st.total


@needs_cuda
def test_memory_status_cuda_device():
    dev = tf.CUDADevice(0)
    st = tf.memory_status(dev)
    assert st.device == dev and st.total and st.free is not None and st.free <= st.total
    if dev.torch_device.type == "cuda":            # a real GPU: torch's allocator numbers
        before = st.allocated
        x = tf.zeros(1024, 1024, device=dev)
        assert x.size and tf.memory_status(dev).allocated >= before + 4 * 1024 * 1024
        del x
        tf.reclaim()
        assert st.reserved is not None and st.reserved >= st.allocated
    else:                                          # the interpreter: host memory, documented
        host = tf.memory_status("cpu")
        assert st.reserved is None and st.total == host.total and st.allocated > 0
        assert "Triton interpreter" in str(st)


class _FailingTorch:
    """``torch`` for triton_kernels.common, whose ``empty`` raises CUDA's
    out-of-memory error at the ``fail_at``-th call (1-based); counts calls."""

    def __init__(self, torch, fail_at=None, error=None):
        self._torch, self.fail_at, self.calls = torch, fail_at, 0
        self.error = error or (lambda: torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB"))

    def empty(self, *a, **k):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise self.error()
        return self._torch.empty(*a, **k)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _fail_allocations(monkeypatch, fail_at=None, error=None):
    kl = _kernels_launch()
    fake = _FailingTorch(kl.torch, fail_at, error)
    monkeypatch.setattr(kl, "torch", fake)
    return fake


@needs_cuda
@pytest.mark.parametrize("error", ["torch", "runtime"])
def test_allocation_failure_becomes_outofmemoryerror(monkeypatch, error):
    import torch
    make = (lambda: torch.OutOfMemoryError("CUDA out of memory.")) if error == "torch" else \
        (lambda: RuntimeError("HIP error: out of memory"))
    _fail_allocations(monkeypatch, 1, make)
    with pytest.raises(OutOfMemoryError) as e:
        tf.zeros(1000, 300, device=tf.CUDADevice(0))
    msg = str(e.value)
    assert "1200000 bytes" in msg and "(1000, 300) float32" in msg          # what was asked
    assert "free of" in msg and "bytes) are free" in msg                    # what there is
    for advice in ("smaller batch", "reclaim()", "float16", "bfloat16"):
        assert advice in msg
    on_host = tf.CUDADevice(0).torch_device.type == "cpu"      # the interpreter's device memory is the host's
    assert ("`free -h`" in msg and "nvidia-smi" not in msg) if on_host else "nvidia-smi" in msg
    assert e.value.asked == 1_200_000 and e.value.free is not None and e.value.total is not None
    assert isinstance(e.value, MemoryError)


def test_other_allocation_errors_pass_through(monkeypatch):
    _fail_allocations(monkeypatch, 1, lambda: RuntimeError("some other failure"))
    with pytest.raises(RuntimeError, match="some other failure"):
        _kernels_launch().empty((2,), _kernels_launch().torch.float32, "cpu")


def test_launch_out_of_memory_and_other_errors():
    kl = _kernels_launch()

    class Kernel:
        def __init__(self, exc):
            self.exc = exc

        def __getitem__(self, grid):
            def run(*args, **meta):
                raise self.exc
            return run

    with pytest.raises(OutOfMemoryError, match="out of memory.*smaller batch"):
        kl.launch(Kernel(RuntimeError("CUDA error: out of memory")), (1,), 1, 2)
    with pytest.raises(ValueError, match="unrelated"):
        kl.launch(Kernel(ValueError("unrelated")), (1,))


def test_launch_runs_on_the_gpu_of_its_tensors(monkeypatch):
    """With several GPUs, a kernel launches under its first tensor's device."""
    kl = _kernels_launch()
    seen = []

    class FakeCuda:
        @staticmethod
        def current_device():
            return 0

        class device:
            def __init__(self, idx):
                self.idx = idx

            def __enter__(self):
                seen.append(("enter", self.idx))

            def __exit__(self, *exc):
                seen.append(("exit", self.idx))

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append(("run", grid)) or "ran"

    class Torch:
        Tensor = kl.torch.Tensor
        cuda = FakeCuda

    monkeypatch.setattr(kl, "torch", Torch)
    monkeypatch.setattr(kl, "_MULTI_GPU", True)
    monkeypatch.setattr(kl, "_gpu_index", lambda args: 1)
    assert kl.launch(Kernel(), (3,), "x") == "ran"
    assert seen == [("enter", 1), ("run", (3,)), ("exit", 1)]
    seen.clear()
    monkeypatch.setattr(kl, "_gpu_index", lambda args: 0)      # already current: no switch
    kl.launch(Kernel(), (2,))
    assert seen == [("run", (2,))]


def test_gpu_index_of_first_tensor():
    import torch
    kl = _kernels_launch()
    assert kl._gpu_index((1, torch.empty(2), torch.empty(3, device="meta"))) is None
    assert kl._gpu_index((1, 2.0)) is None
    assert kl._gpu_index((torch.empty(0, device="meta"),)) is None


# --- a training step that runs out of memory changes nothing ---------------------------------

def _problem(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    labels = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, losses.onehotbatch(labels, range(3))


def _model(dev):
    tf.seed(3)
    return dev(tf.Chain(tf.Dense(5, 7, tf.relu), tf.Dense(7, 3)))


def _step(model, opt, x, y):
    loss, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), model)
    optimise.update(opt, model, g)
    return float(loss)


def _snapshot(model, opt):
    return tf.state(model), tf.state(opt)


@needs_cuda
def test_out_of_memory_in_a_training_step_changes_nothing_and_training_goes_on(monkeypatch):
    dev = tf.CUDADevice(0)
    x, y = _problem()
    xd, yd = dev(x), dev(y)
    halves = [(dev(x[:4]), dev(y[:4])), (dev(x[4:]), dev(y[4:]))]

    # the run that never fails: the two half batches
    model = _model(dev)
    opt = optimise.setup(optimise.Adam(0.05), model)
    for xb, yb in halves:
        _step(model, opt, xb, yb)
    expected = _snapshot(model, opt)

    # count the allocations of one full step (on a scratch copy)
    probe = _fail_allocations(monkeypatch)            # counts, fails nowhere yet
    scratch = _model(dev)
    scratch_opt = optimise.setup(optimise.Adam(0.05), scratch)
    probe.calls = 0
    _step(scratch, scratch_opt, xd, yd)
    total = probe.calls
    assert total > 5

    model = _model(dev)
    opt = optimise.setup(optimise.Adam(0.05), model)
    before = _snapshot(model, opt)
    # fail at the first, a middle and the last allocation of the step
    for fail_at in sorted({1, total // 3, total // 2, (2 * total) // 3, total}):
        probe.fail_at, probe.calls = fail_at, 0
        with pytest.raises(OutOfMemoryError) as e:
            _step(model, opt, xd, yd)
        assert "smaller batch" in str(e.value)
        assert_bit_identical(before, _snapshot(model, opt))
    probe.fail_at = None

    # go on with a smaller batch: the same result as the run that never failed
    for xb, yb in halves:
        _step(model, opt, xb, yb)
    assert_bit_identical(expected, _snapshot(model, opt))


@needs_cuda
def test_out_of_memory_inside_update_leaves_every_parameter(monkeypatch):
    """Gradients of another dtype are converted (allocating) in ``update``:
    running out of memory there must not leave some parameters updated."""
    dev = tf.CUDADevice(0)
    model = _model(dev)
    opt = optimise.setup(optimise.Momentum(0.1), model)
    grads = {"layers": [{"weight": dev(np.ones(layer.weight.shape)), "bias": dev(np.ones(layer.bias.shape))}
                        for layer in model]}
    assert grads["layers"][0]["weight"].dtype == np.float64
    before = _snapshot(model, opt)
    probe = _fail_allocations(monkeypatch, 2)          # the second gradient conversion fails
    with pytest.raises(OutOfMemoryError):
        optimise.update(opt, model, grads)
    assert probe.calls == 2
    assert_bit_identical(before, _snapshot(model, opt))
