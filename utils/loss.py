"""Detection loss: IoU-aware BCE on class scores, CIoU on boxes, and distribution focal loss (DFL), or an L1 loss
on the side distances for a model without DFL bins (reg_max 1, YOLO26); with a teacher (train.py --teacher), a
distillation term on the class scores. DetectionLoss.names names the parts.

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

import numpy as np
import torch
import torch.nn.functional as F

from utils.assigner import ALIGNMENT, TINY_SIDE, DualAssignment, assign_targets
from utils.boxes import boxes_to_distances, complete_iou_loss, dfl_decode, distances_to_boxes, make_anchors

log = logging.getLogger("yolo")


# --cls-weights auto: no class weighs more than this many times the least weighted one. Uncapped, a class with 3
# boxes among 30,000 would weigh 10,000x: its few anchors would then drive the whole class term (a noisy gradient
# from a handful of boxes) and a class absent from the training labels would weigh infinitely.
CLASS_WEIGHT_CAP = 10.0


def resolve_class_weights(text, class_ids, nc):
    """--cls-weights as the run uses it: (the setting with `auto` replaced by its numbers, the nc weights), or
    ("", None) when off. `auto`: inverse class frequency over the training boxes (`class_ids`, one per box), capped
    at CLASS_WEIGHT_CAP x the smallest, scaled to mean 1 over the classes. That keeps the negatives' share of the
    class term (every channel has about as many negatives), not the positives': most positives are of the common
    classes, which weigh less, so the class term of an imbalanced set shrinks next to the box terms
    (bench/RESULTS.md#rare-classes). A list is used as written. The
    numbers go into args.yaml and last.pt, so that a resumed run weighs exactly as it started even if the labels
    have changed since. ValueError: one sentence naming the flag."""
    text = str(text).strip().strip("[]")  # "[1, 2]": a dataset yaml's `defaults:` may give a list
    if not text:
        return "", None
    if text == "auto":
        counts = np.bincount(np.asarray(class_ids, dtype=np.int64), minlength=nc).tolist()
        if not any(counts):  # no box at all: nothing to balance
            weights = [1.0] * nc
        else:
            inverse = [1 / n if n else float("inf") for n in counts]
            weights = [min(w, CLASS_WEIGHT_CAP * min(inverse)) for w in inverse]
    else:
        weights = []
        for part in text.split(","):
            try:
                weights.append(float(part))
            except ValueError:
                raise ValueError(
                    f"--cls-weights {text}: '{part.strip()}' is not a number; give auto or {nc} comma-separated "
                    f"numbers, one per class in the order of the dataset's names (nc={nc})"
                ) from None
        if len(weights) != nc or not all(0 <= w < float("inf") for w in weights):
            what = (
                f"has {len(weights)} numbers" if len(weights) != nc else "has a number that is negative or not finite"
            )
            raise ValueError(
                f"--cls-weights {text} {what} for a dataset of nc={nc} classes; give auto or {nc} comma-separated "
                f"numbers >= 0, one per class in the order of the dataset's names"
            )
        return ",".join(map(repr, weights)), weights
    mean = sum(weights) / nc
    weights = [w / mean for w in weights]
    return ",".join(map(repr, weights)), weights


def pad_targets(targets, batch_size):
    """(N, 6) rows of (image index, class, x1, y1, x2, y2) -> padded (b, max boxes, 5) and a mask; each image's
    boxes in their order in `targets`. One host read (the largest count, which sizes the result): on CPU
    targets, as the loader gives them, no wait for the GPU at all."""
    image = targets[:, 0].long()
    # index_add_ rather than bincount: bincount's CUDA kernel reads the data's min and max back to the host
    counts = torch.zeros(batch_size, dtype=torch.long, device=targets.device).index_add_(
        0, image, torch.ones_like(image)
    )
    n = int(counts.max()) if batch_size else 0
    order = torch.argsort(image, stable=True)
    image = image[order]
    slot = torch.arange(len(image), device=targets.device) - (torch.cumsum(counts, 0) - counts)[image]
    padded = torch.zeros(batch_size, n, 5, device=targets.device, dtype=targets.dtype)
    mask = torch.zeros(batch_size, n, 1, device=targets.device, dtype=torch.bool)
    padded[image, slot] = targets[order, 1:]
    mask[image, slot] = True
    return padded, mask


def one_to_many_weight(epoch, epochs, final=0.1):
    """ProgLoss (YOLO26): the weight of the one-to-many loss in epoch `epoch` (0-based) of `epochs`; the one-to-one
    loss gets 1 minus it. It falls linearly from 0.8 in the first epoch to `final` in the last, as Ultralytics'
    E2ELoss does (its update() after each epoch, with this default final): early, the dense one-to-many targets shape
    the shared features; late, the loss is mostly that of the one-to-one head inference uses. final equal to the
    start: a constant weight (no ProgLoss, train.py --o2m-final). A pure function of the epoch: resume needs no
    state."""
    return final + (0.8 - final) * max(1 - epoch / max(epochs - 1, 1), 0)


def take(t, index):
    """(b, A, c) -> (b, k, c): the anchors `index` (b, k) of each image."""
    return t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))


class DetectionLoss:
    """Call with the model's training output and the batch's targets; returns (total, parts).

    total: a scalar to backpropagate; parts: detached tensor of the terms named by `names`, per image. Both fp32.
    Without DFL (reg_max 1, YOLO26) the third term is an L1 loss on the 4 side distances, in fractions of the image
    size, and is named `l1`. With a one-to-one branch (YOLO26: the maps come as {"one2many", "one2one"}) the total is
    the two branches' losses weighted by one_to_many_weight(self.epoch, self.epochs, o2m_final) (train.py sets the
    epoch), and parts are the one-to-one branch's (what inference uses; Ultralytics logs the same). The one-to-one
    assignment picks topk 7 candidates and keeps the best one per object.
    `assignments_on_cpu` counts the label assignments that ran out of GPU memory and were redone on
    the CPU, a running total (train.py reports how many each epoch added).
    """

    def __init__(
        self,
        head,
        box_gain=7.5,
        cls_gain=0.5,
        dfl_gain=1.5,
        topk=10,
        tiny_box=TINY_SIDE,
        class_weights=None,
        epochs=1,
        o2m_final=0.1,
        distill_gain=None,
        assignment=DualAssignment(),
    ):
        self.nc, self.strides = head.nc, head.strides
        self.reg_max = head.reg_max  # the box bins per side, of both heads where there are two
        # The loss parts, in the order of `parts` (fp32_loss's `terms`), named here and nowhere else: results.csv's
        # columns (`columns`, `val_columns`), the validation losses, the progress bar and the log all read these. A
        # new term: its name here, its gain below (its flag: utils/hyperparameters.py, handed over by train.py), its
        # code in fp32_loss's `terms`. The third term is DFL's only with DFL bins: without them (reg_max 1) it is an
        # L1 loss, and a `dfl_loss` column would send a reader after the wrong one.
        self.names = ("box", "cls", "dfl" if self.reg_max > 1 else "l1")
        self.gains = (box_gain, cls_gain, dfl_gain)
        # --teacher: a fourth part, last, so that the validation's parts (no teacher there) are the first three
        self.distill = distill_gain is not None
        if self.distill:
            self.names, self.gains = (*self.names, "distill"), (*self.gains, distill_gain)
        # --cls-weights: one factor per class channel of the BCE, on its positives and its negatives alike. Weighting
        # the whole channel leaves the score each anchor is pulled towards unchanged (the minimum of w * BCE is where
        # BCE's is), so scores stay calibrated for --conf and NMS; only how much each class counts in the gradient
        # changes. A weight on the positives alone (pos_weight) would inflate the rare class's scores instead: more
        # of its false positives. None: the plain BCE, bitwise as without the option.
        self.class_weights = None if class_weights is None else torch.tensor(class_weights, dtype=torch.float32)
        self.topk, self.tiny_box = topk, tiny_box
        # ProgLoss's position and end (end-to-end heads only; train.py sets the epoch)
        self.epoch, self.epochs, self.o2m_final = 0, epochs, o2m_final
        self.assignment = assignment  # the one-to-one branch's rule (models/yolo.py assignment_of)
        self.assignments_on_cpu = 0

    @property
    def columns(self):
        """results.csv's columns of the training loss: box_loss, cls_loss, dfl_loss (l1_loss without DFL)."""
        return tuple(f"{name}_loss" for name in self.names)

    @property
    def val_columns(self):
        """results.csv's columns of the validation loss: val_box_loss, val_cls_loss, val_dfl_loss (val_l1_loss). No
        column for `distill`: validation runs no teacher (its part, last, is 0 there and left out of these columns)."""
        return tuple(f"val_{name}_loss" for name in self.names if name != "distill")

    def __call__(self, maps, targets, teacher_maps=None):
        """teacher_maps: the teacher's raw maps of the same batch (train.py --teacher), for the `distill` part."""
        device = (maps["one2many"] if isinstance(maps, dict) else maps)[0].device
        with torch.autocast(device.type, enabled=False):  # fp32 even when called inside autocast
            teacher = self.class_logits(teacher_maps) if teacher_maps is not None else None
            if not isinstance(maps, dict):
                return self.fp32_loss([m.float() for m in maps], self.padded(targets, maps[0]), teacher=teacher)
            padded = self.padded(targets, maps["one2many"][0])  # once for both branches: one host read
            # the teacher's dense scores teach the one-to-many branch (the one-to-one learns one positive per
            # object), so its weight follows that branch's under ProgLoss
            one2many = self.fp32_loss([m.float() for m in maps["one2many"]], padded, teacher=teacher)
            o2o, rule = [m.float() for m in maps["one2one"]], self.assignment
            o2o_rule = dict(by_level=rule.by_level, alignment=rule.one2one_alignment)
            one2one = self.fp32_loss(o2o, padded, topk=7, keep=1, **o2o_rule)
            weight = one_to_many_weight(self.epoch, self.epochs, self.o2m_final)
            parts = torch.cat((one2one[1][:3], one2many[1][3:]))  # the one-to-one's, and the distillation term
            return one2many[0] * weight + one2one[0] * (1 - weight), parts

    @staticmethod
    def padded(targets, like):
        """pad_targets of the batch, fp32, on the maps' device (`like`), for fp32_loss."""
        if targets.device.type != "cpu":
            targets = targets.cpu()  # the one wait for the GPU: padding needs the largest box count on the host
        # train.py keeps the targets on the host: padded there, they reach the GPU without a sync
        return tuple(t.to(like.device, non_blocking=True) for t in pad_targets(targets.float(), like.shape[0]))

    def predictions(self, maps):
        """One branch's maps as (box bins per side, box outputs (DFL logits, or the 4 distances without DFL), class
        logits, boxes in grid units, anchors in grid units, each anchor's stride)."""
        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)  # b, A, 4*reg_max + nc
        reg_max = self.reg_max
        pred_distri, pred_logits = flat.split((4 * reg_max, self.nc), 2)
        anchors, strides = make_anchors(maps, self.strides)
        bins = torch.arange(reg_max, device=flat.device, dtype=flat.dtype)
        pred_distances = dfl_decode(pred_distri, bins) if reg_max > 1 else pred_distri
        return reg_max, pred_distri, pred_logits, distances_to_boxes(pred_distances, anchors), anchors, strides

    def fp32_loss(self, maps, padded, topk=None, keep=None, by_level=False, alignment=ALIGNMENT, teacher=None):
        """One branch's (total, parts); padded: (gt, gt_mask) from DetectionLoss.padded. by_level: each object's
        anchors come from the one level its size picks (utils/assigner.py level_by_size), else from every level.
        alignment: (alpha, beta) of the assignment's score ** alpha * IoU ** beta (utils/assigner.py). teacher: the
        teacher's class logits (b, A, nc) for the distillation part; None: that part is 0 (validation)."""
        b = maps[0].shape[0]
        topk = topk or self.topk
        reg_max, pred_distri, pred_logits, pred_boxes, anchors, strides = self.predictions(maps)
        alpha, beta = alignment
        levels = strides.squeeze(-1) if by_level else None
        settings = dict(topk=topk, keep=keep, levels=levels, alpha=alpha, beta=beta)
        target_boxes, target_scores, fg = self.assign(pred_logits, pred_boxes, anchors, strides, padded, settings)
        score_sum = target_scores.sum().clamp(min=1)
        loss_cls = self.class_term(pred_logits, target_scores) / score_sum

        # The box and distance terms, on each image's foreground anchors only
        index, weight, fg = self.foreground(fg, target_scores, padded[0].shape[1] * topk)
        target_grid = take(target_boxes / strides, index)  # to grid units, like the predictions
        loss_box = (self.box_term(take(pred_boxes, index), target_grid, fg) * weight).sum() / score_sum
        if reg_max > 1:
            distance = self.dfl_term(take(pred_distri, index), target_grid, anchors[index], reg_max)
        else:
            grid = maps[0].shape[-2:]
            distance = self.l1_term(take(pred_distri, index), target_grid, anchors[index], strides[index], grid)
        loss_distance = (distance * weight).sum() / score_sum

        terms = (loss_box, loss_cls, loss_distance)  # in the order of self.names
        if self.distill:  # normalised as the class term is, so that its gain reads like --cls's
            no_teacher = teacher is None
            loss_distill = loss_cls.new_zeros(()) if no_teacher else self.distill_term(pred_logits, teacher) / score_sum
            terms = (*terms, loss_distill)
        parts = torch.stack([term * gain for term, gain in zip(terms, self.gains)])
        return parts.sum() * b, parts.detach()

    def assign(self, pred_logits, pred_boxes, anchors, strides, padded, settings):
        """utils/assigner.py's label assignment of one branch: (target boxes in pixels, target scores, foreground
        mask), each anchor's. Redone on the CPU when it runs out of GPU memory (pitfall D5: an image with very many
        boxes; its memory grows as boxes x anchors), which `assignments_on_cpu` counts and the log says."""
        gt, gt_mask = padded
        inputs = (
            pred_logits.detach().sigmoid(),
            pred_boxes.detach() * strides,
            anchors * strides,
            gt[..., :1],
            gt[..., 1:],
            gt_mask,
        )
        settings = dict(settings, tiny_box=self.tiny_box)  # topk, keep, levels, alpha, beta
        try:
            assigned = assign_targets(*inputs, **settings)
        except torch.OutOfMemoryError:
            assigned = None
        if assigned is None:  # out of the except block, the failed attempt's tensors are released
            if pred_logits.device.type == "cuda":
                torch.cuda.empty_cache()
            self.assignments_on_cpu += 1
            log.warning(
                f"out of memory in the label assignment ({int(gt_mask.sum())} boxes in the batch): redone on the CPU"
            )
            assigned = assign_targets(*inputs, **settings, device="cpu")
        target_boxes, target_scores, fg, _ = assigned
        return target_boxes, target_scores, fg

    @staticmethod
    def foreground(fg, target_scores, most):
        """(index, weight, fg) of the anchors the box terms see: index (b, k) picks each image's foreground anchors,
        weight (b, k) is their summed target score and fg (b, k, 1) tells them from the background ones among them
        (weight 0). Gathered without asking how many there are (fg.any() or pred_boxes[fg] would make the host wait
        for the GPU): an image has at most `most` = n boxes * topk of them (each box claims at most topk anchors,
        each anchor learns one box), so its first `most` anchors in fg order hold them all."""
        k = min(fg.shape[1], most)
        index = fg.float().topk(k, 1).indices  # b, k
        weight = (target_scores.sum(-1) * fg).gather(1, index)
        return index, weight, fg.gather(1, index).unsqueeze(-1)

    def class_term(self, pred_logits, target_scores):
        """The class loss of every anchor, summed: BCE against the assignment's soft (IoU-aware) scores."""
        if self.class_weights is not None and self.class_weights.device != pred_logits.device:
            self.class_weights = self.class_weights.to(pred_logits.device)  # once: a copy per step would be a sync
        bce = F.binary_cross_entropy_with_logits(pred_logits, target_scores, self.class_weights, reduction="none")
        return bce.sum()

    def class_logits(self, maps):
        """The teacher's raw maps (its one-to-many branch's where it has two heads) -> class logits (b, A, nc), fp32,
        in the anchors' order of predictions: the last nc channels of each level's map, whatever its box bins (a DFL
        teacher teaches a student without DFL)."""
        maps = maps["one2many"] if isinstance(maps, dict) else maps
        return torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)[..., -self.nc :].float()

    @staticmethod
    def distill_term(pred_logits, teacher_logits):
        """Class-score distillation, summed over every anchor and class: the KL divergence of the student's score
        from the teacher's, each a Bernoulli (the scores are per-class sigmoids, not one softmax). That is the BCE
        against the teacher's scores less the teacher's own entropy: the same gradient, and 0 for a student that
        scores exactly as its teacher does. No temperature: a sigmoid score below one is already soft; the
        teacher's near misses and second classes teach as they are."""
        target = teacher_logits.sigmoid()
        return (
            F.binary_cross_entropy_with_logits(pred_logits, target, reduction="none")
            - F.binary_cross_entropy_with_logits(teacher_logits, target, reduction="none")
        ).sum()

    @staticmethod
    def box_term(pred_boxes, target_boxes, fg):
        """1 - CIoU of each gathered anchor's box (b, k), grid units."""
        # A background anchor's target is whatever box index 0 holds, maybe an all-zero padding box whose CIoU
        # is 0/0: unit boxes there keep the forward finite, and hence the (zero) gradient free of NaN.
        unit = pred_boxes.new_zeros(4)
        unit[2:] = 1  # not new_tensor([0, 0, 1, 1]): a blocking copy from the host, a sync too
        return complete_iou_loss(torch.where(fg, pred_boxes, unit), torch.where(fg, target_boxes, unit))

    def dfl_term(self, pred_distri, target_boxes, anchors, reg_max):
        """DFL of each gathered anchor (b, k), the mean of its 4 sides: the bins' logits against the target
        distances, clamped just below the last bin (so finite)."""
        target_distances = boxes_to_distances(target_boxes, anchors, reg_max - 1)
        dfl = self.distribution_focal_loss(pred_distri.view(-1, reg_max), target_distances.view(-1))
        return dfl.view(pred_distri.shape[0], -1, 4).mean(-1)

    def l1_term(self, pred_distances, target_boxes, anchors, strides, grid):
        """Without DFL: L1 of each gathered anchor (b, k), the mean of its 4 side distances, in fractions of the
        image's width (left, right) and height (top, bottom). grid: the first level's (h, w), in cells."""
        h, w = (s * self.strides[0] for s in grid)
        sides = pred_distances.new_full((4,), float(w))  # filled on the device: new_tensor([w, h, w, h]) is a sync
        sides[1::2] = h
        scale = strides / sides  # grid units -> pixels -> fractions of the image
        target_distances = boxes_to_distances(target_boxes, anchors)
        return ((pred_distances - target_distances).abs() * scale).mean(-1)

    @staticmethod
    def distribution_focal_loss(logits, target):
        """Cross-entropy against the two bins around a continuous target, weighted by closeness (one
        log-softmax for both bins: F.cross_entropy twice would compute it twice)."""
        left = target.long().clamp_(max=logits.shape[-1] - 2)  # the right bin must exist, whatever the rounding
        weight_right = target - left
        log_probs = logits.log_softmax(-1)
        return (
            -log_probs.gather(-1, left[:, None]).squeeze(-1) * (1 - weight_right)
            + -log_probs.gather(-1, left[:, None] + 1).squeeze(-1) * weight_right
        )
