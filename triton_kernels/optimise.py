"""Optimiser updates on the device (mirrors ``reference/optimise.py``, where
the formulas are written out).

One launch per rule and dtype updates every parameter of that dtype, as
torch's foreach/fused optimisers do (``multi_tensor_apply``): a model with
dozens of parameters costs one launch, not dozens of mostly tiny ones.

How a launch finds its tensors. The host writes a small int64 table to the
device with one row per parameter: the first of the parameter's programs,
its element count, its sizes as :func:`indexing.nd_offset` reads them (a
contiguous parameter as one dimension), and for each of its tensors (``x``,
``g``, then the rule's states: the *roles*) the address and the strides.
A program finds its row by a binary search of the first programs, turns the
addresses into pointers of the parameters' dtype and updates its block of
``BLOCK_SIZE`` elements of that parameter in place: it reads ``x``, ``g``
and the states once, computes in float32 (float64 for float64 arrays) and
writes ``x`` and the states back. Parameters, gradients and states stay the
separate tensors they are, each addressed through its own strides, so a
transposed or strided view is updated where it lives. The cost: one table
per call, ``7 + 7 * roles`` int64 per parameter (18 KB for the 64
parameters of ``UNet(3, 2)`` with Adam), allocated and copied to the device
before the first launch, so a call that runs out of memory changes nothing.
A call with the parameters and states of the rule's last (a training loop's
next step) checks only its gradients and writes their addresses into the
rows it keeps; one with the very same tensor objects (a captured step's
gradients) reuses the last table.

Speed. When every parameter of a launch is dense (``DENSE``) the offset is
the linear index itself; when every address is also a multiple of 16 bytes
(``ALIGNED``) the kernel says so, and a block that lies wholly inside its
parameter is read and written without a mask, in 128-bit vectors, as a
kernel given the tensors as arguments would; the last block of each
parameter is masked.

The rejected alternative: the parameters as views of one flat buffer per
dtype, which one plain elementwise launch updates with no table. But the
gradients arrive as separate tensors, so every step would first gather them
into a flat buffer (one more read and write of every gradient, with a launch
per gradient or a multi-tensor gather anyway), and the model's parameters
would have to live inside the optimiser's buffer, which moving, loading or
casting a model (each replaces a Tensor's storage) would silently undo.

Hyperparameters reach the kernel as float32 arguments (Triton passes Python
floats as float32). For float64 arrays that would round ``eta = 1e-3`` to
float32, so each scalar travels as a pair ``hi + lo`` of float32 numbers whose
float64 sum is the value to ~1e-15; float32 kernels use ``hi`` alone. The
bias corrections ``1 - beta^t`` are computed here, in float64.
"""
import weakref

import numpy as np
import torch
import triton
import triton.language as tl

from triflux.errors import DeviceMismatchError, DTypeError, ShapeError
from triflux.specs.optimise import check_step

from . import indexing, launch, numerics
from .numerics import from_float32_pair

# --- the table: columns of a parameter's row ---------------------------------------------------
COLUMN_FIRST_PROGRAM = tl.constexpr(0)
COLUMN_N_ELEMENTS = tl.constexpr(1)
#: size1 .. size5 of nd_offset (size0 is implied by the element count)
COLUMN_SIZES = tl.constexpr(2)
#: one address per role, then each role's six strides
COLUMN_ADDRESSES = tl.constexpr(2 + indexing.MAX_DIMS - 1)
STRIDES_PER_ROLE = tl.constexpr(indexing.MAX_DIMS)

_TRITON_TYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
                 torch.float64: tl.float64}


