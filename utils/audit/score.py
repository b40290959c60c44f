"""Scores of the label audit, one image at a time, from its boxes and a model's predictions on it (out of sample).

Every annotated box gets a score in [0, 1] for each kind of issue, and every prediction that no box explains gets one
for `missing`; higher = more likely wrong. The model's boxes are matched to the labels one to one (greedy, by IoU),
so a crowd of objects does not lend one box's evidence to its neighbour.
"""

import numpy as np

KINDS = ("missing", "wrong_class", "badly_placed", "spurious", "duplicate")
MATCH_IOU = 0.3  # a prediction this close to a box is taken to be that box's object, wherever its edges lie
MERGE_IOU = 0.6  # predictions of different classes this close are one object (validation NMS keeps one per class)


def box_iou(a, b):
    """IoU of every box of a (n, 4) with every box of b (m, 4), corners in pixels."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)


EVIDENCE_IOU = (
    0.25,
    0.6,
)  # a prediction overlapping a box less than the first says nothing of it; from the second, all


def overlap_weight(iou):
    """How far a prediction counts as evidence about a box: 0 below EVIDENCE_IOU's first, 1 from its second, linear
    between (a loose box still counts)."""
    low, high = EVIDENCE_IOU
    return np.clip((iou - low) / (high - low), 0.0, 1.0)


def merge_classes(predictions):
    """The predictions with the same object's lower-confidence boxes of other classes dropped (highest first)."""
    order = np.argsort(-predictions[:, 4], kind="stable")
    predictions = predictions[order]
    iou = box_iou(predictions[:, :4], predictions[:, :4])
    keep = np.ones(len(predictions), bool)
    for i in range(len(predictions)):
        if keep[i]:
            keep[i + 1 :] &= iou[i, i + 1 :] < MERGE_IOU
    return predictions[keep]


def match(label_boxes, objects):
    """One-to-one pairs (label, object) by descending IoU, each at least MATCH_IOU: {label: object}."""
    iou = box_iou(label_boxes, objects[:, :4])
    pairs, used_labels, used_objects = {}, set(), set()
    for flat in np.argsort(-iou, axis=None, kind="stable"):
        j, p = np.unravel_index(flat, iou.shape)
        if iou[j, p] < MATCH_IOU:
            break
        if j not in used_labels and p not in used_objects:
            pairs[int(j)] = int(p)
            used_labels.add(j)
            used_objects.add(p)
    return pairs


def score_image(labels, predictions, nc, ignored=None):
    """Issues of one image. labels (n, 5): class, x1, y1, x2, y2 in pixels; predictions (m, 6): x1, y1, x2, y2,
    confidence, class; ignored (k, 4): regions where an unlabelled object is no issue (VOC difficult, COCO crowd).
    Returns a list of dicts: kind, label (the box's index, None for missing), class, box, score, suggestion (a box
    or a class index, or None)."""
    labels = np.asarray(labels, np.float64).reshape(-1, 5)
    predictions = np.asarray(predictions, np.float64).reshape(-1, 6)
    boxes, classes = labels[:, 1:], labels[:, 0].astype(int)
    objects = merge_classes(predictions)
    pairs = match(boxes, objects)
    issues = _missing(boxes, objects, pairs, ignored)
    iou = box_iou(boxes, predictions[:, :4])
    for j in range(len(labels)):
        own = objects[pairs[j]] if j in pairs else None
        issues += _box_issues(j, boxes, classes, predictions, iou[j], own, nc)
    return issues


def _missing(boxes, objects, pairs, ignored):
    """A prediction no box claims: missing, as likely as the model is sure (none inside an ignored region)."""
    claimed = set(pairs.values())
    free = [p for p in range(len(objects)) if p not in claimed]
    if ignored is not None and len(ignored) and free:
        inside = _inside_fraction(objects[free, :4], np.asarray(ignored, np.float64).reshape(-1, 4)).max(1)
        free = [p for p, f in zip(free, inside) if f < 0.5]
    near = box_iou(objects[free, :4], boxes).max(1) if len(boxes) and free else np.zeros(len(free))
    return [
        dict(kind="missing", label=None, cls=int(objects[p, 5]), box=objects[p, :4].tolist(),
             score=float(objects[p, 4] * (1 - n)), suggestion=objects[p, :4].tolist())
        for p, n in zip(free, near)
    ]  # fmt: skip


def _box_issues(j, boxes, classes, predictions, iou, own, nc):
    """Box j's scores (iou: with each prediction): wrong class, badly placed, spurious, duplicate."""
    c, box = classes[j], boxes[j].tolist()
    per_class = np.zeros(nc)
    np.maximum.at(per_class, predictions[:, 5].astype(int), predictions[:, 4] * overlap_weight(iou))
    same, others = per_class[c], np.delete(per_class, c)
    other_class = int(np.delete(np.arange(nc), c)[others.argmax()]) if nc > 1 else c
    other = others.max() if nc > 1 else 0.0
    issues = [dict(kind="wrong_class", label=j, cls=int(c), box=box, score=float(other * (1 - same)),
                   suggestion=other_class)]  # fmt: skip
    if own is not None:  # how far the edges of the model's box for this object disagree: a weak model's confidence
        # says whether an object is there, not where its edges lie (bench/RESULTS.md#label-audit)
        own_iou = box_iou(boxes[j : j + 1], own[None, :4])[0, 0]
        issues.append(dict(kind="badly_placed", label=j, cls=int(c), box=box, score=float(1 - own_iou),
                           suggestion=own[:4].tolist()))  # fmt: skip
    # something is there when the model finds any object at IoU MATCH_IOU or more (a neighbour's box overlaps less)
    support = predictions[iou >= MATCH_IOU, 4].max(initial=0.0)
    issues.append(dict(kind="spurious", label=j, cls=int(c), box=box, score=float(1 - support), suggestion=None))
    twins = box_iou(boxes[j : j + 1], boxes)[0] * (classes == c)
    twins[j] = 0
    if twins.max(initial=0) >= 0.5:  # a second box on one object: the one the model backs less is the copy
        backing = own[4] if own is not None else 0.0
        issues.append(dict(kind="duplicate", label=j, cls=int(c), box=box, score=float(twins.max() * (1 - backing)),
                           suggestion=None))  # fmt: skip
    return issues


def _inside_fraction(a, b):
    """The part of each box of a (n, 4) that lies inside each box of b (m, 4)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    return inter / np.maximum((a[:, 2:] - a[:, :2]).prod(1)[:, None], 1e-9)
