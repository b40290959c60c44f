"""Export a checkpoint to ONNX, TorchScript, OpenVINO, TFLite, NCNN, MNN, ExecuTorch, Paddle, Core ML, TensorFlow
(SavedModel, GraphDef) or TensorRT, in fp32, fp16 or INT8; check each file against PyTorch and score its mAP next to the
checkpoint's.

    python export.py --onnx                              # newest runs/train/*/weights/best.pt -> best.onnx
    python export.py --weights best.pt --onnx --torchscript --imgsz 640
    python export.py --onnx --dynamic                    # any batch, height and width
    python export.py --onnx --nms                        # NMS inside the graph (--conf, --iou, --max-det fixed in it)
    python export.py --onnx --half                       # fp16 weights and input (CPU or --device 0)
    python export.py --openvino                          # best_openvino_model/ (--half: fp16 weights)
    python export.py --openvino --int8                   # best_int8_openvino_model/, calibrated on --data's images
    python export.py --onnx --int8                       # best_int8.onnx (ONNX Runtime static quantization, QDQ)
    python export.py --tflite                            # best.tflite (LiteRT, for phones; fp32)
    python export.py --ncnn --mnn --executorch           # best_ncnn_model/, best.mnn, best.pte (Android; --half too)
    python export.py --paddle                            # best_paddle_model/ (Paddle Inference, fp32)
    python export.py --saved-model --pb                  # best_saved_model/ and best.pb (TensorFlow, fp32; onnx2tf)
    python export.py --coreml                            # best.mlpackage (iOS; written and its spec checked anywhere,
                                                         #   run and scored on macOS only)
    python export.py --engine --half --workspace 4       # best.engine (TensorRT, on the NVIDIA GPU that will run it;
                                                         #   --int8, --dynamic up to --batch images)
    python export.py --benchmark                         # every format: size, mAP, latency, speed-up, one table
    python export.py --benchmark --latency-imgsz 640 320 # (the default) timed at these sizes too, each written again

The files are written next to the weights (best.onnx, best.torchscript, best_openvino_model/, best_int8.onnx,
best_int8_openvino_model/, best.tflite, best_ncnn_model/, best.mnn, best.pte, best_paddle_model/, best.mlpackage,
best_saved_model/, best.pb, best.engine). Conv+BN are fused first, so the graph holds no BatchNorm and nothing else
that only training uses. Each format is one row of the table in utils/export/formats.py: its flag, file name, the
options it takes, the packages it needs (a missing one: one sentence with that format's pip line), and its write
and load functions.

Outputs of the exported model (input "images": (batch, 3, h, w), RGB, float, 0..1, letterboxed):
  without --nms  "output": (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then the
                 probability of each class (the same tensor the PyTorch model returns in eval mode).
                 float32 also with --half: only the weights, the input and the network run in fp16,
                 the boxes are decoded in fp32 (fp16 pixel coordinates would move them).
  YOLO26         "output": (batch, 300, 6) = x1 y1 x2 y2 score class, best first: its one-to-one head's final
  (end-to-end)   detections, no NMS in or after the graph; metadata end2end: true. With --nms, its one-to-many
                 head and NMS are exported instead, as for the other models (more accurate after short training).
  with --nms     "detections": (batch, max_det, 6) = x1 y1 x2 y2 score class, best first, rows after
                 the last detection are zeros; "count": (batch,) int64, the number of real rows.
                 NMS is class-aware, one class per box (its best), with --conf, --iou and --max-det
                 fixed in the graph, exactly what utils.boxes.non_max_suppression does in Python.
Each file carries metadata (class names, stride, imgsz, batch, dynamic or not, precision, NMS settings, dataset yaml,
input/output names and shapes; where each format keeps it: utils/export/loaders.py): val.py and detect.py need
nothing else.

INT8 (--int8) is post-training quantization calibrated on --calib-images images of the training split of
--data (default: the dataset the checkpoint was trained on), letterboxed exactly as at inference. The layers that
KEEP_FLOAT (utils/export/writers.py) names stay in float: quantizing them costs mAP for no speed (docs/deploy.md, INT8).

After writing, each file is run in its own runtime on a dataset image (or a generated
one) next to PyTorch. The largest differences of the raw outputs and of the detections, and the median latencies are
printed. The exit code is non-zero if they disagree: raw outputs beyond a relative and absolute tolerance of 1e-3
(1e-2 in fp16; an OpenVINO fp16 IR is judged by its detections, INT8 files by their mAP only), or detections that
have no counterpart of the same class (IoU > 0.5) or whose scores differ by more than that tolerance.

Then the accuracy gate: the exported file and the checkpoint are both evaluated (pycocotools mAP50-95, val.py's
settings) on the validation split of --data, or its first --val-images; a drop larger than --max-map-drop (default:
utils/export/gate.py MAX_MAP_DROP, by precision) exits non-zero with one sentence naming the file, both figures and
what to try, and the file that failed is renamed <name>.rejected, so that nothing ships it by its name. A checkpoint
with no dataset of ours (an Ultralytics file without --data) skips the gate, saying so.
"""

