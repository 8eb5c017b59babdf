"""A training step's ratio measured in alternating processes: rounds alternate
between a fresh process timing triflux and one timing torch, so both see the
same machine state (on a shared VM, runs minutes apart can differ by 1.5x),
and neither side's thread pool (NumPy's OpenBLAS, torch's OpenMP) competes
with the other's in one process. Prints the medians and the ratio.

    .venv/bin/python perf/interleaved.py [rounds] [mlp|unet|rnn_seed|lstm_large]
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triflux.benchmarks import BUILDERS  # noqa: E402


def per_step(fn, n=10):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


#: (warm-up steps, timed groups, steps per group) per workload
SCHEDULE = {"mlp": (5, 12, 5), "unet": (1, 5, 1), "rnn_seed": (20, 12, 20), "lstm_large": (1, 3, 1)}


def time_side(side, workload="mlp"):
    """Median seconds per step of one side, measured in this process."""
    step = BUILDERS[workload, side]()
    warm, groups, per = SCHEDULE[workload]
    for _ in range(warm):
        step()
    return statistics.median(per_step(step, per) for _ in range(groups))


def main(rounds=6, workload="mlp"):
    ta, tb = [], []
    for _ in range(rounds):
        for side, out in (("triflux", ta), ("torch", tb)):
            r = subprocess.run([sys.executable, __file__, "--side", side, workload], capture_output=True, text=True,
                               check=True)
            out.append(float(r.stdout))
    ratios = [x / y for x, y in zip(ta, tb)]
    print(f"{workload}: triflux {statistics.median(ta) * 1e3:.2f} ms, torch {statistics.median(tb) * 1e3:.2f} ms per step "
          f"(medians over {rounds} alternating process pairs)")
    print(f"ratio triflux/torch: median {statistics.median(ratios):.2f}x, "
          f"range {min(ratios):.2f}x-{max(ratios):.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--side":
        print(time_side(sys.argv[2], sys.argv[3]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 6, sys.argv[2] if len(sys.argv) > 2 else "mlp")
