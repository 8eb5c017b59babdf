"""Packaging (metadata and dependencies are in setup.cfg).

One distribution, ``triflux``, from three top-level folders of the checkout:
triflux/ is the package, and reference/ and triton_kernels/ are installed as
its subpackages triflux.reference and triflux.triton_kernels, so no top-level
name collides with other distributions. Every package under those folders is
found, not listed, so a new subpackage ships the day it is added; tests/,
perf/ and examples/ are not under them and never ship.
tests/test_wheel_install.py builds the wheel and imports every module from it.
"""
from setuptools import find_packages, setup

#: installed package name -> folder of the checkout that holds it
PACKAGE_DIR = {
    "triflux": "triflux",
    "triflux.reference": "reference",
    "triflux.triton_kernels": "triton_kernels",
}

PACKAGES = [name + sub for name, folder in PACKAGE_DIR.items()
            for sub in [""] + ["." + found for found in find_packages(folder)]]

setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
