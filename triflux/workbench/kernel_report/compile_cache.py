"""Compiling many specializations once: findings cached on disk by source
hash, specialization, architecture and Triton version (:func:`cache_dir`,
:func:`cache_key`), the rest compiled in one subprocess with the
interpreter off (:func:`compile_all` starts it; :func:`compile_worker` is
what it runs: ``python -m triflux.workbench.kernel_report --compile-worker``).
A jitted function is either interpreted or compiled, decided when its module
is imported, so the compiling happens in a process of its own."""
import contextlib
import hashlib
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time

import triflux as tf
from .compiled import METRICS_VERSION, compiled_metrics
from .specializations import Specialization, compile_specialization


def cache_dir():
    """Where compiled-kernel findings are kept ($TRIFLUX_KERNEL_CACHE, default ~/.cache/triflux/kernels)."""
    return os.environ.get("TRIFLUX_KERNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "triflux",
                                                                  "kernels")


def cache_key(fingerprint, spec, arch):
    import triton
    text = json.dumps([METRICS_VERSION, triton.__version__, arch, fingerprint, spec.key()])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _cache_read(key):
    try:
        with open(os.path.join(cache_dir(), key + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _cache_write(key, value):
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        os.replace(tmp, os.path.join(folder, key + ".json"))
    except OSError:
        pass                       # a read-only home: no cache, still correct


def _source_root():
    """The folder to put on PYTHONPATH so a subprocess imports this triflux."""
    return os.path.dirname(os.path.dirname(os.path.abspath(tf.__file__)))


@contextlib.contextmanager
def _cache_lock():
    """Held while compiling, so that concurrent reports (two test workers)
    compile each specialization once: the second finds the first's results."""
    try:
        import fcntl
        os.makedirs(cache_dir(), exist_ok=True)
        f = open(os.path.join(cache_dir(), "compile.lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compile_all(jobs, arch):
    """Metrics for each (fingerprint, Specialization) in ``jobs``: from the
    cache, the rest compiled in one subprocess with the interpreter off.
    Returns ({spec key: metrics or {"error": ...}}, how many were compiled)."""
    keys = {spec.key(): cache_key(fingerprint, spec, arch) for fingerprint, spec in jobs}
    specs = {spec.key(): spec for _, spec in jobs}
    results = {k: _cache_read(keys[k]) for k in specs}
    todo = [k for k, v in results.items() if v is None]
    if not todo:
        return results, 0
    with _cache_lock():
        results.update({k: _cache_read(keys[k]) for k in todo})
        todo = [k for k in todo if results[k] is None]
        if todo:
            for k, metrics in zip(todo, run_compile_worker([specs[k] for k in todo], arch)):
                results[k] = metrics
                if "error" not in metrics:
                    _cache_write(keys[k], metrics)
    return results, len(todo)


def run_compile_worker(specs, arch):
    """Metrics of each of ``specs``, compiled in a subprocess with the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # ptxas runs on every compile and prints its -v log (spill stores) to stdout
    env.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")
    env["PYTHONPATH"] = os.pathsep.join([_source_root(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    request = json.dumps({"arch": arch, "jobs": [spec.encoded() for spec in specs]})
    # python -m triflux.workbench.kernel_report --compile-worker: compile_worker, through __main__.py
    proc = subprocess.run([sys.executable, "-m", __package__, "--compile-worker"], input=request,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"the compile worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_worker():
    """Reads {"arch", "jobs"} on stdin, prints one metrics dict per job (JSON)."""
    request = json.loads(sys.stdin.read())
    out = []
    for job in request["jobs"]:
        spec = Specialization.decoded(job)
        t0 = time.perf_counter()
        try:
            kernel = getattr(importlib.import_module(spec.module), spec.kernel)
            with contextlib.redirect_stdout(io.StringIO()) as log:
                compiled = compile_specialization(kernel, spec, request["arch"])
            metrics = compiled_metrics(compiled, request["arch"], log.getvalue())
        except Exception as e:       # reported per specialization
            metrics = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        metrics["compile_s"] = round(time.perf_counter() - t0, 3)
        out.append(metrics)
    print(json.dumps(out))
