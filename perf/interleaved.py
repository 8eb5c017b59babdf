"""A training step's ratio measured in alternating processes: rounds alternate
between a fresh process timing triflux and one timing torch, so both see the
same machine state (on a shared VM, runs minutes apart can differ by 1.5x),
and neither side's thread pool (NumPy's OpenBLAS, torch's OpenMP) competes
with the other's in one process. Prints a table row per case: the medians,
the ratio's median and range over the rounds, and the load average (the
machine's other work) before and after.

    .venv/bin/python perf/interleaved.py [--one-thread] [--before DIR] [rounds] [case ... | quick | all]

``--before DIR`` times a second triflux, the checkout at DIR (a ``git worktree``
of the commit before a change), in the same rounds: a third process per round,
so the before and after ratios share the machine's state.

``--one-thread`` runs both sides with one thread (OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS = 1) and takes, per process, the least CPU time per step over
its timed groups: a measure the machine's other work hardly moves (above a
load of ~2 both sides' two-thread pools collapse, and the plain ratio with them).

Each side's step time is the median over a process's timed groups; the table
gives the medians over the rounds, the median ratio and its range, and each
side's minimum over the rounds with their ratio (the least disturbed figure).
Never time the two sides in one process: torch's steps run after triflux's
there are slower than in a process of their own (the two thread pools share
the cores), which flatters triflux.

The cases are ``python -m triflux bench``'s workloads (``quick``: mlp,
unet_quick, rnn_seed, lstm_quick, seed_chain), the large ones (unet,
lstm_large), the spatial ranks (``ranks``: one Conv layer of 1, 2 and 3 spatial
axes, forward and backward, and the volumetric UNet step of depth 2, base 8,
batch 2, 32^3) and two per-op probes: ``seed_chain_tiny`` (the seeds' Chain at
batch 1, 8x8: about 40 ops a step on almost no data, so its time is the fixed
cost per op) and ``add_tiny`` (one ``a + b`` of (4,) float32, outside any
gradient).
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triflux.workbench.benchmarks import (BUILDERS, CONV_LAYERS, LSTM_LARGE, LSTM_QUICK, MLP, RNN_SEED,  # noqa: E402
                                          SEED_CHAIN, UNET, UNET3D_SMALL, UNET_QUICK)


def _add_tiny(side):
    if side == "torch":
        import torch
        a, b = torch.ones(4), torch.ones(4)
    else:
        import triflux as tf
        a, b = tf.ones(4), tf.ones(4)
    return lambda: a + b


#: case: (the builder of a side's step, (warm-up steps, timed groups, steps per group))
CASES = {
    "mlp": (lambda side: BUILDERS["mlp", side](MLP), (5, 12, 5)),
    "unet_quick": (lambda side: BUILDERS["unet", side](UNET_QUICK), (2, 9, 3)),
    "rnn_seed": (lambda side: BUILDERS["rnn_seed", side](RNN_SEED), (20, 12, 20)),
    "lstm_quick": (lambda side: BUILDERS["lstm_large", side](LSTM_QUICK), (3, 12, 3)),
    "seed_chain": (lambda side: BUILDERS["seed_chain", side](SEED_CHAIN), (1, 7, 1)),
    "unet": (lambda side: BUILDERS["unet", side](UNET), (1, 5, 1)),
    "lstm_large": (lambda side: BUILDERS["lstm_large", side](LSTM_LARGE), (1, 3, 1)),
    "seed_chain_tiny": (lambda side: BUILDERS["seed_chain", side](dict(SEED_CHAIN, batch=1, size=8)), (20, 12, 20)),
    "add_tiny": (_add_tiny, (1000, 12, 2000)),
    "unet3d_small": (lambda side: BUILDERS["unet", side](UNET3D_SMALL), (1, 5, 1)),
    **{f"conv{r}d_layer": ((lambda r: lambda side: BUILDERS["conv_layer", side](CONV_LAYERS[r]))(r), (2, 9, 2))
       for r in (1, 2, 3)},
}
GROUPS = {"quick": ["mlp", "unet_quick", "rnn_seed", "lstm_quick", "seed_chain"],
          "ranks": ["conv1d_layer", "conv2d_layer", "conv3d_layer", "unet3d_small"],
          "all": ["mlp", "unet_quick", "rnn_seed", "lstm_quick", "seed_chain", "unet", "lstm_large",
                  "seed_chain_tiny", "add_tiny"]}


def per_step(fn, n=10, clock=time.perf_counter):
    t = clock()
    for _ in range(n):
        fn()
    return (clock() - t) / n


def time_side(side, case="mlp", cpu=False):
    """Seconds per step of one side, measured in this process: the median wall
    time over the timed groups, or (``cpu``) the least CPU time of a group."""
    build, (warm, groups, per) = CASES[case]
    step = build(side)
    for _ in range(warm):
        step()
    if cpu:
        return min(per_step(step, per, time.process_time) for _ in range(groups))
    return statistics.median(per_step(step, per) for _ in range(groups))


def _ms(seconds):
    return f"{seconds * 1e3:.3f} ms" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


#: the environment of a one-thread side: OpenBLAS (NumPy) and OpenMP (torch) pools of one
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def measure(case, rounds=6, one_thread=False, before=None):
    """(triflux's median, torch's median, the ratios of the rounds, (triflux's
    minimum, torch's minimum)), alternating processes; with ``before`` (the root of another checkout, such as a ``git
    worktree`` of an older commit) a third process per round times its triflux,
    and its (median, ratios) follow."""
    scripts = [("triflux", __file__), ("torch", __file__)]
    if before:
        scripts.append(("triflux", os.path.join(before, "perf", "interleaved.py")))
    times = [[] for _ in scripts]
    env = dict(os.environ, **ONE_THREAD) if one_thread else None
    for _ in range(rounds):
        for (side, script), out in zip(scripts, times):
            r = subprocess.run([sys.executable, script, "--side", side, case] + ["--cpu"] * one_thread,
                               capture_output=True, text=True, check=True, env=env)
            out.append(float(r.stdout))
    ta, tb, *old = times
    result = statistics.median(ta), statistics.median(tb), [x / y for x, y in zip(ta, tb)], (min(ta), min(tb))
    return result + ((statistics.median(old[0]), [x / y for x, y in zip(old[0], tb)]) if before else ())


def _ratio(ratios):
    return f"**{statistics.median(ratios):.2f}x** | {min(ratios):.2f}x-{max(ratios):.2f}x"


def main(rounds=6, cases=("mlp",), one_thread=False, before=None):
    print(f"{rounds} alternating process {'triples' if before else 'pairs'} per case; load: the 1-minute load "
          "average before -> after"
          + ("; one thread each side, CPU time per step (the least over a process's groups)" if one_thread else ""))
    if before:
        print(f"before: {before}\n| case | triflux before | triflux | torch | ratio before | range | ratio | range "
              "| ratio of minima | load |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    else:
        print("| case | triflux | torch | ratio (median) | range | triflux min | torch min | ratio of minima | load |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        load = os.getloadavg()[0]
        a, b, ratios, (min_a, min_b), *old = measure(case, rounds, one_thread, before)
        times = f"{_ms(old[0])} | {_ms(a)} | {_ms(b)} | {_ratio(old[1])}" if before else f"{_ms(a)} | {_ms(b)}"
        minima = f"{min_a / min_b:.2f}x" if before else f"{_ms(min_a)} | {_ms(min_b)} | {min_a / min_b:.2f}x"
        print(f"| {case} | {times} | {_ratio(ratios)} | {minima} | {load:.1f} -> {os.getloadavg()[0]:.1f} |",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--side":
        print(time_side(sys.argv[2], sys.argv[3], cpu="--cpu" in sys.argv[4:]))
    else:
        args = sys.argv[1:]
        one_thread = "--one-thread" in args
        args = [a for a in args if a != "--one-thread"]
        before = None
        if "--before" in args:
            at = args.index("--before")
            before = args[at + 1]
            del args[at:at + 2]
        n = int(args.pop(0)) if args and args[0].isdigit() else 6
        names = [c for a in (args or ["mlp"]) for c in GROUPS.get(a, [a])]
        unknown = [c for c in names if c not in CASES]
        if unknown:
            sys.exit(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join([*CASES, *GROUPS])}")
        main(n, names, one_thread, before)
