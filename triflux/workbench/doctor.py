"""``python -m triflux doctor``: what can run here, and why not.

:func:`report` gathers everything as plain data (dicts, lists, strings,
numbers) so tests and tools can inspect it; :func:`main` prints it and
returns the exit code.
"""
import argparse
import json
import os
import platform
import sys
import warnings

import numpy as np

import triflux
from triflux import backend
from triflux.devices import DEVICE_CLASSES, CPU
from triflux.memory import format_bytes, memory_status
from triflux.preferences import BACKENDS, preferences_path, read_preference
from .flags import interpreter_notice

HELP = """\
Check which triflux backends work on this machine and why the others do not.

For each backend (CUDA, AMDGPU, Metal, CPU) it prints whether it is functional
and, when not, the reason (no GPU driver, torch or triton missing, a CPU-only
or ROCm build of torch, CUDA_VISIBLE_DEVICES, the Triton interpreter, the
preference file); the versions of Python, NumPy, torch and Triton; every
visible device with its name and memory; and a tiny self-test (add, matmul,
softmax) on each functional GPU device, compared with the CPU reference.

Exit status: 0 when the preferred backend is functional and passes its
self-test; 1 otherwise. The preferred backend is `gpu_backend` in
./LocalPreferences.toml ([triflux] section, see `triflux.gpu_backend`), or
CUDA when none is set (Flux's default). A preference of CPU always passes.
"""

#: largest error of the GPU self-test against the reference that still passes
SELFTEST_TOL = 1e-4

_ENV_VARS = ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", backend.INTERPRETER_DEVICES_VAR,
             "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "TRIFLUX_TEST_REAL_GPU")


def _version(module_name):
    try:
        mod = __import__(module_name)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def _preference():
    path = preferences_path()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        in_file = read_preference()
    at_import = triflux.GPU_BACKEND
    info = {"path": path, "exists": os.path.exists(path), "in_file": in_file,
            "active": at_import, "problems": [str(w.message) for w in caught]}
    if in_file != at_import:
        info["problems"].append(f"the file says {in_file!r} but this process started with "
                                f"{at_import!r}: restart Python for the file to take effect")
    return info


def _memory(dev):
    try:
        m = memory_status(dev)
    except Exception as e:  # never let a memory query break the report
        return f"unknown ({type(e).__name__}: {e})"
    return {k: getattr(m, k, None) for k in ("allocated", "reserved", "free", "total")}


def _selftest_inputs():
    rng = np.random.default_rng(1234)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((5, 7)).astype(np.float32)
    w = rng.standard_normal((7, 3)).astype(np.float32)
    return a, b, w


def _selftest_compute(dev, a, b, w):
    ta, tb, tw = dev(a), dev(b), dev(w)
    s = ta + tb
    y = triflux.matmul(s, tw)
    p = triflux.softmax(y, dims=1)
    outs = (s, y, p)
    for o in outs:
        if o.device != dev:
            raise AssertionError(f"a result landed on {o.device!r}, not on {dev!r}")
    return [o.numpy() for o in outs]


def selftest(dev):
    """Run add, matmul and softmax on ``dev`` and on the CPU reference:
    ``{"passed", "max_error", "error"}``."""
    a, b, w = _selftest_inputs()
    try:
        ref = _selftest_compute(CPU, a, b, w)
        got = _selftest_compute(dev, a, b, w)
    except Exception as e:
        return {"passed": False, "max_error": None, "error": f"{type(e).__name__}: {e}"}
    err = max(float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64)))) for g, r in zip(got, ref))
    ok = bool(np.isfinite(err) and err <= SELFTEST_TOL)
    return {"passed": ok, "max_error": err,
            "error": None if ok else f"max error {err:.3g} is above {SELFTEST_TOL:g}"}


def report(run_selftest=True):
    """Everything the doctor knows, as plain data:

    ``{"triflux", "python", "platform", "versions", "torch_build", "environment",
    "preference", "backends": [{"name", "functional", "reason", "devices":
    [{"device", "idx", "name", "physical", "memory", "selftest"}]}],
    "selected", "preferred", "preferred_default", "ok"}``.
    """
    f = backend.facts()
    out = {
        "triflux": triflux.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "versions": {"numpy": _version("numpy"), "torch": f.torch_version, "triton": f.triton_version,
                     "ml_dtypes": _version("ml_dtypes")},
        "import_errors": {k: v for k, v in (("torch", f.torch_error), ("triton", f.triton_error)) if v},
        "torch_build": {"cuda": f.cuda_version, "hip": f.hip_version,
                        "cuda_available": f.cuda_available, "device_count": f.device_count},
        "environment": {k: os.environ.get(k) for k in _ENV_VARS},
        "interpreter": f.interpreter,
        "preference": _preference(),
        "backends": [],
    }
    for name in BACKENDS:
        ok, why = backend.status(name)
        entry = {"name": name, "functional": ok, "reason": why, "devices": []}
        if ok and name == "CPU":
            entry["devices"].append({"device": repr(CPU), "idx": None, "name": "host CPU (NumPy)",
                                     "physical": None, "memory": _memory(CPU),
                                     "selftest": {"passed": True, "max_error": 0.0,
                                                  "error": None, "reference": True}})
        elif ok:
            for k, (phys, dname) in enumerate(backend.visible_devices()):
                dev = DEVICE_CLASSES[name](k)
                d = {"device": repr(dev), "idx": k, "name": dname, "physical": phys,
                     "memory": _memory(dev), "selftest": None}
                if run_selftest:
                    d["selftest"] = selftest(dev)
                entry["devices"].append(d)
        out["backends"].append(entry)
    try:
        out["selected"] = repr(triflux.get_device())
    except Exception as e:
        out["selected"] = f"error: {type(e).__name__}: {e}"
    pref = out["preference"]["active"]
    out["preferred"] = pref or "CUDA"
    out["preferred_default"] = pref is None
    chosen = next(b for b in out["backends"] if b["name"] == out["preferred"])
    tests_ok = all(d["selftest"] is None or d["selftest"]["passed"] for d in chosen["devices"])
    out["ok"] = bool(chosen["functional"] and tests_ok)
    return out


