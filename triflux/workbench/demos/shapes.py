"""A segmentation data set generated on the fly: images of overlapping
shapes on noisy, varying backgrounds, with a class label per pixel.

Classes: 0 background, 1 disc, 2 rectangle, 3 triangle. Each image holds a
few shapes of random size, position, colour and class; later shapes cover
earlier ones, and the label map records what is visible. Backgrounds are
linear colour gradients of random direction, then Gaussian noise is added,
so colour alone does not give the class: the model has to learn shape.

Everything comes from one NumPy seed, so a data set is reproducible.
"""
import numpy as np

CLASSES = ("background", "disc", "rectangle", "triangle")


def _disc(yy, xx, rng, size):
    cy, cx = rng.uniform(0.15, 0.85, 2) * size
    r = rng.uniform(0.12, 0.25) * size
    return (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r


def _rectangle(yy, xx, rng, size):
    cy, cx = rng.uniform(0.15, 0.85, 2) * size
    hh, hw = rng.uniform(0.08, 0.22, 2) * size
    return (np.abs(yy - cy) <= hh) & (np.abs(xx - cx) <= hw)


def _triangle(yy, xx, rng, size):
    """An upright isosceles triangle: inside the base and both sides."""
    cy, cx = rng.uniform(0.2, 0.8, 2) * size
    h = rng.uniform(0.25, 0.45) * size
    half = rng.uniform(0.5, 0.8) * h
    top, base = cy - h / 2, cy + h / 2
    t = (yy - top) / h                                  # 0 at the apex, 1 at the base
    return (yy <= base) & (t >= 0) & (np.abs(xx - cx) <= t * half)


_DRAW = {1: _disc, 2: _rectangle, 3: _triangle}


def make_shapes(n, size=32, seed=0, max_shapes=4, noise=0.08):
    """``n`` images ``(n, 3, size, size)`` float32 in about [0, 1], and labels
    ``(n, size, size)`` int64 in ``range(len(CLASSES))``."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    images = np.empty((n, 3, size, size), np.float32)
    labels = np.zeros((n, size, size), np.int64)
    for k in range(n):
        angle = rng.uniform(0, 2 * np.pi)
        ramp = (np.cos(angle) * xx + np.sin(angle) * yy) / size           # about -1.4..1.4
        c0, c1 = rng.uniform(0.1, 0.6, 3), rng.uniform(-0.2, 0.2, 3)
        img = c0[:, None, None] + c1[:, None, None] * ramp[None]
        lab = labels[k]
        for _ in range(rng.integers(1, max_shapes + 1)):
            cls = int(rng.integers(1, len(CLASSES)))
            mask = _DRAW[cls](yy, xx, rng, size)
            img[:, mask] = rng.uniform(0.3, 1.0, 3)[:, None]
            lab[mask] = cls
        img += rng.normal(0.0, noise, img.shape)
        images[k] = img
    return images, labels


def split(images, labels, val_fraction=0.2):
    """(train, validation) pairs: the last ``val_fraction`` is held out."""
    n_val = max(1, int(round(len(images) * val_fraction)))
    return (images[:-n_val], labels[:-n_val]), (images[-n_val:], labels[-n_val:])


def confusion(pred, truth, classes=len(CLASSES)):
    """``classes x classes`` counts: rows the true class, columns the predicted."""
    idx = truth.reshape(-1).astype(np.int64) * classes + pred.reshape(-1).astype(np.int64)
    return np.bincount(idx, minlength=classes * classes).reshape(classes, classes)


def class_iou(conf):
    """Per class IoU = TP / (TP + FP + FN); NaN for a class that appears in
    neither the truth nor the prediction."""
    tp = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, tp / union, np.nan)


def mean_iou(conf):
    """Mean of :func:`class_iou` over the classes that appear in the truth or
    the prediction."""
    iou = class_iou(conf)
    present = ~np.isnan(iou)
    return float(np.mean(iou[present])) if present.any() else 1.0


def pixel_accuracy(conf):
    return float(np.trace(conf) / max(conf.sum(), 1))
