"""Inference shared by val.py, detect.py, export.py, models/predict.py and bench/: one small interface over a
PyTorch model, a TorchScript file, an ONNX file, an OpenVINO IR folder and a TFLite file, the preprocessing all of
them get, the postprocessing of their outputs, and the metadata that an exported file carries so that nothing else
is needed to run it.

A loaded model is a plain dict:

    run(x)   x: (n, 3, h, w) float32 RGB 0..1 tensor, any n -> float32 tensor, either the raw predictions
             (n, anchors, 4 + nc) or, for a graph that already gives the final boxes (has_final_boxes: NMS
             exported inside, or an end-to-end model), (n, max_det, 6)
    names, imgsz (h, w), stride, batch (None = any), dynamic (any h, w), half, int8, end2end, backend, device,
    nms (None, or the {"conf", "iou", "max_det"} baked into the graph), data (the dataset yaml it was trained
    on, or None), single_cls

PyTorch checkpoints are built by the scripts and models/predict.py (utils never imports models/) and wrapped
here with `from_pytorch`; exported files are opened with `load_exported`, which dispatches on the file type.
"""

import json
import time
import warnings
import zipfile
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


def has_final_boxes(model):
    """Whether the output of `model` already is the detections, (n, max_det, 6) x1 y1 x2 y2 score class, best first:
    NMS exported inside the graph (export.py --nms), or an end-to-end (NMS-free) network. Then postprocess runs
    no NMS. model: a dict of this module, or a PyTorch nn.Module (its `end2end` attribute)."""
    if isinstance(model, dict):
        return model["nms"] is not None or bool(model.get("end2end"))
    return bool(getattr(model, "end2end", False))


def postprocess(output, model, conf=0.25, iou=0.7, classes=None, max_det=300, multi_label=False):
    """Model output -> list (one per image) of (k, 6) tensors x1 y1 x2 y2 score class, input pixels: NMS on the
    raw predictions, or only the thresholds on a graph that has the final boxes already (has_final_boxes).
    multi_label: a box may count for several classes (val.py's mAP), as in utils.boxes.non_max_suppression."""
    return non_max_suppression(output, conf, iou, classes, max_det, multi_label, end2end=has_final_boxes(model))


def export_metadata(**values):
    """What val.py and detect.py need to run an exported file (names, imgsz, stride, batch, dynamic, half, int8,
    end2end, nms, data, single_cls, input and output names and shapes), as JSON strings: ONNX metadata_props
    hold strings."""
    return {k: json.dumps(v) for k, v in {"format": FORMAT, **values}.items()}


def from_pytorch(model, device, half=False, data=None, single_cls=False):
    """Wrap a (fused, eval) PyTorch model from models.yolo.model_from_checkpoint. data, single_cls: from the
    checkpoint's training arguments."""
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
        "int8": False,
        "end2end": has_final_boxes(model),
        "nms": None,
        "data": data,
        "single_cls": bool(single_cls),
        "backend": "PyTorch",
        "device": device,
    }


def is_openvino(path):
    """An OpenVINO IR: a folder holding one .xml (export.py writes best_openvino_model/best.xml), or the .xml."""
    path = Path(path)
    return path.suffix == ".xml" or path.is_dir()


def load_exported(path, device=torch.device("cpu")):
    """Open an .onnx, .torchscript or .tflite file or an OpenVINO folder written by export.py. Anything else:
    CheckpointError with one sentence saying why."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weights {path} do not exist")
    if path.suffix == ".onnx":
        return _load_onnx(path, device)
    if path.suffix == ".torchscript":
        return _load_torchscript(path, device)
    if path.suffix == ".tflite":
        return _load_tflite(path, device)
    if is_openvino(path):
        return _load_openvino(path, device)
    raise CheckpointError(
        f"weights {path} must be a .pt checkpoint, an .onnx, .torchscript or .tflite file or an OpenVINO folder "
        "from export.py"
    )


def _parse_metadata(strings, path):
    if strings.get("format") != json.dumps(FORMAT):
        raise CheckpointError(
            f"{path} has no metadata from this repo's export.py (class names, image size); export it with export.py"
        )
    try:
        meta = {k: json.loads(v) for k, v in strings.items()}
    except ValueError:
        raise CheckpointError(f"{path} has metadata that is not the JSON export.py writes") from None
    # files exported before int8, end2end, data and single_cls were written read as float, NMS-needing, no dataset
    defaults = {"int8": False, "end2end": False, "data": None, "single_cls": False}
    meta = {**defaults, **meta}
    return {**meta, "imgsz": tuple(meta["imgsz"]), "batch": None if meta["dynamic"] else meta["batch"]}


def any_batch(run_batch, batch):
    """run(x) for any number of images, from run_batch(x) of a file exported for exactly `batch` images (None:
    any): in chunks of `batch`, the last one padded with zeros and the padding's outputs dropped."""
    if not batch:
        return run_batch

    def run(x):
        outputs = []
        for chunk in x.split(batch):
            n = len(chunk)
            if n < batch:
                chunk = torch.cat((chunk, chunk.new_zeros(batch - n, *chunk.shape[1:])))
            outputs.append(run_batch(chunk)[:n])
        return torch.cat(outputs)

    return run


def first_line(error):
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


