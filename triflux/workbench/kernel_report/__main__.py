"""``python -m triflux.workbench.kernel_report [options]``: the report, as
``python -m triflux kernels``; with ``--compile-worker`` alone, the compile
worker that :func:`~.compile_cache.compile_all` starts (a request on stdin,
the metrics as JSON on stdout)."""
import sys

from .command import main
from .compile_cache import compile_worker

if __name__ == "__main__":
    if sys.argv[1:] == ["--compile-worker"]:
        compile_worker()
    else:
        sys.exit(main())
