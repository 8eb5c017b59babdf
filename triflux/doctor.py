"""The old name of :mod:`triflux.workbench.doctor` (``python -m triflux
doctor``), kept: importing it gives that very module object, so an attribute
patched through either name is patched for both."""
import sys

from .workbench import doctor

sys.modules[__name__] = doctor
