"""Task-aligned label assignment (TOOD / YOLOv8): which anchors learn which ground-truth box.

For every (box, anchor) pair: alignment = score_of_box_class ** alpha * IoU ** beta.
Candidates: anchors whose centre lies inside the box; each box keeps its top-k candidates by
alignment; an anchor claimed by several boxes goes to the one it overlaps most. Class targets
are soft: one-hot scaled by the normalised alignment, so a well-placed anchor is asked for a
high score and a poorly placed one for a low score (IoU-aware classification).

Memory grows as batch x boxes x anchors: this is the part of a step that runs out of GPU memory
on an image with thousands of boxes (pitfall D5). `assign_targets(..., device="cpu")`
runs it on the CPU and returns the results on the caller's device.
"""

from typing import NamedTuple

import torch

from utils.boxes import complete_iou_loss

# Stride-8 anchor centres are 8 px apart, so any open interval longer than 8 px holds one: a box side
# under this may miss every centre. The default of tiny_box: sides under it count as this long.
TINY_SIDE = 8.5
# (alpha, beta) of the alignment score ** alpha * IoU ** beta: TOOD's and YOLOv8's, and the default of every branch
# (a one-to-one head may choose its own: DualAssignment below)
ALIGNMENT = (0.5, 6.0)
# level_by_size: an object is detected on the finest level it spans fewer than this many strides of
LEVEL_STRIDES = 8


class DualAssignment(NamedTuple):
    """How utils/loss.py picks the one-to-one (NMS-free) branch's positives (DetectionLoss's `assignment`). The
    defaults are Ultralytics' YOLO26's; E2E_ASSIGNMENT is 11n-e2e's (docs/yolo26.md says what else was tried)."""

    # True: an object's one-to-one positive lies on the one level its size picks (level_by_size), so that an object
    # whose size suits two levels is not answered on both; False: on whichever level aligns best, as in Ultralytics
    by_level: bool = False
    # (alpha, beta) of the one-to-one branch's alignment; E2E_ASSIGNMENT's lets the score lead: the positive stays on
    # the anchor that answers the object best unless a neighbour's box is much better
    one2one_alignment: tuple = ALIGNMENT


E2E_ASSIGNMENT = DualAssignment(by_level=True, one2one_alignment=(1.0, 2.0))


@torch.no_grad()
def assign_targets(pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask, topk=10, alpha=ALIGNMENT[0],
                   beta=ALIGNMENT[1], tiny_box=TINY_SIDE, device=None, keep=None, levels=None):  # fmt: skip
    """
    pred_scores: (b, A, nc) probabilities;  pred_boxes: (b, A, 4) xyxy pixels;  anchors: (A, 2) pixels
    gt_labels: (b, n, 1);  gt_boxes: (b, n, 4) xyxy pixels;  gt_mask: (b, n, 1), 1 for real boxes (rest is padding)
    tiny_box: box sides under this count as this long for candidate selection (else a tiny object between anchor
              centres is never learned); Ultralytics uses 16 px, TINY_SIDE did better here (bench/RESULTS.md).
    device: where to compute ("cpu" for the OOM retry); results come back on pred_scores' device.
    keep: after the top-k and the one-box-per-anchor rule, each box keeps only its `keep` best anchors by alignment
          (YOLO26's one-to-one branch: topk 7, keep 1, one positive per object); None keeps all.
    levels: (A,) each anchor's stride in pixels: given, a box's candidates are only the anchors of the one level its
            size picks (level_by_size); None: every level's.
    Returns target_boxes (b, A, 4), target_scores (b, A, nc), foreground mask (b, A) bool,
    and the index of the assigned box per anchor (b, A).
    """
    home = pred_scores.device
    if device is not None:
        pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask = (
            t.to(device) for t in (pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask)
        )
    b, num_anchors, nc = pred_scores.shape
    n = gt_boxes.shape[1]
    if n == 0:
        return (
            torch.zeros_like(pred_boxes).to(home),
            torch.zeros_like(pred_scores).to(home),
            torch.zeros(b, num_anchors, dtype=torch.bool, device=home),
            torch.zeros(b, num_anchors, dtype=torch.long, device=home),
        )

    # Every (box, anchor) pair is computed, padding included, and masked with torch.where: a boolean-mask gather
    # of the valid pairs would make the host wait for the GPU (its size depends on the data).
    valid = candidates(anchors, gt_boxes, gt_mask, tiny_box)  # b, n, A
    if levels is not None:
        valid &= level_by_size(gt_boxes, levels.to(valid.device))

    # Alignment metric; 0 outside the candidates.
    batch_index = torch.arange(b, device=gt_labels.device).view(-1, 1).expand(-1, n)
    box_scores = pred_scores.transpose(1, 2)[batch_index, gt_labels.squeeze(-1).long()]  # b, n, A
    box_scores = torch.where(valid, box_scores, 0).to(pred_boxes.dtype)
    overlaps = 1 - complete_iou_loss(gt_boxes[:, :, None], pred_boxes[:, None])  # b, n, A (pairs by broadcasting)
    overlaps = torch.where(valid, overlaps.clamp_(0).to(pred_boxes.dtype), 0)
    alignment = box_scores.pow(alpha) * overlaps.pow(beta)
    del box_scores

    positive = choose_positives(alignment, overlaps, valid, min(topk, num_anchors), keep)
    return tuple(t.to(home) for t in soft_targets(gt_labels, gt_boxes, positive, alignment, overlaps, nc))


