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
import numpy as np
import triton
import triton.language as tl

from triflux.errors import DeviceMismatchError, DTypeError, ShapeError
from triflux.reference.optimise import _check_step

from . import common


def _split(value):
    """``value`` as two float32 numbers ``(hi, lo)`` with ``hi + lo ~ value``."""
    hi = float(np.float32(value))
    return hi, float(np.float32(float(value) - hi))


@triton.jit
def _scalar(hi, lo, CT: tl.constexpr):
    """The hyperparameter ``hi + lo`` in the compute type."""
    if CT == tl.float64:
        return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)
    else:
        return tl.cast(hi, tl.float32)


@triton.jit
def _offsets(lin, DENSE: tl.constexpr, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5):
    """Element offset of linear index ``lin`` in one tensor."""
    if DENSE:
        return lin
    else:
        return common.nd_offset(lin, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5)


@triton.jit
def _store(ptr, offs, value, mask):
    """Store a compute-typed value, going through float32 on the way to a
    16-bit type (the interpreter cannot convert float64 to bfloat16)."""
    ty = ptr.dtype.element_ty
    if ty != tl.float64 and value.dtype == tl.float64:
        value = value.to(tl.float32)
    tl.store(ptr + offs, value.to(ty), mask=mask)


# --- descent ---------------------------------------------------------------------------------

@triton.jit
def _descent_kernel(x, g, n, D1, D2, D3, D4, D5,
                    X0, X1, X2, X3, X4, X5, G0, G1, G2, G3, G4, G5,
                    eta_hi, eta_lo,
                    CT: tl.constexpr, DENSE: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    xo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)
    go = _offsets(lin, DENSE, D1, D2, D3, D4, D5, G0, G1, G2, G3, G4, G5)
    xv = tl.load(x + xo, mask=mask).to(CT)
    gv = tl.load(g + go, mask=mask).to(CT)
    eta = _scalar(eta_hi, eta_lo, CT)
    _store(x, xo, xv - eta * gv, mask)


# --- momentum and nesterov -------------------------------------------------------------------

@triton.jit
def _momentum_kernel(x, g, v, n, D1, D2, D3, D4, D5,
                     X0, X1, X2, X3, X4, X5, G0, G1, G2, G3, G4, G5,
                     V0, V1, V2, V3, V4, V5,
                     eta_hi, eta_lo, rho_hi, rho_lo,
                     NESTEROV: tl.constexpr, CT: tl.constexpr, DENSE: tl.constexpr,
                     BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    xo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)
    go = _offsets(lin, DENSE, D1, D2, D3, D4, D5, G0, G1, G2, G3, G4, G5)
    vo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, V0, V1, V2, V3, V4, V5)
    xv = tl.load(x + xo, mask=mask).to(CT)
    gv = tl.load(g + go, mask=mask).to(CT)
    vv = tl.load(v + vo, mask=mask).to(CT)
    eta = _scalar(eta_hi, eta_lo, CT)
    rho = _scalar(rho_hi, rho_lo, CT)
    if NESTEROV:
        d = -(rho * rho) * vv + (1 + rho) * eta * gv  # uses the old velocity
        vv = rho * vv - eta * gv
    else:
        vv = rho * vv + eta * gv
        d = vv
    _store(v, vo, vv, mask)
    _store(x, xo, xv - d, mask)


# --- adam and adamw --------------------------------------------------------------------------

