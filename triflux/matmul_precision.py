"""How GPUs multiply float32 matrices: exactly ("ieee", the default) or on
tensor cores in TF32 ("tf32"), like ``torch.set_float32_matmul_precision``.

* ``"ieee"``: every product a[m, k] b[k, n] is an exact float32 multiply-add
  (FFMA), so a GPU's float32 matmul and conv agree with the float64
  reference to float32's tolerance.
* ``"tf32"``: the tensor cores read each float32 operand as TF32 (float32's
  exponent, a 10-bit significand: they drop the low 13 bits, a relative error
  below 2^-10) and accumulate the products in float32. A dot of K terms is
  then off by up to 2^-9 sum_k |a_k b_k|, about three decimal digits, the
  price of several times the FFMA throughput.

The setting is process-wide and read at each launch, so it applies from the
next call on. It changes the float32 dots of every GEMM-shaped kernel: matmul,
conv, conv_transpose and conv_bias_act of any rank (forward and gradients) and the recurrent
layers' matrix products. float64 products, 16-bit products (tensor cores
already) and the CPU reference are unchanged. The Triton interpreter
(``TRITON_INTERPRET=1``) runs the kernels with the TF32 dot but computes
exact float32 products (NumPy's matmul), so there TF32 changes nothing.

torch's names are accepted too: ``"highest"`` is ``"ieee"``, ``"high"`` is
``"tf32"`` (torch's ``"medium"``, bfloat16 products, has no counterpart).
"""

#: the precisions, as ``get_matmul_precision`` reports them
PRECISIONS = ("ieee", "tf32")
#: torch.set_float32_matmul_precision's spellings of the same two
TORCH_NAMES = {"highest": "ieee", "high": "tf32"}

_precision = "ieee"


def set_matmul_precision(precision):
    """Make float32 matrix products on GPUs ``"ieee"`` (exact float32
    multiply-adds, the default) or ``"tf32"`` (tensor cores, inputs rounded to
    a 10-bit significand; see the module docstring). torch's ``"highest"`` and
    ``"high"`` mean ``"ieee"`` and ``"tf32"``. Case is ignored."""
    global _precision
    name = precision.lower() if isinstance(precision, str) else precision
    name = TORCH_NAMES.get(name, name)
    if name not in PRECISIONS:
        raise ValueError(f'matmul precision must be "ieee" or "tf32" (or torch\'s "highest" or "high"), '
                         f"got {precision!r}")
    _precision = name


def get_matmul_precision():
    """The current precision of float32 matrix products on GPUs: ``"ieee"`` or ``"tf32"``."""
    return _precision
