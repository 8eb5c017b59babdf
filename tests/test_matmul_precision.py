"""``set_matmul_precision("tf32")``: float32 dots on TF32 tensor cores.

What is checked, and where it can be seen:

* the setting itself: the default "ieee", torch's spellings, the error;
* ``numerics.dot_kind`` picks DOT_TF32 for float32 operands only, and every
  GEMM-shaped kernel launch (matmul, dense_bias_act, conv, conv_transpose,
  conv_bias_act of any rank, the recurrent layers; forward and backward) receives it: ``launch.launch``
  is replaced by a recorder and the ``DOT`` constexpr of each launch is read;
* the kernels' dots really read TF32 operands: float32 values whose only
  nonzero bits are among the 13 that TF32 drops come out of a TF32 product
  as if those bits were zero;
* the property suite's forward and backward comparisons of matmul and conv
  pass with the TF32 row of tests/tolerances.py;
* compiled for sm_80 and sm_90 (no GPU needed), the TF32 specializations
  multiply with ``mma ... .tf32`` / ``wgmma ... .tf32`` and the IEEE ones do not.

The Triton interpreter cannot show TF32 rounding: its ``tl.dot`` ignores
``input_precision`` and multiplies exact float32 values (NumPy's matmul). So
in the interpreter, and only there, the tests that compute replace its dot by
one that does what the tensor cores do with ``input_precision="tf32"``: drop
the low 13 bits of every finite float32 operand, then multiply and accumulate
in float32 (``tf32_interpreter``). What reaches a real GPU is proven by the
compiled code instead. On a real GPU (``TRIFLUX_TEST_REAL_GPU=1``) the same
tests run on the hardware's TF32.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import triflux
from triflux import backend
from triflux.matmul_precision import get_matmul_precision, set_matmul_precision

#: the low float32 bits TF32 drops (its significand keeps 10 of float32's 23)
TF32_DROPPED_BITS = 13


@pytest.fixture
def precision():
    """Sets the precision for one test and restores the one before."""
    before = get_matmul_precision()
    yield set_matmul_precision
    set_matmul_precision(before)


# --- the setting -------------------------------------------------------------------------------

def test_default_is_ieee_and_the_setting_round_trips(precision):
    assert triflux.get_matmul_precision() == "ieee"
    for given, meant in (("tf32", "tf32"), ("ieee", "ieee"), ("high", "tf32"), ("highest", "ieee"),
                         ("TF32", "tf32"), ("IEEE", "ieee")):
        triflux.set_matmul_precision(given)
        assert triflux.get_matmul_precision() == meant, given


@pytest.mark.parametrize("bad", ["medium", "fp32", "", None, 32])
def test_unknown_precision_names_the_accepted_ones(precision, bad):
    precision("tf32")
    with pytest.raises(ValueError) as e:
        triflux.set_matmul_precision(bad)
    for name in ('"ieee"', '"tf32"', '"highest"', '"high"', repr(bad)):
        assert name in str(e.value)
    assert get_matmul_precision() == "tf32", "a rejected value must leave the setting alone"


# --- the dot kind on the host ------------------------------------------------------------------

requires_kernels = pytest.mark.requires_kernels


@requires_kernels
@pytest.mark.parametrize("interpret", [False, True], ids=["gpu", "interpreter"])
def test_dot_kind(precision, monkeypatch, interpret):
    import torch
    from triflux.triton_kernels import launch, numerics as nu
    monkeypatch.setattr(launch, "INTERPRET", interpret)
    f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
    sixteen = nu.DOT_IEEE_FP32.value if interpret else nu.DOT_NATIVE.value
    for mode, fp32 in (("ieee", nu.DOT_IEEE_FP32.value), ("tf32", nu.DOT_TF32.value)):
        precision(mode)
        expected = {(f32,): fp32, (f32, f32): fp32, (f32, f16): fp32, (bf16, f32): fp32,
                    (f64,): nu.DOT_FP64.value, (f64, f32): nu.DOT_FP64.value,
                    (f16,): sixteen, (bf16, bf16): sixteen, (f16, bf16): nu.DOT_IEEE_FP32.value}
        for dtypes, kind in expected.items():
            assert nu.dot_kind(*dtypes) == kind, (mode, dtypes)


def _gemm_calls(dtype):
    """(name, call) for every host function that launches a GEMM-shaped
    kernel, on small tensors of ``dtype`` (their values do not matter: the
    launches are only recorded)."""
    import torch
    from triflux.triton_kernels import conv, matmul, rnn

    def t(*shape):
        return torch.ones(shape, dtype=dtype)
    N, L, In, H = 2, 3, 5, 4
    return [
        ("matmul forward", lambda: matmul.matmul_forward(t(5, 7), t(7, 9))),
        ("matmul backward", lambda: matmul.matmul_backward(t(3, 5, 9), None, t(3, 5, 7), t(3, 7, 9))),
        ("dense_bias_act forward", lambda: matmul.dense_bias_act_forward(t(3, 5, 7), t(9, 7), t(9), activation="relu")),
        ("dense_bias_act backward", lambda: matmul.dense_bias_act_backward(
            t(3, 5, 9), t(3, 5, 9), t(3, 5, 7), t(9, 7), t(9), activation="tanh")),
        ("conv forward", lambda: conv.conv_forward(t(2, 4, 9, 9), t(6, 4, 3, 3))),
        ("conv backward", lambda: conv.conv_backward(t(2, 6, 7, 7), None, t(2, 4, 9, 9), t(6, 4, 3, 3))),
        ("conv 3-D backward", lambda: conv.conv_backward(t(1, 3, 2, 3, 2), None, t(1, 2, 3, 4, 3), t(3, 2, 2, 2, 2))),
        ("conv_transpose forward", lambda: conv.conv_transpose_forward(
            t(2, 4, 5, 5), t(4, 3, 3, 3), stride=(2, 2))),
        ("conv_transpose backward", lambda: conv.conv_transpose_backward(
            t(2, 3, 11, 11), None, t(2, 4, 5, 5), t(4, 3, 3, 3), stride=(2, 2))),
        ("conv_bias_act forward", lambda: conv.conv_bias_act_forward(
            t(2, 4, 9, 9), t(6, 4, 3, 3), t(6), activation="relu")),
        ("conv_bias_act backward", lambda: conv.conv_bias_act_backward(
            t(2, 6, 7, 7), t(2, 6, 7, 7), t(2, 4, 9, 9), t(6, 4, 3, 3), t(6), activation="relu")),
        ("lstm forward", lambda: rnn.lstm_sequence_forward(
            t(N, L, In), t(N, H), t(N, H), t(4 * H, In), t(4 * H, H), t(4 * H), t(4 * H))),
        ("gru backward", lambda: rnn.gru_sequence_backward(
            t(N, L, H), t(N, L, H), t(N, L, In), t(N, H), t(3 * H, In), t(3 * H, H), t(3 * H), t(3 * H))),
    ]


def _recorded_dot_kinds(monkeypatch, call):
    """{kernel name: set of DOT constexprs} over the launches ``call`` makes
    (kernels not run: ``launch.launch`` only records)."""
    from triflux.triton_kernels import launch
    kinds = {}

    def record(kernel, grid, *args, **meta):
        if "DOT" in kernel.arg_names:
            values = dict(zip(kernel.arg_names, args), **meta)
            kinds.setdefault(kernel.__name__, set()).add(values["DOT"])
    monkeypatch.setattr(launch, "launch", record)
    call()
    return kinds


@requires_kernels
@pytest.mark.parametrize("mode", ["ieee", "tf32"])
def test_every_float32_gemm_launch_receives_the_precision(precision, monkeypatch, mode):
    import torch
    from triflux.triton_kernels import numerics as nu
    precision(mode)
    expected = nu.DOT_TF32.value if mode == "tf32" else nu.DOT_IEEE_FP32.value
    for name, call in _gemm_calls(torch.float32):
        kinds = _recorded_dot_kinds(monkeypatch, call)
        assert kinds, f"{name}: launched no kernel with a DOT argument"
        for kernel, seen in kinds.items():
            assert seen == {expected}, f"{name}: {kernel} launched with DOT {seen}, expected {expected} ({mode})"


@requires_kernels
def test_tf32_leaves_float64_and_16_bit_dots_alone(precision, monkeypatch):
    import torch
    from triflux.triton_kernels import numerics as nu
    precision("tf32")
    for dtype in (torch.float64, torch.float16):
        expected = nu.dot_kind(dtype)
        assert expected != nu.DOT_TF32.value
        for name, call in _gemm_calls(dtype):
            if name.startswith(("lstm", "gru")):         # the recurrent layers take float32/float64
                continue
            for kernel, seen in _recorded_dot_kinds(monkeypatch, call).items():
                assert seen == {expected}, f"{name} {dtype}: {kernel} launched with DOT {seen}"


# --- the kernels' dots read TF32 operands --------------------------------------------------------

def _tf32_truncate(a):
    """float32 ``a`` with the low 13 bits of every finite value cleared."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    kept = (a.view(np.uint32) & np.uint32(~((1 << TF32_DROPPED_BITS) - 1) & 0xFFFFFFFF)).view(np.float32)
    return np.where(np.isfinite(a), kept, a)


