"""The old name of :mod:`triflux.workbench.kernel_report` (``python -m
triflux kernels``), kept: importing it gives that very package object, so an
attribute patched through either name is patched for both."""
import runpy
import sys

from .workbench import kernel_report

if __name__ == "__main__":          # python -m triflux.kernel_report [--compile-worker]
    runpy.run_module(kernel_report.__name__, run_name="__main__")
else:
    sys.modules[__name__] = kernel_report