def choose_positives(alignment, overlaps, valid, k, keep):
    """(b, n, A) 0/1: each box's positive anchors. Its top-k candidates by alignment (ties broken by topk's order);
    then, with keep, the `keep` best of those. An anchor claimed by several boxes keeps only the box it overlaps
    most."""
    in_topk = torch.zeros_like(alignment, dtype=torch.bool).scatter_(-1, alignment.topk(k, -1).indices, True)
    positive = (in_topk & valid).to(alignment.dtype)  # b, n, A
    # computed whether or not any anchor is claimed twice: asking would be a host sync
    multi = (positive.sum(1) > 1).unsqueeze(1)  # b, 1, A
    best = torch.zeros_like(positive).scatter_(1, overlaps.argmax(1, keepdim=True), 1)
    positive = torch.where(multi, best, positive)
    if keep is not None and keep < k:
        best_anchors = (alignment * positive).topk(keep, -1).indices  # b, n, keep (0 where none: not positive)
        positive = positive * torch.zeros_like(positive).scatter_(-1, best_anchors, 1)
    return positive


def candidates(anchors, gt_boxes, gt_mask, tiny_box):
    """(b, n, A) bool: the anchor centre lies strictly inside the box (sides under tiny_box grown to it about the
    centre), for real boxes only."""
    centre, size = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2, gt_boxes[..., 2:] - gt_boxes[..., :2]
    size = size.clamp(min=tiny_box)
    grown = torch.cat((centre - size / 2, centre + size / 2), -1)[:, :, None]  # b, n, 1, 4
    ax, ay = anchors[:, 0], anchors[:, 1]
    # the smallest of the 4 distances to the sides, as 4 (b, n, A) tensors rather than one (b, n, A, 4)
    inside = torch.min(
        torch.min(ax - grown[..., 0], ay - grown[..., 1]), torch.min(grown[..., 2] - ax, grown[..., 3] - ay)
    )
    return (inside > 1e-9) & gt_mask.bool()


def level_by_size(gt_boxes, strides):
    """(b, n, A) bool: the anchors of the one level at which each box is detected, by its size alone (sqrt(w * h)):
    the finest level it spans fewer than LEVEL_STRIDES strides of (below 64 px at stride 8), one level coarser per
    doubling, the coarsest above.
    For a one-to-one head: where its one positive per object may lie on any level, an object whose size suits two
    is the positive of one level in one step and of the other in the next, and both levels' branches learn to answer
    it: the same object twice, a duplicate that only NMS would remove (bench/RESULTS.md, NMS-free: 11n-e2e)."""
    wh = (gt_boxes[..., 2:] - gt_boxes[..., :2]).clamp(min=1e-6)
    finest, coarsest = strides.min(), strides.max()
    # b, n: 0 below LEVEL_STRIDES finest strides, 1 below twice that, ...
    level = (wh.prod(-1).sqrt() / (LEVEL_STRIDES / 2 * finest)).log2().floor()
    return strides == (finest * 2**level).clamp(finest, coarsest).unsqueeze(-1)


def soft_targets(gt_labels, gt_boxes, positive, alignment, overlaps, nc):
    """Per anchor: the box it learns, its class target (one-hot scaled so that the best anchor of each box is
    asked for its IoU and the others less, with their alignment), whether it is foreground, and the box index."""
    b, n, num_anchors = positive.shape
    foreground = positive.sum(1) > 0
    assigned = positive.argmax(1)  # b, A: index of the box each anchor learns

    flat = assigned + torch.arange(b, device=assigned.device)[:, None] * n
    target_labels = gt_labels.long().flatten()[flat].clamp_(0)
    target_boxes = gt_boxes.view(-1, 4)[flat]
    target_scores = torch.zeros(b, num_anchors, nc, dtype=alignment.dtype, device=alignment.device)
    target_scores.scatter_(2, target_labels.unsqueeze(-1), 1)
    target_scores *= foreground.unsqueeze(-1)

    # Soft targets: the best anchor of each box gets its IoU, the rest scale down with alignment.
    alignment *= positive
    best_alignment = alignment.amax(-1, keepdim=True)
    best_overlap = (overlaps * positive).amax(-1, keepdim=True)
    norm = (alignment * best_overlap / (best_alignment + 1e-9)).amax(1).unsqueeze(-1)
    target_scores *= norm
    return target_boxes, target_scores, foreground, assigned
