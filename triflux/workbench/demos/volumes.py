"""A volumetric segmentation data set generated on the fly: 3-D volumes of
overlapping spheres, boxes and cylinders in noise, with a class label per
voxel (the 3-D counterpart of ``triflux.workbench.demos.shapes``, as a biomedical scan
is of a photograph).

Classes: 0 background, 1 sphere, 2 box, 3 cylinder. Each volume holds a few
solids of random size, position, brightness and class (a cylinder's axis
along one of the three axes at random); later solids cover earlier ones, and
the label map records what is visible. The background is a linear ramp of
random direction and the solids' brightness ranges overlap each other's, and
Gaussian noise is added, so intensity alone does not give the class: the
model has to learn shape in three dimensions.

Everything comes from one NumPy seed, so a data set is reproducible. The
metrics (confusion, IoU, accuracy) are ``triflux.workbench.demos.shapes``'s.
"""
import numpy as np

CLASSES = ("background", "sphere", "box", "cylinder")


def _centre(rng, size):
    return rng.uniform(0.2, 0.8, 3) * size


def _sphere(zyx, rng, size):
    c = _centre(rng, size)
    r = rng.uniform(0.18, 0.3) * size
    return sum((a - ca) ** 2 for a, ca in zip(zyx, c)) <= r * r


def _box(zyx, rng, size):
    c = _centre(rng, size)
    half = rng.uniform(0.16, 0.28, 3) * size
    return np.logical_and.reduce([np.abs(a - ca) <= h for a, ca, h in zip(zyx, c, half)])


def _cylinder(zyx, rng, size):
    """A long round rod along a random axis: a disc in the other two, a length along it."""
    c = _centre(rng, size)
    axis = int(rng.integers(0, 3))
    r, half = rng.uniform(0.1, 0.16) * size, rng.uniform(0.3, 0.45) * size
    across = [k for k in range(3) if k != axis]
    disc = sum((zyx[k] - c[k]) ** 2 for k in across) <= r * r
    return disc & (np.abs(zyx[axis] - c[axis]) <= half)


_DRAW = {1: _sphere, 2: _box, 3: _cylinder}


def make_volumes(n, size=16, seed=0, max_shapes=2, noise=0.1):
    """``n`` volumes ``(n, 1, size, size, size)`` float32 in about [0, 1], and
    labels ``(n, size, size, size)`` int64 in ``range(len(CLASSES))``."""
    rng = np.random.default_rng(seed)
    zyx = tuple(np.mgrid[0:size, 0:size, 0:size].astype(np.float32) + 0.5)
    volumes = np.empty((n, 1, size, size, size), np.float32)
    labels = np.zeros((n, size, size, size), np.int64)
    for k in range(n):
        direction = rng.normal(size=3)
        direction /= np.linalg.norm(direction)
        ramp = sum(d * a for d, a in zip(direction, zyx)) / size              # about -1.7..1.7
        vol = rng.uniform(0.05, 0.35) + rng.uniform(-0.1, 0.1) * ramp
        lab = labels[k]
        for _ in range(rng.integers(1, max_shapes + 1)):
            cls = int(rng.integers(1, len(CLASSES)))
            mask = _DRAW[cls](zyx, rng, size)
            vol[mask] = rng.uniform(0.5, 1.0)
            lab[mask] = cls
        volumes[k, 0] = vol + rng.normal(0.0, noise, vol.shape)
    return volumes, labels
