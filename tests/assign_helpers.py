"""Building assigner inputs from a few boxes, for the assigner tests (test_model.py, test_yolo26.py)."""

import torch

from utils.assigner import assign_targets
from utils.boxes import make_anchors


def anchors_for(size, strides=(8, 16, 32)):
    """Every anchor point of a size x size input, in pixels, and its stride."""
    maps = [torch.zeros(1, 1, size // s, size // s) for s in strides]
    points, stride = make_anchors(maps, strides)
    return points * stride, stride


def assign(gt_boxes_per_image, size=64, nc=3, pred_boxes=None, device=None, **kw):
    """assign_targets on boxes given per image as (class, x1, y1, x2, y2), every class scored 0.5 and every anchor
    predicting a 16x16 box around itself unless pred_boxes says otherwise. Returns the anchors and its answer."""
    anchors, _ = anchors_for(size)
    b, n = len(gt_boxes_per_image), max(len(g) for g in gt_boxes_per_image)
    gt_boxes, gt_labels, gt_mask = torch.zeros(b, n, 4), torch.zeros(b, n, 1), torch.zeros(b, n, 1, dtype=torch.bool)
    for i, boxes in enumerate(gt_boxes_per_image):
        for j, (cls, *xyxy) in enumerate(boxes):
            gt_boxes[i, j], gt_labels[i, j], gt_mask[i, j] = torch.tensor(xyxy, dtype=torch.float32), cls, True
    scores = torch.full((b, len(anchors), nc), 0.5)
    if pred_boxes is None:  # every anchor predicts a 16x16 box around itself
        pred_boxes = torch.cat((anchors - 8, anchors + 8), 1).expand(b, -1, -1).clone()
    return anchors, assign_targets(scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask, device=device, **kw)
