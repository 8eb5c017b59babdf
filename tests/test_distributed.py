"""triflux.distributed with real worker processes (2 workers, each run under
a timeout): every collective on the Gloo backend (and MPI when mpi4py and
mpiexec are installed), data-parallel training against single-process
training, a dead worker, a mismatched model; plus the backend selection
logic in this process."""
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from triflux import distributed as dist
from triflux.distributed import backends as B
from triflux.distributed.data import shard_range
from triflux.errors import DistributedError, TrifluxError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_GPU = os.environ.get("TRIFLUX_TEST_REAL_GPU", "") == "1"
TIMEOUT = 40          # seconds for one launch of 2 workers (they normally take a few)

# --- the worker programs -------------------------------------------------------------------------------

PRELUDE = """
import json, os, sys, time
import numpy as np
import triflux as tf
from triflux import distributed as dist
from triflux.errors import DistributedError
KIND = {"gloo": dist.GlooBackend, "mpi": dist.MPIBackend}[os.environ["TEST_KIND"]]
backend = dist.initialize(KIND, timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
rank, n = dist.local_rank(backend), dist.total_workers(backend)
out = {"rank": rank, "n": n}
def emit():
    with open(os.path.join(os.environ["TEST_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
"""

MAIN = PRELUDE + """
cuda = tf.CUDADevice(0)
v = np.array([1.0, -2.0, 3.0], np.float32) * (rank + 1)      # rank 0: v0, rank 1: 2*v0
for op in ("sum", "avg", "max", "min"):
    a = v.copy()
    r = dist.allreduce(backend, a, op)
    out[f"np_{op}"] = [r.tolist(), r is a]
    t = tf.tensor(v)
    out[f"cpu_{op}"] = [dist.allreduce(backend, t, op).tolist(), t.tolist()]
    g = tf.tensor(v, device=cuda)
    rg = dist.allreduce(backend, g, op)
    out[f"cuda_{op}"] = [rg.tolist(), rg is g, repr(rg.device)]
    # transposed (non-contiguous) arrays and a float64 one
    m = (np.arange(6.0).reshape(2, 3) * (rank + 1)).T
    out[f"strided_{op}"] = dist.allreduce(backend, m, op).tolist()
    out[f"bf16_{op}"] = dist.allreduce(backend, tf.tensor(v).astype(tf.bfloat16), op).astype(tf.float32).tolist()
nested = {"a": (np.full(2, rank + 1.0), [tf.tensor([rank * 10.0])]), "b": 3 + rank, "c": "text",
          "d": tf.tensor(np.full((2, 2), float(rank)), device=cuda)}
r = dist.allreduce(backend, nested, "sum")
out["nested"] = [r["a"][0].tolist(), r["a"][1][0].tolist(), r["b"], r["c"], r["d"].tolist()]
out["int_sum"] = dist.allreduce(backend, np.array([rank + 1, 5], np.int64), "sum").tolist()
try:
    dist.allreduce(backend, np.array([1, 2]), "avg")
except tf.DTypeError as e:
    out["int_avg_error"] = str(e)
for root in (0, 1):
    b = np.full(3, float(rank + 5))
    out[f"bcast_np_{root}"] = dist.bcast(backend, b, root=root).tolist()
    out[f"bcast_cuda_{root}"] = dist.bcast(backend, tf.tensor(b, device=cuda), root=root).tolist()
    out[f"bcast_nested_{root}"] = dist.bcast(backend, [float(rank), (np.array([rank]),)], root=root)[0]
    for op in ("sum", "avg", "max"):
        a = np.array([rank + 1.0, 10.0 * (rank + 1)])
        out[f"reduce_{op}_{root}"] = dist.reduce(backend, a, op, root=root).tolist()
        c = tf.tensor([rank + 1.0, 10.0 * (rank + 1)], device=cuda)
        out[f"reduce_cuda_{op}_{root}"] = dist.reduce(backend, c, op, root=root).tolist()
# a mismatched model is detected by synchronize on every rank
tf.seed(rank)
bad = tf.Chain(tf.Dense(4, 8 + rank, tf.tanh), tf.Dense(8 + rank, 1))
try:
    dist.synchronize(backend, dist.FluxDistributedModel(bad))
    out["mismatch"] = None
except DistributedError as e:
    out["mismatch"] = str(e)
# MPI's non-blocking mode (catchable timeouts) gives the same results
if os.environ["TEST_KIND"] == "mpi":
    nb = dist.MPIBackend(rank, n, rank, 5, nonblocking=True)
    out["nonblocking"] = [dist.allreduce(nb, np.array([rank + 1.0]), op).tolist() for op in ("sum", "avg", "max")]
    out["nonblocking"].append(dist.bcast(nb, np.array([rank + 7]), root=1).tolist())
# NCCL cannot run without CUDA GPUs: a clear error
try:
    dist.initialize(dist.NCCLBackend, timeout=5)
    out["nccl"] = None
except DistributedError as e:
    out["nccl"] = str(e)

import copy
from triflux import losses
def build(seed):
    tf.seed(seed)
    return tf.Chain(tf.Dense(4, 8, tf.tanh), tf.Dense(8, 2))
rng = np.random.default_rng(0)
X = rng.standard_normal((8, 4)).astype(np.float32)      # the combined batch: 8 observations
Y = rng.standard_normal((8, 2)).astype(np.float32)
loss = lambda m, x, y: losses.mse(m(tf.tensor(x)), tf.tensor(y))
def params(m):
    return [p.numpy() for p in tf.functor.leaves(m)]

# single-process training on the combined batch, from rank 0's initial model
ref = build(100)
ref_state = tf.setup(tf.Momentum(0.1, 0.9), ref)
# data-parallel: each rank starts from its own random model; synchronize makes it rank 0's
model = dist.synchronize(backend, dist.FluxDistributedModel(build(100 + rank)))
out["synced"] = max(float(np.abs(a - b).max()) for a, b in zip(params(model), params(ref)))
opt = dist.DistributedOptimizer(backend, tf.Momentum(0.1, 0.9))
state = dist.synchronize(backend, tf.setup(opt, model))
shard = dist.DistributedDataContainer(backend, (X, Y))
out["shard"] = [shard.indices.start, shard.indices.stop, len(shard)]
for step in range(6):
    l_ref, (g_ref,) = tf.withgradient(lambda m: loss(m, X, Y), ref)
    tf.update(ref_state, ref, g_ref)
    losses_dp = tf.train(loss, model, shard.loader(batchsize=len(shard)), state)
out["loss"] = losses_dp[-1]
out["maxdiff"] = max(float(np.abs(a - b).max()) for a, b in zip(params(model), params(ref)))
# Adam's step count (a Python number in the state) is synchronized too
st = tf.setup(dist.DistributedOptimizer(backend, tf.Adam()), build(rank))
st["layers"][0]["weight"].state = st["layers"][0]["weight"].state[:2] + (7 + rank,)
st = dist.synchronize(backend, st)
out["adam_t"] = st["layers"][0]["weight"].state[2]

# Flux's DistributedUtils example in Flux's spelling: a DataLoader over a DistributedDataContainer
# (shuffled per worker), DistributedOptimizer(Adam), against one process on the combined batches
rng = np.random.default_rng(1)
x = rng.random((16, 1)).astype(np.float32)
y = x ** 3
def seed_model(seed):
    tf.seed(seed)
    return tf.Chain(tf.Dense(1, 16, tf.tanh), tf.Dense(16, 1))
ref = seed_model(200)
ref_state = tf.setup(tf.Adam(0.01), ref)
model = dist.synchronize(backend, dist.FluxDistributedModel(seed_model(200 + rank)), root=0)
state = dist.synchronize(backend, tf.setup(dist.DistributedOptimizer(backend, tf.Adam(0.01)), model), root=0)
data = dist.DistributedDataContainer(backend, (x, y, np.arange(16)))
out["ddc"] = [repr(data), len(data)]
loader = tf.DataLoader(data, batchsize=4, shuffle=True, rng=rank)
seen, gaps = [], []
for epoch in range(2):
    for xb, yb, ids in loader:
        local, (g,) = tf.withgradient(lambda m: losses.mse(m(xb), yb), model)
        tf.update(state, model, g)
        seen.append(ids.tolist())
        every = np.zeros((n, len(ids)), np.int64)          # every worker's batch, for the reference
        every[rank] = ids
        every = dist.allreduce(backend, every, "sum").ravel()
        l_ref, (g_ref,) = tf.withgradient(lambda m: losses.mse(m(x[every]), y[every]), ref)
        tf.update(ref_state, ref, g_ref)
        l_all = dist.allreduce(backend, np.array([float(local.item())]), "avg")[0]
        gaps.append(abs(l_all - float(l_ref.item())))
out["ddc_seen"] = seen
out["ddc_loss_gap"] = max(gaps)
out["ddc_maxdiff"] = max(float(np.abs(a - b).max()) for a, b in zip(params(model), params(ref)))
emit()
"""

