"""What the command-line tools share: the device a ``--device`` flag names,
with errors that speak of the flag rather than of library calls, and the
notice printed when a run starts on the Triton interpreter."""
import sys

import triflux as tf
from triflux import backend
from triflux.devices import DEVICE_CLASSES, Device, as_device

#: the note a run on the interpreter prints once, at its start
INTERPRETER_NOTICE = ("note: {device!r} runs every GPU kernel in the Triton interpreter, in Python on the CPU: "
                      "orders of magnitude slower than a GPU, and slower than the CPU device. {consequence}")


def device_from_flag(parser, value):
    """The device ``--device value`` names (``None``: the default device, a
    functional GPU, else the CPU). A device that cannot be used stops the
    command through ``parser.error`` (one line, exit status 2) with advice
    in the command's own terms."""
    try:
        device = tf.get_device() if value is None else as_device(value)
    except tf.NoGPUError:
        parser.error(f"--device {value}: {_unusable_gpu(value)}")
    except (tf.TrifluxError, ValueError) as e:
        parser.error(f"--device {value}: {e}")
    if not backend.status(device.backend)[0]:
        parser.error(f"--device {value}: the {device.backend} backend is not functional here "
                     "(`python -m triflux doctor` says why). Use --device cpu")
    return device


def _unusable_gpu(value):
    """Why the GPU ``value`` names cannot be used, and what to pass instead."""
    kind = value.lower().partition(":")[0]
    names = [n for n in DEVICE_CLASSES if n != "CPU" and (kind == "gpu" or n.lower() == kind)]
    for name in names:
        n = backend.device_count(name) if backend.status(name)[0] else 0
        if n:
            return (f"{name} has {n} visible device(s), {kind}:0 to {kind}:{n - 1}. "
                    "Use one of them, or --device cpu")
    reasons = "; ".join(backend.status(name)[1] if len(names) == 1 else f"{name}: {backend.status(name)[1]}"
                        for name in names)
    advice = "use --device cpu"
    if "CUDA" in names and not backend.interpreter_on():
        advice += ", or set TRITON_INTERPRET=1 in the environment to run the Triton kernels in the interpreter"
    return f"{reasons}. Without a GPU, {advice}"


def on_interpreter(device):
    """Whether ``device`` is a GPU device that the Triton interpreter serves."""
    return isinstance(device, Device) and device.backend == "CUDA" and backend.interpreter_on()


def interpreter_notice(device, consequence="Without a GPU, --device cpu runs faster."):
    """Print :data:`INTERPRETER_NOTICE` to stderr when ``device`` is served by
    the interpreter; returns whether it printed."""
    if not on_interpreter(device):
        return False
    print(INTERPRETER_NOTICE.format(device=device, consequence=consequence), file=sys.stderr, flush=True)
    return True
