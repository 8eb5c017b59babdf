"""The RNN of the blog post "Translating PyTorch models to Flux.jl Part2:
Running on GPU" (2018): predict the next value of a sine wave, trained with
the same code on the CPU and on a GPU.

The post (Flux 0.5, 2018) writes the recurrence by hand:
``context_state = tanh.(cat(input, context_state) * W1)``, ``out = context_state * W2``
with ``input_size, hidden_size, output_size = 7, 6, 1``: the "7" is one input
value concatenated with the 6 hidden values, so ``W1`` (7x6) is exactly an
``RNN(1 => 6)``'s ``weight_ih`` (6x1) and ``weight_hh`` (6x6) side by side, and
``W2`` is a ``Dense(6 => 1)``. On the GPU the post had to swap ``tanh`` for
``CUDAnative.tanh`` (or get "invalid program counter"), and found the GPU 1.8x
slower than the CPU. In triflux the model below runs unchanged on every
device: ``tanh`` is one registered primitive with a NumPy reference and a
Triton kernel, and the whole sequence is one fused primitive (a few kernel
launches per sequence instead of a few per time step).

    python examples/rnn_sine.py                    # the default device
    python examples/rnn_sine.py --device cpu --epochs 300 --out /tmp/sine

It writes its plot, rnn_sine.png, into --out (default examples/output/, which
git ignores) and prints the path.
"""
import argparse
import os
import time

import numpy as np

import triflux as tf
from triflux import losses, optimise
from triflux.workbench.flags import device_from_flag

SEQ_LENGTH = 20
#: where the examples write their files unless told otherwise (ignored by git)
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "output")


def sine_data():
    """x = sin(t_k), y = sin(t_{k+1}) over 21 points of [2, 10], shaped
    (1, 20, 1): one batch-first sequence of one feature."""
    t = np.linspace(2, 10, SEQ_LENGTH + 1)
    data = np.sin(t).astype(np.float32)
    return t, data[:-1].reshape(1, -1, 1), data[1:].reshape(1, -1, 1)


def build_model():
    """``RNN(1 => 6, tanh)`` then ``Dense(6 => 1)``: the post's W1 and W2 (with biases)."""
    return tf.Chain(tf.RNN(1, 6, tf.tanh), tf.Dense(6, 1))


def train(device, epochs=200, lr=0.01, seed=1, say=print):
    """Train on ``device`` with backpropagation through the whole sequence;
    returns (model, losses per epoch, seconds per epoch)."""
    tf.seed(seed)
    _, x, y = sine_data()
    model = device(build_model())
    x, y = device(x), device(y)
    opt = optimise.setup(optimise.Adam(lr), model)
    history = []
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        loss, (g,) = tf.withgradient(lambda m: losses.mse(m(x), y, agg="sum") / 2, model)
        optimise.update(opt, model, g)
        history.append(float(loss))
        if epoch % 50 == 0:
            say(f"epoch {epoch:4d}  loss {history[-1]:.5f}")
    return model, history, (time.perf_counter() - t0) / epochs


def predict(model, device):
    _, x, _ = sine_data()
    return model(device(x)).numpy().reshape(-1)


def plot(path, predictions):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t, x, _ = sine_data()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(t[:-1], x.reshape(-1), label="actual")
    ax.scatter(t[1:], predictions, label="predicted", marker="x")
    ax.set(xlabel="t", ylabel="sin t", title="next-value prediction of a sine wave")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: a functional GPU, else cpu)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--out", default=OUTPUT, help="folder for the plot of predictions (default examples/output/)")
    args = p.parse_args(argv)
    if args.epochs <= 0:
        p.error("--epochs must be positive")
    device = device_from_flag(p, args.device)       # a device that can't be used: a one-line error naming --device
    print(f"device: {device!r}")
    model, history, per_epoch = train(device, epochs=args.epochs)
    print(model)
    print(f"loss {history[0]:.4f} -> {history[-1]:.5f} in {args.epochs} epochs, "
          f"{per_epoch * 1e3:.2f} ms per epoch on {device!r}")
    os.makedirs(args.out, exist_ok=True)
    print(f"wrote {plot(os.path.join(args.out, 'rnn_sine.png'), predict(model, device))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
