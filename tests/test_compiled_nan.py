"""NaN on a real GPU: the kernels, compiled for an NVIDIA GPU (sm_90) without
one, must take minima and maxima of floats only in a NaN-propagating form.

Why. ``tl.minimum``/``tl.maximum``/``tl.max`` compile by default to PTX
``min.f32``/``max.f32``, which return the other operand when one is NaN, so
``elu(NaN)`` would be 0 on a GPU, while the Triton interpreter that CI runs
computes with NumPy and keeps the NaN: the property suite cannot see the
difference. Triton compiles for a GPU target without a GPU (it ships
``ptxas``), so this test compiles the kernels behind the NaN-sensitive
primitives exactly as they launch on a GPU and reads the PTX: every float
``min``/``max`` must carry ``.NaN`` (``max.NaN.f32``; PTX has no such form for
float64, where LLVM follows ``max.f64`` with ``setp.nan.f64`` on its operands
and a select of NaN, which is accepted), or there must be none at all
(explicit comparisons). The kernels use ``triton_kernels.numerics.maximum/
minimum/max_along`` for that.

How it works. Each entry of :data:`NAN_SENSITIVE_LAUNCHES` calls a host
function the way triflux does, on small CPU tensors; in a subprocess with the
interpreter off (``@triton.jit`` then builds real kernels, and every tile and
block size is the GPU's), ``launch.launch`` is replaced by a recorder, and each
Triton kernel launched is compiled with ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))``, its signature and constexprs taken from
the recorded arguments (``triflux.workbench.kernel_report.specialization``, as
Triton's launcher specializes them). The subprocess runs once per session; compiling takes
a few seconds (Triton's cache makes reruns faster).

How to add a kernel: append one line to ``NAN_SENSITIVE_LAUNCHES``, a name and
a function of ``(K, t)``: ``K.<family>`` is ``triflux.triton_kernels.<family>``,
``t(*shape, dtype="float32")`` makes a CPU tensor (of ones); e.g.

    ("maxpool forward", lambda K, t: K.pool.maxpool_forward(
        t(2, 3, 9, 9), window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),

Every kernel that call launches is checked (backward functions that launch
several kernels are covered whole).
"""
import json
import os
import re
import subprocess
import sys

import pytest

from triflux.workbench.kernel_report import Specialization, compile_specialization, specialization

