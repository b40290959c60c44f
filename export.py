"""Export a checkpoint to ONNX, TorchScript, OpenVINO and TFLite, in fp32, fp16 or INT8; check each file against
PyTorch and score its mAP next to the checkpoint's.

    python export.py --onnx                              # newest runs/train/*/weights/best.pt -> best.onnx
    python export.py --weights best.pt --onnx --torchscript --imgsz 640
    python export.py --onnx --dynamic                    # any batch, height and width
    python export.py --onnx --nms --conf 0.25 --iou 0.7  # NMS inside the graph
    python export.py --onnx --half                       # fp16 weights and input (CPU or --device 0)
    python export.py --openvino                          # best_openvino_model/ (--half: fp16 weights)
    python export.py --openvino --int8                   # best_int8_openvino_model/, calibrated on --data's images
    python export.py --onnx --int8                       # best_int8.onnx (ONNX Runtime static quantization, QDQ)
    python export.py --tflite                            # best.tflite (LiteRT, for phones; fp32)
    python export.py --benchmark                         # every format: size, mAP, latency, speed-up, one table

The files are written next to the weights (best.onnx, best.torchscript, best_openvino_model/, best_int8.onnx,
best_int8_openvino_model/, best.tflite). Conv+BN are fused first, so the graph holds no BatchNorm and nothing else
that only training uses.

Outputs of the exported model (input "images": (batch, 3, h, w), RGB, float, 0..1, letterboxed):
  without --nms  "output": (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then the
                 probability of each class (the same tensor the PyTorch model returns in eval mode).
                 float32 also with --half: only the weights, the input and the network run in fp16,
                 the boxes are decoded in fp32 (fp16 pixel coordinates would be up to 0.5 px off).
  YOLO26         "output": (batch, 300, 6) = x1 y1 x2 y2 score class, best first: its one-to-one head's final
  (end-to-end)   detections, no NMS in or after the graph; metadata end2end: true. With --nms, its one-to-many
                 head and NMS are exported instead, as for the other models (more accurate after short training).
  with --nms     "detections": (batch, max_det, 6) = x1 y1 x2 y2 score class, best first, rows after
                 the last detection are zeros; "count": (batch,) int64, the number of real rows.
                 NMS is class-aware, one class per box (its best), with --conf, --iou and --max-det
                 fixed in the graph, exactly what utils.boxes.non_max_suppression does in Python.
The metadata (ONNX metadata_props, metadata.json in the TorchScript file's extra files, the rt_info of the
OpenVINO .xml, metadata.json in a small zip archive appended to the .tflite file) holds the class names, stride,
imgsz, batch, whether the shape is dynamic, the precision, the NMS settings, the dataset yaml and the input/output
names and shapes, each as JSON: val.py and detect.py need nothing else.

INT8 (--int8) is post-training quantization calibrated on --calib-images images of the training split of
--data (default: the dataset the checkpoint was trained on), letterboxed exactly as at inference. The layers that
KEEP_FLOAT names stay in float: quantizing them costs mAP for no speed (README, "Deploy").

After writing, each file is run (ONNX Runtime / TorchScript / OpenVINO / LiteRT) on a dataset image (or a generated one)
next to PyTorch. The largest differences of the raw outputs and of the detections, and the median latencies are
printed. The exit code is non-zero if they disagree: raw outputs beyond a relative and absolute tolerance of 1e-3
(1e-2 in fp16; an OpenVINO fp16 IR is judged by its detections, INT8 files by their mAP only), or detections that
have no counterpart of the same class (IoU > 0.5) or whose scores differ by more than that tolerance.

Then the accuracy gate: the exported file and the checkpoint are both evaluated (pycocotools mAP50-95, val.py's
settings) on the validation split of --data, or its first --val-images; a drop larger than --max-map-drop (default
0.002 for fp32 and fp16, 0.01 for INT8) exits non-zero with one sentence naming the file, both figures and what to
try. A checkpoint with no dataset of ours (an Ultralytics file without --data) skips the gate, saying so.
"""

import argparse
import contextlib
import copy
import importlib.util
import json
import logging
import multiprocessing
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import cv2
import numpy as np
import torch
import torchvision

