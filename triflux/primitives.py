"""Declarations of every primitive (see ``triflux.registry`` for the rules).

Adding a primitive here makes the completeness test demand its five parts and
the property suite cross-check them.
"""
from .registry import register


# --- elementwise: unary ---------------------------------------------------------
for _n in ("neg", "exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "gelu",
           "swish", "softplus"):
    register(_n, "elementwise")
register("gelu_erf", "elementwise", doc="the exact GELU x Phi(x) (NNlib's gelu_erf; gelu is the tanh form)")
register("leakyrelu", "elementwise", doc="attrs: negative_slope")
register("elu", "elementwise", doc="attrs: alpha")
register("cast", "elementwise", doc="attrs: dtype (NumPy dtype of the output)")

# --- elementwise: binary and ternary, NumPy broadcasting --------------------------
for _n in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    register(_n, "elementwise")
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(_n, "elementwise", differentiable=False)
register("where", "elementwise", doc="inputs: cond (bool), a, b")

# --- fills (no tensor inputs; attrs: shape, dtype, device, ...) --------------------
register("fill", "fill", differentiable=False, doc="attrs: shape, value, dtype, device")
register("rand_uniform", "fill", differentiable=False, random=True,
         doc="uniform on [0, 1); attrs: shape, dtype, seed, device")
register("rand_normal", "fill", differentiable=False, random=True,
         doc="standard normal; attrs: shape, dtype, seed, device")

# --- reductions ---------------------------------------------------------------------
for _n in ("sum", "mean", "max"):
    register(_n, "reduce", doc="attrs: axis (tuple of non-negative ints, sorted), keepdims")

# --- matrix products ------------------------------------------------------------------
register("matmul", "matmul", partial_backward=True, doc="NumPy matmul semantics: vector, matrix, batched with broadcasting")

# --- softmax family ---------------------------------------------------------------------
register("softmax", "softmax", doc="attrs: axis")
register("logsoftmax", "softmax", doc="attrs: axis")
register("logsumexp", "softmax", doc="attrs: axis, keepdims")

# --- shape and layout -----------------------------------------------------------------
register("reshape", "shape", doc="attrs: shape")
register("transpose", "shape", doc="attrs: axes (a permutation)")
register("getitem", "shape", doc="attrs: index (tuple of int / slice / None)")
register("concat", "shape", doc="variadic inputs; attrs: axis")
register("broadcast_to", "shape", doc="attrs: shape")
register("contiguous", "shape", doc="a dense row-major copy")

# --- optimiser updates (in place, fused: one kernel per rule) -----------------------------
register("descent_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g; attrs: eta")
register("momentum_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, v; attrs: eta, rho")
register("nesterov_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, v; attrs: eta, rho")
register("adam_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, step")
register("adamw_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, m, v; attrs: eta, beta1, beta2, epsilon, lambd, step")
register("rmsprop_update", "optimise", differentiable=False, in_place=True,
         doc="inputs: x, g, s; attrs: eta, rho, epsilon")

# --- convolution (issue 3): NCHW inputs, PyTorch weight layouts ------------------------------
register("conv2d", "conv",
         doc="inputs: x (N, C, H, W), w (O, C/groups, kh, kw); attrs: stride (sh, sw), "
             "padding (top, bottom, left, right), dilation (dh, dw), groups. Cross-correlation, as torch.")
register("conv2d_bias_act", "conv",
         doc="inputs: x (N, C, H, W), w (O, C/groups, kh, kw), b (O,); attrs: stride, padding (top, bottom, "
             "left, right), dilation, groups, activation (one of 'identity', 'relu', 'sigmoid', 'tanh'). "
             "y = act(conv2d(x, w) + b[o]), fused; the backward uses only the output y.")
register("conv_transpose2d", "conv",
         doc="inputs: x (N, C, H, W), w (C, O/groups, kh, kw); attrs: stride, padding (top, bottom, left, "
             "right), output_padding (oh, ow), dilation, groups. The adjoint of conv2d, as torch.")

# --- pooling (issues 3, 12): NCHW, torch's max_pool2d / avg_pool2d / adaptive pools ---------------
register("maxpool2d", "pool", doc="attrs: window (kh, kw), stride (sh, sw), padding (top, bottom, left, right), "
                                  "dilation (dh, dw), ceil_mode. NaN propagates; the gradient goes to the first "
                                  "maximal pixel or the last NaN of each window, as torch")
register("meanpool2d", "pool", doc="attrs: window, stride, padding, ceil_mode, count_include_pad (divide by the "
                                   "taps inside the padded input, or inside the input only), as torch")
register("adaptive_maxpool2d", "pool", doc="attrs: size (Ho, Wo); windows floor(i*H/Ho) <= h < ceil((i+1)*H/Ho)")
register("adaptive_meanpool2d", "pool", doc="attrs: size (Ho, Wo); the windows of adaptive_maxpool2d")

# --- upsampling (issues 3, 12): torch's F.interpolate, nearest and bilinear -------------------------
register("upsample_nearest2d", "upsample", doc="attrs: exactly one of size (Ho, Wo) and scale (sh, sw), "
                                               "positive ints or floats; torch's index rule")
register("upsample_bilinear2d", "upsample", doc="attrs: size or scale as upsample_nearest2d, align_corners")

# --- normalisation (issue 3) -----------------------------------------------------------------
register("batchnorm_train", "norm", doc="inputs: x (N, C, ...), gamma (C,), beta (C,); attrs: eps. "
                                        "Normalises with the batch's mean and biased variance per channel")
register("batchnorm_test", "norm", doc="inputs: x, gamma, beta, mean (C,), var (C,); attrs: eps. "
                                       "Uses the given (running) statistics; no gradient for mean and var")

# --- dropout (issue 3) -------------------------------------------------------------------------
register("dropout", "dropout", random=True, doc="attrs: p, seed. y = x * mask / (1 - p), the mask drawn on the device "
                                   "from the seed (the backward redraws it)")

# --- recurrent sequences (issue 7): batch-first x (N, L, in), PyTorch weight layouts and gate order ------
register("rnn_sequence", "rnn",
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (H, in), w_hh (H, H), b_ih (H,), b_hh (H,); attrs: "
             "activation ('tanh' | 'relu'). y (N, L, H) = every hidden state h_t; BPTT backward.")
register("lstm_sequence", "rnn",
         doc="inputs: x (N, L, in), h0 (N, H), c0 (N, H), w_ih (4H, in), w_hh (4H, H), b_ih (4H,), b_hh (4H,); "
             "gates i, f, g, o. y (N, L, 2H) = [h_t, c_t] on the last axis; the backward recomputes the gates.")
register("gru_sequence", "rnn",
         doc="inputs: x (N, L, in), h0 (N, H), w_ih (3H, in), w_hh (3H, H), b_ih (3H,), b_hh (3H,); gates r, z, n "
             "(b_hn inside the reset gate's product, as torch). y (N, L, H) = every hidden state h_t.")
