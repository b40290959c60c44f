"""Detection from Python, as plain functions, for applications that embed the detector:

    from models.predict import load, predict

    predictor = load("runs/train/exp/weights/best.pt")  # or best.onnx, .torchscript, .tflite, best_openvino_model/
    result = predict(predictor, "photo.jpg", conf=0.4)  # or a BGR array as cv2.imread gives, or a list of either
    for box, score, name in zip(result.boxes, result.scores, result.names):
        print(name, round(float(score), 2), box.round(1))  # x1 y1 x2 y2 in the image's own pixels

Why a module here: loading a .pt builds the network (models/weights.py), and utils/ never imports models/,
so these cannot live in utils/inference.py; and detect.py is a long script about sources, videos and
streams that nothing should have to import. detect.py itself runs every image and frame through `load`,
`inference_size` and `detect_image` below: the preprocessing, NMS and scaling back exist once.
"""

import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from models.weights import load_weights
from utils.boxes import scale_boxes_to_original
from utils.checkpoints.ours import CheckpointError
from utils.data.images import read_image
from utils.inference import from_pytorch, postprocess, preprocess


class Detections(NamedTuple):
    """One image's detections, best first: boxes (n, 4) float32 x1 y1 x2 y2 in the original image's pixels,
    scores (n,) float32, classes (n,) int64 class indices, names the n class names (a list of str)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    names: list


def load(weights, device="cpu", half=False, nms=False):
    """A .pt checkpoint (ours or Ultralytics'), or an .onnx / .torchscript / .tflite file or an OpenVINO folder
    (best_openvino_model/) from export.py -> its Predictor (utils/inference.py: run, names, imgsz, stride,
    dynamic, nms, ...), whose `weights` is the path as given. half: a .pt runs in fp16 (on a GPU); an exported file
    runs in the precision it was exported in. nms: a YOLO26 .pt answers with its one-to-many head, and NMS
    follows (Ultralytics' default for YOLO26), instead of its NMS-free head; no change for the other models.
    device: "cpu", "cuda", "cuda:1", "1" or a torch.device. A missing, broken or foreign file raises
    utils.checkpoints.ours.CheckpointError (a ValueError) with one sentence that names the file."""
    device = torch.device(f"cuda:{device}" if str(device).isdigit() else device)
    loaded = load_weights(weights, device)
    if loaded.checkpoint is not None:  # a .pt: its network, built
        network, train_args = loaded.model, loaded.train_args
        mode = "per_anchor" if nms else None  # YOLO26: its one-to-many head, for NMS
        data, single_cls = train_args.get("data"), train_args.get("single_cls", False)
        predictor = from_pytorch(network, device, half, data, single_cls, mode)
    else:
        predictor = loaded.model
        if nms and predictor.end2end:
            raise CheckpointError(
                f"{weights} was exported end-to-end (YOLO26's NMS-free head only): it has no one-to-many head to "
                "run NMS on; give the .pt, or a file exported with --nms"
            )
    return predictor.replace(weights=str(weights))


def inference_size(predictor, imgsz=None):
    """The (h, w) the network runs at, and a sentence when that is not the size asked for (else None).
    imgsz: one size, or [size], or (h, w); None or 0 take the model's own. A file exported without
    --dynamic only runs at its own size, and any size is rounded up to a multiple of the stride."""
    sizes = [imgsz or 0] if imgsz is None or isinstance(imgsz, int) else list(imgsz)
    size = tuple(s or m for s, m in zip((sizes * 2)[:2], predictor.imgsz))
    note = None
    if not predictor.dynamic and size != tuple(predictor.imgsz):
        h, w = predictor.imgsz
        note = f"{predictor.weights} was exported for {h}x{w} only (export with --dynamic for other sizes); using that"
        size = (h, w)
    stride = predictor.stride
    return tuple(-(-s // stride) * stride for s in size), note


def nms_note(predictor, conf, iou):
    """A sentence when the thresholds asked for cannot apply because NMS is inside the exported graph, else None."""
    nms = predictor.nms
    if nms and (conf < nms["conf"] or iou != nms["iou"]):
        return (
            f"NMS is inside {predictor.weights} with conf {nms['conf']} and iou {nms['iou']}; "
            "conf can only raise it, iou is ignored"
        )
    return None


def detect_image(predictor, img_rgb, imgsz, conf=0.25, iou=0.7, classes=None, max_det=300):
    """uint8 RGB (h, w, 3) -> (k, 6) CPU tensor x1 y1 x2 y2 score class in the image's pixels, and the
    seconds spent in preprocessing, the model and NMS. imgsz: (h, w) from inference_size."""
    t0 = time.perf_counter()
    x, ratio, pad = preprocess(img_rgb, imgsz)
    t1 = time.perf_counter()
    output = predictor.run(x)
    if output.is_cuda:  # CUDA runs asynchronously: wait, or its time would be counted as NMS time
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    dets = postprocess(output, predictor, conf, iou, classes, max_det)[0].cpu()
    dets[:, :4] = scale_boxes_to_original(dets[:, :4], ratio, pad, img_rgb.shape[:2])
    return dets, (t1 - t0, t2 - t1, time.perf_counter() - t2)


def predict(predictor, source, conf=0.25, iou=0.7, imgsz=None, classes=None, max_det=300, rgb=False):
    """Detections (see the class) for one image, or a list of them for a list of images.

    source: a path (str or Path) to an image file, or a uint8 (H, W, 3) numpy array in BGR order, as
    cv2.imread and cv2.VideoCapture give it (rgb=True: in RGB order, as PIL gives it), or a list of these.
    predictor: from load. conf, iou, classes (class indices to keep), max_det: as detect.py's flags; imgsz: as
    inference_size's, None = the model's own. A path that does not exist or holds no readable image raises
    OSError (FileNotFoundError if missing) in one sentence that names it; an array of another shape or type,
    ValueError."""
    size, note = inference_size(predictor, imgsz)
    for sentence in (note, nms_note(predictor, conf, iou)):
        if sentence:
            warnings.warn(sentence, stacklevel=2)
    images = source if isinstance(source, (list, tuple)) else [source]
    results = []
    for image in images:
        dets = detect_image(predictor, rgb_image(image, rgb), size, conf, iou, classes, max_det)[0].numpy()
        ids = dets[:, 5].astype(np.int64)
        boxes, scores = np.ascontiguousarray(dets[:, :4]), np.ascontiguousarray(dets[:, 4])
        results.append(Detections(boxes, scores, ids, [predictor.names[c] for c in ids]))
    return results if isinstance(source, (list, tuple)) else results[0]


def rgb_image(source, rgb=False):
    """The uint8 RGB array of a path or a BGR (rgb=False) or RGB array; see predict."""
    if isinstance(source, (str, Path)):
        if not Path(source).exists():
            raise FileNotFoundError(f"image {source} does not exist")
        img = read_image(str(source))
        if img is None:
            raise OSError(f"image {source} is not an image that OpenCV can read")
        return img
    if not (isinstance(source, np.ndarray) and source.dtype == np.uint8 and source.ndim == 3 and source.shape[2] == 3):
        what = f"{source.dtype} {source.shape}" if isinstance(source, np.ndarray) else type(source).__name__
        raise ValueError(f"an image must be a path or a uint8 (H, W, 3) array, not {what}")
    # the same channel order read_image gives (RGB), so a path and its cv2.imread array give one result;
    # contiguous, because cv2 refuses views with negative strides (an RGB array made as bgr[..., ::-1])
    return np.ascontiguousarray(source if rgb else source[..., ::-1])
