"""Reading a compiled kernel: registers, local memory and spills, shared
memory, tensor-core instructions (PTX, and SASS where Triton's cuobjdump
runs), the widest load from global memory and PTX counts, as the plain dict
:func:`compiled_metrics` returns (what the compile cache stores)."""
import os
import re
import subprocess
import tempfile
from collections import defaultdict

#: bumped when what is read from a compiled kernel changes (invalidates the cache)
METRICS_VERSION = 2

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
