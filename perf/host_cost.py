"""triflux's host cost per kernel launch against torch's per tiny op, in one process.

Everything runs on this CPU, no GPU needed:

1. torch: ``a + b`` on two 1-element CPU tensors, the cost of torch's
   dispatcher for a tiny op (median over many calls).
2. triflux: on the CUDA device served by the Triton interpreter, with every
   kernel turned into a no-op (``triflux.triton_kernels.launch.launch``
   replaced by a function that counts and returns), so what is left is
   triflux's own Python per launch: validation, promotion, specs, dispatch,
   the kernels' host wrappers (strides, grids, allocation with
   ``torch.empty``) and the tape. Measured for tiny ops (``x + y``, ``relu``,
   a 2x2 ``matmul``, ``sum``) and for one training step of ``UNet(3, 2)``
   (its defaults) at batch 4, 64x64, float32 (forward, gradient, Adam),
   divided by the step's launch count.
   The same step captured (``tf.capture_step``): recorded on two steps,
   then replayed, with the prepared launches no-op'd
   (``triflux.triton_kernels.launch.prepare`` replaced by a counter).
3. The launch itself, which no-op'd kernels leave out: Triton's generic
   ``kernel[grid](*args, **meta)`` (bind, specialize, look up, run) against
   triflux's :class:`DirectLauncher` on a repeat launch, and a captured
   step's prepared launch (the compiled kernel's launcher with its
   arguments bound), all on a real JITFunction of the binary elementwise
   kernel (the arguments of ``x + y``) with a stand-in driver and a
   compiled kernel whose launcher does nothing (Triton's compile step
   replaced), so only the Python of each path is timed.

Each figure is the median of ``--repeats`` rounds (the spread is printed), the
rounds of all figures interleaved so that they share the machine's state.

    .venv/bin/python perf/host_cost.py [--repeats 7] [--no-unet] [--no-launcher] [--profile unet|captured|tiny]
"""
import argparse
import os
import statistics
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported: the interpreter serves CUDADevice
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import triflux as tf  # noqa: E402
from triflux import recording  # noqa: E402
from triflux.triton_kernels import launch as kernel_launch  # noqa: E402
from triflux.workbench import benchmarks  # noqa: E402

LAUNCHES = [0]


def _no_op_launch(kernel, grid, *args, **meta):
    """``launch`` with the kernel not run: counts the launch (and records it
    inside a recorded step) and returns."""
    LAUNCHES[0] += 1
    if recording.ACTIVE is not None:
        recording.note_launch(kernel, grid, args, meta, None)


def _count_launch():
    LAUNCHES[0] += 1


def _no_op_prepare(kernel, grid, args, meta, compiled):
    """``prepare`` with the kernel not run: a repeated launch only counts."""
    return _count_launch


def _per_call(fn, calls, warm=0):
    """Seconds per call of ``fn`` over ``calls`` calls after ``warm`` untimed
    ones, and launches per call."""
    for _ in range(warm):
        fn()
    before = LAUNCHES[0]
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    return dt / calls, (LAUNCHES[0] - before) / calls


def torch_tiny_op():
    a, b = torch.ones(1), torch.ones(1)
    return lambda: a + b


def triflux_tiny_ops():
    """Closures of the tiny ops on the interpreter's CUDA device."""
    dev = tf.CUDADevice(0)
    x = dev(np.ones(4, np.float32))
    y = dev(np.ones(4, np.float32))
    m = dev(np.ones((2, 2), np.float32))
    return {"x + y": lambda: x + y,
            "relu(x)": lambda: tf.relu(x),
            "m @ m (2x2)": lambda: m @ m,
            "sum(x)": lambda: x.sum()}


def unet_step():
    return benchmarks.triflux_unet_step(benchmarks.UNET, device="cuda")


def captured_unet_step():
    """The same step (model, data, loss, Adam) as ``train``'s step captured
    with ``tf.capture_step``: recorded twice here, replayed when timed."""
    return benchmarks.triflux_unet_step(benchmarks.UNET, device="cuda", capture=True)


