"""The workbench's modules under their old names: ``triflux.doctor``,
``triflux.benchmarks``, ``triflux.kernel_report``, ``triflux.demos`` (and
its modules) and ``triflux.__main__`` are the very module objects of
``triflux.workbench``, whichever name is imported first, so an attribute
patched through either name is patched for both; and the old ``python -m``
entry points still run. (tests/test_architecture.py checks that these
aliases are the only modules outside the workbench that import it.)"""
import json

import pytest

from helpers import run_python

#: old name -> the workbench module it is
MOVED = {
    "triflux.doctor": "triflux.workbench.doctor",
    "triflux.benchmarks": "triflux.workbench.benchmarks",
    "triflux.kernel_report": "triflux.workbench.kernel_report",
    "triflux.demos": "triflux.workbench.demos",
    "triflux.demos.mlp": "triflux.workbench.demos.mlp",
    "triflux.demos.unet": "triflux.workbench.demos.unet",
    "triflux.demos.shapes": "triflux.workbench.demos.shapes",
    "triflux.demos.volumes": "triflux.workbench.demos.volumes",
    "triflux.demos.cli": "triflux.workbench.flags",
    "triflux.__main__": "triflux.workbench.cli",
}


@pytest.mark.parametrize("old_first", [True, False], ids=["old name first", "new name first"])
def test_old_names_are_the_workbench_modules(old_first):
    r = run_python(f"""
        import importlib, json, sys
        import triflux
        different = []
        for old, new in {MOVED!r}.items():
            first, second = (old, new) if {old_first} else (new, old)
            a, b = importlib.import_module(first), importlib.import_module(second)
            if a is not b or sys.modules[old] is not sys.modules[new]:
                different.append(old)
        # the package's attributes: `import triflux; triflux.doctor` (lazily imported) and the like
        for name in ("doctor", "benchmarks", "kernel_report", "demos"):
            if getattr(triflux, name) is not sys.modules["triflux.workbench." + name]:
                different.append("triflux." + name + " (attribute)")
        from triflux.demos import unet
        from triflux.demos.cli import device_from_flag
        from triflux.workbench import flags
        if unet is not sys.modules["triflux.workbench.demos.unet"] or device_from_flag is not flags.device_from_flag:
            different.append("from triflux.demos import ...")
        print(json.dumps(different))
    """)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_a_patch_through_the_old_name_reaches_the_workbench():
    r = run_python("""
        import triflux.benchmarks, triflux.kernel_report
        from triflux.workbench import benchmarks, kernel_report
        triflux.benchmarks.QUICK = ["patched"]
        triflux.kernel_report.LAUNCH_LATENCY_US = 7.0
        print(benchmarks.QUICK == ["patched"] and kernel_report.LAUNCH_LATENCY_US == 7.0)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("module", ["triflux.kernel_report", "triflux.workbench.kernel_report"])
def test_the_compile_worker_runs_under_both_names(module):
    """``python -m <module> --compile-worker``, as the kernel report starts it
    (here with no work: a request on stdin, a JSON list on stdout)."""
    r = run_python(f"""
        import subprocess, sys
        done = subprocess.run([sys.executable, "-m", "{module}", "--compile-worker"],
                              input='{{"arch": "sm_90", "jobs": []}}', capture_output=True, text=True)
        print(done.returncode, done.stdout.strip(), done.stderr[-2000:])
    """, unset=("TRITON_INTERPRET",))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("0 []"), r.stdout


def test_python_dash_m_triflux_still_runs():
    r = run_python("""
        import runpy, sys
        sys.argv = ["triflux", "--help"]
        runpy.run_module("triflux", run_name="__main__", alter_sys=True)
    """)
    assert r.returncode == 0, r.stderr
    assert "demo unet" in r.stdout and "kernels" in r.stdout
