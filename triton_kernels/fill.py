"""Fills on the device (mirrors ``reference/fill.py``).

Random numbers come from Triton's counter-based Philox generator: element
``i`` of the output is a pure function of ``(seed, i)``, so the same seed
gives the same numbers on any device, for any block size or grid, and a
longer array with the same seed extends a shorter one.

* float32, float16, bfloat16: ``tl.rand`` / ``tl.randn`` in float32, then
  rounded (uniform draws clamped below 1 first, so rounding never gives 1).
* float64: 53 random bits from two 32-bit Philox outputs per uniform; the
  normal is Box-Muller on two such uniforms, all in float64.

Normal draws read Philox counters in a different stream from uniform ones
(:data:`NORMAL_STREAM` set in the counter's high word), so ``rand_uniform``
and ``rand_normal`` with the same seed are independent.
"""
import triton
import triton.language as tl

from triflux.dtypes import to_torch
from triflux.specs.fill import below_one, check_seed, check_shape, random_dtype

from . import copy, launch

#: added to every normal draw's counter: bit 62 of the 64-bit Philox counter,
#: far above any element index
NORMAL_STREAM = 1 << 62


def torch_device(device):
    """The torch device behind a triflux ``device`` attr (a ``Device`` object,
    or already a torch device / string). ``None``: the default GPU, or the
    CPU when the Triton interpreter serves the kernels."""
    if device is None:
        return "cpu" if launch.INTERPRET else "cuda"
    return getattr(device, "torch_device", device)


def fill_forward(*, shape, value, dtype, device=None):
    return copy.full(check_shape(shape), value, to_torch(dtype), torch_device(device))


@triton.jit
def _uniform53(a, b):
    """A float64 uniform on [0, 1) from two random uint32: 27 + 26 bits."""
    hi = (a >> 5).to(tl.float64)
    lo = (b >> 6).to(tl.float64)
    return (hi * 67108864.0 + lo) * 1.1102230246251565e-16  # (hi * 2**26 + lo) / 2**53


@triton.jit(do_not_specialize=["seed"])
def _rand_uniform_kernel(output_pointer, n_elements, seed,
                         BELOW_ONE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output[i] uniform on [0, 1) from Philox counter i; ``BELOW_ONE`` is the
    largest value below 1 of a 16-bit or float32 output."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    if output_pointer.dtype.element_ty == tl.float64:
        a, b, _, _ = tl.randint4x(seed, index)
        u = _uniform53(a, b)
        tl.store(output_pointer + index, u, mask=mask)
    else:
        u = tl.minimum(tl.rand(seed, index), BELOW_ONE)  # float32 in [0, BELOW_ONE]
        tl.store(output_pointer + index, u.to(output_pointer.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed"])
def _rand_normal_kernel(output_pointer, n_elements, seed,
                        STREAM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """output[i] standard normal from Philox counter i + ``STREAM``."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    counter = index + STREAM
    if output_pointer.dtype.element_ty == tl.float64:
        a, b, c, d = tl.randint4x(seed, counter)
        u1 = 1.0 - _uniform53(a, b)  # (0, 1]: its log is finite
        u2 = _uniform53(c, d)
        r = tl.sqrt(-2.0 * tl.log(u1))
        z = r * tl.cos(6.283185307179586 * u2)
        tl.store(output_pointer + index, z, mask=mask)
    else:
        z = tl.randn(seed, counter)  # float32, Box-Muller inside
        tl.store(output_pointer + index, z.to(output_pointer.dtype.element_ty), mask=mask)


def _random(kernel, shape, dtype, seed, device, **meta):
    d = random_dtype(dtype)
    out = launch.empty(check_shape(shape), to_torch(d), torch_device(device))
    n = out.numel()
    if n:
        block = launch.block_for(n)
        launch.launch(kernel, (launch.cdiv(n, block),), out, n, check_seed(seed),
                      BLOCK_SIZE=block, **meta)
    return out


def rand_uniform_forward(*, shape, dtype, seed, device=None):
    return _random(_rand_uniform_kernel, shape, dtype, seed, device,
                   BELOW_ONE=float(below_one(random_dtype(dtype))))


def rand_normal_forward(*, shape, dtype, seed, device=None):
    return _random(_rand_normal_kernel, shape, dtype, seed, device, STREAM=NORMAL_STREAM)
