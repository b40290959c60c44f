"""The per-epoch metric (utils.evaluate.fast_map, numpy) against pycocotools (utils.evaluate.coco_map, the
official numbers): they must agree within 0.005 on sets that exercise the corner cases of COCO's rules."""

import numpy as np
import pytest

from utils.coco import detections_to_coco, ground_truth
from utils.data.records import Records
from utils.evaluate import coco_map, fast_map, matches_from_cocoeval, precision_recall


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


def test_validation_loss_comes_from_the_same_forward_as_the_detections(tmp_path):
    """epoch_metrics' validation losses: the training loss of the validation batches, from the raw maps of the
    one forward that also gives the detections (no second pass), and the model is left as it was."""
    import torch

    from models.yolo import YOLO
    from utils.data.labels import load_verified
    from utils.data.loader import ValDataset, make_loader
    from utils.data.shapes import make_shapes
    from utils.evaluate import epoch_metrics
    from utils.loss import DetectionLoss

    make_shapes(tmp_path / "shapes", n_train=1, n_val=4, seed=1, size=96)
    records = load_verified([str(tmp_path / "shapes/images/val")], 6, "val")
    loader = make_loader(ValDataset(records, 64, 2), batch_size=2, workers=0)
    torch.manual_seed(0)
    model = YOLO("n", 6).eval()
    loss_fn = DetectionLoss(model.head)
    forwards = []
    model.register_forward_hook(lambda module, inputs, output: forwards.append(len(inputs[0])))
    metrics = epoch_metrics(model, loader, 6, torch.device("cpu"), loss_fn=loss_fn)
    assert forwards == [2, 2]  # one forward per batch
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 84, 4 + 6)  # and eval answers as before, per anchor
    expected = []
    with torch.no_grad():
        for images, targets, _ in loader:
            model.train()  # the training forward gives the raw maps; BN in eval mode keeps it the same network
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.eval()
            expected.append(loss_fn(model(images.float() / 255), targets)[1])
    expected = torch.stack(expected).mean(0).tolist()
    assert loss_fn.val_columns == ("val_box_loss", "val_cls_loss", "val_dfl_loss")
    assert [metrics[k] for k in loss_fn.val_columns] == pytest.approx(expected, rel=1e-5)
    assert {"precision", "recall", "mAP50", "mAP50-95"} <= metrics.keys()
