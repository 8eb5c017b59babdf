"""Declarations of every primitive with its traits, and ``REGISTRY``, the
table of them (``triflux.registry`` says what a declaration asks for).

Declaring a primitive here makes the completeness test demand its parts and
the property suite cross-check them.
"""
from .registry import Registry

REGISTRY = Registry()
register = REGISTRY.register

#: the activations a primitive can apply in its own kernel: those whose derivative is a
#: function of their output, so the backward needs only the stored output y
ACTIVATIONS_FROM_OUTPUT = ("identity", "relu", "sigmoid", "tanh")


# --- elementwise: unary ---------------------------------------------------------
for _n in ("neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu",
           "swish", "softplus"):
    register(_n, "elementwise", accumulates=False)
register("gelu_erf", "elementwise", accumulates=False,
         doc="the exact GELU x Phi(x) (NNlib's gelu_erf; gelu is the tanh form)")
register("leakyrelu", "elementwise", accumulates=False, doc="attrs: negative_slope")
register("elu", "elementwise", accumulates=False, doc="attrs: alpha")
register("cast", "elementwise", accumulates=False, doc="attrs: dtype (NumPy dtype of the output)")

# --- elementwise: binary and ternary, NumPy broadcasting --------------------------
for _n in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    register(_n, "elementwise", accumulates=False, broadcasting=True)
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(_n, "elementwise", differentiable=False, broadcasting=True)
register("where", "elementwise", accumulates=False, broadcasting=True, doc="inputs: cond (bool), a, b")

# --- fills (no tensor inputs; attrs: shape, dtype, device, ...) --------------------
register("fill", "fill", differentiable=False, doc="attrs: shape, value, dtype, device")
register("rand_uniform", "fill", differentiable=False, random=True,
         doc="uniform on [0, 1); attrs: shape, dtype, seed, device")
register("rand_normal", "fill", differentiable=False, random=True,
         doc="standard normal; attrs: shape, dtype, seed, device")

# --- reductions ---------------------------------------------------------------------
_REDUCE_DOC = "attrs: axis (tuple of non-negative ints, sorted), keepdims"
for _n in ("sum", "mean"):
    register(_n, "reduce", accumulates=True, multilinear_forward=True, multilinear_backward=True,
             doc=_REDUCE_DOC)
register("max", "reduce", accumulates=False, doc=_REDUCE_DOC)

# --- matrix products ------------------------------------------------------------------
register("matmul", "matmul", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         partial_backward=True, doc="NumPy matmul semantics: vector, matrix, batched with broadcasting")
register("dense_bias_act", "matmul", accumulates=True, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         partial_backward=True,
         doc="inputs: x (..., K), w (O, K) (torch's Linear layout), b (O,); attrs: activation (one of "
             "fusable_activations). y = act(x @ w^T + b) on the last axis of x, fused: a Dense layer's "
             "forward as one primitive; the backward uses only the output y.")

# --- softmax family ---------------------------------------------------------------------
register("softmax", "softmax", accumulates=True, doc="attrs: axis")
register("logsoftmax", "softmax", accumulates=True, doc="attrs: axis")
register("logsumexp", "softmax", accumulates=True, doc="attrs: axis, keepdims")

# --- shape and layout -----------------------------------------------------------------
# (the backward of a copy is a copy, or a sum where it broadcast or repeated: multilinear)
register("reshape", "shape", accumulates=False, multilinear_backward=True, doc="attrs: shape")
register("transpose", "shape", accumulates=False, multilinear_backward=True, doc="attrs: axes (a permutation)")
register("getitem", "shape", accumulates=False, multilinear_backward=True,
         doc="attrs: index (tuple of int / slice / None)")
register("concat", "shape", accumulates=False, multilinear_backward=True, doc="variadic inputs; attrs: axis")
register("broadcast_to", "shape", accumulates=False, multilinear_backward=True, doc="attrs: shape")
register("contiguous", "shape", accumulates=False, multilinear_backward=True, doc="a dense row-major copy")

# --- optimiser updates (in place, fused: one kernel per rule; mutates: x and the states) ---
register("descent_update", "optimise", differentiable=False, foreach=True, mutates=(0,),
         doc="inputs: x, g; attrs: eta")
register("momentum_update", "optimise", differentiable=False, foreach=True, mutates=(0, 2),
         doc="inputs: x, g, v; attrs: eta, rho")
register("nesterov_update", "optimise", differentiable=False, foreach=True, mutates=(0, 2),
         doc="inputs: x, g, v; attrs: eta, rho")