from models.yolo import load_model
from utils.boxes import non_max_suppression
from utils.checkpoint import CheckpointError, weights_or_newest
from utils.data import ValDataset, make_loader
from utils.dataset_yaml import DatasetError, load_dataset_yaml
from utils.distributed import select_device
from utils.evaluate import evaluate
from utils.images import read_image
from utils.inference import (
    METADATA_FILE,
    OPENVINO_METADATA,
    compare_detections,
    export_metadata,
    from_pytorch,
    import_openvino,
    load_exported,
    median_latency,
    postprocess,
    preprocess,
)
from utils.labels import list_images, load_verified

# Layers left in float by --int8, found by measurement (bench/int8_float_layers.py, README "Deploy"): regular
# expressions on the ONNX node names (OpenVINO keeps them). The box decoding after the head's convolutions: DFL
# softmax and expectation, the anchor arithmetic in pixels and the concatenation of box coordinates (0..imgsz) with
# class probabilities (0..1), which in INT8 share one scale: quantized, ONNX Runtime's INT8 file scored mAP50-95 0.
# NNCF leaves these ops in float by itself; leaving the head's last convolutions in float as well gained nothing.
# YOLO26's one-to-one copies of the head's convolutions are quantized like the one-to-many ones.
KEEP_FLOAT = [r"^/head/(?!(one2one_)?(box|cls)\.)"]
MAX_MAP_DROP = {"fp32": 0.002, "fp16": 0.002, "int8": 0.01}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Export to ONNX / TorchScript / OpenVINO (fp32, fp16, INT8), check against PyTorch, score the mAP",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--weights", default="", help="checkpoint (default: newest runs/train/*/weights/best.pt)")
    parser.add_argument("--onnx", action="store_true", help="write .onnx (the default when no format is named)")
    parser.add_argument("--torchscript", action="store_true", help="write .torchscript")
    parser.add_argument("--openvino", action="store_true", help="write an OpenVINO IR folder (needs openvino)")
    parser.add_argument("--tflite", action="store_true", help="write .tflite, fp32 (needs litert-torch)")
    parser.add_argument(
        "--int8", action="store_true", help="INT8 quantization calibrated on --data's training images (ONNX, OpenVINO)"
    )
    parser.add_argument(
        "--benchmark", action="store_true", help="export to every available format and print one table (batch 1)"
    )
    parser.add_argument(
        "--imgsz", type=int, nargs="+", default=[0], help="h w, or one size for both; 0 = the checkpoint's"
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dynamic", action="store_true", help="batch, height and width chosen at run time")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--half", action="store_true", help="fp16 weights and input; output still fp32")
    parser.add_argument("--nms", action="store_true", help="NMS inside the graph; output (batch, max_det, 6)")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold of --nms and of the check")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold of --nms and of the check")
    parser.add_argument("--max-det", type=int, default=300)
    parser.add_argument("--simplify", action="store_true", help="simplify the ONNX graph (needs onnxslim or onnxsim)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--source",
        default="",
        help="image for the check (default: the first val image of the checkpoint's dataset, else a generated one)",
    )
    parser.add_argument("--runs", type=int, default=20, help="timed runs for the median latency")
    parser.add_argument("--data", default="", help="dataset yaml for --int8 and the gate (default: the checkpoint's)")
    parser.add_argument("--calib-images", type=int, default=300, help="training images that calibrate --int8")
    parser.add_argument("--val-images", type=int, default=0, help="score on the first N validation images (0 = all)")
    parser.add_argument(
        "--max-map-drop",
        type=float,
        default=None,
        help="largest mAP50-95 drop the export may cost (default 0.002 for fp32/fp16, 0.01 for INT8)",
    )
    parser.add_argument("--batch-val", type=int, default=16, help="images per batch when scoring the mAP")
    parser.add_argument("--workers", type=int, default=2, help="data-loader workers when scoring the mAP")
    return parser.parse_args(argv)


