"""Recording one training step as the launches it makes, without running a
kernel (:func:`record_step`), each tagged with the primitive call it belongs
to (:class:`PrimitiveCall`), and the FLOPs and bytes of each
:class:`Launch`: a primitive's FLOPs as its registration declares them
(:func:`primitive_flops`), spread over its launches by bytes."""
import dataclasses
import math
import os
import sys
from collections import defaultdict

from triflux import registry
from triflux.gpus import ASSUMED_GPU, GPUS
from triflux.primitives import REGISTRY
from .specializations import Specialization, source_fingerprint, specialization
from .workloads import WORKLOADS


@dataclasses.dataclass
class PrimitiveCall:
    """One call of a primitive's kernel function: ``name``, ``direction``,
    the shapes of its tensor inputs (for backward: grad, out, inputs...),
    attrs; ``flops`` is set when it returns."""
    name: str
    family: str
    direction: str
    shapes: list
    attrs: dict
    flops: float = 0.0
    tensors: list = dataclasses.field(default_factory=list)   # [(dtype, bytes)] it reads and writes (forward)

    def label(self):
        return f"{self.name} {self.direction}"


@dataclasses.dataclass
class Launch:
    kernel: object                 # the jitted function
    spec: Specialization
    programs: int
    tensors: list                  # [(NumPy dtype name, bytes)] of the distinct tensor arguments
    call: PrimitiveCall = None
    flops: float = 0.0
    indirect: list = dataclasses.field(default_factory=list)   # [(dtype, bytes)] reached through a table

    @property
    def bytes(self):
        return sum(b for _, b in self.tensors) + sum(b for _, b in self.indirect)


def _clear_host_plans():
    """Empty the kernels' cached host-side plans (``lru_cache``d functions of
    the kernel modules): they hold tiles and constexprs chosen for the
    interpreter or for a GPU, and recording switches between the two. (Run
    :func:`record_step` in a process of its own all the same, as the command
    does: other caches may hold such choices too.)"""
    for name, module in list(sys.modules.items()):
        if name.startswith("triflux.triton_kernels") and module is not None:
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def _tensor_list(args):
    """[(dtype name, bytes)] of the distinct tensors among ``args``."""
    import torch
    seen, out = set(), []
    for a in args:
        if isinstance(a, torch.Tensor):
            key = (a.data_ptr(), tuple(a.shape), tuple(a.stride()), a.dtype)
            if key not in seen:
                seen.add(key)
                out.append((str(a.dtype).replace("torch.", ""), a.numel() * a.element_size()))
    return out


def _programs(grid, args, meta, kernel):
    if callable(grid):
        grid = grid({**dict(zip(kernel.arg_names, args)), **meta})
    if isinstance(grid, int):
        return grid
    return math.prod(int(g) for g in grid)


def _shape(v):
    """The shape of a tensor, a list of the shapes of a list of tensors (the
    ``foreach`` form of an update), else None."""
    if hasattr(v, "shape"):
        return tuple(v.shape)
    if isinstance(v, (list, tuple)) and v and all(hasattr(t, "shape") for t in v):
        return [tuple(t.shape) for t in v]
    if isinstance(v, (list, tuple)):       # a backward's tuple of gradients: the first
        return next((tuple(t.shape) for t in v if hasattr(t, "shape")), None)
    return None


INTERPRETER_NOTE = ("note: TRITON_INTERPRET was not set; set to 1 in this process to record the step on the "
                    "interpreter's CUDA device (no kernel runs)")


