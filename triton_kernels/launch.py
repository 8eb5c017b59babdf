"""How kernels get memory and run: allocation, block sizes and the launch
wrapper that turns backend failures into triflux errors.

torch is used here for exactly two things: allocating device memory
(``torch.empty``) and, in ``launch``, selecting the GPU that holds the
arguments. Everything that computes is Triton.

On a real GPU, ``launch`` sends repeat launches of a kernel specialization
straight to the compiled kernel (:class:`DirectLauncher`), skipping Triton's
generic argument binder; the interpreter launches as ``kernel[grid](...)``.
"""
from contextlib import nullcontext
from functools import lru_cache, partial
from itertools import compress, repeat
from operator import and_, attrgetter

import torch
import triton.language as tl

from triflux import backend, recording
from triflux.errors import NoGPUError
from triflux.gpus import ASSUMED_GPU, GPUS, SATURATING_WARPS
from triflux.memory import is_out_of_memory, out_of_memory

INTERPRET = backend.interpreter_on()


@lru_cache(maxsize=None)
@lru_cache(maxsize=None)
def sm_count(device_index):
    """SMs of the GPU ``device_index``, for host plans that size a grid to the
    GPU; the assumed GPU's (``triflux.gpus.ASSUMED_GPU``) where none answers
    (the interpreter records the launches a real GPU would get). Asked once
    per GPU: host plans ask it per launch."""
    if INTERPRET or not torch.cuda.is_available():
        return GPUS[ASSUMED_GPU].sms
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


