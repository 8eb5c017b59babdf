"""``python -m triflux kernels``: how every kernel of a training step compiles
for a real GPU and how long it would take there, measured without a GPU.

Three steps, each usable on its own:

1. **Record** (:func:`record_step`). One training step of a workload
   (:data:`WORKLOADS`) runs on the Triton interpreter's CUDA device with
   ``triton_kernels.launch.launch`` replaced by a recorder, so no kernel runs:
   the host code allocates, picks tiles and grids and calls ``launch``, and
   each call is kept (kernel, grid, arguments). While recording, the host code
   is told it is not in the interpreter (``launch.INTERPRET = False``) and
   that the GPU has the modelled GPU's SMs (``launch.sm_count``: 132 for an
   H100, 108 for an A100), so it picks the tiles, split-K passes, grids and
   constexprs that GPU gets; since no kernel runs, nothing notices that the
   storage is on the CPU. The step reads no value back to the host
   (``withgradient`` and ``optimise.update``, not ``train`` with its NaN
   check); one warm-up step runs first, unrecorded.
   Each launch is also tagged with the primitive call it belongs to (name,
   direction, input shapes, attrs): ``Primitive.kernel`` is wrapped for the
   duration of the recording, nothing else changes.

2. **Compile** (:func:`compile_all`). Launches are grouped by specialization:
   kernel, signature (argument types), constexprs, the 16-byte divisibility
   of pointers and integers, and launch options, exactly what makes Triton
   compile a kernel anew (:func:`specialization` builds it from a launch the
   way Triton's launcher does). Each is compiled with
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90 | 80, 32))``
   in a subprocess with the interpreter off (a jitted function is either
   interpreted or compiled, decided when its module is imported). Read from
   the result: registers and local memory per thread from the cubin's
   resource usage (``cuobjdump -res-usage``: what ``n_regs`` and
   ``4 * n_spills`` report on a GPU, where the driver reads them); spills,
   the bytes of spill stores per thread from ptxas's ``-v`` log; shared
   memory (``metadata.shared`` plus static), warps; tensor-core instructions
   (SASS ``HGMMA``/``HMMA`` when Triton's bundled cuobjdump works, else PTX
   ``wgmma``/``mma.sync``) and their input type; the widest load from global
   memory in the PTX (``ld.global.v4.b32`` or a 16-byte ``cp.async`` = 128
   bits); PTX instruction and FMA counts. Results are cached on disk, one
   JSON file per specialization, keyed by a hash of the kernel's source (with
   every jitted function and constant it reaches), signature, constexprs,
   options, architecture and Triton version, under
   ``$TRIFLUX_KERNEL_CACHE`` (default ``~/.cache/triflux/kernels``).

3. **Model** (:func:`build_report`). Per launch:

   * bytes: the sizes of its distinct tensor arguments, a lower bound (each
     read or written once, as if caches were perfect). Where a forward or
     update call's launches together pass fewer bytes than the call's own
     tensors (the foreach optimiser updates reach the parameters through a
     table of addresses), the difference is added to its launches, by their
     programs;
   * FLOPs: from the primitive being computed, as its registration declares
     them (the ``flops`` of ``triflux/primitives.py``, read by
     :func:`primitive_flops`: 2MNK for a matrix product; 2 N O (C/g) prod(o)
     prod(k) per direction for a convolution of any rank (output sides o,
     kernel sides k), forward and both gradients; 2 N L (|W_ih| + |W_hh|) per
     direction for a recurrent sequence; a few per element for elementwise,
     normalisation, pooling, softmax and optimiser updates, nothing for
     copies and fills). A primitive's FLOPs go to its launches in proportion
     to their bytes, among the launches of kernels that contain a dot
     (``tl.dot``, reached through any jitted helper) when there are any, else
     among all of them: a convolution's FLOPs land on its implicit-GEMM
     launches, not on the bias or activation epilogues beside them;
   * occupancy, the programs (CTAs) resident per SM: the least of
     64 warps / num_warps, the register file (65,536 per SM, allocated per
     warp in units of 256) / (registers per warp * num_warps), shared memory
     per SM / (shared per program + 1 KB the runtime reserves per block), and
     32 blocks per SM (CUDA's limits for sm_80 and sm_90);
   * waves = ceil(programs / (SMs * occupancy));
   * predicted time = latency + max(FLOPs / peak of its unit, bytes /
     bandwidth) * q, with the wave quantization
     q = ceil(programs / (SMs * f)) * SMs * f / programs, where
     f = min(occupancy, 16 warps / num_warps) is how many programs an SM
     needs to reach its share of the peak (:data:`SATURATING_WARPS`: four
     warps per scheduler keep the FMA pipes or enough loads in flight; more
     resident programs wait their turn without adding throughput). So a
     launch takes as long as if its last round of programs were full, and a
     launch of fewer programs than SMs * f runs at that fraction of the
     peak: one 4-warp program gets 1/(132 * 4) of an H100. The unit is the
     tensor cores of the dot's input type (TF32 or 16-bit) when the kernel
     uses them, FP64 for float64 work, else FP32 FFMA. ``latency`` is a fixed
     :data:`LAUNCH_LATENCY_US` per launch (``--latency-us``).

   The step's rooflines: its FLOPs at the FFMA and at the tensor-core peak,
   its bytes at the bandwidth (the FFMA and tensor rooflines are the larger of
   the compute time and the bandwidth time). All of it is a model:
   predictions, not measurements.
"""
import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict

import numpy as np

import triflux as tf
from . import benchmarks, losses, models, optimise, registry
from .demos import shapes as demo_shapes
from .demos import unet as demo_unet
from .gpus import ASSUMED_GPU, GPU, GPUS, SATURATING_WARPS
from .primitives import REGISTRY

#: architecture name -> compute capability given to GPUTarget
ARCHS = {"sm_90": 90, "sm_80": 80}
#: the GPU each architecture is modelled on by default
DEFAULT_GPU = {"sm_90": "H100", "sm_80": "A100"}