def ensure_interpreter():
    """Switch the Triton interpreter on (before triton is imported); True when
    this call did so. Raises when triton is already imported without it."""
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        return False
    if "triton" in sys.modules:
        raise RuntimeError("the kernel report records a step on the Triton interpreter's CUDA device, but "
                           "triton was imported with TRITON_INTERPRET off; set TRITON_INTERPRET=1 first")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def record_step(workload="unet", dtype="float32", batch=None, size=None, gpu=ASSUMED_GPU):
    """The launches of one training step of ``workload`` (after one warm-up
    step) on the GPU ``gpu`` (a name in :data:`GPUS`: its SM count sizes the
    grids), kernels not run, tagged with their primitive calls."""
    ensure_interpreter()
    from triflux.triton_kernels import launch as launcher
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; available: {', '.join(WORKLOADS)}")
    launches, calls = [], []
    recording = {"on": False}

    def record(kernel, grid, *args, **meta):
        if recording["on"]:
            launches.append(Launch(kernel, specialization(kernel, args, meta), _programs(grid, args, meta, kernel),
                                   _tensor_list(list(args) + list(meta.values())), calls[-1] if calls else None))

    original_kernel = registry.Primitive.kernel

    def traced_kernel(prim, direction="forward"):
        fn = original_kernel(prim, direction)

        def traced(*args, **attrs):
            call = PrimitiveCall(prim.name, prim.family, direction, [_shape(a) for a in args],
                                 {k: v for k, v in attrs.items() if k != "device"})
            calls.append(call)
            try:
                out = fn(*args, **attrs)
            finally:
                calls.pop()
            call.flops = primitive_flops(call, out)
            if direction != "backward":      # a forward or an update reads all it is given
                call.tensors = _tensor_list(_flat(args) + _flat(out))
            return out
        return traced

    sms = GPUS[gpu].sms
    saved = (launcher.launch, launcher.INTERPRET, launcher.sm_count)
    launcher.launch, launcher.INTERPRET, launcher.sm_count = record, False, lambda device_index: sms
    registry.Primitive.kernel = traced_kernel
    _clear_host_plans()
    try:
        step = WORKLOADS[workload][1](dtype, batch, size)
        step()
        recording["on"] = True
        step()
    finally:
        launcher.launch, launcher.INTERPRET, launcher.sm_count = saved
        registry.Primitive.kernel = original_kernel
        _clear_host_plans()
    _attribute_to_launches(launches)
    return launches


# --- FLOPs, attributed to the launches ------------------------------------------------------------

def primitive_flops(call, out=None):
    """Floating-point operations of one primitive call (see the package's
    docstring), as its registration declares them (``flops``: exact for
    contractions, a few per element for the rest). A call whose arguments do
    not have the declared form (a kernel function changed its signature)
    counts one per element of its largest tensor."""
    backward = call.direction == "backward"
    inputs = call.shapes[2:] if backward else call.shapes
    out_shape = call.shapes[1] if backward else _shape(out)
    if isinstance(out_shape, list):          # several outputs: the first
        out_shape = out_shape[0]
    largest = max([_elements(s) for s in call.shapes + [out_shape]] or [0])
    try:
        return REGISTRY[call.name].count_flops(call.direction, inputs, out_shape, call.attrs, largest)
    except (TypeError, IndexError, ValueError):
        return largest


def _elements(shape):
    """Elements of a shape, of a list of shapes (a list of tensors), 0 for None."""
    if shape is None:
        return 0
    if isinstance(shape, list):
        return sum(_elements(s) for s in shape)
    return math.prod(shape)


def _attribute_to_launches(launches):
    """Each primitive call's FLOPs onto its launches, by bytes, among those
    whose kernel contains a dot when there are any; and the bytes of a
    forward or update call's own tensors that its launches do not pass as
    arguments (reached through an address table) onto its launches, by programs."""
    by_call = defaultdict(list)
    for ln in launches:
        if ln.call is not None:
            by_call[id(ln.call)].append(ln)
    dots = {}
    for group in by_call.values():
        call = group[0].call
        missing = sum(b for _, b in call.tensors) - sum(ln.bytes for ln in group)
        if missing > 0:
            programs = sum(ln.programs for ln in group) or 1
            per_dtype = defaultdict(int)
            for dt, b in call.tensors:
                per_dtype[dt] += b
            total = sum(per_dtype.values())
            for ln in group:
                ln.indirect = [(dt, missing * ln.programs / programs * b / total) for dt, b in per_dtype.items()]
        for ln in group:
            if ln.kernel not in dots:
                dots[ln.kernel] = source_fingerprint(ln.kernel)[1]
        heavy = [ln for ln in group if dots[ln.kernel]] or group
        total = sum(ln.bytes for ln in heavy) or len(heavy)
        for ln in heavy:
            ln.flops = call.flops * (ln.bytes or 1) / total


def _flat(value):
    """``value`` as a list, lists and tuples flattened one level (a foreach call's lists of tensors)."""
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in (item if isinstance(item, (list, tuple)) else [item])]
    return [value]
