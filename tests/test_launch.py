"""The direct launcher: on a real GPU, repeat launches of a kernel
specialization call the compiled kernel without Triton's generic binder.

No GPU is needed: a fake JIT function and compiled kernel stand in for
Triton's (the attributes and the call that ``JITFunction.run`` makes, as in
Triton 3.6-3.9), and the specialization key is checked against Triton's own
specializer where that is importable. The last test runs a small training
step with the kernels recorded, not run, and checks that every launch could
go direct and that a second step finds every specialization cached.
"""
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

import triflux as tf  # noqa: E402
from triflux import losses, models, optimise, recording  # noqa: E402
from triflux.triton_kernels import launch  # noqa: E402


# --- fakes of Triton's JITFunction, CompiledKernel, driver and knobs --------------------------

class Param:
    """Triton's KernelParam: name, is_constexpr, has_default, default."""

    def __init__(self, name, constexpr=False, default=None, has_default=False):
        self.name, self.is_constexpr, self.default, self.has_default = name, constexpr, default, has_default


class FakeCompiled:
    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "cu-function", ("packed",)
        self.fail = None

    def run(self, *call):
        if self.fail:
            raise self.fail
        self.log.append(("direct",) + call)


class FakeJIT:
    """``kernel[grid](*args, **meta)`` records a generic launch and returns its compiled kernel."""

    def __init__(self, params, log, compiled_type=FakeCompiled):
        self.params, self.log, self.pre_run_hooks = params, log, []
        self.compiled = {}
        self.compiled_type = compiled_type
        self.fail = None

    def __getitem__(self, grid):
        def run(*args, **meta):
            if self.fail:
                raise self.fail
            self.log.append(("generic", grid, args, meta))
            return self.compiled_type(self.log)
        return run


class HookChain:
    def __init__(self):
        self.calls = []


def fake_triton(device=0):
    """(driver, knobs) as triton.runtime.driver and triton.knobs look to the launcher."""
    active = types.SimpleNamespace(get_current_device=lambda: state.device,
                                   get_current_stream=lambda d: f"stream-{d}")
    state = types.SimpleNamespace(device=device)
    driver = types.SimpleNamespace(active=active)
    knobs = types.SimpleNamespace(
        runtime=types.SimpleNamespace(debug=False, add_stages_inspection_hook=None,
                                      launch_enter_hook=HookChain(), launch_exit_hook=HookChain()),
        compilation=types.SimpleNamespace(instrumentation_mode=""))
    return driver, knobs, state


#: a kernel (x_pointer, y_pointer, n, scale, BLOCK_SIZE: constexpr, ACTIVATION: constexpr = "relu")
PARAMS = [Param("x_pointer"), Param("y_pointer"), Param("n"), Param("scale"),
          Param("BLOCK_SIZE", constexpr=True), Param("ACTIVATION", constexpr=True, default="relu", has_default=True)]


def make(params=PARAMS, **kw):
    log = []
    driver, knobs, state = fake_triton()
    direct = launch.DirectLauncher(FakeJIT, FakeCompiled, driver, knobs, **kw)
    return direct, FakeJIT(params, log), log, knobs, state


def tensors(dtype=torch.float32, offset=0):
    base = torch.empty(64, dtype=dtype)
    return base[offset:offset + 8], base[offset + 16:offset + 24]


# --- the key ---------------------------------------------------------------------------------------

def arg_key(params, args, meta=None):
    """The argument part of the direct launcher's key (None: Triton's way)."""
    layout = launch.ArgLayout.of(params, tuple(map(type, args)))
    return None if layout is None else (tuple(map(type, args)), layout.key(args), launch.meta_key(meta or {}))


def test_key_refines_tritons_specialization():
    """Two arguments with one key are specialized alike by Triton's own
    specializer (the key may tell apart more, never less)."""
    jit = pytest.importorskip("triton.runtime.jit")
    specialize = getattr(jit, "native_specialize_impl", None)
    if specialize is None:
        pytest.skip("this Triton has no native_specialize_impl")
    from triton.backends.compiler import BaseBackend
    base = torch.empty(64)
    values = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31 - 1, 2**31, 2**32, 2**63 - 16, 2**63 - 1, 2**63,
              0.0, 1.0, 0.5, -2.5, True, False, None, base, base[1:], base[4:], base[8:], base.double(),
              base.to(torch.bfloat16), base.to(torch.bfloat16)[8:], base.long(), base[:3], base[16:]]
    by_key = {}
    for v in values:
        by_key.setdefault(arg_key([Param("v")], (v,)), []).append(specialize(BaseBackend, v, False, True, True))
    for key, specs in by_key.items():
        assert all(s == specs[0] for s in specs), (key, specs)
    assert len(by_key) > 20


