"""`python -m triflux`: the MLP demo end to end on a tiny run, and argument errors."""
from helpers import run_python


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
