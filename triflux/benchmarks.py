"""The old name of :mod:`triflux.workbench.benchmarks` (the benchmarked
workloads, ``python -m triflux bench``), kept: importing it gives that very
module object, so an attribute patched through either name is patched for
both."""
import sys

from .workbench import benchmarks

if __name__ == "__main__":          # python -m triflux.benchmarks
    sys.exit(benchmarks.main())
else:
    sys.modules[__name__] = benchmarks