#: Fixed device-side cost of one launch in a stream of dependent launches (µs):
#: the grid's launch, ramp-up and drain. Empty-kernel measurements put it at
#: about 1 µs under CUDA graphs and 2-5 µs for stream launches; a round 2 µs.
LAUNCH_LATENCY_US = 2.0

#: shared memory the runtime reserves per resident block on sm_80 and later
RESERVED_SMEM_PER_PROGRAM = 1024
#: bumped when what is read from a compiled kernel changes (invalidates the cache)
METRICS_VERSION = 2

# --- the workloads ------------------------------------------------------------------------------


def _unet_step(dtype, batch, size):
    cfg = dict(benchmarks.UNET, batch=batch or benchmarks.UNET["batch"], size=size or benchmarks.UNET["size"])
    return benchmarks.triflux_unet_step(cfg, device="cuda", dtype=dtype)


def _demo_step(dtype, batch, size):
    """The demo's training step (``python -m triflux demo unet`` with its defaults)."""
    d = demo_unet.DEFAULTS
    batch, size = batch or d["batch_size"], size or d["image_size"]
    dev = tf.CUDADevice(0)
    model = models.UNet(3, len(demo_shapes.CLASSES), depth=d["depth"], base_channels=d["base_channels"])
    model = dev(model if dtype == "float32" else tf.bf16(model))
    opt = optimise.setup(optimise.Adam(d["lr"]), model)
    rng = np.random.default_rng(0)
    np_dtype = getattr(tf, dtype)
    x = dev(rng.standard_normal((batch, 3, size, size)).astype(np_dtype))
    y = dev(np.eye(len(demo_shapes.CLASSES), dtype=np.float32)[rng.integers(0, len(demo_shapes.CLASSES),
                                                                           (batch, size, size))]
            .transpose(0, 3, 1, 2).astype(np_dtype))

    def step():
        _, (g, *_) = tf.withgradient(lambda m, a, b: losses.logitcrossentropy(m(a), b, dims=1), model, x, y)
        optimise.update(opt, model, g)
    return step


#: the volumetric workload: a 3-D UNet at its defaults (depth 4, 64 base channels) on 64^3 volumes
UNET3D = dict(batch=2, size=64, in_channels=1, classes=2)


def _unet3d_step(dtype, batch, size):
    """``models.UNet(1, 2, spatial_dims=3)``'s training step on (batch, 1, size, size, size)
    volumes (default 2 of 64^3), logitcrossentropy, Adam."""
    batch, size = batch or UNET3D["batch"], size or UNET3D["size"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, UNET3D["in_channels"], size, size, size)).astype(np.float32)
    y = np.eye(UNET3D["classes"], dtype=np.float32)[rng.integers(0, UNET3D["classes"], (batch, size, size, size))]
    model, x, y = _in_dtype(dtype, models.UNet(UNET3D["in_channels"], UNET3D["classes"], spatial_dims=3), x,
                            np.ascontiguousarray(np.moveaxis(y, -1, 1)))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y, dims=1), model)
        optimise.update(opt, model, g)
    return step


def _in_dtype(dtype, model, *arrays):
    """``model`` and ``arrays`` on the device, in ``dtype`` (float32 or bfloat16)."""
    dev = tf.CUDADevice(0)
    model = dev(model if dtype == "float32" else tf.bf16(model))
    return (model, *(dev(a.astype(getattr(tf, dtype))) for a in arrays))


def _spatial_step(dtype, batch, size):
    """The spatial families beyond the UNets' convolutions and pools: a 1-D
    model with Conv's reflect and replicate padding (the pad kernels),
    lpnormpool, pixel shuffle, linear upsampling and symmetric padding;
    (batch, 4, size) sequences (default 8 of 256), mse, Adam."""
    batch, size = batch or 8, size or 256
    rng = np.random.default_rng(0)
    model = tf.Chain(tf.Conv((3,), 4, 16, tf.relu, pad=2, pad_mode="reflect"),
                     lambda x: tf.ops.lpnormpool(x, 2, (2,)), tf.PixelShuffle(2),
                     tf.Upsample("linear", scale=2), lambda x: tf.ops.pad_symmetric(x, (1, 2)),
                     tf.Conv((3,), 8, 4, pad=1, pad_mode="replicate"))
    x = rng.standard_normal((batch, 4, size)).astype(np.float32)
    model, x = _in_dtype(dtype, model, x)
    y = model(x) * 0.5                  # a target of the output's shape (no kernel runs while recording)
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y), model)
        optimise.update(opt, model, g)
    return step


def _mlp_step(dtype, batch, size):
    """The benchmarks' MLP step (``benchmarks.triflux_mlp_step``), in ``dtype``."""
    cfg = dict(benchmarks.MLP, batch=batch or benchmarks.MLP["batch"])
    if dtype == "float32":
        return benchmarks.triflux_mlp_step(cfg, device="cuda")
    s = cfg["sizes"]
    model, x, y = _in_dtype(dtype, tf.Chain(tf.Dense(s[0], s[1], tf.relu), tf.Dense(s[1], s[2], tf.relu),
                                            tf.Dense(s[2], s[3])), *benchmarks.mlp_data(cfg))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.logitcrossentropy(m(x), y), model)
        optimise.update(opt, model, g)
    return step


def _lstm_step(dtype, batch, size):
    """The benchmarks' LSTM step (``benchmarks.triflux_recurrent_step``), in ``dtype``."""
    cfg = dict(benchmarks.LSTM_LARGE, batch=batch or benchmarks.LSTM_LARGE["batch"])
    if dtype == "float32":
        return benchmarks.triflux_recurrent_step(cfg, device="cuda")
    model, x, y = _in_dtype(dtype, tf.Chain(tf.LSTM(cfg["inputs"], cfg["hidden"]), tf.Dense(cfg["hidden"], 1)),
                            *benchmarks.sequence_data(cfg))
    opt = optimise.setup(optimise.Adam(1e-3), model)

    def step():
        _, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y), model)
        optimise.update(opt, model, g)
    return step


