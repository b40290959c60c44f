"""Inference shared by detect.py, export.py and bench/: one small interface over a PyTorch model, a
TorchScript file and an ONNX file, the preprocessing all of them get, and the metadata that an
exported file carries so that nothing else is needed to run it.

A loaded model is a plain dict:

    run(x)   x: (n, 3, h, w) float32 RGB 0..1 tensor -> float32 tensor, either the raw predictions
             (n, anchors, 4 + nc) or, for a graph exported with NMS inside or an end-to-end model (YOLO26),
             (n, max_det, 6)
    names, imgsz (h, w), stride, batch (None = any), dynamic (any h, w), half, backend, device,
    nms (None, or the {"conf", "iou", "max_det"} baked into the graph), end2end (final detections, no NMS)

PyTorch checkpoints are built by the scripts (utils never imports models/) and wrapped here with
`from_pytorch`; exported files are opened with `load_exported`.
"""

import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torchvision  # also registers torchvision::nms, which a TorchScript file with NMS inside calls

from utils.augment import letterbox
from utils.boxes import non_max_suppression
from utils.checkpoint import FORMAT, CheckpointError

METADATA_FILE = "metadata.json"  # name of the metadata inside a TorchScript file (_extra_files)


def preprocess(img_rgb, imgsz):
    """uint8 RGB image (h, w, 3) -> (1, 3, H, W) float32 tensor in 0..1, letterboxed to imgsz (H, W).
    Also returns the ratio and (left, top) padding that scale_boxes_to_original needs."""
    img, ratio, pad = letterbox(img_rgb, imgsz)
    x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))).float().div_(255)
    return x.unsqueeze(0), ratio, pad


def postprocess(output, model, conf=0.25, iou=0.7, classes=None, max_det=300):
    """Model output -> list (one per image) of (k, 6) tensors x1 y1 x2 y2 score class, input pixels.
    NMS-free for output that is already final (NMS inside the exported graph, or an end-to-end model: YOLO26)."""
    final = model["nms"] is not None or model.get("end2end", False)
    return non_max_suppression(output, conf, iou, classes, max_det, end2end=final)


def export_metadata(**values):
    """What detect.py needs to run an exported file (names, imgsz, stride, batch, dynamic, half, nms,
    input and output names and shapes), as JSON strings: ONNX metadata_props hold strings."""
    return {k: json.dumps(v) for k, v in {"format": FORMAT, **values}.items()}


def from_pytorch(model, device, half=False):
    """Wrap a (fused, eval) PyTorch model from models.yolo.model_from_checkpoint."""
    model = model.to(device)
    model = model.half() if half else model.float()

    @torch.no_grad()
    def run(x):
        return model(x.to(device, torch.float16 if half else torch.float32)).float()

    h, w = (model.imgsz, model.imgsz) if isinstance(model.imgsz, int) else model.imgsz
    return {
        "run": run,
        "names": list(model.names),
        "imgsz": (h, w),
        "stride": max(model.head.strides),
        "batch": None,
        "dynamic": True,
        "half": half,
        "nms": None,
        "end2end": model.end2end,
        "backend": "PyTorch",
        "device": device,
    }


def load_exported(path, device=torch.device("cpu")):
    """Open an .onnx or .torchscript file written by export.py. Anything else: CheckpointError with
    one sentence saying why."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weights {path} do not exist")
    if path.suffix == ".onnx":
        return _load_onnx(path, device)
    if path.suffix == ".torchscript":
        return _load_torchscript(path, device)
    raise CheckpointError(f"weights {path} must be a .pt checkpoint, an .onnx or a .torchscript file from export.py")


def _parse_metadata(strings, path):
    if strings.get("format") != json.dumps(FORMAT):
        raise CheckpointError(
            f"{path} has no metadata from this repo's export.py (class names, image size); export it with export.py"
        )
    try:
        meta = {k: json.loads(v) for k, v in strings.items()}
    except ValueError:
        raise CheckpointError(f"{path} has metadata that is not the JSON export.py writes") from None
    batch = None if meta["dynamic"] else meta["batch"]
    return {**meta, "imgsz": tuple(meta["imgsz"]), "batch": batch, "end2end": meta.get("end2end", False)}


def _load_onnx(path, device):
    import onnxruntime  # imported here: only .onnx weights need it

    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    try:
        session = onnxruntime.InferenceSession(str(path), providers=providers)
    except Exception as e:  # onnxruntime raises its own types for broken or foreign files
        raise CheckpointError(
            f"{path} is not an ONNX model that ONNX Runtime can load ({str(e).strip().splitlines()[0][:200]})"
        ) from None
    meta = _parse_metadata(session.get_modelmeta().custom_metadata_map, path)
    model_input, model_output = session.get_inputs()[0], session.get_outputs()[0].name
    dtype = np.float16 if model_input.type == "tensor(float16)" else np.float32
    fixed_batch = meta["batch"]

    def run(x):
        x = x.detach().cpu().numpy().astype(dtype)
        n = len(x)
        if fixed_batch and n < fixed_batch:  # a file exported with --batch B takes exactly B images
            x = np.concatenate((x, np.zeros((fixed_batch - n, *x.shape[1:]), dtype)))
        return torch.from_numpy(session.run([model_output], {model_input.name: x})[0][:n]).float()

    return {**meta, "run": run, "backend": "ONNX Runtime", "device": device}


def _load_torchscript(path, device):
    extra = {METADATA_FILE: ""}
    try:
        # torch.jit is deprecated in favour of torch.export, yet still the portable format
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        strings = json.loads(extra[METADATA_FILE] or "{}")
    except Exception as e:
        raise CheckpointError(
            f"{path} is not a TorchScript file this torch can load ({str(e).strip().splitlines()[0][:200]})"
        ) from None
    meta = _parse_metadata(strings, path)
    dtype = torch.float16 if meta["half"] else torch.float32

    @torch.no_grad()
    def run(x):
        out = module(x.to(device, dtype))
        return (out[0] if isinstance(out, (tuple, list)) else out).float()  # with NMS: (detections, count)

    return {**meta, "run": run, "backend": "TorchScript", "device": device}


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
