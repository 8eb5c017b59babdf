"""Distributed backends (Flux's ``DistributedUtils`` backends): who the
workers are and how one buffer is exchanged between them.

===============  =========================================================================
``GlooBackend``  torch.distributed with Gloo: CPU (NumPy) buffers, zero copy through
                 ``torch.from_numpy``; device Tensors are staged through the host.
``NCCLBackend``  torch.distributed with NCCL: CUDA Tensors exchanged on the GPU directly
                 (host buffers are staged onto this worker's GPU). Needs real CUDA GPUs.
``MPIBackend``   mpi4py: NumPy buffers; device Tensors are staged through the host unless
                 CUDA-aware MPI is declared (the preference below).
===============  =========================================================================

``initialize(kind, timeout=seconds)`` reads the rank and the number of
workers from the launcher's environment: torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR``/``MASTER_PORT`` for the
rendezvous), or OpenMPI's ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``
under ``mpiexec`` (MPICH's/PMI's ``PMI_RANK``/``PMI_SIZE`` too). Without a
launcher it is a world of one worker. Each worker gets the GPU
``node-local rank % number of visible GPUs`` (round robin), as
``backend.device``.

A collective that does not finish within ``timeout`` seconds (a dead or
stuck peer) raises :class:`~triflux.errors.DistributedError` naming the
rank, the collective and what to check, instead of hanging. (MPI cannot
cancel its blocking collectives: there a watchdog writes that message and
aborts the MPI job, unless ``initialize(MPIBackend, nonblocking=True)``.
``mpiexec`` itself ends the job when a worker dies.)

CUDA-aware MPI (MPI reading GPU memory directly) is a preference, as Flux's
``FluxDistributedMPICUDAAware``: ``distributed_mpi_cuda_aware = true`` in the
``[triflux]`` section of ``LocalPreferences.toml`` or the environment
variable ``TRIFLUX_MPI_CUDA_AWARE=1``. Without it device buffers go through
host memory.
"""
import atexit
import datetime
import os
import sys
import time

import numpy as np

from .. import backend as _b
from .. import dtypes as _dt
from .. import ops
from ..devices import CUDADevice
from ..errors import DistributedError
from ..preferences import SECTION, preferences_path
from ..tensor import Tensor

__all__ = ["DistributedBackend", "GlooBackend", "NCCLBackend", "MPIBackend", "initialize",
           "get_distributed_backend", "total_workers", "local_rank", "is_initialized", "shutdown",
           "DEFAULT_TIMEOUT"]

#: seconds a collective may take before it is declared failed
DEFAULT_TIMEOUT = 300.0

OPS = ("sum", "avg", "max", "min")

_BACKENDS = {}     # kind (class) -> initialized backend instance


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise DistributedError(f"the environment variable {n}={v!r} is not an integer; "
                                       "it should be set by the launcher (torchrun or mpiexec)") from None
    return None


def launcher_environment():
    """``(rank, world_size, node_local_rank, launcher)`` from the environment:
    torchrun's variables first, then OpenMPI's and PMI's; ``(0, 1, 0, None)``
    when no launcher started this process."""
    rank = _env_int("RANK")
    if rank is not None:
        size = _env_int("WORLD_SIZE")
        if size is None:
            raise DistributedError("RANK is set but WORLD_SIZE is not; launch with `torchrun --nproc-per-node N "
                                   "script.py` or set both (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT)")
        return rank, size, _env_int("LOCAL_RANK") or 0, "torchrun"
    rank = _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    if rank is not None:
        size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
        if size is None:
            raise DistributedError("an MPI rank is set in the environment but not the number of processes "
                                   "(OMPI_COMM_WORLD_SIZE / PMI_SIZE); launch with `mpiexec -n N`")
        local = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
        return rank, size, rank if local is None else local, "mpiexec"
    return 0, 1, 0, None


