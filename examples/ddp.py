"""Data-parallel training with triflux.distributed (Flux's DistributedUtils).

Run it with 2 workers on one machine::

    torchrun --nproc-per-node 2 examples/ddp.py            # Gloo (CPU), or NCCL on CUDA GPUs
    mpiexec -n 2 python examples/ddp.py                    # MPI (mpi4py)

(as root, OpenMPI needs ``mpiexec --allow-run-as-root``; with fewer cores
than workers, ``--oversubscribe``). Across machines, see the README
section "Data-parallel training across processes and machines". Every worker builds its own random
model; ``synchronize`` makes them all equal to rank 0's, each worker trains
on its shard of the data (``DataLoader(DistributedDataContainer(backend,
(x, y)))``, as in Flux) and ``DistributedOptimizer`` averages the
gradients, so the models stay equal.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triflux as tf  # noqa: E402
from triflux import distributed as dist  # noqa: E402
from triflux import losses  # noqa: E402


def choose_backend(name):
    if name != "auto":
        return {"gloo": dist.GlooBackend, "nccl": dist.NCCLBackend, "mpi": dist.MPIBackend}[name]
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        return dist.MPIBackend
    from triflux import backend as tb
    if not tb.interpreter_on():
        try:
            import torch
            if torch.cuda.is_available():
                return dist.NCCLBackend
        except ImportError:
            pass
    return dist.GlooBackend


def main(steps=20, backend_name="auto", timeout=60.0):
    kind = choose_backend(backend_name)
    dist.initialize(kind, timeout=timeout)
    backend = dist.get_distributed_backend(kind)
    rank, n = dist.local_rank(backend), dist.total_workers(backend)
    device = backend.device if kind is dist.NCCLBackend else tf.cpu_device()

    # the same data on every worker (each trains on its own shard of it): y = x^3
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(256, 1)).astype(np.float32)
    y = x ** 3

    tf.seed(1234 + rank)      # deliberately different initial models: synchronize fixes that
    model = device(tf.Chain(tf.Dense(1, 64, tf.tanh), tf.Dense(64, 1)))
    model = dist.synchronize(backend, dist.FluxDistributedModel(model), root=0)
    opt_state = dist.synchronize(backend, tf.setup(dist.DistributedOptimizer(backend, tf.Adam(0.01)), model),
                                 root=0)
    # this worker's shard of the data, read as in Flux: DataLoader(DistributedDataContainer(backend, data))
    data = dist.DistributedDataContainer(backend, (x, y))
    loader = device(tf.DataLoader(data, batchsize=len(data)))

    def loss(m, xb, yb):
        return losses.mse(m(xb), yb)

    for step in range(steps):
        (local,) = tf.train(loss, model, loader, opt_state)
        if step % 5 == 0 or step == steps - 1:
            print(f"rank {rank}/{n} step {step}: local loss {local:.6f}", flush=True)
    # the loss over all the data: the mean of the workers' losses, weighted by shard size
    total = dist.allreduce(backend, np.array([local * len(data), len(data)], np.float64), "sum")
    final = total[0] / total[1]
    print(f"rank {rank}/{n} ({type(backend).__name__}): final loss {final:.6f}", flush=True)
    dist.shutdown(backend)
    return final


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl", "mpi"], default="auto")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait")
    a = p.parse_args()
    main(a.steps, a.backend, a.timeout)
