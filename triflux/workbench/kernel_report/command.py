"""``python -m triflux kernels``: the report as a table (:func:`format_report`)
or as JSON, and the command's arguments (:func:`parse`, :func:`main`)."""
import argparse
import json
import sys

from triflux.gpus import GPUS
from .compile_cache import cache_dir
from .launches import INTERPRETER_NOTE
from .report import build_report
from .roofline import LAUNCH_LATENCY_US
from .specializations import ARCHS, encode_constexpr
from .workloads import WORKLOADS


def _si(x, unit=""):
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def _ms(us):
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"


def _tiles(spec):
    """The block-size constexprs of a specialization, short (``BLOCK_SIZE_M=64``...)."""
    keep = [f"{k.replace('BLOCK_SIZE_', 'B').replace('BLOCK_SIZE', 'B')}={encode_constexpr(v)}"
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


# --- the command ----------------------------------------------------------------------------------

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
