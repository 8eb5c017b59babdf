"""The report of one step: record it, compile its specializations (cached),
and model each launch (:func:`build_report`): one :class:`Row` per kernel
specialization, gathered in a :class:`Report` with the step's rooflines."""
import dataclasses
from collections import defaultdict

from triflux.gpus import GPU, GPUS
from .compile_cache import compile_all
from .launches import ensure_interpreter, record_step
from .roofline import LAUNCH_LATENCY_US, launch_time
from .specializations import Specialization, encode_constexpr, source_fingerprint

#: the GPU each architecture is modelled on by default
DEFAULT_GPU = {"sm_90": "H100", "sm_80": "A100"}


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
                "constexprs": {k: encode_constexpr(v) for k, v in self.spec.constexprs.items()},
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
