"""triflux's version (the package's and the one written into saved files)."""
__version__ = "0.1.0"