def test_key_parts():
    x, y = tensors()
    types, (values, dtypes, addresses), meta = arg_key(PARAMS, (x, y, 16, 0.5, 128), {"num_warps": 4})
    assert types == (torch.Tensor, torch.Tensor, int, float, int)
    assert values == (16, 128) and dtypes == (torch.float32, torch.float32) and addresses == (0, 0)
    assert meta == ((("num_warps", 4),), (int,))
    assert arg_key(PARAMS, tensors(offset=1) + (16, 0.5, 128))[1][2] == (4, 4)
    # floats key by type (Triton compiles one kernel for every value), constexprs by value
    assert arg_key(PARAMS, (x, y, 3, 0.5, 64)) == arg_key(PARAMS, (x, y, 3, 2.0, 64))
    assert arg_key(PARAMS, (x, y, 3, 0.5, 64.0)) != arg_key(PARAMS, (x, y, 3, 0.5, 64.5))
    # 1, 1.0 and True compare equal but compile differently
    assert len({arg_key(PARAMS, (x, y, 3, 0.5, v)) for v in (1, 1.0, True)}) == 3
    assert len({arg_key(PARAMS, (x, y, 3, 0.5, 8), {"BLOCK": v}) for v in (1, 1.0, True)}) == 3
    assert arg_key(PARAMS, (x, y, np.int64(3), 0.5, 128)) is None
    assert arg_key(PARAMS, (x, y, 3, 0.5, x)) is None                  # a tensor as a constexpr
    with pytest.raises(launch.Ineligible):
        arg_key(PARAMS, (x, y, 3, 0.5, 128), {"ACTIVATION": ("relu",)})
    assert arg_key(PARAMS, (x, y, 3, 0.5, 128), {"COMPUTE": torch.float32, "OUT": tl.float16})


# --- launching -------------------------------------------------------------------------------------

def test_first_launch_is_tritons_and_repeats_go_direct():
    direct, kernel, log, _, _ = make()
    x, y = tensors()
    compiled = direct(kernel, (4,), (x, y, 100, 0.5), {"BLOCK_SIZE": 128, "num_warps": 4})
    assert [e[0] for e in log] == ["generic"] and isinstance(compiled, FakeCompiled)
    x2, y2 = tensors()                   # other tensors and another float: the same kernel
    again = direct(kernel, (4, 2), (x2, y2, 100, 0.25), {"BLOCK_SIZE": 128, "num_warps": 4})
    assert again is compiled and direct.direct_launches == 1
    # the call JITFunction.run makes: grid padded to 3, stream, function, metadata, no
    # launch metadata (no hooks), the hooks, then every parameter in order (ACTIVATION's default)
    assert log[1] == ("direct", 4, 2, 1, "stream-0", "cu-function", ("packed",), None, kernel_hooks(direct)[0],
                      kernel_hooks(direct)[1], x2, y2, 100, 0.25, 128, "relu")


def test_an_int_that_changes_goes_tritons_way():
    """Ints key by value: one that changes on every launch (a seed) never goes direct."""
    direct, kernel, log, _, _ = make()
    x, y = tensors()
    for n in (3, 4, 5, 5):
        direct(kernel, (1,), (x, y, n, 0.5), {"BLOCK_SIZE": 128})
    assert [e[0] for e in log] == ["generic", "generic", "generic", "direct"]


def kernel_hooks(direct):
    return direct.knobs.runtime.launch_enter_hook, direct.knobs.runtime.launch_exit_hook


@pytest.mark.parametrize("change", ["misaligned", "dtype", "n=1", "n%16", "n>2^31", "constexpr", "keyword",
                                    "constexpr type", "option", "device", "debug"])
def test_a_new_specialization_goes_tritons_way_once(change):
    direct, kernel, log, knobs, state = make()
    x, y = tensors()
    args, meta = (x, y, 100, 0.5), {"BLOCK_SIZE": 128}
    direct(kernel, (1,), args, meta)
    direct(kernel, (1,), args, meta)
    assert [e[0] for e in log] == ["generic", "direct"]
    if change == "misaligned":
        args = tensors(offset=1) + args[2:]
    elif change == "dtype":
        args = tensors(torch.float16) + args[2:]
    elif change == "n=1":
        args = (x, y, 1, 0.5)
    elif change == "n%16":
        args = (x, y, 96, 0.5)
    elif change == "n>2^31":
        args = (x, y, 2**31 + 1, 0.5)
    elif change == "constexpr":
        meta = {"BLOCK_SIZE": 256}
    elif change == "keyword":
        meta = {"BLOCK_SIZE": 128, "ACTIVATION": "tanh"}
    elif change == "constexpr type":
        meta = {"BLOCK_SIZE": 128.0}
    elif change == "option":
        meta = {"BLOCK_SIZE": 128, "num_warps": 8}
    elif change == "device":
        state.device = 1
    elif change == "debug":
        knobs.runtime.debug = True
    direct(kernel, (1,), args, meta)
    direct(kernel, (1,), args, meta)
    assert [e[0] for e in log] == ["generic", "direct", "generic", "direct"]
    if change == "keyword":
        assert log[-1][-2:] == (128, "tanh")
    if change == "device":
        assert log[-1][4] == "stream-1"


