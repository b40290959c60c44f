"""Host synchronisations: what bench/host_syncs.count_host_syncs counts, and the training step's pieces that
were rewritten to need fewer of them (padding of the targets, label assignment, box and DFL loss, EMA,
validation's copies to the host), each against the implementation it replaced, kept here as reference_*."""

import copy
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_gpu_path import STRIDES, random_batch
from torchvision.ops import complete_box_iou_loss

from bench.host_syncs import count_host_syncs
from utils.assigner import TINY_SIDE, assign_targets
from utils.boxes import (
    boxes_to_distances,
    complete_iou_loss,
    dfl_decode,
    distances_to_boxes,
    make_anchors,
    non_max_suppression,
    scale_boxes_to_original,
)
from utils.ema import ModelEMA
from utils.evaluate import predict_dataset
from utils.loss import DetectionLoss, pad_targets
from utils.optim import optimizer_step

# -----------------------------------------------------------------------------------------------
# The implementations before (git 59b8ca2), with their host syncs: the references


def reference_pad_targets(targets, batch_size):
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


@torch.no_grad()
def reference_assign_targets(
    pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask, topk=10, alpha=0.5, beta=6.0, tiny_box=TINY_SIDE
):
    b, num_anchors, nc = pred_scores.shape
    n = gt_boxes.shape[1]
    centre, size = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2, gt_boxes[..., 2:] - gt_boxes[..., :2]
    size = torch.where(size < TINY_SIDE, size.clamp(min=tiny_box), size)
    grown = torch.cat((centre - size / 2, centre + size / 2), -1)
    deltas = torch.cat((anchors[None, None] - grown[:, :, None, :2], grown[:, :, None, 2:] - anchors[None, None]), -1)
    in_box = deltas.amin(-1) > 1e-9
    valid = in_box & gt_mask.bool()
    overlaps = torch.zeros(b, n, num_anchors, dtype=pred_boxes.dtype, device=pred_boxes.device)
    box_scores = torch.zeros_like(overlaps)
    batch_index = torch.arange(b, device=gt_labels.device).view(-1, 1).expand(-1, n)
    box_scores[valid] = pred_scores.transpose(1, 2)[batch_index, gt_labels.squeeze(-1).long()][valid]
    pairs_pred = pred_boxes.unsqueeze(1).expand(-1, n, -1, -1)[valid]
    pairs_gt = gt_boxes.unsqueeze(2).expand(-1, -1, num_anchors, -1)[valid]
    overlaps[valid] = (1 - complete_box_iou_loss(pairs_gt, pairs_pred, reduction="none")).clamp_(0).to(overlaps.dtype)
    alignment = box_scores.pow(alpha) * overlaps.pow(beta)
    k = min(topk, num_anchors)
    topk_index = alignment.topk(k, -1).indices
    in_topk = torch.zeros_like(alignment, dtype=torch.bool).scatter_(-1, topk_index, True)
    positive = (in_topk & valid).to(alignment.dtype)
    claims = positive.sum(1)
    if claims.max() > 1:
        multi = (claims > 1).unsqueeze(1).expand(-1, n, -1)
        best = torch.zeros_like(positive).scatter_(1, overlaps.argmax(1, keepdim=True), 1)
        positive = torch.where(multi, best, positive)
    foreground = positive.sum(1) > 0
    assigned = positive.argmax(1)
    flat = assigned + torch.arange(b, device=assigned.device)[:, None] * n
    target_labels = gt_labels.long().flatten()[flat].clamp_(0)
    target_boxes = gt_boxes.view(-1, 4)[flat]
    target_scores = torch.zeros(b, num_anchors, nc, dtype=pred_scores.dtype, device=pred_scores.device)
    target_scores.scatter_(2, target_labels.unsqueeze(-1), 1)
    target_scores *= foreground.unsqueeze(-1)
    alignment *= positive
    best_alignment = alignment.amax(-1, keepdim=True)
    best_overlap = (overlaps * positive).amax(-1, keepdim=True)
    norm = (alignment * best_overlap / (best_alignment + 1e-9)).amax(1).unsqueeze(-1)
    target_scores *= norm
    return target_boxes, target_scores, foreground, assigned


