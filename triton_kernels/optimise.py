"""Optimiser updates on the device (mirrors ``reference/optimise.py``, where
the formulas are written out).

One fused kernel per rule: each program reads its block of ``x``, ``g`` and
the rule's states once, computes in float32 (float64 for float64 arrays) and
writes ``x`` and the states back in place. Any layout works: every tensor is
addressed through its own strides (the common all-dense case takes a 1-d fast
path), so a parameter that is a transposed or strided view is updated where it
lives.

Hyperparameters reach the kernel as float32 arguments (Triton passes Python
floats as float32). For float64 arrays that would round ``eta = 1e-3`` to
float32, so each scalar travels as a pair ``hi + lo`` of float32 numbers whose
float64 sum is the value to ~1e-15; float32 kernels use ``hi`` alone. The
bias corrections ``1 - beta^t`` are computed here, in float64.
"""
import torch
import triton
import triton.language as tl

from triflux.errors import DeviceMismatchError, DTypeError, ShapeError
from triflux.reference.optimise import check_step

from . import indexing, launch, numerics
from .numerics import from_float32_pair


@triton.jit
def _store(pointer, offset, value, mask):
    """Store a compute-typed value, going through float32 on the way to a
    16-bit type (the interpreter cannot convert float64 to bfloat16)."""
    element_type = pointer.dtype.element_ty
    if element_type != tl.float64 and value.dtype == tl.float64:
        value = value.to(tl.float32)
    tl.store(pointer + offset, value.to(element_type), mask=mask)


# --- descent ---------------------------------------------------------------------------------

@triton.jit
def _descent_kernel(x_pointer, grad_pointer, n_elements, size1, size2, size3, size4, size5,
                    x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                    grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                    eta_hi, eta_lo,
                    COMPUTE_TYPE: tl.constexpr, DENSE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=DENSE)
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=DENSE)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    _store(x_pointer, x_offset, x - eta * g, mask)


# --- momentum and nesterov -------------------------------------------------------------------

