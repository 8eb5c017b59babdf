"""A small classifier: Chain/Dense/Adam on scikit-learn's handwritten digits.

The data ship inside scikit-learn (1797 8x8 images, 10 classes): nothing is
downloaded. It trains on the default device (a functional GPU, else the CPU
reference), or the one given with ``--device``.
"""
import argparse
import sys
import time

import numpy as np

import triflux as tf
from triflux import losses, optimise
from ..flags import device_from_flag, interpreter_notice


def load_digits_split(seed=0, test_fraction=0.2):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("the mlp demo needs scikit-learn for its data set: `pip install scikit-learn`")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)            # (N, 64), batch first
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m triflux demo mlp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: a functional GPU, else cpu)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "hidden"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")

    device = device_from_flag(p, args.device)
    interpreter_notice(device)
    tf.seed(args.seed)
    (xtr, ytr), (xte, yte) = load_digits_split(args.seed)
    classes = 10
    model = device(tf.Chain(tf.Dense(64, args.hidden, tf.relu),
                            tf.Dense(args.hidden, args.hidden, tf.relu),
                            tf.Dense(args.hidden, classes)))
    opt = optimise.setup(optimise.Adam(args.lr), model)
    loader = device(tf.DataLoader((xtr, losses.onehotbatch(ytr, range(classes))), batchsize=args.batch_size,
                                  shuffle=True, rng=args.seed))
    say = (lambda *a: None) if args.quiet else print
    say(f"triflux {tf.__version__}: digits classifier on {device!r}")
    say(model)

    def loss_fn(m, x, y):
        return losses.logitcrossentropy(m(x), y)

    def accuracy(x, y):
        logits = model(device(x))
        return float(np.mean(losses.onecold(logits) == y))

    # train's step (gradient, checks, update), replayed on a GPU after two recorded steps per batch shape
    step = tf.capture_step(loss_fn, model, opt)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total, n = 0.0, 0
        for x, y in loader:
            loss = step(x, y)
            total += loss * x.shape[0]
            n += x.shape[0]
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            say(f"epoch {epoch:3d}  loss {total / n:.4f}  train acc {accuracy(xtr, ytr):.3f}  "
                f"test acc {accuracy(xte, yte):.3f}  ({time.perf_counter() - t0:.1f} s)")
    acc = accuracy(xte, yte)
    print(f"final test accuracy: {acc:.3f} on {len(yte)} held-out digits ({device!r}, "
          f"{time.perf_counter() - t0:.1f} s)")
    return 0
