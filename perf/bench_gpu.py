"""GPU benchmarks: triflux's Triton kernels against torch (cuDNN, cuBLAS) in
the same process, at the same precision.

* conv2d forward, and forward + backward (input and weight gradients), at the
  shapes of each UNet level;
* a full UNet training step (forward, backward, Adam): images per second and
  peak device memory on both sides; eager, and captured (``tf.capture_step``:
  the step's launches replayed without the Python that made them).

float32 runs with TF32 off on both sides (triflux's float32 dots use
``input_precision="ieee"``; torch's cuDNN and cuBLAS are told not to use TF32),
then bfloat16. Times are medians of CUDA-synchronised wall clock over
``--reps`` repetitions after warm-up (which includes Triton's compilation).

    python perf/bench_gpu.py [--batch 16] [--size 128] [--json perf/gpu.json]
    TRITON_INTERPRET=1 python perf/bench_gpu.py --smoke   # tiny shapes, checks the script runs

Under ``--smoke`` (or without a GPU, under the Triton interpreter) the sizes
are tiny and the numbers mean nothing; the point is that the script works.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triflux.workbench.benchmarks import UNET, torch_unet_step, triflux_unet_step  # noqa: E402


def _sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, torch, reps, warmup=2):
    """Median seconds of ``fn()`` over ``reps`` synchronised runs."""
    for _ in range(warmup):
        fn()
    _sync(torch)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(torch)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def peak_memory(fn, torch):
    """Peak bytes allocated on the GPU while ``fn()`` runs (None without one)."""
    if not torch.cuda.is_available():
        return None
    _sync(torch)
    torch.cuda.reset_peak_memory_stats()
    fn()
    _sync(torch)
    return torch.cuda.max_memory_allocated()


def unet_levels(cfg):
    """(N, C_in, C_out, H) of the 3x3 convolutions at each UNet level."""
    out = []
    for d in range(cfg["depth"] + 1):
        c = cfg["base"] * 2 ** d
        out.append((cfg["batch"], c, c, cfg["size"] // 2 ** d))
    return out


def conv_pair(shape, dtype, torch, device):
    """(triflux forward, triflux forward+backward, torch forward, torch forward+backward) closures."""
    import numpy as np
    import triflux as tf
    from triflux import ops
    n, c, o, h = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((o, c, 3, 3)) * 0.05).astype(np.float32)
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    fdt = {"float32": tf.float32, "bfloat16": tf.dtypes.bfloat16}[dtype]
    dev = tf.CUDADevice(0)
    xt, wt = dev(x.astype(fdt)), dev(w.astype(fdt))

    def tf_fwd():
        return ops.conv2d(xt, wt, padding=1)

    def tf_step():
        tf.gradient(lambda x, w: ops.conv2d(x, w, padding=1).sum(), xt, wt)

    X = torch.from_numpy(x).to(device=device, dtype=tdt).requires_grad_()
    W = torch.from_numpy(w).to(device=device, dtype=tdt).requires_grad_()

    def th_fwd():
        with torch.no_grad():
            return torch.nn.functional.conv2d(X, W, padding=1)

    def th_step():
        X.grad = W.grad = None
        torch.nn.functional.conv2d(X, W, padding=1).sum().backward()
    return tf_fwd, tf_step, th_fwd, th_step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: check the script runs")
    args = p.parse_args(argv)

    from triflux import backend
    torch = backend.torch()
    ok, why = backend.status("CUDA")
    if not ok:
        sys.exit(f"no functional CUDA backend ({why}); run on a GPU, or with TRITON_INTERPRET=1 --smoke")
    real_gpu = torch.cuda.is_available() and not backend.interpreter_on()
    device = "cuda" if real_gpu else "cpu"
    if real_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    cfg = dict(UNET, batch=args.batch, size=args.size)
    reps, warmup = args.reps, 2
    if args.smoke or not real_gpu:
        cfg = dict(UNET, batch=1, size=8, depth=1, base=4)
        reps, warmup = 1, 0
    dtypes = args.dtypes.split(",")
    name = torch.cuda.get_device_name(0) if real_gpu else "Triton interpreter (CPU), torch on the CPU"
    print(f"device: {name}; torch {torch.__version__}; triton {backend.triton().__version__}; "
          f"UNet depth {cfg['depth']}, base {cfg['base']}, batch {cfg['batch']}, {cfg['size']}x{cfg['size']}")
    rows = []
    print("\n| what | dtype | triflux | torch | ratio triflux/torch |\n| --- | --- | --- | --- | --- |")
    for dtype in dtypes:
        for shape in unet_levels(cfg):
            tf_fwd, tf_step, th_fwd, th_step = conv_pair(shape, dtype, torch, device)
            for kind, a, b in (("forward", tf_fwd, th_fwd), ("forward+backward", tf_step, th_step)):
                ta, tb = timed(a, torch, reps, warmup), timed(b, torch, reps, warmup)
                what = f"conv3x3 {kind} N{shape[0]} {shape[1]}->{shape[2]} {shape[3]}x{shape[3]}"
                rows.append(dict(what=what, dtype=dtype, triflux_s=ta, torch_s=tb))
                print(f"| {what} | {dtype} | {ta * 1e3:.3f} ms | {tb * 1e3:.3f} ms | {ta / tb:.2f}x |")
    print("\n| UNet training step | dtype | triflux img/s | torch img/s | time ratio | peak memory triflux | "
          "peak memory torch |\n| --- | --- | --- | --- | --- | --- | --- |")
    for dtype in dtypes:
        for what, capture in (("UNet step", False), ("UNet step, captured", True)):
            a = triflux_unet_step(cfg, device="cuda", dtype=dtype, capture=capture)
            b = torch_unet_step(cfg, device=device, dtype=dtype)
            ta, tb = timed(a, torch, reps, warmup), timed(b, torch, reps, warmup)
            ma, mb = peak_memory(a, torch), peak_memory(b, torch)
            mib = lambda m: "-" if m is None else f"{m / 2 ** 20:.0f} MiB"     # noqa: E731
            rows.append(dict(what="unet-step-captured" if capture else "unet-step", dtype=dtype, triflux_s=ta,
                             torch_s=tb, triflux_peak=ma, torch_peak=mb, batch=cfg["batch"]))
            print(f"| {what} | {dtype} | {cfg['batch'] / ta:.1f} | {cfg['batch'] / tb:.1f} | {ta / tb:.2f}x | "
                  f"{mib(ma)} | {mib(mb)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__, triton=backend.triton().__version__, cfg=cfg,
                           rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