#: name -> (description, builder(dtype, batch, size) -> step closure, takes --size)
WORKLOADS = {
    "unet": ("triflux.models.UNet(3, 2) (depth 4, 64 base channels), batch 4, 64x64, "
             "logitcrossentropy, Adam", _unet_step, True),
    "demo": ("the demo's UNet(3, 4, depth=3, base_channels=16), batch 16, 32x32, Adam", _demo_step, True),
    "unet3d": ("triflux.models.UNet(1, 2, spatial_dims=3) (depth 4, 64 base channels), batch 2, 64x64x64, "
               "logitcrossentropy, Adam", _unet3d_step, True),
    "spatial": ("a 1-D Chain: Conv with reflect padding, lpnormpool, PixelShuffle, linear Upsample, symmetric "
                "pad, Conv with replicate padding; batch 8, 4 x 256, mse, Adam", _spatial_step, True),
    "mlp": ("the benchmarks' MLP 784-256-256-10 relu, batch 128, logitcrossentropy, Adam", _mlp_step, False),
    "lstm": ("the benchmarks' LSTM(64 => 512) + Dense(512 => 1), batch 64, 128 steps, mse, Adam",
             _lstm_step, False),
}

# --- specializations: what Triton compiles anew -------------------------------------------------

#: keyword arguments of a launch that are options of the compiler, not kernel parameters
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclasses.dataclass(frozen=True)
class Specialization:
    """One compiled form of a kernel: the arguments of ``triton.compile``.
    ``signature`` maps each parameter to its Triton type (``*fp32``, ``i32``,
    ``constexpr``...), ``constexprs`` the constexpr parameters to their values,
    ``divisible`` lists the parameters known to be multiples of 16 (pointers
    aligned to 16 bytes, integers divisible by 16: what lets the compiler
    vectorise), ``options`` the compiler options the launch passed."""
    module: str
    kernel: str
    signature: dict
    constexprs: dict
    divisible: tuple
    options: dict

    def attrs(self):
        names = list(self.signature)
        return {(names.index(p),): [["tt.divisibility", 16]] for p in self.divisible}

    def encoded(self):
        """The specialization as JSON-ready values (constexprs encoded)."""
        return {"module": self.module, "kernel": self.kernel, "signature": self.signature,
                "constexprs": {k: _encode(v) for k, v in self.constexprs.items()},
                "divisible": list(self.divisible), "options": self.options}

    @classmethod
    def decoded(cls, d):
        return cls(d["module"], d["kernel"], d["signature"], {k: _decode(v) for k, v in d["constexprs"].items()},
                   tuple(d["divisible"]), d["options"])

    def key(self):
        return json.dumps(self.encoded(), sort_keys=True)


