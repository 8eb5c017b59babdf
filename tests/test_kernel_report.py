"""Compiled-code checks without a GPU: the kernels of real training steps,
compiled for sm_90 and sm_80 by ``triflux.workbench.kernel_report``, must compile,
not spill in the conv, matmul, recurrent and normalisation kernels, must use
tensor cores for 16-bit dots and 128-bit loads in dense elementwise kernels.

The representative set (all of it cached by source hash under
``$TRIFLUX_KERNEL_CACHE``, default ``~/.cache/triflux/kernels``, so a rerun
with unchanged kernels compiles nothing):

* sm_90: every specialization that the demo's UNet step, the report's
  default UNet step (BatchNorms of few, small channels: one program per
  channel), the volumetric UNet step (``unet3d``: 3-D convolutions, pools
  and BatchNorms), the ``spatial`` step (the pad, Lp-pool, pixel-shuffle and
  linear-upsample kernels) and the benchmarks' MLP step launch, in float32
  and bfloat16, and the kernels with a dot (the recurrent ones among them) of
  the benchmarks' LSTM step;
* sm_80: the kernels with a dot of the demo, MLP and LSTM steps in bfloat16: the code that
  differs by architecture (mma.sync instead of wgmma, and the registers it
  takes), where the rest, float32 dots on FFMA included, lowers the same way;
  and every specialization of the UNet step in float32, since ptxas allocates
  registers differently by architecture too (a BatchNorm backward of 8 warps
  that took 62 registers on sm_90 spilled at 64 on sm_80).

Each architecture's steps are recorded for its default GPU (H100, A100),
whose SM count sizes the grids (tiles and split-K passes with them).

About 240 compiles: about 95 s of CPU with a cold cache (165-225 s wall on a
loaded 2-core machine), 10 s warm; the compile runs under a lock in the cache
folder, so test workers running this module side by side compile once.

The findings of the representative set are committed, by cache key (source
hash, specialization, architecture, Triton version), in
``tests/compiled_kernels.json``: the test copies them into a fresh cache, so
CI compiles only the specializations whose source changed since they were
recorded. After changing kernels, refresh the file with
``TRIFLUX_UPDATE_COMPILED_KERNELS=1 python -m pytest tests/test_kernel_report.py``
(that run compiles into ``$TRIFLUX_KERNEL_CACHE`` and keeps exactly the keys
the set uses).

Expectations that today's kernels do not meet are marked
``xfail(strict=True)`` in :data:`KNOWN_GAPS` with the reason: fixing the
kernel makes the test pass, and strict xfail then fails until the mark is
removed.
"""
import json
import os
import time
from pathlib import Path

import pytest

from helpers import run_python

#: architecture -> [(workload, dtype, only the kernels with a dot)]: the representative set
COMPILED = {
    "sm_90": [("demo", "float32", False), ("demo", "bfloat16", False), ("unet", "float32", False),
              ("unet", "bfloat16", False), ("unet3d", "float32", False), ("unet3d", "bfloat16", False),
              ("spatial", "float32", False), ("spatial", "bfloat16", False),
              ("mlp", "float32", False), ("mlp", "bfloat16", False), ("lstm", "float32", True),
              ("lstm", "bfloat16", True)],
    "sm_80": [("demo", "bfloat16", True), ("mlp", "bfloat16", True), ("lstm", "bfloat16", True),
              ("unet", "float32", False)],
}
ARCHS = tuple(COMPILED)
#: the representative set's compiled findings by cache key (see the module docstring)
SEED = Path(__file__).with_name("compiled_kernels.json")
#: kernel modules (triflux.triton_kernels.<family>) whose kernels must not spill
NO_SPILL_FAMILIES = ("conv", "matmul", "bias_act", "rnn", "norm")
#: kernel modules with dots that must use tensor cores on 16-bit inputs
DOT_FAMILIES = ("conv", "matmul", "rnn")

#: (check, arch, family) -> why today's kernels fail it (a fix flips the strict xfail)
KNOWN_GAPS = {}