DEAD = PRELUDE + """
if rank == 1:
    os._exit(3)          # a worker that dies without a word
t0 = time.monotonic()
try:
    for i in range(1000):
        dist.allreduce(backend, np.ones(1000, np.float32), "sum")
    out["error"] = None
except DistributedError as e:
    out["error"] = str(e)
out["elapsed"] = time.monotonic() - t0
emit()
"""

STUCK = PRELUDE + """
if rank == 1:            # alive but never joins the collective: stays until rank 0 has given up
    t0 = time.monotonic()
    while not os.path.exists(os.path.join(os.environ["TEST_OUT"], "rank0.json")) and time.monotonic() - t0 < 20:
        time.sleep(0.05)
    os._exit(0)
t0 = time.monotonic()
try:
    dist.allreduce(backend, np.ones(10, np.float32), "sum")
    out["error"] = None
except DistributedError as e:
    out["error"] = str(e)
out["elapsed"] = time.monotonic() - t0
emit()
"""


# --- launching ---------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    if not REAL_GPU:                 # the workers' CUDA device: the interpreter, or the real GPU
        e.setdefault("TRITON_INTERPRET", "1")
    e.update(extra)
    return e


def _results(folder):
    res = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            d = json.load(f)
        res[d["rank"]] = d
    shutil.rmtree(folder, ignore_errors=True)
    return res