#: (name, call): the NaN-sensitive kernel specializations, by the host call
#: that launches them (see the module docstring)
NAN_SENSITIVE_LAUNCHES = [
    # elementwise: activations that compare or clamp, forward and backward
    ("relu forward", lambda K, t: K.elementwise.relu_forward(t(1000))),
    ("relu backward", lambda K, t: K.elementwise.relu_backward(t(1000), None, t(1000))),
    ("abs forward", lambda K, t: K.elementwise.abs_forward(t(1000))),
    ("abs backward", lambda K, t: K.elementwise.abs_backward(t(1000), None, t(1000))),
    ("tanh forward", lambda K, t: K.elementwise.tanh_forward(t(1000))),
    ("softplus forward", lambda K, t: K.elementwise.softplus_forward(t(1000))),
    ("leakyrelu forward", lambda K, t: K.elementwise.leakyrelu_forward(t(1000), 0.1)),
    ("leakyrelu backward", lambda K, t: K.elementwise.leakyrelu_backward(t(1000), None, t(1000), 0.1)),
    ("elu forward", lambda K, t: K.elementwise.elu_forward(t(1000), 1.0)),
    ("elu backward", lambda K, t: K.elementwise.elu_backward(t(1000), None, t(1000), 1.0)),
    ("gelu backward", lambda K, t: K.elementwise.gelu_backward(t(1000), None, t(1000))),
    ("gelu_erf forward", lambda K, t: K.elementwise.gelu_erf_forward(t(1000))),
    ("gelu_erf backward", lambda K, t: K.elementwise.gelu_erf_backward(t(1000), None, t(1000))),
    ("maximum forward", lambda K, t: K.elementwise.maximum_forward(t(1000), t(1000))),
    ("maximum forward float64", lambda K, t: K.elementwise.maximum_forward(
        t(1000, dtype="float64"), t(1000, dtype="float64"))),
    ("minimum forward", lambda K, t: K.elementwise.minimum_forward(t(1000), t(1000))),
    ("maximum backward", lambda K, t: K.elementwise.maximum_backward(t(1000), None, t(1000), t(1000))),
    ("minimum backward", lambda K, t: K.elementwise.minimum_backward(t(1000), None, t(1000), t(1000))),
    # reductions: the row maximum (float64's takes other integer keys)
    ("max forward", lambda K, t: K.reduce.max_forward(t(64, 100), axis=(1,))),
    ("max forward float64", lambda K, t: K.reduce.max_forward(t(64, 100, dtype="float64"), axis=(1,))),
    ("max backward", lambda K, t: K.reduce.max_backward(t(64), t(64), t(64, 100), axis=(1,))),
    # softmax family: one chunk per row, and the online sweep of long rows
    ("softmax forward", lambda K, t: K.softmax.softmax_forward(t(64, 100), 1)),
    ("softmax forward, long rows", lambda K, t: K.softmax.softmax_forward(t(4, 5000), 1)),
    ("logsumexp forward", lambda K, t: K.softmax.logsumexp_forward(t(64, 100), 1)),
    ("logsumexp backward (long-row sweep)", lambda K, t: K.softmax.logsumexp_backward(
        t(64), t(64), t(64, 100), 1)),
    # batch norm: the variance floor
    ("batchnorm_train forward", lambda K, t: K.norm.batchnorm_train_forward(t(8, 3, 5, 5), t(3), t(3))),
    ("batchnorm_train backward", lambda K, t: K.norm.batchnorm_train_backward(
        t(8, 3, 5, 5), None, t(8, 3, 5, 5), t(3), t(3))),
    ("batchnorm_train relu forward (the fused activation)", lambda K, t: K.norm.batchnorm_train_forward(
        t(8, 3, 5, 5), t(3), t(3), activation="relu")),
    ("batchnorm_train relu backward (g relu'(y))", lambda K, t: K.norm.batchnorm_train_backward(
        t(8, 3, 5, 5), t(8, 3, 5, 5), t(8, 3, 5, 5), t(3), t(3), activation="relu")),
    # conv_bias_act: the fused relu epilogue and its gradient
    ("conv_bias_act relu forward", lambda K, t: K.conv.conv_bias_act_forward(
        t(2, 3, 9, 9), t(4, 3, 3, 3), t(4), activation="relu")),
    ("conv_bias_act relu backward (gz = G relu'(y))", lambda K, t: K.bias_act.act_grad_and_bias_grad(
        t(2, 4, 7, 7), t(2, 4, 7, 7), t(4), K.numerics.ACTIVATION_CODES["relu"])),
    # dense_bias_act: the matmul kernel's relu epilogue, and its gradient through a (rows, O) matrix
    ("dense_bias_act relu forward", lambda K, t: K.matmul.dense_bias_act_forward(
        t(8, 9), t(4, 9), t(4), activation="relu")),
    ("dense_bias_act relu backward", lambda K, t: K.matmul.dense_bias_act_backward(
        t(8, 4), t(8, 4), t(8, 9), t(4, 9), t(4), activation="relu")),
    # dropout: the mask multiplies (a dropped NaN stays NaN)
    ("dropout forward", lambda K, t: K.dropout.dropout_forward(t(1000), 0.5, 7)),
    # max pooling: the window scan (first real, greater, or NaN), forward and argmax + routing
    ("maxpool forward", lambda K, t: K.pool.maxpool_forward(
        t(2, 3, 9, 9), window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),
    ("maxpool forward dilated ceil_mode float64", lambda K, t: K.pool.maxpool_forward(
        t(2, 3, 9, 9, dtype="float64"), window=(3, 2), stride=(2, 1), padding=(1, 1, 1, 1),
        dilation=(1, 2), ceil_mode=True)),
    ("maxpool backward", lambda K, t: K.pool.maxpool_backward(
        t(2, 3, 5, 5), None, t(2, 3, 9, 9), window=(3, 3), stride=(2, 2), padding=(1, 1, 1, 1))),
    ("maxpool 1-d forward", lambda K, t: K.pool.maxpool_forward(t(2, 3, 9), window=(3,), stride=(2,), padding=(1, 1))),
    ("maxpool 3-d forward", lambda K, t: K.pool.maxpool_forward(
        t(2, 3, 4, 6, 6), window=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0, 0, 0, 0))),
    ("maxpool 3-d backward", lambda K, t: K.pool.maxpool_backward(
        t(2, 3, 2, 3, 3), None, t(2, 3, 4, 6, 6), window=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0, 0, 0, 0))),
    ("adaptive_maxpool forward", lambda K, t: K.pool.adaptive_maxpool_forward(t(2, 3, 9, 7), size=(4, 3))),
    ("adaptive_maxpool forward float64", lambda K, t: K.pool.adaptive_maxpool_forward(
        t(2, 3, 9, 7, dtype="float64"), size=(1, 1))),
    ("adaptive_maxpool backward", lambda K, t: K.pool.adaptive_maxpool_backward(
        t(2, 3, 4, 3), None, t(2, 3, 9, 7), size=(4, 3))),
    ("adaptive_maxpool 3-d forward", lambda K, t: K.pool.adaptive_maxpool_forward(t(2, 3, 5, 9, 7), size=(2, 4, 3))),
    # Lp-norm pooling: p = inf is the maximum of |x| (the scan again); finite p sums pow (exp2/log2 and selects)
    ("lpnormpool inf forward and backward", lambda K, t: K.pool.lpnormpool_backward(
        t(2, 3, 4, 4), None, t(2, 3, 9, 9), p=float("inf"), window=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0))),
    ("lpnormpool 1.5 backward float64", lambda K, t: K.pool.lpnormpool_backward(
        t(2, 3, 5, dtype="float64"), None, t(2, 3, 9, dtype="float64"), p=1.5, window=(3,), stride=(2,),
        padding=(1, 1))),
]

