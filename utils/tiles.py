"""Sliced inference (detect.py and val.py --tile): small objects in large images, found at the model's own scale.

A 3000x2000 photo letterboxed to 640 px shrinks a 20 px object to 4 px, below what the network can see. Instead the
image is cut into overlapping tiles of --tile px (SAHI's slicing: a grid whose last row and column are flush with
the image's far edges), each tile is letterboxed to the model's input size and run through the network in batches,
and the boxes are shifted back into the image. The whole image is run once more, letterboxed as usual, for the
objects too large for a tile. Then one box is kept per object:

- A box that touches a tile side lying inside the image is "cut": the seam runs through its object. An object no
  wider than the overlap also lies whole in the neighbouring tile, whose box is the right one, so a cut box gives way
  to a whole box (from another tile or the whole-image pass) that covers at least half of it. Comparing by IoU, as
  NMS does, would miss this: a box cut in half has an IoU of 0.5 or less with the whole box.
- Whole boxes of one object from two tiles (it lay in their overlap) or from a tile and the whole-image pass are
  the same box seen twice: IoU >= MATCH across sources, the higher score kept. Boxes of one tile never suppress each
  other here (the tile's own NMS has decided between them), so adjacent or nested objects survive.
- Two cut boxes from different tiles (pieces of an object wider than the overlap that the whole-image pass missed)
  overlapping by half of the smaller one: the higher score is kept, as SAHI's NMS with its IOS metric does.
- The whole-image pass keeps only boxes at least as long as the overlap: a smaller object lies whole in some tile,
  which sees it at a higher resolution than the shrunken whole image.

SAHI (MIT) has these ideas and more, but pulls in shapely, fire, click and requests, and opencv-python, whose cv2
would overwrite opencv-python-headless's; what is used of it fits in this module. The entry point is `tiled_predictor`,
which wraps any Predictor of utils/inference.py (a .pt or any exported file) into one whose input is a whole image
at its own size and whose output is the final boxes, so that detect.py and val.py run it through their usual path
unchanged.
"""

import numpy as np
import torch
import torch.nn.functional as F

from utils.boxes import resized_side, scale_boxes_to_original
from utils.data.augment import PAD_VALUE
from utils.data.images import load_resized
from utils.data.records import as_records
from utils.inference import postprocess

DEFAULT_OVERLAP = 0.2  # SAHI's default: 20 % of a tile shared with each neighbour
MATCH = 0.5  # the IoU (whole boxes) or covered fraction (cut boxes) at which two boxes are one object
EDGE = 2.0  # model-input px: a box this close to a tile side inside the image is cut (boxes are clipped to the tile)
# Input pixels per forward when the model takes any batch size: 32 tiles at 320 px, 8 at 640, since small maps pay a
# per-call overhead (bench/RESULTS.md#sliced-inference)
BATCH_PIXELS = 32 * 320 * 320


def tiling_error(tile, overlap, imgsz):
    """One sentence when --tile and --overlap cannot slice for a model of input size imgsz (h, w), else None."""
    if tile < max(imgsz):
        return (
            f"--tile {tile} is smaller than the model's input ({imgsz[0]}x{imgsz[1]} px): each tile is run at the "
            f"model's size, so a smaller one would only be enlarged; use --tile {max(imgsz)} or more"
        )
    if not 0 <= overlap <= 0.9:
        return f"--overlap {overlap} must be between 0 and 0.9 (the fraction of a tile shared with its neighbour)"
    return None


def tile_starts(length, tile, step):
    """Where the tiles along one side of `length` px begin: every `step` px, the last one flush with the far edge."""
    if length <= tile:
        return [0]
    return [*range(0, length - tile, step), length - tile]


def tile_grid(h, w, tile, overlap=DEFAULT_OVERLAP):
    """(x1, y1, x2, y2) of every tile of an h x w image, row by row; all of one size, min(tile, side) per side."""
    step = max(1, tile - round(tile * overlap))
    th, tw = min(tile, h), min(tile, w)
    return [(x, y, x + tw, y + th) for y in tile_starts(h, tile, step) for x in tile_starts(w, tile, step)]


