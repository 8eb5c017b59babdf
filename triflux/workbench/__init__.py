"""The workbench: the tools built on triflux, which the library itself never
imports (``tests/test_architecture.py`` checks that).

``python -m triflux COMMAND`` (:mod:`triflux.workbench.cli`) runs them:

* :mod:`~triflux.workbench.demos` (``demo unet``, ``demo mlp``): training
  runs end to end, with their generated data sets;
* :mod:`~triflux.workbench.doctor` (``doctor``): which backends work here,
  and why not;
* :mod:`~triflux.workbench.benchmarks` (``bench``): the benchmarked
  workloads, built in triflux and in torch (perf/ times them too);
* :mod:`~triflux.workbench.kernel_report` (``kernels``): the kernels of a
  training step compiled for a GPU without one, with a roofline model;
* :mod:`~triflux.workbench.flags`: what the commands share (``--device``,
  the notice of runs on the Triton interpreter).

The old names (``triflux.doctor``, ``triflux.benchmarks``,
``triflux.kernel_report``, ``triflux.demos``...) are kept: each is the same
module object as its workbench counterpart.
"""