@triton.jit
def _this_block(table_pointer, n_parameters, ROLES: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                BLOCK_SIZE: tl.constexpr):
    """This program's row of the table, the linear indices of its block,
    whether the block lies wholly inside the parameter, and the mask. The
    row is the last one whose first program is at most this program: a
    binary search of ``SEARCH_STEPS`` halvings (the rows are in program order,
    ``n_parameters < 2**SEARCH_STEPS``)."""
    program = tl.program_id(0)
    row_width = COLUMN_ADDRESSES + ROLES * (1 + STRIDES_PER_ROLE)
    found = 0
    for step in tl.static_range(SEARCH_STEPS):
        probe = found + (1 << (SEARCH_STEPS - 1 - step))
        first = tl.load(table_pointer + probe * row_width + COLUMN_FIRST_PROGRAM, mask=probe < n_parameters,
                        other=program + 1)
        found = tl.where(first <= program, probe, found)
    row = table_pointer + found * row_width
    start = (program - tl.load(row + COLUMN_FIRST_PROGRAM)) * BLOCK_SIZE
    n_elements = tl.load(row + COLUMN_N_ELEMENTS)
    index = start + tl.arange(0, BLOCK_SIZE)
    return row, index, start + BLOCK_SIZE <= n_elements, index < n_elements


@triton.jit
def _tensor(row, role, index, ROLES: tl.constexpr, DTYPE: tl.constexpr, DENSE: tl.constexpr,
            ALIGNED: tl.constexpr):
    """The pointer to the tensor of ``role`` (0 = x, 1 = g, then the states)
    and the element offsets of the linear ``index`` in it."""
    pointer = tl.load(row + COLUMN_ADDRESSES + role).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)
    if DENSE:
        offset = index
    else:
        sizes = row + COLUMN_SIZES
        strides = row + COLUMN_ADDRESSES + ROLES + role * STRIDES_PER_ROLE
        offset = indexing.nd_offset(index, tl.load(sizes), tl.load(sizes + 1), tl.load(sizes + 2),
                                    tl.load(sizes + 3), tl.load(sizes + 4), tl.load(strides),
                                    tl.load(strides + 1), tl.load(strides + 2), tl.load(strides + 3),
                                    tl.load(strides + 4), tl.load(strides + 5))
    return pointer, offset


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
def _descent_block(row, index, mask, eta, COMPUTE_TYPE: tl.constexpr, DTYPE: tl.constexpr,
                   DENSE: tl.constexpr, ALIGNED: tl.constexpr):
    x_pointer, x_offset = _tensor(row, 0, index, 2, DTYPE, DENSE, ALIGNED)
    grad_pointer, grad_offset = _tensor(row, 1, index, 2, DTYPE, DENSE, ALIGNED)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    _store(x_pointer, x_offset, x - eta * g, mask)