class ReferenceLoss(DetectionLoss):
    @staticmethod
    def padded(targets, like):  # the reference pads inside fp32_loss, as it did
        return targets

    def fp32_loss(self, maps, targets, teacher=None):  # no teacher here: DetectionLoss passes None
        b = maps[0].shape[0]
        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)
        pred_distri, pred_logits = flat.split((4 * self.reg_max, self.nc), 2)
        anchors, strides = make_anchors(maps, self.strides)
        bins = torch.arange(self.reg_max, device=flat.device, dtype=flat.dtype)
        pred_boxes = distances_to_boxes(dfl_decode(pred_distri, bins), anchors)
        gt, gt_mask = reference_pad_targets(targets.to(flat.device), b)
        target_boxes, target_scores, fg, _ = reference_assign_targets(
            pred_logits.detach().sigmoid(),
            pred_boxes.detach() * strides,
            anchors * strides,
            gt[..., :1],
            gt[..., 1:],
            gt_mask,
            topk=self.topk,
            tiny_box=self.tiny_box,
        )
        score_sum = target_scores.sum().clamp(min=1)
        loss_cls = F.binary_cross_entropy_with_logits(pred_logits, target_scores, reduction="none").sum() / score_sum
        loss_box = loss_dfl = flat.new_zeros(())
        if fg.any():
            weight = target_scores.sum(-1)[fg]
            target_grid = target_boxes / strides
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


def reference_ema_update(ema, model):
    ema.updates += 1
    d = ema.decay * (1 - np.exp(-ema.updates / ema.tau))
    weights = model.state_dict()
    for name, value in ema.ema.state_dict().items():
        if value.dtype.is_floating_point:
            value.mul_(d).add_(weights[name].detach(), alpha=1 - d)
        else:
            value.copy_(weights[name])


# -----------------------------------------------------------------------------------------------
# The counter


def test_counter_counts_each_kind_of_host_sync_by_op():
    x = torch.arange(-5.0, 5.0, requires_grad=True)
    mask = x.detach() > 0
    with count_host_syncs() as counts:
        float(x.detach().sum())
        bool(mask.any())
        torch.where(mask)
        y = x[mask]
        z = x.detach().clone()
        z[mask] = torch.zeros(int(mask.sum()))  # a second scalar read: the size
        torch.masked_select(x.detach(), mask)
        torch.unique(mask)
        torch.repeat_interleave(torch.tensor([1, 2]))
        torch.bincount(mask.long())
        mask.tolist()
        x.cpu()
        y.sum().backward()  # x[mask]'s backward puts the gradient back through the mask
    assert counts == {
        "aten._local_scalar_dense": 3,
        "aten.nonzero": 1,
        "aten.index (bool mask)": 1,
        "aten.index_put_ (bool mask)": 1,
        "aten.index_put (bool mask)": 1,
        "aten.masked_select": 1,
        "aten._unique2": 1,
        "aten.repeat_interleave": 1,
        "aten.bincount": 1,
        "Tensor.tolist": 1,
        "Tensor.cpu": 1,
    }


def test_counter_ignores_what_stays_on_the_device():
    x = torch.randn(4, 8, requires_grad=True)
    mask = x.detach() > 0
    with count_host_syncs() as counts:
        y = torch.where(mask, x, 0).sum(1).topk(2).values
        z = x.detach().clone()
        z[mask] = 0  # masked_fill with a host scalar
        index = torch.arange(4)
        x[index, index].sum().backward()  # integer indices
        torch.repeat_interleave(x.detach(), torch.full((4,), 2), dim=0, output_size=8)
        x.detach().to("cpu", non_blocking=True)
        torch.isfinite(y).all()
    assert sum(counts.values()) == 0, counts
    with count_host_syncs(cuda_only=True) as counts:  # on a GPU: CPU tensors are host data
        bool(mask.any())
        mask.tolist()
    assert sum(counts.values()) == 0, counts


# -----------------------------------------------------------------------------------------------
# The rewritten pieces: the same results, fewer syncs


def test_complete_iou_loss_equals_torchvision_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(2, 300, 2, generator=g) * 100
    boxes = torch.cat((xy, xy + 1 + torch.rand(2, 300, 2, generator=g) * 60), -1)
    a, b = boxes[0].clone().requires_grad_(), boxes[1].clone().requires_grad_()
    a_ref, b_ref = boxes[0].clone().requires_grad_(), boxes[1].clone().requires_grad_()
    loss = complete_iou_loss(a, b)
    reference = complete_box_iou_loss(a_ref, b_ref, reduction="none")
    assert (reference > 1).any() and (reference < 1).any()  # disjoint and overlapping pairs both occur
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    loss.sum().backward()
    reference.sum().backward()
    torch.testing.assert_close(a.grad, a_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, b_ref.grad, rtol=1e-5, atol=1e-6)
    # broadcast: every pair of (10 boxes) x (20 boxes) without expanding the inputs
    pairs = complete_iou_loss(boxes[0, :10, None], boxes[1, None, :20])
    expanded = complete_box_iou_loss(boxes[0, :10, None].expand(-1, 20, -1), boxes[1, None, :20].expand(10, -1, -1))
    torch.testing.assert_close(pairs, expanded, rtol=1e-6, atol=1e-6)


