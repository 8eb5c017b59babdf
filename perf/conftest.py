"""Benchmarks run on the reference (CPU) path unless a test asks for kernels."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