class ModelWithNMS(torch.nn.Module):
    """The network followed by NMS, written with ops that export to ONNX with a dynamic batch and a
    dynamic number of boxes. One NMS call serves every image and class: each box is shifted by
    (class * span, image * span), span larger than any box, so boxes of different classes or
    images never overlap, and torchvision.ops.nms becomes ONNX NonMaxSuppression."""

    def __init__(self, model, conf, iou, max_det):
        super().__init__()
        self.model, self.conf, self.iou, self.max_det = model, conf, iou, max_det

    def forward(self, x):
        pred = self.model(x).float()  # fp32 even for --half: the shifts below would overflow fp16
        boxes, (score, cls) = pred[..., :4], pred[..., 4:].max(2)
        # Image index of every box, and the zero output, derived from tensors rather than from
        # x.shape: the tracer would freeze a Python int into the graph and the batch stop being dynamic.
        image = torch.ones_like(score).cumsum(0) - 1
        images = image[:, 0]
        out = torch.zeros_like(image[:, :1]).repeat(1, self.max_det * 6)
        span = boxes.max() - boxes.min() + 1
        boxes, score, cls, image = boxes.reshape(-1, 4), score.flatten(), cls.flatten().to(boxes.dtype), image.flatten()
        keep = score > self.conf
        boxes, score, cls, image = boxes[keep], score[keep], cls[keep], image[keep]
        # best first
        keep = torchvision.ops.nms(boxes + torch.stack((cls, image, cls, image), 1) * span, score, self.iou)
        boxes, score, cls, image = boxes[keep], score[keep], cls[keep], image[keep]
        # Rank of each kept box among those of its image (they come best first): row in the output.
        same_image = (image[:, None] == images[None, :]).to(boxes.dtype)  # kept boxes x batch
        rank = ((same_image.cumsum(0) * same_image).sum(1) - 1).long()
        fits = rank < self.max_det
        rows = torch.cat((boxes, score[:, None], cls[:, None]), 1)[fits]
        out = out.view(-1, 6).index_put((image[fits].long() * self.max_det + rank[fits],), rows)
        return out.view(-1, self.max_det, 6), same_image.sum(0).clamp(max=self.max_det).long()


def check_image(ckpt_args, source):
    """(path, RGB image) for the check: --source, else the first val image of the checkpoint's
    dataset, else a generated one (a checkpoint from elsewhere may not have its dataset here)."""
    if source:
        img = read_image(source)
        if img is None:
            sys.exit(f"error: --source {source} is not a readable image")
        return source, img
    try:
        for path in list_images(load_dataset_yaml(ckpt_args["data"])["val"])[:5]:
            if (img := read_image(path)) is not None:
                return path, img
    except Exception:  # no args, no yaml, no dataset here: the generated image will do
        pass
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    for _ in range(12):  # a few filled shapes on noise, so that the network has something to see
        x, y, r = int(rng.integers(40, 600)), int(rng.integers(40, 440)), int(rng.integers(10, 80))
        cv2.circle(img, (x, y), r, tuple(int(c) for c in rng.integers(0, 256, 3)), -1)
    return "a generated image", img


def export_onnx(module, x, path, args, metadata):
    import onnx

    names_out = ["detections", "count"] if args.nms else ["output"]
    dynamic_axes = None
    if args.dynamic:
        dynamic_axes = {
            "images": {0: "batch", 2: "height", 3: "width"},
            names_out[0]: {0: "batch"} if args.nms or args.end2end else {0: "batch", 1: "anchors"},
        }
        if args.nms:
            dynamic_axes["count"] = {0: "batch"}
    with warnings.catch_warnings():  # the tracer's warnings about shapes are expected and would bury the report
        warnings.simplefilter("ignore")
        # dynamo=False: the TorchScript-based exporter, which needs no onnxscript and turns
        # torchvision.ops.nms into NonMaxSuppression.
        torch.onnx.export(
            module,
            x,
            str(path),
            dynamo=False,
            opset_version=args.opset,
            input_names=["images"],
            output_names=names_out,
            dynamic_axes=dynamic_axes,
        )
    graph = onnx.load(str(path))
    if args.nms:  # the exporter cannot infer these two sizes through the scatter; they are fixed
        for dim, size in zip(graph.graph.output[0].type.tensor_type.shape.dim[1:], (args.max_det, 6)):
            dim.dim_value = size
    if args.simplify:
        graph = simplify(graph)
    shape = lambda t: [d.dim_param or d.dim_value for d in t.type.tensor_type.shape.dim]  # noqa: E731
    metadata.update(
        input_names=["images"],
        output_names=names_out,
        input_shapes=[shape(t) for t in graph.graph.input],
        output_shapes=[shape(t) for t in graph.graph.output],
    )
    for key, value in export_metadata(**metadata).items():
        graph.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(graph)
    onnx.save(graph, str(path))


def simplify(graph):
    """Fold constants and remove redundant nodes with whichever simplifier is installed (optional)."""
    if importlib.util.find_spec("onnxslim"):
        import onnxslim

        return onnxslim.slim(graph)
    import onnxsim

    graph, valid = onnxsim.simplify(graph)
    if not valid:
        sys.exit("error: onnxsim could not validate the simplified graph; export without --simplify")
    return graph


