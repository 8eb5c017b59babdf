"""NumPy references, forward and backward, one module per family of
primitives. Written to be read: the math is in each docstring. They are also
the CPU backend that users train on."""