@triton.jit
def _adam_kernel(x, g, m, v, n, D1, D2, D3, D4, D5,
                 X0, X1, X2, X3, X4, X5, G0, G1, G2, G3, G4, G5,
                 M0, M1, M2, M3, M4, M5, V0, V1, V2, V3, V4, V5,
                 eta_hi, eta_lo, b1_hi, b1_lo, b2_hi, b2_lo, eps_hi, eps_lo,
                 bc1_hi, bc1_lo, bc2_hi, bc2_lo, lam_hi, lam_lo,
                 DECAY: tl.constexpr, CT: tl.constexpr, DENSE: tl.constexpr,
                 BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    xo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)
    go = _offsets(lin, DENSE, D1, D2, D3, D4, D5, G0, G1, G2, G3, G4, G5)
    mo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, M0, M1, M2, M3, M4, M5)
    vo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, V0, V1, V2, V3, V4, V5)
    xv = tl.load(x + xo, mask=mask).to(CT)
    gv = tl.load(g + go, mask=mask).to(CT)
    mv = tl.load(m + mo, mask=mask).to(CT)
    vv = tl.load(v + vo, mask=mask).to(CT)
    eta = _scalar(eta_hi, eta_lo, CT)
    b1 = _scalar(b1_hi, b1_lo, CT)
    b2 = _scalar(b2_hi, b2_lo, CT)
    eps = _scalar(eps_hi, eps_lo, CT)
    bc1 = _scalar(bc1_hi, bc1_lo, CT)  # 1 - beta1^t
    bc2 = _scalar(bc2_hi, bc2_lo, CT)  # 1 - beta2^t
    mv = b1 * mv + (1 - b1) * gv
    vv = b2 * vv + (1 - b2) * gv * gv
    d = (mv / bc1) / (tl.sqrt(vv / bc2) + eps)
    if DECAY:  # AdamW, coupled: x - eta * (d + lambd * x)
        d = d + _scalar(lam_hi, lam_lo, CT) * xv
    _store(m, mo, mv, mask)
    _store(v, vo, vv, mask)
    _store(x, xo, xv - eta * d, mask)


# --- rmsprop ---------------------------------------------------------------------------------

@triton.jit
def _rmsprop_kernel(x, g, s, n, D1, D2, D3, D4, D5,
                    X0, X1, X2, X3, X4, X5, G0, G1, G2, G3, G4, G5,
                    S0, S1, S2, S3, S4, S5,
                    eta_hi, eta_lo, rho_hi, rho_lo, eps_hi, eps_lo,
                    CT: tl.constexpr, DENSE: tl.constexpr, BLOCK: tl.constexpr):
    lin = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = lin < n
    xo = _offsets(lin, DENSE, D1, D2, D3, D4, D5, X0, X1, X2, X3, X4, X5)
    go = _offsets(lin, DENSE, D1, D2, D3, D4, D5, G0, G1, G2, G3, G4, G5)
    so = _offsets(lin, DENSE, D1, D2, D3, D4, D5, S0, S1, S2, S3, S4, S5)
    xv = tl.load(x + xo, mask=mask).to(CT)
    gv = tl.load(g + go, mask=mask).to(CT)
    sv = tl.load(s + so, mask=mask).to(CT)
    eta = _scalar(eta_hi, eta_lo, CT)
    rho = _scalar(rho_hi, rho_lo, CT)
    eps = _scalar(eps_hi, eps_lo, CT)
    sv = rho * sv + (1 - rho) * gv * gv
    _store(s, so, sv, mask)
    _store(x, xo, xv - eta * gv / (tl.sqrt(sv) + eps), mask)


# --- host side -------------------------------------------------------------------------------

def _launch(kernel, rule, tensors, scalars, **meta):
    """Check ``tensors`` = ``(x, g, *states)``, then run ``kernel`` once over
    all elements with each tensor's strides and ``scalars`` as hi/lo pairs."""
    import torch
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
    mshape, strides = common.merge_dims(tuple(x.shape), *[tuple(t.stride()) for t in tensors])
    dense = all(mshape[:-1] == [1] * (common.MAX_DIMS - 1) and st[-1] == 1 for st in strides)
    args = [a for s in scalars for a in _split(s)]
    stride_args = [s for st in strides for s in st]
    block = common.block_for(n)
    common.launch(kernel, (common.cdiv(n, block),), *tensors, n, *mshape[1:], *stride_args, *args,
                  CT=common.compute_type(x.dtype), DENSE=dense, BLOCK=block, **meta)


def descent_update_forward(x, g, *, eta):
    _launch(_descent_kernel, "descent_update", (x, g), (eta,))


def momentum_update_forward(x, g, v, *, eta, rho):
    _launch(_momentum_kernel, "momentum_update", (x, g, v), (eta, rho), NESTEROV=False)


def nesterov_update_forward(x, g, v, *, eta, rho):
    _launch(_momentum_kernel, "nesterov_update", (x, g, v), (eta, rho), NESTEROV=True)


def _bias_corrections(beta1, beta2, step):
    step = _check_step(step)
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
