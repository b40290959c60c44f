"""Evaluation: run a model over a validation loader, map predictions back to original pixels,
and compute COCO mAP with pycocotools (the official implementation, not a re-implementation)."""

import contextlib
import functools
import io
import time

import numpy as np
import torch
import torchvision
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from utils.boxes import scale_boxes_to_original
from utils.coco import detections_to_coco, ground_truth
from utils.inference import Predictor, postprocess


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def predict_dataset(model, loader, device, conf=0.001, iou=0.7, max_det=300, half=False, loss_fn=None):
    """Detections of every validation image in original pixels: dict dataset index -> (n, 6) array
    of x1 y1 x2 y2 score class. Also the time per image of each stage, in ms, and with `loss_fn` (train.py's
    DetectionLoss) the mean validation loss parts (loss_fn.names) from the same forward's raw maps, else None.
    model: a PyTorch nn.Module (training), or a Predictor of utils/inference.py (val.py, export.py's gate: any
    format, a .pt wrapped by from_pytorch included)."""
    results, seconds, images = {}, np.zeros(3), 0
    loss_sum, batches = torch.zeros(len(loss_fn.names) if loss_fn is not None else 0, device=device), 0
    for batch, targets, metas in loader:
        predictions, maps = model_outputs(model, batch, device, half, seconds, with_maps=loss_fn is not None)
        if loss_fn is not None:  # summed on the device, read once at the end
            loss_sum += loss_fn(maps, targets)[1]
            batches += 1
        nms = functools.partial(postprocess, predictions.float(), model, conf, iou, max_det=max_det, multi_label=True)
        detections = timed(device, seconds, 2, nms)
        images += len(batch)
        for det, meta in zip(detections, metas):
            det[:, :4] = scale_boxes_to_original(det[:, :4], meta["ratio"], meta["pad"], meta["shape"])
        # one copy to the host per batch, not per image: each one waits for the GPU
        on_host = torch.cat(detections).cpu().numpy() if detections else np.zeros((0, 6), np.float32)
        for meta, det in zip(metas, np.split(on_host, np.cumsum([len(d) for d in detections])[:-1])):
            results[meta["index"]] = det
    speed = dict(zip(("preprocess", "inference", "nms"), (seconds / max(images, 1) * 1000).round(3).tolist()))
    return results, speed, (loss_sum / max(batches, 1)).tolist() if loss_fn is not None else None


def timed(device, seconds, stage, work):
    """work(), its wall time (the device's queue drained before and after) added to seconds[stage]."""
    synchronize(device)
    start = time.perf_counter()
    out = work()
    synchronize(device)
    seconds[stage] += time.perf_counter() - start
    return out


def model_outputs(model, batch, device, half, seconds, with_maps=False):
    """(predictions, raw maps or None) of a uint8 batch; the preprocessing and inference times into seconds.
    model: an nn.Module or a Predictor of utils/inference.py (see predict_dataset). with_maps: an nn.Module's raw
    maps too, from the same forward (the validation loss)."""
    if isinstance(model, Predictor):  # it converts to its own precision and device
        x = timed(device, seconds, 0, lambda: batch.to(model.device).float().div_(255))  # pitfall D3
        return timed(device, seconds, 1, lambda: model.run(x)), None
    model.eval()  # pitfall M1: BN and dropout must be in inference mode
    dtype = next(model.parameters()).dtype  # fp16 after .half(); fp32 weights (the EMA in training) run in autocast
    x = timed(device, seconds, 0, lambda: batch.to(device, non_blocking=True).to(dtype).div_(255))  # pitfall D3
    with torch.autocast(device.type, dtype=torch.float16, enabled=half and device.type == "cuda"):
        if not with_maps:
            return timed(device, seconds, 1, lambda: model(x)), None
        maps = timed(device, seconds, 1, lambda: model(x, mode="maps"))
        return timed(device, seconds, 1, lambda: model.head.from_maps(maps, model.head.eval_mode)), maps