def mpi_cuda_aware_preference():
    """Whether CUDA-aware MPI is declared (``TRIFLUX_MPI_CUDA_AWARE=1`` or
    ``distributed_mpi_cuda_aware = true`` in ``LocalPreferences.toml``)."""
    env = os.environ.get("TRIFLUX_MPI_CUDA_AWARE")
    if env not in (None, ""):
        return env.strip().lower() not in ("0", "false", "no")
    try:
        import tomllib
        with open(preferences_path(), "rb") as f:
            return bool(tomllib.load(f).get(SECTION, {}).get("distributed_mpi_cuda_aware", False))
    except Exception:
        return False


def _round_robin_device(node_local_rank):
    """This worker's GPU, ``node_local_rank % visible GPUs`` (``None`` when
    no GPU backend is functional)."""
    ok, _ = _b.status("CUDA")
    if not ok:
        return None
    n = _b.device_count("CUDA")
    return CUDADevice(node_local_rank % n) if n else None


class DistributedBackend:
    """A set of workers that exchange buffers. ``rank`` (0-based) and
    ``world_size``; ``node_local_rank`` is the rank among the workers on this
    machine (for GPU assignment); ``device`` this worker's GPU (round robin)
    or ``None``; ``timeout`` in seconds."""
    name = "?"

    def __init__(self, rank, world_size, node_local_rank, timeout):
        self.rank, self.world_size, self.node_local_rank = int(rank), int(world_size), int(node_local_rank)
        self.timeout = float(timeout)
        self.device = None
        self.closed = False

    def __repr__(self):
        return f"{type(self).__name__}(rank {self.rank} of {self.world_size}, timeout {self.timeout:g} s)"

    # --- errors -------------------------------------------------------------------------------
    def error(self, collective, exc=None, hint=None):
        """A DistributedError for ``collective`` failing on this worker."""
        what = f"{collective} failed on rank {self.rank} of {self.world_size} ({type(self).__name__})"
        cause = f": {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" \
            if exc is not None else ""
        hint = hint or (f"Check that every worker is still alive (a worker that crashed or exited early "
                        f"leaves the others waiting), that all of them call the same collectives in the same "
                        f"order on buffers of the same shape and dtype, and that the network between them "
                        f"works; a collective waits at most the timeout ({self.timeout:g} s, "
                        f"`initialize(kind, timeout=seconds)`).")
        return DistributedError(f"{what}{cause}. {hint}")

    def _check_open(self, collective):
        if self.closed:
            raise DistributedError(f"{collective}: this {type(self).__name__} was shut down; call "
                                   f"`initialize({type(self).__name__})` again")

    # --- what subclasses provide -----------------------------------------------------------------
    def device_direct(self, t):
        """Whether the torch tensor ``t`` (device memory) can be exchanged
        without staging it through the host."""
        return False

    def host_collective(self, collective, arr, op, root):
        """Run ``collective`` ("allreduce", "bcast", "reduce") on the
        contiguous NumPy array ``arr`` in place."""
        raise NotImplementedError

    def device_collective(self, collective, t, op, root):
        """The same on a contiguous torch tensor in device memory."""
        raise NotImplementedError

    def barrier(self):
        self.host_collective("barrier", np.zeros(1, np.int32), "sum", 0)

    def _shutdown(self):
        pass

    # --- Python objects, built on buffers (so they obey the timeout on every backend) ------------
    def allgather_bytes(self, payload, collective="allgather"):
        """Every worker's ``payload`` (bytes), in rank order."""
        n = self.world_size
        if n == 1:
            return [bytes(payload)]
        lens = np.zeros(n, np.int64)
        lens[self.rank] = len(payload)
        self.host_collective(collective, lens, "sum", 0)
        m = int(lens.max())
        buf = np.zeros((n, max(m, 1)), np.uint8)
        buf[self.rank, :len(payload)] = np.frombuffer(bytes(payload), np.uint8)
        self.host_collective(collective, buf, "sum", 0)    # one non-zero contribution per row: no overflow
        return [buf[i, :int(lens[i])].tobytes() for i in range(n)]

    def bcast_bytes(self, payload, root=0, collective="bcast"):
        """``payload`` of rank ``root`` on every worker."""
        if self.world_size == 1:
            return bytes(payload)
        ln = np.array([len(payload) if self.rank == root else 0], np.int64)
        self.host_collective(collective, ln, "sum", root)   # bcast ignores the op
        buf = np.zeros(max(int(ln[0]), 1), np.uint8)
        if self.rank == root:
            buf[:len(payload)] = np.frombuffer(bytes(payload), np.uint8)
        self.host_collective("bcast", buf, "sum", root)
        return buf[:int(ln[0])].tobytes()