@triton.jit
def _momentum_kernel(x_pointer, grad_pointer, velocity_pointer, n_elements,
                     size1, size2, size3, size4, size5,
                     x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                     grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                     velocity_stride0, velocity_stride1, velocity_stride2, velocity_stride3,
                     velocity_stride4, velocity_stride5,
                     eta_hi, eta_lo, rho_hi, rho_lo,
                     NESTEROV: tl.constexpr, COMPUTE_TYPE: tl.constexpr, DENSE: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=DENSE)
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=DENSE)
    velocity_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, velocity_stride0,
                                         velocity_stride1, velocity_stride2, velocity_stride3,
                                         velocity_stride4, velocity_stride5, DENSE=DENSE)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    v = tl.load(velocity_pointer + velocity_offset, mask=mask).to(COMPUTE_TYPE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    rho = from_float32_pair(rho_hi, rho_lo, COMPUTE_TYPE)
    if NESTEROV:
        d = -(rho * rho) * v + (1 + rho) * eta * g  # uses the old velocity
        v = rho * v - eta * g
    else:
        v = rho * v + eta * g
        d = v
    _store(velocity_pointer, velocity_offset, v, mask)
    _store(x_pointer, x_offset, x - d, mask)


# --- adam and adamw --------------------------------------------------------------------------

@triton.jit
def _adam_kernel(x_pointer, grad_pointer, m_pointer, v_pointer, n_elements,
                 size1, size2, size3, size4, size5,
                 x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                 grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                 m_stride0, m_stride1, m_stride2, m_stride3, m_stride4, m_stride5,
                 v_stride0, v_stride1, v_stride2, v_stride3, v_stride4, v_stride5,
                 eta_hi, eta_lo, beta1_hi, beta1_lo, beta2_hi, beta2_lo, epsilon_hi, epsilon_lo,
                 correction1_hi, correction1_lo, correction2_hi, correction2_lo, lambd_hi, lambd_lo,
                 DECAY: tl.constexpr, COMPUTE_TYPE: tl.constexpr, DENSE: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
    """``m`` and ``v`` are the first and second moments; ``correction1`` and
    ``correction2`` the bias corrections 1 - beta1^t and 1 - beta2^t."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=DENSE)
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=DENSE)
    m_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, m_stride0, m_stride1,
                                  m_stride2, m_stride3, m_stride4, m_stride5, DENSE=DENSE)
    v_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, v_stride0, v_stride1,
                                  v_stride2, v_stride3, v_stride4, v_stride5, DENSE=DENSE)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    m = tl.load(m_pointer + m_offset, mask=mask).to(COMPUTE_TYPE)
    v = tl.load(v_pointer + v_offset, mask=mask).to(COMPUTE_TYPE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    beta1 = from_float32_pair(beta1_hi, beta1_lo, COMPUTE_TYPE)
    beta2 = from_float32_pair(beta2_hi, beta2_lo, COMPUTE_TYPE)
    epsilon = from_float32_pair(epsilon_hi, epsilon_lo, COMPUTE_TYPE)
    correction1 = from_float32_pair(correction1_hi, correction1_lo, COMPUTE_TYPE)
    correction2 = from_float32_pair(correction2_hi, correction2_lo, COMPUTE_TYPE)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    d = (m / correction1) / (tl.sqrt(v / correction2) + epsilon)
    if DECAY:  # AdamW, coupled: x - eta * (d + lambd * x)
        d = d + from_float32_pair(lambd_hi, lambd_lo, COMPUTE_TYPE) * x
    _store(m_pointer, m_offset, m, mask)
    _store(v_pointer, v_offset, v, mask)
    _store(x_pointer, x_offset, x - eta * d, mask)


# --- rmsprop ---------------------------------------------------------------------------------

@triton.jit
def _rmsprop_kernel(x_pointer, grad_pointer, square_pointer, n_elements,
                    size1, size2, size3, size4, size5,
                    x_stride0, x_stride1, x_stride2, x_stride3, x_stride4, x_stride5,
                    grad_stride0, grad_stride1, grad_stride2, grad_stride3, grad_stride4, grad_stride5,
                    square_stride0, square_stride1, square_stride2, square_stride3, square_stride4,
                    square_stride5,
                    eta_hi, eta_lo, rho_hi, rho_lo, epsilon_hi, epsilon_lo,
                    COMPUTE_TYPE: tl.constexpr, DENSE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """``square`` is the running mean of g^2."""
    index = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = index < n_elements
    x_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, x_stride0, x_stride1,
                                  x_stride2, x_stride3, x_stride4, x_stride5, DENSE=DENSE)
    grad_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, grad_stride0,
                                     grad_stride1, grad_stride2, grad_stride3, grad_stride4,
                                     grad_stride5, DENSE=DENSE)
    square_offset = indexing.nd_offset(index, size1, size2, size3, size4, size5, square_stride0,
                                       square_stride1, square_stride2, square_stride3,
                                       square_stride4, square_stride5, DENSE=DENSE)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    square = tl.load(square_pointer + square_offset, mask=mask).to(COMPUTE_TYPE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    rho = from_float32_pair(rho_hi, rho_lo, COMPUTE_TYPE)
    epsilon = from_float32_pair(epsilon_hi, epsilon_lo, COMPUTE_TYPE)
    square = rho * square + (1 - rho) * g * g
    _store(square_pointer, square_offset, square, mask)
    _store(x_pointer, x_offset, x - eta * g / (tl.sqrt(square) + epsilon), mask)


# --- host side -------------------------------------------------------------------------------

def _launch(kernel, rule, tensors, scalars, **meta):
    """Check ``tensors`` = ``(x, g, *states)``, then run ``kernel`` once over
    all elements with each tensor's strides and ``scalars`` as hi/lo pairs."""
    x = tensors[0]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise DTypeError(f"{rule}: parameters must be floating point, got {x.dtype}")
    for name, t in zip(("gradient", "state", "state", "state"), tensors[1:]):
        if tuple(t.shape) != tuple(x.shape):
            raise ShapeError(f"{rule}: the {name} has shape {tuple(t.shape)} but the "
                             f"parameter has shape {tuple(x.shape)}")
        if t.dtype != x.dtype:
            raise DTypeError(f"{rule}: the {name} is {t.dtype} but the parameter is {x.dtype}; "
                             "parameters, gradients and optimiser states share one dtype")
        if t.device != x.device:
            raise DeviceMismatchError(f"{rule}: the {name} is on {t.device} but the parameter is on "
                                      f"{x.device}; move both to one device")
    n = x.numel()
    if n == 0:
        return
    for k, t in enumerate(tensors):
        if k != 1 and any(st == 0 and sd > 1 for st, sd in zip(t.stride(), t.shape)):
            raise ShapeError(f"{rule}: cannot update a broadcast (stride-0) view in place; "
                             "make the parameter and its states dense arrays")
    sizes, strides = indexing.merge_dims(tuple(x.shape), *[tuple(t.stride()) for t in tensors])
    dense = all(indexing.dense_strides(sizes, st) for st in strides)
    scalar_pairs = [half for s in scalars for half in numerics.float32_pair(s)]
    stride_args = [s for st in strides for s in st]
    block = launch.block_for(n)
    launch.launch(kernel, (launch.cdiv(n, block),), *tensors, n, *sizes[1:], *stride_args, *scalar_pairs,
                  COMPUTE_TYPE=numerics.compute_type(x.dtype), DENSE=dense, BLOCK_SIZE=block, **meta)


def descent_update_forward(x, g, *, eta):
    _launch(_descent_kernel, "descent_update", (x, g), (eta,))


def momentum_update_forward(x, g, v, *, eta, rho):
    _launch(_momentum_kernel, "momentum_update", (x, g, v), (eta, rho), NESTEROV=False)


def nesterov_update_forward(x, g, v, *, eta, rho):
    _launch(_momentum_kernel, "nesterov_update", (x, g, v), (eta, rho), NESTEROV=True)


def _bias_corrections(beta1, beta2, step):
    step = check_step(step)
    return 1.0 - float(beta1) ** step, 1.0 - float(beta2) ** step


def adam_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, step):
    bc1, bc2 = _bias_corrections(beta1, beta2, step)
    _launch(_adam_kernel, "adam_update", (x, g, m, v),
            (eta, beta1, beta2, epsilon, bc1, bc2, 0.0), DECAY=False)


def adamw_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, lambd, step):
    bc1, bc2 = _bias_corrections(beta1, beta2, step)
    _launch(_adam_kernel, "adamw_update", (x, g, m, v),
            (eta, beta1, beta2, epsilon, bc1, bc2, lambd), DECAY=True)


def rmsprop_update_forward(x, g, s, *, eta, rho, epsilon):
    _launch(_rmsprop_kernel, "rmsprop_update", (x, g, s), (eta, rho, epsilon))
