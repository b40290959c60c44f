"""Scoring in each dataset format (issue 39): from the same weights val.py gives the same numbers on the YOLO txt,
VOC and COCO json sets, pycocotools' numbers, with VOC difficult and COCO crowd boxes ignored alike.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from format_sets import CATEGORY_IDS, NAMES, TINY, run
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from utils.coco import detections_to_coco, ground_truth
from utils.data.dataset_yaml import load_dataset_yaml
from utils.data.labels import load_verified
from utils.evaluate import coco_map, fast_map

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


def val_metrics(root, weights, fmt, out):
    data = root / "cvat" / "obj.data" if fmt == "cvat" else root / f"{fmt}.yaml"  # CVAT's export as it is
    run(["val.py", "--weights", weights, "--data", data, "--save-json", "--out", out, "--workers", "0",
         "--batch", "4", "--device", "cpu"])  # fmt: skip
    return json.loads((out / "metrics.json").read_text())


def pycocotools_by_hand(gt, predictions):
    """mAP50-95, mAP50 of pycocotools' own COCOeval, up to 300 detections per image as val.py counts them.
    summarize() asks for 100 by name in its first figure, so that one is averaged here as summarize() does."""
    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    ev = COCOeval(coco_gt, coco_gt.loadRes(predictions), "bbox")
    ev.params.maxDets = [1, 10, 300]
    ev.evaluate(), ev.accumulate(), ev.summarize()
    precision = ev.eval["precision"][:, :, :, 0, 2]  # area 'all', 300 detections
    return precision[precision > -1].mean(), ev.stats[1]


def test_train_on_voc_and_coco_json_then_val_scores_each_as_pycocotools(sets, tmp_path):
    """One epoch on the VOC and on the COCO json set; then the same best.pt scored by val.py against the three yamls
    and CVAT's obj.data: the same numbers, and for COCO the numbers of pycocotools run by hand on the original json
    (original ids). (One tiny epoch scores about 0: test_scoring_... below checks the same path with detections that
    score.)"""
    root, truth = sets
    for fmt in ("voc", "coco"):
        run(["train.py", "--data", root / f"{fmt}.yaml", "--epochs", "1", "--out", tmp_path / fmt, *TINY])
    weights = tmp_path / "coco" / "weights" / "best.pt"
    formats = ("yolo", "voc", "coco", "cvat")
    metrics = {fmt: val_metrics(root, weights, fmt, tmp_path / f"val_{fmt}") for fmt in formats}
    predictions = json.loads((tmp_path / "val_coco" / "predictions.json").read_text())
    original = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    assert predictions and {p["category_id"] for p in predictions} <= set(CATEGORY_IDS)
    assert {p["image_id"] for p in predictions} <= {im["id"] for im in original["images"]}
    by_hand = pycocotools_by_hand(original, predictions)  # the original json, as given
    assert (metrics["coco"]["mAP50-95"], metrics["coco"]["mAP50"]) == pytest.approx(by_hand, abs=1e-6)
    assert not (tmp_path / "val_coco" / "ground_truth.json").exists()  # scored against the original: nothing built
    for fmt in ("yolo", "voc", "cvat"):
        assert metrics[fmt]["mAP50-95"] == pytest.approx(metrics["coco"]["mAP50-95"], abs=1e-6), fmt
        assert metrics[fmt]["instances"] == metrics["coco"]["instances"], fmt


def synthetic_detections(records, truth, seed=0):
    """{record index: (n, 6) x1 y1 x2 y2 score class} of a detector that is mostly right: every box found (the
    ignored ones too) a pixel or two off, sometimes as the wrong class, plus false positives."""
    rng = np.random.default_rng(seed)
    boxes_of = {image.name: (w, h, boxes) for (split, image), (w, h, boxes) in truth.items() if split == "val"}
    results = {}
    for i in range(len(records)):
        w, h, boxes = boxes_of[Path(records.path(i)).name]
        dets = []
        for c, x1, y1, x2, y2, _ in boxes:
            cls = c if rng.random() < 0.8 else (c + 1) % len(NAMES)
            dets.append([*(np.array([x1, y1, x2, y2]) + rng.normal(0, 1.5, 4)), rng.uniform(0.1, 1), cls])
        for _ in range(3):
            x, y = rng.uniform(0, [w - 10, h - 10])
            dets.append([x, y, x + 10, y + 10, rng.uniform(0, 0.6), rng.integers(len(NAMES))])
        results[i] = np.array(dets, dtype=np.float64).reshape(-1, 6)
    return results


def test_scoring_of_voc_coco_json_and_yolo_is_pycocotools_with_ignored_boxes(sets):
    """The scoring path of utils.evaluate.evaluate (ground_truth, detections_to_coco, coco_map) on each format's val
    records, with detections that score: VOC difficult and COCO crowd boxes ignored alike (a detection on one is no
    false positive), so all three equal pycocotools run by hand on the YOLO ground truth plus those boxes as crowds,
    and the COCO json one equals pycocotools on the original json."""
    root, truth = sets
    scores, detections = {}, {}
    for fmt in ("yolo", "voc", "coco"):
        data = load_dataset_yaml(root / f"{fmt}.yaml")
        records = load_verified(data["val"], data["nc"], "val")
        gt, image_ids, category_ids = ground_truth(records, data["names"], data["coco_jsons"]["val"])
        results = synthetic_detections(records, truth)
        detections[fmt] = [d for i, det in results.items() for d in detections_to_coco(det, image_ids[i], category_ids)]
        scores[fmt] = coco_map(gt, detections[fmt], category_ids)[:2]
        fast = fast_map(results, records, len(NAMES))  # the per-epoch metric: ignores the same boxes
        assert (fast["mAP50-95"], fast["mAP50"]) == pytest.approx(scores[fmt], abs=0.005), fmt
        if fmt == "yolo":
            yolo_gt = gt
    original = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    assert scores["coco"] == pytest.approx(pycocotools_by_hand(original, detections["coco"]), abs=1e-6)
    assert {d["category_id"] for d in detections["coco"]} <= set(CATEGORY_IDS)
    image_id = {Path(im["file_name"]).name: im["id"] for im in yolo_gt["images"]}
    with_crowds = dict(yolo_gt, annotations=list(yolo_gt["annotations"]))
    for (split, image), (w, h, boxes) in truth.items():
        for c, x1, y1, x2, y2, ignored in boxes:
            if split == "val" and ignored:
                with_crowds["annotations"].append(
                    {"id": len(with_crowds["annotations"]) + 1, "image_id": image_id[image.name], "category_id": c,
                     "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 1}
                )  # fmt: skip
    by_hand = pycocotools_by_hand(with_crowds, detections["yolo"])
    assert 0.2 < by_hand[0] < 0.95  # a score that means something
    for fmt in ("voc", "coco"):
        assert scores[fmt] == pytest.approx(by_hand, abs=1e-6), fmt
    assert scores["yolo"][0] < by_hand[0]  # without the ignored boxes, the detections on them are false positives


def test_roboflow_coco_export_scores_as_its_json_without_the_root_category(sets, tmp_path):
    """Roboflow's COCO export: each split's `_annotations.coco.json` beside its images, a root category first that
    the others name as their supercategory and no box has. It is no class: the same classes, category ids and
    scores as the plain json, and pycocotools' own numbers on the Roboflow json as written."""
    root, truth = sets
    export = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    export["categories"] = [{"id": 0, "name": "shape", "supercategory": "none"}, *export["categories"]]
    (tmp_path / "valid").mkdir()
    for image in (root / "coco" / "images" / "val").iterdir():
        (tmp_path / "valid" / image.name).write_bytes(image.read_bytes())
    (tmp_path / "valid" / "_annotations.coco.json").write_text(json.dumps(export))
    (tmp_path / "data.yaml").write_text("train: valid/_annotations.coco.json\nval: valid/_annotations.coco.json\n")
    scores = {}
    for name, cfg in (("roboflow", tmp_path / "data.yaml"), ("coco", root / "coco.yaml")):
        data = load_dataset_yaml(cfg)
        assert data["names"] == NAMES, name
        records = load_verified(data["val"], data["nc"], "val")
        gt, image_ids, category_ids = ground_truth(records, data["names"], data["coco_jsons"]["val"])
        assert sorted(category_ids) == sorted(CATEGORY_IDS), name
        results = synthetic_detections(records, truth)
        detections = [d for i, det in results.items() for d in detections_to_coco(det, image_ids[i], category_ids)]
        scores[name] = coco_map(gt, detections, category_ids)[:2]
    assert scores["roboflow"] == pytest.approx(pycocotools_by_hand(export, detections), abs=1e-6)
    assert scores["roboflow"] == pytest.approx(scores["coco"], abs=1e-6) and 0.2 < scores["coco"][0] < 0.95
