"""The loss parts are named in one place, DetectionLoss.names (utils/loss.py): results.csv's columns, the validation
losses, the progress bar and the log line all follow it, and a model without DFL (reg_max 1, the YOLO26 family) names
its third term l1, for the L1 loss it is."""

import csv
import sys
import types
from pathlib import Path

import pytest
import torch
import warm_python
import yaml

from models.yolo import YOLO
from utils.data.shapes import make_shapes
from utils.loss import DetectionLoss
from utils.monitor import epoch_line, progress_text

REPO = Path(__file__).resolve().parents[1]
FAULTS = ["assign_on_cpu", "oom_skipped_steps", "nonfinite_skipped_steps"]


def random_maps(nc, reg_max, imgsz=64, b=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, 4 * reg_max + nc, imgsz // s, imgsz // s, generator=g) for s in (8, 16, 32)]


@pytest.mark.parametrize(
    "head, third",
    [
        (types.SimpleNamespace(nc=3, reg_max=16, strides=(8, 16, 32)), "dfl"),
        (types.SimpleNamespace(nc=3, reg_max=4, strides=(8, 16, 32)), "dfl"),
        (types.SimpleNamespace(nc=3, reg_max=1, strides=(8, 16, 32)), "l1"),
    ],
)
def test_names_columns_and_parts_agree(head, third):
    loss_fn = DetectionLoss(head)
    assert loss_fn.names == ("box", "cls", third)
    assert loss_fn.columns == ("box_loss", "cls_loss", f"{third}_loss")
    assert loss_fn.val_columns == ("val_box_loss", "val_cls_loss", f"val_{third}_loss")
    targets = torch.tensor([[0.0, 1, 8, 8, 40, 40], [1, 2, 20, 4, 60, 30]])
    _, parts = loss_fn(random_maps(head.nc, head.reg_max), targets)
    assert parts.shape == (len(loss_fn.names),) and (parts > 0).all()


def test_each_family_names_its_distance_term():
    """YOLOv8 and YOLO11 have DFL bins; YOLO26 has none (its box branch predicts the distances, an L1 term), and
    --reg-max swaps the box branch alone, the name with it."""
    families = [("n", 0, "dfl"), ("11n", 0, "dfl"), ("26n", 0, "l1"), ("11n", 1, "l1"), ("26n", 16, "dfl")]
    for scale, reg_max, third in families:
        assert DetectionLoss(YOLO(scale, 2, reg_max=reg_max).head).names == ("box", "cls", third), (scale, reg_max)


def test_progress_text_and_epoch_line_show_the_names_they_are_given():
    scores = {"precision": 0.5, "recall": 0.25, "mAP50": 0.4, "mAP50-95": 0.3}
    faults = dict.fromkeys(FAULTS, 0)
    for third in ("dfl", "l1"):
        names = ("box", "cls", third)
        text = progress_text(names, [1.0, 2.0, 3.0], 0.01, 1.5, 10.0)
        assert text == f"box 1.000 cls 2.000 {third} 3.000 lr 1.00e-02 mem 1.5G 10.0 img/s"
        val = dict(zip([f"val_{n}_loss" for n in names], [4.0, 5.0, 6.0]))
        line = epoch_line(1, 2, names, [1.0, 2.0, 3.0], {**scores, **val}, 3.2, {**faults, "assign_on_cpu": 2})
        assert line == (
            f"epoch 1/2: box 1.000 cls 2.000 {third} 3.000 | P 0.500 R 0.250 mAP50 0.400 mAP50-95 0.300 | "
            f"val box 4.000 cls 5.000 {third} 6.000 | 3 s | assign on cpu 2"
        )


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=8, n_val=4, seed=3, size=96)
    cfg = root / "tiny.yaml"
    names = ["circle", "square", "triangle", "star", "cross", "hexagon"]  # make_shapes' classes
    cfg.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": names}))
    return cfg


def test_a_yolo26_run_writes_l1_columns_and_logs_l1(tiny_data, tmp_path):
    """A tiny YOLO26 run: results.csv's header is the epoch, loss_fn.columns, the scores, loss_fn.val_columns, lr,
    seconds and the faults, and the progress bar and the log line name the third term l1, never dfl."""
    out = tmp_path / "run"
    args = ["--data", tiny_data, "--model", "26n", "--epochs", "1", "--imgsz", "64", "--batch", "4", "--workers", "0"]
    args += ["--device", "cpu", "--warmup-epochs", "0", "--out", out]
    result = warm_python.run([sys.executable, "train.py", *map(str, args)], REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    loss_fn = DetectionLoss(YOLO("26n", 6).head)
    assert loss_fn.names == ("box", "cls", "l1")
    scores = ["precision", "recall", "mAP50", "mAP50-95"]
    expected = ["epoch", *loss_fn.columns, *scores, *loss_fn.val_columns, "lr", "seconds", *FAULTS]
    with open(out / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == expected and len(rows) == 2
    row = dict(zip(rows[0], rows[1]))
    assert all(float(row[c]) > 0 for c in [*loss_fn.columns, *loss_fn.val_columns])
    epoch = [line for line in (out / "train.log").read_text().splitlines() if "epoch 1/1: " in line]
    assert len(epoch) == 1 and " l1 " in epoch[0] and "val box " in epoch[0] and "dfl" not in epoch[0], epoch
    assert " l1 " in result.stderr and "dfl" not in result.stderr  # the progress bar


def test_a_resumed_yolo26_run_keeps_the_l1_numbers_it_wrote_as_dfl_loss(tmp_path):
    """results.csv of a YOLO26 run started before its third term was named l1: resumed, the kept rows carry their
    numbers into the l1 columns instead of zeros."""
    from utils.monitor import start_results_csv

    path = tmp_path / "results.csv"
    path.write_text("epoch,box_loss,dfl_loss,val_dfl_loss\n1,3.5,0.25,0.5\n2,3.1,0.2,0.4\n3,3.0,0.1,0.3\n")
    start_results_csv(path, ["epoch", "box_loss", "l1_loss", "val_l1_loss", "lr"], resumed_epoch=2)
    assert path.read_text() == "epoch,box_loss,l1_loss,val_l1_loss,lr\n1,3.5,0.25,0.5,0\n2,3.1,0.2,0.4,0\n"
