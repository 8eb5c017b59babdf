"""Declarations of every primitive with its traits, and ``REGISTRY``, the
table of them (``triflux.registry`` says what a declaration asks for).

Declaring a primitive here makes the completeness test demand its parts and
the property suite cross-check them.
"""
from .registry import PerElement, Registry

REGISTRY = Registry()
register = REGISTRY.register

#: the activations a primitive can apply in its own kernel: those whose derivative is a
#: function of their output, so the backward needs only the stored output y
ACTIVATIONS_FROM_OUTPUT = ("identity", "relu", "sigmoid", "tanh")


# --- elementwise: unary ---------------------------------------------------------
#: a few operations per element of elementwise math, forward and backward
_ELEMENTWISE = PerElement(1, 2)
for _n in ("neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu",
           "swish", "softplus"):
    register(_n, "elementwise", accumulates=False, flops=_ELEMENTWISE)
register("gelu_erf", "elementwise", accumulates=False, flops=_ELEMENTWISE,
         doc="the exact GELU x Phi(x) (NNlib's gelu_erf; gelu is the tanh form)")
register("leakyrelu", "elementwise", accumulates=False, flops=_ELEMENTWISE, doc="attrs: negative_slope")
register("elu", "elementwise", accumulates=False, flops=_ELEMENTWISE, doc="attrs: alpha")
register("cast", "elementwise", accumulates=False, flops=_ELEMENTWISE, doc="attrs: dtype (NumPy dtype of the output)")

# --- elementwise: binary and ternary, NumPy broadcasting --------------------------
for _n in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    register(_n, "elementwise", accumulates=False, broadcasting=True, flops=_ELEMENTWISE)
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(_n, "elementwise", differentiable=False, broadcasting=True, flops=_ELEMENTWISE)
register("where", "elementwise", accumulates=False, broadcasting=True, flops=_ELEMENTWISE,
         doc="inputs: cond (bool), a, b")

# --- fills (no tensor inputs; attrs: shape, dtype, device, ...) --------------------
#: copies, fills and layout changes compute nothing
_COPY = PerElement(0, 0)
register("fill", "fill", differentiable=False, flops=_COPY, doc="attrs: shape, value, dtype, device")
register("rand_uniform", "fill", differentiable=False, random=True, flops=_COPY,
         doc="uniform on [0, 1); attrs: shape, dtype, seed, device")
register("rand_normal", "fill", differentiable=False, random=True, flops=_COPY,
         doc="standard normal; attrs: shape, dtype, seed, device")

# --- reductions ---------------------------------------------------------------------
_REDUCE_DOC = "attrs: axis (tuple of non-negative ints, sorted), keepdims"
for _n in ("sum", "mean"):
    register(_n, "reduce", accumulates=True, multilinear_forward=True, multilinear_backward=True,
             flops=PerElement(1, 1), doc=_REDUCE_DOC)
register("max", "reduce", accumulates=False, flops=PerElement(1, 1), doc=_REDUCE_DOC)

# --- matrix products ------------------------------------------------------------------
register("matmul", "matmul", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         partial_backward=True, flops="matmul_flops", doc="NumPy matmul semantics: vector, matrix, batched with broadcasting")
register("dense_bias_act", "matmul", accumulates=True, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         partial_backward=True, flops="dense_bias_act_flops",
         doc="inputs: x (..., K), w (O, K) (torch's Linear layout), b (O,); attrs: activation (one of "
             "fusable_activations). y = act(x @ w^T + b) on the last axis of x, fused: a Dense layer's "
             "forward as one primitive; the backward uses only the output y.")

# --- softmax family ---------------------------------------------------------------------
_SOFTMAX = PerElement(5, 4)    # max, subtract, exp, sum, divide (or log) per element
register("softmax", "softmax", accumulates=True, flops=_SOFTMAX, doc="attrs: axis")
register("logsoftmax", "softmax", accumulates=True, flops=_SOFTMAX, doc="attrs: axis")
register("logsumexp", "softmax", accumulates=True, flops=_SOFTMAX, doc="attrs: axis, keepdims")

