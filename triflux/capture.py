"""A training step recorded once and replayed: the same kernel launches
without the Python that made them.

An eager step on a GPU spends most of its host time deciding what to launch
(layers, dispatch, the tape, the kernels' host wrappers): tens of
microseconds per launch where the launch itself needs a few. A training
loop makes the same decisions every step, so :class:`CapturedStep` makes
them twice, writes down what came out (every launch with its arguments,
``triflux.recording``) and from the third step on only repeats the
launches, as a CUDA graph does on the device side. On a real GPU each
repeated launch is the compiled kernel's own launcher with its arguments
bound (``triton_kernels.launch.prepare``).

What the step is: a function ``step(batch, index, phase)`` whose device
work happens inside ``phase(name, fn, *args)`` calls (``fn(*args)``,
recorded); the Python between phases runs every step (reading the loss,
checking it, the optimiser's one launch). ``optimise.train_step`` is
written that way, and ``capture_step(loss, model, opt_state)`` captures it.

The rules that make a replay the step it stands for:

* The batch is copied into buffers of the recording, so the user's arrays
  are never written and a new batch reaches the recorded launches.
* Every other array the step reads or writes must stay where it was: the
  parameters and optimiser state are updated in place. Moved state
  (BatchNorm's running statistics, written to new memory that replaces the
  old when the step completes, ``modes.all_or_nothing``) alternates between
  two buffers: a replay reads one and writes the other, and the failed step
  (a NaN loss) leaves the state as it was, as in an eager step.
* Before each replay the guards are checked: the same batch shapes, dtypes
  and devices (else another recording, up to ``max_recordings``), every
  array of the watched structures (model, optimiser state) still the
  memory recorded, the same arrays and train/test modes in the layers
  (looked at again when an attribute of a layer was set), the same layers
  in the containers (``Chain``'s list), the same matmul precision. A guard that fails makes
  the step record again.
* The two recorded steps must agree: the same kernels, grids, sizes and
  host values (a step count or a value read from the data would not
  repeat), no device value read on the host inside a phase and no host
  data copied to the device that differs. The one host value that may
  change is a seed drawn from triflux's random stream (dropout, ``rand``):
  a replay draws as many seeds, in the same order, and launches with them,
  so it is the eager step with the same ``seed(...)``. A step that disagrees, or
  has no launches (the CPU, where the NumPy reference computes), runs
  eagerly: with a warning naming the reason, except on the CPU.

A recording keeps every buffer of the step allocated while it lives (as a
CUDA graph's memory pool does): about one step's activations and gradients.
"""
import warnings

from . import functor, recording
from .constructors import next_seed
from .functor import children, is_layer, leaves
from .matmul_precision import get_matmul_precision
from .modes import all_or_nothing
from .tensor import Tensor


def eager_phase(name, fn, *args):
    """The phase of an eager step: ``fn(*args)``."""
    return fn(*args)


class CapturedStep:
    """``step(batch, index, phase)`` recorded and replayed (see the module).

    ``watched``: the structures whose arrays the step reads and updates in
    place (the model and the optimiser state). Call ``run(batch, index)``
    (or the instance, with the batch's elements as arguments); ``stats``
    counts eager, recorded and replayed steps; ``reasons`` says why a batch
    signature runs eagerly; ``reset()`` forgets every recording (after
    changing the model's structure in a way the guards cannot see)."""

    def __init__(self, step, watched, *, max_recordings=3, name="capture_step"):
        self.step, self.watched, self.name = step, watched, name
        self.max_recordings = max_recordings
        self.reasons = {}
        self.stats = {"eager": 0, "recorded": 0, "replayed": 0}
        self._entries = {}          # signature -> _Pending | _Replay | _EAGER

    def __call__(self, *batch):
        return self.run(batch)

    def reset(self):
        """Forget every recording (their buffers are freed)."""
        self._entries.clear()
        self.reasons.clear()

    def run(self, batch, index=0):
        """One step on ``batch`` (a tuple of the step's arguments after the model)."""
        batch = tuple(batch) if isinstance(batch, tuple) else (batch,)
        signature = _signature(batch)
        entry = self._entries.get(signature) if signature is not None else _EAGER
        if entry is _EAGER:
            self.stats["eager"] += 1
            return self.step(batch, index, eager_phase)
        if isinstance(entry, _Replay):
            if entry.guards_hold():
                self.stats["replayed"] += 1
                return entry.replay(self.step, batch, index)
            del self._entries[signature]
            entry = None
        if entry is None and len(self._entries) >= self.max_recordings:
            self._entries.pop(next(iter(self._entries)))
        staging = entry.staging if entry is not None else [
            Tensor._make(t._data.new_empty(t._data.shape), t._device) if _on_gpu(t) else None for t in batch]
        result, taken = _record(self.step, batch, staging, index)
        self.stats["recorded"] += 1
        seed_slots, reason = {}, None
        if taken.recording.launches:    # what one recording shows at once, then what two show
            reason = _unreplayable(taken) or (entry and _disagreement(entry.taken, taken, seed_slots))
        if not taken.recording.launches:            # the CPU: nothing to replay
            self._entries[signature] = _EAGER
        elif reason:
            self._entries[signature] = _EAGER
            self.reasons[signature] = reason
            warnings.warn(f"{self.name}: this step cannot be replayed, so it runs eagerly every time: {reason}",
                          stacklevel=3)
        elif entry is None:
            self._entries[signature] = _Pending(staging, taken)
        else:
            self._entries[signature] = _Replay(staging, taken, self.watched, seed_slots)
        return result