#: PTX types of floating operands
_FLOAT_TYPES = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64"}
_MIN_MAX = re.compile(r"\b(?:min|max)((?:\.[A-Za-z0-9_]+)+)")
_OPERAND = r"(%\w+|0d[0-9A-Fa-f]+)"
_F64_MIN_MAX = re.compile(rf"\b(?:min|max)\.f64\s+(%\w+),\s*{_OPERAND},\s*{_OPERAND};")
_SETP_NAN = re.compile(rf"\bsetp\.nan\.f64\s+(%\w+),\s*{_OPERAND},\s*{_OPERAND};")


def _nan_fixed_up(ptx, dst, a, b):
    """Whether the float64 min/max ``dst = op(a, b)`` is LLVM's expansion of
    the NaN-propagating form (PTX has no min.NaN.f64): its register operands
    tested by ``setp.nan.f64 p`` and the result replaced by NaN under ``p``."""
    regs = {r for r in (a, b) if r.startswith("%")}
    for m in _SETP_NAN.finditer(ptx):
        if regs <= {m.group(2), m.group(3)}:
            nan = r"0d[7Ff][Ff][Ff][0-9A-Fa-f]+"   # a NaN constant
            select = rf"\bselp\.f64\s+%\w+,\s*{nan},\s*{re.escape(dst)},\s*{re.escape(m.group(1))};"
            if re.search(select, ptx):
                return True
    return False


def nan_dropping_instructions(ptx):
    """The distinct min/max instructions on floats in ``ptx`` that return the
    non-NaN operand: those without the ``.NaN`` modifier, except float64 ones
    whose result is replaced by NaN when an operand is NaN (see _nan_fixed_up)."""
    bad = set()
    for m in _MIN_MAX.finditer(ptx):
        parts = m.group(1).split(".")[1:]
        if _FLOAT_TYPES.intersection(parts) and "NaN" not in parts and parts != ["f64"]:
            bad.add(m.group(0))
    for m in _F64_MIN_MAX.finditer(ptx):
        if not _nan_fixed_up(ptx, *m.groups()):
            bad.add(m.group(0).split()[0])
    return sorted(bad)


def min_max_forms(ptx):
    return sorted({m.group(0) for m in _MIN_MAX.finditer(ptx)})


# --- the worker: runs in a subprocess with the interpreter off -----------------------------

def _compile_ptx(kernel, spec):
    return compile_specialization(kernel, spec, "sm_90").asm["ptx"]


