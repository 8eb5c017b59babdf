"""``python -m triflux COMMAND``: runs the workbench's command line,
:mod:`triflux.workbench.cli`. Imported (``from triflux.__main__ import
main``), this name gives that very module object."""
import sys

from .workbench import cli

if __name__ == "__main__":
    sys.exit(cli.main())
else:
    sys.modules[__name__] = cli