@pytest.fixture
def tf32_interpreter(monkeypatch):
    """In the interpreter: its dot with input_precision="tf32" made to drop the
    operands' low 13 bits as tensor cores do (see the module docstring)."""
    if not backend.interpreter_on():
        return
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    exact_dot = interpreter.InterpreterBuilder.create_dot

    def tf32_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32 == b.data.dtype:
            a = interpreter.TensorHandle(_tf32_truncate(a.data), a.dtype)
            b = interpreter.TensorHandle(_tf32_truncate(b.data), b.dtype)
        return exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", tf32_dot)


#: 1 + 2^-20: a float32 number whose only fraction bit is one that TF32 drops
BELOW_TF32 = 1.0 + 2.0 ** -20


@requires_kernels
def test_tf32_dots_drop_the_low_bits(precision, tf32_interpreter, kernel_device):
    """Every operand 1 + 2^-20: a TF32 product reads 1, so each output is the
    number of products K exactly; an IEEE one is above K (about K (1 + 2^-19))."""
    import torch
    from triflux.triton_kernels import conv, matmul

    def t(*shape):
        return torch.full(shape, BELOW_TF32, dtype=torch.float32, device=kernel_device)
    K, M = 40, 19
    calls = {
        "matmul forward": (lambda: [matmul.matmul_forward(t(M, K), t(K, M))], K),
        # both gradients sum over M products: dA = G B^T, dB = A^T G
        "matmul backward": (lambda: list(matmul.matmul_backward(t(M, M), None, t(M, K), t(K, M))), M),
        "conv forward": (lambda: [conv.conv_forward(t(2, 4, 6, 6), t(5, 4, 3, 3))], 4 * 3 * 3),
        # the weight gradient sums over the 2 * 4 * 4 output pixels
        "conv weight gradient": (lambda: [conv.conv_backward(t(2, 5, 4, 4), None, t(2, 4, 6, 6),
                                                             t(5, 4, 3, 3))[1]], 2 * 4 * 4),
    }
    for mode in ("tf32", "ieee"):
        precision(mode)
        for name, (call, k) in calls.items():
            for out in call():
                values = set(np.unique(out.cpu().numpy()).tolist())
                if mode == "tf32":
                    assert values == {float(k)}, (
                        f"{name}: a TF32 product of operands 1 + 2^-20 must read them as 1 and give "
                        f"{k}, got {sorted(values)}: the kernel's dot did not use TF32")
                else:
                    assert min(values) > k, f"{name}: IEEE products must see the low bits: {sorted(values)}"