def launchers():
    """(Triton's generic launch, the direct launch) of the binary elementwise
    kernel with ``x + y``'s arguments, each a closure, and the undo of the
    stand-ins; see the module docstring."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    from triflux.triton_kernels import elementwise

    recorded = []
    kernel_launch.launch = lambda kernel, grid, *args, **meta: recorded.append((grid, args, meta))
    triflux_tiny_ops()["x + y"]()
    kernel_launch.launch = _no_op_launch
    grid, args, meta = recorded[-1]
    meta = dict(meta, INTERPRETER=False)          # as a GPU launch has it

    class Compiled:                               # a compiled kernel whose launcher does nothing
        function, packed_metadata = None, None

        def run(self, *call):
            pass

        def launch_metadata(self, grid, stream, *args):
            return None

    class Driver:                                 # the current device and stream, and a GPU target
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    saved, driver._active = driver._active, Driver()
    kernel = JITFunction(elementwise._binary_kernel.fn)
    compiled = Compiled()

    def compile_(key, signature, device, constexprs, options, attrs, warmup):
        kernel.device_caches[device][0][key] = compiled
        return compiled
    kernel._do_compile = compile_
    direct = kernel_launch.DirectLauncher(JITFunction, Compiled, driver, knobs)
    generic = lambda: kernel[grid](*args, **meta)            # noqa: E731
    fast = lambda: direct(kernel, grid, args, meta)          # noqa: E731
    generic()
    fast()
    prepared = direct.bound(kernel, grid, args, meta, compiled)

    def undo():
        driver._active = saved
    return generic, fast, prepared, undo


def measure(repeats, with_unet, with_launcher):
    cases = {"torch a + b": (torch_tiny_op(), 20000, 0)}
    cases.update({f"triflux {k}": (fn, 2000, 0) for k, fn in triflux_tiny_ops().items()})
    if with_unet:
        # one untimed step per round: the first step after the tiny ops' loops runs ~1.3x slower
        # (caches and allocator), which is not the steady state being measured
        cases["triflux UNet(3, 2) step"] = (unet_step(), 3, 1)
        cases["triflux UNet(3, 2) step, captured (replayed)"] = (captured_unet_step(), 3, 1)
    undo = None
    if with_launcher:
        generic, fast, prepared, undo = launchers()
        cases["Triton kernel[grid](...), x + y's kernel"] = (generic, 2000, 0)
        cases["DirectLauncher, repeat launch"] = (fast, 2000, 0)
        cases["prepared launch, replayed (captured step)"] = (prepared, 20000, 0)
    for fn, _, _ in cases.values():    # warm-up: caches, first allocations
        fn()
    rounds = {k: [] for k in cases}
    launches = {}
    for _ in range(repeats):
        for k, (fn, calls, warm) in cases.items():
            per_call, n = _per_call(fn, calls, warm)
            rounds[k].append(per_call)
            launches[k] = n
    if undo:
        undo()
    return rounds, launches


def report(rounds, launches):
    torch_us = statistics.median(rounds["torch a + b"]) * 1e6
    print(f"torch {torch.__version__}, triton-interpreted triflux, Python {sys.version.split()[0]}")
    print("| case | per call | launches per call | per launch | spread per launch (min-max) | ratio to torch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, r in rounds.items():
        n = launches[k] or 1
        med = statistics.median(r) * 1e6
        unit = "ms" if med > 1e4 else "µs"
        scale = 1e-3 if unit == "ms" else 1
        ratio = "1" if k.startswith("torch") else f"{med / n / torch_us:.1f}x"
        if not k.startswith(("torch", "triflux")):       # a launcher: Python per launch on top of the above
            n, ratio = 1, f"{med / torch_us:.1f}x"
        print(f"| {k} | {med * scale:.1f} {unit} | {launches[k]:g} | {med / n:.1f} µs | "
              f"{min(r) * 1e6 / n:.1f}-{max(r) * 1e6 / n:.1f} µs | {ratio} |")


def profile(what):
    import cProfile
    import pstats
    if what == "unet":
        fn, calls = unet_step(), 3
    elif what == "captured":
        fn, calls = captured_unet_step(), 20
    else:
        fns = triflux_tiny_ops()
        calls = 3000
        fn = lambda: [f() for f in fns.values()]   # noqa: E731
    fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(40)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-unet", action="store_true", help="tiny ops only (the UNet step takes a few seconds)")
    p.add_argument("--no-launcher", action="store_true", help="leave out Triton's and the direct launcher")
    p.add_argument("--profile", choices=["unet", "captured", "tiny"], help="print a cProfile of the no-op'd workload instead")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    kernel_launch.launch = _no_op_launch
    kernel_launch.prepare = _no_op_prepare
    if args.profile:
        profile(args.profile)
        return 0
    report(*measure(args.repeats, not args.no_unet, not args.no_launcher))
    return 0


if __name__ == "__main__":
    sys.exit(main())