def _bytes(n):
    if n is None:
        return "?"
    return format_bytes(n)


def _memory_text(m):
    if isinstance(m, str):
        return m
    parts = [f"{_bytes(m.get('allocated'))} allocated"]
    if m.get("reserved") is not None:
        parts.append(f"{_bytes(m['reserved'])} reserved")
    parts.append(f"{_bytes(m.get('free'))} free of {_bytes(m.get('total'))}")
    return ", ".join(parts)


def format_report(r):
    """The report as the text the command prints."""
    v = r["versions"]
    tb = r["torch_build"]
    lines = [f"triflux {r['triflux']} doctor",
             f"Python {r['python']} ({r['platform']})"]
    torch_s = (f"torch {v['torch']} (CUDA {tb['cuda'] or 'none'}, HIP {tb['hip'] or 'none'})"
               if v["torch"] else f"torch not installed ({r['import_errors'].get('torch', '')})")
    triton_s = f"triton {v['triton']}" if v["triton"] else "triton not installed"
    lines.append(f"Packages: numpy {v['numpy']}, {torch_s}, {triton_s}, ml_dtypes {v['ml_dtypes'] or 'not installed'}")
    env = ", ".join(f"{k}={val!r}" for k, val in r["environment"].items() if val is not None) or "none set"
    lines.append(f"Environment: {env}")
    p = r["preference"]
    if p["exists"]:
        lines.append(f"Preference: {p['path']}: gpu_backend = {p['in_file']!r} (active: {p['active']!r})")
    else:
        lines.append(f"Preference: none ({p['path']} does not exist); "
                     "automatic order CUDA, AMDGPU, Metal, CPU")
    for prob in p["problems"]:
        lines.append(f"  ! {prob}")
    lines.append("")
    lines.append("Backends:")
    for b in r["backends"]:
        state = "functional" if b["functional"] else "not functional"
        lines.append(f"  {b['name']:<7} {state:<15} {b['reason']}")
        for d in b["devices"]:
            where = f" (physical {d['physical']})" if d["physical"] is not None else ""
            lines.append(f"    {d['device']}: {d['name']}{where}")
            lines.append(f"      memory: {_memory_text(d['memory'])}")
            t = d["selftest"]
            if t is None:
                lines.append("      self-test: skipped")
            elif t.get("reference"):
                lines.append("      self-test: this is the reference")
            else:
                verdict = "PASS" if t["passed"] else "FAIL"
                err = "n/a" if t["max_error"] is None else f"{t['max_error']:.3g}"
                extra = "" if t["passed"] else f" - {t['error']}"
                lines.append(f"      self-test add+matmul+softmax vs CPU reference: {verdict} "
                             f"(max error {err}){extra}")
    lines.append("")
    lines.append(f"get_device() selects: {r['selected']}")
    how = "default, no preference set" if r["preferred_default"] else "from the preference"
    chosen = next(b for b in r["backends"] if b["name"] == r["preferred"])
    if r["ok"]:
        verdict = "OK"
    elif not chosen["functional"]:
        verdict = (f"NOT functional: {chosen['reason']} (exit status 1). Without a GPU, "
                   "TRITON_INTERPRET=1 runs the kernels in the Triton interpreter, or choose the CPU "
                   "with `triflux.gpu_backend(\"CPU\")`")
    else:
        verdict = "FAILS its self-test (exit status 1); please report it with this output"
    lines.append(f"Preferred backend: {r['preferred']} ({how}): {verdict}")
    return "\n".join(lines)


def _parser():
    p = argparse.ArgumentParser(prog="python -m triflux doctor", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-selftest", action="store_true", help="skip the kernel self-test")
    return p


def main(argv=None):
    """Print the report; return 0 when the preferred backend works, else 1
    (2 for bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    interpreter_notice(DEVICE_CLASSES["CUDA"](0), "The self-test checks the kernels' results, not their speed.")
    r = report(run_selftest=not args.no_selftest)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        print(format_report(r))
    sys.stdout.flush()
    return 0 if r["ok"] else 1
