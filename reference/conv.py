"""Convolutions of any spatial rank, NumPy reference (forward and backward).

Layout: batch-first, channels second. ``conv`` takes ``x`` of shape
(N, C, *s) with R = 1, 2 or 3 spatial sides s and a weight ``w`` of shape
(O, C/G, *k) (PyTorch's layout, G = ``groups``, k the R kernel sides); it is
a cross-correlation, as in torch (and Flux's CrossCor). With multi-indices
p (an output position), t (a kernel tap) in Z^R and the per-axis stride
``s``, dilation ``d`` (products elementwise):

    xp = x zero-padded by (lo_a, hi_a) on each spatial axis a
    y[n, o, p] = sum_{c in group(o), t} xp[n, c, p*s + t*d] * w[o, c - g(o)*C/G, t]

with output sides ``o_a = (s_a + lo_a + hi_a - d_a*(k_a - 1) - 1) // s_a + 1``;
output channel ``o`` sees the input channels of its group
``g(o) = o // (O/G)``. For R = 2, p = (p, q), t = (i, j) and the padding is
(top, bottom, left, right). Shapes and attributes are checked, and the output
shape derived, by the family's spec (``triflux.specs.conv``).

``conv_transpose`` is the adjoint (transpose) of ``conv`` with respect to
its input: its forward is conv's input gradient, its backward uses conv's
forward and conv's weight gradient. Nothing is computed twice.

One code path serves every rank, written over the R spatial axes (tuples
of R strides, R slices): the arrays keep their rank, so a 2-D call runs the
very NumPy operations of a 2-D-only code. Everything is im2col (a strided
view of the padded input, then one copy laid out as (channel, tap) rows by
position columns) followed by one ``matmul``, per group of samples (one
sample of a large volume, the whole batch of a small one); the input
gradient is one ``matmul`` followed by col2im, one slice-add per kernel tap
(prod(k) of them), never a loop over positions, or for stride 1 a forward
correlation of the output gradient with the turned kernel.

Stride 1 in 3 dimensions (a volumetric UNet's 3x3x3 convs) has a cheaper
form, the grid (:func:`_grid_plan`): with the input of each channel laid
out flat, one gap of zeros after each line serving as the padding on both
of its sides, every kernel tap is a constant offset, so the im2col matrix
is a strided view of that one flat row per channel, copied block by block
into cache-sized blocks (long contiguous runs) and multiplied there; the
grid's extra columns (the gaps) are computed and discarded. The weight
gradient of narrow layers then needs no im2col copy at all, one product per
tap on shifted columns. For a 3x3x3 kernel the im2col matrix is 27x the
input: on 8-channel 32^3 volumes the grid runs the forward 2.5x and the
weight gradient 2.4x faster than one whole im2col copy (one core). Layers of
16 or more output channels take the grid with the channels last
(:func:`_rows_conv`): the taps of the last two kernel axes side by side
(9x the input, not 27x), one product per tap of the first axis on rows
shifted in place, positions along the products' long side.

The groups are independent, so they run on all the threads at once
(``_threads``: copies and products alike); a fused layer's bias, activation
and activation derivative are applied group by group, while the group's
block is in cache.
How many samples a group holds depends on the thread count (each thread gets
a group), so sums over groups may round differently on machines with other
core counts. float16/bfloat16 compute in float32 and round once at the end;
float32 and float64 stay as they are.
"""
import functools
import itertools
import math
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..specs.conv import conv_bias_act_spec, conv_spec, conv_transpose_spec
from ._threads import in_parallel, thread_count
from ._activation import activate, through_activation
from ._util import in_compute_dtype



class _Scratch(threading.local):
    """Buffers reused by every group and every call (one set per thread, each
    of ``small`` to ``keep`` bytes): a fresh array of several MB costs a page
    fault per 4 KB each time it is first written, as much as the copies into
    it (small arrays come from memory malloc keeps, at no such cost)."""
    small, keep = 1 << 20, 64 << 20

    def array(self, name, shape, dtype):
        """A scratch array of ``shape`` (its contents are garbage), valid until
        the next request of ``name``."""
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size < self.small:
            return np.empty(shape, dtype)
        memory = self.__dict__.get(name)
        if memory is None or memory.size < size:
            memory = np.empty(size, np.uint8)
            if size <= self.keep:
                self.__dict__[name] = memory
        return memory[:size].view(dtype).reshape(shape)


_SCRATCH = _Scratch()
_ALL = slice(None)


def _spatial(rank):
    """The axes of the R spatial sides of an (N, C, *s) array."""
    return tuple(range(2, 2 + rank))


@functools.lru_cache(maxsize=256)
def _pad_plan(shape, padding):
    """For x of ``shape`` padded by ``padding``: the padded shape, the index
    tuples of the borders (zeroed) and of the interior (x)."""
    sides = shape[2:]
    lo, hi = padding[0::2], padding[1::2]
    borders = []
    for axis, (n, a) in enumerate(zip(sides, lo)):
        before = (_ALL,) * (2 + axis)
        borders += [before + (slice(0, a),), before + (slice(a + n, None),)]
    return (shape[:2] + tuple(n + a + b for n, a, b in zip(sides, lo, hi)), tuple(borders),
            (_ALL, _ALL) + tuple(slice(a, a + n) for a, n in zip(lo, sides)))


def _padded(x, padding):
    """x (N, C, *s) zero-padded by padding (lo, hi per spatial axis) (in
    scratch memory: valid until the next call)."""
    if not any(padding):
        return x
    shape, borders, interior = _pad_plan(x.shape, padding)
    xp = _SCRATCH.array("padded", shape, x.dtype)
    for border in borders:
        xp[border] = 0
    xp[interior] = x
    return xp


@functools.lru_cache(maxsize=256)
def _window_plan(spec, shape, strides):
    """The shape and strides of :func:`_windows`'s view of a padded input of
    ``shape`` and ``strides``, and the axis order (C, *k, S, *o) of im2col."""
    kernel, stride, dilation, out = spec.kernel_size, spec.stride, spec.dilation, spec.out_shape[2:]
    assert all((o - 1) * s + (k - 1) * d < n for o, s, k, d, n in zip(out, stride, kernel, dilation, shape[2:]))
    steps = strides[2:]
    R = len(kernel)
    return (shape[:2] + tuple(kernel) + tuple(out),
            strides[:2] + tuple(d * t for d, t in zip(dilation, steps)) + tuple(s * t for s, t in zip(stride, steps)),
            (1,) + tuple(range(2, 2 + R)) + (0,) + tuple(range(2 + R, 2 + 2 * R)))