# --- torch.distributed (Gloo, NCCL) -----------------------------------------------------------------

def torch_view(arr):
    """A zero-copy torch view of the NumPy array ``arr`` (bfloat16 included)."""
    import torch
    if arr.dtype.kind == "V":
        if _dt.is_bfloat16(arr.dtype):
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


class _TorchBackend(DistributedBackend):
    torch_backend = None

    def __init__(self, rank, world_size, node_local_rank, timeout):
        super().__init__(rank, world_size, node_local_rank, timeout)
        import torch.distributed as dist
        self._dist = dist
        if not dist.is_available():
            raise DistributedError("this torch build has no torch.distributed; install a torch with "
                                   "distributed support (the default wheels have it)")
        kw = dict(backend=self.torch_backend, rank=self.rank, world_size=self.world_size,
                  timeout=datetime.timedelta(seconds=self.timeout))
        self._prepare()
        if dist.is_initialized():
            raise DistributedError("torch.distributed is already initialized in this process (by another "
                                   "library or another triflux backend); use that one or shut it down first")
        try:
            if self.world_size == 1 and "MASTER_ADDR" not in os.environ:
                kw["store"] = dist.HashStore()
            else:
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", "29500")
                kw["init_method"] = "env://"
            dist.init_process_group(**kw)
        except DistributedError:
            raise
        except Exception as e:
            raise self.error(
                "initialize", e,
                f"Check that all {self.world_size} workers were started and reach "
                f"MASTER_ADDR={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} (rank 0 listens "
                f"there; the port must be free on rank 0's machine) within the timeout "
                f"({self.timeout:g} s).") from None

    def _prepare(self):
        pass

    def _op(self, op):
        ops = self.__dict__.get("_ops")
        if ops is None:
            R = self._dist.ReduceOp
            ops = self._ops = {"sum": R.SUM, "avg": R.SUM, "max": R.MAX, "min": R.MIN}
        return ops[op]

    def _run(self, collective, t, op, root):
        dist = self._dist
        try:
            if collective == "bcast":
                dist.broadcast(t, src=root)
            elif collective == "reduce":
                dist.reduce(t, dst=root, op=self._op(op))
            else:           # allreduce, and what is built on it (allgather, barrier, synchronize's check)
                dist.all_reduce(t, op=self._op(op))
        except DistributedError:
            raise
        except Exception as e:
            raise self.error(collective, e) from None

    def _shutdown(self):
        try:
            if self._dist.is_initialized():
                self._dist.destroy_process_group()
        except Exception:
            pass


class GlooBackend(_TorchBackend):
    """torch.distributed with Gloo: CPU buffers (NumPy, zero copy), device
    Tensors staged through the host. No MPI needed."""
    name = "gloo"
    torch_backend = "gloo"

    def host_collective(self, collective, arr, op, root):
        self._check_open(collective)
        self._run(collective, torch_view(arr), op, root)
        if op == "avg" and collective != "bcast" and (collective != "reduce" or self.rank == root):
            np.divide(arr, self.world_size, out=arr, casting="unsafe")


