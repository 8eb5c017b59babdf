"""A training step written down as it runs on a device: every kernel launch
with its arguments, and every copy between the host and the device, for
:mod:`triflux.capture` to check and replay.

Nothing is written unless a :class:`Recording` is open (``with
recording.phase(name):``); outside, the hooks in the launcher and in the
host/device copies cost one global lookup each.
"""
import contextlib
import hashlib

#: the open Recording (None: nothing is recorded)
ACTIVE = None


class Recording:
    """What a step did on its device, in order.

    ``launches``: ``(kernel, grid, args, meta, compiled)`` per launch, as
    ``triflux.triton_kernels.launch.launch`` made it (``compiled``: what
    Triton returned, the compiled kernel on a real GPU). ``uploads``: a
    digest of each host array copied to the device. ``host_reads``: what
    read a device value on the host. ``device_copies``: copies between
    devices. ``seeds``: the seeds drawn from triflux's random stream
    (dropout, random fills), in order. ``allocated``: the addresses of the
    device memory allocated while recording (the step's own buffers; every
    other tensor a launch reads was made before the step). ``phases``:
    ``{name: (first launch, end)}``.

    Holding the launches holds their arguments: every buffer the step used
    stays allocated while the recording lives (as a CUDA graph's pool does).
    """

    def __init__(self):
        self.launches, self.uploads, self.host_reads, self.device_copies, self.seeds = [], [], [], [], []
        self.allocated = set()
        self.phases = {}

    @contextlib.contextmanager
    def phase(self, name):
        """Record what runs inside the block as the phase ``name``."""
        global ACTIVE
        outer, ACTIVE = ACTIVE, self
        start = len(self.launches)
        try:
            yield self
        finally:
            ACTIVE = outer
            self.phases[name] = (start, len(self.launches))

    def phase_launches(self, name):
        """The launches of the phase ``name``."""
        start, end = self.phases[name]
        return self.launches[start:end]


def note_launch(kernel, grid, args, meta, compiled):
    """A launch, into the open recording."""
    ACTIVE.launches.append((kernel, grid, args, meta, compiled))


def note_upload(array):
    """A host array copied to the device, into the open recording (by its
    dtype, shape and a digest of its bytes)."""
    ACTIVE.uploads.append((str(array.dtype), array.shape, hashlib.blake2b(array.tobytes(), digest_size=16).digest()))


def note_host_read(tensor):
    """A device tensor read on the host, into the open recording."""
    ACTIVE.host_reads.append(f"a {tuple(tensor.shape)} tensor")


def note_device_copy(tensor, target):
    """A copy from one device to another, into the open recording."""
    ACTIVE.device_copies.append(f"a {tuple(tensor.shape)} tensor from {tensor.device} to {target}")


def note_seed(value):
    """A seed drawn from triflux's random stream, into the open recording."""
    ACTIVE.seeds.append(value)


def note_allocation(tensor):
    """Device memory allocated for the step (a torch tensor), into the open recording."""
    ACTIVE.allocated.add(tensor.untyped_storage().data_ptr())