def coco_map(gt, detections, category_ids, max_det=300):
    """pycocotools' COCOeval, counting up to max_det detections per image. Returns mAP50-95, mAP50,
    per-class AP arrays, and the evaluated object (for the PR curves). With no detection at all,
    every number is 0."""
    nc = len(category_ids)
    if not detections:
        return 0.0, 0.0, np.zeros(nc), np.zeros(nc), None
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints a page per call
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        coco_dt = coco_gt.loadRes(detections)
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        # COCO's default counts 100 detections per image: an image with 150 objects could never reach
        # recall 1. summarize() would then report -1 (it asks for maxDets=100 by name), so the two
        # summary numbers are read from the precision table, exactly as summarize() computes them.
        ev.params.maxDets = [1, 10, max_det]
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"][:, :, :, 0, -1]  # iou thresholds, recall points, classes (area all, max_det)

    def mean_ap(p):
        return float(p[p > -1].mean()) if (p > -1).any() else 0.0

    per_class = np.array([mean_ap(p) for p in precision.transpose(2, 0, 1)])
    per_class50 = np.array([mean_ap(p) for p in precision[0].T])
    ap = np.zeros(nc)
    ap50 = np.zeros(nc)
    for k, cat in enumerate(ev.params.catIds):
        ap[category_ids.index(cat)] = per_class[k]
        ap50[category_ids.index(cat)] = per_class50[k]
    return mean_ap(precision), mean_ap(precision[0]), ap, ap50, ev


def precision_recall(scores, hits, n_gt):
    """Precision and recall per class at the IoU of mAP50, at the one confidence that maximises the mean F1
    over classes (the operating point YOLO tables report), plus the curves for plotting.
    scores, hits: per class, the detections' scores and whether each matched a box at that IoU;
    n_gt: boxes per class."""
    nc = len(n_gt)
    grid = np.linspace(0, 1, 1000)
    p_curve, r_curve = np.zeros((nc, grid.size)), np.zeros((nc, grid.size))
    for k in range(nc):
        if not len(scores[k]) or n_gt[k] == 0:
            continue
        order = np.argsort(-np.asarray(scores[k]), kind="stable")
        score, tp = np.asarray(scores[k])[order], np.asarray(hits[k], dtype=bool)[order]
        tpc, fpc = np.cumsum(tp), np.cumsum(~tp)
        recall, precision = tpc / n_gt[k], tpc / (tpc + fpc)
        r_curve[k] = np.interp(-grid, -score, recall, left=0)
        p_curve[k] = np.interp(-grid, -score, precision, left=1)
    f1 = 2 * p_curve * r_curve / (p_curve + r_curve + 1e-16)
    has_gt = np.asarray(n_gt) > 0
    best = int(f1[has_gt].mean(0).argmax()) if has_gt.any() else 0
    return (
        p_curve[:, best],
        r_curve[:, best],
        {"confidence": grid, "precision": p_curve, "recall": r_curve, "f1": f1, "n_gt": np.asarray(n_gt, float)},
    )


def matches_from_cocoeval(ev, category_ids):
    """(scores, hits at the IoU of mAP50, n_gt) per class, read from pycocotools' per-image results."""
    nc = len(category_ids)
    scores, hits, n_gt = [[] for _ in range(nc)], [[] for _ in range(nc)], np.zeros(nc)
    if ev is not None:
        column = {cat: k for k, cat in enumerate(category_ids)}
        for e in ev.evalImgs:  # one entry per (class, area range, image); keep area "all"
            if e is None or e["aRng"] != ev.params.areaRng[0]:
                continue
            k = column[e["category_id"]]
            n_gt[k] += int((~e["gtIgnore"].astype(bool)).sum())
            keep = ~e["dtIgnore"][0].astype(bool)
            scores[k] += list(np.asarray(e["dtScores"])[keep])
            hits[k] += list(e["dtMatches"][0][keep] > 0)
    return scores, hits, n_gt