def export_torchscript(module, x, path, args, metadata):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, x, check_trace=False)  # the NMS output legitimately varies in size
    outputs = module(x)
    outputs = [list(o.shape) for o in (outputs if isinstance(outputs, tuple) else (outputs,))]
    input_shape = list(x.shape)
    if args.dynamic:  # name the dimensions that vary, as the ONNX graph does
        input_shape = ["batch", 3, "height", "width"]
        per_anchor = not (args.nms or args.end2end)
        outputs = [["batch", "anchors", outputs[0][2]]] if per_anchor else [["batch", *o[1:]] for o in outputs]
    names_out = ["detections", "count"] if args.nms else ["output"]
    metadata.update(input_names=["images"], output_names=names_out, input_shapes=[input_shape], output_shapes=outputs)
    with warnings.catch_warnings():  # torch.jit is deprecated in favour of torch.export, yet still the portable format
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(export_metadata(**metadata))})


def export_tflite(module, x, path, metadata):
    """A TFLite (LiteRT) flatbuffer converted from the PyTorch module by litert-torch (torch.export, then LiteRT's
    converter; the input stays NCHW like the other formats), and the metadata as metadata.json in a zip archive
    appended to it, where the interpreter, which reads the flatbuffer from its start, does not look."""
    if not installed("litert_torch"):  # not imported here (see below): only looked for
        import_optional("litert_torch", "--tflite", package="litert-torch")  # exits with the sentence
    # converted on the CPU, in fp32, from contiguous weights: channels_last ones (as loaded) came out wrong (raw
    # outputs 24 px off)
    module = copy.deepcopy(module).float().cpu().eval().to(memory_format=torch.contiguous_format)
    x = x.float().cpu().contiguous()
    # In a process of its own: the conversion starts JAX's thread pools, and the data loader workers of the gate
    # would then be forked from a multithreaded process (JAX warns of deadlocks).
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        pool.apply(convert_tflite, (module, x, str(path)))
    with torch.no_grad():
        output = list(module(x).shape)
    metadata.update(
        input_names=["images"], output_names=["output"], input_shapes=[list(x.shape)], output_shapes=[output]
    )
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(METADATA_FILE, json.dumps(export_metadata(**metadata)))


def convert_tflite(module, x, path):
    import litert_torch

    with contextlib.redirect_stdout(sys.stderr):  # its progress lines are not part of the report
        litert_torch.convert(module, (x,)).export(path)


def keep_float(name):
    """Whether the node `name` stays in float in an INT8 export (KEEP_FLOAT)."""
    return any(re.search(pattern, name) for pattern in KEEP_FLOAT)


def export_openvino(onnx_path, xml_path, metadata, half=False, calibration=None):
    """An OpenVINO IR (xml_path and its .bin, in a folder of their own) converted from the ONNX file, with the
    metadata in the IR's rt_info. half: fp16 weights. calibration: callable giving the calibration inputs -> INT8 by
    NNCF's post-training quantization, KEEP_FLOAT's layers in float."""
    ov = import_openvino("--openvino")
    network = ov.convert_model(str(onnx_path))
    if calibration is not None:
        nncf = import_optional("nncf", "--openvino --int8")
        nncf.set_log_level(logging.WARNING)  # else a line per op it leaves unquantized would bury the report
        kept = [op.get_friendly_name() for op in network.get_ops() if keep_float(op.get_friendly_name())]
        inputs = list(calibration())
        network = nncf.quantize(
            network,
            nncf.Dataset(inputs),
            # MIXED: symmetric weights, asymmetric activations (SiLU outputs are not centred on zero)
            preset=nncf.QuantizationPreset.MIXED,
            subset_size=len(inputs),  # every calibration image given, not NNCF's default 300
            ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        )
    network.set_rt_info(json.dumps(export_metadata(**metadata)), OPENVINO_METADATA)
    shutil.rmtree(xml_path.parent, ignore_errors=True)  # no stale .bin of an earlier export beside the new .xml
    ov.save_model(network, str(xml_path), compress_to_fp16=half)


