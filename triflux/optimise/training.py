"""Flux's training loop: ``train`` (one epoch), ``train_step`` (one step,
all or nothing) and ``capture_step`` (the step recorded once and replayed).

::

    train(lambda m, x, y: mse(m(x), y), model, loader, opt_state)   # one epoch
"""
import contextlib
import math
import warnings
from functools import partial

import numpy as np

from ..autodiff import LEFT_THE_TAPE, differentiate
from ..capture import CapturedStep, eager_phase
from ..errors import GradientError, NonFiniteError
from ..functor import holds_arrays
from ..modes import all_or_nothing
from ..tensor import as_tensor
from .interface import apply_update, prepare_update, update
from .mixed_precision import MixedPrecisionState
from .rules import Rule
from .tree import trainables

def _learns_nothing(model, batch):
    """The message for a loss with no gradient for any trainable parameter of ``model``."""
    if not trainables(model):
        return (f"train: the model has no trainable parameters (floating-point Tensors outside a layer's "
                f"non-trainable state), so there is nothing to train; got a {type(model).__name__}")
    return (f"train: the loss on batch {batch} (0-based) does not depend on any trainable parameter of the model: "
            f"every gradient is None, so training would learn nothing (the model was not updated). "
            + LEFT_THE_TAPE)


@contextlib.contextmanager
def _naming_what_cannot_learn(model, index):
    """A GradientError inside becomes train's message when the model has no
    trainable parameter at all (nothing to differentiate)."""
    try:
        yield
    except GradientError:
        if not trainables(model):
            raise GradientError(_learns_nothing(model, index)) from None
        raise


def train(loss, model, data, opt_state, *, progress=False, capture=False):
    """One epoch (Flux's ``train!``): for each ``batch`` in ``data``, compute
    ``loss(model, *batch)`` (a tuple batch is splatted; anything else is
    passed whole, ``loss(model, batch)``) and its gradient with respect to
    ``model``, then ``update(opt_state, model, grad)``. With a
    ``MixedPrecision`` state the scaled loss ``opt_state.scale(loss(...))``
    is differentiated (and the unscaled value reported); a step whose
    gradients overflow is skipped by ``update``.

    Each step is all or nothing: a step that raises leaves the model (its
    running statistics included) and ``opt_state`` exactly as they were. A
    NaN or Inf loss stops training with ``NonFiniteError`` naming the batch
    before that batch updates anything, as Flux does; a loss that does not
    depend on any trainable parameter (every gradient None: it went through
    ``.numpy()`` or ``float(...)``, say) stops it with ``GradientError``.
    ``progress=True``
    shows a tqdm bar when tqdm is installed. ``capture=True`` records the
    step on the first two batches of each shape and replays its kernel
    launches after (:func:`capture_step`; on a GPU, a step's host cost
    without the Python per launch; the same results). Returns the list of
    losses (as Python floats), one per batch."""
    if isinstance(opt_state, Rule):
        raise TypeError(f"train(loss, model, data, opt_state): pass `setup({opt_state!r}, model)`, "
                        "not the rule itself (Flux's `opt_state = Flux.setup(rule, model)`)")
    it = data
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            warnings.warn("train(progress=True) needs the `tqdm` package; training without a progress bar",
                          stacklevel=2)
        else:
            it = tqdm(data, desc="train", leave=False)
    step = capture_step(loss, model, opt_state, name="train").run if capture else \
        partial(train_step, loss, model, opt_state)
    losses = []
    for i, batch in enumerate(it):
        v = step(batch, i)
        losses.append(v)
        if progress and hasattr(it, "set_postfix"):
            it.set_postfix(loss=f"{v:.4g}")
    return losses


def capture_step(loss, model, opt_state, *, name="capture_step"):
    """:func:`train`'s step, recorded on its first two calls and replayed
    after (:class:`triflux.capture.CapturedStep`): ``step = capture_step(loss,
    model, opt_state)``, then ``step(x, y)`` per batch returns the loss as a
    float, as one step of ``train`` would, with the same checks and the
    same all-or-nothing guarantee. On a GPU the replay repeats the recorded
    kernel launches without the Python that made them; on the CPU (or for a
    step that cannot be replayed, with a warning saying why) it runs
    eagerly. ``train(..., capture=True)`` uses one for the epoch."""
    if isinstance(opt_state, Rule):
        raise TypeError(f"{name}(loss, model, opt_state): pass `setup({opt_state!r}, model)`, not the rule itself")
    return CapturedStep(partial(train_step, loss, model, opt_state), (model, opt_state), name=name)


def train_step(loss, model, opt_state, batch, index=0, phase=eager_phase):
    """One step of :func:`train` on ``batch`` (number ``index`` of the
    epoch, for messages): the loss and its gradient, the checks, the update,
    all or nothing. Returns the loss as a Python float. The device work is
    in two phases, ``phase("gradient", ...)`` and ``phase("update", ...)``,
    which ``triflux.capture`` records and replays."""
    # the gradient is the model's only (as Flux's train!): none is computed for the data
    args = tuple(as_tensor(a) if isinstance(a, np.ndarray) else a
                 for a in (batch if isinstance(batch, tuple) else (batch,)))
    with all_or_nothing(), _naming_what_cannot_learn(model, index):   # a step that raises leaves the running statistics too as they were
        if isinstance(opt_state, MixedPrecisionState):   # differentiate the scaled loss; report the loss itself
            scale = opt_state.loss_scale
            value, grads, _ = phase("gradient", differentiate,
                                    lambda m: opt_state.scale(loss(m, *args)), (model,), "train")
            v = float(value.item()) / scale
        else:
            value, grads, _ = phase("gradient", differentiate, lambda m: loss(m, *args), (model,), "train")
            v = float(value.item())
        if not math.isfinite(v):
            raise NonFiniteError(
                f"train: the loss is {v} on batch {index} (0-based), stopping training; the model was not "
                "updated with this batch. Check the data for NaN/Inf, lower the learning rate, or use a "
                "stabler loss (e.g. logitcrossentropy on logits instead of crossentropy on softmax).")
        if not holds_arrays(grads[0]):
            raise GradientError(_learns_nothing(model, index))
        if isinstance(opt_state, MixedPrecisionState):
            phase("update", update, opt_state, model, grads[0])
        else:
            apply_update(phase("update", prepare_update, opt_state, model, grads[0]))
    return v