def _windows(xp, spec):
    """im2col as a view: (N, C, *k, *o) with ``cols[n, c, t, p] = xp[n, c, p*s + t*d]``
    (t, p in Z^R), for the zero-padded input xp: a step along t_a is d_a
    positions of xp's axis a, along p_a s_a positions, so the view is xp's
    memory read with those strides (``as_strided``; it never reads past xp)."""
    shape, strides, _ = _window_plan(spec, xp.shape, xp.strides)
    return as_strided(xp, shape, strides, writeable=False)


#: the products run over groups of whole samples with at least this many output
#: positions: one sample of a large image, the whole batch of a small one. A group's
#: im2col matrix stays a few MB, and a deep layer with few positions still reads its
#: weights once per batch, not once per sample.
_GROUP_PIXELS = 2048


def _sample_groups(n, pixels):
    """Slices of consecutive samples (of ``n``), each with ``_GROUP_PIXELS`` or
    more output ``pixels`` (the last one fewer), and at least as many groups as
    the threads that run them (``_threads``) where there are enough samples."""
    per = min(max(1, -(-_GROUP_PIXELS // max(pixels, 1))), max(1, -(-n // thread_count())))
    return [slice(start, min(start + per, n)) for start in range(0, n, per)]


def _im2col(xp, spec):
    """The im2col matrices (G, Cg*prod(k), S*prod(o)) of a group of S samples
    of the padded input xp: rows (c, t) of group g, columns the output
    positions (n, p), so one matrix product serves all S samples. The copy
    into the scratch buffer is the one copy im2col makes; its inner axis runs
    along the last spatial axis."""
    view = _windows(xp, spec).transpose(_window_plan(spec, xp.shape, xp.strides)[2])
    cols = _SCRATCH.array("cols", view.shape, xp.dtype)           # (C, *k, S, *o)
    np.copyto(cols, view)
    return cols.reshape(spec.groups, view.shape[0] // spec.groups * math.prod(spec.kernel_size), -1)


def _batch_inside(g, groups):
    """g (S, O, *o) as (G, O/G, S*prod(o)), the layout of the im2col columns."""
    S, O = g.shape[:2]
    P = math.prod(g.shape[2:])
    return g.reshape(S, groups, O // groups, P).transpose(1, 2, 0, 3).reshape(groups, O // groups, S * P)


#: products of at most this many output channels (per group) run over column chunks of
#: about ``_CHUNK_VALUES`` im2col values (a power of two of columns, 64 or more). Measured
#: on one core here (OpenBLAS, float32), whole against chunked: 8 x 216 x 32768 (a 3-D
#: UNet's first level) 3.97 against 1.90 ms, 8 x 432 x 32768 10.6 against 4.8 ms,
#: 1.5-2.9x on every shape tried with 2-16 rows alone; with 24 and 32 rows the whole
#: product was 10-15% faster.
_NARROW, _CHUNK_VALUES = 16, 1 << 16
#: the fewest im2col values chunked: in a whole layer, forward and backward on two
#: threads, the chunks made a 2-D 16-channel 3x3 conv on 2 x 64x64 (2.4 MB of im2col
#: per thread) 12% slower, and the 3-D convs of 8 channels on 2 x 32^3 (28-56 MB)
#: 15-25% faster
_LONG = 1 << 22


def _product(wm, cols):
    """np.matmul(wm, cols) of (G, M, K) weights and (G, K, P) im2col columns,
    over column chunks for narrow products (``_NARROW``)."""
    K, P = cols.shape[1:]
    chunk = max(64, 1 << (max(_CHUNK_VALUES // max(K, 1), 1).bit_length() - 1))
    if wm.shape[1] > _NARROW or K * P < _LONG:
        return np.matmul(wm, cols)
    z = np.empty(wm.shape[:2] + (P,), np.result_type(wm, cols))
    for start in range(0, P, chunk):
        np.matmul(wm, cols[:, :, start: start + chunk], out=z[:, :, start: start + chunk])
    return z


#: the grid formulation (:func:`_grid_plan`) serves convolutions whose padded input has
#: at most this many positions per output position: the products on the grid's extra
#: columns are wasted. Measured on one core (float32, 3x3x3, pad 1, one sample), grid
#: against im2col: 8 -> 8 channels on 32^3 (1.2 positions per output) 2.0 against 5.5 ms,
#: 16 -> 8 4.4 against 16 ms, 16 -> 16 on 16^3 (1.42) 1.4 against 2.0 ms.
_GRID_WASTE = 1.5
#: the ranks the grid serves: 3-D, where the im2col matrix is 27x the input. A 2-D layer
#: (8 x 32 channels, 48x48, 3x3) took 0.91x of im2col's CPU time on one thread but 1.07x
#: of its time on two (each block's copy and product hand the GIL back and forth, where
#: im2col makes one copy and one product per group); a 1-D layer's im2col copy already
#: runs along the sequence (the grid took 1.08x of its time)
_GRID_RANKS = (3,)
#: the grid's im2col blocks hold about this many values (``_BLOCK_COLUMNS`` or more
#: columns): a block and its product stay in the core's cache. Measured on one core
#: (OpenBLAS, float32), 8 x 216 times 216 x B: 119 GFLOP/s for B = 256 and 512 (221 and
#: 442 KB), 31-39 for B = 1024-4096.
_BLOCK_VALUES, _BLOCK_COLUMNS = 1 << 16, 256
#: the im2col values of a narrow product's blocks copied and multiplied by one call each:
#: every call hands the GIL back and forth between the threads, and one block of a narrow
#: layer's product takes ~10 us. Measured on two cores, the forward of 8 -> 8 channels on
#: 2 x 32^3 took 4.3 ms with one block a call (4.8 on one thread), 3.1 ms with four (1 MB);
#: a 2-D layer of 32 channels (a block ~50 us) was about 10% slower with three
_GIL_VALUES = 1 << 18
#: the weight gradient's blocks of xg and gg on the grid hold about this many values:
#: measured on one core (float32, 3x3x3 on 32^3, one sample), 8 -> 8 channels 1.8 ms
#: against 3.5 for im2col blocks, 16 -> 8 3.5 against 7.1; with 16 -> 8, blocks of 8192
#: columns (940 KB) took twice as long as 4096
_TAP_VALUES = 96 << 10
#: the weight gradient of layers of at most this many output channels per group takes the
#: grid's products per tap (:func:`_grid_weight_grad`), wider ones one product over a
#: whole im2col matrix. Measured on one core (float32, 3x3x3, batch 2), per tap against
#: im2col: 16 -> 16 channels on 16^3 1.5 against 2.6 ms, 32 -> 32 on 8^3 0.76 against 1.13
#: and on 16^3 6.3 against 6.2; 64 -> 64 on 16^3 19.0 against 17.7, 32 -> 64 11.9 against 8.6
_TAP_CHANNELS = 32


@functools.lru_cache(maxsize=256)
def _grid_plan(spec, samples):
    """The grid formulation of a stride-1 conv over ``samples`` samples, or
    None where it does not serve (strides; ranks other than ``_GRID_RANKS``;
    a grid of more than ``_GRID_WASTE`` positions per output position).

    Lay the input of every channel out flat on a grid with a gap of
    g_a = max(lo_a, hi_a) zero positions after each line along every axis a,
    the samples one after another: position h of sample n at

        row(n, h) = front + n*L + sum_a h_a*step_a

    with the pitch pitch_a = s_a + g_a, step_a = prod(pitch[a+1:]),
    L = prod(pitch) positions per sample and ``front`` = sum_a lo_a*step_a
    zero positions before the first sample (and zeros after the last). A gap
    serves as the padding after one line and before the next: a read lo_a or
    fewer positions before a line lands in the previous line's gap, one hi_a
    or fewer past its end in its own (zero-padding each line on both sides
    would take lo_a + hi_a positions: a 3x3x3 kernel on 16^3 has 17^3
    positions here, not 18^3). Output position p of sample n sits at
    q = n*L + sum_a p_a*step_a, and with stride 1 tap t reads position
    p + t*d - lo of the input, the grid's row

        q + off(t),   off(t) = sum_a t_a*d_a*step_a

    a constant offset per tap, whatever q. So the im2col matrix of every grid
    column q is a strided view of the grid, cols[(c, t), q] = grid[c, q + off(t)],
    whose copy runs along q. The product computes every q < Q (the last
    output position's + 1) but those of the gap's lines along the first axis
    (:func:`_output_runs`): the columns of no output position in them (in
    the other gaps) are computed and discarded. The grid holds every row
    that a q < Q reads.

    Returns (pitch, steps, front, Q, the grid's length)."""
    R = spec.rank
    sides, out = spec.x_shape[2:], spec.out_shape[2:]
    if any(s != 1 for s in spec.stride) or R not in _GRID_RANKS or math.prod(out) == 0:
        return None
    pitch = tuple(n + max(lo, hi) for n, lo, hi in zip(sides, spec.padding_lo, spec.padding_hi))
    # an output line longer than the pitch (padding past the kernel's reach) would overlap the next
    if any(o > p for o, p in zip(out, pitch)) or math.prod(pitch) > _GRID_WASTE * math.prod(out):
        return None
    steps = tuple(math.prod(pitch[a + 1:]) for a in range(R))
    Q = (samples - 1) * math.prod(pitch) + sum((o - 1) * step for o, step in zip(out, steps)) + 1
    reach = sum((k - 1) * d * step for k, d, step in zip(spec.kernel_size, spec.dilation, steps))
    front = sum(lo * step for lo, step in zip(spec.padding_lo, steps))
    return pitch, steps, front, Q, max(front + samples * math.prod(pitch), Q + reach)


def _on_grid(a, plan, front, name, channels_last=False):
    """a (S, C, *s) laid out on the grid of ``plan`` (:func:`_grid_plan`),
    sample n's position h at row front + n*L + sum_a h_a*step_a: (C, rows),
    or (rows, C) ``channels_last``, zero at every other row (in scratch
    memory ``name``: valid until its next request)."""
    pitch, _, _, _, rows = plan
    S, C, R = a.shape[0], a.shape[1], len(pitch)
    end = front + S * math.prod(pitch)
    grid = _SCRATCH.array(name, (rows, C) if channels_last else (C, rows), a.dtype)
    flat = grid if channels_last else grid.T                          # (rows, C) either way
    flat[:front], flat[end:] = 0, 0
    lines = flat[front:end].reshape((S,) + pitch + (C,))
    for axis, n in enumerate(a.shape[2:]):                          # the gaps
        lines[(_ALL,) * (1 + axis) + (slice(n, None),)] = 0
    lines[(_ALL,) + tuple(slice(0, n) for n in a.shape[2:])] = a.transpose((0,) + _spatial(R) + (1,))
    return grid


def _tap_strides(spec, plan):
    """The grid's rows between taps along each kernel axis: d_a*step_a."""
    return tuple(d * step for d, step in zip(spec.dilation, plan[1]))


def _output_runs(plan, spec, samples):
    """The grid's columns [q0, q1) of each sample's lines along the first axis
    that hold output positions (:func:`_grid_plan`; the gap's lines after them
    left out), runs that meet joined."""
    pitch, steps, _, Q, _ = plan
    runs = []
    for n in range(samples):
        q0, q1 = n * math.prod(pitch), min(Q, n * math.prod(pitch) + spec.out_shape[2] * steps[0])
        if runs and runs[-1][1] == q0:
            runs[-1] = (runs[-1][0], q1)
        else:
            runs.append((q0, q1))
    return runs


def _grid_blocks(xg, spec, plan, samples, narrow=False):
    """The grid's im2col matrix in column blocks, several at a time: yields
    (q0, q1, cols), cols the (n, G, Cg*prod(k), b) blocks cols[j, (c, t), i]
    = xg[c, q0 + j*b + i + off(t)] of n*b = q1 - q0 columns
    (:func:`_grid_plan`), copied into scratch memory (valid until the next
    yield), over the columns of output lines (:func:`_output_runs`). A block
    of b columns holds about ``_BLOCK_VALUES`` values; for ``narrow``
    products (``_NARROW`` rows or fewer), up to ``_GIL_VALUES`` values of
    them are copied by one call and multiplied by one."""
    Q = plan[3]
    C = xg.shape[0]
    kernel = tuple(spec.kernel_size)
    item = xg.itemsize
    rows = C * math.prod(kernel)
    width = min(max(_BLOCK_COLUMNS, _BLOCK_VALUES // rows), Q)
    per = max(1, _GIL_VALUES // (rows * width)) if narrow else 1
    taps = (xg.strides[0],) + tuple(s * item for s in _tap_strides(spec, plan))
    memory = _SCRATCH.array("cols", (rows * width * per,), xg.dtype)
    # view[c, t, q] = xg[c, q + off(t)]
    view = as_strided(xg, (C,) + kernel + (Q,), taps + (item,), writeable=False)
    order = tuple(range(1, 2 + len(kernel))) + (0, 2 + len(kernel))          # (n, C, *k, b) as (C, *k, n, b)
    for start, stop in _output_runs(plan, spec, samples):
        whole = (stop - start) // width if per > 1 else 0
        # blocks[c, t, j, i] = xg[c, start + j*width + i + off(t)]: the whole blocks, per at a time
        blocks = as_strided(view[..., start:], (C,) + kernel + (whole, width), taps + (width * item, item),
                            writeable=False)
        for j0 in range(0, whole, per):
            n = min(per, whole - j0)
            cols = memory[:rows * width * n].reshape((n, C) + kernel + (width,))
            np.copyto(cols.transpose(order), blocks[..., j0:j0 + n, :])
            yield start + j0 * width, start + (j0 + n) * width, cols.reshape(n, spec.groups, rows // spec.groups,
                                                                               width)
        for q0 in range(start + whole * width, stop, width):        # one block at a time (the last one narrower)
            q1 = min(stop, q0 + width)
            cols = memory[:rows * (q1 - q0)].reshape((C,) + kernel + (q1 - q0,))
            np.copyto(cols, view[..., q0:q1])
            yield q0, q1, cols.reshape(1, spec.groups, rows // spec.groups, q1 - q0)


def _off_grid(yg, S, plan, spec):
    """The output (S, O, *o) from its grid layout yg (O, S*L) (a view)."""
    pitch = plan[0]
    y = yg.reshape((-1, S) + pitch)[(_ALL, _ALL) + tuple(slice(0, o) for o in spec.out_shape[2:])]
    return y.transpose((1, 0) + _spatial(len(pitch)))


def _grid_conv(x, wm, spec, plan):
    """The forward formula for a group of samples x (S, C, *s) on the grid
    (:func:`_grid_plan`): per column block, y[g, o, q] = sum_{(c, t)}
    w[g, o, (c, t)] * cols[g, (c, t), q]. Returns the output (S, O, *o) as a
    view of the grid's output (O, S*L) (scratch memory)."""
    pitch, _, front, Q, _ = plan
    S = x.shape[0]
    G, M = wm.shape[:2]
    yg = _SCRATCH.array("grid_out", (G, M, S * math.prod(pitch)), x.dtype)
    for q0, q1, cols in _grid_blocks(_on_grid(x, plan, front, "padded"), spec, plan, S, M <= _NARROW):
        n, width = cols.shape[0], cols.shape[-1]
        if n == 1:
            np.matmul(wm, cols[0], out=yg[:, :, q0:q1])
        else:                                                     # n blocks by one call
            np.matmul(wm, cols, out=yg[:, :, q0:q1].reshape(G, M, n, width).transpose(2, 0, 1, 3))
    return _off_grid(yg.reshape(G * M, -1), S, plan, spec)


#: convolutions on the grid of one group with at least this many output channels take
#: it with the channels last (:func:`_rows_conv`). Measured on one core (float32, 3x3x3,
#: pad 1, batch 2), forward, against the channels-first grid's blocks: 16 -> 16 channels on
#: 16^3 1.96 against 2.60 ms, 32 -> 32 5.4 against 6.7, 8 -> 16 on 32^3 8.3 against 9.6,
#: 32 -> 32 on 8^3 0.73 against 0.99; with 8 output channels the product (positions by 8)
#: runs at about half the rate of the blocks' (8 by positions): 8 -> 8 on 32^3 6.8 against
#: 4.1 ms, 16 -> 8 13.3 against 8.0
_WIDE = 16
#: the row-tap matrix of :func:`_rows_conv` is copied and multiplied in chunks of about
#: this many values (whole lines along the first axis, at least one): a chunk stays in the
#: core's cache (2 MB here) through its products. Measured on one core (float32, 3x3x3 on
#: batch 2), chunks of 2^17, 2^19 and 2^21 values: 32 -> 32 channels on 16^3 8.1, 6.3 and
#: 6.5 ms, 8 -> 16 on 32^3 11.9, 9.2 and 10.8 ms
_ROWS_VALUES = 1 << 19


def _row_taps(x, spec, plan):
    """The row-tap matrix of a group of samples x (S, C, *s) on the grid
    (:func:`_grid_plan`) laid out with the channels last, grid[r, c]: with
    the first kernel axis apart, t = (t_0, u), the taps u of the other axes
    side by side,

        X[r, (u, c)] = grid[r + sum_{a>0} u_a*d_a*step_a, c]

    (a copy in runs of the last kernel axis's taps' channels, k_{R-1}*C
    values with dilation 1), so that tap t of output position q reads
    X[q + t_0*d_0*step_0, (u, c)]. Yields (q0, q1, X), X holding the rows
    q0 ... q1 + lead - 1 (``lead`` = (k_0 - 1)*d_0*step_0, the rows the taps
    along the first axis span), in chunks of whole lines along the first axis
    over the columns of output lines (:func:`_output_runs`) of about
    ``_ROWS_VALUES`` values: a chunk stays in cache through its products, and
    the next chunk's X takes over its last ``lead`` rows (moved, not copied
    from the grid again). X is scratch memory, valid until the next yield."""
    pitch, steps, front, Q, _ = plan
    S, C = x.shape[:2]
    kernel, shifts = tuple(spec.kernel_size), _tap_strides(spec, plan)
    lead = (kernel[0] - 1) * shifts[0]
    grid = _on_grid(x, plan, front, "rows", channels_last=True)
    item = grid.itemsize
    taps = as_strided(grid, (Q + lead,) + kernel[1:] + (C,),
                      (C * item,) + tuple(s * C * item for s in shifts[1:]) + (item,),
                      writeable=False)                                    # taps[r, u, c] = X[r, (u, c)]
    K = C * math.prod(kernel[1:])
    chunk = min(max(1, _ROWS_VALUES // K // steps[0]) * steps[0], Q)
    X = _SCRATCH.array("cols", (chunk + lead, K), x.dtype)
    done = kept = None                    # the end of the last chunk, its X's rows after it
    for start, stop in _output_runs(plan, spec, S):
        for q0 in range(start, stop, chunk):
            q1 = min(stop, q0 + chunk)
            reuse = lead if q0 == done else 0
            if reuse:
                X[:reuse] = X[kept:kept + reuse]
            np.copyto(X[reuse:q1 - q0 + lead].reshape(taps[q0 + reuse:q1 + lead].shape), taps[q0 + reuse:q1 + lead])
            yield q0, q1, X
            done, kept = q1, q1 - q0


def _rows_conv(x, w, spec, plan, y, finish):
    """The forward formula for a group of samples x (S, C, *s) on the grid
    (:func:`_grid_plan`) with the channels last, into y (S, O, *o): for each
    chunk of the row-tap matrix X (:func:`_row_taps`) and each tap t_0 of the
    first kernel axis a product over its rows shifted by t_0*d_0*step_0, read
    in place,

        Y[q, o] = sum_{t_0} sum_{(u, c)} X[q + t_0*d_0*step_0, (u, c)] * w[o, c, t_0, u]

    Positions run along the products' long side and (u, c) along their inner
    one, the shape OpenBLAS multiplies fastest (positions by 288 by 32: 110-120
    GFLOP/s on one core, against 60-80 with the positions along the columns).
    Each chunk's output lines go into y by ``finish(z, out)`` (z a view
    (S', O, lines, ...) of Y, out the same part of y) while they are in cache."""
    pitch, steps = plan[:2]
    R, O, kernel, out = len(pitch), w.shape[0], w.shape[2:], spec.out_shape[2:]
    shift, line = _tap_strides(spec, plan)[0], steps[0]
    # w as (t_0, (u, c), o)
    wt = np.ascontiguousarray(w.transpose(tuple(range(2, 2 + R)) + (1, 0))).reshape(kernel[0], -1, O)
    Y = _SCRATCH.array("rows_out", (x.shape[0] * math.prod(pitch), O), x.dtype)   # the gaps: not computed
    lines = Y.reshape((-1, line, O))
    part = None
    crop = (_ALL,) + tuple(slice(0, o) for o in out[1:]) + (_ALL,)
    for q0, q1, X in _row_taps(x, spec, plan):
        n = q1 - q0
        np.matmul(X[:n], wt[0], out=Y[q0:q1])
        for t0 in range(1, kernel[0]):
            if part is None or len(part) < n:
                part = _SCRATCH.array("rows_part", (len(X), O), x.dtype)
            np.matmul(X[t0 * shift:t0 * shift + n], wt[t0], out=part[:n])
            Y[q0:q1] += part[:n]
        # the chunk's lines, cropped to the output positions, sample by sample into y
        first, last = q0 // line, -(-q1 // line)
        while first < last:
            sample, at = divmod(first, pitch[0])
            count = min(last - first, out[0] - at)
            block = lines[first:first + count].reshape((count,) + pitch[1:] + (O,))
            finish(block[crop].transpose((R,) + tuple(range(R)))[None], y[sample:sample + 1, :, at:at + count])
            first += pitch[0] - at


def _conv(x, w, spec, bias=None, activation="identity"):
    """The forward formula (module docstring), in the compute dtype, for x
    of the spec's input shape; with ``bias`` and ``activation``,
    act(conv(x, w) + b), added to each group's output while it is in cache.
    Stride 1 on a grid with little waste: :func:`_grid_plan`; else im2col."""
    N = x.shape[0]
    O, Cg = w.shape[:2]
    G = spec.groups
    out = spec.out_shape[2:]
    R = len(out)
    wm = w.reshape(G, O // G, Cg * math.prod(w.shape[2:]))
    y = np.empty((N, O) + out, dtype=x.dtype)
    order = (1, 0) + _spatial(R)

    def finish(z, part):
        """part of y = act(z + b), z a view of the products' output."""
        if bias is not None:
            z += bias.reshape((1, -1) + (1,) * R)
        activate(z, activation, out=part)

    def group(s):
        plan = _grid_plan(spec, s.stop - s.start)
        if plan is not None and G == 1 and O >= _WIDE:
            return _rows_conv(x[s], w, spec, plan, y[s], finish)
        if plan is not None:
            z = _grid_conv(x[s], wm, spec, plan)
        else:
            # the weights (G, O/G, Cg*prod(k)) times the im2col matrix (G, Cg*prod(k), S*prod(o)):
            # y[g, o, (n, p)] = sum_{(c, t)} w[g, o, (c, t)] * cols[g, (c, t), (n, p)]
            z = _product(wm, _im2col(_padded(x[s], spec.padding), spec)).reshape((O, -1) + out).transpose(order)
        finish(z, y[s])
    in_parallel(group, _sample_groups(N, math.prod(out)))
    return y


#: the fewest output positions in a batch for which the input gradient is a correlation
#: with the turned kernel (:func:`_flipped_correlation`)
_TURNED_PIXELS = 1024


def _flipped_correlation(g_shape, w, spec):
    """For stride 1, conv's input gradient is itself a correlation: of g
    zero-padded by (d_a*(k_a-1) - lo_a, ...) on each axis a, with the kernel
    turned (every kernel axis reversed) and its two channel axes swapped (per
    group),

        dx[n, c, h] = sum_{o, t} gp[n, o, h + t*d] * w[o, c', k - 1 - t]       (h, t in Z^R)

    Returns that weight (C, O/G, *k) and the correlation's spec, or None where
    col2im serves: strides; padding past the kernel's reach; weights that are
    not all finite (the padding's zeros would multiply them: 0 * inf is NaN);
    more output than input channels (fewer rows for the product) on inputs
    wider than 8 along the last axis, where col2im's slice-adds run long
    enough, except 3-D convs on the grid (:func:`_grid_plan`) with at least a
    quarter as many input as output channels; and batches of fewer than
    ``_TURNED_PIXELS`` output positions, where turning the kernel (a copy of
    the weights) costs as much as the products. Measured on two cores, a 2-D
    layer's whole backward took 0.6-1.0x of its time with col2im on the UNets'
    and the Chain's layers it is chosen for; on one core, the input gradient
    of 3x3x3 convs on 2 x 32^3 took 0.58x of col2im's time for 4 -> 8
    channels, 0.95x for 2 -> 8 and 1.4x for 1 -> 8 (one row per product), and
    0.65x for 8 -> 16 channels on 2 x 16^3."""
    O, Cg = w.shape[:2]
    kernel = w.shape[2:]
    G, R = spec.groups, spec.rank
    out = g_shape[2:]
    # the padding that gives the input's sides; g may lack positions no input reaches (conv_transpose)
    padding = ()
    for n, lo, k, d, o in zip(spec.x_shape[2:], spec.padding_lo, kernel, spec.dilation, out):
        padding += (d * (k - 1) - lo, n + lo - o)
    if (any(s != 1 for s in spec.stride) or min(padding) < 0 or g_shape[0] * math.prod(out) < _TURNED_PIXELS
            or not bool(np.isfinite(w).all())):
        return None
    narrow = Cg < O // G and out[-1] > 8
    if narrow and (R < 3 or 4 * Cg < O // G):
        return None
    turned = conv_spec(g_shape, (spec.x_shape[1], O // G) + kernel, w.dtype, w.dtype, (1,) * R, padding,
                       spec.dilation, G)
    if narrow and _grid_plan(turned, 1) is None:
        return None
    flipped = w.reshape((G, O // G, Cg) + kernel).transpose((0, 2, 1) + tuple(range(3, 3 + R)))
    flipped = flipped.reshape((spec.x_shape[1], O // G) + kernel)
    return np.ascontiguousarray(flipped[(_ALL, _ALL) + (slice(None, None, -1),) * R]), turned


def _input_grad_buffer(g, w, spec):
    """The padded input gradient dxp for :func:`_add_input_grad` (not yet
    zeroed: each group zeroes its own samples, on its thread) and whether
    col2im runs along the rows of the last axis laid end to end (``runs``)."""
    N, C = spec.x_shape[:2]
    padded = tuple(n + a + b for n, a, b in zip(spec.x_shape[2:], spec.padding_lo, spec.padding_hi))
    out = g.shape[2:]
    # Stride 1, R >= 2 and one output position along the axes before the last two (the
    # depth of a 3-D conv): with the rows of the padded input laid end to end (a spare row
    # after each plane), tap t moves every output position by the same flat offset, so its
    # slice-add is one long run per channel. g gets zero columns up to the padded width Wp;
    # their products (exact zeros for finite weights) land on positions real ones reach
    # too, or on the spare rows. Worth it for wide inputs only, where those columns add few products.
    runs = (spec.rank >= 2 and all(s == 1 for s in spec.stride) and all(o == 1 for o in out[:-2])
            and 16 * (padded[-1] - out[-1]) <= out[-1] and bool(np.isfinite(w).all()))
    if runs:
        padded = padded[:-2] + (padded[-2] + 1, padded[-1])
    return np.empty((N, C) + padded, dtype=g.dtype), runs


def _add_input_grad(dxp, runs, g, w, spec):
    """col2im of a group of samples: zeroes their padded dxp (S, C, *sp) and
    adds conv's input gradient for their output gradient g (S, O, *o) into it
    (the formula at :func:`_conv_input_grad`)."""
    dxp[...] = 0
    S, C = dxp.shape[:2]
    O, Cg = w.shape[:2]
    kernel, G, R = w.shape[2:], spec.groups, spec.rank
    stride, dilation = spec.stride, spec.dilation
    out = g.shape[2:]
    steps = None
    if runs:                                                   # g's rows widened to Wp by zeros
        Wp = dxp.shape[-1]
        gw = _SCRATCH.array("g", g.shape[:-1] + (Wp,), g.dtype)
        gw[..., :out[-1]], gw[..., out[-1]:] = g, 0
        g = gw
        # the flat offset of one step along each spatial axis in a sample's channel, and a run's length
        steps = tuple(math.prod(dxp.shape[2 + a + 1:]) for a in range(R))
        run = out[-2] * Wp
    taps = math.prod(kernel)
    dcols = _SCRATCH.array("cols", (G, Cg * taps, S * math.prod(g.shape[2:])), g.dtype)
    np.matmul(w.reshape(G, O // G, Cg * taps).transpose(0, 2, 1), _batch_inside(g, G), out=dcols)
    dcols = dcols.reshape((C, taps, S) + g.shape[2:])
    d = dxp.transpose((1, 0) + _spatial(R))                    # (C, S, *sp), a view
    rows = dxp.reshape(S, C, -1).transpose(1, 0, 2)            # the same with its rows end to end
    if runs:
        for k, start in enumerate(_col2im_plan(kernel, dilation, stride, out, steps)):
            rows[:, :, start: start + run] += dcols[:, k].reshape(C, S, run)
    else:
        for k, index in enumerate(_col2im_plan(kernel, dilation, stride, out, None)):
            d[index] += dcols[:, k]


@functools.lru_cache(maxsize=256)
def _col2im_plan(kernel, dilation, stride, out, steps):
    """Where each tap t of col2im adds: with ``steps`` (the flat offset of one
    step along each axis: the runs), the start of its run; else the index
    (all channels, all samples, then per axis the positions p*s + t*d)."""
    taps = itertools.product(*map(range, kernel))
    if steps is not None:
        return tuple(sum(t * dl * step for t, dl, step in zip(tap, dilation, steps)) for tap in taps)
    return tuple((_ALL, _ALL) + tuple(slice(t * dl, t * dl + s * (o - 1) + 1, s)
                                      for t, dl, s, o in zip(tap, dilation, stride, out)) for tap in taps)


def _cropped(dxp, spec):
    """dx: the padded input gradient with the padding cropped off (a view)."""
    return dxp[(_ALL, _ALL) + tuple(slice(lo, lo + n) for lo, n in zip(spec.padding_lo, spec.x_shape[2:]))]


def _conv_input_grad(g, w, spec):
    """dL/dx of conv for dL/dy = g (N, O, *o):

        dcols[c, t, n, p] = sum_{o in group(c)} w[o, c', t] * g[n, o, p]
        dxp[n, c, p*s + t*d] += dcols[c, t, n, p]                         (col2im)
        dx = dxp with the padding cropped off

    (per group of samples one matmul, then one slice-add per kernel tap t),
    or for stride 1 the same sums as a forward correlation (:func:`_flipped_correlation`).
    This is also conv_transpose's forward, whose ``g`` may lack the
    positions at the high end of each axis that no input position reaches."""
    flipped = _flipped_correlation(g.shape, w, spec)
    if flipped is not None:
        return _conv(g, *flipped)
    dxp, runs = _input_grad_buffer(g, w, spec)
    in_parallel(lambda s: _add_input_grad(dxp[s], runs, g[s], w, spec),
                _sample_groups(g.shape[0], math.prod(g.shape[2:])))
    return _cropped(dxp, spec)


def _weight_grad_part(x, g, spec):
    """The weight gradient's sum over one group of samples, x (S, C, *s) and
    g (S, O, *o), as one product over their (n, p) together:
    dw[g, o, (c, t)] = sum_{(n, p)} g[g, o, (n, p)] * cols[g, (c, t), (n, p)],
    or the same sum over the grid's columns (:func:`_grid_weight_grad`)."""
    plan = _grid_plan(spec, x.shape[0])
    if plan is not None and g.shape[1] // spec.groups <= _TAP_CHANNELS and bool(np.isfinite(x).all()):
        return _grid_weight_grad(x, g, spec, plan)
    cols, gs = _im2col(_padded(x, spec.padding), spec), _batch_inside(g, spec.groups)
    if cols.shape[2] >= cols.shape[1]:     # more positions than rows: BLAS runs the same sums
        return np.matmul(cols, gs.transpose(0, 2, 1)).transpose(0, 2, 1)   # as dw^T = cols g^T, 10-20% faster
    return np.matmul(gs, cols.transpose(0, 2, 1))


def _grid_weight_grad(x, g, spec, plan):
    """The weight gradient's sum over one group of samples on the grid
    (:func:`_grid_plan`), with no im2col copy: g laid out on the grid,
    gg[o, q], zero on the columns of no output position (so they add
    nothing), and for each tap t a product over a block of columns,

        dw[o, c', t] = sum_q gg[o, q] * xg[c, q + off(t)]      (c in group(o))

    xg's rows shifted by off(t) are a plain column slice, read by BLAS in
    place: one ``matmul`` per block runs the prod(k) products of a view
    (G, *k, Cg, columns) of xg (a step along kernel axis a moves off(t) by
    d_a*step_a), so the block of xg and gg (``_TAP_VALUES``) stays in cache
    through them. Needs x finite: a column of no output position still reads
    x, and 0 * inf is NaN."""
    pitch, _, front, Q, _ = plan
    G, (S, O), C = spec.groups, g.shape[:2], x.shape[1]
    kernel, R, strides = tuple(spec.kernel_size), len(pitch), _tap_strides(spec, plan)
    gg = _on_grid(g, plan, 0, "grid_out").reshape(G, O // G, -1)
    xg = _on_grid(x, plan, front, "padded").reshape(G, C // G, -1)
    item = xg.itemsize
    shifted = as_strided(xg, (G,) + kernel + (C // G, Q), (xg.strides[0],) + tuple(s * item for s in strides) +
                         xg.strides[1:], writeable=False)              # shifted[g, t, c', q] = xg[g, c', q + off(t)]
    width = max(_BLOCK_COLUMNS, (_TAP_VALUES - C * sum((k - 1) * s for k, s in zip(kernel, strides))) // (C + O))
    dw = np.zeros((G,) + kernel + (C // G, O // G), x.dtype)      # dw^T per tap
    part = np.empty_like(dw)
    for start, stop in _output_runs(plan, spec, S):                # (gg is zero on the gap's lines)
        for q0 in range(start, stop, width):
            q1 = min(stop, q0 + width)
            gb = gg[:, :, q0:q1].transpose(0, 2, 1).reshape((G,) + (1,) * R + (q1 - q0, O // G))
            dw += np.matmul(shifted[..., q0:q1], gb, out=part)
    # (G, *k, Cg, O/G) as (G, O/G, (Cg, t)), the layout of the im2col rows
    return dw.transpose((0, R + 2, R + 1) + tuple(range(1, R + 1))).reshape(G, O // G, -1)


def _in_order(parts, empty):
    """The sum of the groups' ``parts`` (new arrays, the first one overwritten),
    added in order (``empty`` with none)."""
    total = empty() if not parts else parts[0]
    for part in parts[1:]:
        total += part
    return total


def _weight_grad(parts, spec, dtype):
    """dw from the groups' parts, in the weight's memory layout."""
    return np.ascontiguousarray(_in_order(parts, lambda: np.zeros(spec.w_shape, dtype))).reshape(spec.w_shape)


def _conv_weight_grad(x, g, spec):
    """dL/dw of conv for dL/dy = g:

        dw[o, c', t] = sum_{n, p} g[n, o, p] * xp[n, g(o)*C/G + c', p*s + t*d]
    """
    parts = in_parallel(lambda s: _weight_grad_part(x[s], g[s], spec),
                        _sample_groups(x.shape[0], math.prod(g.shape[2:])))
    return _weight_grad(parts, spec, g.dtype)


def _as(a, dtype):
    return None if a is None else a.astype(dtype, copy=False)


def conv_forward(x, w, stride=None, padding=None, dilation=None, groups=1):
    """y = conv(x, w): the cross-correlation of the module docstring,
    ``y[n, o, p] = sum_{c, t} xp[n, c, p*s + t*d] * w[o, c, t]`` (c over the
    group of o; p, t in Z^R). Output (N, O, *o) in x's dtype."""
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    xc, wc = in_compute_dtype(x, w)
    return _conv(xc, wc, spec).astype(x.dtype, copy=False)


def conv_backward(grad, out, x, w, stride=None, padding=None, dilation=None, groups=1, needs=(True, True)):
    """Adjoint of y = conv(x, w) with G = dL/dy (``needs`` says which of
    (dx, dw) to compute; the other is None: a first layer's dx nobody uses):

        dx[n, c, h] = sum_{o, t, p : h + lo = p*s + t*d} G[n, o, p] w[o, c', t]
                      (conv_transpose(G, w), the "full" correlation with the turned kernel)
        dw[o, c', t] = sum_{n, p} G[n, o, p] xp[n, c, p*s + t*d]

    (h, p, t in Z^R, lo the padding before each axis).
    """
    spec = conv_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, dilation, groups)
    gc, xc, wc = in_compute_dtype(grad, x, w)
    dx, dw, _ = _backward_by_groups(gc, None, xc, wc, spec, "identity", tuple(needs) + (False,))
    return _as(dx, x.dtype), _as(dw, w.dtype)


def conv_transpose_forward(x, w, stride=None, padding=None, output_padding=None, dilation=None, groups=1):
    """y = conv_transpose(x, w), x (N, Cin, *s), w (Cin, O/G, *k): the
    adjoint of conv (weight w read as a conv weight of Cin outputs and O/G
    inputs per group) with the same stride/padding/dilation/groups:

        y = dL/dz of z = conv(u, w) at dL/dz = x, for u of shape (N, O, *o),
        o_a = (s_a - 1)*t_a - lo_a - hi_a + d_a*(k_a - 1) + output_padding_a + 1.

    output_padding (below the stride or the dilation) adds positions at the
    high end of each axis, as torch."""
    spec = conv_transpose_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                               groups)
    xc, wc = in_compute_dtype(x, w)
    y = _conv_input_grad(xc, wc, spec.adjoint)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


def conv_transpose_backward(grad, out, x, w, stride=None, padding=None, output_padding=None, dilation=None,
                            groups=1, needs=(True, True)):
    """Adjoint of y = conv_transpose(x, w) = A_w^T x (A_w: conv by w), G = dL/dy
    (``needs``: which of (dx, dw) to compute; the other is None):

        dx = A_w G = conv(G, w)                       (the same stride, padding, ...)
        dw = conv's weight gradient with input G and output gradient x:
        dw[c, o', t] = sum_{n, p} x[n, c, p] Gp[n, o, p*s + t*d]
    """
    spec = conv_transpose_spec(x.shape, w.shape, x.dtype, w.dtype, stride, padding, output_padding, dilation,
                               groups)
    gc, xc, wc = in_compute_dtype(grad, x, w)
    # An output_padding of a stride or more (allowed below the dilation) adds whole
    # planes that no input position reaches: conv(G) then has spec.extra more
    # positions, which are cut off (dx) or met by zero gradients (dw).
    dx = None
    if needs[0]:
        dx = _conv(gc, wc, spec.adjoint)[(_ALL, _ALL) + tuple(slice(0, n) for n in x.shape[2:])]
        dx = dx.astype(x.dtype, copy=False)
    if not needs[1]:
        return dx, None
    if any(spec.extra):
        xc = np.pad(xc, ((0, 0), (0, 0)) + tuple((0, e) for e in spec.extra))
    return dx, _conv_weight_grad(gc, xc, spec.adjoint).astype(w.dtype, copy=False)


# --- conv with bias and activation fused (one primitive) -------------------------------------

def conv_bias_act_forward(x, w, b, stride=None, padding=None, dilation=None, groups=1, activation="identity"):
    """y = act(conv(x, w) + b), one primitive (a Conv layer's whole forward):

        y[n, o, p] = act(z[n, o, p]),  z[n, o, p] = conv(x, w)[n, o, p] + b[o]

    with act one of the declared fusable activations, identity, relu
    (max(z, 0)), sigmoid (1 / (1 + exp(-z))) and tanh: those whose derivative
    is a function of y alone, so the backward needs only the output. Computed
    in float32 for half-precision inputs and rounded once; output
    (N, O, *o) in x's dtype."""
    spec = conv_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                              stride, padding, dilation, groups, activation)
    xc, wc, bc = in_compute_dtype(x, w, b)
    return _conv(xc, wc, spec, bc, activation).astype(x.dtype, copy=False)


def conv_bias_act_backward(grad, out, x, w, b, stride=None, padding=None, dilation=None, groups=1,
                           activation="identity", needs=(True, True, True)):
    """Adjoint of y = act(conv(x, w) + b) with G = dL/dy, from the output y
    (``needs``: which of (dx, dw, db) to compute; the others are None):

        gz[n, o, p] = G[n, o, p] * act'(y[n, o, p])
                      (identity: 1; relu: [not y <= 0]; sigmoid: y (1 - y); tanh: 1 - y^2)
        db[o]       = sum_{n, p} gz[n, o, p]
        (dx, dw)    = conv's adjoint (conv_backward) at the output gradient gz
    """
    spec = conv_bias_act_spec(np.shape(x), np.shape(w), np.shape(b), x.dtype, w.dtype, np.asarray(b).dtype,
                              stride, padding, dilation, groups, activation)
    xc, wc, g, y = in_compute_dtype(x, w, grad, out)
    dx, dw, db = _backward_by_groups(g, y, xc, wc, spec, activation, needs)
    return _as(dx, x.dtype), _as(dw, w.dtype), _as(db, np.asarray(b).dtype)


def _backward_by_groups(g, y, x, w, spec, activation, needs):
    """(dx, dw, db) of y = act(conv(x, w) + b) for the output gradient g (in
    the compute dtype; ``y`` serves act' only, None for identity), those in
    ``needs`` (None for the others): one section of groups of samples, each
    taking its gz = g * act'(y) through the input gradient, the weight
    gradient's product and the bias sum while gz is in cache."""
    flipped = _flipped_correlation(g.shape, w, spec) if needs[0] else None
    dx = np.empty(spec.x_shape, g.dtype) if flipped is not None else None
    if needs[0] and flipped is None:
        dxp, runs = _input_grad_buffer(g, w, spec)
    sums = (0,) + _spatial(spec.rank)

    def group(s):
        gz = g[s] if activation == "identity" else through_activation(g[s], y[s], activation)
        if flipped is not None:
            dx[s] = _conv(gz, *flipped)
        elif needs[0]:
            _add_input_grad(dxp[s], runs, gz, w, spec)
        return (gz.sum(axis=sums) if needs[2] else None,
                _weight_grad_part(x[s], gz, spec) if needs[1] else None)
    parts = in_parallel(group, _sample_groups(g.shape[0], math.prod(g.shape[2:])))
    if needs[0] and flipped is None:
        dx = _cropped(dxp, spec)
    dw = _weight_grad([p[1] for p in parts], spec, g.dtype) if needs[1] else None
    db = _in_order([p[0] for p in parts], lambda: np.zeros(spec.w_shape[0], g.dtype)) if needs[2] else None
    return dx, dw, db