# COCO's IoU thresholds and recall points, computed as pycocotools computes them
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True)
RECALL_POINTS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True)


def match_image(det, gt, thresholds=IOU_THRESHOLDS):
    """COCO's matching in one image, for every IoU threshold at once: detections in descending score
    order each take the still unmatched ground-truth box of their class with the highest IoU, if that IoU
    reaches the threshold. det: (n, 6) x1 y1 x2 y2 score class, sorted by score; gt: (m, 5) class x1 y1 x2 y2
    in the same pixels. Returns (n, thresholds) bool: true positive."""
    tp = np.zeros((len(det), len(thresholds)), bool)
    near = np.flatnonzero(np.isin(det[:, 5], gt[:, 0]))  # a detection of a class the image lacks matches nothing
    if not len(near):
        return tp
    # IoU in numpy rather than torchvision.ops.box_iou: called once per image, the tensor round trip costs more
    # than the arithmetic
    d, g = det[near, :4], gt[:, 1:]
    inter = (np.minimum(d[:, None, 2:], g[None, :, 2:]) - np.maximum(d[:, None, :2], g[None, :, :2])).clip(0).prod(2)
    union = (d[:, 2:] - d[:, :2]).prod(1)[:, None] + (g[:, 2:] - g[:, :2]).prod(1)[None] - inter
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    iou *= det[near, 5:6] == gt[None, :, 0]  # another class: no match
    free = np.ones((len(thresholds), len(gt)), bool)
    rows = np.arange(len(thresholds))
    for k in np.flatnonzero(iou.max(1) >= thresholds[0]):  # the others match nothing at any threshold
        candidates = np.where(free, iou[k], -1.0)
        best = candidates.argmax(1)
        hit = candidates[rows, best] >= thresholds
        free[rows[hit], best[hit]] = False
        tp[near[k]] = hit
    return tp


def crowd_overlap(det, crowd, thresholds=IOU_THRESHOLDS):
    """(n, thresholds) bool: the detection lies on a box to ignore of its class (VOC difficult, COCO crowd) by at
    least the threshold, measured as pycocotools measures a crowd: intersection over the detection's own area.
    det: (n, 6) x1 y1 x2 y2 score class; crowd: (m, 5) class x1 y1 x2 y2, in the same pixels."""
    if not len(crowd) or not len(det):
        return np.zeros((len(det), len(thresholds)), bool)
    d, g = det[:, None, :4], crowd[None, :, 1:]
    inter = (np.minimum(d[..., 2:], g[..., 2:]) - np.maximum(d[..., :2], g[..., :2])).clip(0).prod(2)
    area = (det[:, 2:4] - det[:, :2]).prod(1)[:, None]
    overlap = np.divide(inter, area, out=np.zeros_like(inter), where=area > 0) * (det[:, 5:6] == crowd[None, :, 0])
    return overlap.max(1)[:, None] >= thresholds


