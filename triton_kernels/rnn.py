"""Recurrent family, Triton kernels (the math is in ``triflux.reference.rnn``).

A sequence costs a few launches, not L per gate:

forward   1. ``xp = x @ w_ih^T`` for every time step at once (the matmul
             family's GEMM, stored in the compute type);
          2. ONE launch for the whole time loop (``_forward_kernel``): each
             program owns BN batch rows and walks t = 0 .. L-1 inside the
             kernel, computing every gate of its rows per step (hidden units
             in chunks of BJ, the product h_{t-1} @ w_hh^T in chunks of BK,
             h_{t-1} read back from the hidden-state buffer it wrote at t-1;
             ``tl.debug_barrier()`` between steps makes its own stores visible);
          3. a cast to the output dtype for float16/bfloat16 (the recurrence
             keeps its states in float32).
backward  the forward recurrence again where the output was rounded
          (float16/bfloat16: the float32 states are needed), the GEMM for xp,
          then ONE launch walking t = L-1 .. 0 (``_backward_kernel``) that
          stores the gate gradients of every step in (N, L, G*H) buffers and
          finishes with dh0 (and dc0); then dx by a GEMM and dW_ih, dW_hh,
          db_ih, db_hh by ``_weight_sum_kernel`` (sums over batch and time).

Everything accumulates in float32 (float64 for float64); dots are ieee
float32 ``tl.dot`` or, for float64, sums of outer products.
"""
import torch
import triton
import triton.language as tl

from . import common
from .common import store_value
from .elementwise import _sigmoid
from .elementwise import _tanh as _series_tanh
from .matmul import _mm
from ..errors import DTypeError, ShapeError

_CELL_RNN, _CELL_LSTM, _CELL_GRU = 0, 1, 2
_GATES = {_CELL_RNN: 1, _CELL_LSTM: 4, _CELL_GRU: 3}


# --- device helpers ---------------------------------------------------------------------

@triton.jit
def _tanh(x, NT: tl.constexpr, INTERP: tl.constexpr):
    """tanh. On a GPU the elementwise family's (expm1 by a short series near 0,
    no ``log``: GPU ``log`` is approximate near 1). In the interpreter, which
    pays per operation inside the time loop, expm1(-2|x|) by Kahan's
    (u - 1) v / log(u), u = exp(v): a few operations, a few ulp with NumPy's
    exact ``log``."""
    if INTERP:
        v = -2.0 * tl.abs(x)
        u = tl.exp(v)
        um1 = u - 1.0
        lg = tl.log(tl.where(u == 1.0, 0.5, u))      # (no 0/0 where u == 1)
        m = tl.where(u == 1.0, v, tl.where(um1 == -1.0, -1.0, um1 * v / lg))
        t = -m / (2.0 + m)
        y = tl.where(x < 0, -t, t)
    else:
        y = _series_tanh(x, NT)
    return y


@triton.jit
def _dtanh(a):
    """tanh'(a) = 1 - tanh(a)^2 = 4 e / (1 + e)^2, e = exp(-2|a|): from the
    pre-activation, so no cancellation where tanh saturates (1 - y^2 from a
    rounded y loses ~u / (1 - y^2) relative)."""
    e = tl.exp(-2.0 * tl.abs(a))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _dot(a, b, F64: tl.constexpr):
    if F64:
        c = tl.sum(a.to(tl.float64)[:, :, None] * b.to(tl.float64)[None, :, :], axis=1)
    else:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return c


@triton.jit
def _hprev(hs, h0, rn, t, rk, N, L, H, W, sh0n, sh0k, COL: tl.constexpr):
    """(BN, BK) block of the previous state, columns rk: the state buffer's
    step t-1 (column offset COL*H: 0 for h, 1 for an LSTM's c), or h0/c0 at t = 0.

    Step conditions on the scalar t are branches, never parts of a load mask:
    Triton 3.9's interpreter rejects a mask that broadcasts a scalar
    comparison ("mask has unsupported dtype"), and a branch loads once."""
    m = (rn < N)[:, None] & (rk < H)[None, :]
    if t > 0:
        prev = tl.load(hs + rn[:, None] * L * W + (t - 1) * W + COL * H + rk[None, :], mask=m, other=0.0)
    else:
        prev = tl.load(h0 + rn[:, None] * sh0n + rk[None, :] * sh0k, mask=m, other=0.0).to(hs.dtype.element_ty)
    return prev


