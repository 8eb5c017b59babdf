"""The GPUs triflux models: peak figures and the per-SM limits that bound
occupancy, read by the kernel report's roofline (``triflux.workbench.kernel_report``)
and by the kernels' host plans when they size a grid for the GPU
(``triflux.triton_kernels.launch.sm_count``). No GPU is needed to read them.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class GPU:
    """Peak figures of one GPU (FLOP/s, bytes/s) and the per-SM limits that
    bound occupancy."""
    name: str
    sms: int
    ffma: float          # FP32 on the CUDA cores (an FMA counts 2)
    fp64: float          # FP64 on the CUDA cores
    tf32: float          # TF32 tensor cores, dense
    bf16: float          # BF16/FP16 tensor cores, dense, float32 accumulation
    bandwidth: float     # HBM
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_programs_per_sm: int = 32
    source: str = ""


#: Peak figures. TFLOP/s and TB/s from NVIDIA's datasheets (H100's gives the
#: tensor-core figures with sparsity: halved here for dense math); SM counts
#: from the architecture whitepapers; per-SM limits (registers, shared memory,
#: warps, blocks) from the CUDA C++ Programming Guide's compute-capability table.
GPUS = {
    "H100": GPU("H100 SXM5 80GB", sms=132, ffma=67e12, fp64=34e12, tf32=495e12, bf16=989e12,
                bandwidth=3.35e12, smem_per_sm=228 * 1024,
                source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: FP32 67 TFLOPS, FP64 34, TF32 "
                       "989 and BF16 1,979 with sparsity, 3.35 TB/s); NVIDIA H100 Tensor Core GPU "
                       "Architecture whitepaper (132 SMs on H100 SXM5); CUDA C++ Programming Guide, "
                       "compute capability 9.0 (228 KB shared memory per SM)"),
    "H200": GPU("H200 SXM 141GB", sms=132, ffma=67e12, fp64=34e12, tf32=495e12, bf16=989e12,
                bandwidth=4.8e12, smem_per_sm=228 * 1024,
                source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141 GB HBM3e at 4.8 TB/s; FP32 67 "
                       "TFLOPS, FP64 34, TF32 989 and BF16 1,979 with sparsity: the H100's compute); the same "
                       "Hopper GH100 processor as H100 SXM5 (132 SMs, compute capability 9.0, 228 KB shared "
                       "memory per SM). Measured on one here (2026-10-28, the device tool's KINDS.md): a "
                       "device-to-device copy at about 4.3 TB/s, an 8192^3 bf16 product at 769-798 TFLOP/s"),
    "A100": GPU("A100 SXM4 80GB", sms=108, ffma=19.5e12, fp64=9.7e12, tf32=156e12, bf16=312e12,
                bandwidth=2.039e12, smem_per_sm=164 * 1024,
                source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: FP32 19.5 TFLOPS, FP64 9.7, "
                       "TF32 156, BF16 312, 2,039 GB/s); NVIDIA A100 Tensor Core GPU Architecture "
                       "whitepaper (108 SMs); CUDA C++ Programming Guide, compute capability 8.0 "
                       "(164 KB shared memory per SM)"),
}

#: the GPU assumed where none can be asked (a step recorded under the interpreter)
ASSUMED_GPU = "H100"

#: resident warps with which an SM reaches its share of the peak: more programs per SM
#: than that add no throughput (four warps per scheduler; ``triflux.workbench.kernel_report``'s model)
SATURATING_WARPS = 16