def fast_map(results, records, nc, max_det=300):
    """The per-epoch metric: mAP50-95, mAP50, precision and recall computed the way pycocotools computes
    them (area 'all', up to max_det detections per image, 101 recall points, the precision envelope) from
    the YOLO labels, in numpy, without building a COCO dict per detection, many times faster on a large val set.
    Agrees with coco_map within tests/test_evaluate.py's tolerance; val.py and the end of training report
    pycocotools' numbers, the official ones. results: predict_dataset's; records: utils.data.records.Records."""
    n_gt = np.bincount(records.labels[:, 0].astype(int), minlength=nc)[:nc]
    scores, classes, tps = [np.zeros(0)], [np.zeros(0, int)], [np.zeros((0, len(IOU_THRESHOLDS)), bool)]
    ignored = [np.zeros((0, len(IOU_THRESHOLDS)), bool)]  # on a VOC difficult / COCO crowd box: neither tp nor fp
    for i in range(len(records)):
        det = results.get(i)
        if det is None or not len(det):
            continue
        det = det[np.argsort(-det[:, 4], kind="stable")][:max_det].astype(np.float64)
        h, w = records.shapes[i]
        gt = records.labels_of(i).astype(np.float64) * [1, w, h, w, h]
        tp = match_image(det, gt)
        crowd = records.ignored_of(i).astype(np.float64) * [1, w, h, w, h]
        scores.append(det[:, 4]), classes.append(det[:, 5].astype(int)), tps.append(tp)
        ignored.append(~tp & crowd_overlap(det, crowd))
    scores, classes, tps = np.concatenate(scores), np.concatenate(classes), np.concatenate(tps)
    ignored = np.concatenate(ignored)
    ap = np.zeros((nc, len(IOU_THRESHOLDS)))
    for k in np.flatnonzero(n_gt):
        mine = classes == k
        order = np.argsort(-scores[mine], kind="mergesort")  # pycocotools' sort
        tp = tps[mine][order]
        if not len(tp):
            continue  # boxes but no detection: AP 0
        tpc, fpc = np.cumsum(tp, 0), np.cumsum(~tp & ~ignored[mine][order], 0)
        recall, precision = tpc / n_gt[k], tpc / (tpc + fpc + np.spacing(1))
        precision = np.maximum.accumulate(precision[::-1], 0)[::-1]  # the envelope
        for t in range(len(IOU_THRESHOLDS)):
            at = np.searchsorted(recall[:, t], RECALL_POINTS, side="left")
            ap[k, t] = np.where(at < len(tp), precision[np.minimum(at, len(tp) - 1), t], 0).mean()
    valid = n_gt > 0
    counted = ~ignored[:, 0]
    p, r, _ = precision_recall(
        [scores[(classes == k) & counted] for k in range(nc)],
        [tps[(classes == k) & counted, 0] for k in range(nc)],
        n_gt,
    )
    return {
        "precision": float(p[valid].mean()) if valid.any() else 0.0,
        "recall": float(r[valid].mean()) if valid.any() else 0.0,
        "mAP50": float(ap[valid, 0].mean()) if valid.any() else 0.0,
        "mAP50-95": float(ap[valid].mean()) if valid.any() else 0.0,
    }


def confusion_matrix(results, records, nc, conf=0.25, iou=0.45):
    """(nc + 1) x (nc + 1) counts: rows = predicted class, columns = true class; the last row and
    column are background (a missed object, or a detection of nothing)."""
    matrix = np.zeros((nc + 1, nc + 1), dtype=np.int64)
    for i, r in enumerate(records):
        h, w = r["shape"]
        gt = np.array(r["labels"], dtype=np.float32).reshape(-1, 5)
        gt_boxes = torch.from_numpy(gt[:, 1:] * [w, h, w, h])
        det = results.get(i, np.zeros((0, 6)))
        det = det[det[:, 4] > conf]
        gt_cls, det_cls = gt[:, 0].astype(int), det[:, 5].astype(int)
        matched_gt, matched_det = set(), set()
        if len(gt) and len(det):
            overlaps = torchvision.ops.box_iou(gt_boxes, torch.from_numpy(det[:, :4]).float()).numpy()
            pairs = np.argwhere(overlaps > iou)
            pairs = pairs[np.argsort(-overlaps[pairs[:, 0], pairs[:, 1]])]  # best overlaps first
            for g, d in pairs:
                if g not in matched_gt and d not in matched_det:
                    matched_gt.add(g)
                    matched_det.add(d)
                    matrix[det_cls[d], gt_cls[g]] += 1
        for g in range(len(gt)):
            if g not in matched_gt:
                matrix[nc, gt_cls[g]] += 1
        for d in range(len(det)):
            if d not in matched_det:
                matrix[det_cls[d], nc] += 1
    return matrix


