"""Train a UNET to segment generated images of overlapping shapes.

The data (triflux.demos.shapes) are made on the fly from --seed: discs,
rectangles and triangles of random colours on noisy gradient backgrounds,
with a class per pixel. A triflux.models.UNet learns them with Adam on the
default device (a functional GPU, else the CPU reference) or --device.

The learning rate follows a cosine from --lr down to zero over the epochs.
Each epoch shows a progress bar (loss, images/s, device), then the
validation mean IoU and pixel accuracy on a held-out fifth of the data. In
--out (default runs/<timestamp>/) it writes a checkpoint per epoch, the final
model, metrics.csv, curves.png and predictions.png. Ctrl-C finishes the
current step, saves a checkpoint and prints how to resume (--resume PATH).
"""
import argparse
import csv
import math
import os
import signal
import sys
import time

import numpy as np

import triflux as tf
from triflux import losses, optimise
from triflux.devices import as_device
from triflux.models import UNet
from .shapes import CLASSES, confusion, make_shapes, mean_iou, pixel_accuracy, split

DEFAULTS = dict(epochs=15, batch_size=16, image_size=32, samples=1000, seed=0, depth=3, base_channels=16, lr=3e-3)
CHECKPOINT_FORMAT = "triflux-demo-unet-checkpoint"


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m triflux demo unet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: a functional GPU, else cpu)")
    p.add_argument("--epochs", type=int, default=None, help=f"total epochs (default {DEFAULTS['epochs']})")
    p.add_argument("--batch-size", type=int, default=None, help=f"default {DEFAULTS['batch_size']}")
    p.add_argument("--image-size", type=int, default=None,
                   help=f"side of the square images, divisible by 2^depth (default {DEFAULTS['image_size']})")
    p.add_argument("--samples", type=int, default=None,
                   help=f"images in the data set, a fifth held out (default {DEFAULTS['samples']})")
    p.add_argument("--depth", type=int, default=None, help=f"UNet levels (default {DEFAULTS['depth']})")
    p.add_argument("--base-channels", type=int, default=None, help=f"default {DEFAULTS['base_channels']}")
    p.add_argument("--lr", type=float, default=None, help=f"Adam's learning rate (default {DEFAULTS['lr']})")
    p.add_argument("--seed", type=int, default=None, help="seeds the data, the weights and the shuffling")
    p.add_argument("--out", default=None, help="output folder (default runs/<timestamp>/)")
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint file")
    p.add_argument("--quiet", action="store_true", help="no progress bars; only the last lines")
    return p


def _config(p, args, saved):
    """The run's settings: a checkpoint's when resuming (the command line may
    only raise --epochs and change the device, batch size stays), else the
    command line's over the defaults. Errors exit with status 2."""
    cfg = dict(DEFAULTS)
    if saved is not None:
        cfg.update(saved)
        fixed = ("image_size", "samples", "seed", "depth", "base_channels", "batch_size", "lr")
        for k in fixed:
            given = getattr(args, k)
            if given is not None and given != saved[k]:
                p.error(f"--{k.replace('_', '-')} {given} differs from the checkpoint's {saved[k]}; "
                        "a resumed run keeps its settings")
    for k in DEFAULTS:
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    for k in ("epochs", "batch_size", "image_size", "samples", "depth", "base_channels"):
        if cfg[k] <= 0:
            p.error(f"--{k.replace('_', '-')} must be positive, got {cfg[k]}")
    if cfg["lr"] <= 0:
        p.error(f"--lr must be positive, got {cfg['lr']}")
    if cfg["image_size"] % 2 ** cfg["depth"]:
        p.error(f"--image-size {cfg['image_size']} must be divisible by 2^depth = {2 ** cfg['depth']}")
    if cfg["samples"] < 5:
        p.error("--samples must be at least 5 (a fifth is held out for validation)")
    return cfg


def _writable_folder(p, path):
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        p.error(f"--out {path}: cannot write there ({e.strerror or e})")
    return path


def learning_rate(cfg, epoch):
    """Cosine decay: ``lr * (1 + cos(pi * (epoch - 1) / epochs)) / 2``."""
    return cfg["lr"] * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / cfg["epochs"]))


