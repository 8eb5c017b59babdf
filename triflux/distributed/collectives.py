"""Collectives on structures: ``allreduce``, ``bcast``, ``reduce`` and
``synchronize`` (Flux's ``allreduce!``, ``bcast!``, ``reduce!`` and
``synchronize!!``).

``x`` may be a triflux Tensor on any device, a NumPy array, a Python number,
or any nesting of them in tuples, lists, dicts and layers (a model, an
optimiser state tree). Arrays are updated **in place** when they are
writable (a dense device Tensor, a writable NumPy array) and the result is
returned as well (tuples rebuilt, numbers replaced); an array that cannot be
written (a read-only or broadcast view) is replaced by a new one in the
result. Every worker must call the same collectives in the same order on
structures of the same shapes.

How a leaf travels: NumPy arrays and CPU Tensors (NumPy underneath) go to
the backend as they are (a zero-copy ``torch.from_numpy`` view for Gloo);
device Tensors are exchanged in device memory where the backend can
(NCCL, CUDA-aware MPI), otherwise copied to the host, exchanged, and copied
back.

Ops: ``"sum"``, ``"avg"`` (the mean over workers: the sum, then divided by
the number of workers), ``"max"``, ``"min"``; the builtins ``sum``, ``max``,
``min`` and ``operator.add`` are accepted too.
"""
import operator
import pickle

import numpy as np

from .. import dtypes as _dt
from ..errors import DistributedError, DTypeError
from ..functor import children, is_layer, path_join
from ..tensor import Tensor, torch_to_numpy, transfer
from .backends import as_backend, torch_view
from .model import FluxDistributedModel

__all__ = ["allreduce", "bcast", "reduce", "synchronize", "normalize_op"]

_OP_NAMES = {"sum": "sum", "+": "sum", "add": "sum", "avg": "avg", "mean": "avg", "max": "max", "min": "min"}


def normalize_op(op):
    """``"sum"``, ``"avg"``, ``"max"`` or ``"min"`` from a name or a builtin."""
    if op is sum or op is operator.add or op is np.add:
        return "sum"
    if op is max or op is np.maximum:
        return "max"
    if op is min or op is np.minimum:
        return "min"
    if op is np.mean:
        return "avg"
    if isinstance(op, str) and op.lower() in _OP_NAMES:
        return _OP_NAMES[op.lower()]
    raise ValueError(f"unknown reduction {op!r}; use 'sum', 'avg', 'max' or 'min' "
                     "(or the builtins sum, max, min)")


# --- one leaf ------------------------------------------------------------------------------------------

def _check_dtype(dtype, op, path, collective):
    if op == "avg" and not _dt.is_floating(dtype):
        raise DTypeError(f"{collective}(op='avg') at `{path or '(the value itself)'}`: the mean of {dtype} values "
                         "is not an integer; convert to a floating type first or use op='sum'")


def _numpy_leaf(b, arr, collective, op, root, write):
    """The collective on a NumPy array: in place when writable."""
    writable = arr.flags.writeable and not any(s == 0 for s, n in zip(arr.strides, arr.shape) if n > 1)
    if writable and arr.flags.c_contiguous:
        if collective == "reduce" and b.rank != root:
            b.host_collective(collective, arr.copy(), op, root)   # non-roots keep their values
        else:
            b.host_collective(collective, arr, op, root)
        return arr
    buf = np.ascontiguousarray(arr).copy() if arr.size else np.empty(arr.shape, arr.dtype)
    b.host_collective(collective, buf, op, root)
    if collective == "reduce" and b.rank != root:
        return arr
    if writable and write:
        arr[...] = buf
        return arr
    return buf


def _device_leaf(b, x, collective, op, root):
    """The collective on a device Tensor ``x``: in device memory when the
    backend can, else staged through the host; written back in place."""
    t = x._data
    keep = collective == "reduce" and b.rank != root
    overlapping = any(s == 0 for s, n in zip(t.stride(), t.shape) if n > 1)
    if b.device_direct(t):
        from ..triton_kernels import copy, launch   # Triton only where a device collective runs
        buf = copy.contiguous(t)
        if keep or overlapping:
            if buf is t:
                buf = copy.copy_into(launch.empty(t.shape, t.dtype, t.device), t)
        b.device_collective(collective, buf, op, root)
        if keep:
            return x
        if overlapping:
            return Tensor._make(buf, x._device)
        if buf is not t:
            copy.copy_into(t, buf)
        return x
    host = torch_to_numpy(t)                         # a dense host copy
    b.host_collective(collective, host, op, root)
    if keep:
        return x
    if overlapping:
        return _to_device(host, x._device)
    t.copy_(torch_view(host))                        # host -> device memory, in place
    return x


def _to_device(arr, device):
    return transfer(Tensor._from_numpy(arr), device)


def collective_on_leaf(b, x, collective, op, root, path):
    """``collective`` (with reduction ``op`` and ``root``) over backend ``b``
    on one leaf ``x`` at ``path``: a Tensor (on its device, in place where
    it can), a NumPy array or a number."""
    if isinstance(x, Tensor):
        if op is not None:
            _check_dtype(x.dtype, op, path, collective)
        if x.size == 0:
            return x
        if isinstance(x._data, np.ndarray):
            out = _numpy_leaf(b, x._data, collective, op, root, True)
            return x if out is x._data else Tensor._from_numpy(out)
        return _device_leaf(b, x, collective, op, root)
    if isinstance(x, np.ndarray):
        if op is not None:
            _check_dtype(x.dtype, op, path, collective)
        if x.size == 0:
            return x
        return _numpy_leaf(b, x, collective, op, root, True)
    if _is_number(x):
        arr = np.array(x)
        if op == "avg" and not _dt.is_floating(arr.dtype):
            arr = arr.astype(np.float64)
        if op is not None:
            _check_dtype(arr.dtype, op, path, collective)
        b.host_collective(collective, arr.reshape(1), op, root)
        if collective == "reduce" and b.rank != root:
            return x
        v = arr.reshape(()).item() if not isinstance(x, np.generic) else arr.reshape(())[()]
        return type(x)(v) if isinstance(x, (bool, int)) and op != "avg" else v
    return x


