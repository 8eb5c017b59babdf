"""`python -m triflux demo unet` end to end on a tiny configuration: the
files it writes, its metrics, checkpoint retention, resuming (exactly, also
from the middle of an epoch), Ctrl-C, and argument errors (one line,
status 2, before any work)."""
import csv
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from .helpers import ROOT, run_python

TINY = ["--device", "cpu", "--samples", "40", "--image-size", "16", "--depth", "2", "--base-channels", "4",
        "--batch-size", "8"]


def run_demo(*args, timeout=300):
    return run_python(f"import sys; from triflux.__main__ import main; sys.exit(main(['demo', 'unet', *{list(args)!r}]))",
                      timeout=timeout, unset=("TRITON_INTERPRET",),
                      env={"CUDA_VISIBLE_DEVICES": "-1", "COLUMNS": "250"})   # a wide "terminal": the whole bar


def read_metrics(folder):
    with open(os.path.join(folder, "metrics.csv")) as f:
        return list(csv.DictReader(f))


#: metrics.csv's columns
COLUMNS = ["epoch", "train_loss", "val_mean_iou", "val_pixel_accuracy", "val_iou_background", "val_iou_disc",
           "val_iou_rectangle", "val_iou_triangle", "images_per_s", "seconds"]

#: the demo, interrupted by Ctrl-C at the end of a given optimiser step (a step counted over all epochs)
INTERRUPTED_AT = """
import os, signal, sys
from triflux.optimise import training
from triflux.__main__ import main
apply_update, steps = training.apply_update, [0]
def interrupting_update(*args, **kwargs):
    steps[0] += 1
    if steps[0] == {step}:
        os.kill(os.getpid(), signal.SIGINT)
    return apply_update(*args, **kwargs)
training.apply_update = interrupting_update
sys.exit(main(['demo', 'unet', *{argv!r}]))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny demo for 2 epochs of 2 steps keeping 1 checkpoint, and the
    same run interrupted after the first step of epoch 2 and resumed in its
    folder with the default retention; the tests below read their files."""
    base = tmp_path_factory.mktemp("demo")
    full, broken = str(base / "full"), str(base / "interrupted")
    tiny = [*TINY, "--samples", "20", "--epochs", "2", "--quiet"]
    done = run_demo(*tiny, "--keep-checkpoints", "1", "--out", full)
    stopped = run_python(INTERRUPTED_AT.format(step=3, argv=[*tiny, "--out", broken]),
                         timeout=300, unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert stopped.returncode == 130, stopped.stderr
    path = os.path.join(broken, "interrupted-epoch002.safetensors")
    import triflux as tf
    saved = tf.load(path)
    resumed = run_demo("--device", "cpu", "--resume", path, "--quiet")
    return SimpleNamespace(full=full, done=done, broken=broken, saved=saved, resumed=resumed)


def test_demo_trains_and_writes_everything(runs):
    r, out = runs.done, runs.full
    assert r.returncode == 0, r.stderr
    assert "note:" not in r.stderr                # the interpreter notice is for the interpreter only
    rows = read_metrics(out)
    with open(os.path.join(out, "metrics.csv")) as f:
        assert f.readline().strip().split(",") == COLUMNS
    assert [int(r_["epoch"]) for r_ in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= float(row["val_mean_iou"]) <= 1.0 and 0.0 <= float(row["val_pixel_accuracy"]) <= 1.0
        assert np.isfinite(float(row["train_loss"])) and float(row["images_per_s"]) > 0
        per_class = [float(row[c]) for c in COLUMNS if c.startswith("val_iou_")]
        assert all(0.0 <= v <= 1.0 for v in per_class if not np.isnan(v))
        assert abs(np.nanmean(per_class) - float(row["val_mean_iou"])) < 1e-5
    best = max(rows, key=lambda r_: float(r_["val_mean_iou"]))["epoch"]
    kept = {f"checkpoint-epoch{int(e):03d}.safetensors" for e in {2, int(best)}}
    assert set(os.listdir(out)) == {"model.safetensors", "metrics.csv", "curves.png", "predictions.png", *kept}
    last = r.stdout.strip().splitlines()[-5:]
    assert last[0].startswith("final validation mean IoU") and out in last[1] and "metrics.csv" in last[3]
    assert last[2].startswith("checkpoints:") and f"the newest 1 and the best by validation mean IoU (epoch {best})" in last[2]
    for png in ("curves.png", "predictions.png"):
        with open(os.path.join(out, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import triflux as tf
    assert "net" in tf.load(os.path.join(out, "model.safetensors"))


def test_resuming_mid_epoch_logs_what_the_uninterrupted_run_logged(runs):
    assert runs.saved["epoch"] == 2 and runs.saved["steps_done"] == 1
    assert runs.resumed.returncode == 0, runs.resumed.stderr
    a, b = read_metrics(runs.full), read_metrics(runs.broken)
    for key in COLUMNS[:-2]:
        assert [x[key] for x in a] == [x[key] for x in b], key
    assert float(b[1]["seconds"]) > runs.saved["progress"]["seconds"] > 0     # epoch 2 counts its first step
    assert sorted(f for f in os.listdir(runs.broken) if f.endswith(".safetensors")) == [
        "checkpoint-epoch001.safetensors", "checkpoint-epoch002.safetensors", "model.safetensors"]                        # the interrupted checkpoint went with its epoch
    import triflux as tf
    final = tf.load(os.path.join(runs.full, "model.safetensors"))
    again = tf.load(os.path.join(runs.broken, "model.safetensors"))
    for x, y in zip(tf.functor.leaves(final), tf.functor.leaves(again)):
        np.testing.assert_array_equal(x, y)


def test_retention_keeps_the_newest_and_the_best(tmp_path):
    from triflux.workbench.demos import unet
    history = [{"epoch": e, "val_mean_iou": iou} for e, iou in enumerate([0.2, 0.7, 0.5, 0.7, 0.4, 0.6], 1)]
    names = [unet.checkpoint_name(e) for e in range(1, 7)] + [unet.interrupted_name(3), unet.interrupted_name(7)]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert unet.prune_checkpoints(str(tmp_path), history, None) == [1, 2, 3, 4, 5, 6]
    assert sorted(os.listdir(tmp_path)) == sorted(names)
    assert unet.prune_checkpoints(str(tmp_path), history, 2) == [2, 5, 6]
    assert sorted(os.listdir(tmp_path)) == [unet.checkpoint_name(e) for e in (2, 5, 6)] + [unet.interrupted_name(7)]


def test_predictions_have_a_legend_of_the_classes():
    from triflux.workbench.demos import shapes, unet
    images, labels = shapes.make_shapes(2, 8, seed=0)
    fig = unet.prediction_figure(images, labels, labels[::-1])
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == list(shapes.CLASSES)
    truth = next(im for ax in fig.axes for im in ax.images if im.get_array().ndim == 2)    # a class map
    for k, patch in enumerate(legend.legend_handles):
        np.testing.assert_allclose(patch.get_facecolor(), truth.to_rgba(float(k)))
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_progress_bar_shows_loss_rate_and_device(tmp_path):
    r = run_demo(*TINY, "--epochs", "1", "--samples", "20", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "epoch 1/1" in r.stdout and "loss=" in r.stdout and "img_s=" in r.stdout and "CPUDevice()" in r.stdout
    assert "validation mean IoU" in r.stdout


def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path):
    out = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="-1")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen([sys.executable, "-m", "triflux", "demo", "unet", *TINY, "--epochs", "50",
                             "--out", out], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(os.path.join(out, "checkpoint-epoch001.safetensors")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "resume with: python -m triflux demo unet --resume" in stderr
    path = stderr.split("--resume", 1)[1].split()[0]
    assert os.path.exists(path)
    r = run_demo("--device", "cpu", "--resume", path, "--epochs", "3", "--quiet")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device tpu"),
    (["--epochs", "0"], "--epochs must be positive"),
    (["--batch-size", "-1"], "--batch-size must be positive"),
    (["--image-size", "20", "--depth", "3"], "divisible by 2^depth = 8"),
    (["--samples", "0"], "--samples must be positive"),
    (["--out", "/proc/triflux-cannot-write"], "cannot write there"),
    (["--resume", "/nonexistent/ckpt.safetensors"], "--resume"),
    (["--keep-checkpoints", "0"], "expected a positive number or 'all'"),
    (["--device", "cuda"], "Without a GPU, use --device cpu"),
])
def test_bad_arguments_exit_2_before_work(args, message, tmp_path):
    r = run_demo(*args, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert "error:" in r.stderr.strip().splitlines()[-1] and "Traceback" not in r.stderr
    assert "`cpu(" not in r.stderr                  # the command line's advice, not the library's
    assert "epoch" not in r.stdout


#: metrics.csv's columns for the volumes (--spatial-dims 3)
COLUMNS_3D = ["epoch", "train_loss", "val_mean_iou", "val_pixel_accuracy", "val_iou_background", "val_iou_sphere",
              "val_iou_box", "val_iou_cylinder", "images_per_s", "seconds"]


def test_volumes_demo_trains_writes_slices_and_resumes_exactly(tmp_path):
    """--spatial-dims 3: volumes of spheres, boxes and cylinders, a 3-D UNet, the same files and
    metrics (the volume classes' IoUs), mid-volume slices in predictions.png, and a resume from the
    middle of an epoch that continues with exactly the uninterrupted run's numbers."""
    tiny = ["--device", "cpu", "--spatial-dims", "3", "--samples", "12", "--image-size", "8", "--depth", "1",
            "--base-channels", "2", "--batch-size", "4", "--epochs", "2", "--quiet"]
    full, broken = str(tmp_path / "full"), str(tmp_path / "broken")
    r = run_demo(*tiny, "--out", full)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(full, "metrics.csv")) as f:
        assert f.readline().strip().split(",") == COLUMNS_3D
    assert {"model.safetensors", "metrics.csv", "curves.png", "predictions.png"} <= set(os.listdir(full))
    assert "3-D UNet segmentation of 4 classes (background, sphere, box, cylinder)" not in r.stdout  # --quiet
    stopped = run_python(INTERRUPTED_AT.format(step=4, argv=[*tiny, "--out", broken]),
                         timeout=300, unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert stopped.returncode == 130, stopped.stderr       # 10 training volumes: 3 steps an epoch
    resumed = run_demo("--device", "cpu", "--resume", os.path.join(broken, "interrupted-epoch002.safetensors"),
                       "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    a, b = read_metrics(full), read_metrics(broken)
    for key in COLUMNS_3D[:-2]:
        assert [x[key] for x in a] == [x[key] for x in b], key
    bad = run_demo("--device", "cpu", "--resume", os.path.join(broken, "checkpoint-epoch001.safetensors"),
                   "--spatial-dims", "2")
    assert bad.returncode == 2 and "--spatial-dims 2 differs from the checkpoint's 3" in bad.stderr


def test_volume_figure_shows_middle_slices():
    from triflux.workbench.demos import unet, volumes
    vols, labels = volumes.make_volumes(3, 8, seed=1)
    assert vols.shape == (3, 1, 8, 8, 8) and labels.shape == (3, 8, 8, 8)
    assert set(np.unique(labels)) <= {0, 1, 2, 3} and (labels > 0).any()
    images, truth, pred = unet.mid_slices(vols, labels, labels[::-1])
    assert images.shape == (3, 1, 8, 8) and np.array_equal(truth, labels[:, 4])
    fig = unet.prediction_figure(vols, labels, labels[::-1], volumes.CLASSES)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == list(volumes.CLASSES)
    assert fig.axes[0].get_title(loc="left") == "input (middle slice)"
