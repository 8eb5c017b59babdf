"""Whether GPU kernels time their tile candidates (``set_autotune``), like
``torch.backends.cudnn.benchmark``.

Off (the default), a GPU launch takes the tile the wave model picks
(``triton_kernels.matmul.best_tile``; ``pydoc triflux.kernel_report``): no
time is spent measuring, and a step is the same every run. On, the matrix
product and the convolution kernels go through ``triton.autotune`` on a real
GPU: the first launch of each shape (sizes, dot kind and dtypes) times every
tile of the kernel's table for that dot kind, the model's pick first, and
keeps the fastest, so a tuned launch is never slower than the model's tile
by more than the timing noise. Tuning costs a few hundred milliseconds per
new shape. The Triton interpreter never tunes (it would time NumPy).
"""

_autotune = False


def set_autotune(on=True):
    """Time the tile candidates of the matmul and conv kernels on a real GPU
    (``True``) or take the model's tile (``False``, the default)."""
    global _autotune
    if not isinstance(on, bool):
        raise TypeError(f"set_autotune takes True or False, got {on!r}")
    _autotune = on


def get_autotune():
    """Whether GPU kernels time their tile candidates (see ``set_autotune``)."""
    return _autotune
