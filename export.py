"""Export a checkpoint to ONNX and/or TorchScript, then check the file against PyTorch.

    python export.py --onnx                              # newest runs/train/*/weights/best.pt -> best.onnx
    python export.py --weights best.pt --onnx --torchscript --imgsz 640
    python export.py --onnx --dynamic                    # any batch, height and width
    python export.py --onnx --nms --conf 0.25 --iou 0.7  # NMS inside the graph
    python export.py --onnx --half                       # fp16 weights and input (CPU or --device 0)

The files are written next to the weights (best.onnx, best.torchscript). Conv+BN are fused first,
so the graph holds no BatchNorm and nothing else that only training uses.

Outputs of the exported model (input "images": (batch, 3, h, w), RGB, float, 0..1, letterboxed):
  without --nms  "output": (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then the
                 probability of each class (the same tensor the PyTorch model returns in eval mode).
                 float32 also with --half: only the weights, the input and the network run in fp16,
                 the boxes are decoded in fp32 (fp16 pixel coordinates would be up to 0.5 px off).
  YOLO26         "output": (batch, 300, 6) = x1 y1 x2 y2 score class, best first: its one-to-one head's final
  (end-to-end)   detections, no NMS in or after the graph (--nms is refused); metadata end2end: true.
  with --nms     "detections": (batch, max_det, 6) = x1 y1 x2 y2 score class, best first, rows after
                 the last detection are zeros; "count": (batch,) int64, the number of real rows.
                 NMS is class-aware, one class per box (its best), with --conf, --iou and --max-det
                 fixed in the graph, exactly what utils.boxes.non_max_suppression does in Python.
The metadata (ONNX metadata_props, or metadata.json in the TorchScript file's extra files) holds
the class names, stride, imgsz, batch, whether the shape is dynamic, the NMS settings and the
input/output names and shapes, each as JSON: detect.py needs nothing else.

After writing, each file is run (ONNX Runtime / TorchScript) on a dataset image (or a generated
one) next to PyTorch. The largest differences of the raw outputs and of the detections, and the
median latencies are printed. The exit code is non-zero if they disagree: raw outputs beyond a
relative and absolute tolerance of 1e-3 (1e-2 in fp16), or detections that have no counterpart
of the same class (IoU > 0.5) or whose scores differ by more than that tolerance.
"""

import argparse
import importlib.util
import json
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import torch
import torchvision

from models.yolo import load_model
from utils.boxes import non_max_suppression
from utils.checkpoint import CheckpointError, weights_or_newest
from utils.dataset_yaml import load_dataset_yaml
from utils.distributed import select_device
from utils.images import read_image
from utils.inference import (
    METADATA_FILE,
    compare_detections,
    export_metadata,
    load_exported,
    median_latency,
    postprocess,
    preprocess,
)
from utils.labels import list_images


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Export to ONNX / TorchScript and check against PyTorch",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--weights", default="", help="checkpoint (default: newest runs/train/*/weights/best.pt)")
    parser.add_argument("--onnx", action="store_true", help="write .onnx (the default when no format is named)")
    parser.add_argument("--torchscript", action="store_true", help="write .torchscript")
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


@torch.no_grad()
def check(path, model, module, x, args, tolerance, torch_ms):
    """Run the exported file next to PyTorch; print differences and latencies; return True if they agree."""
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
    ok = raw_ok and unmatched == 0 and score_difference <= tolerance
    their_ms = median_latency(exported["run"], x, args.runs)
    print(
        f"{exported['backend']:>13}: raw output max |diff| {raw_difference}; "
        f"detections {sum(map(len, detections))} vs PyTorch's {sum(map(len, reference))}, {unmatched} unmatched, "
        f"max |diff| {box_difference:.2e} px boxes, {score_difference:.2e} scores; "
        f"median latency {their_ms:.1f} ms vs PyTorch {torch_ms:.1f} ms ({args.runs} runs)"
    )
    return ok


def main(argv=None):
    args = parse_args(argv)
    try:
        weights = weights_or_newest(args.weights)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    if not (args.onnx or args.torchscript):
        args.onnx = True
    device = select_device(args.device)
    if args.simplify and not (importlib.util.find_spec("onnxslim") or importlib.util.find_spec("onnxsim")):
        sys.exit("error: --simplify needs an ONNX simplifier: pip install onnxslim (or onnxsim)")
    if args.nms and args.opset < 11:
        sys.exit("error: --nms needs --opset 11 or newer (ONNX NonMaxSuppression)")
    if Path(weights).suffix in (".onnx", ".torchscript"):
        sys.exit(f"error: {weights} is already an exported model; export.py takes a .pt checkpoint")
    try:
        model, train_args = load_model(weights)  # fused: no training-only parts in the graph
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    args.end2end = model.end2end  # YOLO26: the graph's output is the final detections
    if args.nms and model.end2end:
        sys.exit(f"error: --nms: {weights} is an end-to-end model (YOLO26) whose output needs no NMS; leave --nms out")
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz[:2]
    imgsz = [s or model.imgsz for s in imgsz]
    stride = max(model.head.strides)
    if any(s % stride for s in imgsz):
        sys.exit(f"error: --imgsz {' '.join(map(str, imgsz))} must be a multiple of the stride {stride}")
    model = model.to(device).half() if args.half else model.to(device)
    module = ModelWithNMS(model, args.conf, args.iou, args.max_det).eval() if args.nms else model

    source, img = check_image(train_args, args.source)
    x = preprocess(img, imgsz)[0].repeat(args.batch, 1, 1, 1).to(device, torch.float16 if args.half else torch.float32)
    metadata = dict(
        names=list(model.names),
        imgsz=imgsz,
        stride=stride,
        batch=args.batch,
        dynamic=args.dynamic,
        half=args.half,
        nms=dict(conf=args.conf, iou=args.iou, max_det=args.max_det) if args.nms else None,
        end2end=model.end2end,
    )
    written = []
    if args.onnx:
        written.append(Path(weights).with_suffix(".onnx"))
        export_onnx(module, x, written[-1], args, dict(metadata))
    if args.torchscript:
        written.append(Path(weights).with_suffix(".torchscript"))
        export_torchscript(module, x, written[-1], args, dict(metadata))
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")

    print(f"check on {source}, input {tuple(x.shape)}:")
    tolerance = 1e-2 if args.half else 1e-3
    with torch.no_grad():
        torch_ms = median_latency(module, x, args.runs)
    bad = [path for path in written if not check(path, model, module, x, args, tolerance, torch_ms)]
    if bad:
        sys.exit(
            f"error: {', '.join(map(str, bad))} and PyTorch disagree beyond tolerance {tolerance} "
            "(relative, see above); the file is written but should not be trusted"
        )


if __name__ == "__main__":
    main()