class NCCLBackend(_TorchBackend):
    """torch.distributed with NCCL: CUDA Tensors exchanged on the GPU; each
    worker uses GPU ``node_local_rank % device_count``. Needs real CUDA GPUs
    (not the Triton interpreter)."""
    name = "nccl"
    torch_backend = "nccl"

    def _prepare(self):
        import torch
        if _b.interpreter_on() or not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            why = ("the Triton interpreter serves the CUDA device (TRITON_INTERPRET=1), which NCCL cannot use"
                   if _b.interpreter_on() else "no CUDA GPU is available to torch")
            raise DistributedError(f"NCCLBackend needs CUDA GPUs: {why}. Use `initialize(GlooBackend)` "
                                   "(CPU and staged device buffers, no GPU needed) or `initialize(MPIBackend)`.")
        if not self._dist.is_nccl_available():
            raise DistributedError("this torch build has no NCCL; use `initialize(GlooBackend)` or a CUDA "
                                   "build of torch")
        self._tdev = torch.device("cuda", self.node_local_rank % torch.cuda.device_count())
        torch.cuda.set_device(self._tdev)

    def _op(self, op):
        ops = self.__dict__.get("_ops")
        if ops is None:
            R = self._dist.ReduceOp
            ops = self._ops = {"sum": R.SUM, "avg": R.AVG, "max": R.MAX, "min": R.MIN}
        return ops[op]

    def device_direct(self, t):
        return t.device.type == "cuda"

    def device_collective(self, collective, t, op, root):
        self._check_open(collective)
        self._run(collective, t, op, root)

    def host_collective(self, collective, arr, op, root):
        # NCCL only moves GPU memory: stage the host buffer onto this worker's GPU and back
        self._check_open(collective)
        import torch
        t = torch_view(arr).to(self._tdev, copy=True)
        self._run(collective, t, op, root)
        if collective == "reduce" and self.rank != root:
            return
        torch_view(arr).copy_(t.to("cpu"))
        torch.cuda.synchronize(self._tdev)


# --- MPI (mpi4py) -------------------------------------------------------------------------------------

def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            f"MPIBackend needs mpi4py and an MPI library ({e}). Install them, e.g. "
            "`apt-get install openmpi-bin libopenmpi-dev && pip install mpi4py`, or use "
            "`initialize(GlooBackend)` (no MPI needed).") from None
    return MPI