@triton.jit
def _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G: tl.constexpr,
            BN: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr, F64: tl.constexpr):
    """h_{t-1} @ w_hh[g*H + rj, :]^T for every gate g < G at once (each block
    of h_{t-1} loaded once for all gates); unused gates stay zero."""
    CT: tl.constexpr = hs.dtype.element_ty
    a0 = tl.zeros((BN, BJ), dtype=CT)
    a1 = tl.zeros((BN, BJ), dtype=CT)
    a2 = tl.zeros((BN, BJ), dtype=CT)
    a3 = tl.zeros((BN, BJ), dtype=CT)
    for k0 in range(0, H, BK):
        rk = k0 + tl.arange(0, BK)
        hp = _hprev(hs, h0, rn, t, rk, N, L, H, W, sh0n, sh0k, 0)
        wm = (rk < H)[:, None] & (rj < H)[None, :]
        wp = whh + rj[None, :] * swr + rk[:, None] * swk
        a0 += _dot(hp, tl.load(wp, mask=wm, other=0.0).to(CT), F64)
        if G > 1:
            a1 += _dot(hp, tl.load(wp + H * swr, mask=wm, other=0.0).to(CT), F64)
            a2 += _dot(hp, tl.load(wp + 2 * H * swr, mask=wm, other=0.0).to(CT), F64)
        if G > 3:
            a3 += _dot(hp, tl.load(wp + 3 * H * swr, mask=wm, other=0.0).to(CT), F64)
    return a0, a1, a2, a3


@triton.jit
def _pre(xp, rn, t, rj, g, N, L, H, GH, bih, sbi, bhh, sbh, WITH_BHH: tl.constexpr):
    """x_t @ w_ih[g]^T + b_ih[g] (+ b_hh[g]) for the block."""
    m = (rn < N)[:, None] & (rj < H)[None, :]
    a = tl.load(xp + rn[:, None] * L * GH + t * GH + g * H + rj[None, :], mask=m, other=0.0)
    a += tl.load(bih + (g * H + rj) * sbi, mask=rj < H, other=0.0).to(xp.dtype.element_ty)[None, :]
    if WITH_BHH:
        a += tl.load(bhh + (g * H + rj) * sbh, mask=rj < H, other=0.0).to(xp.dtype.element_ty)[None, :]
    return a


@triton.jit
def _bias(b, sb, g, rj, H, CT: tl.constexpr):
    return tl.load(b + (g * H + rj) * sb, mask=rj < H, other=0.0).to(CT)[None, :]


# --- forward ------------------------------------------------------------------------------

