"""Inference shared by val.py, detect.py, export.py, models/predict.py and bench/: one small interface over a
PyTorch model and every file export.py writes (ONNX, TorchScript, OpenVINO, TFLite, NCNN, MNN, ExecuTorch, Paddle,
Core ML, TensorRT), the preprocessing all of them get and the postprocessing of their outputs.

A loaded model of any format is a Predictor (below): its run function and what it was exported with.
PyTorch checkpoints are built by the scripts and models/predict.py (utils never imports models/) and wrapped
here with `from_pytorch`; exported files are opened with `load_exported`, which finds the file's row in the table
of formats (utils/export/formats.py) and calls its load function (utils/export/loaders.py).
"""

import dataclasses
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torchvision  # also registers torchvision::nms, which a TorchScript file with NMS inside calls

from utils.boxes import non_max_suppression
from utils.checkpoints.ours import CheckpointError
from utils.data.augment import letterbox
from utils.export import formats as export_formats


@dataclasses.dataclass(frozen=True)
class Predictor:
    """A model ready to run, of any format (a .pt's network, or a file export.py wrote).

    run(x): x (n, 3, h, w) float32 RGB 0..1 tensor, any n -> float32 tensor, either the raw predictions
    (n, anchors, 4 + nc) or, for a graph that already gives the final boxes (has_final_boxes: NMS exported inside,
    or an end-to-end model), (n, max_det, 6). imgsz: (h, w); batch: None = any; dynamic: any h, w; nms: None, or
    the {"conf", "iou", "max_det"} baked into the graph; data: the dataset yaml it was trained on, or None;
    backend: the runtime; weights: the path it was loaded from; metadata: all that an exported file carries."""

    run: Callable
    names: list
    imgsz: tuple
    stride: int
    batch: int = None
    dynamic: bool = True
    half: bool = False
    int8: bool = False
    end2end: bool = False
    nms: dict = None
    data: str = None
    single_cls: bool = False
    backend: str = "PyTorch"
    device: torch.device = torch.device("cpu")
    weights: str = ""
    metadata: dict = dataclasses.field(default_factory=dict)

    def replace(self, **changes):
        """A copy with these fields changed."""
        return dataclasses.replace(self, **changes)


def predictor_of(loaded, backend):
    """The Predictor of an exported file from its load function's dict (utils/export/loaders.py): its metadata,
    run and device."""
    fields = {f.name for f in dataclasses.fields(Predictor)}
    known = {k: v for k, v in loaded.items() if k in fields}
    metadata = {k: v for k, v in loaded.items() if k != "run"}
    return Predictor(**known, backend=backend, metadata=metadata)


def preprocess(img_rgb, imgsz):
    """uint8 RGB image (h, w, 3) -> (1, 3, H, W) float32 tensor in 0..1, letterboxed to imgsz (H, W).
    Also returns the ratio and (left, top) padding that scale_boxes_to_original needs."""
    img, ratio, pad = letterbox(img_rgb, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).float().div_(255)
    return x.unsqueeze(0), ratio, pad


def has_final_boxes(model):
    """Whether the output of `model` already is the detections, (n, max_det, 6) x1 y1 x2 y2 score class, best first:
    NMS exported inside the graph (export.py --nms), or an end-to-end (NMS-free) network. Then postprocess runs
    no NMS. model: a Predictor, or a PyTorch nn.Module in its eval answer (its `end2end` attribute)."""
    if isinstance(model, Predictor):
        return model.nms is not None or model.end2end
    return bool(getattr(model, "end2end", False))


def postprocess(output, model, conf=0.25, iou=0.7, classes=None, max_det=300, multi_label=False):
    """Model output -> list (one per image) of (k, 6) tensors x1 y1 x2 y2 score class, input pixels: NMS on the
    raw predictions, or only the thresholds on a graph that has the final boxes already (has_final_boxes).
    multi_label: a box may count for several classes (val.py's mAP), as in utils.boxes.non_max_suppression."""
    return non_max_suppression(output, conf, iou, classes, max_det, multi_label, end2end=has_final_boxes(model))


def from_pytorch(model, device, half=False, data=None, single_cls=False, mode=None):
    """The Predictor of a (fused, eval) PyTorch model from models.yolo.model_from_checkpoint. data, single_cls: from
    the checkpoint's training arguments. mode: what its head answers (models/head.py Detect.forward; "per_anchor": a
    YOLO26 network's one-to-many head, for NMS); None: its eval answer."""
    model = model.to(device)
    model = model.half() if half else model.float()
    mode = mode or model.head.eval_mode

    @torch.no_grad()
    def run(x):
        return model(x.to(device, torch.float16 if half else torch.float32), mode=mode).float()

    h, w = (model.imgsz, model.imgsz) if isinstance(model.imgsz, int) else model.imgsz
    end2end = mode == "end2end"
    settings = dict(half=half, end2end=end2end, data=data, single_cls=bool(single_cls), device=device)
    return Predictor(run, list(model.names), (h, w), max(model.head.strides), **settings)


def load_exported(path, device=torch.device("cpu")):
    """Open a file or folder written by export.py with the load function of its row in utils/export/formats.py
    (picked by its suffix; a folder is the folder format's, OpenVINO's). Anything else, or a runtime that is not
    installed (looked up without importing it): CheckpointError with one sentence saying why, or its pip line."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weights {path} do not exist")
    row = export_formats.format_of(path)
    if row is None:
        raise CheckpointError(f"weights {path} must be a .pt checkpoint, {export_formats.kinds()} from export.py")
    if reason := row.cannot_run():
        raise CheckpointError(
            f"{path} ({export_formats.a_or_an(row.title)} model) cannot run on this machine: {reason}"
        )
    missing = export_formats.missing_sentence(f"{path} ({export_formats.a_or_an(row.title)} model)", row.run_packages)
    if missing:
        raise CheckpointError(missing)
    return predictor_of(row.load(path, device), row.runtime)


def median_latency(run, x, runs=20, warmup=3):
    """Median wall time of run(x) in ms, after warm-up runs (first calls allocate and pick kernels)."""
    for _ in range(warmup):
        run(x)
    times = []
    for _ in range(runs):
        if x.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        run(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def compare_detections(reference, other, conf, margin=1e-3):
    """How far two sets of detections of one image ((k, 6) tensors) are apart, matching each
    detection to the same-class one it overlaps most (IoU > 0.5) rather than by position: tiny
    float differences may reorder equal scores. Returns (largest |difference| of matched boxes in
    pixels, of matched scores, number of detections without a match). A detection within `margin`
    of the confidence threshold may be missing from the other set without counting: a 1e-6
    difference can legitimately put it on either side. Where several overlapping boxes have tied
    scores, NMS may keep a different one of them: a large box difference with an equal score is
    that, not an error."""
    reference, other = reference.float().cpu(), other.float().cpu()
    box_difference, score_difference, unmatched = 0.0, 0.0, 0
    used = torch.zeros(len(other), dtype=torch.bool)
    for row in reference:
        candidates = ((other[:, 5] == row[5]) & ~used).nonzero().flatten()
        if len(candidates):
            iou = torchvision.ops.box_iou(row[None, :4], other[candidates, :4])[0]
            best = candidates[iou.argmax()]
            if iou.max() > 0.5:
                used[best] = True
                box_difference = max(box_difference, (row[:4] - other[best, :4]).abs().max().item())
                score_difference = max(score_difference, (row[4] - other[best, 4]).abs().item())
                continue
        unmatched += int(row[4] > conf + margin)
    unmatched += int((other[~used, 4] > conf + margin).sum())
    return box_difference, score_difference, unmatched