def evaluate(model, device, images, labels, batch=64):
    """(mean IoU, pixel accuracy, predictions) on held-out data, in test mode."""
    preds = []
    for i in range(0, len(images), batch):
        logits = model(device(images[i: i + batch]))
        preds.append(np.argmax(logits.numpy(), axis=1))
    pred = np.concatenate(preds)
    conf = confusion(pred, labels)
    return mean_iou(conf), pixel_accuracy(conf), pred


def save_plots(out, history, images, labels, pred):
    """curves.png (loss and IoU per epoch) and predictions.png (input, truth,
    prediction for a few validation images)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(ep, [h["train_loss"] for h in history], marker="o")
    ax[0].set(xlabel="epoch", ylabel="training loss", title="loss")
    ax[1].plot(ep, [h["val_mean_iou"] for h in history], marker="o", label="mean IoU")
    ax[1].plot(ep, [h["val_pixel_accuracy"] for h in history], marker="s", label="pixel accuracy")
    ax[1].set(xlabel="epoch", ylim=(0, 1), title="validation")
    ax[1].legend()
    fig.tight_layout()
    curves = os.path.join(out, "curves.png")
    fig.savefig(curves, dpi=100)
    plt.close(fig)
    k = min(4, len(images))
    fig, ax = plt.subplots(3, k, figsize=(2.2 * k, 6.6), squeeze=False)
    for j in range(k):
        for row, (img, title) in enumerate(((np.clip(images[j].transpose(1, 2, 0), 0, 1), "input"),
                                            (labels[j], "truth"), (pred[j], "prediction"))):
            ax[row, j].imshow(img, vmin=0, vmax=3, cmap=None if row == 0 else "viridis", interpolation="nearest")
            ax[row, j].set_axis_off()
            if j == 0:
                ax[row, j].set_title(title, loc="left")
    fig.tight_layout()
    preds = os.path.join(out, "predictions.png")
    fig.savefig(preds, dpi=100)
    plt.close(fig)
    return curves, preds


def _write_metrics(out, history):
    path = os.path.join(out, "metrics.csv")
    fields = ["epoch", "train_loss", "val_mean_iou", "val_pixel_accuracy", "images_per_s", "seconds"]
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for h in history:
            w.writerow({k: h[k] for k in fields})
    os.replace(tmp, path)
    return path


def main(argv=None):
    p = parse(argv)
    args = p.parse_args(argv)

    # --- everything is checked before any work starts ---------------------------------------
    saved = None
    if args.resume is not None:
        try:
            saved = tf.load(args.resume)
        except (tf.TrifluxError, OSError) as e:
            p.error(f"--resume: {e}")
        if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
            p.error(f"--resume {args.resume}: not a checkpoint of this demo")
    cfg = _config(p, args, saved["config"] if saved else None)
    try:
        device = tf.get_device() if args.device is None else as_device(args.device)
    except (tf.TrifluxError, ValueError) as e:
        p.error(f"--device {args.device}: {e}")
    if args.out is not None:
        out = args.out
    elif saved is not None:
        out = os.path.dirname(os.path.abspath(args.resume))
    else:
        out = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    out = _writable_folder(p, out)
    say = (lambda *a: None) if args.quiet else print

    # --- data, model, optimiser ---------------------------------------------------------------
    images, labels = make_shapes(cfg["samples"], cfg["image_size"], seed=cfg["seed"])
    (xtr, ytr), (xva, yva) = split(images, labels)
    onehot = np.eye(len(CLASSES), dtype=np.float32)[ytr].transpose(0, 3, 1, 2)
    tf.seed(cfg["seed"])
    model = device(UNet(3, len(CLASSES), depth=cfg["depth"], base_channels=cfg["base_channels"]))
    opt = optimise.setup(optimise.Adam(cfg["lr"]), model)
    loader = device(tf.DataLoader((xtr, np.ascontiguousarray(onehot)), batchsize=cfg["batch_size"],
                                  shuffle=True, rng=cfg["seed"]))
    history, start_epoch, skip_steps = [], 1, 0
    if saved is not None:
        tf.loadmodel(model, saved["model"])
        tf.loadmodel(opt, saved["optimiser"])
        history = list(saved["history"])
        start_epoch, skip_steps = int(saved["epoch"]), int(saved["steps_done"])
        loader.rng.bit_generator.state = saved["loader_rng"]
        say(f"resumed from {args.resume}: epoch {start_epoch}, {skip_steps} steps done")

    say(f"triflux {tf.__version__}: UNet segmentation of {len(CLASSES)} classes "
        f"({', '.join(CLASSES)}) on {device!r}")
    say(f"data: {len(xtr)} training and {len(xva)} validation images of {cfg['image_size']}x{cfg['image_size']}; "
        f"model: UNet(depth={cfg['depth']}, base_channels={cfg['base_channels']}), "
        f"{sum(int(np.prod(t.shape)) for t in tf.functor.leaves(model)):,} numbers")

    def checkpoint(epoch, steps_done, rng_state, name):
        path = os.path.join(out, name)
        tf.save(path, {"format": CHECKPOINT_FORMAT, "config": cfg, "epoch": epoch, "steps_done": steps_done,
                       "loader_rng": rng_state, "history": history, "model": tf.state(model),
                       "optimiser": tf.state(opt)})
        return path

    def loss_fn(m, x, y):
        return losses.logitcrossentropy(m(x), y, dims=1)

    interrupted = {"flag": False}

    def on_sigint(signum, frame):
        if interrupted["flag"]:
            raise KeyboardInterrupt
        interrupted["flag"] = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        from tqdm import tqdm
        for epoch in range(start_epoch, cfg["epochs"] + 1):
            optimise.adjust(opt, learning_rate(cfg, epoch))
            rng_state = loader.rng.bit_generator.state      # replays this epoch's order on resume
            total = n = 0
            t0 = time.perf_counter()
            bar = tqdm(total=len(loader), desc=f"epoch {epoch}/{cfg['epochs']}", disable=args.quiet,
                       unit="batch", leave=True, file=sys.stdout, dynamic_ncols=True)
            for step, (x, y) in enumerate(loader):
                if step < skip_steps:
                    bar.update(1)
                    continue
                value, (g, *_) = tf.withgradient(loss_fn, model, x, y)
                optimise.update(opt, model, g)
                total += float(value) * x.shape[0]
                n += x.shape[0]
                rate = n / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{total / n:.4f}", img_s=f"{rate:.1f}", device=repr(device).split(" ")[0])
                bar.update(1)
                if interrupted["flag"]:
                    bar.close()
                    path = checkpoint(epoch, step + 1, rng_state, f"interrupted-epoch{epoch:03d}.safetensors")
                    print(f"interrupted: saved {path}\nresume with: python -m triflux demo unet --resume {path}",
                          file=sys.stderr)
                    return 130
            bar.close()
            skip_steps = 0
            seconds = time.perf_counter() - t0
            miou, acc, _ = evaluate(model, device, xva, yva)
            history.append(dict(epoch=epoch, train_loss=round(total / max(n, 1), 6), val_mean_iou=round(miou, 6),
                                val_pixel_accuracy=round(acc, 6), images_per_s=round(n / seconds, 2),
                                seconds=round(seconds, 3)))
            say(f"epoch {epoch}: loss {total / max(n, 1):.4f}  validation mean IoU {miou:.3f}  "
                f"pixel accuracy {acc:.3f}  ({n / seconds:.1f} images/s)")
            checkpoint(epoch + 1, 0, loader.rng.bit_generator.state, f"checkpoint-epoch{epoch:03d}.safetensors")
            _write_metrics(out, history)
    finally:
        signal.signal(signal.SIGINT, previous)

    miou, acc, pred = evaluate(model, device, xva, yva)
    model_path = os.path.join(out, "model.safetensors")
    tf.save(model_path, model)
    metrics = _write_metrics(out, history)
    curves, preds = save_plots(out, history, xva, yva, pred)
    print(f"final validation mean IoU {miou:.3f}, pixel accuracy {acc:.3f} ({device!r})")
    print(f"model:       {model_path}")
    print(f"checkpoints: {os.path.join(out, 'checkpoint-epoch*.safetensors')}")
    print(f"metrics:     {metrics}")
    print(f"plots:       {curves}, {preds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