@triton.jit
def _forward_kernel(xp, h0, c0, whh, bih, bhh, hs, N, L, H,
                    sh0n, sh0k, sc0n, sc0k, swr, swk, sbi, sbh,
                    CELL: tl.constexpr, RELU: tl.constexpr, G: tl.constexpr,
                    BN: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr,
                    F64: tl.constexpr, NT: tl.constexpr, INTERP: tl.constexpr):
    """Every step of the recurrence for BN batch rows; states into ``hs``
    ((N, L, H), or (N, L, 2H) = [h, c] for the LSTM), compute type."""
    CT: tl.constexpr = hs.dtype.element_ty
    rn = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    GH = G * H
    W = H
    if CELL == 1:
        W = 2 * H
    for t in range(0, L):
        for j0 in range(0, H, BJ):
            rj = j0 + tl.arange(0, BJ)
            m = (rn < N)[:, None] & (rj < H)[None, :]
            out = hs + rn[:, None] * L * W + t * W + rj[None, :]
            if CELL == 0:
                h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                          BN, BJ, BK, F64)
                a = _pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True) \
                    + h0_
                if RELU:
                    h = tl.where(a < 0, 0.0, a)
                else:
                    h = _tanh(a, NT, INTERP)
                tl.store(out, h.to(CT), mask=m)
            elif CELL == 1:
                h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                          BN, BJ, BK, F64)
                ai = _pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True) \
                    + h0_
                af = _pre(xp, rn, t, rj, 1, N, L, H, GH, bih, sbi, bhh, sbh, True) \
                    + h1
                ag = _pre(xp, rn, t, rj, 2, N, L, H, GH, bih, sbi, bhh, sbh, True) \
                    + h2
                ao = _pre(xp, rn, t, rj, 3, N, L, H, GH, bih, sbi, bhh, sbh, True) \
                    + h3
                cp = _hprev(hs, c0, rn, t, rj, N, L, H, W, sc0n, sc0k, 1)
                c = _sigmoid(af) * cp + _sigmoid(ai) * _tanh(ag, NT, INTERP)
                h = _sigmoid(ao) * _tanh(c, NT, INTERP)
                tl.store(out, h.to(CT), mask=m)
                tl.store(out + H, c.to(CT), mask=m)
            else:
                h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                          BN, BJ, BK, F64)
                r = _sigmoid(_pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True)
                             + h0_)
                az = _pre(xp, rn, t, rj, 1, N, L, H, GH, bih, sbi, bhh, sbh, True) + h1
                hn = h2 \
                    + _bias(bhh, sbh, 2, rj, H, CT)
                nn = _tanh(_pre(xp, rn, t, rj, 2, N, L, H, GH, bih, sbi, bhh, sbh, False) + r * hn, NT, INTERP)
                hp = _hprev(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, 0)
                h = _sigmoid(-az) * nn + _sigmoid(az) * hp
                tl.store(out, h.to(CT), mask=m)
        tl.debug_barrier()


# --- backward -----------------------------------------------------------------------------

@triton.jit
def _dg_whh(dgh, rn, t, ok, rj, N, L, H, GH, whh, swr, swk,
            BN: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr, F64: tl.constexpr):
    """dAh_t @ w_hh for the block (BN, BJ): the gradient reaching h_{t-1}
    (zero unless ``ok``: there is no step t)."""
    acc = tl.zeros((BN, BJ), dtype=dgh.dtype.element_ty)
    if ok:                       # a branch, not a mask term (see _hprev)
        for k0 in range(0, GH, BK):
            rk = k0 + tl.arange(0, BK)
            d = tl.load(dgh + rn[:, None] * L * GH + t * GH + rk[None, :],
                        mask=(rn < N)[:, None] & (rk < GH)[None, :], other=0.0)
            w = tl.load(whh + rk[:, None] * swr + rj[None, :] * swk,
                        mask=(rk < GH)[:, None] & (rj < H)[None, :], other=0.0)
            acc += _dot(d, w.to(dgh.dtype.element_ty), F64)
    return acc


