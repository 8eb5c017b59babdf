"""triflux: Flux.jl's model of GPU support, in Python."""
import os as _os

# In a source checkout the top-level reference/ and triton_kernels/ folders are
# this package's subpackages (setup.cfg installs them as triflux.reference and
# triflux.triton_kernels); make the same names resolve when run from the tree.
_src = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "reference")) and \
        _os.path.isdir(_os.path.join(_src, "reference")) and _src not in __path__:
    __path__.append(_src)