FITNESS = {  # --fitness: what picks best.pt and drives --patience
    "map": lambda m: m["mAP50-95"],
    "map50": lambda m: m["mAP50"],
    "ultralytics": lambda m: 0.1 * m["mAP50"] + 0.9 * m["mAP50-95"],  # Ultralytics' weighting
}


def epoch_metrics(model, loader, nc, device, half=False, max_det=300, loss_fn=None):
    """The validation after each epoch: {precision, recall, mAP50, mAP50-95} by fast_map (COCO's rules in numpy,
    seconds on COCO val where pycocotools takes a minute), and with `loss_fn` the validation losses (its
    val_columns: val_box_loss, val_cls_loss, val_dfl_loss or val_l1_loss; overfitting shows as these rising while the
    training losses fall). It only picks best.pt and fills results.csv."""
    results, _, losses = predict_dataset(model, loader, device, max_det=max_det, half=half, loss_fn=loss_fn)
    metrics = fast_map(results, loader.dataset.records, nc, max_det)
    return {**metrics, **dict(zip(loss_fn.val_columns, losses))} if losses is not None else metrics


def evaluate(model, loader, names, device, coco_json=None, conf=0.001, iou=0.7, max_det=300, half=False):
    """Everything val.py reports, by pycocotools. Returns a dict with the summary metrics, per-class rows, the
    COCO detections, speeds, the PR curves and the confusion matrix."""
    records = loader.dataset.records
    results, speed, _ = predict_dataset(model, loader, device, conf, iou, max_det, half)
    gt, image_ids, category_ids = ground_truth(records, names, coco_json)
    detections = [d for i, det in results.items() for d in detections_to_coco(det, image_ids[i], category_ids)]
    map5095, map50, ap, ap50, ev = coco_map(gt, detections, category_ids, max_det)
    p, r, curves = precision_recall(*matches_from_cocoeval(ev, category_ids))
    has_gt = curves["n_gt"] > 0
    classes = records.labels[:, 0].astype(int)
    instances = np.bincount(classes, minlength=len(names))
    image_of_box = np.repeat(np.arange(len(records)), np.diff(records.label_offsets))
    images_with = np.bincount(np.unique(image_of_box * len(names) + classes) % len(names), minlength=len(names))
    per_class = [
        {
            "class": n,
            "images": int(images_with[c]),
            "instances": int(instances[c]),
            "precision": float(p[c]),
            "recall": float(r[c]),
            "mAP50": float(ap50[c]),
            "mAP50-95": float(ap[c]),
        }
        for c, n in enumerate(names)
    ]
    metrics = {
        "precision": float(p[has_gt].mean()) if has_gt.any() else 0.0,
        "recall": float(r[has_gt].mean()) if has_gt.any() else 0.0,
        "mAP50": map50,
        "mAP50-95": map5095,
        "images": len(records),
        "instances": int(instances.sum()),
        "speed_ms": speed,
    }
    return {
        "metrics": metrics,
        "per_class": per_class,
        "detections": detections,
        "curves": curves,
        "confusion": confusion_matrix(results, records, len(names)),
        "ground_truth": gt,
    }


def format_table(result, names):
    """The per-class table val.py prints (and train.py at the end)."""
    m = result["metrics"]

    def line(name, r):
        numbers = f"{r['precision']:>7.3f} {r['recall']:>7.3f} {r['mAP50']:>7.3f} {r['mAP50-95']:>9.3f}"
        return f"{name[:16]:>16} {r['images']:>8} {r['instances']:>10} {numbers}"

    lines = [
        f"{'class':>16} {'images':>8} {'instances':>10} {'P':>7} {'R':>7} {'mAP50':>7} {'mAP50-95':>9}",
        line("all", m),
    ]
    if len(names) > 1:
        lines += [line(row["class"], row) for row in result["per_class"]]
    return "\n".join(lines)