@triton.jit
def _backward_kernel(xp, h0, c0, whh, bih, bhh, hs, grad, dgi, dgh, carry, dh0, dc0, N, L, H,
                     sh0n, sh0k, sc0n, sc0k, swr, swk, sbi, sbh, sgn, sgt, sgk,
                     CELL: tl.constexpr, RELU: tl.constexpr, G: tl.constexpr,
                     BN: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr,
                     F64: tl.constexpr, NT: tl.constexpr, INTERP: tl.constexpr):
    """BPTT for BN batch rows: gate gradients of every step into ``dgi`` (input
    side) and ``dgh`` (hidden side; the same buffer except for the GRU),
    ``carry`` (N, H) holds the elementwise path to the previous step (LSTM:
    dc_t * f_t, GRU: dh_t * z_t); at the end dh0 (and dc0)."""
    CT: tl.constexpr = hs.dtype.element_ty
    rn = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    GH = G * H
    W = H
    if CELL == 1:
        W = 2 * H
    for tt in range(0, L):
        t = L - 1 - tt
        for j0 in range(0, H, BJ):
            rj = j0 + tl.arange(0, BJ)
            m = (rn < N)[:, None] & (rj < H)[None, :]
            gptr = grad + rn[:, None] * sgn + t * sgt + rj[None, :] * sgk
            dh = tl.load(gptr, mask=m, other=0.0).to(CT)
            dh += _dg_whh(dgh, rn, t + 1, t < L - 1, rj, N, L, H, GH, whh, swr, swk, BN, BJ, BK, F64)
            cptr = carry + rn[:, None] * H + rj[None, :]
            cin = tl.zeros((BN, BJ), dtype=carry.dtype.element_ty)
            if t < L - 1:            # the carry from step t+1 (a branch: see _hprev)
                cin = tl.load(cptr, mask=m, other=0.0)
            di = dgi + rn[:, None] * L * GH + t * GH + rj[None, :]
            dhh = dgh + rn[:, None] * L * GH + t * GH + rj[None, :]
            if CELL == 0:
                if RELU:
                    hcur = tl.load(hs + rn[:, None] * L * W + t * W + rj[None, :], mask=m, other=0.0)
                    da = tl.where(hcur > 0, dh, 0.0)
                else:
                    h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                              BN, BJ, BK, F64)
                    da = dh * _dtanh(_pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True) + h0_)
                tl.store(di, da, mask=m)
            elif CELL == 1:
                h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                          BN, BJ, BK, F64)
                # derivatives without cancellation: s (1 - s) = s sigmoid(-a), 1 - tanh^2 by _dtanh
                ai = _pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True) + h0_
                af = _pre(xp, rn, t, rj, 1, N, L, H, GH, bih, sbi, bhh, sbh, True) + h1
                ag = _pre(xp, rn, t, rj, 2, N, L, H, GH, bih, sbi, bhh, sbh, True) + h2
                ao = _pre(xp, rn, t, rj, 3, N, L, H, GH, bih, sbi, bhh, sbh, True) + h3
                i = _sigmoid(ai)
                f = _sigmoid(af)
                g = _tanh(ag, NT, INTERP)
                o = _sigmoid(ao)
                c = tl.load(hs + rn[:, None] * L * W + t * W + H + rj[None, :], mask=m, other=0.0)
                cp = _hprev(hs, c0, rn, t, rj, N, L, H, W, sc0n, sc0k, 1)
                tc = _tanh(c, NT, INTERP)
                gc = tl.load(gptr + H * sgk, mask=m, other=0.0).to(CT)
                dc = gc + cin + dh * o * _dtanh(c)
                tl.store(di, dc * g * i * _sigmoid(-ai), mask=m)
                tl.store(di + H, dc * cp * f * _sigmoid(-af), mask=m)
                tl.store(di + 2 * H, dc * i * _dtanh(ag), mask=m)
                tl.store(di + 3 * H, dh * tc * o * _sigmoid(-ao), mask=m)
                tl.store(cptr, dc * f, mask=m)
            else:
                h0_, h1, h2, h3 = _hh_all(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, whh, swr, swk, G,
                                          BN, BJ, BK, F64)
                dh += cin
                ar = _pre(xp, rn, t, rj, 0, N, L, H, GH, bih, sbi, bhh, sbh, True) + h0_
                az = _pre(xp, rn, t, rj, 1, N, L, H, GH, bih, sbi, bhh, sbh, True) + h1
                r = _sigmoid(ar)
                z = _sigmoid(az)
                omz = _sigmoid(-az)        # 1 - z without cancellation
                hn = h2 \
                    + _bias(bhh, sbh, 2, rj, H, CT)
                an = _pre(xp, rn, t, rj, 2, N, L, H, GH, bih, sbi, bhh, sbh, False) + r * hn
                nn = _tanh(an, NT, INTERP)
                hp = _hprev(hs, h0, rn, t, rj, N, L, H, W, sh0n, sh0k, 0)
                dn = dh * omz * _dtanh(an)
                dr = dn * hn * r * _sigmoid(-ar)
                dz = dh * (hp - nn) * z * omz
                tl.store(di, dr, mask=m)
                tl.store(di + H, dz, mask=m)
                tl.store(di + 2 * H, dn, mask=m)
                tl.store(dhh, dr, mask=m)
                tl.store(dhh + H, dz, mask=m)
                tl.store(dhh + 2 * H, dn * r, mask=m)
                tl.store(cptr, dh * z, mask=m)
        tl.debug_barrier()
    # the gradients of the initial state
    for j0 in range(0, H, BJ):
        rj = j0 + tl.arange(0, BJ)
        m = (rn < N)[:, None] & (rj < H)[None, :]
        d = _dg_whh(dgh, rn, 0, L > 0, rj, N, L, H, GH, whh, swr, swk, BN, BJ, BK, F64)
        cin = tl.load(carry + rn[:, None] * H + rj[None, :], mask=m, other=0.0)
        if CELL == 2:
            d += cin
        tl.store(dh0 + rn[:, None] * H + rj[None, :], store_value(d, dh0.dtype.element_ty, INTERP), mask=m)
        if CELL == 1:
            tl.store(dc0 + rn[:, None] * H + rj[None, :], store_value(cin, dc0.dtype.element_ty, INTERP),
                     mask=m)


