"""Detection loss: IoU-aware BCE on class scores, CIoU on boxes, and distribution focal loss (DFL).

Normalisation: every term is summed over anchors and divided by the sum of the soft class
targets of the batch, so it does not grow with the number of boxes; the total is then multiplied
by the batch size. One optimizer step sees (batch x accumulate) ~= 64 images (the nominal batch),
so the gradient of a step is the same whatever `--batch` is, and the learning rates users know from
YOLOv5/YOLOv8 (SGD lr0=0.01) carry over unchanged.

Precision: the whole loss runs in fp32, whatever the model's dtype under AMP. In bf16 (8 bits of
mantissa) pixel coordinates round by 2-4 px, class ids above 256 change, and the DFL target's clamp
just below the last bin rounds onto it (an out-of-range class for the cross-entropy: a crash on CPU,
a device-side assert on CUDA); in fp16 box areas over 65,504 px^2 overflow the assigner's IoU.
"""

import logging

import torch
import torch.nn.functional as F
from torchvision.ops import complete_box_iou_loss

from utils.assigner import TINY_SIDE, assign_targets
from utils.boxes import boxes_to_distances, dfl_decode, distances_to_boxes, make_anchors

log = logging.getLogger("yolo")


def pad_targets(targets, batch_size):
    """(N, 6) rows of (image index, class, x1, y1, x2, y2) -> padded (b, max boxes, 5) and a mask."""
    counts = (
        torch.bincount(targets[:, 0].long(), minlength=batch_size)
        if len(targets)
        else torch.zeros(batch_size, dtype=torch.long)
    )
    n = int(counts.max()) if batch_size else 0
    padded = torch.zeros(batch_size, n, 5, device=targets.device, dtype=targets.dtype)
    mask = torch.zeros(batch_size, n, 1, device=targets.device, dtype=torch.bool)
    for i in range(batch_size):
        rows = targets[targets[:, 0] == i, 1:]
        padded[i, : len(rows)] = rows
        mask[i, : len(rows)] = True
    return padded, mask


class DetectionLoss:
    """Call with the model's training output and the batch's targets; returns (total, parts).

    total: a scalar to backpropagate; parts: detached tensor of (box, cls, dfl), per image. Both fp32.
    `assignments_on_cpu` counts the label assignments that ran out of GPU memory and were redone on
    the CPU, a running total (train.py reports how many each epoch added).
    """

    def __init__(self, head, box_gain=7.5, cls_gain=0.5, dfl_gain=1.5, topk=10, tiny_box=TINY_SIDE):
        self.nc, self.reg_max, self.strides = head.nc, head.reg_max, head.strides
        self.gains = (box_gain, cls_gain, dfl_gain)
        self.topk, self.tiny_box = topk, tiny_box
        self.assignments_on_cpu = 0

    def __call__(self, maps, targets):
        with torch.autocast(maps[0].device.type, enabled=False):  # fp32 even when called inside autocast
            return self.fp32_loss([m.float() for m in maps], targets.float())

    def fp32_loss(self, maps, targets):
        b = maps[0].shape[0]
        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)  # b, A, 4*reg_max + nc
        pred_distri, pred_logits = flat.split((4 * self.reg_max, self.nc), 2)
        anchors, strides = make_anchors(maps, self.strides)  # grid units, and each anchor's stride

        bins = torch.arange(self.reg_max, device=flat.device, dtype=flat.dtype)
        pred_boxes = distances_to_boxes(dfl_decode(pred_distri, bins), anchors)  # grid units

        gt, gt_mask = pad_targets(targets.to(flat.device), b)
        assignment_inputs = (
            pred_logits.detach().sigmoid(),
            pred_boxes.detach() * strides,
            anchors * strides,
            gt[..., :1],
            gt[..., 1:],
            gt_mask,
        )
        try:
            assigned = assign_targets(*assignment_inputs, topk=self.topk, tiny_box=self.tiny_box)
        except torch.OutOfMemoryError:
            assigned = None  # pitfall D5: an image with very many boxes (memory grows as boxes x anchors)
        if assigned is None:  # out of the except block, the failed attempt's tensors are released
            if flat.device.type == "cuda":
                torch.cuda.empty_cache()
            self.assignments_on_cpu += 1
            log.warning(f"out of memory in the label assignment ({len(targets)} boxes in the batch): redone on the CPU")
            assigned = assign_targets(*assignment_inputs, topk=self.topk, tiny_box=self.tiny_box, device="cpu")
        target_boxes, target_scores, fg, _ = assigned
        score_sum = target_scores.sum().clamp(min=1)

        loss_cls = F.binary_cross_entropy_with_logits(pred_logits, target_scores, reduction="none").sum() / score_sum
        loss_box = loss_dfl = flat.new_zeros(())
        if fg.any():
            weight = target_scores.sum(-1)[fg]
            target_grid = target_boxes / strides  # to grid units, like the predictions
            iou_loss = complete_box_iou_loss(pred_boxes[fg], target_grid[fg], reduction="none")
            loss_box = (iou_loss * weight).sum() / score_sum
            target_distances = boxes_to_distances(target_grid, anchors, self.reg_max - 1)[fg]
            loss_dfl = (
                self.distribution_focal_loss(pred_distri[fg].view(-1, self.reg_max), target_distances.view(-1))
                .view(-1, 4)
                .mean(1)
                * weight
            ).sum() / score_sum
        parts = torch.stack((loss_box * self.gains[0], loss_cls * self.gains[1], loss_dfl * self.gains[2]))
        return parts.sum() * b, parts.detach()

    @staticmethod
    def distribution_focal_loss(logits, target):
        """Cross-entropy against the two bins around a continuous target, weighted by closeness."""
        left = target.long().clamp_(max=logits.shape[-1] - 2)  # the right bin must exist, whatever the rounding
        weight_right = target - left
        return (
            F.cross_entropy(logits, left, reduction="none") * (1 - weight_right)
            + F.cross_entropy(logits, left + 1, reduction="none") * weight_right
        )