def wave_efficiency(programs, num_warps, registers, sms, gpu=GPUS[ASSUMED_GPU]):
    """The share of the GPU time a grid of ``programs`` uses, by the kernel
    report's wave model: an SM runs min(resident, SATURATING_WARPS / num_warps)
    programs at full rate (resident: the GPU's warps and registers per SM,
    registers allocated per warp in units of 256), and a launch pays for
    whole rounds of ``sms`` times that many programs."""
    registers_per_warp = -(-registers * 32 // 256) * 256
    resident = min(gpu.max_warps_per_sm // num_warps, gpu.regs_per_sm // (registers_per_warp * num_warps))
    per_round = sms * max(1, min(resident, SATURATING_WARPS // num_warps))
    return programs / (cdiv(programs, per_round) * per_round)


def numel(shape):
    """Number of elements of ``shape`` (any iterable of sizes)."""
    n = 1
    for size in shape:
        n *= int(size)
    return n


def next_pow2(n):
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def block_for(n, gpu_block=1024):
    """Elements per program. The interpreter pays ~1 ms per program, so there
    one program takes as much as it can (NumPy vectorises inside it)."""
    if INTERPRET:
        return min(next_pow2(max(n, 1)), 1 << 16)
    return gpu_block


def cdiv(a, b):
    """ceil(a / b) for positive integers: the programs that cover ``a`` items ``b`` at a time."""
    return (a + b - 1) // b


def empty(shape, dtype, device):
    """Uninitialised device memory (``dtype``: a torch dtype). Running out of
    device memory raises triflux's ``OutOfMemoryError`` (bytes asked for,
    bytes free, advice)."""
    try:
        # size= by keyword: torch parses it faster than a positional tuple (about 1 µs of 3)
        out = torch.empty(size=shape if isinstance(shape, tuple) else tuple(shape), dtype=dtype, device=device)
    except RuntimeError as e:       # torch.OutOfMemoryError is a RuntimeError
        if not is_out_of_memory(e):
            raise
        raise out_of_memory(e, shape, dtype, device) from None
    if recording.ACTIVE is not None:
        recording.note_allocation(out)
    return out


#: more than one GPU visible (then ``launch`` selects the tensors' GPU); None until first asked
_MULTI_GPU = None


def _multi_gpu():
    global _MULTI_GPU
    if _MULTI_GPU is None:
        try:
            _MULTI_GPU = (not INTERPRET) and torch.cuda.is_available() and torch.cuda.device_count() > 1
        except Exception:
            _MULTI_GPU = False
    return _MULTI_GPU


def _gpu_index(args):
    """The GPU index of the first tensor among ``args`` (``None``: none on a GPU)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            i = a.get_device()          # -1 on the CPU; cheaper than building a.device
            return i if i >= 0 else None
    return None


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)`` on the GPU that holds the tensor
    arguments (with several GPUs), with backend failures made readable.
    On a real GPU a repeat launch goes straight to the compiled kernel.
    Inside a step being recorded (``triflux.recording``) the launch is
    written down as well."""
    run = _direct_launcher() or _generic_launch
    try:
        if _MULTI_GPU or (_MULTI_GPU is None and _multi_gpu()):
            idx = _gpu_index(args)
            if idx is not None and idx != torch.cuda.current_device():
                with torch.cuda.device(idx):
                    compiled = run(kernel, grid, args, meta)
            else:
                compiled = run(kernel, grid, args, meta)
        else:
            compiled = run(kernel, grid, args, meta)
    except RuntimeError as e:
        raise readable_failure(e, args) from None
    if recording.ACTIVE is not None:
        recording.note_launch(kernel, grid, args, meta, compiled)
    return compiled


def readable_failure(error, args):
    """The triflux error for a backend failure ``error`` of a launch with
    ``args`` (no GPU driver, out of memory), or ``error`` itself."""
    msg = str(error)
    if "active drivers" in msg or "no CUDA-capable device" in msg or "driver" in msg.lower() and "found" in msg.lower():
        return NoGPUError(
            "no GPU backend is functional here (Triton found no GPU driver). "
            "Use the CPU device (`cpu(x)`), or set TRITON_INTERPRET=1 before importing "
            "triflux to run the kernels in the Triton interpreter.")
    if is_out_of_memory(error):
        idx = _gpu_index(args)
        return out_of_memory(error, device=None if idx is None else torch.device("cuda", idx))
    return error


# --- recorded launches, repeated (triflux.capture) ---------------------------------------------

def prepare(kernel, grid, args, meta, compiled):
    """The recorded launch ``kernel[grid](*args, **meta)`` (which returned
    ``compiled``) as a callable of no arguments that repeats it: on a real
    GPU the compiled kernel's own launcher with every value bound (none of
    Triton's binder, specializer or cache lookup runs again, nor this
    module's key); elsewhere Triton's way. Prepare on the GPU the launch
    runs on (``on_gpu_of``): the stream is that device's current one."""
    direct = _direct_launcher()
    bound = direct.bound(kernel, grid, args, meta, compiled) if direct else None
    return bound or partial(_generic_launch, kernel, grid, args, meta)


def on_gpu_of(args):
    """A context in which the current GPU is the one holding the first tensor of ``args``."""
    if _MULTI_GPU or (_MULTI_GPU is None and _multi_gpu()):
        idx = _gpu_index(args)
        if idx is not None and idx != torch.cuda.current_device():
            return torch.cuda.device(idx)
    return nullcontext()


def run_prepared(runs, args):
    """Call every prepared launch of ``runs`` in order (on the GPU of the
    tensors among ``args``), with backend failures made readable."""
    try:
        with on_gpu_of(args):
            for run in runs:
                run()
    except RuntimeError as e:
        raise readable_failure(e, args) from None


def _generic_launch(kernel, grid, args, meta):
    """Triton's own launch: bind, specialize, look up (or compile), run."""
    return kernel[grid](*args, **meta)


# --- direct launch of compiled kernels (real GPUs) -----------------------------------------

#: the Triton versions whose launch sequence DirectLauncher repeats (JITFunction.run's
#: last call, CompiledKernel's fields, the argument specialization): checked in 3.6 and 3.9
DIRECT_LAUNCH_VERSIONS = ((3, 6), (3, 9))

#: the scalar types whose values the direct launcher keys on (with the type: ``1``, ``1.0`` and
#: ``True`` compare equal but compile differently); floats key by type only, as Triton's do
_KEYED_BY_VALUE = (bool, int, str, type(None), torch.dtype, tl.dtype)


class ArgLayout:
    """Where the tensors are among a kernel's positional arguments of given
    types, and which arguments key by value, for :meth:`key`; None from
    :meth:`of` where some argument is of another kind (the launch goes
    Triton's way)."""

    def __init__(self, tensors, by_value):
        self.tensors, self.by_value = tensors, by_value

    @classmethod
    def of(cls, params, types):
        """The layout of arguments of ``types`` for the parameters ``params``."""
        tensors, by_value = [], []
        for param, kind in zip(params, types):
            is_tensor = issubclass(kind, torch.Tensor)
            scalar = kind is float or issubclass(kind, _KEYED_BY_VALUE)
            if not (is_tensor or scalar) or (is_tensor and param.is_constexpr):
                return None
            tensors.append(is_tensor)
            # constexprs compile per value, floats never; ints key by value, finer than Triton's classes
            by_value.append(param.is_constexpr or (scalar and kind is not float))
        return cls(tuple(tensors), tuple(by_value))

    def key(self, args):
        """What tells these arguments apart from others of the same types: the
        values of the non-float scalars and constexprs, each tensor's dtype
        and address modulo 16 (C-level iteration: this runs on every launch)."""
        tensors = tuple(compress(args, self.tensors))
        return (tuple(compress(args, self.by_value)), tuple(map(_DTYPE, tensors)),
                tuple(map(and_, map(torch.Tensor.data_ptr, tensors), repeat(15))))


_DTYPE = attrgetter("dtype")


def meta_key(meta):
    """The keyword values with their types; raises :class:`Ineligible` for a
    value of another kind than :data:`_KEYED_BY_VALUE` or float."""
    types = tuple(map(type, meta.values()))
    if types not in _META_TYPES_SEEN:
        for kind in types:
            if kind is not float and not issubclass(kind, _KEYED_BY_VALUE):
                raise Ineligible(kind.__name__)
        _META_TYPES_SEEN.add(types)
    return tuple(meta.items()), types


#: the tuples of keyword value types meta_key has accepted
_META_TYPES_SEEN = set()


class Ineligible(Exception):
    """A launch the direct launcher leaves to Triton (an unusual argument)."""


def _no_hook(hook):
    """True for an unset launch hook (None, or an empty HookChain)."""
    return hook is None or getattr(hook, "calls", None) == []


class DirectLauncher:
    """Repeat launches of a compiled kernel specialization without Triton's
    generic binder.

    ``kernel[grid](*args, **meta)`` makes Triton bind the arguments to the
    kernel's parameters, specialize each (a tensor by its dtype and whether
    its address is a multiple of 16, an int by its width, whether it is 1
    and whether a multiple of 16, a constexpr by its value), look the
    compiled kernel up (or compile it) and run it. The first launch of each
    key here goes that way and keeps the CompiledKernel it returns; a repeat
    launch calls that kernel's launcher with the grid, the current stream and
    every parameter's value (the arguments, then the keywords and defaults),
    as ``JITFunction.run`` ends.

    The key is finer than Triton's specialization, so it never picks a
    kernel compiled for other arguments: the kernel, the current device,
    Triton's option switches, the types of the arguments, the values of all
    but floats and tensors (an int that changes on every launch, such as a
    seed, goes Triton's way every time), each tensor's dtype and address
    modulo 16, the keywords with their types. Left to Triton: other kernel
    kinds (autotuned, heuristics, the interpreter's), grid functions,
    pre-run and launch hooks, arguments of other kinds. If a direct launch
    fails where Triton's then succeeds, direct launching turns off for good
    (``disabled`` says why).

    ``jit_type``, ``compiled_type``, ``driver`` and ``knobs`` are Triton's
    JITFunction, CompiledKernel, ``triton.runtime.driver`` and ``triton.knobs``
    (fakes in the tests).
    """

    def __init__(self, jit_type, compiled_type, driver, knobs, max_entries=4096):
        self.jit_type, self.compiled_type = jit_type, compiled_type
        self.driver, self.knobs = driver, knobs
        self.max_entries = max_entries
        #: key -> (kernel, compiled kernel, the values of the parameters after the positional ones)
        self.compiled = {}
        #: (id(kernel), argument types) -> ArgLayout or None, and the kernels they are of
        self.layouts = {}
        self.disabled = None
        self.direct_launches = 0

    def eligible(self, kernel, grid):
        """Whether this launch may go direct (else Triton's way, always)."""
        runtime = self.knobs.runtime
        return (not self.disabled and type(kernel) is self.jit_type and not kernel.pre_run_hooks
                and type(grid) is tuple and 1 <= len(grid) <= 3
                and runtime.add_stages_inspection_hook is None
                and _no_hook(runtime.launch_enter_hook) and _no_hook(runtime.launch_exit_hook))

    def options_state(self):
        """Triton's switches that enter its compile-cache key besides the arguments."""
        compilation = self.knobs.compilation
        return (self.knobs.runtime.debug, compilation.instrumentation_mode,
                getattr(compilation, "fpsan_homomorphic_casts", None))

    def key(self, kernel, args, meta):
        """The key of this launch (see the class), or None: Triton's way."""
        types = tuple(map(type, args))
        found = self.layouts.get((id(kernel), types))
        if found is None:
            layout = ArgLayout.of(kernel.params, types) if len(args) <= len(kernel.params) else None
            self.layouts[id(kernel), types] = found = (layout, kernel)   # holding the kernel keeps its id its own
        layout = found[0]
        if layout is None:
            return None
        try:
            return (id(kernel), self.driver.active.get_current_device(), self.options_state(), types,
                    layout.key(args), meta_key(meta))
        except Ineligible:
            return None

    def __call__(self, kernel, grid, args, meta):
        if not self.eligible(kernel, grid):
            return kernel[grid](*args, **meta)
        key = self.key(kernel, args, meta)
        try:
            entry = None if key is None else self.compiled.get(key)
        except TypeError:               # an unhashable value
            key = entry = None
        if entry is None:
            compiled = kernel[grid](*args, **meta)
            if key is not None:
                self._keep(key, kernel, compiled, len(args), meta)
            return compiled
        try:
            return self._run(entry[1], grid, key[1], args + entry[2])
        except Exception as e:
            compiled = kernel[grid](*args, **meta)   # an error of the launch itself raises here
            self.disabled = f"a direct launch of {getattr(kernel, '__name__', kernel)} failed: {e!r}"
            self.compiled.clear()
            return compiled

    def _keep(self, key, kernel, compiled, n_args, meta):
        """Keep ``compiled`` for ``key`` when it is a CompiledKernel and every
        parameter after the positional ones has a keyword value or a default."""
        tail = self._tail(kernel, n_args, meta) if type(compiled) is self.compiled_type else None
        if tail is None:
            return
        if len(self.compiled) >= self.max_entries:
            self.compiled.clear()
            self.layouts.clear()
        self.compiled[key] = (kernel, compiled, tail)

    @staticmethod
    def _tail(kernel, n_args, meta):
        """The values of ``kernel``'s parameters after the first ``n_args``:
        from ``meta`` or their defaults (None if one has neither)."""
        tail = []
        for param in kernel.params[n_args:]:
            if param.name in meta:
                tail.append(meta[param.name])
            elif param.has_default:
                tail.append(param.default)
            else:
                return None
        return tuple(tail)

    def bound(self, kernel, grid, args, meta, compiled):
        """The launch of ``compiled`` on ``grid`` with ``args`` and ``meta``
        as a callable of no arguments, on the current device's current
        stream (taken now); None where the launch must go Triton's way."""
        if not self.eligible(kernel, grid) or type(compiled) is not self.compiled_type:
            return None
        tail = self._tail(kernel, len(args), meta)
        if tail is None:
            return None
        try:
            meta_key(meta)
        except Ineligible:
            return None
        stream = self.driver.active.get_current_stream(self.driver.active.get_current_device())
        runtime = self.knobs.runtime
        return partial(compiled.run, *grid, *(1,) * (3 - len(grid)), stream, compiled.function,
                       compiled.packed_metadata, None, runtime.launch_enter_hook, runtime.launch_exit_hook,
                       *args, *tail)

    def _run(self, compiled, grid, device, bound):
        """``compiled`` on ``grid`` with every parameter's value ``bound``, as
        JITFunction.run ends (the launch metadata only feeds launch hooks: none here)."""
        stream = self.driver.active.get_current_stream(device)
        grid_0, grid_1, grid_2 = grid + (1,) * (3 - len(grid))
        runtime = self.knobs.runtime
        compiled.run(grid_0, grid_1, grid_2, stream, compiled.function, compiled.packed_metadata, None,
                     runtime.launch_enter_hook, runtime.launch_exit_hook, *bound)
        self.direct_launches += 1
        return compiled


#: the process's DirectLauncher; False where launches go Triton's way (the interpreter,
#: a Triton version not checked); None until first asked
_DIRECT = None


def _direct_launcher():
    global _DIRECT
    if _DIRECT is None:
        _DIRECT = make_direct_launcher() or False
    return _DIRECT


def make_direct_launcher():
    """A DirectLauncher over the installed Triton, or None where launches go
    Triton's own way: the interpreter, or a Triton version outside
    ``DIRECT_LAUNCH_VERSIONS``."""
    if INTERPRET:
        return None
    import triton
    from triton import knobs
    from triton.compiler import CompiledKernel
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    try:
        version = tuple(int(v) for v in triton.__version__.split(".")[:2])
    except ValueError:
        return None
    if not DIRECT_LAUNCH_VERSIONS[0] <= version <= DIRECT_LAUNCH_VERSIONS[1]:
        return None
    return DirectLauncher(JITFunction, CompiledKernel, driver, knobs)