def launch_torchrun_style(code, n=2, timeout=TIMEOUT, worker_timeout=20, argv=None):
    """Start ``n`` workers with torchrun's environment variables set by hand;
    ``(returncodes, [stdout+stderr per rank], [result dict per rank])``."""
    port = str(_free_port())
    folder = tempfile.mkdtemp(prefix="triflux-dist-")
    procs = []
    for r in range(n):
        env = _env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r), "WORLD_SIZE": str(n),
                    "LOCAL_RANK": str(r), "TEST_KIND": "gloo", "TEST_TIMEOUT": str(worker_timeout),
                    "TEST_OUT": folder})
        cmd = [sys.executable] + (list(argv) if argv else ["-c", code])
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT))
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        texts = [p.communicate()[0] for p in procs]
        pytest.fail(f"the workers did not finish within {timeout} s (a hang):\n" + "\n---\n".join(texts))
    return [p.returncode for p in procs], outs, _results(folder)


MPIEXEC = shutil.which("mpiexec")


def _mpi_available():
    if MPIEXEC is None:
        return "mpiexec is not installed (apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


def launch_mpiexec(code, n=2, timeout=TIMEOUT, worker_timeout=20, argv=None):
    cmd = [MPIEXEC, "-n", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--oversubscribe", "--bind-to", "none", sys.executable] + (list(argv) if argv else ["-c", code])
    folder = tempfile.mkdtemp(prefix="triflux-dist-")
    env = _env({"TEST_KIND": "mpi", "TEST_TIMEOUT": str(worker_timeout), "OMPI_MCA_btl": "self,tcp", "TEST_OUT": folder,
                "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec did not finish within {timeout} s (a hang): {e.stdout} {e.stderr}")
    return p.returncode, p.stdout + p.stderr, _results(folder)


LAUNCHERS = ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(_mpi_available() is not None,
                                                                   reason=str(_mpi_available())))]