register("adam_update", "optimise", differentiable=False, foreach=True, mutates=(0, 2, 3),
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, step")
register("adamw_update", "optimise", differentiable=False, foreach=True, mutates=(0, 2, 3),
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, lambd, step")
register("rmsprop_update", "optimise", differentiable=False, foreach=True, mutates=(0, 2),
         doc="inputs: x, g, s; attrs: eta, rho, epsilon")

# --- convolution: NCHW inputs, PyTorch weight layouts -----------------------------------------
register("conv2d", "conv", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         partial_backward=True,
         doc="inputs: x (N, C, H, W), w (O, C/groups, kh, kw); attrs: stride (sh, sw), "
             "padding (top, bottom, left, right), dilation (dh, dw), groups. Cross-correlation, as torch.")
register("conv2d_bias_act", "conv", accumulates=True, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         partial_backward=True,
         doc="inputs: x (N, C, H, W), w (O, C/groups, kh, kw), b (O,); attrs: stride, padding (top, bottom, "
             "left, right), dilation, groups, activation (one of fusable_activations: those whose "
             "derivative is a function of their output). y = act(conv2d(x, w) + b[o]), fused; the "
             "backward uses only the output y.")
register("conv_transpose2d", "conv", accumulates=True, multilinear_forward=True, multilinear_backward=True,
         partial_backward=True,
         doc="inputs: x (N, C, H, W), w (C, O/groups, kh, kw); attrs: stride, padding (top, bottom, left, "
             "right), output_padding (oh, ow), dilation, groups. The adjoint of conv2d, as torch.")

# --- pooling: NCHW, torch's max_pool2d / avg_pool2d / adaptive pools ------------------------
# (windows sum, and overlapping windows sum their gradients: all accumulate)
register("maxpool2d", "pool", accumulates=True,
         doc="attrs: window (kh, kw), stride (sh, sw), padding (top, bottom, left, right), dilation (dh, dw), "
             "ceil_mode. NaN propagates; the gradient goes to the first maximal pixel or the last NaN of "
             "each window, as torch")
register("meanpool2d", "pool", accumulates=True,
         doc="attrs: window, stride, padding, ceil_mode, count_include_pad (divide by the taps inside the "
             "padded input, or inside the input only), as torch")
register("adaptive_maxpool2d", "pool", accumulates=False,
         doc="attrs: size (Ho, Wo); windows floor(i*H/Ho) <= h < ceil((i+1)*H/Ho)")
register("adaptive_meanpool2d", "pool", accumulates=True,
         doc="attrs: size (Ho, Wo); the windows of adaptive_maxpool2d")

# --- upsampling: torch's F.interpolate, nearest and bilinear ----------------------------------
# (the backward sums the gradients of every output pixel a source pixel feeds)
register("upsample_nearest2d", "upsample", accumulates=True,
         doc="attrs: exactly one of size (Ho, Wo) and scale (sh, sw), positive ints or floats; "
             "torch's index rule")
register("upsample_bilinear2d", "upsample", accumulates=True,
         doc="attrs: size or scale as upsample_nearest2d, align_corners")

# --- normalisation ---------------------------------------------------------------------------
# (batch statistics and the gradients of gamma and beta are sums over N and the pixels)
register("batchnorm_train", "norm", accumulates=True, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x (N, C, ...), gamma (C,), beta (C,)[, running_mean (C,), running_var (C,)[, "
             "moved_mean (C,), moved_var (C,)]]; attrs: eps[, momentum], activation (one of "
             "fusable_activations, applied to the normalised output in the same kernel; the backward takes "
             "its derivative from the output). Normalises with the batch's mean and biased variance per "
             "channel; given the running statistics, moves them as batchnorm_running_update does, in the "
             "same launches: in place, or into the moved ones (which a training step keeps aside until it "
             "succeeds); no gradient for any of them")
register("batchnorm_running_update", "norm", differentiable=False, accumulates=True, mutates=(1, 2),
         doc="inputs: x (N, C, ...), running_mean (C,), running_var (C,); attrs: momentum. In place: "
             "running = (1 - momentum) * running + momentum * the batch's mean / unbiased variance")
register("batchnorm_test", "norm", accumulates=True, fusable_activations=ACTIVATIONS_FROM_OUTPUT,
         doc="inputs: x, gamma, beta, mean (C,), var (C,); attrs: eps, activation (as batchnorm_train's). "
             "Uses the given (running) statistics; no gradient for mean and var")

# --- dropout ---------------------------------------------------------------------------------
register("dropout", "dropout", accumulates=False, random=True,
         doc="attrs: p, seed. y = x * mask / (1 - p), the mask drawn on the device from the seed (the "
             "backward redraws it)")

# --- recurrent sequences: batch-first x (N, L, in), PyTorch weight layouts and gate order --------------
register("rnn_sequence", "rnn", accumulates=True, partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (H, in), w_hh (H, H), b_ih (H,), b_hh (H,); attrs: "
             "activation ('tanh' | 'relu'). y (N, L, H) = every hidden state h_t; BPTT backward.")
register("lstm_sequence", "rnn", accumulates=True, partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), c0 (N, H), w_ih (4H, in), w_hh (4H, H), b_ih (4H,), b_hh (4H,); "
             "gates i, f, g, o. y (N, L, 2H) = [h_t, c_t] on the last axis; the kernels' backward recomputes "
             "the gates, the reference's reads those its forward kept with y (or recomputes them for another array).")
register("gru_sequence", "rnn", accumulates=True, partial_backward=True,
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (3H, in), w_hh (3H, H), b_ih (3H,), b_hh (3H,); gates r, z, n "
             "(b_hn inside the reset gate's product, as torch). y (N, L, H) = every hidden state h_t.")