# --- shape and layout -----------------------------------------------------------------
# (the backward of a copy is a copy, or a sum where it broadcast or repeated: multilinear)
register("reshape", "shape", accumulates=False, multilinear_backward=True, flops=_COPY, doc="attrs: shape")
register("transpose", "shape", accumulates=False, multilinear_backward=True, flops=_COPY, doc="attrs: axes (a permutation)")
register("getitem", "shape", accumulates=False, multilinear_backward=True, flops=_COPY,
         doc="attrs: index (tuple of int / slice / None)")
register("concat", "shape", accumulates=False, multilinear_backward=True, flops=_COPY, doc="variadic inputs; attrs: axis")
register("broadcast_to", "shape", accumulates=False, multilinear_backward=True, flops=_COPY, doc="attrs: shape")
register("contiguous", "shape", accumulates=False, multilinear_backward=True, flops=_COPY, doc="a dense row-major copy")

# --- optimiser updates (in place, fused: one kernel per rule; mutates: x and the states) ---
register("descent_update", "optimise", differentiable=False, foreach=True, flops=PerElement(2, 0), mutates=(0,),
         doc="inputs: x, g; attrs: eta")
register("momentum_update", "optimise", differentiable=False, foreach=True, flops=PerElement(4, 0), mutates=(0, 2),
         doc="inputs: x, g, v; attrs: eta, rho")
register("nesterov_update", "optimise", differentiable=False, foreach=True, flops=PerElement(6, 0), mutates=(0, 2),
         doc="inputs: x, g, v; attrs: eta, rho")