def _run(kind, code, **kw):
    if kind == "gloo":
        rcs, outs, res = launch_torchrun_style(code, **kw)
        return rcs, "\n---\n".join(outs), res
    rc, text, res = launch_mpiexec(code, **kw)
    return [rc], text, res


_CACHE = {}


def _ok(kind, what, code):
    key = (kind, what)
    if key not in _CACHE:
        _CACHE[key] = _run(kind, code)
    rcs, text, res = _CACHE[key]
    assert all(rc == 0 for rc in rcs) and sorted(res) == [0, 1], f"the workers failed ({rcs}):\n{text}"
    return res


# --- collectives -----------------------------------------------------------------------------------------

V = np.array([1.0, -2.0, 3.0])
EXPECT = {"sum": 3 * V, "avg": 1.5 * V, "max": np.maximum(V, 2 * V), "min": np.minimum(V, 2 * V)}


@pytest.mark.parametrize("kind", LAUNCHERS)
def test_allreduce_every_op_every_leaf(kind):
    res = _ok(kind, "main", MAIN)
    M = np.arange(6.0).reshape(2, 3).T
    for r in (0, 1):
        d = res[r]
        for op, want in EXPECT.items():
            got, same = d[f"np_{op}"]
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op} on NumPy, rank {r}")
            assert same, "a writable NumPy array is reduced in place"
            got, after = d[f"cpu_{op}"]
            np.testing.assert_allclose(got, want, rtol=1e-6)
            np.testing.assert_allclose(after, want, rtol=1e-6)   # the CPU Tensor changed in place
            got, same, dev = d[f"cuda_{op}"]
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op} on the CUDA device, rank {r}")
            assert same and dev.startswith("CUDADevice(0)")
            mw = {"sum": 3 * M, "avg": 1.5 * M, "max": 2 * M, "min": M}[op]
            np.testing.assert_allclose(d[f"strided_{op}"], mw, rtol=1e-12)
            np.testing.assert_allclose(d[f"bf16_{op}"], want, rtol=1e-2)
        assert d["int_sum"] == [3, 10]
        if kind == "mpi":
            assert d["nonblocking"] == [[3.0], [1.5], [2.0], [8]]
        assert "avg" in d["int_avg_error"] and "floating" in d["int_avg_error"]


@pytest.mark.parametrize("kind", LAUNCHERS)
def test_allreduce_nested_structures(kind):
    res = _ok(kind, "main", MAIN)
    for r in (0, 1):
        a0, a1, b, c, dd = res[r]["nested"]
        assert a0 == [3.0, 3.0] and a1 == [10.0] and b == 7 and c == "text"
        assert dd == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("kind", LAUNCHERS)
def test_bcast_and_reduce(kind):
    res = _ok(kind, "main", MAIN)
    for root in (0, 1):
        for r in (0, 1):
            d = res[r]
            assert d[f"bcast_np_{root}"] == [root + 5.0] * 3
            assert d[f"bcast_cuda_{root}"] == [root + 5.0] * 3
            assert d[f"bcast_nested_{root}"] == float(root)
            mine = [r + 1.0, 10.0 * (r + 1)]
            for op, want in (("sum", [3.0, 30.0]), ("avg", [1.5, 15.0]), ("max", [2.0, 20.0])):
                expect = want if r == root else mine     # non-roots keep their values
                assert d[f"reduce_{op}_{root}"] == expect, (op, root, r)
                assert d[f"reduce_cuda_{op}_{root}"] == expect, (op, root, r)


