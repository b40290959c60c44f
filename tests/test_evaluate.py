"""The per-epoch metric (utils.evaluate.fast_map, numpy) against pycocotools (utils.evaluate.coco_map, the
official numbers): they must agree within 0.005 on sets that exercise the corner cases of COCO's rules."""

import numpy as np
import pytest

from utils.coco import detections_to_coco, ground_truth
from utils.evaluate import coco_map, fast_map, matches_from_cocoeval, precision_recall
from utils.records import Records


def synthetic_set(seed, n_images=60, nc=6):
    """Ground truth and detections of a detector that is right most of the time: jittered copies of the
    boxes (sometimes of the wrong class, sometimes twice), plus false positives. Class nc - 1 has no box,
    class nc - 2 boxes but never a detection; some images are empty, one holds 150 small boxes."""
    rng = np.random.default_rng(seed)
    records, results = [], {}
    for i in range(n_images):
        h, w = (int(v) for v in rng.integers(120, 480, 2))
        k = 0 if i % 9 == 0 else 150 if i == 7 else int(rng.poisson(5))
        size = rng.uniform(0.02, 0.08, (k, 2)) if i == 7 else rng.uniform(0.05, 0.5, (k, 2))
        centre = rng.uniform(size / 2, 1 - size / 2)
        boxes = np.concatenate((centre - size / 2, centre + size / 2), 1)
        classes = rng.integers(0, nc - 1, k)
        records.append({"im": f"{i}.jpg", "shape": [h, w], "labels": np.column_stack((classes, boxes)).tolist()})
        pixels = boxes * [w, h, w, h]
        dets = []
        for box, c in zip(pixels, classes):
            for _ in range(int(rng.integers(0, 3)) if c != nc - 2 else 0):  # missed, found, found twice
                jitter = rng.normal(0, 0.08, 4) * np.tile(box[2:] - box[:2], 2)
                cls = c if rng.random() < 0.9 else rng.integers(0, nc)
                dets.append([*(box + jitter), rng.uniform(0.05, 1.0), cls])
        for _ in range(int(rng.integers(0, 8))):  # false positives anywhere
            x, y = rng.uniform(0, [w, h])
            dets.append(
                [x, y, x + rng.uniform(5, 60), y + rng.uniform(5, 60), rng.uniform(0.001, 0.6), rng.integers(0, nc)]
            )
        dets = np.array(dets, dtype=np.float64).reshape(-1, 6)
        dets[:, :4] = dets[:, :4].clip(0, [w, h, w, h])
        dets = dets[(dets[:, 2] > dets[:, 0] + 1) & (dets[:, 3] > dets[:, 1] + 1)]
        results[i] = dets[np.argsort(-dets[:, 4])]
    return Records.from_dicts(records), results


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_map_agrees_with_pycocotools(seed):
    nc = 6
    records, results = synthetic_set(seed, nc=nc)
    gt, image_ids, category_ids = ground_truth(records, [str(c) for c in range(nc)])
    detections = [d for i, det in results.items() for d in detections_to_coco(det, image_ids[i], category_ids)]
    map5095, map50, *_, ev = coco_map(gt, detections, category_ids, max_det=300)
    p, r, _ = precision_recall(*matches_from_cocoeval(ev, category_ids))
    fast = fast_map(results, records, nc, max_det=300)
    assert 0.2 < map5095 < 0.8  # a set where the number means something
    assert abs(fast["mAP50-95"] - map5095) < 0.005 and abs(fast["mAP50"] - map50) < 0.005, (fast, map5095, map50)
    has_gt = np.bincount(records.labels[:, 0].astype(int), minlength=nc) > 0
    assert abs(fast["precision"] - p[has_gt].mean()) < 0.01 and abs(fast["recall"] - r[has_gt].mean()) < 0.01


def test_fast_map_of_perfect_empty_and_wrong_detections():
    records, results = synthetic_set(3, n_images=10)
    perfect = {}
    for i in range(len(records)):
        h, w = records.shapes[i]
        gt = records.labels_of(i)
        perfect[i] = np.column_stack((gt[:, 1:] * [w, h, w, h], np.full(len(gt), 0.9), gt[:, 0]))
    assert fast_map(perfect, records, 6)["mAP50-95"] == pytest.approx(1.0)
    assert fast_map({}, records, 6)["mAP50-95"] == 0.0
    wrong_class = {i: np.column_stack((d[:, :5], (d[:, 5] + 1) % 5)) for i, d in perfect.items()}
    assert fast_map(wrong_class, records, 6)["mAP50"] == 0.0
