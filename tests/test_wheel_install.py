"""The package as users get it: build the wheel from the checkout, install it
(not editable) into a fresh virtual environment, import every module of the
source tree from it and run a demo.

Offline: the wheel is built without build isolation (this environment's
setuptools) and installed with --no-deps; its dependencies come from this
environment's site-packages, which a .pth file puts on the fresh environment's
path after its own (the fresh environment's copy of triflux is the one
imported, which the script checks module by module)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from helpers import ROOT

#: installed package -> folder of the checkout (setup.py's PACKAGE_DIR)
SOURCE_FOLDERS = {"triflux": "triflux", "triflux.reference": "reference",
                  "triflux.triton_kernels": "triton_kernels"}

#: not copied into the build tree: environments, VCS, build and test leftovers
NOT_SOURCE = shutil.ignore_patterns(".venv*", ".git", "build", "dist", "*.egg-info", "__pycache__",
                                    ".hypothesis", ".pytest_cache", ".benchmarks", "runs", ".whl")


def source_modules():
    """Every module of the source tree under its installed name, found by
    walking the folders (so a new module or subpackage is checked the day it
    is added); a folder with Python files counts as a package."""
    names = []
    for package, folder in SOURCE_FOLDERS.items():
        top = os.path.join(ROOT, folder)
        for here, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(here, top)
            prefix = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            for f in sorted(files):
                if f.endswith(".py"):
                    names.append(prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}")
            if any(f.endswith(".py") for f in files) and prefix not in names:
                names.append(prefix)          # a folder without __init__.py: must still ship
    return names


def test_source_modules_are_found():
    names = source_modules()
    for expected in ("triflux", "triflux.distributed", "triflux.layers", "triflux.reference.matmul",
                     "triflux.triton_kernels.rnn", "triflux.__main__"):
        assert expected in names


def _declared_ranges():
    """{name: SpecifierSet} of setup.cfg's install_requires and extras."""
    import configparser
    from packaging.requirements import Requirement
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg["options"]["install_requires"].split("\n")
    for extra in cfg["options.extras_require"].values():
        lines += extra.split("\n")
    reqs = [Requirement(line) for line in lines if line.strip()]
    return {r.name: r.specifier for r in reqs}


def _pins(*files):
    pins = {}
    for name in files:
        with open(os.path.join(ROOT, "requirements", name)) as f:
            for line in f:
                line = line.split("#")[0].strip()
                if "==" in line:
                    pkg, version = line.split("==")
                    pins[pkg.strip()] = version.strip()
    return pins


@pytest.mark.parametrize("package", ["numpy", "triton"])
def test_accepted_range_is_what_ci_tests(package):
    """setup.cfg accepts the minor versions from the oldest CI environment's
    (.venv) to the newest's (.venv-newest), no more: widening a range
    without moving a pin (or the reverse) fails here."""
    from packaging.version import Version
    spec = _declared_ranges()[package]
    oldest = Version(_pins("test.txt", "cpu-machine.txt")[package])
    newest = Version(_pins("newest.txt")[package])
    assert oldest in spec and newest in spec, (package, str(spec), oldest, newest)
    assert Version(f"{oldest.major}.{oldest.minor}.0") in spec
    below = Version(f"{oldest.major}.{oldest.minor - 1}.99") if oldest.minor else Version(f"{oldest.major - 1}.99")
    assert below not in spec, f"setup.cfg accepts {package} {below}, older than CI's oldest {oldest}"
    above = Version(f"{newest.major}.{newest.minor + 1}.0")
    assert above not in spec, f"setup.cfg accepts {package} {above}, newer than CI's newest {newest}"


IMPORT_ALL = textwrap.dedent("""
    import importlib, json, os, sys
    site, names = sys.argv[1], json.loads(sys.argv[2])
    for name in names:
        mod = importlib.import_module(name)
        where = os.path.realpath(mod.__file__)
        assert where.startswith(os.path.realpath(site) + os.sep), f"{name} imported from {where}, not the wheel"
    print("IMPORTED", len(names))
""")


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    # build from a copy: an in-tree build would reuse a stale build/ folder
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    r = subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = wheels.glob("triflux-*.whl")

    # the wheel holds the triflux package and its metadata, nothing else
    # (no tests/, perf/, examples/, no top-level reference/ or triton_kernels/)
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"triflux"}, sorted(tops)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run(pip + ["--python", py, "install", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies (numpy, safetensors, torch, triton, scikit-learn, ...) from this environment
    with open(os.path.join(site, "dependencies_from_test_env.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")

    # neither the checkout nor the interpreter switch: a user's shell, outside the source tree
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    names = source_modules()
    r = subprocess.run([py, "-c", IMPORT_ALL, site, json.dumps(names)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"IMPORTED {len(names)}" in r.stdout

    r = subprocess.run([py, "-m", "triflux", "demo", "mlp", "--epochs", "1", "--quiet"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "final test accuracy" in r.stdout, r.stdout