class _Watchdog:
    """Ends the MPI job when a blocking collective outlives the timeout: MPI
    cannot cancel a blocking collective, so the watchdog thread writes the
    DistributedError message to stderr and calls ``MPI_Abort`` (every worker
    stops, none hangs)."""

    def __init__(self, backend):
        import threading
        self.backend = backend
        self.deadline = None
        self.what = None
        self.thread = threading.Thread(target=self._run, name="triflux-mpi-watchdog", daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            time.sleep(0.05)
            d = self.deadline
            if d is not None and time.monotonic() > d:
                b = self.backend
                msg = b.error(self.what, TimeoutError(f"no answer from the other workers within {b.timeout:g} s"),
                              "Check that every worker is alive and calls the same collectives in the same "
                              "order. MPI cannot cancel a blocking collective, so the whole MPI job is being "
                              "aborted; `initialize(MPIBackend, timeout=..., nonblocking=True)` raises this "
                              "error as an exception instead (slower non-blocking collectives).")
                sys.stderr.write(f"triflux.distributed: DistributedError: {msg}\n")
                sys.stderr.flush()
                b.comm.Abort(1)
                return


class MPIBackend(DistributedBackend):
    """mpi4py on ``MPI.COMM_WORLD``: NumPy buffers; device Tensors staged
    through the host unless CUDA-aware MPI is declared (see the module
    docstring). float16/bfloat16 buffers are reduced in float32.

    By default collectives are MPI's blocking ones (its fastest algorithms),
    guarded by a watchdog thread that aborts the MPI job with the
    DistributedError message when one outlives the timeout (MPI cannot
    cancel it). ``nonblocking=True`` uses non-blocking collectives polled up
    to the timeout, which raise a catchable ``DistributedError`` instead, at
    some cost in bandwidth (MPI's non-blocking algorithms are slower)."""
    name = "mpi"

    def __init__(self, rank, world_size, node_local_rank, timeout, comm=None, nonblocking=False):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        r, n = self.comm.Get_rank(), self.comm.Get_size()
        super().__init__(r, n, node_local_rank if n == world_size else r, timeout)
        self.cuda_aware = mpi_cuda_aware_preference()
        self.nonblocking = bool(nonblocking)
        self._watchdog = None
        M = MPI
        self._ops = {"sum": M.SUM, "avg": M.SUM, "max": M.MAX, "min": M.MIN}

    def _op(self, op):
        return self._ops[op]

    def _wait(self, req, collective):
        deadline = time.monotonic() + self.timeout
        i = 0
        try:
            while not req.Test():
                i += 1
                if i % 64 == 0:
                    if time.monotonic() > deadline:
                        raise self.error(collective, TimeoutError(
                            f"no answer from the other workers within {self.timeout:g} s"))
                    if i > 100000:
                        time.sleep(1e-4)
        except DistributedError:
            raise
        except Exception as e:
            raise self.error(collective, e) from None

    def _start(self, collective, buf, op, root):
        c = self.comm
        IN_PLACE = self.MPI.IN_PLACE
        if collective == "bcast":
            return c.Ibcast(buf, root=root)
        if collective == "reduce":
            if self.rank == root:
                return c.Ireduce(IN_PLACE, buf, self._op(op), root=root)
            return c.Ireduce(buf, None, self._op(op), root=root)
        return c.Iallreduce(IN_PLACE, buf, self._op(op))   # allreduce and what is built on it

    def _blocking(self, collective, buf, op, root):
        c = self.comm
        IN_PLACE = self.MPI.IN_PLACE
        if collective == "bcast":
            c.Bcast(buf, root=root)
        elif collective == "reduce":
            if self.rank == root:
                c.Reduce(IN_PLACE, buf, self._op(op), root=root)
            else:
                c.Reduce(buf, None, self._op(op), root=root)
        else:
            c.Allreduce(IN_PLACE, buf, self._op(op))

    def _exchange(self, collective, buf, op, root):
        if self.nonblocking:
            try:
                req = self._start(collective, buf, op, root)
            except Exception as e:
                raise self.error(collective, e) from None
            self._wait(req, collective)
            return
        if self._watchdog is None:
            self._watchdog = _Watchdog(self)
        w = self._watchdog
        w.what = collective
        w.deadline = time.monotonic() + self.timeout
        try:
            self._blocking(collective, buf, op, root)
        except Exception as e:
            raise self.error(collective, e) from None
        finally:
            w.deadline = None

    def host_collective(self, collective, arr, op, root):
        self._check_open(collective)
        low = arr.dtype == np.float16 or arr.dtype.kind == "V"       # float16, bfloat16: in float32
        buf = arr.astype(np.float32) if low else arr
        self._exchange(collective, buf, op, root)
        if op == "avg" and collective != "bcast" and (collective != "reduce" or self.rank == root):
            np.divide(buf, self.world_size, out=buf, casting="unsafe")
        if low and (collective != "reduce" or self.rank == root):
            arr[...] = buf.astype(arr.dtype)

    def device_direct(self, t):
        return self.cuda_aware and t.device.type == "cuda"

    def device_collective(self, collective, t, op, root):
        # CUDA-aware MPI reads the device memory through __cuda_array_interface__
        self._check_open(collective)
        import torch
        torch.cuda.synchronize(t.device)
        self._exchange(collective, t, op, root)
        if op == "avg" and collective != "bcast" and (collective != "reduce" or self.rank == root):
            from ..triton_kernels import copy   # Triton only where a device collective runs
            dev = _device_of_torch(t)
            q = ops.div(Tensor._make(t, dev), self.world_size)
            copy.copy_into(t, q._data)


def _device_of_torch(t):
    return CUDADevice(t.device.index or 0)


# --- the public functions -----------------------------------------------------------------------------

_KINDS = {"gloo": GlooBackend, "nccl": NCCLBackend, "mpi": MPIBackend}


def _kind(kind, where):
    if isinstance(kind, type) and issubclass(kind, DistributedBackend) and kind is not DistributedBackend \
            and kind in _KINDS.values():
        return kind
    if isinstance(kind, DistributedBackend):
        return type(kind)
    if isinstance(kind, str) and kind.lower().replace("backend", "") in _KINDS:
        return _KINDS[kind.lower().replace("backend", "")]
    raise TypeError(f"{where}: {kind!r} is not a distributed backend kind; use MPIBackend, NCCLBackend or "
                    "GlooBackend (from triflux.distributed)")


def initialize(kind, timeout=None, **kw):
    """Start this worker's backend of ``kind`` (``MPIBackend``,
    ``NCCLBackend`` or ``GlooBackend``) and return it; rank and world size
    come from the launcher (torchrun or mpiexec). ``timeout`` (seconds,
    default 300) bounds the rendezvous and every collective. Calling it again
    for the same kind returns the running backend."""
    cls = _kind(kind, "initialize")
    t = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not t > 0:
        raise ValueError(f"initialize: timeout must be a positive number of seconds, got {timeout!r}")
    have = _BACKENDS.get(cls)
    if have is not None and not have.closed:
        return have
    rank, size, local, _ = launcher_environment()
    if not 0 <= rank < size:
        raise DistributedError(f"initialize: rank {rank} is outside 0..{size - 1} (world size {size}); check the "
                               "launcher's RANK/WORLD_SIZE")
    b = cls(rank, size, local, t, **kw)
    if cls is NCCLBackend:
        b.device = CUDADevice(b._tdev.index)
    else:
        b.device = _round_robin_device(b.node_local_rank)
    _BACKENDS[cls] = b
    return b


def is_initialized(kind):
    b = _BACKENDS.get(_kind(kind, "is_initialized"))
    return b is not None and not b.closed


def get_distributed_backend(kind):
    """The backend ``initialize(kind)`` started in this process."""
    cls = _kind(kind, "get_distributed_backend")
    b = _BACKENDS.get(cls)
    if b is None or b.closed:
        raise DistributedError(f"get_distributed_backend: {cls.__name__} is not initialized in this process; "
                               f"call `initialize({cls.__name__})` first")
    return b


def as_backend(b, where):
    """The running backend ``b`` names: a backend from ``initialize`` as it
    is, a kind (``GlooBackend``, "gloo") as ``get_distributed_backend`` finds
    it; ``where`` names the caller in the error."""
    if isinstance(b, DistributedBackend):
        return b
    if isinstance(b, type) or isinstance(b, str):
        return get_distributed_backend(b)
    raise TypeError(f"{where}: expected a backend from `initialize(...)`, got {type(b).__name__}")


def total_workers(backend):
    """The number of workers (processes) of ``backend``."""
    return as_backend(backend, "total_workers").world_size


def local_rank(backend):
    """This worker's rank, 0 .. ``total_workers(backend) - 1`` (Flux's
    ``local_rank``: the rank in the backend's communicator). The rank among
    the workers of this machine is ``backend.node_local_rank``."""
    return as_backend(backend, "local_rank").rank


def shutdown(backend=None):
    """Close ``backend`` (all initialized backends when ``None``)."""
    targets = list(_BACKENDS.values()) if backend is None else [as_backend(backend, "shutdown")]
    for b in targets:
        if not b.closed:
            b._shutdown()
            b.closed = True


atexit.register(shutdown)
