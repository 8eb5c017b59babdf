"""Data-parallel training across processes and machines (Flux's
``DistributedUtils``)::

    import triflux as tf
    from triflux import distributed as dist

    dist.initialize(dist.GlooBackend)             # or MPIBackend, NCCLBackend
    backend = dist.get_distributed_backend(dist.GlooBackend)
    model = dist.synchronize(backend, dist.FluxDistributedModel(model))
    data = dist.DistributedDataContainer(backend, (x, y))
    opt_state = dist.synchronize(backend, tf.setup(dist.DistributedOptimizer(backend, tf.Adam(1e-3)), model))
    for xb, yb in tf.DataLoader(data, batchsize=32, shuffle=True):
        loss, (g,) = tf.withgradient(lambda m: tf.losses.mse(m(xb), yb), model)
        tf.update(opt_state, model, g)

Launch with ``torchrun --nproc-per-node 2 script.py`` or
``mpiexec -n 2 python script.py``. Modules: ``backends`` (initialize, the
three backends), ``collectives`` (allreduce, bcast, reduce, synchronize),
``data`` (DistributedDataContainer), ``optimiser`` (DistributedOptimizer),
``model`` (FluxDistributedModel).
"""
from .backends import (DistributedBackend, GlooBackend, MPIBackend, NCCLBackend, get_distributed_backend,
                       initialize, is_initialized, local_rank, shutdown, total_workers)
from .collectives import allreduce, bcast, reduce, synchronize
from .data import DistributedDataContainer
from .model import DistributedModel, FluxDistributedModel
from .optimiser import DistributedOptimizer
from ..errors import DistributedError

__all__ = ["DistributedBackend", "MPIBackend", "NCCLBackend", "GlooBackend", "initialize",
           "get_distributed_backend", "total_workers", "local_rank", "is_initialized", "shutdown",
           "synchronize", "allreduce", "bcast", "reduce", "DistributedDataContainer", "DistributedOptimizer",
           "FluxDistributedModel", "DistributedModel", "DistributedError"]