@pytest.mark.parametrize("kind", LAUNCHERS)
def test_synchronize_detects_a_mismatched_model_on_every_rank(kind):
    res = _ok(kind, "main", MAIN)
    for r in (0, 1):
        msg = res[r]["mismatch"]
        assert msg is not None, f"rank {r} did not notice the mismatch"
        assert "rank 1" in msg and "rank 0" in msg and "layers[0].weight" in msg, msg
        assert "(8, 4)" in msg or "(4, 8)" in msg, msg
        assert "same model" in msg


@pytest.mark.skipif(REAL_GPU, reason="with a real GPU NCCL is available")
def test_nccl_needs_cuda():
    res = _ok("gloo", "main", MAIN)
    msg = res[0]["nccl"]
    assert msg is not None and "NCCLBackend needs CUDA GPUs" in msg and "GlooBackend" in msg


NCCL_ONE = """
import numpy as np, triflux as tf
from triflux import distributed as dist
b = dist.initialize(dist.NCCLBackend, timeout=30)
assert dist.total_workers(b) == 1 and b.device is not None
x = tf.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3), device=b.device)
for op in ("sum", "avg", "max", "min"):
    assert dist.allreduce(b, x, op) is x and x.tolist() == np.arange(6.0).reshape(2, 3).tolist(), op
y = dist.bcast(b, {"a": x.T, "n": 3, "h": np.ones(2)})       # a transposed view, a number, a host array
assert y["n"] == 3 and y["a"].tolist() == np.arange(6.0).reshape(2, 3).T.tolist()
assert dist.reduce(b, x, "avg").tolist() == np.arange(6.0).reshape(2, 3).tolist()
print("NCCL OK")
"""


@pytest.mark.gpu
def test_nccl_backend_on_one_gpu():
    import subprocess as sp
    env = _env({})
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = sp.run([sys.executable, "-c", NCCL_ONE], capture_output=True, text=True, env=env, cwd=ROOT,
               timeout=TIMEOUT)
    assert p.returncode == 0 and "NCCL OK" in p.stdout, p.stdout + p.stderr


# --- training ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", LAUNCHERS)
def test_data_parallel_training_equals_single_process(kind):
    res = _ok(kind, "main", MAIN)
    for r in (0, 1):
        d = res[r]
        assert d["synced"] == 0.0, "synchronize must make every model equal to rank 0's"
        assert d["shard"] == [4 * r, 4 * r + 4, 4]
        assert d["maxdiff"] < 1e-5, d
        assert d["adam_t"] == 7


@pytest.mark.parametrize("kind", LAUNCHERS)
def test_flux_example_dataloader_over_a_distributed_container(kind):
    """Flux's DistributedUtils example with ``DataLoader(DistributedDataContainer(backend, (x, y)),
    batchsize=4, shuffle=True)``: the workers see disjoint halves (every local observation once per
    epoch, reshuffled), and training equals one process on the combined batches, losses included."""
    res = _ok(kind, "main", MAIN)
    for r in (0, 1):
        d = res[r]
        assert d["ddc"] == [f"DistributedDataContainer(rank {r} of 2: observations {8 * r}:{8 * r + 8} of 16; "
                            "(float32[8, 1], float32[8, 1], int64[8]))", 8]
        seen = d["ddc_seen"]
        assert [len(b) for b in seen] == [4, 4, 4, 4]
        for epoch in (seen[:2], seen[2:]):
            assert sorted(epoch[0] + epoch[1]) == list(range(8 * r, 8 * r + 8))
        assert seen[:2] != seen[2:]                              # reshuffled every epoch
        assert d["ddc_loss_gap"] < 1e-6 and d["ddc_maxdiff"] < 1e-5, d
    assert res[0]["ddc_seen"] != [[i - 8 for i in b] for b in res[1]["ddc_seen"]]   # each its own shuffle