def letterbox_tensor(x, shape):
    """utils.data.augment.letterbox for a (n, 3, h, w) float batch in 0..1 on any device: resized by the same rounding
    rule, padded grey around the centre. Returns the batch, the ratio and the (left, top) padding."""
    h, w = x.shape[-2:]
    ratio = min(shape[0] / h, shape[1] / w)
    nh, nw = resized_side(h, ratio), resized_side(w, ratio)
    if (nh, nw) != (h, w):  # bilinear without antialiasing: what cv2.INTER_LINEAR does in letterbox
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    top, left = (shape[0] - nh) // 2, (shape[1] - nw) // 2
    padding = (left, shape[1] - nw - left, top, shape[0] - nh - top)
    return F.pad(x, padding, value=PAD_VALUE / 255), ratio, (left, top)


def run_batches(predictor, x, conf, iou, classes, max_det, multi_label):
    """postprocess'd detections (input px) of every image of x, in chunks the predictor accepts: its fixed batch size
    (the last chunk padded), or as many as fit in BATCH_PIXELS."""
    size = predictor.batch or max(1, BATCH_PIXELS // (x.shape[-2] * x.shape[-1]))
    out = []
    for start in range(0, len(x), size):
        chunk = x[start : start + size]
        n = len(chunk)
        if predictor.batch and n < size:
            chunk = torch.cat((chunk, chunk[-1:].expand(size - n, *chunk.shape[1:])))
        out += postprocess(predictor.run(chunk), predictor, conf, iou, classes, max_det, multi_label)[:n]
    return out


def cut_sides(boxes, grid, h, w, margin):
    """(n,) bool: each box of tile grid[i] (one tensor per tile) touches a side of its tile that lies inside the
    image, so that the tile saw only part of its object."""
    flags = []
    for b, (x1, y1, x2, y2) in zip(boxes, grid):
        near = (
            ((b[:, 0] <= x1 + margin) & (x1 > 0))
            | ((b[:, 1] <= y1 + margin) & (y1 > 0))
            | ((b[:, 2] >= x2 - margin) & (x2 < w))
            | ((b[:, 3] >= y2 - margin) & (y2 < h))
        )
        flags.append(near)
    return torch.cat(flags) if flags else torch.zeros(0, dtype=torch.bool)


def detect_tiled(predictor, image, imgsz, tile, overlap, conf, iou, classes=None, max_det=300, multi_label=False):
    """One (3, h, w) float image in 0..1 -> (k, 6) CPU tensor x1 y1 x2 y2 score class in its pixels, best first.
    imgsz: the (h, w) the network runs at (models/predict.inference_size)."""
    h, w = image.shape[-2:]
    grid = tile_grid(h, w, tile, overlap)
    crops = torch.stack([image[:, y1:y2, x1:x2] for x1, y1, x2, y2 in grid])
    batch, ratio, pad = letterbox_tensor(crops, imgsz)
    whole_pass = len(grid) > 1  # one tile is the whole image already
    if whole_pass:
        whole, whole_ratio, whole_pad = letterbox_tensor(image[None], imgsz)
        batch = torch.cat((batch, whole))
    found = [d.float().cpu() for d in run_batches(predictor, batch, conf, iou, classes, max_det, multi_label)]
    shape = crops.shape[-2:]
    for d, (x1, y1, _, _) in zip(found, grid):
        d[:, :4] = scale_boxes_to_original(d[:, :4], ratio, pad, shape) + torch.tensor([x1, y1, x1, y1])
    cut = cut_sides([d[:, :4] for d in found[: len(grid)]], grid, h, w, EDGE / ratio)
    if whole_pass:
        d = found[-1]
        d[:, :4] = scale_boxes_to_original(d[:, :4], whole_ratio, whole_pad, (h, w))
        sides = d[:, 2:4] - d[:, :2]
        found[-1] = d[sides.max(1).values >= round(tile * overlap)]
        cut = torch.cat((cut, torch.zeros(len(found[-1]), dtype=torch.bool)))
    sources = torch.cat([torch.full((len(d),), i) for i, d in enumerate(found)])
    dets = torch.cat(found)
    keep = merge_tiles(dets.numpy(), sources.numpy(), cut.numpy(), max_det)
    return dets[keep]


def merge_tiles(dets, sources, cut, max_det=300):
    """Indices of the boxes to keep, best first, one per object (the rules in this module's docstring).
    dets: (n, 6) x1 y1 x2 y2 score class; sources: (n,) the tile (or whole-image pass) of each; cut: (n,) bool.
    Greedy, as NMS: the whole boxes in score order, then the cut ones, each against the boxes kept so far; each
    phase stops at max_det kept, since no more can be returned."""
    boxes, scores, classes = dets[:, :4], dets[:, 4], dets[:, 5]
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    order = np.argsort(-scores, kind="stable")
    kept = np.zeros(0, np.int64)
    for phase_cut in (False, True):
        limit = len(kept) + max_det
        for i in order[cut[order] == phase_cut]:
            if len(kept) == limit:
                break
            rivals = kept[(classes[kept] == classes[i]) & (sources[kept] != sources[i])]
            if len(rivals):
                lo = np.maximum(boxes[rivals, :2], boxes[i, :2])
                hi = np.minimum(boxes[rivals, 2:], boxes[i, 2:])
                inter = (hi - lo).clip(0).prod(1)
                if phase_cut:  # covered: by half of itself under a whole box, of the smaller one under a cut one
                    base = np.where(cut[rivals], np.minimum(area[rivals], area[i]), area[i])
                else:  # the same whole box seen twice: IoU
                    base = area[rivals] + area[i] - inter
                if (inter >= MATCH * np.maximum(base, 1e-9)).any():
                    continue
            kept = np.append(kept, i)
    return kept[np.argsort(-scores[kept], kind="stable")][:max_det]


def tiled_predictor(
    predictor, imgsz, tile, overlap=DEFAULT_OVERLAP, conf=0.25, iou=0.7, classes=None, max_det=300, multi_label=False
):
    """A Predictor (utils/inference.py) that runs `predictor` tiled at input size imgsz (h, w): run(x) takes whole
    images (n, 3, h, w) in 0..1 at their own size (so letterbox them to their own (h, w): ratio 1, no padding) and
    returns the final boxes (n, k, 6), zero rows after the last, as an end-to-end model does; postprocess then only
    applies thresholds. conf, iou, classes, max_det, multi_label: each tile's NMS, as postprocess takes them."""
    settings = (imgsz, tile, overlap, conf, iou, classes, max_det, multi_label)

    def run(x):
        dets = [detect_tiled(predictor, image, *settings) for image in x]
        out = torch.zeros(len(x), max(max(len(d) for d in dets), 1), 6)
        for k, d in enumerate(dets):
            out[k, : len(d)] = d
        return out.to(x.device)

    return predictor.replace(run=run, end2end=True, nms=None, dynamic=True, batch=None)


class WholeImages(torch.utils.data.Dataset):
    """val.py --tile: each image at its own size, as tiled_predictor's run takes it (ValDataset letterboxes them all to
    the model's size); a batch of one, since their sizes differ. Items as ValDataset's, with ratio 1 and no padding."""

    def __init__(self, records):
        self.records = as_records(records)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        record = self.records[index]
        img, labels = load_resized(record, max(record["shape"]))  # its own size: read, not resized
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        meta = {"index": index, "path": record["im"], "shape": img.shape[:2], "ratio": 1.0, "pad": (0, 0)}
        return image, torch.from_numpy(labels).reshape(-1, 5), meta
