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
from triflux.reference.fill import below_one, check_seed, check_shape, random_dtype

from . import common

#: added to every normal draw's counter: bit 62 of the 64-bit Philox counter,
#: far above any element index
NORMAL_STREAM = 1 << 62


def torch_device(device):
    """The torch device behind a triflux ``device`` attr (a ``Device`` object,
    or already a torch device / string). ``None``: the default GPU, or the
    CPU when the Triton interpreter serves the kernels."""
    if device is None:
        return "cpu" if common.INTERPRET else "cuda"
    return getattr(device, "torch_device", device)


def fill_forward(*, shape, value, dtype, device=None):
    return common.full(check_shape(shape), value, to_torch(dtype), torch_device(device))


@triton.jit
def _uniform53(a, b):
    """A float64 uniform on [0, 1) from two random uint32: 27 + 26 bits."""
    hi = (a >> 5).to(tl.float64)
    lo = (b >> 6).to(tl.float64)
    return (hi * 67108864.0 + lo) * 1.1102230246251565e-16  # (hi * 2**26 + lo) / 2**53


@triton.jit(do_not_specialize=["seed"])
def _rand_uniform_kernel(out, n, seed, TOP: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    if out.dtype.element_ty == tl.float64:
        a, b, _, _ = tl.randint4x(seed, lin)
        u = _uniform53(a, b)
        tl.store(out + lin, u, mask=mask)
    else:
        u = tl.minimum(tl.rand(seed, lin), TOP)  # float32 in [0, TOP]
        tl.store(out + lin, u.to(out.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seed"])
def _rand_normal_kernel(out, n, seed, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    counter = lin + STREAM
    if out.dtype.element_ty == tl.float64:
        a, b, c, d = tl.randint4x(seed, counter)
        u1 = 1.0 - _uniform53(a, b)  # (0, 1]: its log is finite
        u2 = _uniform53(c, d)
        r = tl.sqrt(-2.0 * tl.log(u1))
        z = r * tl.cos(6.283185307179586 * u2)
        tl.store(out + lin, z, mask=mask)
    else:
        z = tl.randn(seed, counter)  # float32, Box-Muller inside
        tl.store(out + lin, z.to(out.dtype.element_ty), mask=mask)


def _random(kernel, shape, dtype, seed, device, **meta):
    d = random_dtype(dtype)
    out = common.empty(check_shape(shape), to_torch(d), torch_device(device))
    n = out.numel()
    if n:
        block = common.block_for(n)
        common.launch(kernel, (common.cdiv(n, block),), out, n, check_seed(seed),
                      BLOCK=block, **meta)
    return out


def rand_uniform_forward(*, shape, dtype, seed, device=None):
    return _random(_rand_uniform_kernel, shape, dtype, seed, device,
                   TOP=float(below_one(random_dtype(dtype))))


def rand_normal_forward(*, shape, dtype, seed, device=None):
    return _random(_rand_normal_kernel, shape, dtype, seed, device, STREAM=NORMAL_STREAM)