# --- failures -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", LAUNCHERS)
def test_a_dead_worker_fails_the_others_instead_of_hanging(kind):
    t0 = time.monotonic()
    rcs, text, res = _run(kind, DEAD, worker_timeout=5)
    took = time.monotonic() - t0
    assert took < TIMEOUT
    if kind == "gloo":
        assert rcs[1] == 3
        assert 0 in res, text
        msg = res[0]["error"]
        assert msg is not None, "the surviving worker did not notice"
        assert "allreduce failed on rank 0 of 2" in msg and "alive" in msg, msg
        assert res[0]["elapsed"] < 5 + 3
    else:   # mpiexec itself ends the whole job when a rank dies: no hang, a non-zero exit, its message
        assert rcs[0] != 0, text
        assert "exit" in text and "non-zero" in text, text



@pytest.mark.parametrize("kind", LAUNCHERS)
def test_a_stuck_worker_fails_the_others_within_the_timeout(kind):
    t0 = time.monotonic()
    rcs, text, res = _run(kind, STUCK, worker_timeout=1.5)
    took = time.monotonic() - t0
    if kind == "gloo":
        assert 0 in res, text
        msg = res[0]["error"]
        assert msg is not None and "allreduce failed on rank 0 of 2" in msg and "timeout (1.5 s" in msg, msg
        assert 1.4 < res[0]["elapsed"] < 1.5 + 3
    else:   # a blocking MPI collective cannot be cancelled: the watchdog aborts the job with the message
        assert rcs[0] != 0 and not res, text
        assert "DistributedError: allreduce failed on rank 0 of 2 (MPIBackend)" in text, text
        assert "within 1.5 s" in text and "nonblocking=True" in text, text
        assert took < TIMEOUT

# --- in this process: selection, environment, sharding --------------------------------------------------------

def test_backend_kinds_and_errors(monkeypatch):
    assert B._kind("gloo", "x") is dist.GlooBackend and B._kind(dist.MPIBackend, "x") is dist.MPIBackend
    assert B._kind("NCCLBackend", "x") is dist.NCCLBackend
    with pytest.raises(TypeError, match="MPIBackend, NCCLBackend or GlooBackend"):
        dist.initialize("tcp")
    with pytest.raises(DistributedError, match=r"initialize\(NCCLBackend\)"):
        dist.get_distributed_backend(dist.NCCLBackend)
    assert issubclass(DistributedError, TrifluxError) and issubclass(DistributedError, RuntimeError)
    assert dist.DistributedModel is dist.FluxDistributedModel
    with pytest.raises(ValueError, match="timeout"):
        dist.initialize(dist.GlooBackend, timeout=0)


def test_launcher_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
              "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert B.launcher_environment() == (0, 1, 0, None)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert B.launcher_environment() == (3, 4, 1, "mpiexec")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert B.launcher_environment() == (2, 8, 0, "torchrun")    # torchrun's variables win
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(DistributedError, match="WORLD_SIZE"):
        B.launcher_environment()