#: the subprocess: record each step (interpreter on) for each architecture's GPU, compile
#: the union of specializations once per architecture, print every report's rows as JSON
_SCRIPT = """
import json, time
from triflux.workbench import kernel_report as kr
plan = {plan!r}
t0 = time.perf_counter()
recorded = {{(w, d, arch): kr.record_step(w, d, gpu=kr.DEFAULT_GPU[arch]) for arch, steps in plan.items()
            for w, d, _ in steps}}
compiled, rows, keys = 0, [], []
for arch, steps in plan.items():
    jobs = {{}}
    for w, d, only_dots in steps:
        jobs.update({{spec.key(): (f, spec) for f, spec in kr.compile_jobs(recorded[w, d, arch], only_dots)}})
    compiled += kr.compile_all(list(jobs.values()), arch)[1]
    keys += [kr.cache_key(f, spec, arch) for f, spec in jobs.values()]
    for w, d, only_dots in steps:
        rep = kr.build_report(w, arch, dtype=d, only_dots=only_dots, launches=recorded[w, d, arch])
        rows += [dict(r.as_json(arch, rep.gpu), workload=w, step_dtype=d) for r in rep.rows]
print(json.dumps({{"rows": rows, "compiled": compiled, "keys": keys, "seconds": time.perf_counter() - t0}}))
"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Every compiled specialization's report row (one subprocess: recording
    switches the kernels' host code to a GPU's tiles, which must not leak
    into this process's interpreter runs)."""
    pytest.importorskip("triton.backends.nvidia", reason="needs Triton's NVIDIA backend to compile for a GPU")
    update = os.environ.get("TRIFLUX_UPDATE_COMPILED_KERNELS") == "1"
    env = {}
    if not update:
        cache = tmp_path_factory.mktemp("compiled_kernels")
        for key, found in (json.loads(SEED.read_text()) if SEED.exists() else {}).items():
            (cache / f"{key}.json").write_text(json.dumps(found))
        env["TRIFLUX_KERNEL_CACHE"] = str(cache)
    t0 = time.perf_counter()
    r = run_python(_SCRIPT.format(plan=COMPILED), env=env, timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"kernel report: {len(found['rows'])} rows, {found['compiled']} compiled now, "
          f"{time.perf_counter() - t0:.1f} s")
    if update:
        from triflux.workbench.kernel_report import cache_dir
        entries = {key: json.loads(Path(cache_dir(), f"{key}.json").read_text()) for key in sorted(set(found["keys"]))}
        SEED.write_text(json.dumps(entries, sort_keys=True, separators=(",", ":")).replace("},", "},\n") + "\n")
    return found["rows"]


def _family(row):
    return row["module"].rpartition(".")[2]


