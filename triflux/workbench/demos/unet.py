"""Train a UNET to segment generated images (or volumes) of overlapping shapes.

The data (triflux.workbench.demos.shapes) are made on the fly from --seed: discs,
rectangles and triangles of random colours on noisy gradient backgrounds,
with a class per pixel. With --spatial-dims 3 (triflux.workbench.demos.volumes) they
are volumes of spheres, boxes and cylinders in noise, a class per voxel,
segmented by a 3-D UNet. A triflux.models.UNet learns them with Adam on the
default device (a functional GPU, else the CPU reference) or --device.

The learning rate follows a cosine from --lr down to zero over the epochs.
Each epoch shows a progress bar (loss, images/s, device), then the
validation mean IoU and pixel accuracy on a held-out fifth of the data. In
--out (default runs/<timestamp>/) it writes the final model, metrics.csv (per
epoch: training loss, validation mean IoU, pixel accuracy and each class's
IoU), curves.png, predictions.png and a checkpoint per epoch, of which it
keeps the newest --keep-checkpoints (default 3) and the one of best
validation mean IoU. Ctrl-C finishes the current step, saves a checkpoint and
prints how to resume (--resume PATH).
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
from triflux.models import UNet
from ..flags import device_from_flag, interpreter_notice
from . import shapes, volumes
from .shapes import class_iou, confusion, make_shapes, mean_iou, pixel_accuracy, split
from .volumes import make_volumes

DEFAULTS = dict(epochs=15, batch_size=16, image_size=32, samples=1000, seed=0, depth=3, base_channels=16, lr=3e-3,
                spatial_dims=2)
#: what --spatial-dims 3 changes: volumes of 16^3, a narrower UNet (its convolutions cost 3x3x3 taps)
DEFAULTS_3D = dict(epochs=16, batch_size=8, image_size=16, samples=400, depth=3, base_channels=8, lr=3e-3)
#: the generated data set's module (its CLASSES) by spatial rank
DATA = {2: shapes, 3: volumes}
CHECKPOINT_FORMAT = "triflux-demo-unet-checkpoint/2"
#: epoch checkpoints kept besides the best one, unless --keep-checkpoints says otherwise
KEEP_CHECKPOINTS = 3
CLASSES = shapes.CLASSES


def metric_names(classes=CLASSES):
    """metrics.csv's columns for a data set of ``classes``."""
    return ["epoch", "train_loss", "val_mean_iou", "val_pixel_accuracy", *(f"val_iou_{c}" for c in classes),
            "images_per_s", "seconds"]


METRICS = metric_names()
#: the running sums of an epoch before its first step
NO_PROGRESS = {"loss_sum": 0.0, "images": 0, "seconds": 0.0}


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m triflux demo unet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: a functional GPU, else cpu)")
    p.add_argument("--spatial-dims", type=int, choices=(2, 3), default=None,
                   help="2: images (default); 3: volumes and a 3-D UNet, with the defaults "
                        + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in DEFAULTS_3D.items()))
    p.add_argument("--epochs", type=int, default=None, help=f"total epochs (default {DEFAULTS['epochs']})")
    p.add_argument("--batch-size", type=int, default=None, help=f"default {DEFAULTS['batch_size']}")
    p.add_argument("--image-size", type=int, default=None,
                   help=f"side of the square images (cubic volumes), divisible by 2^depth "
                        f"(default {DEFAULTS['image_size']})")
    p.add_argument("--samples", type=int, default=None,
                   help=f"images in the data set, a fifth held out (default {DEFAULTS['samples']})")
    p.add_argument("--depth", type=int, default=None, help=f"UNet levels (default {DEFAULTS['depth']})")
    p.add_argument("--base-channels", type=int, default=None, help=f"default {DEFAULTS['base_channels']}")
    p.add_argument("--lr", type=float, default=None, help=f"Adam's learning rate (default {DEFAULTS['lr']})")
    p.add_argument("--seed", type=int, default=None, help="seeds the data, the weights and the shuffling")
    p.add_argument("--out", default=None, help="output folder (default runs/<timestamp>/)")
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint file")
    p.add_argument("--keep-checkpoints", type=_keep_count, default=KEEP_CHECKPOINTS, metavar="N|all",
                   help=f"keep the epoch checkpoints of the N newest epochs and of the best one by validation "
                        f"mean IoU (default {KEEP_CHECKPOINTS}); 'all' keeps every epoch's")
    p.add_argument("--quiet", action="store_true", help="no progress bars; only the last lines")
    return p


