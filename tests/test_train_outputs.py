"""What a train.py run leaves (issue 4): every output of a two-epoch run and its MLflow record, val.py's mAP against
pycocotools, each setting that is not the default printed and saved with its source.

Every run here is a real `python train.py ...` subprocess on a tiny generated dataset, on the CPU (train_runs.py)."""

import csv
import json
import os

import pytest
import torch
import yaml
from train_runs import TINY, load, run, tensors_equal


def assert_every_output_written(out):
    """Every file a finished run leaves in `out`; its pictures are real images, not empty files."""
    pictures = [
        "labels.jpg",
        "train_batch0.jpg",
        "train_batch1.jpg",
        "train_batch2.jpg",
        "val_batch0_labels.jpg",
        "val_batch0_pred.jpg",
        "F1_curve.png",
        "P_curve.png",
        "R_curve.png",
    ]
    for name in [
        "weights/last.pt",
        "weights/best.pt",
        "results.csv",
        "results.png",
        "args.yaml",
        "train.log",
        "metrics.json",
        "pr_curve.png",
        "confusion_matrix.png",
        *pictures,
    ]:
        assert (out / name).exists(), name
    import cv2

    assert all(cv2.imread(str(out / name)) is not None for name in pictures)  # real images, not empty files


def test_two_epoch_run_writes_every_output(tiny_data, tmp_path, monkeypatch):
    """Also --mlflow: the run read back with MLflow's own client from the local store (a resume continues it: below,
    in test_extend_a_finished_run_as_if_started_with_more_epochs)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # the default store: beside the run
    run(["--data", tiny_data, "--epochs", "2", "--mlflow", "--out", out, *TINY], env=env)
    assert_every_output_written(out)
    assert "best F1 at confidence" in (out / "train.log").read_text()
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for column in ["box_loss", "cls_loss", "dfl_loss", "precision", "recall", "mAP50", "mAP50-95", "lr", "seconds"]:
        assert column in rows[0] and float(rows[-1][column]) == float(rows[-1][column])  # present, not NaN
    for column in ["val_box_loss", "val_cls_loss", "val_dfl_loss"]:  # beside the training losses, each epoch
        assert all(0 < float(r[column]) < 100 for r in rows), column
    last, best = load(out / "weights/last.pt"), load(out / "weights/best.pt")
    assert last["epoch"] == 2 and last["iteration"] == 0 and "optimizer" in last and "scaler" in last
    # deployable, self-describing
    assert "optimizer" not in best and best["names"][0] == "circle" and best["imgsz"] == 64
    assert torch.equal(best["model"]["head.cls.0.2.bias"], last["ema"]["head.cls.0.2.bias"]) or best["epoch"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"mAP50", "mAP50-95", "precision", "recall"} <= metrics.keys()
    assert yaml.safe_load((out / "args.yaml").read_text())["epochs"] == 2

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 reads its file store only when allowed
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run_id = json.loads((out / "mlflow.json").read_text())["run_id"]
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    assert client.get_experiment(tracked.info.experiment_id).name == "tiny"  # named after the dataset yaml
    params = tracked.data.params
    assert params["epochs"] == "2" and params["imgsz"] == "64" and params["optimizer"] == "adamw"
    assert params["data"] == str(tiny_data) and params["cls_weights"] == "" and float(params["lr0"]) == 0.002
    for column in ["box_loss", "cls_loss", "mAP50-95", "val_box_loss", "lr", "seconds"]:
        history = client.get_metric_history(run_id, column)
        assert [m.step for m in history] == [1, 2], column
        assert [m.value for m in history] == pytest.approx([float(r[column]) for r in rows], rel=1e-4), column
    artifacts = {a.path for folder in ("", "plots", "weights") for a in client.list_artifacts(run_id, folder)}
    assert {"weights/best.pt", "plots/results.png", "plots/labels.jpg", "results.csv", "args.yaml"} <= artifacts
    assert "weights/last.pt" not in artifacts
    downloaded = client.download_artifacts(run_id, "weights/best.pt", str(tmp_path))
    assert tensors_equal(load(downloaded)["model"], best["model"])


def test_val_map_equals_pycocotools_on_the_saved_detections(tiny_data, tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    run(["--data", tiny_data, "--epochs", "2", "--out", tmp_path / "train", *TINY])
    out = tmp_path / "val"
    args = ["--weights", tmp_path / "train/weights/last.pt", "--data", tiny_data, "--save-json", "--workers", "0"]
    result = run(["val.py", *args, "--out", out], check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mAP50-95" in result.stdout and "inference" in result.stdout and "best F1 at confidence" in result.stdout
    pictures = ["pr_curve.png", "confusion_matrix.png", "F1_curve.png", "P_curve.png", "R_curve.png"]
    assert all((out / p).stat().st_size > 0 for p in pictures + ["val_batch0_labels.jpg", "val_batch0_pred.jpg"])
    metrics = json.loads((out / "metrics.json").read_text())
    gt = COCO(str(out / "ground_truth.json"))
    detections = json.loads((out / "predictions.json").read_text())
    assert detections, "the tiny model should produce some low-confidence detections"
    ev = COCOeval(gt, gt.loadRes(detections), "bbox")
    ev.params.maxDets = [1, 10, 300]  # val.py's --max-det: up to 300 detections of an image count
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[0] == -1  # pycocotools' summary asks for maxDets=100 by name; val.py reads the table instead
    precision = ev.eval["precision"][:, :, :, 0, -1]
    assert metrics["mAP50-95"] == pytest.approx(precision[precision > -1].mean(), abs=1e-9)
    assert metrics["mAP50"] == pytest.approx(ev.stats[1], abs=1e-9)
    assert len(metrics["per_class"]) == 6


def test_each_setting_that_is_not_the_default_is_printed_and_saved_with_its_source(tiny_data, tmp_path):
    """Four sources (flags, the dataset yaml's defaults:, the optimizer's choice, a resumed run) and which one won,
    at start and in args.yaml, which still reads back as plain yaml."""
    cfg = tmp_path / "with_defaults.yaml"
    cfg.write_text(tiny_data.read_text().replace("path: shapes", f"path: {tiny_data.parent / 'shapes'}")
                   + "defaults: {imgsz: 96, lr0: 0.004}\n")  # fmt: skip
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--imgsz", "64")]
    result = run(["--data", cfg, "--epochs", "1", "--lr0", "0.003", "--out", out, *tiny])
    saved = (out / "args.yaml").read_text()
    assert f"imgsz: 96  # <- {cfg} defaults" in saved.splitlines()
    assert "lr0: 0.003  # <- command line" in saved.splitlines()  # the flag wins over the yaml
    assert "optimizer: adamw  # <- --optimizer auto: 3 iterations" in saved.splitlines()
    assert "seed: 0" in saved.splitlines()  # a default: no comment
    assert yaml.safe_load(saved)["imgsz"] == 96
    assert f"imgsz 96 <- {cfg} defaults" in result.stdout + result.stderr
    result = run(["--resume", out / "weights/last.pt", "--epochs", "2"])
    assert "epochs 2 <- command line, resumed run had 1" in result.stdout + result.stderr
    saved = (out / "args.yaml").read_text().splitlines()
    assert "epochs: 2  # <- command line, resumed run had 1" in saved
    assert f"imgsz: 96  # <- resumed run {out / 'weights/last.pt'}" in saved