def _encode(value):
    """A constexpr value as JSON (Triton dtypes and constexpr wrappers tagged)."""
    kind = type(value).__name__
    if kind == "constexpr":
        return _encode(value.value)
    if kind == "dtype" and type(value).__module__.startswith("triton"):
        return {"triton_dtype": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    return value


def _decode(value):
    if isinstance(value, dict) and "triton_dtype" in value:
        import triton.language as tl
        return tl.dtype(value["triton_dtype"])
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    return value


def _parameters(kernel):
    """[(name, is_constexpr, specialize, align, default)] of a jitted kernel
    (compiled or interpreted), as Triton's launcher reads them."""
    fn = kernel.fn
    params = getattr(kernel, "params", None)
    if params is not None:     # a compiled JITFunction knows its own
        return [(p.name, p.is_constexpr, not p.do_not_specialize, not p.do_not_specialize_on_alignment,
                 p.default if p.has_default else inspect.Parameter.empty) for p in params]
    options = getattr(kernel, "kwargs", {}) or {}
    sig = list(inspect.signature(fn).parameters.values())

    def listed(key):
        given = options.get(key) or ()
        return {sig[i].name if isinstance(i, int) else i for i in given}
    no_spec, no_align = listed("do_not_specialize"), listed("do_not_specialize_on_alignment")
    return [(p.name, "constexpr" in str(p.annotation), p.name not in no_spec, p.name not in no_align, p.default)
            for p in sig]


def specialization(kernel, args, meta):
    """The :class:`Specialization` that ``kernel[grid](*args, **meta)``
    compiles to on a GPU: each argument typed and specialized as Triton's
    launcher does (ints equal to 1 and ``None`` become constexprs, pointers
    and ints divisible by 16 are marked so)."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl
    params = _parameters(kernel)
    names = [p[0] for p in params]
    values = dict(zip(names, args))
    unknown = [k for k in meta if k not in names and k not in LAUNCH_OPTIONS]
    if unknown:
        raise TypeError(f"{kernel.__name__}: unknown launch keywords {unknown}")
    values.update({k: v for k, v in meta.items() if k in names})
    signature, constexprs, divisible = {}, {}, []
    for name, is_constexpr, specialize, align, default in params:
        if name not in values:
            if default is inspect.Parameter.empty:
                raise TypeError(f"{kernel.__name__}: no value for parameter {name}")
            values[name] = default
        v = values[name]
        if is_constexpr:
            ty, attr = "constexpr", None
        else:
            ty, attr = native_specialize_impl(CUDABackend, v, False, specialize, align)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = attr if not is_constexpr else v
        elif isinstance(attr, str) and "D" in attr:
            divisible.append(name)
    options = {k: v for k, v in meta.items() if k in LAUNCH_OPTIONS}
    fn = kernel.fn
    return Specialization(fn.__module__, fn.__name__, signature, constexprs, tuple(divisible), options)


def compile_specialization(kernel, spec, arch="sm_90"):
    """``triton.compile`` of ``spec`` for ``arch`` (sm_90 or sm_80); ``kernel``
    must be a compiled (not interpreted) jitted function, so this runs where
    TRITON_INTERPRET is off. No GPU is needed."""
    import triton
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(fn=kernel, signature=spec.signature, constexprs=spec.constexprs,
                                    attrs=spec.attrs())
    return triton.compile(src, target=GPUTarget("cuda", ARCHS[arch], 32), options=dict(spec.options))


def source_fingerprint(kernel):
    """(sha256 hex, contains a dot) of a kernel's source with every jitted
    function it reaches and the simple constants it reads (the parts of the
    tree that change what it compiles to)."""
    from triton.runtime.jit import KernelInterface
    digest, seen, state = hashlib.sha256(), set(), {"dot": False}

    def names(code):
        out = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out |= names(c)
        return out

    def value(label, v, used):
        if isinstance(v, KernelInterface):
            visit(v.fn)
        elif isinstance(v, types.ModuleType):
            for attr in sorted(used):
                if attr in vars(v):
                    value(f"{label}.{attr}", vars(v)[attr], ())
        elif type(v).__name__ == "constexpr" or isinstance(v, (bool, int, float, str)):
            digest.update(f"{label}={v!r};".encode())

    def visit(fn):
        if fn in seen:
            return
        seen.add(fn)
        text = inspect.getsource(fn)
        state["dot"] |= "tl.dot(" in text
        digest.update(text.encode())
        used = names(fn.__code__)
        for name in sorted(used):
            if name in fn.__globals__:
                value(name, fn.__globals__[name], used)
    visit(kernel.fn)
    return digest.hexdigest(), state["dot"]


# --- reading a compiled kernel ------------------------------------------------------------------

_LD_GLOBAL = re.compile(r"\bld\.global((?:\.[A-Za-z0-9_:]+)+)")
_CP_ASYNC = re.compile(r"\bcp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)*\s+\[[^\]]*\],\s*\[[^\]]*\],\s*"
                       r"(0x[0-9a-fA-F]+|\d+)")
_TMA = re.compile(r"\bcp\.async\.bulk\.tensor")
_PTX_MMA = re.compile(r"\b(wgmma\.mma_async|mma\.sync)[\w.]*?\.(bf16|f16|tf32|f64|e4m3|e5m2|s8|u8)\b")
_SASS_OP = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)", re.M)
_PTX_OP = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*(?:\.[A-Za-z0-9_:]+)*)\s", re.M)
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores")
_RES_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def widest_global_load(ptx):
    """(bits, form) of the widest load from global memory in ``ptx``: 128 for
    ``ld.global.v4.b32`` or a 16-byte ``cp.async`` (global to shared), 32 for
    a scalar ``ld.global.b32``, "TMA" for bulk tensor copies; (0, "") if none."""
    best = (0, "")
    for m in _LD_GLOBAL.finditer(ptx):
        mods = m.group(1).split(".")[1:]
        vec = next((int(x[1:]) for x in mods if re.fullmatch(r"v\d", x)), 1)
        ty = next((x for x in reversed(mods) if re.fullmatch(r"[bfsu]\d+", x)), "")
        bits = vec * int(ty[1:] or 0)
        if bits > best[0]:
            best = (bits, (f"v{vec}." if vec > 1 else "") + ty)
    for m in _CP_ASYNC.finditer(ptx):
        size = int(m.group(1), 0)
        if 8 * size > best[0]:
            best = (8 * size, f"cp.async {size}B")
    if _TMA.search(ptx) and best[0] < 128:
        best = (128, "TMA")
    return best


def _cuobjdump(cubin, *flags):
    """cuobjdump's output for ``cubin`` (Triton's bundled tool), or None when it does not run."""
    try:
        from triton import knobs
        tool = knobs.nvidia.cuobjdump.path
    except Exception:
        return None
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        done = subprocess.run([tool, *flags, path], capture_output=True, text=True, timeout=120)
        return done.stdout if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        os.remove(path)


def ptx_counts(ptx):
    """(instructions, float FMAs) in ``ptx``, counted statically (a loop body once)."""
    ops = _PTX_OP.findall(ptx)
    return len(ops), sum(1 for op in ops if op.startswith("fma.") and (".f32" in op or ".f64" in op))


def sass_counts(sass):
    """{opcode: count} of the SASS instructions in cuobjdump's listing."""
    count = defaultdict(int)
    for m in _SASS_OP.finditer(sass):
        count[m.group(1)] += 1
    return count


def compiled_metrics(compiled, arch, ptxas_log=""):
    """What the report reads from a compiled kernel (a dict of plain values).
    ``local_bytes`` is the local memory per thread (stack frame and local
    arrays: ``4 * n_spills`` on a GPU); ``spills_bytes`` the bytes of spill
    stores ptxas reports in ``ptxas_log`` (its ``-v`` output), or
    ``local_bytes`` without a log (Triton's kernels keep nothing else there).
    The SASS is disassembled (about a second for a large kernel) only where
    the PTX has tensor-core instructions, to confirm the HGMMA/HMMA they become."""
    ptx = compiled.asm["ptx"]
    cubin = compiled.asm["cubin"]
    out = {"num_warps": compiled.metadata.num_warps, "smem_bytes": int(compiled.metadata.shared)}
    m = _RES_USAGE.search(_cuobjdump(cubin, "-res-usage") or "")
    if m:
        regs, stack, static_smem, local = map(int, m.groups())
        out.update(regs=regs, local_bytes=stack + local, spills_bytes=stack + local)
        out["smem_bytes"] += static_smem
    else:                          # only a GPU driver could tell
        out.update(regs=None, local_bytes=None, spills_bytes=None)
    spills = _PTXAS_SPILLS.search(ptxas_log or "")
    if spills:
        out["spills_bytes"] = int(spills.group(1))
    out["load_bits"], out["load_form"] = widest_global_load(ptx)
    out["ptx_instructions"], out["ptx_fma"] = ptx_counts(ptx)
    ptx_mma = _PTX_MMA.findall(ptx)
    out["dot_input"] = ptx_mma[0][1] if ptx_mma else None
    out.update(tensor_core=bool(ptx_mma), tensor_core_from="PTX", hgmma=None, hmma=None)
    sass = _cuobjdump(cubin, "-sass") if ptx_mma else None
    if sass:
        count = sass_counts(sass)
        out.update(tensor_core=bool(count["HGMMA"] or count["HMMA"]), tensor_core_from="SASS",
                   hgmma=count["HGMMA"], hmma=count["HMMA"])
    return out