def _keep_count(text):
    """--keep-checkpoints: a positive count, or None for 'all'."""
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'all', got {text!r}")
    return n


def _config(p, args, saved):
    """The run's settings: a checkpoint's when resuming (the command line may
    only raise --epochs and change the device, batch size stays), else the
    command line's over the defaults. Errors exit with status 2."""
    cfg = dict(DEFAULTS)
    if saved is not None:
        cfg.update(saved)
        fixed = ("image_size", "samples", "seed", "depth", "base_channels", "batch_size", "lr", "spatial_dims")
        for k in fixed:
            given = getattr(args, k)
            if given is not None and given != saved.get(k, DEFAULTS[k]):
                p.error(f"--{k.replace('_', '-')} {given} differs from the checkpoint's {saved.get(k, DEFAULTS[k])}; "
                        "a resumed run keeps its settings")
    elif args.spatial_dims == 3:
        cfg.update(DEFAULTS_3D, spatial_dims=3)
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


def evaluate(model, device, images, labels, batch=64, classes=CLASSES):
    """(validation scores, predictions) on held-out data, in test mode: the
    scores are metrics.csv's ``val_*`` columns, rounded to 6 digits (a class
    absent from both truth and prediction has IoU NaN)."""
    preds = []
    for i in range(0, len(images), batch):
        logits = model(device(images[i: i + batch]))
        preds.append(np.argmax(logits.numpy(), axis=1))
    pred = np.concatenate(preds)
    conf = confusion(pred, labels)
    scores = {"val_mean_iou": mean_iou(conf), "val_pixel_accuracy": pixel_accuracy(conf)}
    scores.update((f"val_iou_{c}", float(v)) for c, v in zip(classes, class_iou(conf)))
    return {k: round(v, 6) for k, v in scores.items()}, pred


def checkpoint_name(epoch):
    return f"checkpoint-epoch{epoch:03d}.safetensors"


def interrupted_name(epoch):
    return f"interrupted-epoch{epoch:03d}.safetensors"


def best_epoch(history):
    """The epoch of highest validation mean IoU (the first of equals)."""
    return max(history, key=lambda h: h["val_mean_iou"])["epoch"]


def prune_checkpoints(out, history, keep):
    """Delete from ``out`` the epoch checkpoints of ``history`` other than
    the ``keep`` newest and the :func:`best_epoch`'s, and the interrupted
    checkpoints of finished epochs (``keep=None`` deletes nothing). Returns
    the epochs whose checkpoints stay."""
    epochs = [h["epoch"] for h in history]
    if keep is None:
        return epochs
    kept = sorted(set(epochs[-keep:]) | {best_epoch(history)})
    for e in epochs:
        for name in [interrupted_name(e)] + ([] if e in kept else [checkpoint_name(e)]):
            try:
                os.remove(os.path.join(out, name))
            except FileNotFoundError:
                pass
    return kept


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def mid_slices(images, labels, pred):
    """The middle slice (along the first spatial axis) of volumes ``(n, C, D,
    H, W)`` and of their label maps ``(n, D, H, W)``: what a figure shows of
    a volume."""
    mid = images.shape[2] // 2
    return images[:, :, mid], labels[:, mid], pred[:, mid]


