"""`python -m triflux demo unet` end to end on a tiny configuration: the
files it writes, its metrics, resuming (exactly), Ctrl-C, and argument
errors (one line, status 2, before any work)."""
import csv
import os
import signal
import subprocess
import sys
import time

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


def test_demo_trains_writes_everything_and_resumes_exactly(tmp_path):
    out = str(tmp_path / "run")
    r = run_demo(*TINY, "--epochs", "2", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    files = set(os.listdir(out))
    assert {"model.safetensors", "metrics.csv", "curves.png", "predictions.png",
            "checkpoint-epoch001.safetensors", "checkpoint-epoch002.safetensors"} <= files, files
    assert not any(f.endswith(".tmp") for f in files)
    rows = read_metrics(out)
    assert [int(r_["epoch"]) for r_ in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= float(row["val_mean_iou"]) <= 1.0 and 0.0 <= float(row["val_pixel_accuracy"]) <= 1.0
        assert np.isfinite(float(row["train_loss"])) and float(row["images_per_s"]) > 0
    last = r.stdout.strip().splitlines()[-5:]
    assert last[0].startswith("final validation mean IoU") and out in last[1] and "metrics.csv" in last[3]
    for png in ("curves.png", "predictions.png"):
        with open(os.path.join(out, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import triflux as tf
    model = tf.load(os.path.join(out, "model.safetensors"))
    assert "net" in model

    # resuming after epoch 1 reproduces epoch 2 exactly
    resumed = str(tmp_path / "resumed")
    r2 = run_demo("--device", "cpu", "--resume", os.path.join(out, "checkpoint-epoch001.safetensors"),
                  "--out", resumed, "--quiet")
    assert r2.returncode == 0, r2.stderr
    a, b = read_metrics(out), read_metrics(resumed)
    for key in ("train_loss", "val_mean_iou", "val_pixel_accuracy"):
        assert [x[key] for x in a] == [x[key] for x in b], key
    final = tf.load(os.path.join(out, "model.safetensors"))
    again = tf.load(os.path.join(resumed, "model.safetensors"))
    for x, y in zip(tf.functor.leaves(final), tf.functor.leaves(again)):
        np.testing.assert_array_equal(x, y)


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
])
def test_bad_arguments_exit_2_before_work(args, message, tmp_path):
    r = run_demo(*args, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert "error:" in r.stderr.strip().splitlines()[-1]
    assert "epoch" not in r.stdout
