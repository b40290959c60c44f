"""Box helpers: formats, anchors, letterbox inverse mapping, and NMS post-processing.

Conventions: `xyxy` = corners in pixels, `xywh` = centre and size in pixels, `xywhn` = centre
and size normalised to 0..1 (the YOLO label format).
"""

import contextlib

import numpy as np
import torch
import torchvision


def xyxy_to_xywh(b):
    out = b.clone() if isinstance(b, torch.Tensor) else np.array(b, dtype=np.float32, copy=True)
    out[..., 0] = (b[..., 0] + b[..., 2]) / 2
    out[..., 1] = (b[..., 1] + b[..., 3]) / 2
    out[..., 2] = b[..., 2] - b[..., 0]
    out[..., 3] = b[..., 3] - b[..., 1]
    return out


def make_anchors(maps, strides, offset=0.5):
    """Anchor points (cell centres, in grid units of their level) and their strides, for every level.
    Always float32, whatever the maps' dtype: an fp16 arange exports as an ONNX Range of float16, which
    ONNX Runtime rejects (INVALID_GRAPH), and the boxes built on these points need fp32 anyway."""
    points, stride_column = [], []
    for m, s in zip(maps, strides):
        h, w = m.shape[-2:]
        sy, sx = torch.meshgrid(
            torch.arange(h, device=m.device, dtype=torch.float32) + offset,
            torch.arange(w, device=m.device, dtype=torch.float32) + offset,
            indexing="ij",
        )
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_column.append(torch.full((h * w, 1), s, dtype=torch.float32, device=m.device))
    return torch.cat(points), torch.cat(stride_column)


_WEIGHTED_SUM = [False]  # set only while dfl_as_weighted_sum() traces a network for NCNN


@contextlib.contextmanager
def dfl_as_weighted_sum():
    """Inside: dfl_decode takes DFL's expectation as a weighted sum (Mul, then a sum over the bins) instead of a matrix
    product. For NCNN only, whose MatMul ran slower than the same graph with the sum
    (bench/RESULTS.md); ONNX Runtime wants the product (see dfl_decode). Only while a network is traced: PyTorch's own
    results are the product's, bitwise."""
    _WEIGHTED_SUM[0] = True
    try:
        yield
    finally:
        _WEIGHTED_SUM[0] = False


def dfl_decode(distri, bins):
    """DFL: (..., 4 * reg_max) logits -> (..., 4) side distances in grid units, each the expectation
    of the softmax over its reg_max bins. `bins`: torch.arange(reg_max) (any device and dtype)."""
    # A (bins, 1) matrix, not the vector: ONNX Runtime runs a MatMul with a 1-D operand several times slower;
    # PyTorch gives the same result, bitwise, either way.
    probabilities = distri.reshape(*distri.shape[:-1], 4, len(bins)).softmax(-1)  # not unflatten: x2paddle lacks it
    if _WEIGHTED_SUM[0]:
        return (probabilities * bins.to(distri.dtype)).sum(-1)
    return (probabilities @ bins.to(distri.dtype)[:, None]).squeeze(-1)


def distances_to_boxes(distances, anchors):
    """(left, top, right, bottom) distances from anchor points -> xyxy."""
    lt, rb = distances.chunk(2, -1)
    return torch.cat((anchors - lt, anchors + rb), -1)


def boxes_to_distances(boxes, anchors, max_distance=None):
    """xyxy -> (left, top, right, bottom) distances, clipped just below the last DFL bin (max_distance: reg_max - 1;
    None, without DFL: as they are)."""
    x1y1, x2y2 = boxes.chunk(2, -1)
    distances = torch.cat((anchors - x1y1, x2y2 - anchors), -1)
    return distances if max_distance is None else distances.clamp_(0, max_distance - 0.01)