def test_unusual_launches_always_go_tritons_way():
    x, y = tensors()
    cases = {
        "argument type": lambda d, k: d(k, (1,), (x, y, np.int64(3), 0.5), {"BLOCK_SIZE": 128}),
        "unhashable keyword": lambda d, k: d(k, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128, "ACTIVATION": ["a"]}),
        "grid function": lambda d, k: d(k, lambda meta: (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128}),
        "grid of 4": lambda d, k: d(k, (1, 1, 1, 1), (x, y, 3, 0.5), {"BLOCK_SIZE": 128}),
    }
    for name, call in cases.items():
        direct, kernel, log, _, _ = make()
        call(direct, kernel)
        call(direct, kernel)
        assert [e[0] for e in log] == ["generic", "generic"], name
        assert not direct.compiled, name

    def hooked(setup):
        direct, kernel, log, knobs, _ = make()
        setup(kernel, knobs)
        for _ in range(2):
            direct(kernel, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128})
        return [e[0] for e in log]
    assert hooked(lambda k, kn: k.pre_run_hooks.append(print)) == ["generic", "generic"]
    assert hooked(lambda k, kn: kn.runtime.launch_enter_hook.calls.append(print)) == ["generic", "generic"]
    assert hooked(lambda k, kn: setattr(kn.runtime, "launch_exit_hook", print)) == ["generic", "generic"]
    assert hooked(lambda k, kn: setattr(kn.runtime, "add_stages_inspection_hook", print)) == ["generic", "generic"]
    # another kind of kernel (autotuned, the interpreter's): Triton's way
    direct, _, log, _, _ = make()
    other = type("Autotuner", (FakeJIT,), {})(PARAMS, log)
    for _ in range(2):
        direct(other, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128})
    assert [e[0] for e in log] == ["generic", "generic"]


def test_kept_only_when_every_parameter_has_a_value():
    direct, kernel, log, _, _ = make()
    x, y = tensors()
    for _ in range(2):          # BLOCK_SIZE has no default and is not given: Triton decides (raises, really)
        direct(kernel, (1,), (x, y, 3, 0.5), {})
    assert [e[0] for e in log] == ["generic", "generic"]
    kernel.compiled_type = object              # not a CompiledKernel: not kept
    direct2, kernel2, log2, _, _ = make()
    kernel2.compiled_type = lambda log: "a future"
    for _ in range(2):
        direct2(kernel2, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128})
    assert [e[0] for e in log2] == ["generic", "generic"]


def test_failed_direct_launch_falls_back_and_turns_direct_launching_off():
    direct, kernel, log, _, _ = make()
    x, y = tensors()
    call = lambda: direct(kernel, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128})   # noqa: E731
    compiled = call()
    compiled.fail = TypeError("the launcher wants other arguments")
    call()
    assert [e[0] for e in log] == ["generic", "generic"]
    assert "TypeError" in direct.disabled and not direct.compiled
    call()
    assert [e[0] for e in log] == ["generic", "generic", "generic"]