def _is_number(x):
    """A Python or NumPy real number (or bool): exchanged as a 0-d array."""
    return isinstance(x, (bool, int, float, np.bool_, np.number)) and not isinstance(x, np.complexfloating)


def _walk(x, f, path=""):
    """Apply ``f(leaf, path)`` to every array / number leaf of ``x`` in a
    fixed depth-first order; mutable containers (lists, dicts, layers) are
    updated in place, tuples rebuilt. Returns the new ``x``."""
    if isinstance(x, (Tensor, np.ndarray)) or _is_number(x):
        return f(x, path)
    if is_layer(x):
        for name, v in children(x).items():
            nv = _walk(v, f, path_join(path, name))
            if nv is not v:
                object.__setattr__(x, name, nv)
        return x
    if isinstance(x, list):
        for i, v in enumerate(x):
            nv = _walk(v, f, path_join(path, i))
            if nv is not v:
                x[i] = nv
        return x
    if isinstance(x, tuple):
        items = [_walk(v, f, path_join(path, i)) for i, v in enumerate(x)]
        if all(a is b for a, b in zip(items, x)):
            return x
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, dict):
        for k in list(x.keys()):
            v = x[k]
            nv = _walk(v, f, path_join(path, k))
            if nv is not v:
                x[k] = nv
        return x
    return x


def _collective(backend, x, collective, op, root):
    b = as_backend(backend, collective)
    root = int(root)
    if not 0 <= root < b.world_size:
        raise ValueError(f"{collective}: root {root} is not a rank of this backend (0..{b.world_size - 1})")
    op = None if op is None else _OP_NAMES.get(op) if isinstance(op, str) and op in _OP_NAMES else \
        normalize_op(op)
    if isinstance(x, FluxDistributedModel):
        _walk(x.model, lambda v, p: collective_on_leaf(b, v, collective, op, root, p))
        return x
    return _walk(x, lambda v, p: collective_on_leaf(b, v, collective, op, root, p))


def allreduce(backend, x, op):
    """Reduce ``x`` over all workers with ``op`` ("sum", "avg", "max",
    "min"); every worker gets the result (in place where ``x`` is writable;
    also returned)."""
    return _collective(backend, x, "allreduce", op, 0)


def bcast(backend, x, root=0):
    """Rank ``root``'s ``x`` on every worker (in place; also returned)."""
    return _collective(backend, x, "bcast", None, root)


def reduce(backend, x, op, root=0):
    """Reduce ``x`` over all workers onto rank ``root`` (in place there);
    the other workers' values are left as they were."""
    return _collective(backend, x, "reduce", op, root)


# --- synchronize -----------------------------------------------------------------------------------------

def _describe(v):
    if isinstance(v, Tensor):
        return ("Tensor", tuple(v.shape), str(v.dtype))
    if isinstance(v, np.ndarray):
        return ("ndarray", tuple(v.shape), str(v.dtype))
    return (type(v).__name__, (), "")


def fingerprint(x):
    """``[(path, kind, shape, dtype)]`` for every leaf of ``x``, in the
    order collectives visit them."""
    out = []

    def f(v, p):
        out.append((p or "(the value itself)",) + _describe(v))
        return v
    _walk(x, f)
    return out


def _show(entry):
    if entry is None:
        return "nothing"
    _, kind, shape, dtype = entry
    return f"a {kind} of shape {shape} {dtype}" if dtype else f"a {kind}"


def _first_difference(a, b):
    for i in range(max(len(a), len(b))):
        ea = a[i] if i < len(a) else None
        eb = b[i] if i < len(b) else None
        if ea != eb:
            return ea, eb
    return None


def synchronize(backend, x, root=0):
    """Make ``x`` (a model, an optimiser state, any structure) on every
    worker equal to rank ``root``'s (Flux's ``synchronize!!``): arrays are
    overwritten in place, numbers (such as Adam's step count) replaced;
    returns the synchronized value (for a ``FluxDistributedModel``, the
    model inside it).

    First every worker's structure (paths, shapes, dtypes) is compared with
    the root's; if any worker differs, every worker raises a
    ``DistributedError`` naming the first differing field."""
    b = as_backend(backend, "synchronize")
    root = int(root)
    if not 0 <= root < b.world_size:
        raise ValueError(f"synchronize: root {root} is not a rank of this backend (0..{b.world_size - 1})")
    inner = x.model if isinstance(x, FluxDistributedModel) else x
    mine = fingerprint(inner)
    prints = [pickle.loads(p) for p in b.allgather_bytes(pickle.dumps(mine), "synchronize")]
    for r, theirs in enumerate(prints):
        d = _first_difference(prints[root], theirs)
        if d is not None:
            ea, eb = d
            path = (ea or eb)[0]
            raise DistributedError(
                f"synchronize (on rank {b.rank}): rank {r}'s {type(inner).__name__} does not match rank {root}'s "
                f"(the root) at `{path}`: rank {root} has {_show(ea)}, rank {r} has {_show(eb)}"
                + (f" (rank {r} has `{eb[0]}` there)" if ea and eb and ea[0] != eb[0] else "")
                + ". Every worker must build the same model (same layers, sizes and dtypes) and optimiser "
                "state before synchronizing.")
    return _walk(inner, lambda v, p: collective_on_leaf(b, v, "bcast", None, root, p))
