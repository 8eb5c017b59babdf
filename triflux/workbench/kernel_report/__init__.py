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

The modules, in the order of the steps:

* :mod:`.workloads`: the training steps (:data:`WORKLOADS`);
* :mod:`.specializations`: what Triton compiles anew, and compiling it for a GPU;
* :mod:`.compiled`: what is read from a compiled kernel;
* :mod:`.compile_cache`: the on-disk cache and the compile worker;
* :mod:`.launches`: recording a step, FLOPs and bytes per launch;
* :mod:`.roofline`: occupancy and the predicted time of a launch;
* :mod:`.report`: a step's rows and rooflines;
* :mod:`.command`: ``python -m triflux kernels``, the table and the JSON.

Every public name of those modules is importable from this package (and
from its old name, ``triflux.kernel_report``, the same module object). To
replace a function for a test, patch it in the module that calls it (the
report calls ``report.compile_all``).
"""
from triflux.gpus import ASSUMED_GPU, GPU, GPUS, SATURATING_WARPS
from .workloads import UNET3D, WORKLOADS
from .specializations import (ARCHS, LAUNCH_OPTIONS, Specialization, compile_specialization, decode_constexpr,
                              encode_constexpr, source_fingerprint, specialization)
from .compiled import METRICS_VERSION, compiled_metrics, ptx_counts, sass_counts, widest_global_load
from .compile_cache import cache_dir, cache_key, compile_all, compile_worker, run_compile_worker
from .launches import INTERPRETER_NOTE, Launch, PrimitiveCall, ensure_interpreter, primitive_flops, record_step
from .roofline import LAUNCH_LATENCY_US, RESERVED_SMEM_PER_PROGRAM, launch_time, occupancy, peak_for
from .report import DEFAULT_GPU, Report, Row, build_report, compile_jobs, group_launches
from .command import format_report, main, parse

__all__ = ["ASSUMED_GPU", "GPU", "GPUS", "SATURATING_WARPS", "UNET3D", "WORKLOADS", "ARCHS", "LAUNCH_OPTIONS",
           "Specialization", "compile_specialization", "decode_constexpr", "encode_constexpr", "source_fingerprint",
           "specialization", "METRICS_VERSION", "compiled_metrics", "ptx_counts", "sass_counts", "widest_global_load",
           "cache_dir", "cache_key", "compile_all", "compile_worker", "run_compile_worker", "INTERPRETER_NOTE",
           "Launch", "PrimitiveCall", "ensure_interpreter", "primitive_flops", "record_step", "LAUNCH_LATENCY_US",
           "RESERVED_SMEM_PER_PROGRAM", "launch_time", "occupancy", "peak_for", "DEFAULT_GPU", "Report", "Row",
           "build_report", "compile_jobs", "group_launches", "format_report", "main", "parse"]