# --- the property suite with the TF32 row --------------------------------------------------------

@requires_kernels
@pytest.mark.parametrize("name", ["matmul", "dense_bias_act", "conv", "conv_transpose", "conv_bias_act"])
def test_tf32_kernels_match_the_reference_within_the_tf32_row(name, precision, tf32_interpreter,
                                                             monkeypatch, kernel_device):
    """The property suite's float32 forward and backward comparisons, with the
    float32 tolerance replaced by the TF32 row. In the interpreter the kernels'
    dots are the emulated TF32 ones (the fixture), so this checks the row
    against TF32 arithmetic, not only against IEEE results that would pass it
    anyway."""
    import test_primitives as suite
    import tolerances as tol
    from triflux.primitives import REGISTRY
    precision("tf32")
    monkeypatch.setitem(tol.TOLERANCES, "float32", tol.TOLERANCES["tf32"])
    suite.test_kernel_forward_matches_reference(prim=REGISTRY[name], dtype="float32", kernel_device=kernel_device)
    suite.test_kernel_backward_matches_reference(prim=REGISTRY[name], dtype="float32", kernel_device=kernel_device)


# --- the compiled code -----------------------------------------------------------------------------

#: the host calls whose kernels are compiled (each kernel of them, sm_80 and sm_90)
COMPILED_CALLS = ("matmul forward", "conv backward", "lstm forward")


