"""The MLP-step ratio measured in alternating processes: rounds alternate
between a fresh process timing triflux and one timing torch, so both see the
same machine state (on a shared VM, runs minutes apart can differ by 1.5x),
and neither side's thread pool (NumPy's OpenBLAS, torch's OpenMP) competes
with the other's in one process. Prints the medians and the ratio.

    .venv/bin/python perf/interleaved.py [rounds]
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from perf.test_bench_cpu import torch_mlp_step, triflux_mlp_step  # noqa: E402


def per_step(fn, n=10):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def time_side(side, steps=60):
    """Median seconds per step of one side, measured in this process."""
    step = triflux_mlp_step() if side == "triflux" else torch_mlp_step()
    for _ in range(5):
        step()
    return statistics.median(per_step(step, 5) for _ in range(steps // 5))


def main(rounds=6):
    ta, tb = [], []
    for _ in range(rounds):
        for side, out in (("triflux", ta), ("torch", tb)):
            r = subprocess.run([sys.executable, __file__, "--side", side], capture_output=True, text=True, check=True)
            out.append(float(r.stdout))
    ratios = [x / y for x, y in zip(ta, tb)]
    print(f"triflux {statistics.median(ta) * 1e3:.2f} ms, torch {statistics.median(tb) * 1e3:.2f} ms per step "
          f"(medians over {rounds} alternating process pairs)")
    print(f"ratio triflux/torch: median {statistics.median(ratios):.2f}x, "
          f"range {min(ratios):.2f}x-{max(ratios):.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--side":
        print(time_side(sys.argv[2]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