def test_gpus_are_assigned_round_robin(monkeypatch):
    from triflux import backend as tb
    monkeypatch.setattr(tb, "status", lambda name: (True, ""))
    monkeypatch.setattr(tb, "device_count", lambda name: 3)
    assert [B._round_robin_device(r).idx for r in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    monkeypatch.setattr(tb, "status", lambda name: (False, "no GPU"))
    assert B._round_robin_device(5) is None


def test_shards_split_like_flux():
    # ceil(N / n) per worker, the last ones shorter (or empty)
    assert [shard_range(10, 3, r) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [shard_range(8, 2, r) for r in range(2)] == [(0, 4), (4, 8)]
    assert [shard_range(5, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    for n in range(0, 30):
        for w in range(1, 6):
            parts = [shard_range(n, w, r) for r in range(w)]
            assert sum(hi - lo for lo, hi in parts) == n
            assert all(parts[i][1] == parts[i + 1][0] for i in range(w - 1))


def test_ops_are_named():
    from triflux.distributed.collectives import normalize_op
    assert [normalize_op(o) for o in ("sum", sum, max, min, "avg", "mean", "+")] == \
        ["sum", "sum", "max", "min", "avg", "avg", "sum"]
    with pytest.raises(ValueError, match="'sum', 'avg', 'max' or 'min'"):
        normalize_op("prod")


def test_example_ddp_runs_with_a_torchrun_style_launch():
    rcs, outs, _ = launch_torchrun_style(None, argv=[os.path.join(ROOT, "examples", "ddp.py"), "--steps", "3"])
    assert rcs == [0, 0], "\n".join(outs)
    for r in (0, 1):
        assert f"rank {r}/2 step 0" in outs[r] and f"rank {r}/2 (GlooBackend): final loss" in outs[r], outs[r]
    finals = [float(o.rsplit("final loss", 1)[1].split()[0]) for o in outs]
    assert finals[0] == finals[1]          # one loss over all the data, the same on every worker



def test_data_container_shards_arrays_tensors_and_structures():
    import triflux as tf
    x = np.arange(20.0).reshape(10, 2)
    y = np.arange(10)
    parts = []
    for r in range(3):
        fake = B.DistributedBackend(r, 3, 0, 1.0)     # no exchange needed: only rank and size
        c = dist.DistributedDataContainer(fake, (x, tf.tensor(y)))
        parts.append(c)
        assert "rank %d of 3" % r in repr(c)
    assert [len(c) for c in parts] == [4, 4, 2] and [c.indices for c in parts] == [range(0, 4), range(4, 8),
                                                                                    range(8, 10)]
    np.testing.assert_array_equal(np.concatenate([c.data[0] for c in parts]), x)   # every observation once
    xb, yb = parts[2][1]
    np.testing.assert_array_equal(xb, x[9])
    assert int(yb) == 9
    batches = list(parts[1].loader(batchsize=3))                                # works with DataLoader
    assert [b[0].shape[0] for b in batches] == [3, 1]
    np.testing.assert_array_equal(batches[0][0], x[4:7])
    d = dist.DistributedDataContainer(B.DistributedBackend(1, 2, 0, 1.0), {"img": np.zeros((5, 3))})
    assert d.data["img"].shape == (2, 3) and len(d) == 2
    with pytest.raises(IndexError):
        parts[2][2]
    with pytest.raises(tf.ShapeError, match="different numbers of observations"):
        dist.DistributedDataContainer(B.DistributedBackend(0, 2, 0, 1.0), (x, y[:3]))


def test_distributed_optimiser_state_saves_and_loads(tmp_path):
    """A DistributedOptimizer's state saves as its inner rule's and loads back
    into a DistributedOptimizer state (keeping the live backend), exactly."""
    import triflux as tf
    from triflux import distributed as dist
    backend = dist.initialize(dist.GlooBackend, timeout=30)
    model = tf.Chain(tf.Dense(3, 2))
    opt = tf.setup(dist.DistributedOptimizer(backend, tf.Adam(1e-2)), model)
    x = np.ones((4, 3), np.float32)
    for _ in range(2):
        _, (g,) = tf.withgradient(lambda m: (m(x) ** 2).sum(), model)
        tf.update(opt, model, g)
    path = tf.save(str(tmp_path / "opt.safetensors"), {"model": model, "opt": opt})
    fresh_model = tf.Chain(tf.Dense(3, 2))
    fresh = tf.setup(dist.DistributedOptimizer(backend, tf.Adam(1e-2)), fresh_model)
    saved = tf.load(path)
    tf.loadmodel(fresh_model, saved["model"])
    tf.loadmodel(fresh, saved["opt"])
    leaf = fresh["layers"][0]["weight"]
    assert isinstance(leaf.rule, dist.DistributedOptimizer) and leaf.rule.backend is backend
    for a, b in zip(tf.functor.leaves(tf.state(opt)), tf.functor.leaves(tf.state(fresh))):
        np.testing.assert_array_equal(a, b)