@triton.jit
def _weight_sum_kernel(a, b, b0, out, R, C, M, L,
                       sbn, sbt, sbc, sb0n, sb0c, sor, soc,
                       SHIFT: tl.constexpr, ONES: tl.constexpr, F64: tl.constexpr,
                       BR: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, INTERP: tl.constexpr):
    """out[r, c] = sum over rows m = (n, t) of a[m, r] * b[n, t, c] (a dense
    (N*L, R)). SHIFT: b's row is step t-1, and b0[n] at t = 0 (h_{t-1}).
    ONES: out[r, 0] = sum_m a[m, r] (the bias gradients)."""
    CT: tl.constexpr = a.dtype.element_ty
    rr = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rc = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC)
    acc = tl.zeros((BR, BC), dtype=CT)
    for m0 in range(0, M, BM):
        rm = m0 + tl.arange(0, BM).to(tl.int64)
        mm = rm < M
        av = tl.load(a + rm[None, :] * R + rr[:, None], mask=(rr < R)[:, None] & mm[None, :], other=0.0)
        if ONES:
            acc += tl.sum(av, axis=1)[:, None]
        else:
            n = rm // L
            t = rm % L
            bm = mm[:, None] & (rc < C)[None, :]
            if SHIFT:
                bv = tl.load(b + n[:, None] * sbn + (t - 1)[:, None] * sbt + rc[None, :] * sbc,
                             mask=bm & (t > 0)[:, None], other=0.0).to(CT)
                bv += tl.load(b0 + n[:, None] * sb0n + rc[None, :] * sb0c,
                              mask=bm & (t == 0)[:, None], other=0.0).to(CT)
            else:
                bv = tl.load(b + n[:, None] * sbn + t[:, None] * sbt + rc[None, :] * sbc,
                             mask=bm, other=0.0).to(CT)
            acc += _dot(av, bv, F64)
    tl.store(out + rr[:, None] * sor + rc[None, :] * soc, store_value(acc, out.dtype.element_ty, INTERP),
             mask=(rr < R)[:, None] & (rc < C)[None, :])


# --- host side ------------------------------------------------------------------------------