def _worker():
    """Compile every launch of NAN_SENSITIVE_LAUNCHES (and the two checker
    probes) and print the findings as JSON."""
    import types

    import torch
    import triton

    from triflux.triton_kernels import launch
    K = types.SimpleNamespace()
    for family in ("elementwise", "reduce", "softmax", "norm", "conv", "dropout", "fill", "optimise",
                   "matmul", "shape", "pool", "rnn", "numerics", "bias_act"):
        try:
            setattr(K, family, __import__(f"triflux.triton_kernels.{family}", fromlist=[family]))
        except ImportError:
            pass

    def t(*shape, dtype="float32"):
        return torch.ones(shape, dtype=getattr(torch, dtype))

    launches = []
    launch.launch = lambda kernel, grid, *args, **meta: launches.append((kernel, args, meta))
    compiled = {}
    results = []
    for name, call in NAN_SENSITIVE_LAUNCHES:
        launches.clear()
        entry = {"name": name, "kernels": [], "error": None}
        try:
            call(K, t)
            for kernel, args, meta in launches:
                spec = specialization(kernel, args, meta)
                if spec.key() not in compiled:
                    compiled[spec.key()] = _compile_ptx(kernel, spec)
                ptx = compiled[spec.key()]
                entry["kernels"].append({
                    "kernel": kernel.__name__,
                    "constexprs": {k: str(v) for k, v in spec.constexprs.items()},
                    "nan_dropping": nan_dropping_instructions(ptx),
                    "forms": min_max_forms(ptx)})
        except Exception as e:  # reported per entry
            entry["error"] = f"{type(e).__name__}: {e}"
        results.append(entry)

    # the checker's own probes: plain tl.maximum must be caught, the NaN form not
    probes = {}
    for fn in _probe_kernels():
        for ty in ("fp32", "fp64"):
            spec = Specialization(fn.__module__, fn.__name__, {"x": "*" + ty, "y": "*" + ty, "BLOCK": "constexpr"},
                                  {"BLOCK": 128}, ("x", "y"), {})
            ptx = _compile_ptx(fn, spec)
            probes[f"{fn.__name__} {ty}"] = nan_dropping_instructions(ptx)
    print(json.dumps({"launches": results, "probes": probes, "triton": triton.__version__}))


def _probe_kernels():
    """Two tiny kernels, y = max(x, 0): plain tl.maximum and numerics.maximum."""
    import triton
    import triton.language as tl

    from triflux.triton_kernels import numerics

    def plain_max(x, y, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y + i, tl.maximum(tl.load(x + i), 0.0))

    def nan_max(x, y, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y + i, numerics.maximum(tl.load(x + i), 0.0))
    return triton.jit(plain_max), triton.jit(nan_max)


# --- the tests ----------------------------------------------------------------------------------

def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def compiled():
    """The worker's findings (one subprocess per session)."""
    try:
        import triton
        import triton.backends.compiler
        import triton.backends.nvidia  # noqa: F401
    except ImportError as e:
        pytest.skip(f"needs Triton with its NVIDIA backend to compile for a GPU target: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([_repo_root(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=_repo_root())
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"the compile worker failed (exit {proc.returncode}, Triton {triton.__version__}):\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ty", ["fp32", "fp64"])
def test_checker_catches_a_plain_maximum(compiled, ty):
    """The PTX check bites: plain tl.maximum compiles to a NaN-dropping max
    (max.f32; max.f64 without a NaN select), numerics.maximum does not."""
    assert compiled["probes"][f"plain_max {ty}"], f"plain tl.maximum ({ty}) was not flagged"
    assert compiled["probes"][f"nan_max {ty}"] == [], compiled["probes"][f"nan_max {ty}"]


@pytest.mark.parametrize("name", [n for n, _ in NAN_SENSITIVE_LAUNCHES])
def test_kernel_keeps_nan_on_a_gpu(name, compiled):
    entry = next(e for e in compiled["launches"] if e["name"] == name)
    assert entry["error"] is None, \
        f"{name}: could not be compiled for sm_90 (Triton {compiled['triton']}): {entry['error']}"
    assert entry["kernels"], f"{name}: launched no Triton kernel"
    for k in entry["kernels"]:
        assert not k["nan_dropping"], (
            f"{name}: kernel {k['kernel']} ({k['constexprs']}) compiles to {k['nan_dropping']} "
            f"(all min/max forms: {k['forms']}): PTX min/max without .NaN return the other operand "
            "when one is NaN, so the GPU drops a NaN the reference keeps. Use "
            "triton_kernels.numerics.maximum/minimum/max_along (propagate_nan=tl.PropagateNan.ALL) or "
            "an explicit comparison that sends NaN down the right branch")


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker()