# --- the compile cache and worker ---------------------------------------------------------------

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
            for k, metrics in zip(todo, _run_compile_worker([specs[k] for k in todo], arch)):
                results[k] = metrics
                if "error" not in metrics:
                    _cache_write(keys[k], metrics)
    return results, len(todo)


def _run_compile_worker(specs, arch):
    """Metrics of each of ``specs``, compiled in a subprocess with the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # ptxas runs on every compile and prints its -v log (spill stores) to stdout
    env.update(TRITON_ALWAYS_COMPILE="1", TRITON_DUMP_PTXAS_LOG="1")
    env["PYTHONPATH"] = os.pathsep.join([_source_root(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    request = json.dumps({"arch": arch, "jobs": [spec.encoded() for spec in specs]})
    proc = subprocess.run([sys.executable, "-m", "triflux.kernel_report", "--compile-worker"], input=request,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"the compile worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _compile_worker():
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


# --- recording a step ---------------------------------------------------------------------------

@dataclasses.dataclass
class PrimitiveCall:
    """One call of a primitive's kernel function: ``name``, ``direction``,
    the shapes of its tensor inputs (for backward: grad, out, inputs...),
    attrs; ``flops`` is set when it returns."""
    name: str
    family: str
    direction: str
    shapes: list
    attrs: dict
    flops: float = 0.0
    tensors: list = dataclasses.field(default_factory=list)   # [(dtype, bytes)] it reads and writes (forward)

    def label(self):
        return f"{self.name} {self.direction}"


@dataclasses.dataclass
class Launch:
    kernel: object                 # the jitted function
    spec: Specialization
    programs: int
    tensors: list                  # [(NumPy dtype name, bytes)] of the distinct tensor arguments
    call: PrimitiveCall = None
    flops: float = 0.0
    indirect: list = dataclasses.field(default_factory=list)   # [(dtype, bytes)] reached through a table

    @property
    def bytes(self):
        return sum(b for _, b in self.tensors) + sum(b for _, b in self.indirect)


def _clear_host_plans():
    """Empty the kernels' cached host-side plans (``lru_cache``d functions of
    the kernel modules): they hold tiles and constexprs chosen for the
    interpreter or for a GPU, and recording switches between the two. (Run
    :func:`record_step` in a process of its own all the same, as the command
    does: other caches may hold such choices too.)"""
    for name, module in list(sys.modules.items()):
        if name.startswith("triflux.triton_kernels") and module is not None:
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def _tensor_list(args):
    """[(dtype name, bytes)] of the distinct tensors among ``args``."""
    import torch
    seen, out = set(), []
    for a in args:
        if isinstance(a, torch.Tensor):
            key = (a.data_ptr(), tuple(a.shape), tuple(a.stride()), a.dtype)
            if key not in seen:
                seen.add(key)
                out.append((str(a.dtype).replace("torch.", ""), a.numel() * a.element_size()))
    return out


def _programs(grid, args, meta, kernel):
    if callable(grid):
        grid = grid({**dict(zip(kernel.arg_names, args)), **meta})
    if isinstance(grid, int):
        return grid
    return math.prod(int(g) for g in grid)


def _shape(v):
    """The shape of a tensor, a list of the shapes of a list of tensors (the
    ``foreach`` form of an update), else None."""
    if hasattr(v, "shape"):
        return tuple(v.shape)
    if isinstance(v, (list, tuple)) and v and all(hasattr(t, "shape") for t in v):
        return [tuple(t.shape) for t in v]
    if isinstance(v, (list, tuple)):       # a backward's tuple of gradients: the first
        return next((tuple(t.shape) for t in v if hasattr(t, "shape")), None)
    return None


INTERPRETER_NOTE = ("note: TRITON_INTERPRET was not set; set to 1 in this process to record the step on the "
                    "interpreter's CUDA device (no kernel runs)")


def ensure_interpreter():
    """Switch the Triton interpreter on (before triton is imported); True when
    this call did so. Raises when triton is already imported without it."""
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        return False
    if "triton" in sys.modules:
        raise RuntimeError("the kernel report records a step on the Triton interpreter's CUDA device, but "
                           "triton was imported with TRITON_INTERPRET off; set TRITON_INTERPRET=1 first")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def record_step(workload="unet", dtype="float32", batch=None, size=None, gpu=ASSUMED_GPU):
    """The launches of one training step of ``workload`` (after one warm-up
    step) on the GPU ``gpu`` (a name in :data:`GPUS`: its SM count sizes the
    grids), kernels not run, tagged with their primitive calls."""
    ensure_interpreter()
    from .triton_kernels import launch as launcher
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; available: {', '.join(WORKLOADS)}")
    launches, calls = [], []
    recording = {"on": False}

    def record(kernel, grid, *args, **meta):
        if recording["on"]:
            launches.append(Launch(kernel, specialization(kernel, args, meta), _programs(grid, args, meta, kernel),
                                   _tensor_list(list(args) + list(meta.values())), calls[-1] if calls else None))

    original_kernel = registry.Primitive.kernel

    def traced_kernel(prim, direction="forward"):
        fn = original_kernel(prim, direction)

        def traced(*args, **attrs):
            call = PrimitiveCall(prim.name, prim.family, direction, [_shape(a) for a in args],
                                 {k: v for k, v in attrs.items() if k != "device"})
            calls.append(call)
            try:
                out = fn(*args, **attrs)
            finally:
                calls.pop()
            call.flops = primitive_flops(call, out)
            if direction != "backward":      # a forward or an update reads all it is given
                call.tensors = _tensor_list(_flat(args) + _flat(out))
            return out
        return traced

    sms = GPUS[gpu].sms
    saved = (launcher.launch, launcher.INTERPRET, launcher.sm_count)
    launcher.launch, launcher.INTERPRET, launcher.sm_count = record, False, lambda device_index: sms
    registry.Primitive.kernel = traced_kernel
    _clear_host_plans()
    try:
        step = WORKLOADS[workload][1](dtype, batch, size)
        step()
        recording["on"] = True
        step()
    finally:
        launcher.launch, launcher.INTERPRET, launcher.sm_count = saved
        registry.Primitive.kernel = original_kernel
        _clear_host_plans()
    _attribute_to_launches(launches)
    return launches


# --- FLOPs --------------------------------------------------------------------------------------

def primitive_flops(call, out=None):
    """Floating-point operations of one primitive call (see the module
    docstring), as its registration declares them (``flops``: exact for
    contractions, a few per element for the rest). A call whose arguments do
    not have the declared form (a kernel function changed its signature)
    counts one per element of its largest tensor."""
    backward = call.direction == "backward"
    inputs = call.shapes[2:] if backward else call.shapes
    out_shape = call.shapes[1] if backward else _shape(out)
    if isinstance(out_shape, list):          # several outputs: the first
        out_shape = out_shape[0]
    largest = max([_elements(s) for s in call.shapes + [out_shape]] or [0])
    try:
        return REGISTRY[call.name].count_flops(call.direction, inputs, out_shape, call.attrs, largest)
    except (TypeError, IndexError, ValueError):
        return largest


def _elements(shape):
    """Elements of a shape, of a list of shapes (a list of tensors), 0 for None."""
    if shape is None:
        return 0
    if isinstance(shape, list):
        return sum(_elements(s) for s in shape)
    return math.prod(shape)


def _attribute_to_launches(launches):
    """Each primitive call's FLOPs onto its launches, by bytes, among those
    whose kernel contains a dot when there are any; and the bytes of a
    forward or update call's own tensors that its launches do not pass as
    arguments (reached through an address table) onto its launches, by programs."""
    by_call = defaultdict(list)
    for ln in launches:
        if ln.call is not None:
            by_call[id(ln.call)].append(ln)
    dots = {}
    for group in by_call.values():
        call = group[0].call
        missing = sum(b for _, b in call.tensors) - sum(ln.bytes for ln in group)
        if missing > 0:
            programs = sum(ln.programs for ln in group) or 1
            per_dtype = defaultdict(int)
            for dt, b in call.tensors:
                per_dtype[dt] += b
            total = sum(per_dtype.values())
            for ln in group:
                ln.indirect = [(dt, missing * ln.programs / programs * b / total) for dt, b in per_dtype.items()]
        for ln in group:
            if ln.kernel not in dots:
                dots[ln.kernel] = source_fingerprint(ln.kernel)[1]
        heavy = [ln for ln in group if dots[ln.kernel]] or group
        total = sum(ln.bytes for ln in heavy) or len(heavy)
        for ln in heavy:
            ln.flops = call.flops * (ln.bytes or 1) / total


def _flat(value):
    """``value`` as a list, lists and tuples flattened one level (a foreach call's lists of tensors)."""
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in (item if isinstance(item, (list, tuple)) else [item])]
    return [value]