def _gap(check, arch, family=None):
    reason = KNOWN_GAPS.get((check, arch, family))
    return pytest.param(arch, family, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else \
        pytest.param(arch, family)


def _where(row):
    return (f"{row['kernel']} ({row['workload']} {row['step_dtype']}, {', '.join(row['primitives'])}; "
            f"constexprs {row['constexprs']})")


@pytest.mark.parametrize("arch", ARCHS)
def test_every_specialization_compiles(rows, arch):
    mine = [r for r in rows if r["arch"] == arch]
    assert mine, f"nothing compiled for {arch}"
    failed = [f"{_where(r)}: {r['error'].splitlines()[0]}" for r in mine if r["error"]]
    assert not failed, f"{len(failed)} of {len(mine)} specializations do not compile for {arch}:\n" + \
        "\n".join(failed)


@pytest.mark.parametrize("arch,family", [_gap("spills", a, f) for a in ARCHS for f in NO_SPILL_FAMILIES])
def test_no_spills(rows, arch, family):
    mine = [r for r in rows if r["arch"] == arch and _family(r) == family and not r["error"]]
    assert mine, f"no {family} kernel in the representative set"
    spilled = [f"{_where(r)}: {r['spills_bytes']} bytes of spill stores per thread ({r['local_bytes']} bytes of "
               f"local memory, {r['regs']} registers)" for r in mine if r["spills_bytes"]]
    assert not spilled, f"{family} kernels spill on {arch}:\n" + "\n".join(spilled)


@pytest.mark.parametrize("arch,family", [_gap("tensor cores", a, f) for a in ARCHS for f in DOT_FAMILIES])
def test_16bit_dots_use_tensor_cores(rows, arch, family):
    """HGMMA on sm_90, HMMA on sm_80 (from the SASS where Triton's cuobjdump
    runs, else wgmma/mma.sync in the PTX) in every kernel with a dot that a
    bfloat16 step launches."""
    mine = [r for r in rows if r["arch"] == arch and _family(r) == family and r["dot"]
            and r["step_dtype"] == "bfloat16" and not r["error"]]
    assert mine, f"no bfloat16 {family} kernel with a dot in the representative set"
    wanted = "hgmma" if arch == "sm_90" else "hmma"
    missing = [f"{_where(r)}: {r['dot_input'] or 'no'} tensor-core input, {wanted}: {r[wanted]}" for r in mine
               if not r["tensor_core"] or (r[wanted] is not None and not r[wanted])]
    assert not missing, f"16-bit dots without {wanted.upper()} on {arch}:\n" + "\n".join(missing)


def _dense(row):
    """Every strided operand of an elementwise kernel is dense (the *_DENSE constexprs)."""
    flags = [v for k, v in row["constexprs"].items() if k.endswith("_DENSE")]
    return bool(flags) and all(flags)


@pytest.mark.parametrize("arch,family", [_gap("128-bit loads", "sm_90", "elementwise")])
def test_dense_elementwise_kernels_load_128_bits(rows, arch, family):
    mine = [r for r in rows if r["arch"] == arch and _family(r) == family and _dense(r) and not r["error"]]
    assert mine, "no dense elementwise kernel in the representative set"
    narrow = [f"{_where(r)}: widest load {r['load_bits']} bits ({r['load_form']})" for r in mine
              if r["load_bits"] < 128]
    assert not narrow, f"dense elementwise kernels without 128-bit loads on {arch}:\n" + "\n".join(narrow)


def test_the_command_prints_one_json_object_per_specialization():
    """``python -m triflux kernels --json`` in a fresh process without
    TRITON_INTERPRET: it switches the interpreter on itself."""
    r = run_python("import sys; from triflux.__main__ import main; "
                   "sys.exit(main(['kernels', '--workload', 'mlp', '--json']))",
                   timeout=900, unset=("TRITON_INTERPRET",))
    assert r.returncode == 0, r.stderr[-4000:]
    assert "TRITON_INTERPRET" in r.stderr
    found = json.loads(r.stdout)
    keys = {"kernel", "dtype", "arch", "launches", "regs", "spills_bytes", "smem_bytes", "tensor_core", "flops",
            "bytes", "predicted_us"}
    assert found and all(keys <= set(row) for row in found), [sorted(keys - set(row)) for row in found]
    assert {row["arch"] for row in found} == {"sm_90"} and {row["dtype"] for row in found} >= {"float32"}
    assert sum(row["launches"] for row in found) >= 10
    matmul = [row for row in found if row["kernel"] == "_matmul_kernel"]
    assert matmul and all(row["flops"] > 0 and row["bytes"] > 0 and row["predicted_us"] > 0 for row in matmul)
    assert sum(row["flops"] for row in matmul) >= 2 * 128 * (784 * 256 + 256 * 256 + 256 * 10), \
        "the MLP's forward products alone are 2 x batch x the weights' sizes"


def test_the_command_sizes_the_grids_for_the_named_gpu():
    """``python -m triflux kernels --arch sm_80`` records the step for an
    A100 (108 SMs) unless ``--gpu`` names another GPU: the demo's conv weight
    gradients, split over pixels into whole rounds of the GPU where that pays
    (conv._fastest_split), fill at most one round of two programs per SM there
    (216) and more than that with ``--gpu H100`` (up to 264); the host code's
    SM count is the real one again afterwards. (Compiling is stubbed out: it
    does not change the launches.)"""
    r = run_python("""
import contextlib, io, json
from triflux.workbench import kernel_report as kr
from triflux.__main__ import main
from triflux.triton_kernels import launch
real = launch.sm_count
kr.report.compile_all = lambda jobs, arch: ({spec.key(): {"num_warps": 4, "regs": 32, "smem_bytes": 0} for _, spec in jobs}, 0)
for gpu in ([], ["--gpu", "H100"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernels", "--workload", "demo", "--arch", "sm_80", "--json", *gpu]) == 0
    rows = json.loads(out.getvalue())
    print(json.dumps([sorted({r["gpu"] for r in rows}), sorted({p for r in rows if r["kernel"] == "_weight_grad_kernel"
                                                               for p in (r["programs_min"], r["programs_max"])})]))
print(json.dumps([launch.sm_count is real, launch.sm_count(0)]))
""", env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    (a100_gpu, a100), (h100_gpu, h100), (restored, sms_after) = map(json.loads, r.stdout.strip().splitlines()[-3:])
    assert a100_gpu == ["A100 SXM4 80GB"] and h100_gpu == ["H100 SXM5 80GB"]
    assert max(a100) <= 2 * 108 < max(h100) <= 2 * 132, (a100, h100)
    assert restored and sms_after == 132


# --- the model's parts, without compiling -------------------------------------------------------

def test_occupancy_is_the_tightest_of_warps_registers_and_shared_memory():
    from triflux.workbench.kernel_report import GPUS, occupancy
    h100 = GPUS["H100"]
    assert occupancy(32, 0, 4, h100) == 16            # 64 warps / 4
    assert occupancy(255, 0, 4, h100) == 2            # 8,192 registers per warp (256-register units)
    assert occupancy(64, 100 * 1024, 4, h100) == 2    # 228 KB / (100 KB + 1 KB reserved)
    assert occupancy(32, 0, 1, h100) == 32            # at most 32 programs per SM
    assert occupancy(32, 200 * 1024, 4, GPUS["A100"]) == 0   # more shared memory than an A100 SM has


def test_predicted_time_pays_for_partial_waves_and_latency():
    from triflux.workbench.kernel_report import GPUS, Launch, launch_time
    h100 = GPUS["H100"]
    metrics = {"regs": 32, "smem_bytes": 0, "num_warps": 4, "tensor_core": False}

    def predicted(programs, nbytes):
        return launch_time(Launch(None, None, programs, [("float32", nbytes)]), metrics, "float32", h100, 2.0)
    ideal = 1e9 / h100.bandwidth * 1e6                  # 1 GB at full bandwidth, µs
    full, waves, bound = predicted(132 * 4, 1e9)         # 16 warps on every SM: the bandwidth
    assert full == pytest.approx(2.0 + ideal) and waves == 1 and bound == "memory"
    one, _, bound = predicted(1, 1e9)                    # one program: 1 / (132 * 4) of the GPU
    assert one == pytest.approx(2.0 + ideal * 132 * 4) and bound == "memory, waves"
    tiny, _, bound = predicted(1, 4)
    assert tiny == pytest.approx(2.0, rel=1e-3) and bound == "latency"


def test_flops_of_contractions():
    from triflux.workbench.kernel_report import PrimitiveCall, primitive_flops
    mm = PrimitiveCall("matmul", "matmul", "forward", [(128, 784), (784, 256)], {})
    assert primitive_flops(mm) == 2 * 128 * 784 * 256
    back = PrimitiveCall("matmul", "matmul", "backward", [(128, 256), (128, 256), (128, 784), (784, 256)],
                         {"needs": (False, True)})
    assert primitive_flops(back) == 2 * 128 * 784 * 256        # only the weight's gradient
    dense = PrimitiveCall("dense_bias_act", "matmul", "forward", [(4, 32, 784), (256, 784), (256,)],
                          {"activation": "relu"})
    assert primitive_flops(dense) == 2 * 128 * 784 * 256
    dense_back = PrimitiveCall("dense_bias_act", "matmul", "backward",
                               [(128, 256), (128, 256), (128, 784), (256, 784), (256,)],
                               {"activation": "relu", "needs": (True, True, True)})
    assert primitive_flops(dense_back) == 2 * 2 * 128 * 784 * 256
    conv = PrimitiveCall("conv2d", "conv", "backward", [(4, 8, 30, 30), (4, 8, 30, 30), (4, 3, 32, 32),
                                                         (8, 3, 3, 3)], {})
    assert primitive_flops(conv) == 2 * 2 * (4 * 8 * 30 * 30) * 3 * 3 * 3
    up = PrimitiveCall("conv_transpose2d", "conv", "forward", [(4, 16, 8, 8), (16, 8, 2, 2)], {})
    assert primitive_flops(up) == 2 * (4 * 16 * 8 * 8) * 8 * 2 * 2
    adam = PrimitiveCall("adam_update", "optimise", "foreach", [[(10, 10), (5,)], [(10, 10), (5,)]], {})
    assert primitive_flops(adam) == 12 * 105


def test_widest_global_load():
    from triflux.workbench.kernel_report import widest_global_load
    assert widest_global_load("\t@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];") == (128, "v4.b32")
    assert widest_global_load("ld.global.L1::evict_last.b16 {%rs1}, [%rd2];") == (16, "b16")
    assert widest_global_load("cp.async.cg.shared.global [ %r41 + 0 ], [ %rd29 + 0 ], 0x10, %r42;") == \
        (128, "cp.async 16B")
    assert widest_global_load("ld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r5];") == (0, "")