_EAGER = object()   # a batch signature that runs eagerly


def _on_gpu(t):
    return isinstance(t, Tensor) and not t._device.is_cpu


def _signature(batch):
    """What a recording is good for: each Tensor's shape, dtype and device,
    each plain value itself; None where an element is neither (runs eagerly)."""
    out = []
    for v in batch:
        if isinstance(v, Tensor):
            out.append((v.shape, v.dtype, v._device))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out.append((type(v), v))
        else:
            return None
    return tuple(out)


class _Taken:
    """One recorded step: the recording, each phase's result, the moved
    state ``(owner, memory read, memory written)`` and the staged batch."""

    def __init__(self, recording_, results, moved, staged):
        self.recording, self.results, self.moved, self.staged = recording_, results, moved, staged


def _record(step, batch, staging, index):
    """Run ``step`` eagerly on ``batch`` copied into ``staging``, recording its phases."""
    staged = _stage(batch, staging)
    taken_recording, results = recording.Recording(), {}

    def phase(name, fn, *args):
        with taken_recording.phase(name):
            results[name] = out = fn(*args)
        return out

    with all_or_nothing() as block:
        result = step(staged, index, phase)
        moved = [(owner, owner._data, new._data) for owner, new in block.values()]
    return result, _Taken(taken_recording, results, moved, staged)


def _stage(batch, staging):
    """The batch with its GPU Tensors copied into ``staging``'s."""
    staged = []
    for v, buffer in zip(batch, staging):
        if buffer is None:
            staged.append(v)
        else:
            buffer._data.copy_(v._data)
            staged.append(buffer)
    return tuple(staged)


class _Pending:
    """A batch signature recorded once, waiting for the second recording."""

    def __init__(self, staging, taken):
        self.staging, self.taken = staging, taken


# --- do two recordings agree? ----------------------------------------------------------------

def _name(kernel):
    return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", repr(kernel))


def _same_value(a, b):
    if type(a) is not type(b):
        return False
    if hasattr(a, "data_ptr"):       # a torch tensor: its layout, not its memory
        return (a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                and a.device == b.device)
    return a == b or (a != a and b != b)   # NaN equals NaN here


