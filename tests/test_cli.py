"""`python -m triflux`: the MLP demo end to end on a tiny run, argument errors,
and the notice of runs on the Triton interpreter."""
import pytest

from helpers import run_python
from triflux import backend


def run_cli(*args, timeout=300):
    return run_python(f"import sys; from triflux.__main__ import main; sys.exit(main({list(args)!r}))",
                      timeout=timeout, unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})


def test_mlp_demo_trains_and_reports_accuracy():
    r = run_cli("demo", "mlp", "--epochs", "3", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "Dense(64 => 64, relu)" in r.stdout and "CPUDevice()" in r.stdout
    line = [l for l in r.stdout.splitlines() if l.startswith("final test accuracy")][0]
    assert float(line.split(":")[1].split()[0]) > 0.85, line


def test_bad_arguments_exit_2_with_one_line():
    r = run_cli("demo", "mlp", "--epochs", "0")
    assert r.returncode == 2 and "--epochs must be positive" in r.stderr
    r = run_cli("demo", "mlp", "--device", "tpu")
    assert r.returncode == 2 and "CUDA, AMDGPU, Metal, CPU" in r.stderr
    r = run_cli("demo", "nothing")
    assert r.returncode == 2 and "unknown demo" in r.stderr
    r = run_cli("--help")
    assert r.returncode == 0 and "demo mlp" in r.stdout and "kernels" in r.stdout


def test_kernels_help_and_argument_errors():
    """`python -m triflux kernels` (tests/test_kernel_report.py runs it)."""
    r = run_cli("kernels", "--help")
    assert r.returncode == 0 and "--workload" in r.stdout and "--json" in r.stdout and "sm_80" in r.stdout
    r = run_cli("kernels", "--workload", "mlp", "--size", "32")
    assert r.returncode == 2 and "--size applies to the image workloads" in r.stderr
    r = run_cli("kernels", "--arch", "sm_70")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_readme_example_runs():
    import os
    import re
    from helpers import ROOT
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    r = run_python(code + "\nprint('README OK', float(loss) > 0)")
    assert r.returncode == 0, r.stderr
    assert "README OK True" in r.stdout


INTERPRETER_RUNS = """
import sys
from triflux.workbench import benchmarks
from triflux.__main__ import main
from triflux.workbench.demos import mlp, unet

class Started(Exception):
    pass

def started(*args, **kwargs):
    raise Started

unet.make_shapes = mlp.load_digits_split = started     # stop each demo once its run has begun
benchmarks.QUICK = []                                   # bench prints its table's head, times nothing
for argv in (["demo", "unet", "--device", "cuda", "--out", {out!r}], ["demo", "mlp", "--device", "cuda"],
             ["bench", "--device", "cuda"], ["doctor", "--no-selftest"]):
    print("$", *argv[:2], file=sys.stderr, flush=True)
    try:
        main(argv)
    except Started:
        pass
"""


@pytest.mark.skipif(not (backend.has_module("torch") and backend.has_module("triton")),
                    reason="the interpreter needs torch and triton")
def test_runs_on_the_interpreter_say_once_that_it_is_slow(tmp_path):
    r = run_python(INTERPRETER_RUNS.format(out=str(tmp_path)), env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    notice = ("note: CUDADevice(0) [Triton interpreter on the CPU] runs every GPU kernel in the Triton interpreter, "
              "in Python on the CPU: orders of magnitude slower than a GPU, and slower than the CPU device.")
    runs = dict(part.split("\n", 1) for part in r.stderr.split("$ ")[1:])
    assert set(runs) == {"demo unet", "demo mlp", "bench --device", "doctor --no-selftest"}, r.stderr
    for command, err in runs.items():
        assert err.count(notice) == 1, (command, err)
    assert "--device cpu runs faster" in runs["demo unet"] and "--device cpu runs faster" in runs["demo mlp"]
    assert "The triflux timings below are interpreter timings." in runs["bench --device"]
    assert "| workload | triflux (interpreter timings) | torch |" in r.stdout
    assert "device: cuda (Triton interpreter on the CPU; torch on the CPU)" in r.stdout
