"""Evaluate a checkpoint or an exported model with pycocotools: per-class table, speed per stage, metrics.json, plots.

    python val.py                                          # newest runs/train/*/weights/best.pt
    python val.py --weights runs/train/exp/weights/best.pt --data data/shapes.yaml
    python val.py --weights best.pt --data coco.yaml --save-json   # + COCO-format detections
    python val.py --weights runs/train/exp/weights/best_int8_openvino_model   # what you ship: any export.py format
    python val.py --weights best.pt --data aerial.yaml --tile 640   # large images, sliced as detect.py --tile does

--weights: a .pt (ours or Ultralytics'), or an .onnx, .torchscript, .tflite or OpenVINO folder from export.py, which
carries its class names, image size and dataset yaml. A file exported without --dynamic takes only its own
size: its images are letterboxed to that square (or h x w) instead of rectangular batches.

mAP is computed by pycocotools against ground truth built from the labels (YOLO txt, or VOC xml with its
`difficult` boxes ignored), or against the original COCO json when the split is one or the dataset yaml names
one for val (`coco_json:`), so COCO numbers are official.
"""

import argparse
import json
import sys
from pathlib import Path

from models.predict import inference_size, load
from utils.checkpoints.ours import CheckpointError, weights_or_newest
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml, save_inferred_yaml
from utils.data.labels import MAX_PIXELS, load_verified, single_class
from utils.data.loader import ValDataset, fix_cv2_and_file_limits, make_loader
from utils.distributed import select_device
from utils.evaluate import evaluate, format_table
from utils.general import next_run_dir, setup_logging, write_run_file
from utils.plots import plot_evaluation
from utils.tiles import DEFAULT_OVERLAP, WholeImages, tiled_predictor, tiling_error

parser = argparse.ArgumentParser(
    description="Evaluate a checkpoint (COCO mAP with pycocotools)",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
)
parser.add_argument(
    "--weights", default="", help="checkpoint or exported model (default: newest runs/train/*/weights/best.pt)"
)
parser.add_argument("--data", default="", help="dataset yaml, obj.data or export folder (default: the checkpoint's)")
parser.add_argument("--split", default="val", choices=["val", "test", "train"])
parser.add_argument("--imgsz", type=int, default=0, help="0 = the size stored in the checkpoint or exported file")
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--conf", type=float, default=0.001, help="low on purpose: mAP integrates over all confidences")
parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
parser.add_argument("--max-det", type=int, default=300)
parser.add_argument("--device", default="")
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--half", action="store_true", help="fp16 inference of a .pt (CUDA)")
parser.add_argument(
    "--nms", action="store_true", help="YOLO26 .pt: its one-to-many head + NMS instead of the NMS-free head"
)
parser.add_argument(
    "--single-cls",
    action="store_true",
    help="every class as one (automatic for a checkpoint trained with --single-cls)",
)
parser.add_argument(
    "--max-pixels", type=int, default=MAX_PIXELS, help="exclude images with more pixels (decompression bombs)"
)
parser.add_argument("--tile", type=int, default=0, help="run on overlapping tiles of this many px (utils/tiles.py)")
parser.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP, help="--tile: the part shared by neighbours")
parser.add_argument("--save-json", action="store_true", help="write COCO-format detections to predictions.json")
parser.add_argument("--out", default="", help="output folder (default runs/val/exp, exp2, ...)")
args = parser.parse_args()

fix_cv2_and_file_limits()
try:
    weights = weights_or_newest(args.weights)
except CheckpointError as e:
    sys.exit(f"error: {e}")
device = select_device(args.device)
try:
    # any format: models/predict.py
    predictor = load(weights, device, half=args.half and device.type == "cuda", nms=args.nms)
    if not (args.data or predictor.data):  # an Ultralytics file names no dataset of ours
        sys.exit(f"error: {weights} does not say which dataset it was trained on; give --data")
    data = load_dataset_yaml(args.data or predictor.data)
    split = data[args.split]
    records = load_verified(split, data["nc"], args.split, max_pixels=args.max_pixels) if split else None
except (CheckpointError, DatasetError) as e:
    sys.exit(f"error: {e}")
if records is None:
    sys.exit(f"error: {data['yaml']} has no '{args.split}' split")
if args.single_cls or predictor.single_cls:  # trained with --single-cls: every class counts as one
    records, data["names"], data["nc"] = single_class(records), ["object"], 1
if len(predictor.names) != data["nc"]:
    sys.exit(f"error: {weights} predicts {len(predictor.names)} classes but {data['yaml']} names {data['nc']}")

out = Path(args.out) if args.out else next_run_dir("runs/val/exp")
out.mkdir(parents=True, exist_ok=True)
log = setup_logging(out / "val.log")
if data["inferred_yaml"]:  # a folder as --data: the yaml it amounts to, beside the scores
    save_inferred_yaml(data, out / "data.yaml")
shape, note = inference_size(predictor, args.imgsz)
if note:
    log.info(f"note: {note}")
imgsz = max(shape)
batch = 1 if args.tile else args.batch  # --tile: each image whole, at its own size, one at a time
if args.tile:  # the tiled predictor slices it
    error = tiling_error(args.tile, args.overlap, shape)
    if error:
        sys.exit(f"error: {error}")
    predictor = tiled_predictor(
        predictor, shape, args.tile, args.overlap, args.conf, args.iou, None, args.max_det, True
    )
    dataset = WholeImages(records)
    log.info(f"tiles of {args.tile} px overlapping by {args.overlap:.0%}, and the whole image for large objects")
else:  # a file of fixed size gets that size for every image, a .pt or a --dynamic export rectangular batches
    dataset = ValDataset(records, imgsz, batch, stride=predictor.stride, shape=None if predictor.dynamic else shape)
loader = make_loader(dataset, batch_size=batch, workers=args.workers, pin_memory=device.type == "cuda")
log.info(f"{weights} ({predictor.backend}): {len(records)} {args.split} images at {imgsz} px on {predictor.device}")

coco_json = data["coco_jsons"][args.split]  # the split's original COCO json, when it has one
result = evaluate(predictor, loader, data["names"], device, coco_json, args.conf, args.iou, args.max_det)
speed = result["metrics"]["speed_ms"]
log.info(format_table(result, data["names"]))
log.info(
    f"speed per image: {speed['preprocess']:.1f} ms preprocess, {speed['inference']:.1f} ms inference, "
    f"{speed['nms']:.1f} ms NMS at {imgsz} px"
)
metrics = {**result["metrics"], "per_class": result["per_class"], "weights": str(weights)}
write_run_file(out / "metrics.json", json.dumps(metrics, indent=2))  # aside, renamed; a full disk: one sentence
if args.save_json:
    (out / "predictions.json").write_text(json.dumps(result["detections"]))
    if coco_json is None:  # the ground truth the mAP was computed against, for re-checking
        (out / "ground_truth.json").write_text(json.dumps(result["ground_truth"]))
best_f1_confidence = plot_evaluation(result, predictor, loader, data["names"], out, device)
log.info(f"best F1 at confidence {best_f1_confidence:.3f} (F1_curve.png; detect.py --conf)")
log.info(f"results in {out}")