import argparse
import copy
import sys
from pathlib import Path

import cv2
import numpy as np
import torch

from models.weights import load_weights
from utils.boxes import non_max_suppression
from utils.checkpoints.ours import CheckpointError, weights_or_newest
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.images import read_image
from utils.data.labels import list_images
from utils.distributed import select_device
from utils.export import formats as export_formats
from utils.export.formats import OPTIONS, a_or_an, file_size, installed, joined, label, missing_sentence, output_path
from utils.export.gate import Scores, gate, print_benchmark, set_aside
from utils.export.options import ExportOptions
from utils.export.writers import ExportError, ModelWithNMS, written_at_once
from utils.inference import compare_detections, load_exported, median_latency, postprocess, preprocess


def format_help(row, default):
    """--onnx's help and the others': what the flag writes and the packages it needs (from the table)."""
    what = f"{a_or_an(row.title)} folder" if row.folder else row.suffix
    needs = f" (pip install {' '.join(p.pip for p in row.packages())})" if row.packages() else ""
    return f"write {what}{needs}" + ("; the default when no format is named" if default else "")


def parse_args(argv=None):
    rows = export_formats.FORMATS
    parser = argparse.ArgumentParser(
        description=f"Export to {' / '.join(r.title for r in rows)} (fp32, fp16, INT8), check against PyTorch, "
        "score the mAP",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--weights", default="", help="checkpoint (default: newest runs/train/*/weights/best.pt)")
    for row in rows:
        add(row.flag, action="store_true", help=format_help(row, row is rows[0]))
    int8_formats = ", ".join(r.title for r in rows if "int8" in r.options)
    add(
        "--int8", action="store_true", help=f"INT8 quantization calibrated on --data's training images ({int8_formats})"
    )
    add("--benchmark", action="store_true", help="export to every available format and print one table (batch 1)")
    add("--imgsz", type=int, nargs="+", default=[0], help="h w, or one size for both; 0 = the checkpoint's")
    sizes_help = "--benchmark: the square sizes each format is timed at (written again at each one --imgsz is not)"
    add("--latency-imgsz", type=int, nargs="+", default=[640, 320], help=sizes_help)
    add("--batch", type=int, default=1)
    add("--dynamic", action="store_true", help="batch, height and width chosen at run time")
    add("--opset", type=int, default=17)
    add("--half", action="store_true", help="fp16 weights and input; output still fp32")
    add("--nms", action="store_true", help="NMS inside the graph; output (batch, max_det, 6)")
    add("--conf", type=float, default=0.25, help="confidence threshold of --nms and of the check")
    add("--iou", type=float, default=0.7, help="NMS IoU threshold of --nms and of the check")
    add("--max-det", type=int, default=300)
    add("--simplify", action="store_true", help="simplify the ONNX graph (needs onnxslim or onnxsim)")
    add("--workspace", type=float, default=0, help="--engine: the TensorRT builder's scratch memory, GiB (0: its own)")
    add("--device", default="cpu")
    source_help = "image for the check (default: the first val image of the checkpoint's dataset, else a generated one)"
    add("--source", default="", help=source_help)
    add("--runs", type=int, default=20, help="timed runs for the median latency")
    add("--data", default="", help="dataset yaml for --int8 and the gate (default: the checkpoint's)")
    add("--calib-images", type=int, default=300, help="training images that calibrate --int8")
    add("--val-images", type=int, default=0, help="score on the first N validation images (0 = all)")
    drop_help = "largest mAP50-95 drop the export may cost (default 0.002 for fp32/fp16, 0.01 for INT8)"
    add("--max-map-drop", type=float, default=None, help=drop_help)
    add("--batch-val", type=int, default=16, help="images per batch when scoring the mAP")
    add("--workers", type=int, default=2, help="data-loader workers when scoring the mAP")
    return parser.parse_args(argv)


def check_request(args):
    """The weights and the (row, precision) of each file asked for, or exit with one sentence naming the flag."""
    try:
        weights = Path(weights_or_newest(args.weights))
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    rows = export_formats.FORMATS
    if args.simplify and not (installed("onnxslim") or installed("onnxsim")):
        sys.exit("error: --simplify needs an ONNX simplifier: pip install onnxslim (or onnxsim)")
    if args.nms and args.opset < 11:
        sys.exit("error: --nms needs --opset 11 or newer (ONNX NonMaxSuppression)")
    if args.workspace and not args.engine:
        sys.exit("error: --workspace sizes the TensorRT builder's memory; give it with --engine")
    for row in rows:
        refused = [option for option in OPTIONS if option not in row.options]
        if getattr(args, row.name) and any(getattr(args, option) for option in refused):
            sys.exit(f"error: {row.flag} {row.refusal}; leave out {', '.join('--' + o for o in refused)}")
    if args.int8 and (args.half or args.nms):
        int8_formats = joined([row.title for row in rows if "int8" in row.options], "or")
        sys.exit(f"error: --int8 quantizes the raw network to {int8_formats}; leave out --half, --nms")
    if args.benchmark and (args.batch != 1 or args.nms or args.half or args.int8 or args.dynamic):
        sys.exit(
            "error: --benchmark measures every format at batch 1 as exported by default; give no other format flag"
        )
    jobs = jobs_of(args)
    for row, precision in jobs:
        flags = row.flag + (" --int8" if precision == "int8" else "")
        if reason := row.cannot_write():
            sys.exit(f"error: {flags} cannot be written on this machine: {reason}; export --onnx here instead")
        if missing := missing_sentence(flags, row.packages(precision)):
            sys.exit(f"error: {missing}")
    if export_formats.format_of(weights) is not None:
        sys.exit(f"error: {weights} is already an exported model; export.py takes a .pt checkpoint")
    return weights, jobs


def jobs_of(args):
    """(row, precision) of each export asked for: --benchmark takes every format this machine can run."""
    if not args.benchmark:
        precision = "int8" if args.int8 else "fp16" if args.half else "fp32"
        named = [row for row in export_formats.FORMATS if getattr(args, row.name)]
        return [(row, precision) for row in named or export_formats.FORMATS[:1]]  # ONNX when no format is named
    jobs = []
    for row in export_formats.FORMATS:
        for precision in row.benchmark:
            if reason := row.cannot_run():
                print(f"note: left out of the benchmark: {row.runtime} {precision}: {reason}")
            elif missing := missing_sentence(f"{row.runtime} {precision}", row.packages(precision)):
                print(f"note: left out of the benchmark: {missing}")
            else:
                jobs.append((row, precision))
    return jobs


def load_network(weights, args, device):
    """The fused network, its training arguments and the size to export at."""
    try:
        loaded = load_weights(weights)  # fused: no training-only parts in the graph
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    network, train_args = loaded.model, loaded.train_args
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz[:2]
    imgsz = [s or network.imgsz for s in imgsz]
    stride = max(network.head.strides)
    if any(s % stride for s in imgsz):
        sys.exit(f"error: --imgsz {' '.join(map(str, imgsz))} must be a multiple of the stride {stride}")
    if args.benchmark and any(s <= 0 or s % stride for s in args.latency_imgsz):
        sizes = " ".join(map(str, args.latency_imgsz))
        sys.exit(f"error: --latency-imgsz {sizes}: each size must be a positive multiple of the stride {stride}")
    return network.to(device), train_args, imgsz


def dataset_of(args, train_args, weights, network, jobs):
    """The dataset of --int8's calibration and of the gate: --data, else the checkpoint's; None when neither."""
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
    return data


def metadata_of(network, train_args, options, imgsz, data_yaml):
    """What every exported file carries (utils/export/loaders.py reads it back); the writers add the shapes."""
    return dict(
        names=list(network.names),
        imgsz=imgsz,
        stride=max(network.head.strides),
        batch=options.batch,
        dynamic=options.dynamic,
        nms=dict(conf=options.conf, iou=options.iou, max_det=options.max_det) if options.nms else None,
        end2end=options.end2end,
        data=str(data_yaml or train_args.get("data") or "") or None,
        single_cls=bool(train_args.get("single_cls", False)),
    )


def check_image(ckpt_args, source):
    """(path, RGB image) for the check: --source, else the first val image of the checkpoint's dataset, else a
    generated one (a checkpoint from elsewhere may not have its dataset here)."""
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


def calibration_inputs(data, imgsz, n, batch):
    """A callable giving the calibration inputs of --int8: n images spread over the training split of the dataset
    (not its first n, which may all show the same scene), letterboxed exactly as at inference, as float32 arrays
    (batch, 3, h, w). Read lazily, since hundreds of float32 images do not fit in memory at once."""
    paths = list_images(data["train"])
    if not paths:
        sys.exit(f"error: --int8 needs training images to calibrate on, and {data['yaml']} lists none")
    paths = [paths[i] for i in np.unique(np.linspace(0, len(paths) - 1, min(n, len(paths))).round().astype(int))]

    def inputs():
        for path in paths:
            if (img := read_image(path)) is not None:
                yield np.repeat(preprocess(img, imgsz)[0].numpy(), batch, 0)

    return inputs


def write_all(weights, jobs, network, x32, args, options, metadata, calibration, data, folder=None):
    """Write each file with its row's write function, next to the weights or in folder. Returns [(path, row,
    precision, the network it came from, its input, the traced module)]."""
    # ONNX and TorchScript in fp16 trace an fp16 network; OpenVINO converts fp32 and stores fp16 weights
    half_network = None
    if any(precision == "fp16" and not row.fp16_weights_only for row, precision in jobs):
        half_network = copy.deepcopy(network).half()
    written = []
    for row, precision in jobs:
        net = half_network if precision == "fp16" and not row.fp16_weights_only else network
        x = x32.half() if net is half_network else x32
        module = ModelWithNMS(net, options.conf, options.iou, options.max_det).eval() if options.nms else net
        meta = dict(metadata, half=precision == "fp16", int8=precision == "int8")
        path = output_path(weights, row, precision, folder, tag_fp16=args.benchmark)
        (path.parent.parent if row.folder else path.parent).mkdir(parents=True, exist_ok=True)  # not an empty one
        if precision == "int8":
            print(f"quantizing to INT8, calibrated on up to {args.calib_images} images of {data['yaml']} ...")
        try:  # written aside, then renamed: a kill or a full disk never leaves half a file that later loads
            with written_at_once(path, row.folder) as temporary:
                row.write(module, x, temporary, options, meta, calibration if precision == "int8" else None)
        except ExportError as e:
            sys.exit(f"error: {e}")
        print(f"wrote {path.parent if row.folder else path} ({file_size(path) / 1e6:.1f} MB)")
        written.append((path, row, precision, net, x, module))
    return written


@torch.no_grad()
def check(path, model, module, x, options, runs, tolerance, torch_ms, parity="raw"):
    """Run the exported file next to PyTorch; print differences and latencies. Returns (whether they agree, its
    median latency in ms). parity: "raw" (raw outputs and detections within tolerance), "detections" (those only:
    OpenVINO fp16, whose weights move raw boxes while the detections agree), None (INT8: the mAP judges)."""
    exported = load_exported(path, x.device)  # its Predictor
    raw = module(x)
    raw = (raw[0] if options.nms else raw).float()
    theirs = exported.run(x).to(raw.device)
    settings = dict(conf=options.conf, iou=options.iou, max_det=options.max_det)
    reference = non_max_suppression(model(x, mode=options.mode).float(), **settings, end2end=options.end2end)
    detections = postprocess(theirs, exported, **settings)
    compared = [compare_detections(a, b, options.conf) for a, b in zip(reference, detections)]
    box_difference, score_difference = max(c[0] for c in compared), max(c[1] for c in compared)
    unmatched = sum(c[2] for c in compared)
    # With NMS in the graph the raw output is the detections, whose rows may swap on equal scores; so are an
    # end-to-end model's (YOLO26): its scores, sorted, must agree, and the detections are matched below.
    raw_difference = "n/a (NMS inside)" if options.nms else f"{(theirs - raw).abs().max().item():.2e}"
    if options.end2end:
        theirs, raw = theirs[..., 4], raw[..., 4]
        raw_difference = f"{(theirs - raw).abs().max().item():.2e} (scores, best first)"
    raw_ok = options.nms or torch.allclose(theirs, raw, rtol=tolerance, atol=tolerance)
    # Boxes are not held to a tolerance here: among overlapping boxes with tied scores, NMS may
    # legitimately keep another one (see compare_detections); the raw check covers box values.
    # Where the graph's output is the raw predictions, the NMS after it is ours on both sides: with the raw output
    # within tolerance, a detection kept on one side only is a near-tie of two overlapping boxes (fp16 flips them
    # on barely trained weights), printed but not a failure. The detections judge graphs that give them.
    detections_judge = options.nms or options.end2end or parity == "detections"
    detections_ok = unmatched == 0 and score_difference <= tolerance
    ok = parity is None or ((raw_ok or parity == "detections") and (detections_ok or not detections_judge))
    their_ms = median_latency(exported.run, x, runs)
    print(
        f"{label(path):>24}: raw output max |diff| {raw_difference}; "
        f"detections {sum(map(len, detections))} vs PyTorch's {sum(map(len, reference))}, {unmatched} unmatched, "
        f"max |diff| {box_difference:.2e} px boxes, {score_difference:.2e} scores; "
        f"median latency {their_ms:.1f} ms vs PyTorch {torch_ms:.1f} ms ({runs} runs)"
    )
    return ok, their_ms


def latency_at_sizes(weights, jobs, network, img, args, options, metadata, data, first):
    """--benchmark's latencies, at --imgsz and at each --latency-imgsz: {(h, w): (PyTorch's ms, {(format, precision):
    ms})}, and the failures of the files written for them. first: (imgsz, input, written, latency, PyTorch's ms) of
    the files already written, checked and scored at --imgsz; at another size each format is written again into
    <stem>_benchmark/<size>px/ (an INT8 file calibrated at that size) and checked against PyTorch there, not scored."""
    imgsz, x32, written, latency, torch_ms = first
    timings = {tuple(imgsz): (torch_ms, {(row.name, p): latency[path] for path, row, p, *_ in written})}
    failures = []
    for size in args.latency_imgsz:
        if (size, size) in timings:
            continue
        x = preprocess(img, [size, size])[0].repeat(args.batch, 1, 1, 1).to(x32.device)
        calibration = calibration_inputs(data, [size, size], args.calib_images, args.batch)
        folder = weights.parent / f"{weights.stem}_benchmark" / f"{size}px"
        meta = dict(metadata, imgsz=[size, size])
        here = write_all(weights, jobs, network, x, args, options, meta, calibration, data, folder)
        failed, latency_here, torch_here = check_all(
            here, network, x, options, args.runs, f"the same image at {size} px"
        )
        failures += failed
        timings[size, size] = (torch_here, {(row.name, p): latency_here.get(path) for path, row, p, *_ in here})
    return timings, failures


def check_all(written, network, x32, options, runs, source):
    """check() each file. Returns (the sentences of the failures, each file's latency, PyTorch's latency)."""
    print(f"check on {source}, input {tuple(x32.shape)}:")
    failures, latency = [], {}
    with torch.no_grad():
        torch_ms = median_latency(lambda x: network(x, mode=options.mode), x32, runs)
    for path, row, precision, net, x, module in written:
        if reason := row.cannot_run():  # written, not run: Core ML off macOS, described (its spec) instead
            described = f"; its spec: {row.describe(path)}" if row.describe else ""
            print(f"{label(path):>24}: not run here ({reason}){described}")
            continue
        tolerance = 1e-2 if precision == "fp16" else 1e-3
        fp16_weights = precision == "fp16" and row.fp16_weights_only  # of an fp32 graph (OpenVINO): see check()
        parity = None if precision == "int8" else "detections" if fp16_weights else "raw"
        ok, latency[path] = check(path, net, module, x, options, runs, tolerance, torch_ms, parity)
        if not ok:
            failures.append(
                (path, f"{label(path)} and PyTorch disagree beyond tolerance {tolerance} (relative, see above)")
            )
    return failures, latency, torch_ms


def main(argv=None):
    args = parse_args(argv)
    weights, jobs = check_request(args)
    device = select_device(args.device)
    network, train_args, imgsz = load_network(weights, args, device)
    data = dataset_of(args, train_args, weights, network, jobs)
    source, img = check_image(train_args, args.source)
    x32 = preprocess(img, imgsz)[0].repeat(args.batch, 1, 1, 1).to(device)
    calibration = calibration_inputs(data, imgsz, args.calib_images, args.batch) if data else None
    options = ExportOptions.of(args, network.end2end)
    metadata = metadata_of(network, train_args, options, imgsz, args.data)
    folder = weights.parent / f"{weights.stem}_benchmark" if args.benchmark else None
    written = write_all(weights, jobs, network, x32, args, options, metadata, calibration, data, folder)
    failures, latency, torch_ms = check_all(written, network, x32, options, args.runs, source)
    if data is None:
        print(f"accuracy gate skipped: {weights} names no dataset of ours; give --data to score the exported files")
    else:
        scores = Scores(data, train_args, args, device, options.mode)
        print(f"accuracy gate on {data['yaml']}:")
        results = {}
        for path, row, precision, *_ in written:
            if reason := row.cannot_run():
                print(f"{label(path):>24}: not scored here: {reason}")
                continue
            *results[path], failure = gate(path, row, precision, scores, network, args, imgsz)
            failures += [(path, failure)] if failure else []
        if args.benchmark:
            first = (imgsz, x32, written, latency, torch_ms)
            timings, failed = latency_at_sizes(weights, jobs, network, img, args, options, metadata, data, first)
            failures += failed
            print_benchmark(weights, scores.checkpoint(network, args.dynamic, imgsz), written, results, timings)
    if failures:  # a file that failed keeps no name that val.py, detect.py or a glob for *.onnx would ship
        sentences = {}
        for path, sentence in failures:
            sentences.setdefault(path, []).append(sentence)
        sys.exit(
            "\n".join(f"error: {sentence}" for path, said in sentences.items() for sentence in set_aside(path, said))
        )


if __name__ == "__main__":
    main()
