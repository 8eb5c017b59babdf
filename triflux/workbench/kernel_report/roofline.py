"""The timing model of one launch: programs resident per SM
(:func:`occupancy`), the unit its arithmetic runs on (:func:`peak_for`) and
its predicted time, a roofline paid per wave plus a fixed latency
(:func:`launch_time`). The formulas are in the package's docstring
(``pydoc triflux.workbench.kernel_report``); all of it is a model."""
import math

from triflux.gpus import SATURATING_WARPS

#: Fixed device-side cost of one launch in a stream of dependent launches (µs):
#: the grid's launch, ramp-up and drain. Empty-kernel measurements put it at
#: about 1 µs under CUDA graphs and 2-5 µs for stream launches; a round 2 µs.
LAUNCH_LATENCY_US = 2.0

#: shared memory the runtime reserves per resident block on sm_80 and later
RESERVED_SMEM_PER_PROGRAM = 1024


def occupancy(regs, smem, num_warps, gpu):
    """Programs resident per SM (see the package's docstring); 0: does not fit."""
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