def _worker():
    """In a subprocess with the interpreter off: record the launches of
    COMPILED_CALLS in float32 under each precision (IEEE: matmul only, the
    control), compile each specialization for sm_80 and sm_90 and print what
    its PTX multiplies with, as JSON."""
    import re

    import torch
    import triton

    from triflux.triton_kernels import launch
    from triflux.workbench.kernel_report import compile_specialization, specialization
    launch.INTERPRET = False
    launches = []
    launch.launch = lambda kernel, grid, *args, **meta: launches.append((kernel, args, meta))
    calls = dict(_gemm_calls(torch.float32))
    found = []
    for mode, names in (("tf32", COMPILED_CALLS), ("ieee", ("matmul forward",))):
        set_matmul_precision(mode)
        for name in names:
            launches.clear()
            calls[name]()
            for kernel, args, meta in launches:
                if "DOT" not in kernel.arg_names:
                    continue
                spec = specialization(kernel, args, meta)
                for arch in (80, 90):
                    ptx = compile_specialization(kernel, spec, f"sm_{arch}").asm["ptx"]
                    found.append({"mode": mode, "call": name, "kernel": kernel.__name__, "arch": arch,
                                  "dot": spec.constexprs["DOT"],
                                  "multiplies": sorted(set(re.findall(r"\b(?:wgmma\.mma_async|mma)\.[\w.]+", ptx))),
                                  "ffma": len(re.findall(r"\bfma\.rn\.f32\b", ptx))})
    print(json.dumps({"triton": triton.__version__, "found": found}))


@pytest.fixture(scope="module")
def compiled():
    try:
        import triton
        import triton.backends.nvidia  # noqa: F401
    except ImportError as e:
        pytest.skip(f"needs Triton with its NVIDIA backend to compile for a GPU target: {e}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"the compile worker failed (exit {proc.returncode}, Triton {triton.__version__}):\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tf32_compiles_to_tf32_tensor_cores(compiled):
    from triflux.triton_kernels import numerics as nu
    tf32 = [f for f in compiled["found"] if f["mode"] == "tf32"]
    assert {f["call"] for f in tf32} == set(COMPILED_CALLS), tf32
    assert {f["kernel"] for f in tf32} >= {"_matmul_kernel", "_gather_conv_kernel", "_weight_grad_kernel"}
    for f in tf32:
        what = f"{f['call']}: {f['kernel']} for sm_{f['arch']} (Triton {compiled['triton']})"
        assert f["dot"] == nu.DOT_TF32.value, what
        assert any(".tf32" in m for m in f["multiplies"]), \
            f"{what}: no TF32 tensor-core instruction (mma/wgmma .tf32), only {f['multiplies']}"
    hopper = [m for f in tf32 if f["arch"] == 90 and f["kernel"] == "_matmul_kernel" for m in f["multiplies"]]
    assert any(m.startswith("wgmma.mma_async") for m in hopper), f"matmul on sm_90 uses no wgmma: {hopper}"


def test_ieee_compiles_to_ffma_only(compiled):
    ieee = [f for f in compiled["found"] if f["mode"] == "ieee"]
    assert ieee
    for f in ieee:
        what = f"{f['kernel']} for sm_{f['arch']} (Triton {compiled['triton']})"
        assert not f["multiplies"], f"{what}: IEEE float32 must not use tensor cores: {f['multiplies']}"
        assert f["ffma"], f"{what}: no fma.rn.f32"


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker()
