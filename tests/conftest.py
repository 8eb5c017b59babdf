"""Shared pytest set-up for the triflux suite.

Device selection. CI has no GPU, so by default the Triton kernels run in the
Triton interpreter (``TRITON_INTERPRET=1``, torch CPU tensors as device
storage). That variable is read when ``triton`` is imported, so it is set here,
at the very top, before anything (triflux.triton_kernels, torch plugins, test
modules) can import triton; pytest loads this file before collecting any test.
On a machine with a GPU, ``TRIFLUX_TEST_REAL_GPU=1`` leaves the variable alone
and the very same tests launch the kernels on the GPU.

Hypothesis profiles (``HYPOTHESIS_PROFILE``, default ``ci``):

* ``ci``: derandomised (the same examples every run, no example database),
  no deadline, 8 examples per property test, no shrinking: the whole suite in
  minutes on two cores in the interpreter.
* ``newest``: ``ci`` with 4 examples, for the kernel suite's second run on
  the newest accepted Triton (``make test-newest``).
* ``dev``: random, 25 examples: for local runs that should find new cases.
* ``gpu``: 100 examples: for runs on a real GPU, where kernels are fast.
"""
import os

REAL_GPU = os.environ.get("TRIFLUX_TEST_REAL_GPU", "") == "1"
if not REAL_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from triflux import backend  # noqa: E402  (imports neither torch nor triton)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=8,
    suppress_health_check=_SLOW_OK,
    print_blob=True,
    # no shrinking: in the interpreter it can take minutes per failing test;
    # the failure still prints the drawn case (and our messages its shapes,
    # attrs and layouts). `HYPOTHESIS_PROFILE=dev` shrinks to a minimal case.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
# `make test-newest`: the kernel suite again on the newest Triton the package
# accepts (Makefile). A Triton release breaks a construct on the first launch
# of the kernel specialization that uses it, so fewer examples of the same
# derandomised draws suffice (each dtype is its own test).
settings.register_profile("newest", parent=settings.get_profile("ci"), max_examples=4)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=25,
    suppress_health_check=_SLOW_OK,
    print_blob=True,
)
settings.register_profile(
    "gpu",
    deadline=None,
    max_examples=100,
    suppress_health_check=_SLOW_OK,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _gpu_faithful_min_max():
    """Make the interpreter's plain (non-NaN-propagating) float minimum,
    maximum and clamp drop NaN as PTX ``min.f32``/``max.f32`` do on a GPU, so
    that a kernel using a plain ``tl.minimum`` where NaN matters (elu(NaN) = 0
    on a GPU) fails the property suite here too. Triton 3.9's interpreter
    already does this (np.fmin/np.fmax); Triton 3.6's used np.minimum, which
    keeps NaN and hid the difference. The NaN-propagating forms
    (``propagate_nan=tl.PropagateNan.ALL``) keep np.minimum/np.maximum."""
    import numpy as np
    from triton.runtime import interpreter as ti   # (TRITON_INTERPRET is set above)
    builder = ti.InterpreterBuilder
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)

    def create_clampf(self, arg, lo, hi, propagate_nans):
        if propagate_nans == ti._ir.PROPAGATE_NAN.NONE:
            return self.binary_op(self.binary_op(arg, lo, np.fmax), hi, np.fmin)
        return self.ternary_op(arg, lo, hi, np.clip)
    builder.create_clampf = create_clampf


if not REAL_GPU and backend.has_module("triton"):
    try:
        _gpu_faithful_min_max()
    except (ImportError, AttributeError) as e:   # a Triton whose interpreter is laid out otherwise
        import warnings
        warnings.warn(f"could not make the Triton interpreter's min/max GPU-faithful ({e}); "
                      "tests/test_compiled_nan.py still checks the compiled code")


def kernels_status():
    """``(ok, reason)``: can the Triton kernels run in this session?"""
    ok, why = backend.status("CUDA")
    if ok:
        return True, why
    return False, (f"the Triton kernels cannot run here: {why}. Install torch and triton "
                   "(`pip install triflux[gpu]`); with no GPU they run in the Triton "
                   "interpreter (the default for this suite).")


def real_gpu_status():
    """``(ok, reason)``: is a real GPU (not the interpreter) serving the kernels?"""
    if backend.interpreter_on():
        return False, ("needs a real GPU: this run uses the Triton interpreter "
                       "(set TRIFLUX_TEST_REAL_GPU=1 on a machine with a GPU)")
    ok, why = backend.status("CUDA")
    if not ok:
        return False, f"needs a real GPU: {why}"
    return True, why


def pytest_report_header(config):
    ok, why = kernels_status()
    mode = "interpreter" if backend.interpreter_on() else ("GPU" if ok else "unavailable")
    return [f"triflux kernels: {mode} ({why})",
            f"hypothesis profile: {settings.get_current_profile_name()}"]


def pytest_runtest_setup(item):
    if item.get_closest_marker("requires_kernels") is not None:
        ok, why = kernels_status()
        if not ok:
            pytest.skip(why)
    if item.get_closest_marker("gpu") is not None:
        ok, why = real_gpu_status()
        if not ok:
            pytest.skip(why)


@pytest.fixture(scope="session")
def requires_kernels():
    """Use as an argument (or ``@pytest.mark.usefixtures("requires_kernels")``,
    or the ``requires_kernels`` marker): skips, saying why, when torch or
    triton is missing or no backend can run the kernels."""
    ok, why = kernels_status()
    if not ok:
        pytest.skip(why)
    return True


@pytest.fixture(scope="session")
def kernel_device(requires_kernels):
    """The torch device string for kernel-side tensors: ``"cpu"`` when the
    Triton interpreter serves the kernels, ``"cuda"`` on a real GPU."""
    return "cpu" if backend.interpreter_on() else "cuda"
