"""The old name of :mod:`triflux.workbench.demos`, kept: importing it gives
that very package object, and ``triflux.demos.unet``, ``.mlp``, ``.shapes``
and ``.volumes`` the workbench's modules (``triflux.demos.cli``, what the
commands share, is :mod:`triflux.workbench.flags`)."""
import sys

from ..workbench import demos, flags
from ..workbench.demos import mlp, shapes, unet, volumes

sys.modules[__name__] = demos
for _name, _module in {"mlp": mlp, "shapes": shapes, "unet": unet, "volumes": volumes, "cli": flags}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
demos.cli = flags      # `from triflux.demos import cli`: the package's old submodule