def quantize_onnx(fp32_path, path, metadata, calibration):
    """INT8 ONNX (QDQ: QuantizeLinear/DequantizeLinear pairs around the quantized ops, which ONNX Runtime fuses
    into integer kernels) by ONNX Runtime's static quantization, KEEP_FLOAT's nodes in float."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.inputs = iter(calibration())

        def get_next(self):
            x = next(self.inputs, None)
            return None if x is None else {"images": x}

    kept = [node.name for node in onnx.load(str(fp32_path)).graph.node if keep_float(node.name)]
    quantize_static(
        str(fp32_path),
        str(path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,  # one scale per output channel of each conv: fused Conv+BN weights vary a lot by channel
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=kept,
    )
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in export_metadata(**metadata).items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def installed(name):
    """Whether the package can be imported, without importing it (a None in sys.modules blocks it, as in the tests)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return False


def import_optional(name, what, package=None):
    """An optional package that `what` needs, or exit with one sentence saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        sys.exit(
            f"error: {what} needs {name}, which is not installed: pip install {package or name} "
            "(or -r requirements-dev.txt)"
        )


def calibration_inputs(data, imgsz, n, batch):
    """A callable giving the calibration inputs of --int8: n images spread over the training split of the dataset
    (not its first n, which may all show the same scene), letterboxed exactly as at inference, as float32 arrays
    (batch, 3, h, w). Read lazily: 300 images at 640 px are 1.5 GB as float32."""
    paths = list_images(data["train"])
    if not paths:
        sys.exit(f"error: --int8 needs training images to calibrate on, and {data['yaml']} lists none")
    paths = [paths[i] for i in np.unique(np.linspace(0, len(paths) - 1, min(n, len(paths))).round().astype(int))]

    def inputs():
        for path in paths:
            if (img := read_image(path)) is not None:
                yield np.repeat(preprocess(img, imgsz)[0].numpy(), batch, 0)

    return inputs


@torch.no_grad()
def check(path, model, module, x, args, tolerance, torch_ms, parity="raw"):
    """Run the exported file next to PyTorch; print differences and latencies. Returns (whether they agree, the
    file's median latency in ms). parity: "raw" (raw outputs and detections within tolerance), "detections" (the
    detections only: OpenVINO fp16, whose fp16 weights move raw box coordinates by a pixel at 640 while the
    detections agree), None (INT8: the differences are printed, the mAP judges)."""
    exported = load_exported(path, x.device)
    raw = module(x)
    raw = (raw[0] if args.nms else raw).float()
    theirs = exported["run"](x).to(raw.device)
    settings = dict(conf=args.conf, iou=args.iou, max_det=args.max_det)
    reference = non_max_suppression(model(x).float(), **settings, end2end=model.end2end)
    detections = postprocess(theirs, exported, **settings)
    compared = [compare_detections(a, b, args.conf) for a, b in zip(reference, detections)]
    box_difference, score_difference = max(c[0] for c in compared), max(c[1] for c in compared)
    unmatched = sum(c[2] for c in compared)
    # With NMS in the graph the raw output is the detections, whose rows may swap on equal scores; so are an
    # end-to-end model's (YOLO26): its scores, sorted, must agree, and the detections are matched below.
    raw_difference = "n/a (NMS inside)" if args.nms else f"{(theirs - raw).abs().max().item():.2e}"
    if args.end2end:
        theirs, raw = theirs[..., 4], raw[..., 4]
        raw_difference = f"{(theirs - raw).abs().max().item():.2e} (scores, best first)"
    raw_ok = args.nms or torch.allclose(theirs, raw, rtol=tolerance, atol=tolerance)
    # Boxes are not held to a tolerance here: among overlapping boxes with tied scores, NMS may
    # legitimately keep another one (see compare_detections); the raw check covers box values.
    # Where the graph's output is the raw predictions, the NMS after it is ours on both sides: with the raw output
    # within tolerance, a detection kept on one side only is a near-tie of two overlapping boxes (fp16 flips them
    # on barely trained weights), printed but not a failure. The detections judge graphs that give them.
    detections_judge = args.nms or args.end2end or parity == "detections"
    detections_ok = unmatched == 0 and score_difference <= tolerance
    ok = parity is None or ((raw_ok or parity == "detections") and (detections_ok or not detections_judge))
    their_ms = median_latency(exported["run"], x, args.runs)
    print(
        f"{label(path):>24}: raw output max |diff| {raw_difference}; "
        f"detections {sum(map(len, detections))} vs PyTorch's {sum(map(len, reference))}, {unmatched} unmatched, "
        f"max |diff| {box_difference:.2e} px boxes, {score_difference:.2e} scores; "
        f"median latency {their_ms:.1f} ms vs PyTorch {torch_ms:.1f} ms ({args.runs} runs)"
    )
    return ok, their_ms


FORMAT_NAMES = {"onnx": "ONNX Runtime", "torchscript": "TorchScript", "openvino": "OpenVINO", "tflite": "LiteRT"}


def output_path(weights, fmt, precision, folder=None, tag_fp16=False):
    """Where an export is written: best.onnx, best_int8.onnx, best.torchscript, best_openvino_model/best.xml,
    best_int8_openvino_model/best.xml, best.tflite, next to the weights (or in `folder`)."""
    weights = Path(weights)
    folder = Path(folder or weights.parent)
    stem = weights.stem + {"int8": "_int8", "fp16": "_fp16" if tag_fp16 else ""}.get(precision, "")
    if fmt == "openvino":
        return folder / f"{stem}_openvino_model" / f"{weights.stem}.xml"
    return folder / f"{stem}.{fmt}"


def label(path):
    """What an exported file is called in the report: its file name, or its folder for OpenVINO."""
    path = Path(path)
    return f"{path.parent.name}/" if path.suffix == ".xml" else path.name


class Scores:
    """The accuracy gate's evaluations: mAP50-95 and mAP50 by pycocotools (val.py's settings) on the validation
    split, or its first --val-images, for the checkpoint and each exported file, on the same images at the same
    size (a file without --dynamic takes only its own size: the checkpoint is then scored at that size too)."""

    def __init__(self, data, train_args, args, device):
        self.records = load_verified(data["val"], data["nc"], "val") if data["val"] else None
        if self.records is None or not len(self.records):
            sys.exit(f"error: {data['yaml']} has no validation images to score the export on; give another --data")
        if args.val_images:
            self.records = self.records.take(np.arange(min(args.val_images, len(self.records))))
        self.names, self.coco_json = data["names"], data["coco_json"]
        if train_args.get("single_cls"):
            self.records, self.names = self.records.single_class(), ["object"]
        self.args, self.device, self.reference = args, device, {}

    def __call__(self, model, imgsz):
        fixed = None if model["dynamic"] else tuple(imgsz)
        dataset = ValDataset(self.records, max(imgsz), self.args.batch_val, stride=model["stride"], shape=fixed)
        loader = make_loader(dataset, batch_size=self.args.batch_val, workers=self.args.workers)
        metrics = evaluate(model, loader, self.names, self.device, self.coco_json, conf=0.001, iou=0.7)["metrics"]
        return metrics["mAP50-95"], metrics["mAP50"]

    def checkpoint(self, network, dynamic, imgsz):
        """The checkpoint's (mAP50-95, mAP50) as the exported file is scored (computed once per kind of input)."""
        if dynamic not in self.reference:
            model = {**from_pytorch(network, self.device), "dynamic": dynamic}
            self.reference[dynamic] = self(model, imgsz)
        return self.reference[dynamic]