def _ct(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(n, h, f64):
    p2 = common.next_pow2
    if common.INTERPRET:
        return min(p2(n), 64), min(p2(h), 64), min(p2(h), 64)
    if f64:
        return 16, 16, 16
    return 16, max(16, min(p2(h), 64)), max(16, min(p2(h), 32))


def _check(name, cell, x, h0, w_ih, w_hh, b_ih, b_hh, c0=None):
    g = _GATES[cell]
    tensors = (x, h0, w_ih, w_hh, b_ih, b_hh) + (() if c0 is None else (c0,))
    dts = {t.dtype for t in tensors}
    if len(dts) != 1 or not x.dtype.is_floating_point:
        raise DTypeError(f"{name}: every input must have one floating dtype, got "
                         f"{', '.join(sorted(str(d) for d in dts))}; convert with `f32(...)` first")
    if x.dim() != 3:
        raise ShapeError(f"{name}: x must have shape (N, L, in), got {tuple(x.shape)}")
    if w_hh.dim() != 2 or w_hh.shape[0] != g * w_hh.shape[1]:
        raise ShapeError(f"{name}: w_hh must have shape ({g}*H, H), got {tuple(w_hh.shape)}")
    n, _, i = x.shape
    h = w_hh.shape[1]
    want = [("h0", h0, (n, h)), ("w_ih", w_ih, (g * h, i)), ("b_ih", b_ih, (g * h,)),
            ("b_hh", b_hh, (g * h,))]
    if c0 is not None:
        want.append(("c0", c0, (n, h)))
    for k, v, shape in want:
        if tuple(v.shape) != shape:
            raise ShapeError(f"{name}: {k} must have shape {shape} for x of shape {tuple(x.shape)} "
                             f"and hidden size {h}, got {tuple(v.shape)}")
    return h


def _states(cell, x, h0, c0, w_ih, w_hh, b_ih, b_hh, relu, xp=None):
    """(hs, xp): every state in the compute type ((N, L, H), LSTM (N, L, 2H)) and
    the input projections (N, L, G*H)."""
    n, length, _ = x.shape
    h = w_hh.shape[1]
    ct = _ct(x.dtype)
    width = 2 * h if cell == _CELL_LSTM else h
    hs = common.empty((n, length, width), ct, x.device)
    if xp is None:
        xp = _mm(x, w_ih.transpose(0, 1), out_dtype=ct)
    f64 = ct == torch.float64
    bn, bj, bk = _blocks(n, h, f64)
    c0_ = h0 if c0 is None else c0
    common.launch(_forward_kernel, (common.cdiv(n, bn),), xp, h0, c0_, w_hh, b_ih, b_hh, hs, n, length, h,
                  h0.stride(0), h0.stride(1), c0_.stride(0), c0_.stride(1), w_hh.stride(0), w_hh.stride(1),
                  b_ih.stride(0), b_hh.stride(0),
                  CELL=cell, RELU=relu, G=_GATES[cell], BN=bn, BJ=bj, BK=bk, F64=f64,
                  NT=17 if f64 else 9, INTERP=common.INTERPRET)
    return hs, xp


def _forward(name, cell, x, h0, c0, w_ih, w_hh, b_ih, b_hh, relu=False):
    h = _check(name, cell, x, h0, w_ih, w_hh, b_ih, b_hh, c0)
    n, length, _ = x.shape
    width = 2 * h if cell == _CELL_LSTM else h
    if n * length * h == 0:
        return common.empty((n, length, width), x.dtype, x.device)
    hs, _ = _states(cell, x, h0, c0, w_ih, w_hh, b_ih, b_hh, relu)
    return common.cast(hs, x.dtype)


def _weight_sum(a, b, b0, out_shape, dtype, shift=False, ones=False):
    """The (R, C) sum over (n, t) of a[n, t, :]^T b[n, t, :] (see the kernel)."""
    n, length, r = a.shape
    c = 1 if ones else out_shape[-1]
    out = common.empty(out_shape, dtype, a.device)
    if out.numel() == 0:
        return out
    m = n * length
    if m == 0:
        return common.full(out_shape, 0.0, dtype, a.device)
    f64 = a.dtype == torch.float64
    p2 = common.next_pow2
    if common.INTERPRET:
        br, bc, bm = min(p2(r), 128), min(p2(c), 128), min(p2(m), 256)
    elif f64:
        br, bc, bm = 16, 16, 16
    else:
        br, bc, bm = 32, 32, 32
    o2 = out.view(r, c)
    bs = (0, 0, 0) if ones else tuple(b.stride())
    b0s = (0, 0) if b0 is None else tuple(b0.stride())
    common.launch(_weight_sum_kernel, (common.cdiv(r, br), common.cdiv(c, bc)), a, a if ones else b,
                  a if b0 is None else b0, o2, r, c, m, length, *bs, *b0s, o2.stride(0), o2.stride(1),
                  SHIFT=shift, ONES=ones, F64=f64, BR=br, BC=bc, BM=bm, INTERP=common.INTERPRET)
    return out


def _backward(name, cell, grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh, relu=False):
    h = _check(name, cell, x, h0, w_ih, w_hh, b_ih, b_hh, c0)
    n, length, i = x.shape
    g = _GATES[cell]
    dev, dt = x.device, x.dtype

    def zeros(t):
        return common.full(tuple(t.shape), 0.0, t.dtype, dev)

    if n * length * h == 0:
        gs = [zeros(x), zeros(h0)] + ([] if c0 is None else [zeros(c0)]) + \
             [zeros(w_ih), zeros(w_hh), zeros(b_ih), zeros(b_hh)]
        return tuple(gs)
    ct = _ct(dt)
    xp = _mm(x, w_ih.transpose(0, 1), out_dtype=ct)
    if out.dtype == ct:
        hs = common.contiguous(out)
    else:   # the output was rounded: recompute the states in the compute type
        hs, _ = _states(cell, x, h0, c0, w_ih, w_hh, b_ih, b_hh, relu, xp=xp)
    dgi = common.empty((n, length, g * h), ct, dev)
    dgh = common.empty((n, length, g * h), ct, dev) if cell == _CELL_GRU else dgi
    carry = common.empty((n, h), ct, dev)
    dh0 = common.empty((n, h), h0.dtype, dev)
    dc0 = common.empty((n, h), c0.dtype, dev) if c0 is not None else dh0
    c0_ = h0 if c0 is None else c0
    f64 = ct == torch.float64
    bn, bj, bk = _blocks(n, h, f64)
    common.launch(_backward_kernel, (common.cdiv(n, bn),), xp, h0, c0_, w_hh, b_ih, b_hh, hs, grad,
                  dgi, dgh, carry, dh0, dc0, n, length, h,
                  h0.stride(0), h0.stride(1), c0_.stride(0), c0_.stride(1), w_hh.stride(0), w_hh.stride(1),
                  b_ih.stride(0), b_hh.stride(0), grad.stride(0), grad.stride(1), grad.stride(2),
                  CELL=cell, RELU=relu, G=g, BN=bn, BJ=bj, BK=bk, F64=f64, NT=17 if f64 else 9,
                  INTERP=common.INTERPRET)
    dx = _mm(dgi, common.cast(w_ih, ct), out_dtype=dt)
    dw_ih = _weight_sum(dgi, x, None, tuple(w_ih.shape), w_ih.dtype)
    hview = hs if cell != _CELL_LSTM else hs[:, :, :h]
    dw_hh = _weight_sum(dgh, hview, h0, tuple(w_hh.shape), w_hh.dtype, shift=True)
    db_ih = _weight_sum(dgi, None, None, tuple(b_ih.shape), b_ih.dtype, ones=True)
    db_hh = _weight_sum(dgh, None, None, tuple(b_hh.shape), b_hh.dtype, ones=True)
    gs = [dx, dh0] + ([] if c0 is None else [dc0]) + [dw_ih, dw_hh, db_ih, db_hh]
    return tuple(gs)


# --- the primitives -------------------------------------------------------------------------

def rnn_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """See ``reference.rnn.rnn_sequence_forward``: GEMM, then one launch for the time loop."""
    if activation not in ("tanh", "relu"):
        raise ValueError(f"rnn_sequence: activation must be 'tanh' or 'relu', got {activation!r}")
    return _forward("rnn_sequence", _CELL_RNN, x, h0, None, w_ih, w_hh, b_ih, b_hh, activation == "relu")


def rnn_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh, activation="tanh"):
    """See ``reference.rnn.rnn_sequence_backward``: one launch for BPTT, then GEMM/sums."""
    return _backward("rnn_sequence", _CELL_RNN, grad, out, x, h0, None, w_ih, w_hh, b_ih, b_hh,
                     activation == "relu")


def lstm_sequence_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.lstm_sequence_forward``; output [h_t, c_t] per step."""
    return _forward("lstm_sequence", _CELL_LSTM, x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def lstm_sequence_backward(grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.lstm_sequence_backward``."""
    return _backward("lstm_sequence", _CELL_LSTM, grad, out, x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def gru_sequence_forward(x, h0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.gru_sequence_forward``."""
    return _forward("gru_sequence", _CELL_GRU, x, h0, None, w_ih, w_hh, b_ih, b_hh)


def gru_sequence_backward(grad, out, x, h0, w_ih, w_hh, b_ih, b_hh):
    """See ``reference.rnn.gru_sequence_backward``."""
    return _backward("gru_sequence", _CELL_GRU, grad, out, x, h0, None, w_ih, w_hh, b_ih, b_hh)