def test_pad_targets_equals_the_per_image_loop_in_any_row_order():
    targets = torch.cat(random_batch(5, nc=7, b=6)[1:])
    targets[targets[:, 0] == 3, 0] = 4  # image 3 without boxes
    shuffled = targets[torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))]
    for t, b in ((targets, 6), (shuffled, 6), (targets, 7), (torch.zeros(0, 6), 3), (torch.zeros(0, 6), 0)):
        padded, mask = pad_targets(t, b)
        reference_padded, reference_mask = reference_pad_targets(t, b)
        assert torch.equal(padded, reference_padded) and torch.equal(mask, reference_mask)
    with count_host_syncs() as counts:
        pad_targets(shuffled, 6)
    assert counts == {"aten._local_scalar_dense": 1}  # the largest count: host data in train.py


def assignment_inputs(maps, targets, reg_max=16):
    """The assigner's arguments as DetectionLoss computes them."""
    b, nc = maps[0].shape[0], maps[0].shape[1] - 4 * reg_max
    flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)
    pred_distri, pred_logits = flat.split((4 * reg_max, nc), 2)
    anchors, strides = make_anchors(maps, STRIDES)
    pred_boxes = distances_to_boxes(dfl_decode(pred_distri, torch.arange(reg_max, dtype=flat.dtype)), anchors)
    gt, gt_mask = reference_pad_targets(targets, b)
    return pred_logits.sigmoid(), pred_boxes * strides, anchors * strides, gt[..., :1], gt[..., 1:], gt_mask


@pytest.mark.parametrize("seed", range(6))
def test_assigner_equals_the_masked_gather_version(seed):
    inputs = assignment_inputs(*random_batch(seed, nc=5, imgsz=320, b=4))
    with count_host_syncs() as counts:
        results = assign_targets(*inputs)
    with count_host_syncs() as reference_counts:
        references = reference_assign_targets(*inputs)
    assert sum(counts.values()) == 0 and reference_counts["aten.index (bool mask)"] >= 3, (counts, reference_counts)
    target_boxes, target_scores, fg, assigned = results
    assert fg.any() and torch.equal(fg, references[2]) and torch.equal(assigned, references[3])
    assert torch.equal(target_boxes, references[0])
    torch.testing.assert_close(target_scores, references[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", range(6))
def test_loss_and_its_gradient_equal_the_masked_version_and_sync_at_most_once(seed):
    nc = 7
    head = types.SimpleNamespace(nc=nc, reg_max=16, strides=STRIDES)
    maps, targets = random_batch(seed, nc, imgsz=320, b=4)
    leaves = [m.clone().requires_grad_() for m in maps]
    reference_leaves = [m.clone().requires_grad_() for m in maps]
    with count_host_syncs() as counts:
        loss, parts = DetectionLoss(head)(leaves, targets)
        loss.backward()
    with count_host_syncs() as reference_counts:
        reference_loss, reference_parts = ReferenceLoss(head)(reference_leaves, targets)
        reference_loss.backward()
    # the one left: the largest box count of the targets, which train.py keeps on the host
    assert counts == {"aten._local_scalar_dense": 1}
    assert sum(reference_counts.values()) > 20, reference_counts
    assert (parts > 0).all()
    torch.testing.assert_close(parts, reference_parts, rtol=1e-5, atol=0)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=0)
    for leaf, reference in zip(leaves, reference_leaves):
        scale = reference.grad.abs().max()
        torch.testing.assert_close(leaf.grad, reference.grad, rtol=1e-5, atol=1e-6 * scale)


def test_yolo26_loss_of_both_branches_syncs_once():
    head = types.SimpleNamespace(nc=5, reg_max=1, strides=STRIDES)
    maps, targets = random_batch(1, 5, imgsz=128, b=2, reg_max=1)
    branches = {"one2many": [m.clone().requires_grad_() for m in maps], "one2one": [m.requires_grad_() for m in maps]}
    with count_host_syncs() as counts:
        loss, parts = DetectionLoss(head)(branches, targets)
        loss.backward()
    assert counts == {"aten._local_scalar_dense": 1}  # the targets are padded once, for both branches
    assert (parts > 0).all() and all(torch.isfinite(m.grad).all() for m in branches["one2one"])


def test_loss_without_boxes_has_zero_box_terms_and_finite_gradients():
    maps, _ = random_batch(0, nc=3, imgsz=128, b=2)
    maps = [m.requires_grad_() for m in maps]
    loss, parts = DetectionLoss(types.SimpleNamespace(nc=3, reg_max=16, strides=STRIDES))(maps, torch.zeros(0, 6))
    loss.backward()
    assert parts[0] == 0 and parts[2] == 0 and parts[1] > 0
    assert all(torch.isfinite(m.grad).all() for m in maps)


def test_ema_fused_update_equals_mul_add():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1))
    ema, reference = ModelEMA(model, tau=3), ModelEMA(model, tau=3)
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model.train()(torch.randn(2, 3, 8, 8))  # moves the BN statistics and num_batches_tracked
        ema.update(model)
        reference_ema_update(reference, model)
    state, reference_state = ema.ema.state_dict(), reference.ema.state_dict()
    assert state["1.num_batches_tracked"] == 5
    for name, value in state.items():
        torch.testing.assert_close(value, reference_state[name], rtol=1e-6, atol=1e-6)
    assert not torch.equal(state["0.weight"], model.state_dict()["0.weight"])  # an average, not a copy


