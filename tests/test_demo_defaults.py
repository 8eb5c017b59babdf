"""The README's promise for `make demo`: with its defaults, the UNet demo
reaches a validation mean IoU of at least 0.8 on the CPU reference (about
three minutes on two cores; this is the slowest test in the suite)."""
import csv
import os

from .helpers import run_python


def test_defaults_reach_mean_iou_0_8_on_the_cpu(tmp_path):
    r = run_python("import sys; from triflux.__main__ import main; "
                   f"sys.exit(main(['demo', 'unet', '--device', 'cpu', '--quiet', '--out', {str(tmp_path)!r}]))",
                   timeout=1200, unset=("TRITON_INTERPRET",), env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert r.returncode == 0, r.stderr[-3000:]
    with open(os.path.join(tmp_path, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 15
    final = float(rows[-1]["val_mean_iou"])
    assert final >= 0.8, rows
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"]) / 4
    assert f"final validation mean IoU {final:.3f}" in r.stdout


def test_volume_defaults_reach_mean_iou_0_8_on_the_cpu(tmp_path):
    """`demo unet --spatial-dims 3`: the README's promise for the volumetric UNet (16 epochs of
    400 volumes of 16^3 on the CPU reference, about two minutes on two quiet cores)."""
    r = run_python("import sys; from triflux.__main__ import main; "
                   "sys.exit(main(['demo', 'unet', '--spatial-dims', '3', '--device', 'cpu', '--quiet', '--out', "
                   f"{str(tmp_path)!r}]))", timeout=1200, unset=("TRITON_INTERPRET",),
                   env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert r.returncode == 0, r.stderr[-3000:]
    with open(os.path.join(tmp_path, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16
    final = float(rows[-1]["val_mean_iou"])
    assert final >= 0.8, rows
    assert f"final validation mean IoU {final:.3f}" in r.stdout