# --- the model ----------------------------------------------------------------------------------

def occupancy(regs, smem, num_warps, gpu):
    """Programs resident per SM (see the module docstring); 0: does not fit."""
    regs_per_warp = math.ceil(max(regs or 0, 1) * 32 / 256) * 256
    limits = [gpu.max_warps_per_sm // num_warps, gpu.regs_per_sm // (regs_per_warp * num_warps),
              gpu.max_programs_per_sm]
    if smem:
        limits.append(gpu.smem_per_sm // (smem + RESERVED_SMEM_PER_PROGRAM))
    return max(0, min(limits))


def peak_for(metrics, dtype, gpu):
    """(FLOP/s, unit name) of the unit a kernel's arithmetic runs on."""
    if metrics.get("tensor_core"):
        if metrics.get("dot_input") == "tf32":
            return gpu.tf32, "TF32"
        if metrics.get("dot_input") == "f64":
            return gpu.fp64, "FP64"
        return gpu.bf16, "tensor"
    if dtype == "float64":
        return gpu.fp64, "FP64"
    return gpu.ffma, "FFMA"


def launch_time(ln, metrics, dtype, gpu, latency_us):
    """(predicted µs, waves, what bounds it) for one launch."""
    warps = metrics["num_warps"]
    occ = max(occupancy(metrics["regs"], metrics["smem_bytes"], warps, gpu), 1)
    waves = math.ceil(ln.programs / (gpu.sms * occ))
    filling = min(occ, max(1, SATURATING_WARPS // warps))
    quantization = math.ceil(ln.programs / (gpu.sms * filling)) * gpu.sms * filling / max(ln.programs, 1)
    peak, _ = peak_for(metrics, dtype, gpu)
    compute, memory = ln.flops / peak * 1e6, ln.bytes / gpu.bandwidth * 1e6
    busy = max(compute, memory) * quantization
    bound = "latency" if latency_us >= busy else ("compute" if compute >= memory else "memory")
    if bound != "latency" and quantization >= 2:
        bound += ", waves"
    return latency_us + busy, waves, bound


@dataclasses.dataclass
class Row:
    """One kernel specialization of the step."""
    spec: Specialization
    launches: list
    metrics: dict
    dtype: str
    primitives: list
    dot: bool                      # the kernel contains a dot
    predicted_us: float = 0.0
    waves: list = dataclasses.field(default_factory=list)
    bounds: dict = dataclasses.field(default_factory=dict)

    @property
    def flops(self):
        return sum(ln.flops for ln in self.launches)

    @property
    def bytes(self):
        return sum(ln.bytes for ln in self.launches)

    def as_json(self, arch, gpu):
        m = self.metrics
        programs = [ln.programs for ln in self.launches]
        return {"kernel": self.spec.kernel, "module": self.spec.module, "dtype": self.dtype, "arch": arch,
                "dot": self.dot, "gpu": gpu.name, "launches": len(self.launches), "programs_min": min(programs),
                "programs_max": max(programs), "single_program_launches": programs.count(1),
                "num_warps": m.get("num_warps"), "regs": m.get("regs"), "spills_bytes": m.get("spills_bytes"),
                "local_bytes": m.get("local_bytes"),
                "smem_bytes": m.get("smem_bytes"), "tensor_core": bool(m.get("tensor_core")),
                "dot_input": m.get("dot_input"), "load_bits": m.get("load_bits"), "load_form": m.get("load_form"),
                "ptx_instructions": m.get("ptx_instructions"), "ptx_fma": m.get("ptx_fma"),
                "hgmma": m.get("hgmma"), "hmma": m.get("hmma"),
                "flops": self.flops, "bytes": self.bytes, "waves_min": min(self.waves), "waves_max": max(self.waves),
                "predicted_us": round(self.predicted_us, 3), "bound": self.bound(),
                "primitives": self.primitives, "signature": self.spec.signature,
                "constexprs": {k: _encode(v) for k, v in self.spec.constexprs.items()},
                "options": self.spec.options, "error": m.get("error")}

    def bound(self):
        return max(self.bounds, key=self.bounds.get) if self.bounds else ""


@dataclasses.dataclass
class Report:
    workload: str
    dtype: str
    arch: str
    gpu: GPU
    batch: int
    size: int
    rows: list
    launches: int
    single_program_launches: int
    compiled: int
    latency_us: float
    interpreter_switched_on: bool = False

    @property
    def flops(self):
        return sum(r.flops for r in self.rows)

    @property
    def bytes(self):
        return sum(r.bytes for r in self.rows)

    @property
    def predicted_us(self):
        return sum(r.predicted_us for r in self.rows)

    def rooflines_us(self):
        g = self.gpu
        tensor = g.bf16 if self.dtype in ("bfloat16", "float16") else g.tf32
        compute_ffma, compute_tensor = self.flops / g.ffma * 1e6, self.flops / tensor * 1e6
        memory = self.bytes / g.bandwidth * 1e6
        return {"ffma_compute_us": compute_ffma, "tensor_compute_us": compute_tensor, "bandwidth_us": memory,
                "ffma_roofline_us": max(compute_ffma, memory), "tensor_roofline_us": max(compute_tensor, memory)}

    def errors(self):
        return [(r.spec.kernel, r.metrics["error"]) for r in self.rows if r.metrics.get("error")]


def _main_dtype(launches):
    per = defaultdict(int)
    for ln in launches:
        for dt, b in ln.tensors + ln.indirect:
            per[dt] += b
    return max(per, key=per.get) if per else "none"


def group_launches(launches, only_dots=False):
    """{specialization key: [launches]}, and {kernel: (source fingerprint,
    contains a dot)}; ``only_dots``: only the kernels that contain a dot."""
    groups, fingerprints = {}, {}
    for ln in launches:
        if ln.kernel not in fingerprints:
            fingerprints[ln.kernel] = source_fingerprint(ln.kernel)
        if fingerprints[ln.kernel][1] or not only_dots:
            groups.setdefault(ln.spec.key(), []).append(ln)
    return groups, fingerprints


def compile_jobs(launches, only_dots=False):
    """The (fingerprint, Specialization) pairs :func:`compile_all` takes for ``launches``."""
    groups, fingerprints = group_launches(launches, only_dots)
    return [(fingerprints[g[0].kernel][0], g[0].spec) for g in groups.values()]


def build_report(workload="unet", arch="sm_90", gpu=None, dtype="float32", batch=None, size=None,
                 latency_us=LAUNCH_LATENCY_US, only_dots=False, launches=None):
    """Record for ``gpu`` (unless ``launches`` of :func:`record_step` are
    given: recorded for the same GPU), compile (cached) and model one step: a
    :class:`Report`. ``gpu`` defaults to the architecture's
    (:data:`DEFAULT_GPU`). ``only_dots``: rows only for the kernels that
    contain a dot (the launch counts still cover the whole step)."""
    switched = ensure_interpreter()
    gpu_name = gpu or DEFAULT_GPU[arch]
    gpu = GPUS[gpu_name]
    if launches is None:
        launches = record_step(workload, dtype, batch, size, gpu_name)
    groups, fingerprints = group_launches(launches, only_dots)
    metrics, compiled = compile_all([(fingerprints[g[0].kernel][0], g[0].spec) for g in groups.values()], arch)
    rows = []
    for key, group in groups.items():
        labels = sorted({ln.call.label() if ln.call else "(no primitive)" for ln in group})
        row = Row(group[0].spec, group, metrics[key], _main_dtype(group), labels, fingerprints[group[0].kernel][1])
        if "error" not in row.metrics:
            for ln in group:
                t, waves, bound = launch_time(ln, row.metrics, row.dtype, gpu, latency_us)
                row.predicted_us += t
                row.waves.append(waves)
                row.bounds[bound] = row.bounds.get(bound, 0) + t
        else:
            row.waves = [0]
        rows.append(row)
    rows.sort(key=lambda r: -r.predicted_us)
    return Report(workload, dtype, arch, gpu, batch, size, rows, len(launches),
                  sum(1 for ln in launches if ln.programs == 1), compiled, latency_us, switched)


# --- printing -----------------------------------------------------------------------------------

def _si(x, unit=""):
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def _ms(us):
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"


def _tiles(spec):
    """The block-size constexprs of a specialization, short (``BLOCK_SIZE_M=64``...)."""
    keep = [f"{k.replace('BLOCK_SIZE_', 'B').replace('BLOCK_SIZE', 'B')}={_encode(v)}"
            for k, v in spec.constexprs.items() if k.startswith("BLOCK")]
    return " ".join(keep)


def format_report(rep, top=8):
    g = rep.gpu
    lines = []
    if rep.interpreter_switched_on:
        lines.append(INTERPRETER_NOTE)
    desc = WORKLOADS[rep.workload][0]
    size = "" if not (rep.batch or rep.size) else \
        f" [batch {rep.batch or 'default'}" + (f", {rep.size}x{rep.size}]" if rep.size else "]")
    lines.append(f"workload: {rep.workload}: {desc}{size}, {rep.dtype}; one training step")
    lines.append(f"target: {rep.arch} on {g.name} ({g.sms} SMs, FFMA {g.ffma / 1e12:g}, TF32 {g.tf32 / 1e12:g}, "
                 f"BF16 {g.bf16 / 1e12:g} TFLOP/s dense, {g.bandwidth / 1e12:g} TB/s); "
                 f"{len(rep.rows)} specializations, {rep.compiled} compiled now, the rest from {cache_dir()}")
    lines.append("all times are PREDICTED by the model in `pydoc triflux.kernel_report`, not measured")
    lines.append("")
    head = (f"{'kernel':34} {'dtype':8} {'launch':>6} {'programs':>11} {'warps':>5} {'regs':>4} {'spill':>5} "
            f"{'smem':>6} {'TC':>3} {'load':>7} {'FLOPs':>7} {'bytes':>7} {'waves':>7} {'predicted':>10}  bound")
    lines.append(head)
    lines.append("-" * len(head))
    for r in rep.rows:
        m = r.metrics
        if m.get("error"):
            lines.append(f"{r.spec.kernel[:34]:34} {r.dtype:8} {len(r.launches):>6}  COMPILE FAILED: "
                         f"{m['error'].splitlines()[0][:120]}")
            continue
        progs = [ln.programs for ln in r.launches]
        prange = f"{min(progs)}" if min(progs) == max(progs) else f"{min(progs)}-{max(progs)}"
        wrange = f"{min(r.waves)}" if min(r.waves) == max(r.waves) else f"{min(r.waves)}-{max(r.waves)}"
        tc = ("yes" if m.get("tensor_core") else "no")
        spill = "?" if m.get("spills_bytes") is None else str(m["spills_bytes"])
        lines.append(f"{r.spec.kernel[:34]:34} {r.dtype:8} {len(r.launches):>6} {prange:>11} {m['num_warps']:>5} "
                     f"{m.get('regs') or '?':>4} {spill:>5} {_si(m['smem_bytes'], 'B'):>6} {tc:>3} "
                     f"{m.get('load_bits', 0):>4}b  {_si(r.flops):>7} {_si(r.bytes, 'B'):>7} {wrange:>7} "
                     f"{_ms(r.predicted_us):>10}  {r.bound()}")
    lines.append("")
    roof = rep.rooflines_us()
    total = rep.predicted_us
    tensor_name = "BF16 tensor" if rep.dtype in ("bfloat16", "float16") else "TF32 tensor"
    lines.append(f"launches per step: {rep.launches} ({rep.single_program_launches} of them single-program), "
                 f"{len(rep.rows)} specializations")
    orphans = sum(1 for r in rep.rows for ln in r.launches if ln.call is None)
    if orphans:
        lines.append(f"  ({orphans} launches outside any primitive's kernel function: no FLOPs counted for them)")
    lines.append(f"FLOPs {_si(rep.flops)}, bytes {_si(rep.bytes, 'B')} (each launch's distinct tensors once)")
    lines.append(f"predicted step: {_ms(total)} (of which launch latency {_ms(rep.launches * rep.latency_us)} "
                 f"= {rep.launches} x {rep.latency_us:g} µs)")
    lines.append(f"rooflines of the step: FFMA {_ms(roof['ffma_roofline_us'])} (compute "
                 f"{_ms(roof['ffma_compute_us'])}), {tensor_name} {_ms(roof['tensor_roofline_us'])} (compute "
                 f"{_ms(roof['tensor_compute_us'])}), bandwidth {_ms(roof['bandwidth_us'])}")
    lines.append(f"predicted / FFMA roofline = {total / roof['ffma_roofline_us']:.2f}x, "
                 f"/ {tensor_name} roofline = {total / roof['tensor_roofline_us']:.2f}x")
    lines.append("")
    lines.append("dominant kernels (share of the predicted step):")
    for r in rep.rows[:top]:
        if r.metrics.get("error"):
            continue
        share = r.predicted_us / total if total else 0
        lines.append(f"  {share:6.1%}  {_ms(r.predicted_us):>10}  {r.spec.kernel} [{_tiles(r.spec)}] "
                     f"x{len(r.launches)}, {r.bound()}; {', '.join(r.primitives)[:100]}")
    errors = rep.errors()
    if errors:
        lines.append("")
        lines.append(f"{len(errors)} specializations FAILED to compile")
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m triflux kernels",
        description="The kernels of one training step, compiled for a GPU without one: per kernel "
                    "specialization the launches, registers, spills, shared memory, tensor-core use, "
                    "vector width, FLOPs, bytes, waves and a predicted time (a roofline model, see "
                    "`pydoc triflux.kernel_report`), the step's predicted time against its FFMA, tensor and "
                    "bandwidth rooflines, and the kernels that dominate.")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="unet",
                   help="; ".join(f"{k}: {v[0]}" for k, v in WORKLOADS.items()) + " (default unet)")
    p.add_argument("--arch", choices=sorted(ARCHS), default="sm_90", help="compile target (default sm_90)")
    p.add_argument("--gpu", choices=sorted(GPUS), default=None,
                   help="the GPU whose SM count sizes the step's grids and whose peak table is modelled "
                        "(default: H100 for sm_90, A100 for sm_80)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="default float32")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the workload's)")
    p.add_argument("--size", type=int, default=None, help="image side for unet and demo (default: the workload's)")
    p.add_argument("--latency-us", type=float, default=LAUNCH_LATENCY_US,
                   help=f"fixed cost per launch in the model (default {LAUNCH_LATENCY_US:g} µs)")
    p.add_argument("--top", type=int, default=8, help="dominant kernels to list (default 8)")
    p.add_argument("--json", action="store_true", help="a JSON list, one object per specialization")
    return p


def main(argv=None):
    p = parse(argv)
    args = p.parse_args(argv)
    if args.size is not None and not WORKLOADS[args.workload][2]:
        p.error(f"--size applies to the image workloads (unet, demo), not {args.workload}")
    for name in ("batch", "size"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name} must be positive")
    try:
        rep = build_report(args.workload, args.arch, args.gpu, args.dtype, args.batch, args.size, args.latency_us)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        if rep.interpreter_switched_on:
            print(INTERPRETER_NOTE, file=sys.stderr)
        print(json.dumps([r.as_json(rep.arch, rep.gpu) for r in rep.rows], indent=1))
    else:
        print(format_report(rep, args.top))
    return 1 if rep.errors() else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--compile-worker"]:
        _compile_worker()
    else:
        sys.exit(main())