def gate(path, precision, scores, network, args, imgsz):
    """Score the exported file and the checkpoint; print both. Returns (mAP50-95, mAP50, None or the sentence of
    a failure)."""
    model = load_exported(path, scores.device)
    ours, ours50 = scores(model, imgsz)
    reference, _ = scores.checkpoint(network, model["dynamic"], imgsz)
    limit = MAX_MAP_DROP[precision] if args.max_map_drop is None else args.max_map_drop
    n = len(scores.records)
    print(
        f"{label(path):>24}: mAP50-95 {ours:.4f} vs the checkpoint's {reference:.4f} on {n} val images "
        f"(drop {reference - ours:+.4f}, allowed {limit})"
    )
    if reference - ours <= limit:
        return ours, ours50, None
    advice = {
        "int8": "export without --int8, or calibrate on more images (--calib-images)",
        "fp16": "export without --half",
        "fp32": "the export is broken: look at the raw-output differences above, or try another --opset",
    }[precision]
    return (
        ours,
        ours50,
        f"{label(path)} ({FORMAT_NAMES[path.suffix.lstrip('.') if path.suffix != '.xml' else 'openvino']} "
        f"{precision}) scores mAP50-95 {ours:.4f} against the checkpoint's {reference:.4f} on {n} val images, "
        f"a drop of {reference - ours:.4f} > --max-map-drop {limit}: {advice}",
    )


def file_size(path):
    """Bytes on disk: the file, or for OpenVINO the .xml and its .bin."""
    path = Path(path)
    return path.stat().st_size + (path.with_suffix(".bin").stat().st_size if path.suffix == ".xml" else 0)


