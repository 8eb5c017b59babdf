"""Triton kernels, forward and backward, one module per family of primitives,
mirroring ``triflux.reference`` name for name. torch is used only to allocate
device memory and to copy; every computation is a Triton kernel."""