def _load_onnx(path, device):
    import onnxruntime  # imported here: only .onnx weights need it

    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    try:
        session = onnxruntime.InferenceSession(str(path), providers=providers)
    except Exception as e:  # onnxruntime raises its own types for broken or foreign files
        raise CheckpointError(f"{path} is not an ONNX model that ONNX Runtime can load ({first_line(e)})") from None
    meta = _parse_metadata(session.get_modelmeta().custom_metadata_map, path)
    model_input, model_output = session.get_inputs()[0], session.get_outputs()[0].name
    dtype = np.float16 if model_input.type == "tensor(float16)" else np.float32

    def run_batch(x):
        x = x.detach().cpu().numpy().astype(dtype)
        return torch.from_numpy(session.run([model_output], {model_input.name: x})[0]).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "backend": "ONNX Runtime", "device": device}


def _load_torchscript(path, device):
    extra = {METADATA_FILE: ""}
    try:
        # torch.jit is deprecated in favour of torch.export, yet still the portable format
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        strings = json.loads(extra[METADATA_FILE] or "{}")
    except Exception as e:
        raise CheckpointError(f"{path} is not a TorchScript file this torch can load ({first_line(e)})") from None
    meta = _parse_metadata(strings, path)
    dtype = torch.float16 if meta["half"] else torch.float32

    @torch.no_grad()
    def run(x):
        out = module(x.to(device, dtype))
        return (out[0] if isinstance(out, (tuple, list)) else out).float()  # with NMS: (detections, count)

    return {**meta, "run": run, "backend": "TorchScript", "device": device}


OPENVINO_MISSING = "OpenVINO (pip install openvino, or pip install -r requirements-dev.txt), which is not installed"
OPENVINO_METADATA = ["yolo_flat", "metadata"]  # where export.py puts the metadata in the IR's rt_info


def import_openvino(what):
    """The openvino module, or CheckpointError saying that `what` needs it and how to install it."""
    try:
        import openvino
    except ImportError:
        raise CheckpointError(f"{what} needs {OPENVINO_MISSING}") from None
    return openvino


_openvino_core = []


def openvino_core(what):
    """The process's one openvino.Core. One for all models, kept to the end: a Core collected while a model compiled
    by it still runs unloads the CPU plugin under that model (a segmentation fault in the tests)."""
    openvino = import_openvino(what)
    if not _openvino_core:
        _openvino_core.append(openvino.Core())
    return _openvino_core[0]


def _load_openvino(path, device):
    xml = path if path.suffix == ".xml" else next(iter(sorted(path.glob("*.xml"))), None)
    if xml is None:
        raise CheckpointError(f"{path} is a folder without an OpenVINO model (.xml); export one with export.py")
    core = openvino_core(f"{path} (an OpenVINO model)")
    try:
        network = core.read_model(str(xml))
    except Exception as e:
        raise CheckpointError(f"{xml} is not an OpenVINO model this OpenVINO can read ({first_line(e)})") from None
    strings = (
        json.loads(network.get_rt_info(OPENVINO_METADATA).astype(str)) if network.has_rt_info(OPENVINO_METADATA) else {}
    )
    meta = _parse_metadata(strings, path)
    # The CPU plugin runs f32 layers in bf16 where the CPU has bf16 instructions (AVX512_BF16, AMX) unless told
    # otherwise. bf16 keeps 8 bits of mantissa: box coordinates in pixels move by up to 2-4 px at 640 and the
    # DFL's expectations by a tenth of a cell, enough to lose mAP50-95 (measured: boxes 16 px off on the tests'
    # model). So float layers compute in f32, also in an fp16 IR (its weights are stored in fp16 and expanded) and
    # in the layers an INT8 IR keeps in float.
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if device.type != "cpu":
        warnings.warn(f"{path}: OpenVINO runs on the CPU here, not on {device}", stacklevel=3)
    compiled = core.compile_model(network, "CPU", config)
    request = compiled.create_infer_request()
    output = compiled.outputs[0]

    def run_batch(x):
        x = x.detach().cpu().numpy().astype(np.float32)  # an fp16 IR takes f32 input too: the plugin converts
        return torch.from_numpy(request.infer({0: x})[output].copy()).float()

    cpu = torch.device("cpu")
    return {**meta, "run": any_batch(run_batch, meta["batch"]), "backend": "OpenVINO", "device": cpu}


def tflite_metadata(path):
    """The metadata export.py appends to a .tflite file as a small zip archive (the interpreter reads the
    flatbuffer from the front and ignores what follows it), or {} when there is none or it is implausibly large."""
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo(METADATA_FILE).file_size > 1 << 20:  # a crafted archive must not inflate 1 GB
                return {}
            return json.loads(archive.read(METADATA_FILE))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return {}


def _load_tflite(path, device):
    try:
        from ai_edge_litert.interpreter import Interpreter  # imported here: only .tflite weights need it
    except ImportError:
        raise CheckpointError(
            f"{path} (a TFLite model) needs ai-edge-litert (pip install ai-edge-litert, or pip install -r "
            "requirements-dev.txt), which is not installed"
        ) from None
    meta = _parse_metadata(tflite_metadata(path), path)
    try:
        interpreter = Interpreter(model_path=str(path), num_threads=torch.get_num_threads())
        interpreter.allocate_tensors()
    except Exception as e:
        raise CheckpointError(f"{path} is not a TFLite model this interpreter can load ({first_line(e)})") from None
    model_input, model_output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    if device.type != "cpu":
        warnings.warn(f"{path}: the TFLite interpreter runs on the CPU here, not on {device}", stacklevel=3)

    def run_batch(x):
        interpreter.set_tensor(model_input["index"], x.detach().cpu().numpy().astype(np.float32))
        interpreter.invoke()
        return torch.from_numpy(interpreter.get_tensor(model_output["index"]).copy()).float()

    cpu = torch.device("cpu")
    return {**meta, "run": any_batch(run_batch, meta["batch"]), "backend": "LiteRT", "device": cpu}


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
