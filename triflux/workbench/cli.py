"""``python -m triflux COMMAND``: the subcommands, each handed to its workbench module."""
import sys

from . import benchmarks, doctor, kernel_report
from .demos import mlp, unet

USAGE = """usage: python -m triflux COMMAND [options]

commands:
  demo unet    train a UNET to segment generated images of shapes, with progress bars,
               checkpoints, metrics and plots (`python -m triflux demo unet --help`)
  demo mlp     train a small classifier (Chain/Dense/Adam) on the digits data set
  doctor       which backends work here and why not, devices, versions, a kernel
               self-test; exit status 1 when the preferred backend is not functional
               (`python -m triflux doctor --help`)
  bench        a quick run of the benchmarks: triflux vs torch on the same device, as a
               table (`python -m triflux bench --help`; perf/ has the careful suites)
  kernels      the kernels of one training step compiled for a GPU without one: registers,
               spills, tensor cores, vector loads, FLOPs, bytes and a predicted time per
               kernel (`python -m triflux kernels --help`)
"""

DEMOS = {"unet": unet, "mlp": mlp}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        return doctor.main(rest)
    if cmd == "bench":
        return benchmarks.main(rest)
    if cmd == "kernels":
        return kernel_report.main(rest)
    if cmd == "demo":
        if not rest or rest[0] in ("-h", "--help"):
            print(f"usage: python -m triflux demo {{{','.join(DEMOS)}}} [options]")
            return 0 if rest else 2
        if rest[0] in DEMOS:
            return DEMOS[rest[0]].main(rest[1:])
        print(f"unknown demo {rest[0]!r}; available: {', '.join(DEMOS)}", file=sys.stderr)
        return 2
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