def prediction_figure(images, labels, pred, classes=CLASSES):
    """Input, truth and prediction of the first (up to) four images (of
    volumes: their middle slices, :func:`mid_slices`), with a legend naming
    the class of each colour."""
    plt = _pyplot()
    from matplotlib.patches import Patch
    volume = images.ndim == 5
    if volume:
        images, labels, pred = mid_slices(images, labels, pred)
    cmap, last = plt.get_cmap("viridis"), len(classes) - 1
    k = min(4, len(images))
    fig, ax = plt.subplots(3, k, figsize=(2.2 * k, 7.0), squeeze=False)
    for j in range(k):
        picture = images[j].transpose(1, 2, 0)
        ax[0, j].imshow(np.clip(picture[..., 0] if picture.shape[-1] == 1 else picture, 0, 1),
                        cmap="gray" if picture.shape[-1] == 1 else None, vmin=0, vmax=1, interpolation="nearest")
        for row, cls in ((1, labels[j]), (2, pred[j])):
            ax[row, j].imshow(cls, vmin=0, vmax=last, cmap=cmap, interpolation="nearest")
        for row, title in enumerate(("input", "truth", "prediction")):
            ax[row, j].set_axis_off()
            if j == 0:
                ax[row, j].set_title(title + (" (middle slice)" if volume and row == 0 else ""), loc="left")
    fig.legend(handles=[Patch(color=cmap(i / last), label=c) for i, c in enumerate(classes)],
               loc="lower center", ncol=2 if k < 3 else len(classes), frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def save_plots(out, history, images, labels, pred, classes=CLASSES):
    """curves.png (loss and IoU per epoch) and predictions.png
    (:func:`prediction_figure` of a few validation images)."""
    plt = _pyplot()
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
    fig = prediction_figure(images, labels, pred, classes)
    preds = os.path.join(out, "predictions.png")
    fig.savefig(preds, dpi=100)
    plt.close(fig)
    return curves, preds


def _write_metrics(out, history, classes=CLASSES):
    path = os.path.join(out, "metrics.csv")
    tmp = path + ".tmp"
    fields = metric_names(classes)
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
            p.error(f"--resume {args.resume}: not a checkpoint of this version of the demo "
                    f"(format {saved.get('format') if isinstance(saved, dict) else None!r}, "
                    f"expected {CHECKPOINT_FORMAT!r})")
    cfg = _config(p, args, saved["config"] if saved else None)
    device = device_from_flag(p, args.device)
    if args.out is not None:
        out = args.out
    elif saved is not None:
        out = os.path.dirname(os.path.abspath(args.resume))
    else:
        out = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    out = _writable_folder(p, out)
    say = (lambda *a: None) if args.quiet else print
    interpreter_notice(device)

    # --- data, model, optimiser ---------------------------------------------------------------
    dims = cfg.get("spatial_dims", 2)
    classes = DATA[dims].CLASSES
    make = make_shapes if dims == 2 else make_volumes
    images, labels = make(cfg["samples"], cfg["image_size"], seed=cfg["seed"])
    (xtr, ytr), (xva, yva) = split(images, labels)
    onehot = np.moveaxis(np.eye(len(classes), dtype=np.float32)[ytr], -1, 1)     # (N, classes, *spatial)
    tf.seed(cfg["seed"])
    model = device(UNet(images.shape[1], len(classes), depth=cfg["depth"], base_channels=cfg["base_channels"],
                        spatial_dims=dims))
    opt = optimise.setup(optimise.Adam(cfg["lr"]), model)
    loader = device(tf.DataLoader((xtr, np.ascontiguousarray(onehot)), batchsize=cfg["batch_size"],
                                  shuffle=True, rng=cfg["seed"]))
    history, start_epoch, skip_steps, progress = [], 1, 0, NO_PROGRESS
    if saved is not None:
        tf.loadmodel(model, saved["model"])
        tf.loadmodel(opt, saved["optimiser"])
        history = list(saved["history"])
        start_epoch, skip_steps = int(saved["epoch"]), int(saved["steps_done"])
        progress = saved["progress"]
        loader.rng.bit_generator.state = saved["loader_rng"]
        say(f"resumed from {args.resume}: epoch {start_epoch}, {skip_steps} steps done")

    what, side = ("images", "x".join([str(cfg["image_size"])] * 2)) if dims == 2 else \
        ("volumes", "x".join([str(cfg["image_size"])] * 3))
    say(f"triflux {tf.__version__}: {'3-D ' if dims == 3 else ''}UNet segmentation of {len(classes)} classes "
        f"({', '.join(classes)}) on {device!r}")
    say(f"data: {len(xtr)} training and {len(xva)} validation {what} of {side}; "
        f"model: UNet(depth={cfg['depth']}, base_channels={cfg['base_channels']}"
        f"{', spatial_dims=3' if dims == 3 else ''}), "
        f"{sum(int(np.prod(t.shape)) for t in tf.functor.leaves(model)):,} numbers")

    def checkpoint(epoch, steps_done, rng_state, progress, name):
        """``progress``: the running loss sum, images and seconds of the
        epoch's ``steps_done`` steps, so a resumed epoch logs what an
        uninterrupted one would."""
        path = os.path.join(out, name)
        tf.save(path, {"format": CHECKPOINT_FORMAT, "config": cfg, "epoch": epoch, "steps_done": steps_done,
                       "progress": progress, "loader_rng": rng_state, "history": history,
                       "model": tf.state(model), "optimiser": tf.state(opt)})
        return path

    def loss_fn(m, x, y):
        return losses.logitcrossentropy(m(x), y, dims=1)

    # train's step (gradient, checks, update), replayed on a GPU after two recorded steps per batch shape
    train_step = tf.capture_step(loss_fn, model, opt)
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
            total, n, earlier = progress["loss_sum"], progress["images"], progress["seconds"]
            t0 = time.perf_counter() - earlier
            bar = tqdm(total=len(loader), desc=f"epoch {epoch}/{cfg['epochs']}", disable=args.quiet,
                       unit="batch", leave=True, file=sys.stdout, dynamic_ncols=True)
            for step, (x, y) in enumerate(loader):
                if step < skip_steps:
                    bar.update(1)
                    continue
                total += train_step(x, y) * x.shape[0]
                n += x.shape[0]
                rate = n / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{total / n:.4f}", img_s=f"{rate:.1f}", device=repr(device).split(" ")[0])
                bar.update(1)
                if interrupted["flag"]:
                    bar.close()
                    progress = {"loss_sum": total, "images": n, "seconds": time.perf_counter() - t0}
                    path = checkpoint(epoch, step + 1, rng_state, progress, interrupted_name(epoch))
                    print(f"interrupted: saved {path}\nresume with: python -m triflux demo unet --resume {path}",
                          file=sys.stderr)
                    return 130
            bar.close()
            skip_steps, progress = 0, NO_PROGRESS
            seconds = time.perf_counter() - t0
            scores, _ = evaluate(model, device, xva, yva, classes=classes)
            history.append(dict(epoch=epoch, train_loss=round(total / max(n, 1), 6), **scores,
                                images_per_s=round(n / seconds, 2), seconds=round(seconds, 3)))
            say(f"epoch {epoch}: loss {total / max(n, 1):.4f}  validation mean IoU {scores['val_mean_iou']:.3f}  "
                f"pixel accuracy {scores['val_pixel_accuracy']:.3f}  ({n / seconds:.1f} images/s)")
            checkpoint(epoch + 1, 0, loader.rng.bit_generator.state, progress, checkpoint_name(epoch))
            _write_metrics(out, history, classes)
            prune_checkpoints(out, history, args.keep_checkpoints)
    finally:
        signal.signal(signal.SIGINT, previous)

    scores, pred = evaluate(model, device, xva, yva, classes=classes)
    model_path = os.path.join(out, "model.safetensors")
    tf.save(model_path, model)
    metrics = _write_metrics(out, history, classes)
    kept = prune_checkpoints(out, history, args.keep_checkpoints)
    curves, preds = save_plots(out, history, xva, yva, pred, classes)
    print(f"final validation mean IoU {scores['val_mean_iou']:.3f}, "
          f"pixel accuracy {scores['val_pixel_accuracy']:.3f} ({device!r})")
    print(f"model:       {model_path}")
    which = ("every epoch's" if args.keep_checkpoints is None else
             f"the newest {args.keep_checkpoints} and the best by validation mean IoU (epoch {best_epoch(history)})")
    print(f"checkpoints: {os.path.join(out, 'checkpoint-epoch*.safetensors')}, epochs "
          f"{', '.join(map(str, kept))}: {which}")
    print(f"metrics:     {metrics}")
    print(f"plots:       {curves}, {preds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