def complete_iou_loss(boxes1, boxes2, eps=1e-7):
    """torchvision.ops.complete_box_iou_loss(reduction="none") (1 - CIoU), term for term, but the intersection
    is a torch.where instead of its boolean-mask indexing, which makes the host wait for the GPU twice (forward
    and backward). xyxy boxes broadcast: (b, n, 1, 4) against (b, 1, A, 4) gives every pair without copying
    the boxes out to (b, n, A, 4)."""
    x1, y1, x2, y2 = boxes1.unbind(-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(-1)
    xkis1, ykis1, xkis2, ykis2 = torch.max(x1, x1g), torch.max(y1, y1g), torch.min(x2, x2g), torch.min(y2, y2g)
    intersection = torch.where((ykis2 > ykis1) & (xkis2 > xkis1), (xkis2 - xkis1) * (ykis2 - ykis1), 0)
    del xkis1, ykis1, xkis2, ykis2  # these are (b, n, A) each in the assigner: freed before the next ones
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - intersection
    iou = intersection / (union + eps)
    del intersection, union
    diagonal = ((torch.max(x2, x2g) - torch.min(x1, x1g)) ** 2) + ((torch.max(y2, y2g) - torch.min(y1, y1g)) ** 2) + eps
    centres = (((x2 + x1) / 2 - (x1g + x2g) / 2) ** 2) + (((y2 + y1) / 2 - (y1g + y2g) / 2) ** 2)
    loss = 1 - iou + (centres / diagonal)
    del diagonal, centres
    v = (4 / (torch.pi**2)) * torch.pow((torch.atan((x2g - x1g) / (y2g - y1g)) - torch.atan((x2 - x1) / (y2 - y1))), 2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return loss + alpha * v


def resized_side(side, ratio):
    """A side of `side` pixels resized by `ratio`, in whole pixels; a thin strip never becomes 0 px. The one
    rounding rule of letterbox and of scale_boxes_to_original, which must agree to the pixel."""
    return max(1, round(side * ratio))


def scale_boxes_to_original(boxes, ratio, pad, original_shape):
    """Undo the letterbox: boxes in network-input pixels -> pixels of the original image, clipped.

    ratio: the resize factor (new / original); pad: (left, top) padding added after resizing;
    original_shape: (height, width) of the image as it was read. The resize rounded each side to whole
    pixels (resized_side), so each axis is undone with its own exact factor, not the nominal one (off by up
    to half a pixel per side).
    """
    h, w = original_shape
    boxes = boxes.clone()
    boxes[..., [0, 2]] = (boxes[..., [0, 2]] - pad[0]) / (resized_side(w, ratio) / w)
    boxes[..., [1, 3]] = (boxes[..., [1, 3]] - pad[1]) / (resized_side(h, ratio) / h)
    boxes[..., [0, 2]] = boxes[..., [0, 2]].clamp(0, w)
    boxes[..., [1, 3]] = boxes[..., [1, 3]].clamp(0, h)
    return boxes


def top_pairs(scores, max_det=300):
    """(batch, anchors, nc) probabilities -> the anchor, score and class (each batch, k) of the k =
    min(max_det, anchors) best (anchor, class) pairs among the k anchors with the best top class, best first (as
    Ultralytics' end-to-end head, so that its checkpoints give its detections); an anchor may appear once per
    class."""
    nc, k = scores.shape[-1], min(max_det, scores.shape[1])
    anchors = scores.amax(2).topk(k, 1).indices  # b, k
    scores = scores.gather(1, anchors.unsqueeze(-1).expand(-1, -1, nc))  # b, k, nc
    best, index = scores.flatten(1).topk(k, 1)  # b, k over the k x nc pairs
    return anchors.gather(1, index // nc), best, index % nc


def top_detections(decoded, max_det=300):
    """An end-to-end (one-to-one) head's decoded output (batch, anchors, 4 + nc) -> its final detections (batch, k, 6)
    x1 y1 x2 y2 score class, best first: top_pairs' detections. models/head.py answers so; a runtime without TopK
    (NCNN) gets it here."""
    anchor, score, cls = top_pairs(decoded[..., 4:], max_det)
    boxes = decoded[..., :4].gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))
    return torch.cat((boxes, score.unsqueeze(-1), cls.unsqueeze(-1).to(boxes.dtype)), 2)


def non_max_suppression(
    predictions, conf=0.25, iou=0.7, classes=None, max_det=300, multi_label=False, max_candidates=30000, end2end=False
):
    """Per image: confidence threshold, class-aware NMS, at most max_det boxes.

    predictions: (batch, anchors, 4 + nc) as the model returns in eval mode.
    Returns a list (one per image) of (n, 6) tensors: x1 y1 x2 y2 score class.
    multi_label: one box may be kept for several classes (better mAP; use it for validation).
    end2end: the predictions are final detections (batch, k, 6), best first, as YOLO26 (model.end2end) and a graph
    exported with NMS inside give them: only conf, classes and max_det apply, no NMS.
    There is deliberately no time limit: a limit that silently drops images corrupts mAP.
    """
    if end2end:
        output = []
        for pred in predictions:
            keep = pred[:, 4] > conf
            if classes is not None:
                keep &= torch.isin(pred[:, 5].long(), torch.as_tensor(classes, device=pred.device))
            output.append(pred[keep][:max_det])
        return output
    output = []
    for pred in predictions:
        boxes, scores = pred[:, :4], pred[:, 4:]
        if multi_label:
            i, j = (scores > conf).nonzero(as_tuple=True)
            boxes, score, cls = boxes[i], scores[i, j], j
        else:
            score, cls = scores.max(1)
            keep = score > conf
            boxes, score, cls = boxes[keep], score[keep], cls[keep]
        if classes is not None:
            keep = torch.isin(cls, torch.as_tensor(classes, device=cls.device))
            boxes, score, cls = boxes[keep], score[keep], cls[keep]
        if score.numel() > max_candidates:  # bound the NMS cost on a degenerate, all-positive output
            top = score.topk(max_candidates).indices
            boxes, score, cls = boxes[top], score[top], cls[top]
        keep = torchvision.ops.batched_nms(boxes.float(), score.float(), cls, iou)[:max_det]
        output.append(torch.cat((boxes[keep], score[keep, None], cls[keep, None].to(boxes.dtype)), 1))
    return output