def test_a_failing_launch_raises_and_leaves_direct_launching_on():
    direct, kernel, log, _, _ = make()
    x, y = tensors()
    call = lambda: direct(kernel, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128})   # noqa: E731
    compiled = call()
    compiled.fail = kernel.fail = RuntimeError("CUDA error: out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        call()
    assert direct.disabled is None and direct.compiled
    compiled.fail = kernel.fail = None
    call()
    assert [e[0] for e in log] == ["generic", "direct"]


def test_cache_is_bounded():
    direct, kernel, log, _, _ = make(max_entries=3)
    x, y = tensors()
    for block in (16, 32, 64, 128):
        direct(kernel, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": block})
    assert len(direct.compiled) == 1


# --- against Triton's own JITFunction.run ----------------------------------------------------------

@pytest.fixture
def real_jit(monkeypatch):
    """A real JITFunction of triflux's binary elementwise kernel, run by
    Triton's own ``run`` with a fake driver and a compiled kernel that records
    its calls (Triton's compile step replaced): (kernel, grid, args, meta, calls)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    from triflux.triton_kernels import elementwise

    calls = []

    class Compiled:
        function, packed_metadata = "cu-function", "packed"

        def run(self, *call):
            calls.append(call)

        def launch_metadata(self, grid, stream, *args):
            return None

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 7

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    monkeypatch.setattr(driver, "_active", Driver())
    kernel = JITFunction(getattr(elementwise._binary_kernel, "fn", elementwise._binary_kernel))
    compiled = Compiled()

    def compile_(key, signature, device, constexprs, options, attrs, warmup):
        kernel.device_caches[device][0][key] = compiled
        return compiled
    monkeypatch.setattr(kernel, "_do_compile", compile_)
    recorded = []
    monkeypatch.setattr(launch, "launch", lambda k, grid, *args, **meta: recorded.append((grid, args, meta)))
    dev = tf.CUDADevice(0)
    _ = dev(np.ones((3, 4), np.float32)) + dev(np.ones(4, np.float32))
    grid, args, meta = recorded[-1]
    return kernel, grid, args, dict(meta, INTERPRETER=False), calls, Compiled


def test_direct_launch_calls_the_compiled_kernel_as_triton_does(real_jit):
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    kernel, grid, args, meta, calls, compiled_type = real_jit
    direct = launch.DirectLauncher(JITFunction, compiled_type, driver, knobs)
    assert direct(kernel, grid, args, meta) is direct(kernel, grid, args, meta)
    assert direct.direct_launches == 1 and len(calls) == 2
    tritons, ours = calls
    assert ours == tritons           # grid, stream, function, metadata, hooks and every parameter


# --- launch(): the direct launcher in place, the GPU of the tensors selected -----------------------

def test_launch_goes_through_the_direct_launcher_on_the_tensors_gpu(monkeypatch):
    """With several GPUs, launch enters the tensors' GPU and the direct
    launcher keys and launches there."""
    seen = []
    driver, knobs, state = fake_triton()

    class FakeCuda:
        @staticmethod
        def current_device():
            return state.device

        class device:
            def __init__(self, idx):
                self.idx = idx

            def __enter__(self):
                self.before, state.device = state.device, self.idx
                seen.append(("enter", self.idx))

            def __exit__(self, *exc):
                state.device = self.before
                seen.append(("exit", self.idx))

    class Torch:
        Tensor = torch.Tensor
        cuda = FakeCuda

    log = []
    direct = launch.DirectLauncher(FakeJIT, FakeCompiled, driver, knobs)
    kernel = FakeJIT(PARAMS, log)
    monkeypatch.setattr(launch, "torch", Torch)
    monkeypatch.setattr(launch, "_MULTI_GPU", True)
    monkeypatch.setattr(launch, "_DIRECT", direct)
    monkeypatch.setattr(launch, "_gpu_index", lambda args: 1)
    x, y = tensors()
    for _ in range(2):
        launch.launch(kernel, (2,), x, y, 3, 0.5, BLOCK_SIZE=128)
    assert seen == [("enter", 1), ("exit", 1)] * 2
    assert [e[0] for e in log] == ["generic", "direct"] and log[1][4] == "stream-1"
    monkeypatch.setattr(launch, "_gpu_index", lambda args: 0)     # on the current GPU: no switch
    for _ in range(2):
        launch.launch(kernel, (2,), x, y, 3, 0.5, BLOCK_SIZE=128)
    assert seen == [("enter", 1), ("exit", 1)] * 2
    assert [e[0] for e in log] == ["generic", "direct", "generic", "direct"] and log[3][4] == "stream-0"


# --- recorded launches, prepared and repeated (triflux.capture) ---------------------------------------

def test_a_recorded_launch_is_prepared_as_the_compiled_kernels_own_call(monkeypatch):
    """On a real GPU a prepared launch calls the compiled kernel's launcher
    with the grid, the stream current when prepared and every parameter's
    value, none of the binder or the key; an ineligible one (a grid
    function, a compiled kernel of another kind) goes Triton's way."""
    direct, kernel, log, _, state = make()
    monkeypatch.setattr(launch, "_DIRECT", direct)
    x, y = tensors()
    recorded = recording.Recording()
    with recorded.phase("step"):
        launch.launch(kernel, (4, 2), x, y, 100, 0.5, BLOCK_SIZE=128, num_warps=4)
    (entry,) = recorded.launches
    assert entry[:4] == (kernel, (4, 2), (x, y, 100, 0.5), {"BLOCK_SIZE": 128, "num_warps": 4})
    run = launch.prepare(*entry)
    state.device = 1                     # the stream was taken when prepared
    log.clear()
    run()
    run()
    assert log == [("direct", 4, 2, 1, "stream-0", "cu-function", ("packed",), None, kernel_hooks(direct)[0],
                    kernel_hooks(direct)[1], x, y, 100, 0.5, 128, "relu")] * 2
    assert direct.direct_launches == 0   # nothing of __call__ ran
    log.clear()
    grid_function = launch.prepare(kernel, lambda meta: (1,), entry[2], entry[3], entry[4])
    other_kind = launch.prepare(kernel, (4, 2), entry[2], entry[3], object())
    grid_function()
    other_kind()
    assert [e[0] for e in log] == ["generic", "generic"]


def test_prepared_launch_failures_are_triflux_errors(monkeypatch):
    direct, kernel, log, _, _ = make()
    monkeypatch.setattr(launch, "_DIRECT", direct)
    x, y = tensors()
    compiled = launch.launch(kernel, (1,), x, y, 3, 0.5, BLOCK_SIZE=128)
    run = launch.prepare(kernel, (1,), (x, y, 3, 0.5), {"BLOCK_SIZE": 128}, compiled)
    compiled.fail = RuntimeError("CUDA error: out of memory")
    with pytest.raises(tf.errors.OutOfMemoryError):
        launch.run_prepared([run], (x, y))
    compiled.fail = RuntimeError("an unrelated failure")
    with pytest.raises(RuntimeError, match="unrelated"):
        launch.run_prepared([run], (x, y))


def test_launch_errors_are_translated_on_the_direct_path(monkeypatch):
    driver, knobs, _ = fake_triton()
    log = []
    direct = launch.DirectLauncher(FakeJIT, FakeCompiled, driver, knobs)
    kernel = FakeJIT(PARAMS, log)
    monkeypatch.setattr(launch, "_DIRECT", direct)
    x, y = tensors()
    compiled = launch.launch(kernel, (1,), x, y, 3, 0.5, BLOCK_SIZE=128)
    compiled.fail = kernel.fail = RuntimeError("CUDA error: out of memory")
    with pytest.raises(tf.errors.OutOfMemoryError):
        launch.launch(kernel, (1,), x, y, 3, 0.5, BLOCK_SIZE=128)


def test_direct_launching_only_on_checked_triton_versions(monkeypatch):
    import triton
    assert launch.make_direct_launcher() is None or not launch.INTERPRET      # the interpreter: Triton's way
    monkeypatch.setattr(launch, "INTERPRET", False)
    for version, expected in [("3.5.1", False), ("3.6.0", True), ("3.9.2", True), ("3.10.0", False),
                              ("4.0.0", False), ("3.7.0+git1234", True), ("nightly", False)]:
        monkeypatch.setattr(triton, "__version__", version)
        assert isinstance(launch.make_direct_launcher(), launch.DirectLauncher) is expected, version


# --- a training step: every launch could go direct, and the second step would ----------------------

def test_training_step_launches_are_direct_launchable(monkeypatch):
    """Record the launches of two steps (kernels not run): every launch is
    eligible, and the second step's specializations are all the first's."""
    from triton.runtime.jit import JITFunction
    params = {}
    steps = [set(), set()]
    current = [0]

    def record(kernel, grid, *args, **meta):
        fn = getattr(kernel, "fn", kernel)
        if fn not in params:
            params[fn] = JITFunction(fn).params
        assert type(grid) is tuple and 1 <= len(grid) <= 3, (fn.__name__, grid)
        try:
            key = arg_key(params[fn], args, meta)
            hash(key)
        except (launch.Ineligible, TypeError) as e:
            raise AssertionError(f"{fn.__name__}: {e!r} is not direct-launchable") from None
        assert key is not None, f"{fn.__name__}: arguments of types {[type(a) for a in args]}"
        steps[current[0]].add((fn.__name__, key))

    monkeypatch.setattr(launch, "launch", record)
    dev = tf.CUDADevice(0)
    tf.seed(0)
    model = dev(models.UNet(3, 2, depth=2, base_channels=4))
    opt = optimise.setup(optimise.Adam(1e-3), model)
    x = dev(np.zeros((2, 3, 8, 8), np.float32))
    y = dev(np.zeros((2, 2, 8, 8), np.float32))
    for step in (0, 1):
        current[0] = step
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y, dims=1), model)
        optimise.update(opt, model, g)
    assert steps[1] and steps[1] <= steps[0], sorted(steps[1] - steps[0])[:5]