def _disagreement(first, second, seed_slots):
    """Why two recordings of one batch signature do not describe the same
    launches (None when they do). Arguments that are the seeds the steps
    drew from triflux's random stream (the same ordinal in both) are not a
    disagreement: ``seed_slots`` gets ``{launch: [(argument, ordinal)]}``."""
    a, b = first.recording, second.recording
    # memory made before the second step must be the memory the first read, but for moved state,
    # which the first step wrote (new memory) and the second reads
    moved_on = {(read.untyped_storage().data_ptr(), written.untyped_storage().data_ptr())
                for _, read, written in first.moved}
    if a.phases.keys() != b.phases.keys() or [e - s for s, e in a.phases.values()] != \
            [e - s for s, e in b.phases.values()]:
        return (f"the two steps made different launches ({len(a.launches)} and {len(b.launches)}): the "
                "Python took another path the second time")
    for i, (la, lb) in enumerate(zip(a.launches, b.launches)):
        kernel = _name(la[0])
        if la[0] is not lb[0] or la[1] != lb[1]:
            return f"launch {i} differs between two steps ({kernel} on {la[1]}, then {_name(lb[0])} on {lb[1]})"
        if len(la[2]) != len(lb[2]) or la[3].keys() != lb[3].keys():
            return f"launch {i} ({kernel}) has other arguments in the second step"
        for k, (u, v) in enumerate(zip(la[2], lb[2])):
            if _same_value(u, v):
                if hasattr(v, "data_ptr") and v.untyped_storage().data_ptr() not in b.allocated \
                        and u.data_ptr() != v.data_ptr() \
                        and (u.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()) not in moved_on:
                    return (f"argument {k} of launch {i} ({kernel}) is a tensor made before the step that "
                            f"differs between steps ({_show(v)}: a constant or an array chosen per step on "
                            "the host) and would repeat")
                continue
            ordinal = _seed_ordinal(a, u)
            if ordinal is None or ordinal != _seed_ordinal(b, v):
                return (f"argument {k} of launch {i} ({kernel}) changes between steps ({_show(u)}, then "
                        f"{_show(v)}): a value decided on the host per step (a step count, a value of the "
                        "data, a random number not from triflux's stream) would repeat")
            seed_slots.setdefault(i, []).append((k, ordinal))   # the replay draws it anew
        for key in la[3]:
            if not _same_value(la[3][key], lb[3][key]):
                return f"{key} of launch {i} ({kernel}) changes between steps ({la[3][key]!r}, then {lb[3][key]!r})"
    if len(a.seeds) != len(b.seeds):
        return f"the two steps drew {len(a.seeds)} and {len(b.seeds)} random seeds"
    if not set(b.uploads) <= set(a.uploads):
        return ("the step copies host data to the device that differs between steps (a NumPy array or list "
                "made inside the loss or the model, `gpu(...)` of new data): a replay would repeat the first "
                "copy; move that data into the batch")
    if [m[1].shape for m in first.moved] != [m[1].shape for m in second.moved]:
        return "the step moves other state the second time"
    return None


def _seed_ordinal(rec, value):
    """Which of ``rec``'s seeds ``value`` is (None: an argument, not a seed)."""
    if type(value) is int and value in rec.seeds:
        return rec.seeds.index(value)
    return None


def _show(v):
    return f"a {tuple(v.shape)} {v.dtype} tensor" if hasattr(v, "data_ptr") else repr(v)


def _unreplayable(taken):
    """Why one recording cannot be replayed on its own (None when it can)."""
    rec = taken.recording
    if rec.host_reads:
        return (f"a device value is read on the host inside the step ({rec.host_reads[0]}: `.numpy()`, "
                "`.item()`, `float(...)`), and the Python that uses it would not run in a replay")
    if rec.device_copies:
        return f"the step copies between devices ({rec.device_copies[0]})"
    for owner, read, written in taken.moved:
        if read.stride() != written.stride() or read.untyped_storage().nbytes() != written.untyped_storage().nbytes():
            return "moved state whose new memory has another layout than the old"
    return None


# --- the replay ---------------------------------------------------------------------------------

