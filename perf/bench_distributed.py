"""allreduce throughput of triflux.distributed against the raw libraries,
in the same run: triflux's ``allreduce(GlooBackend)`` vs
``torch.distributed.all_reduce`` on the same process group, and triflux's
``allreduce(MPIBackend)`` vs mpi4py's ``Allreduce`` on the same
communicator (when mpi4py and mpiexec are installed). float32 buffers of
1 MB to 256 MB, op "sum"; the two contenders alternate repetition by
repetition so that load changes hit both alike.

::

    python perf/bench_distributed.py                     # spawns 2 workers itself (Gloo, then MPI)
    python perf/bench_distributed.py --sizes 1 4 16 --reps 5 --json out.json
    torchrun --nproc-per-node 2 perf/bench_distributed.py --worker gloo
    mpiexec -n 2 python perf/bench_distributed.py --worker mpi

Throughput is the algorithm bandwidth, buffer bytes / median seconds per
allreduce; "overhead" is triflux's median time over the raw library's,
minus one.
"""
import argparse
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MB = 1 << 20


def _time(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def bench_pair(barrier, ours, raw, buf, reps):
    """Median seconds of ``ours(buf)`` and ``raw(buf)``, alternating."""
    for _ in range(2):                 # warm up both paths (connections, allocations)
        ours(buf)
        raw(buf)
    t_ours, t_raw = [], []
    for i in range(reps):
        pair = [(ours, t_ours), (raw, t_raw)]
        for f, times in (pair if i % 2 == 0 else pair[::-1]):
            barrier()
            times.append(_time(lambda: f(buf)))
    return float(np.median(t_ours)), float(np.median(t_raw))


def worker(kind, sizes, reps, out):
    from triflux import distributed as dist
    if kind == "gloo":
        import torch
        import torch.distributed as tdist
        backend = dist.initialize(dist.GlooBackend, timeout=600)
        raw_name = "torch.distributed (gloo)"

        def raw(b):
            tdist.all_reduce(torch.from_numpy(b))

        def barrier():
            tdist.barrier()
    else:
        from mpi4py import MPI
        backend = dist.initialize(dist.MPIBackend, timeout=600)
        comm = backend.comm
        raw_name = "mpi4py"

        def raw(b):
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

        def barrier():
            comm.Barrier()

    def ours(b):
        dist.allreduce(backend, b, "sum")

    rows = []
    for mb in sizes:
        buf = np.ones(int(mb * MB) // 4, np.float32)
        t_ours, t_raw = bench_pair(barrier, ours, raw, buf, reps)
        rows.append({"backend": type(backend).__name__, "raw": raw_name, "MB": mb, "reps": reps,
                     "triflux_s": t_ours, "raw_s": t_raw,
                     "triflux_GBps": mb * MB / t_ours / 1e9, "raw_GBps": mb * MB / t_raw / 1e9,
                     "overhead": t_ours / t_raw - 1.0, "workers": dist.total_workers(backend)})
    if dist.local_rank(backend) == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.shutdown(backend)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(a, kind, out):
    return [os.path.abspath(__file__), "--worker", kind, "--reps", str(a.reps), "--out", out,
            "--sizes", *map(str, a.sizes)]


def spawn(a):
    """Run the Gloo workers (torchrun's variables set by hand) and, when
    available, the MPI workers under mpiexec; the rows of both."""
    rows = []
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    folder = tempfile.mkdtemp(prefix="triflux-bench-")
    out = os.path.join(folder, "gloo.json")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable] + _args(a, "gloo", out),
                              env=dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                                       WORLD_SIZE=str(a.workers), LOCAL_RANK=str(r)))
             for r in range(a.workers)]
    if any(p.wait() for p in procs):
        sys.exit("the Gloo workers failed")
    rows += json.load(open(out))
    mpiexec = shutil.which("mpiexec")
    if importlib.util.find_spec("mpi4py") is None:
        mpiexec = None
    if mpiexec and not a.no_mpi:
        out = os.path.join(folder, "mpi.json")
        cmd = [mpiexec, "-n", str(a.workers), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        subprocess.run(cmd + [sys.executable] + _args(a, "mpi", out), env=env, check=True)
        rows += json.load(open(out))
    else:
        print("(MPI skipped: mpi4py or mpiexec is not installed)")
    return rows


def table(rows):
    lines = ["| backend | vs | MB | triflux GB/s | raw GB/s | triflux ms | raw ms | overhead |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['raw']} | {r['MB']:g} | {r['triflux_GBps']:.3f} | {r['raw_GBps']:.3f} "
                     f"| {r['triflux_s'] * 1e3:.2f} | {r['raw_s'] * 1e3:.2f} | {r['overhead'] * 100:+.1f}% |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description="allreduce throughput: triflux.distributed vs raw libraries")
    p.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64, 256], help="buffer sizes in MB")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per size and contender")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker", choices=["gloo", "mpi"], help="(internal) run as one worker")
    p.add_argument("--out", help="(internal) where rank 0 writes its rows")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--no-mpi", action="store_true", help="skip the MPI comparison")
    a = p.parse_args()
    if a.worker:
        out = a.out or os.path.join(tempfile.gettempdir(), f"triflux-bench-{a.worker}.json")
        worker(a.worker, a.sizes, a.reps, out)
        if not a.out:
            print(table(json.load(open(out))) if os.path.exists(out) else "")
        return
    rows = spawn(a)
    print(table(rows))
    worst = max(r["overhead"] for r in rows)
    print(f"\nworst triflux overhead: {worst * 100:+.1f}% (target: at most +10%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