@triton.jit
def _descent_kernel(table_pointer, n_parameters, eta_hi, eta_lo,
                    DTYPE: tl.constexpr, COMPUTE_TYPE: tl.constexpr, DENSE: tl.constexpr,
                    ALIGNED: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row, index, whole, mask = _this_block(table_pointer, n_parameters, 2, SEARCH_STEPS, BLOCK_SIZE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    if whole:
        _descent_block(row, index, None, eta, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)
    else:
        _descent_block(row, index, mask, eta, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)


# --- momentum and nesterov -------------------------------------------------------------------

@triton.jit
def _momentum_block(row, index, mask, eta, rho, NESTEROV: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                    DTYPE: tl.constexpr, DENSE: tl.constexpr, ALIGNED: tl.constexpr):
    x_pointer, x_offset = _tensor(row, 0, index, 3, DTYPE, DENSE, ALIGNED)
    grad_pointer, grad_offset = _tensor(row, 1, index, 3, DTYPE, DENSE, ALIGNED)
    velocity_pointer, velocity_offset = _tensor(row, 2, index, 3, DTYPE, DENSE, ALIGNED)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    v = tl.load(velocity_pointer + velocity_offset, mask=mask).to(COMPUTE_TYPE)
    if NESTEROV:
        d = -(rho * rho) * v + (1 + rho) * eta * g  # uses the old velocity
        v = rho * v - eta * g
    else:
        v = rho * v + eta * g
        d = v
    _store(velocity_pointer, velocity_offset, v, mask)
    _store(x_pointer, x_offset, x - d, mask)


@triton.jit
def _momentum_kernel(table_pointer, n_parameters, eta_hi, eta_lo, rho_hi, rho_lo,
                     NESTEROV: tl.constexpr, DTYPE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                     DENSE: tl.constexpr, ALIGNED: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    row, index, whole, mask = _this_block(table_pointer, n_parameters, 3, SEARCH_STEPS, BLOCK_SIZE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    rho = from_float32_pair(rho_hi, rho_lo, COMPUTE_TYPE)
    if whole:
        _momentum_block(row, index, None, eta, rho, NESTEROV, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)
    else:
        _momentum_block(row, index, mask, eta, rho, NESTEROV, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)


# --- adam and adamw --------------------------------------------------------------------------

@triton.jit
def _adam_block(row, index, mask, eta, beta1, beta2, epsilon, correction1, correction2, lambd,
                DECAY: tl.constexpr, COMPUTE_TYPE: tl.constexpr, DTYPE: tl.constexpr,
                DENSE: tl.constexpr, ALIGNED: tl.constexpr):
    """``m`` and ``v`` are the first and second moments; ``correction1`` and
    ``correction2`` the bias corrections 1 - beta1^t and 1 - beta2^t."""
    x_pointer, x_offset = _tensor(row, 0, index, 4, DTYPE, DENSE, ALIGNED)
    grad_pointer, grad_offset = _tensor(row, 1, index, 4, DTYPE, DENSE, ALIGNED)
    m_pointer, m_offset = _tensor(row, 2, index, 4, DTYPE, DENSE, ALIGNED)
    v_pointer, v_offset = _tensor(row, 3, index, 4, DTYPE, DENSE, ALIGNED)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    m = tl.load(m_pointer + m_offset, mask=mask).to(COMPUTE_TYPE)
    v = tl.load(v_pointer + v_offset, mask=mask).to(COMPUTE_TYPE)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    d = (m / correction1) / (tl.sqrt(v / correction2) + epsilon)
    if DECAY:  # AdamW, coupled: x - eta * (d + lambd * x)
        d = d + lambd * x
    _store(m_pointer, m_offset, m, mask)
    _store(v_pointer, v_offset, v, mask)
    _store(x_pointer, x_offset, x - eta * d, mask)


@triton.jit
def _adam_kernel(table_pointer, n_parameters,
                 eta_hi, eta_lo, beta1_hi, beta1_lo, beta2_hi, beta2_lo, epsilon_hi, epsilon_lo,
                 correction1_hi, correction1_lo, correction2_hi, correction2_lo, lambd_hi, lambd_lo,
                 DECAY: tl.constexpr, DTYPE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                 DENSE: tl.constexpr, ALIGNED: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
    row, index, whole, mask = _this_block(table_pointer, n_parameters, 4, SEARCH_STEPS, BLOCK_SIZE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    beta1 = from_float32_pair(beta1_hi, beta1_lo, COMPUTE_TYPE)
    beta2 = from_float32_pair(beta2_hi, beta2_lo, COMPUTE_TYPE)
    epsilon = from_float32_pair(epsilon_hi, epsilon_lo, COMPUTE_TYPE)
    correction1 = from_float32_pair(correction1_hi, correction1_lo, COMPUTE_TYPE)
    correction2 = from_float32_pair(correction2_hi, correction2_lo, COMPUTE_TYPE)
    lambd = from_float32_pair(lambd_hi, lambd_lo, COMPUTE_TYPE)
    if whole:
        _adam_block(row, index, None, eta, beta1, beta2, epsilon, correction1, correction2, lambd,
                    DECAY, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)
    else:
        _adam_block(row, index, mask, eta, beta1, beta2, epsilon, correction1, correction2, lambd,
                    DECAY, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)


# --- rmsprop ---------------------------------------------------------------------------------

@triton.jit
def _rmsprop_block(row, index, mask, eta, rho, epsilon, COMPUTE_TYPE: tl.constexpr,
                   DTYPE: tl.constexpr, DENSE: tl.constexpr, ALIGNED: tl.constexpr):
    """``square`` is the running mean of g^2."""
    x_pointer, x_offset = _tensor(row, 0, index, 3, DTYPE, DENSE, ALIGNED)
    grad_pointer, grad_offset = _tensor(row, 1, index, 3, DTYPE, DENSE, ALIGNED)
    square_pointer, square_offset = _tensor(row, 2, index, 3, DTYPE, DENSE, ALIGNED)
    x = tl.load(x_pointer + x_offset, mask=mask).to(COMPUTE_TYPE)
    g = tl.load(grad_pointer + grad_offset, mask=mask).to(COMPUTE_TYPE)
    square = tl.load(square_pointer + square_offset, mask=mask).to(COMPUTE_TYPE)
    square = rho * square + (1 - rho) * g * g
    _store(square_pointer, square_offset, square, mask)
    _store(x_pointer, x_offset, x - eta * g / (tl.sqrt(square) + epsilon), mask)


@triton.jit
def _rmsprop_kernel(table_pointer, n_parameters, eta_hi, eta_lo, rho_hi, rho_lo,
                    epsilon_hi, epsilon_lo, DTYPE: tl.constexpr, COMPUTE_TYPE: tl.constexpr,
                    DENSE: tl.constexpr, ALIGNED: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr):
    row, index, whole, mask = _this_block(table_pointer, n_parameters, 3, SEARCH_STEPS, BLOCK_SIZE)
    eta = from_float32_pair(eta_hi, eta_lo, COMPUTE_TYPE)
    rho = from_float32_pair(rho_hi, rho_lo, COMPUTE_TYPE)
    epsilon = from_float32_pair(epsilon_hi, epsilon_lo, COMPUTE_TYPE)
    if whole:
        _rmsprop_block(row, index, None, eta, rho, epsilon, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)
    else:
        _rmsprop_block(row, index, mask, eta, rho, epsilon, COMPUTE_TYPE, DTYPE, DENSE, ALIGNED)


# --- host side -------------------------------------------------------------------------------

def _row(rule, tensors):
    """Check one parameter's ``tensors`` = ``(x, g, *states)``. Its row of the
    table (the first program left to :func:`_table`), whether its tensors are
    dense and whether their addresses are multiples of 16 bytes; None for a
    parameter without elements."""
    x = tensors[0]
    if x.dtype not in _TRITON_TYPES:
        raise DTypeError(f"{rule}: parameters must be floating point, got {x.dtype}")
    shape, dtype, gpu = x.shape, x.dtype, x.get_device()
    for name, t in zip(("gradient", "state", "state", "state"), tensors[1:]):
        if t.shape != shape:
            raise ShapeError(f"{rule}: the {name} has shape {tuple(t.shape)} but the "
                             f"parameter has shape {tuple(shape)}")
        if t.dtype != dtype:
            raise DTypeError(f"{rule}: the {name} is {t.dtype} but the parameter is {dtype}; "
                             "parameters, gradients and optimiser states share one dtype")
        if t.get_device() != gpu:
            raise DeviceMismatchError(f"{rule}: the {name} is on {t.device} but the parameter is on "
                                      f"{x.device}; move both to one device")
    n = x.numel()
    if n == 0:
        return None
    if all(t.is_contiguous() for t in tensors):     # read as one dimension
        sizes, strides, dense = (1, 1, 1, 1, n), (0, 0, 0, 0, 0, 1) * len(tensors), True
    else:
        for k, t in enumerate(tensors):
            if k != 1 and any(st == 0 and sd > 1 for st, sd in zip(t.stride(), t.shape)):
                raise ShapeError(f"{rule}: cannot update a broadcast (stride-0) view in place; "
                                 "make the parameter and its states dense arrays")
        merged, stride_sets = indexing.merge_dims(tuple(shape), *[tuple(t.stride()) for t in tensors])
        sizes, strides = merged[1:], [s for st in stride_sets for s in st]
        dense = all(indexing.dense_strides(merged, st) for st in stride_sets)
    addresses = [t.data_ptr() for t in tensors]
    # the columns in the order of COLUMN_FIRST_PROGRAM .. COLUMN_ADDRESSES, then the strides
    return [0, n, *sizes, *addresses, *strides], dense, not any(a % 16 for a in addresses)


#: in the interpreter a program costs about as much as this many lanes of its block
_INTERPRETER_PROGRAM_COST = 4096


def _block_size(counts):
    """Elements per program for parameters of ``counts`` elements: the GPU
    block of launch.block_for; in the interpreter, which pays per program and
    per lane, the power of two that makes programs x (cost + block) least."""
    if not launch.INTERPRET:
        return launch.block_for(max(counts))
    return min((1 << k for k in range(4, 17)),
               key=lambda block: sum(launch.cdiv(n, block) for n in counts) * (_INTERPRETER_PROGRAM_COST + block))


def _table(rows):
    """The launch for the parameters of ``rows`` (from :func:`_row`): its host
    table (the rows with their first programs, padded to 16 bytes), the
    program count and the block size."""
    rows = np.array(rows, np.int64)
    counts = rows[:, COLUMN_N_ELEMENTS.value]
    block = _block_size(counts.tolist())
    programs = (counts + block - 1) // block
    rows[:, COLUMN_FIRST_PROGRAM.value] = np.cumsum(programs) - programs
    host = np.zeros(rows.size + rows.size % 2, np.int64)
    host[:rows.size] = rows.ravel()
    return host, int(programs.sum()), block


def _launch_for_each(kernel, rule, roles, scalars, **meta):
    """Check ``roles`` = ``(xs, gs, *state lists)``, then update every
    parameter: one launch of ``kernel`` per dtype, ``scalars`` as hi/lo pairs.
    Every table is on the device before the first launch."""
    if any(len(tensors) != len(roles[0]) for tensors in roles):
        raise ValueError(f"{rule}: the lists of parameters, gradients and states differ in length: "
                         f"{[len(tensors) for tensors in roles]}")
    tables = _tables_for(rule, roles)
    if tables is None:
        return
    table, launches, _ = tables
    scalar_pairs = [half for s in scalars for half in numerics.float32_pair(s)]
    for dtype, begin, end, n_parameters, programs, dense, aligned, block in launches:
        launch.launch(kernel, (programs,), table[begin:end], n_parameters, *scalar_pairs,
                      DTYPE=_TRITON_TYPES[dtype], COMPUTE_TYPE=numerics.compute_type(dtype), DENSE=dense,
                      ALIGNED=dense and aligned, SEARCH_STEPS=n_parameters.bit_length(), BLOCK_SIZE=block,
                      **meta)


#: per rule, the layout of its last call (:class:`_Layout`)
_LAST_LAYOUT = {}


def _tables_for(rule, roles):
    """The device table and the launches (dtype, table rows, programs, ...)
    for the tensors of ``roles``; None when no parameter has elements.

    A training loop calls a rule with the same parameters and states every
    step and new gradients: the rule's last :class:`_Layout` keeps their rows,
    so such a call checks only the gradients and writes their addresses into
    the rows. A call with the very tensors of the last (a captured step's
    gradients) reuses its device table as it is."""
    static = [t for k, tensors in enumerate(roles) if k != 1 for t in tensors]
    layout = _LAST_LAYOUT.get(rule)
    if layout is None or not layout.holds(static, len(roles)):
        layout = _LAST_LAYOUT[rule] = _Layout(rule, roles, static)
        return layout.last
    return layout.tables(rule, roles)


class _Layout:
    """The table of one call of a rule (``template``), kept for the next
    calls with the same parameters and states (weakly: a dropped model frees
    its memory), and the tables of the last call (``last``)."""

    def __init__(self, rule, roles, static):
        self.ids = tuple(map(id, static))
        self.interpret = launch.INTERPRET       # (the block size depends on it)
        # a tensor of the rows freed: the layout is void (its id may be taken by a new tensor)
        self.void = False
        self.refs = [weakref.ref(t, self._void) for t in static]
        self.n_roles = len(roles)
        self.last = self.template = _build_tables(rule, roles)
        self.gradients = [weakref.ref(g) for g in roles[1]]
        self.groups = None
        xs = roles[0]
        # the gradients' rows can be refilled when every row reads its tensors as one dimension
        if self.last is not None and all(t.is_contiguous() for tensors in roles for t in tensors):
            self.shapes = [x.shape for x in xs]
            self.dtypes = [x.dtype for x in xs]
            self.device = xs[0].get_device()
            self.groups = _gradient_columns(xs, self.n_roles, self.last)

    def _void(self, ref):
        self.void = True

    def holds(self, static, n_roles):
        """Whether ``static`` are the very tensors of the rows: the same ids, none freed since."""
        return (not self.void and n_roles == self.n_roles and self.interpret == launch.INTERPRET
                and self.ids == tuple(map(id, static)))

    def tables(self, rule, roles):
        """The tables for the gradients ``roles[1]`` (the rest as before)."""
        gs = roles[1]
        if len(gs) == len(self.gradients) and all(ref() is g for ref, g in zip(self.gradients, gs)):
            return self.last
        addresses = self.groups is not None and self._gradient_addresses(gs)
        if not addresses:        # a gradient that is strided, or wrong: every row built and checked again
            self.last = _build_tables(rule, roles)
        else:
            self.last = _refilled(self.template, self.groups, addresses)
        self.gradients = [weakref.ref(g) for g in gs]
        return self.last

    def _gradient_addresses(self, gs):
        """Each gradient's address, when all of them are dense and fit their
        parameters as the rows expect; else None (the full build raises or
        copes)."""
        if len(gs) != len(self.shapes):
            return None
        out = []
        for g, shape, dtype in zip(gs, self.shapes, self.dtypes):
            if g.shape != shape or g.dtype != dtype or g.get_device() != self.device or not g.is_contiguous():
                return None
            out.append(g.data_ptr())
        return out


def _gradient_columns(xs, n_roles, tables):
    """Per launch of ``tables``: the positions of its gradients' addresses in
    its host table (a row is ``7 + 7 * roles`` int64, see :func:`_row`) and
    the parameters of its rows, in order."""
    _, launches, hosts = tables
    by_dtype = {}
    for i, x in enumerate(xs):
        if x.numel():
            by_dtype.setdefault(x.dtype, []).append(i)
    width, first = 7 + 7 * n_roles, COLUMN_ADDRESSES.value
    groups = []
    for (dtype, *_), host in zip(launches, hosts):
        members = by_dtype[dtype]
        addresses = host[:len(members) * width].reshape(len(members), width)[:, first:first + n_roles]
        aligned = not (np.delete(addresses, 1, axis=1) % 16).any()     # the parameters' and states'
        groups.append((np.arange(len(members)) * width + first + 1, members, aligned))
    return groups


def _refilled(tables, groups, addresses):
    """``tables`` with the gradients' addresses of ``addresses`` (one per
    parameter) written into the host tables, copied to a new device table."""
    table, launches, hosts = tables
    new_hosts, new_launches = [], []
    for (positions, members, aligned), host, entry in zip(groups, hosts, launches):
        host = host.copy()
        ptrs = [addresses[i] for i in members]
        host[positions] = ptrs
        aligned = aligned and not any(a % 16 for a in ptrs)
        new_hosts.append(host)
        new_launches.append(entry[:6] + (aligned,) + entry[7:])
    device_table = launch.empty(table.shape, torch.int64, table.device)
    device_table.copy_(torch.from_numpy(np.concatenate(new_hosts)))
    return device_table, new_launches, new_hosts


def _build_tables(rule, roles):
    """See :func:`_tables_for`: the checks of every parameter, then its table."""
    by_dtype = {}            # dtype: [rows, all dense, all aligned]
    first = None
    for tensors in zip(*roles):
        row = _row(rule, tensors)
        if row is None:
            continue
        x = tensors[0]
        if first is None:
            first = x
        elif x.get_device() != first.get_device():
            raise DeviceMismatchError(f"{rule}: the parameters are on {first.device} and {x.device}; "
                                      "one update runs on one device")
        group = by_dtype.setdefault(x.dtype, [[], True, True])
        group[0].append(row[0])
        group[1] &= row[1]
        group[2] &= row[2]
    if first is None:
        return None
    device = first.device
    if launch.INTERPRET and device.type != "cpu":
        raise DeviceMismatchError(f"{rule}: the Triton interpreter reaches the tensors through their "
                                  f"addresses, which must be CPU memory, not {device}")
    launches, hosts, start = [], [], 0
    for dtype, (rows, dense, aligned) in by_dtype.items():
        host, programs, block = _table(rows)
        launches.append((dtype, start, start + host.size, len(rows), programs, dense, aligned, block))
        hosts.append(host)
        start += host.size
    table = launch.empty((start,), torch.int64, device)
    table.copy_(torch.from_numpy(np.concatenate(hosts)))
    return table, launches, hosts


def _bias_corrections(beta1, beta2, step):
    step = check_step(step)
    return 1.0 - float(beta1) ** step, 1.0 - float(beta2) ** step


def descent_update_foreach(xs, gs, *, eta):
    _launch_for_each(_descent_kernel, "descent_update", (xs, gs), (eta,))


def momentum_update_foreach(xs, gs, vs, *, eta, rho):
    _launch_for_each(_momentum_kernel, "momentum_update", (xs, gs, vs), (eta, rho), NESTEROV=False)


def nesterov_update_foreach(xs, gs, vs, *, eta, rho):
    _launch_for_each(_momentum_kernel, "nesterov_update", (xs, gs, vs), (eta, rho), NESTEROV=True)


def adam_update_foreach(xs, gs, ms, vs, *, eta, beta1, beta2, epsilon, step):
    bc1, bc2 = _bias_corrections(beta1, beta2, step)
    _launch_for_each(_adam_kernel, "adam_update", (xs, gs, ms, vs),
                     (eta, beta1, beta2, epsilon, bc1, bc2, 0.0), DECAY=False)


def adamw_update_foreach(xs, gs, ms, vs, *, eta, beta1, beta2, epsilon, lambd, step):
    bc1, bc2 = _bias_corrections(beta1, beta2, step)
    _launch_for_each(_adam_kernel, "adamw_update", (xs, gs, ms, vs),
                     (eta, beta1, beta2, epsilon, bc1, bc2, lambd), DECAY=True)


def rmsprop_update_foreach(xs, gs, ss, *, eta, rho, epsilon):
    _launch_for_each(_rmsprop_kernel, "rmsprop_update", (xs, gs, ss), (eta, rho, epsilon))


# --- one parameter: the same launch for a list of one ------------------------------------------

def descent_update_forward(x, g, *, eta):
    descent_update_foreach([x], [g], eta=eta)


def momentum_update_forward(x, g, v, *, eta, rho):
    momentum_update_foreach([x], [g], [v], eta=eta, rho=rho)


def nesterov_update_forward(x, g, v, *, eta, rho):
    nesterov_update_foreach([x], [g], [v], eta=eta, rho=rho)


def adam_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, step):
    adam_update_foreach([x], [g], [m], [v], eta=eta, beta1=beta1, beta2=beta2, epsilon=epsilon, step=step)


def adamw_update_forward(x, g, m, v, *, eta, beta1, beta2, epsilon, lambd, step):
    adamw_update_foreach([x], [g], [m], [v], eta=eta, beta1=beta1, beta2=beta2, epsilon=epsilon,
                         lambd=lambd, step=step)


def rmsprop_update_forward(x, g, s, *, eta, rho, epsilon):
    rmsprop_update_foreach([x], [g], [s], eta=eta, rho=rho, epsilon=epsilon)