class _Replay:
    """A recorded step ready to repeat: per phase the prepared launches of
    both parities (moved state read from one buffer and written to the
    other, alternately), and the guards."""

    def __init__(self, staging, taken, watched, seed_slots):
        from .triton_kernels import launch    # a recording with launches: the kernels are loaded
        self.staging, self.taken, self.watched, self._launch = staging, taken, watched, launch
        rec = taken.recording
        moved = taken.moved
        # after the recorded step the owners hold the memory it wrote: the next replay reads that
        swaps = {}
        for _, read, written in moved:
            swaps[read.untyped_storage().data_ptr()] = (read, written)
            swaps[written.untyped_storage().data_ptr()] = (written, read)
        args_of_first = rec.launches[0][2]
        self.runs, self.seeded = [], []
        for parity in (0, 1):
            per_phase, seeded = {}, {}
            for name, (start, _) in rec.phases.items():
                runs, slots = [], []
                for j, (kernel, grid, args, meta, compiled) in enumerate(rec.phase_launches(name)):
                    if parity == 0:
                        args = tuple(_swapped(a, swaps) for a in args)
                    with launch.on_gpu_of(args):
                        runs.append(launch.prepare(kernel, grid, args, meta, compiled))
                    if start + j in seed_slots:     # prepared again with the seeds each replay draws
                        slots.append((j, seed_slots[start + j], (kernel, grid, args, meta, compiled)))
                per_phase[name] = runs
                seeded[name] = slots
            self.runs.append(per_phase)
            self.seeded.append(seeded)
        self.n_seeds = len(rec.seeds)
        self.device_args = args_of_first
        self.parity = 0
        owners = {id(owner) for owner, _, _ in moved}
        arrays = leaves(watched)
        tensors = [t for t in arrays if isinstance(t, Tensor) and id(t) not in owners]
        self.fixed = [(t, t._data) for t in tensors]
        layers, self.containers = _layers_and_containers(watched)
        self.modes = [(layer, layer.active) for layer in layers if "active" in vars(layer)]
        self.leaf_ids = set(map(id, arrays))
        self.writes = functor.ATTRIBUTE_WRITES
        self.precision = get_matmul_precision()

    def guards_hold(self):
        """Whether the recording still describes this step (see the module)."""
        if get_matmul_precision() != self.precision:
            return False
        for t, data in self.fixed:
            if t._data is not data:
                return False
        expect = 2 if self.parity == 0 else 1      # owners hold the memory the last step wrote
        for moved in self.taken.moved:
            if moved[0]._data is not moved[expect]:
                return False
        for container, items in self.containers:
            if len(container) != len(items) or any(a is not b for a, b in zip(_items(container), items)):
                return False
        if functor.ATTRIBUTE_WRITES != self.writes:   # some layer's attribute was set: a new array, a mode?
            if (any(layer.active != active for layer, active in self.modes)
                    or {id(t) for t in leaves(self.watched)} != self.leaf_ids):
                return False
            self.writes = functor.ATTRIBUTE_WRITES
        return True

    def replay(self, step, batch, index):
        staged = _stage(batch, self.staging)
        runs, results, launch = self.runs[self.parity], self.taken.results, self._launch
        if self.n_seeds:        # new seeds from triflux's stream, as many and in the order the step draws them
            runs = self._reseeded(runs, [next_seed() for _ in range(self.n_seeds)])

        def phase(name, fn, *args):
            launch.run_prepared(runs[name], self.device_args)
            return results[name]

        result = step(staged, index, phase)
        written = 1 if self.parity == 0 else 2
        for moved in self.taken.moved:
            moved[0]._data = moved[written]
        self.parity ^= 1
        return result

    def _reseeded(self, runs, seeds):
        """``runs`` with every launch that takes a seed prepared anew with ``seeds``."""
        out = {}
        for name, phase_runs in runs.items():
            phase_runs = list(phase_runs)
            for j, slots, (kernel, grid, args, meta, compiled) in self.seeded[self.parity][name]:
                args = list(args)
                for k, ordinal in slots:
                    args[k] = seeds[ordinal]
                with self._launch.on_gpu_of(args):
                    phase_runs[j] = self._launch.prepare(kernel, grid, tuple(args), meta, compiled)
            out[name] = phase_runs
        return out


def _swapped(a, swaps):
    """``a`` with memory of a moved state's one buffer read from the other instead."""
    if not hasattr(a, "untyped_storage"):
        return a
    found = swaps.get(a.untyped_storage().data_ptr())
    if found is None:
        return a
    this, other = found
    offset = (a.data_ptr() - this.data_ptr()) // a.element_size()
    return other.as_strided(a.size(), a.stride(), other.storage_offset() + offset)


def _items(container):
    return list(container.values()) if isinstance(container, dict) else list(container)


def _layers_and_containers(x):
    """Every layer in the structure ``x``, and every list or dict held by a
    layer with a snapshot of its items (``Chain``'s ``layers``)."""
    layers, containers, seen = [], [], set()

    def walk(v, in_layer):
        if id(v) in seen:
            return
        seen.add(id(v))
        if is_layer(v):
            layers.append(v)
            for c in children(v).values():
                walk(c, True)
        elif isinstance(v, (tuple, list, dict)):
            if in_layer and not isinstance(v, tuple):
                containers.append((v, _items(v)))
            for c in (v.values() if isinstance(v, dict) else v):
                walk(c, in_layer)
    walk(x, False)
    return layers, containers