register("adam_update", "optimise", differentiable=False, foreach=True, flops=PerElement(12, 0), mutates=(0, 2, 3),
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, step")
register("adamw_update", "optimise", differentiable=False, foreach=True, flops=PerElement(14, 0), mutates=(0, 2, 3),
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, lambd, step")
register("rmsprop_update", "optimise", differentiable=False, foreach=True, flops=PerElement(8, 0), mutates=(0, 2),
         doc="inputs: x, g, s; attrs: eta, rho, epsilon")

# --- spatial families: any spatial rank R in 1..3 ------------------------------------------------
# Inputs are (N, C, *spatial) with R spatial axes; every per-axis attr is a tuple of R entries
# (stride, dilation, window, size, scale, output_padding) and ``padding`` the flat 2R-tuple
# (lo_0, hi_0, lo_1, hi_1, ...) in axis order; the rank is read from them and from x. Each family's
# spec (triflux/specs/<family>.py) carries the rank. The 2-D names stay as aliases (``conv2d`` finds
# ``conv``), so code written for the 2-D primitives runs unchanged.
_SPATIAL = ("x (N, C, *spatial) with R = 1, 2 or 3 spatial axes; per-axis attrs are R-tuples, padding the "
            "flat (lo_0, hi_0, ..., lo_R-1, hi_R-1). ")

# --- convolution: PyTorch weight layouts -------------------------------------------------------------
register("conv", "conv", accumulates=True, flops="conv_flops", multilinear_forward=True, multilinear_backward=True,
         partial_backward=True,
         doc=_SPATIAL + "inputs: x, w (O, C/groups, *kernel); attrs: stride, padding, dilation, groups. "
             "Cross-correlation, as torch's conv1d/2d/3d (and Flux's CrossCor).")
register("conv_bias_act", "conv", accumulates=True, flops="conv_flops", fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         partial_backward=True,
         doc=_SPATIAL + "inputs: x, w (O, C/groups, *kernel), b (O,); attrs: stride, padding, dilation, "
             "groups, activation (one of fusable_activations: those whose derivative is a function of "
             "their output). y = act(conv(x, w) + b[o]), fused; the backward uses only the output y.")
register("conv_transpose", "conv", accumulates=True, flops="conv_flops", multilinear_forward=True, multilinear_backward=True,
         partial_backward=True,
         doc=_SPATIAL + "inputs: x, w (C, O/groups, *kernel); attrs: stride, padding, output_padding, "
             "dilation, groups. The adjoint of conv, as torch's conv_transpose1d/2d/3d.")

# --- pooling: torch's max_pool / avg_pool / lp_pool / adaptive pools -------------------------------------
# (windows sum, and overlapping windows sum their gradients: all accumulate)
register("maxpool", "pool", flops="pool_flops", accumulates=True,
         doc=_SPATIAL + "attrs: window, stride, padding, dilation, ceil_mode. NaN propagates; the gradient "
             "goes to the first maximal element or the last NaN of each window, as torch")
register("meanpool", "pool", flops="pool_flops", accumulates=True,
         doc=_SPATIAL + "attrs: window, stride, padding, ceil_mode, count_include_pad (divide by the taps "
             "inside the padded input, or inside the input only), as torch")
register("lpnormpool", "pool", flops="pool_flops", accumulates=True,
         doc=_SPATIAL + "attrs: p (a positive float), window, stride, padding, dilation, ceil_mode. "
             "y = (sum of x^p over the window)^(1/p), as torch's lp_pool (NNlib's lpnormpool)")
register("adaptive_maxpool", "pool", flops="pool_flops", accumulates=False,
         doc=_SPATIAL + "attrs: size (R output sides); windows floor(i*n/m) <= h < ceil((i+1)*n/m)")
register("adaptive_meanpool", "pool", flops="pool_flops", accumulates=True,
         doc=_SPATIAL + "attrs: size; the windows of adaptive_maxpool")

# --- resampling: torch's F.interpolate, F.pixel_shuffle ---------------------------------------------------
# (the backward sums the gradients of every output element a source element feeds)
register("upsample_nearest", "upsample", flops="upsample_flops", accumulates=True,
         doc=_SPATIAL + "attrs: exactly one of size (R sides) and scale (R positive ints or floats); "
             "torch's index rule")
register("upsample_linear", "upsample", flops="upsample_flops", accumulates=True,
         doc=_SPATIAL + "attrs: size or scale as upsample_nearest, align_corners. Linear along each "
             "spatial axis: linear (R = 1), bilinear (2), trilinear (3)")
register("pixel_shuffle", "upsample", flops="upsample_flops", accumulates=False, multilinear_forward=True, multilinear_backward=True,
         doc=_SPATIAL + "attrs: factor r. (N, C*r^R, *s) -> (N, C, *(s*r)): a permutation of the elements, "
             "torch's channel order (NNlib's pixel_shuffle in row-major layout)")
register("pixel_unshuffle", "upsample", flops="upsample_flops", accumulates=False, multilinear_forward=True, multilinear_backward=True,
         doc=_SPATIAL + "attrs: factor r. The inverse of pixel_shuffle: (N, C, *(s*r)) -> (N, C*r^R, *s)")

# --- padding -----------------------------------------------------------------------------------------
register("pad", "pad", accumulates=True, multilinear_backward=True, flops=PerElement(0, 1),
         doc="inputs: x of any rank; attrs: padding (lo, hi) per axis of x, flat (2*x.ndim entries, "
             "non-negative), mode ('constant' | 'reflect' | 'replicate' | 'symmetric' | 'circular'), value "
             "(constant mode). The backward sums the gradients of every output element an input element "
             "was copied to")

for _old, _new in (("conv2d", "conv"), ("conv2d_bias_act", "conv_bias_act"), ("conv_transpose2d", "conv_transpose"),
                   ("maxpool2d", "maxpool"), ("meanpool2d", "meanpool"), ("adaptive_maxpool2d", "adaptive_maxpool"),
                   ("adaptive_meanpool2d", "adaptive_meanpool"), ("upsample_nearest2d", "upsample_nearest"),
                   ("upsample_bilinear2d", "upsample_linear")):
    REGISTRY.alias(_old, _new)

# --- normalisation ---------------------------------------------------------------------------
_NORM = PerElement(8, 10)    # statistics, normalisation, scale and shift per element; their gradients
# (batch statistics and the gradients of gamma and beta are sums over N and the pixels)
register("batchnorm_train", "norm", accumulates=True, flops=_NORM, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x (N, C, ...), gamma (C,), beta (C,)[, running_mean (C,), running_var (C,)[, "
             "moved_mean (C,), moved_var (C,)]]; attrs: eps[, momentum], activation (one of "
             "fusable_activations, applied to the normalised output in the same kernel; the backward takes "
             "its derivative from the output). Normalises with the batch's mean and biased variance per "
             "channel; given the running statistics, moves them as batchnorm_running_update does, in the "
             "same launches: in place, or into the moved ones (which a training step keeps aside until it "
             "succeeds); no gradient for any of them")
register("batchnorm_running_update", "norm", differentiable=False, accumulates=True, flops=_NORM, mutates=(1, 2),
         doc="inputs: x (N, C, ...), running_mean (C,), running_var (C,); attrs: momentum. In place: "
             "running = (1 - momentum) * running + momentum * the batch's mean / unbiased variance")
register("batchnorm_test", "norm", accumulates=True, flops=_NORM, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x, gamma, beta, mean (C,), var (C,); attrs: eps, activation (as batchnorm_train's). "
             "Uses the given (running) statistics; no gradient for mean and var")

# --- per-sample normalisation (family layernorm): statistics per sample, not per batch ---------------
# Each sample's rows (its trailing axes, or its groups of channels) get their own mean and biased
# variance; optional inputs are trailing (no weight = torch's weight=None, Flux's affine=false).
# The parameter gradients are sums over the rows: per-program partial sums, then an ordered second pass.
_SAMPLE_NORM = PerElement(8, 12)     # statistics, normalisation, scale and shift; their gradients
register("layernorm", "layernorm", accumulates=True, flops=_SAMPLE_NORM, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x (*batch, *normalised), optional weight and bias (shape: normalised); attrs: "
             "normalised_ndim (the trailing axes normalised together), eps, activation (one of "
             "fusable_activations, applied in the same kernel). y = act((x - mean) / sqrt(var + eps) * weight "
             "+ bias), mean and biased variance over each sample's trailing axes (torch's layer_norm)")
register("rmsnorm", "layernorm", accumulates=True, flops=PerElement(5, 8),
         doc="inputs: x (*batch, *normalised), optional weight (shape: normalised); attrs: normalised_ndim, eps "
             "(None: the machine epsilon of the compute type, as torch). y = x / sqrt(mean(x^2) + eps) * weight "
             "(torch's rms_norm)")
register("groupnorm", "layernorm", accumulates=True, flops=_SAMPLE_NORM, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x (N, C, *spatial), optional weight (C,) and bias (C,); attrs: groups (dividing C), eps, "
             "activation. Statistics per sample and group of C/groups consecutive channels (torch's group_norm; "
             "groups = C is instance norm)")
register("instancenorm_train", "layernorm", accumulates=True, flops=_SAMPLE_NORM,
         fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x (N, C, *spatial), then weight (C,) and bias (C,) when affine, then optionally "
             "running_mean (C,) and running_var (C,), then optionally moved_mean (C,) and moved_var (C,); attrs: "
             "affine, eps, momentum, activation. Normalises each sample's channel with its own statistics "
             "(groupnorm with groups = C) and, given the running statistics, moves them in the same launches "
             "as instancenorm_running_update does: in place, or into the moved ones (kept aside until a training "
             "step succeeds); no gradient for any of them")
register("instancenorm_running_update", "layernorm", differentiable=False, accumulates=True, flops=_SAMPLE_NORM,
         mutates=(1, 2),
         doc="inputs: x (N, C, *spatial), running_mean (C,), running_var (C,); attrs: momentum. In place: running = "
             "(1 - momentum) * running + momentum * the batch's average of each sample's channel mean (unbiased "
             "variance), as torch's InstanceNorm(track_running_stats=True)")

# --- dropout ---------------------------------------------------------------------------------
register("dropout", "dropout", accumulates=False, random=True, flops=PerElement(2, 2),
         doc="attrs: p, seed. y = x * mask / (1 - p), the mask drawn on the device from the seed (the "
             "backward redraws it)")

# --- recurrent sequences: batch-first x (N, L, in), PyTorch weight layouts and gate order --------------
register("rnn_sequence", "rnn", accumulates=True, flops="recurrent_flops", partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (H, in), w_hh (H, H), b_ih (H,), b_hh (H,); attrs: "
             "activation ('tanh' | 'relu'). y (N, L, H) = every hidden state h_t; BPTT backward.")
register("lstm_sequence", "rnn", accumulates=True, flops="recurrent_flops", partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), c0 (N, H), w_ih (4H, in), w_hh (4H, H), b_ih (4H,), b_hh (4H,); "
             "gates i, f, g, o. y (N, L, 2H) = [h_t, c_t] on the last axis; the kernels' backward recomputes "
             "the gates, the reference's reads those its forward kept with y (or recomputes them for another array).")
register("gru_sequence", "rnn", accumulates=True, flops="recurrent_flops", partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (3H, in), w_hh (3H, H), b_ih (3H,), b_hh (3H,); gates r, z, n "
             "(b_hn inside the reset gate's product, as torch). y (N, L, H) = every hidden state h_t.")

# --- attention (family attention): scaled dot-product attention, torch's sdpa layout -------------------
# q (N, H, Lq, d), k (N, H, Lk, d), v (N, H, Lk, dv); then an optional floating bias and an optional bool
# mask (True: may attend), each broadcastable to (N, H, Lq, Lk), in that order (told apart by dtype).
# The kernels are fused (FlashAttention-2: online softmax, the Lq x Lk weights never stored, causal blocks
# skipped, the softmax statistics kept for a backward that recomputes the weights; no atomics).
# Not declared `random`: the property suite compares both sides exactly at p = 0 (its strategies), and
# tests/test_attention_family.py checks the moments and the reproducibility of p > 0.
_ATTENTION_DOC = ("attrs: causal (top-left: query i attends keys j <= i, as torch's is_causal), scale (None: "
                  "1/sqrt(d)), p (dropout on the weights), seed (its mask). Fully masked rows give 0 (torch 2.13).")
register("attention", "attention", accumulates=True, partial_backward=True, flops="attention_flops",
         doc="inputs: q, k, v[, bias][, mask]; y (N, H, Lq, dv) = dropout(softmax(scale q k^T + bias, masked)) v. "
             + _ATTENTION_DOC)
register("attention_weights", "attention", accumulates=True, partial_backward=True, flops="attention_flops",
         doc="inputs: q, k[, bias][, mask]; the weights (N, H, Lq, Lk) that `attention` multiplies v by, dropout "
             "included (the same mask for the same seed): NNlib's returned attention scores. " + _ATTENTION_DOC)

# --- gather, scatter, embeddings: rows of a table moved by integer indices (NNlib's gather/scatter,
# torch's embedding/embedding_bag); the table, the index forms and the checks: triflux/specs/gather.py.
# Indices (int32/int64) get no gradient (None); repeated indices are reduced deterministically (a
# stable sort by row, then each row's entries in order: no atomics).
_INDEXED = ("idx: int32/int64, 0-based; coords=False: one row (axis 0) per entry, idx of any shape K; "
            "coords=True: idx (*K, M), M coordinates per entry into the first M axes. ")
register("gather", "gather", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         flops="gather_flops",
         doc="inputs: src, idx; attrs: coords. y[k] = src[idx[k]], shape K + src.shape[M:] (NNlib's gather, "
             "row-major). " + _INDEXED + "The backward adds each y gradient into its row of src.")
register("scatter", "gather", accumulates=True, flops="gather_flops",
         doc="inputs: src (K + row shape), idx; attrs: op ('add' | 'mul' | 'max' | 'min' | 'mean'), dstsize, "
             "coords. y (dstsize)[r] = op over the entries k with idx[k] = r of src[k]; rows no entry reaches hold "
             "NNlib's initial value (0, 1, -inf, +inf, 0). " + _INDEXED + "Gradients as torch's scatter_reduce "
             "(include_self=False): ties of max/min share, the product of the others for mul.")
register("embedding", "gather", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         flops="gather_flops",
         doc="inputs: weight (V, D), idx (any shape, int32/int64); attrs: padding_idx (None or a row: no gradient), "
             "scale_grad_by_freq. y = weight[idx], shape idx.shape + (D,), as torch's F.embedding.")
register("embedding_bag", "gather", accumulates=True, flops="gather_flops",
         doc="inputs: weight (V, D), idx (n,), offsets (B,)[, per_sample_weights (n,)]; attrs: mode ('sum' | "
             "'mean' | 'max'), padding_idx (left out of the bags), include_last_offset, scale_grad_by_freq. "
             "y (B, D): bag b = the entries offsets[b] <= i < offsets[b + 1] reduced, as torch's F.embedding_bag "
             "(empty bag: zeros; max: NaN wins, the gradient to the first entry attaining it).")