def test_optimizer_step_with_a_loss_scale_steps_as_scaler_step_does_with_one_sync():
    def run(step):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
        for k in range(3):
            loss = model(torch.randn(8, 4)).pow(2).sum() * (float("inf") if k == 1 else 1)  # step 1: overflows
            scaler.scale(loss).backward()
            with count_host_syncs() as counts:
                step(model, optimizer, scaler)
        return model.weight.detach().clone(), scaler.get_scale(), counts

    def as_before(model, optimizer, scaler):
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        if bool(torch.isfinite(norm)):
            scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    weight, scale, counts = run(lambda *a: optimizer_step(*a, 10.0))
    reference_weight, reference_scale, reference_counts = run(as_before)
    assert torch.equal(weight, reference_weight) and scale == reference_scale == 2.0**11  # grown, halved, grown
    assert counts == {"aten._local_scalar_dense": 1} and reference_counts["aten._local_scalar_dense"] == 2


class FixedModel(torch.nn.Module):
    """Returns given raw predictions (n, anchors, 4 + nc) whatever the images."""

    def __init__(self, predictions):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.predictions = predictions

    def forward(self, x):
        return self.predictions[: len(x)]


def test_validation_copies_detections_to_the_host_once_per_batch():
    g = torch.Generator().manual_seed(0)
    b, anchors, nc = 3, 200, 4
    xy = torch.rand(b, anchors, 2, generator=g) * 200
    scores = torch.rand(b, anchors, nc, generator=g) ** 4
    scores[1] = 0  # an image without a detection
    predictions = torch.cat((xy, xy + 5 + torch.rand(b, anchors, 2, generator=g) * 50, scores), -1)
    metas = [{"index": 10 + i, "ratio": 0.5, "pad": (4, 8), "shape": (500, 480)} for i in range(b)]
    loader = [(torch.zeros(b, 3, 32, 32), None, metas), (torch.zeros(b, 3, 32, 32), None, copy.deepcopy(metas))]
    for i, m in enumerate(loader[1][2]):
        m["index"] = 20 + i
    with count_host_syncs() as counts:
        results, _, _ = predict_dataset(FixedModel(predictions), loader, torch.device("cpu"), conf=0.05)
    assert counts["Tensor.cpu"] == len(loader)
    assert sorted(results) == [10, 11, 12, 20, 21, 22]
    assert len(results[11]) == 0 and results[11].shape == (0, 6)
    for i, det in enumerate(non_max_suppression(predictions, 0.05, 0.7, max_det=300, multi_label=True)):
        det[:, :4] = scale_boxes_to_original(det[:, :4], 0.5, (4, 8), (500, 480))
        assert len(det) > 0 or i == 1
        assert np.array_equal(results[10 + i], det.numpy()) and np.array_equal(results[20 + i], det.numpy())