def jobs_of(args):
    """(format, precision) of each export asked for: --benchmark takes every format this machine can run."""
    if not args.benchmark:
        precision = "int8" if args.int8 else "fp16" if args.half else "fp32"
        return [(fmt, precision) for fmt in ("onnx", "torchscript", "openvino", "tflite") if getattr(args, fmt)]
    jobs = [("torchscript", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]
    if installed("litert_torch") and installed("ai_edge_litert"):
        jobs.append(("tflite", "fp32"))
    else:
        print("note: TFLite left out of the benchmark: it is not installed (pip install litert-torch ai-edge-litert)")
    if importlib.util.find_spec("openvino") is None:
        print("note: OpenVINO left out of the benchmark: it is not installed (pip install openvino nncf)")
        return jobs
    jobs += [("openvino", "fp32"), ("openvino", "fp16")]
    if importlib.util.find_spec("nncf") is None:
        print("note: OpenVINO INT8 left out of the benchmark: it needs nncf (pip install nncf)")
        return jobs
    return jobs + [("openvino", "int8")]


def main(argv=None):
    args = parse_args(argv)
    try:
        weights = weights_or_newest(args.weights)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    if not (args.onnx or args.torchscript or args.openvino or args.tflite or args.benchmark):
        args.onnx = True
    device = select_device(args.device)
    if args.simplify and not (importlib.util.find_spec("onnxslim") or importlib.util.find_spec("onnxsim")):
        sys.exit("error: --simplify needs an ONNX simplifier: pip install onnxslim (or onnxsim)")
    if args.nms and args.opset < 11:
        sys.exit("error: --nms needs --opset 11 or newer (ONNX NonMaxSuppression)")
    if args.int8 and (args.half or args.nms or args.torchscript):
        sys.exit("error: --int8 quantizes the raw network to ONNX or OpenVINO; leave out --half, --nms, --torchscript")
    if args.tflite and (args.half or args.int8 or args.nms or args.dynamic):
        sys.exit("error: --tflite exports the fp32 network at a fixed size; leave out --half, --int8, --nms, --dynamic")
    if args.benchmark and (args.batch != 1 or args.nms or args.half or args.int8 or args.dynamic):
        sys.exit(
            "error: --benchmark measures every format at batch 1 as exported by default; give no other format flag"
        )
    if args.openvino:
        try:
            import_openvino("--openvino")
        except CheckpointError as e:
            sys.exit(f"error: {e}")
    if Path(weights).suffix in (".onnx", ".torchscript", ".tflite", ".xml") or Path(weights).is_dir():
        sys.exit(f"error: {weights} is already an exported model; export.py takes a .pt checkpoint")
    try:
        network, train_args = load_model(weights)  # fused: no training-only parts in the graph
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    if args.nms:  # YOLO26: its one-to-many head and NMS in the graph, instead of the NMS-free head
        network.end2end = False
    args.end2end = network.end2end  # YOLO26 (without --nms): the graph's output is the final detections
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz[:2]
    imgsz = [s or network.imgsz for s in imgsz]
    stride = max(network.head.strides)
    if any(s % stride for s in imgsz):
        sys.exit(f"error: --imgsz {' '.join(map(str, imgsz))} must be a multiple of the stride {stride}")
    network = network.to(device)
    jobs = jobs_of(args)

    data = None
    if args.data or train_args.get("data"):
        try:
            data = load_dataset_yaml(args.data or train_args["data"])
        except DatasetError as e:
            sys.exit(f"error: {e}")
    if data is None and args.benchmark:
        sys.exit(f"error: --benchmark scores every format on the dataset and {weights} names no dataset; give --data")
    if data is None and any(precision == "int8" for _, precision in jobs):
        sys.exit(f"error: --int8 calibrates on the dataset's images and {weights} names no dataset; give --data")
    if data is not None and len(data["names"]) != len(network.names):
        sys.exit(f"error: {weights} predicts {len(network.names)} classes but {data['yaml']} names {data['nc']}")

    source, img = check_image(train_args, args.source)
    x32 = preprocess(img, imgsz)[0].repeat(args.batch, 1, 1, 1).to(device)
    half_network = copy.deepcopy(network).half() if any(p == "fp16" and f != "openvino" for f, p in jobs) else None
    metadata = dict(
        names=list(network.names),
        imgsz=imgsz,
        stride=stride,
        batch=args.batch,
        dynamic=args.dynamic,
        nms=dict(conf=args.conf, iou=args.iou, max_det=args.max_det) if args.nms else None,
        end2end=network.end2end,
        data=str(args.data or train_args.get("data") or "") or None,
        single_cls=bool(train_args.get("single_cls", False)),
    )
    folder = Path(weights).parent / f"{Path(weights).stem}_benchmark" if args.benchmark else None
    calibration = calibration_inputs(data, imgsz, args.calib_images, args.batch) if data else None

    written = []  # (path, format, precision, the network it came from, its input)
    with tempfile.TemporaryDirectory() as scratch:
        for fmt, precision in jobs:
            half = precision == "fp16"
            # ONNX and TorchScript in fp16 run an fp16 network; OpenVINO converts fp32 and stores fp16 weights
            net = half_network if half and fmt != "openvino" else network
            x = x32.half() if net is half_network else x32
            module = ModelWithNMS(net, args.conf, args.iou, args.max_det).eval() if args.nms else net
            meta = dict(metadata, half=half, int8=precision == "int8")
            path = output_path(weights, fmt, precision, folder, tag_fp16=args.benchmark)
            path.parent.mkdir(parents=True, exist_ok=True)
            if fmt == "torchscript":
                export_torchscript(module, x, path, args, meta)
            elif fmt == "tflite":
                export_tflite(module, x, path, meta)
            elif fmt == "onnx" and precision != "int8":
                export_onnx(module, x, path, args, meta)
            else:  # OpenVINO and INT8 start from an fp32 ONNX graph
                float_onnx = Path(scratch) / f"{fmt}_{precision}.onnx"
                export_onnx(module, x, float_onnx, args, dict(meta))
                if fmt == "onnx":
                    print(f"quantizing to INT8, calibrated on up to {args.calib_images} images of {data['yaml']} ...")
                    quantize_onnx(float_onnx, path, meta, calibration)
                else:
                    if precision == "int8":
                        print(
                            f"quantizing to INT8, calibrated on up to {args.calib_images} images of {data['yaml']} ..."
                        )
                    export_openvino(float_onnx, path, meta, half, calibration if precision == "int8" else None)
            print(f"wrote {path.parent if fmt == 'openvino' else path} ({file_size(path) / 1e6:.1f} MB)")
            written.append((path, fmt, precision, net, x, module))

    print(f"check on {source}, input {tuple(x32.shape)}:")
    failures, latency = [], {}
    with torch.no_grad():
        torch_ms = median_latency(network, x32, args.runs)
    for path, fmt, precision, net, x, module in written:
        tolerance = 1e-2 if precision == "fp16" else 1e-3
        parity = None if precision == "int8" else "detections" if (fmt, precision) == ("openvino", "fp16") else "raw"
        ok, latency[path] = check(path, net, module, x, args, tolerance, torch_ms, parity)
        if not ok:
            failures.append(
                f"{label(path)} and PyTorch disagree beyond tolerance {tolerance} (relative, see above); "
                "the file is written but should not be trusted"
            )

    results = {}
    if data is None:
        print(f"accuracy gate skipped: {weights} names no dataset of ours; give --data to score the exported files")
    else:
        scores = Scores(data, train_args, args, device)
        print(f"accuracy gate on {data['yaml']}:")
        for path, fmt, precision, *_ in written:
            *results[path], failure = gate(path, precision, scores, network, args, imgsz)
            failures += [failure] if failure else []
        if args.benchmark:
            reference = scores.checkpoint(network, args.dynamic, imgsz)
            print_benchmark(weights, reference, torch_ms, written, results, latency)
    if failures:
        sys.exit("error: " + "\nerror: ".join(failures))


def print_benchmark(weights, reference, torch_ms, written, results, latency):
    """One row per format: file size, mAP50-95, mAP50 (pycocotools), median latency at batch 1, speed-up."""
    rows = [("PyTorch", "fp32", file_size(weights), *reference, torch_ms)]
    rows += [(FORMAT_NAMES[f], p, file_size(path), *results[path], latency[path]) for path, f, p, *_ in written]
    header = ("format", "precision", "size MB", "mAP50-95", "mAP50", "latency ms", "speed-up")
    print("\n{:<14} {:<9} {:>8} {:>9} {:>7} {:>11} {:>8}".format(*header))
    for name, precision, size, m, m50, ms in rows:
        print(f"{name:<14} {precision:<9} {size / 1e6:>8.1f} {m:>9.4f} {m50:>7.4f} {ms:>11.1f} {torch_ms / ms:>7.2f}x")


if __name__ == "__main__":
    main()
