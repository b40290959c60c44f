"""Detect objects in images, folders, globs, .txt lists, videos or a webcam, and save the results.

    python detect.py --source photo.jpg                        # newest runs/train/*/weights/best.pt
    python detect.py --weights best.onnx --source images/ --save-txt --save-json
    python detect.py --weights best.torchscript --source "shots/*.png" --conf 0.4 --classes 0 2
    python detect.py --weights best.pt --source video.mp4     # writes an annotated video
    python detect.py --weights best.pt --source 0              # webcam 0; Ctrl+C stops and saves

--weights: a .pt checkpoint, or an .onnx / .torchscript file from export.py (they carry their
class names, image size and NMS settings, so nothing else is needed).

Outputs in runs/detect/exp (exp2, ... or --out): the annotated images, and videos as .mp4;
  --save-txt   labels/NAME.txt (labels/NAME_FRAME.txt for videos), one row per detection:
               class cx cy w h conf, coordinates normalised to 0..1 (YOLO format plus confidence)
  --save-json  predictions.json in COCO format: image_id (the file name's stem, as a number when it
               is one, so COCO val images match their ids; NAME_FRAME for videos), category_id (the
               class index), bbox (x y w h in pixels), score
Unreadable files are reported and skipped; the run goes on.
"""

import argparse
import glob
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from tqdm import tqdm

from models.yolo import load_model
from utils.boxes import scale_boxes_to_original, xyxy_to_xywh
from utils.checkpoint import CheckpointError, find_best_checkpoint
from utils.coco import detections_to_coco
from utils.distributed import select_device
from utils.general import next_run_dir
from utils.images import read_image
from utils.inference import from_pytorch, load_exported, postprocess, preprocess
from utils.labels import IMAGE_SUFFIXES
from utils.plots import draw_detections

WRITABLE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}  # cv2 writes these; others become .jpg
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".m4v", ".mpg", ".mpeg", ".wmv", ".webm", ".gif"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Detect objects in images and videos", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--weights", default="", help=".pt, .onnx or .torchscript (default: newest runs/train/*/weights/best.pt)"
    )
    parser.add_argument("--source", required=True, help="image, folder, glob, .txt list, video, or webcam index")
    parser.add_argument("--imgsz", type=int, nargs="+", default=[0], help="h w, or one size for both; 0 = the model's")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    parser.add_argument("--classes", type=int, nargs="+", help="keep only these class indices")
    parser.add_argument("--max-det", type=int, default=300, help="at most this many detections per image")
    parser.add_argument("--device", default="", help="cpu, 0, ... (default: the first GPU if any)")
    parser.add_argument("--save-txt", action="store_true", help="labels/*.txt: class cx cy w h conf (normalised)")
    parser.add_argument("--save-json", action="store_true", help="predictions.json in COCO format")
    parser.add_argument("--out", default="", help="output folder (default runs/detect/exp, exp2, ...)")
    return parser.parse_args(argv)


def open_model(weights, device):
    """The model behind the interface of utils/inference.py; a bad file -> CheckpointError."""
    if Path(weights).suffix != ".pt":
        return load_exported(weights, device)
    return from_pytorch(load_model(weights)[0], device)


def list_sources(source):
    """A webcam index (int), or the list of image and video files that `source` names."""
    if source.isdigit():
        return int(source)
    path = Path(source)
    if path.is_dir():
        files = sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES | VIDEO_SUFFIXES)
    elif path.suffix == ".txt" and path.is_file():  # one path per line, relative to the list
        lines = [Path(line.strip()) for line in path.read_text().splitlines() if line.strip()]
        files = [str(p if p.is_absolute() else path.parent / p) for p in lines]
    elif any(c in source for c in "*?["):
        files = sorted(glob.glob(source, recursive=True))
    elif path.is_file():
        files = [source]
    else:
        sys.exit(f"error: --source {source} is not a file, folder, glob, .txt list or webcam index")
    if not files:
        sys.exit(f"error: --source {source} names no image or video")
    return files


def detect(model, img_rgb, imgsz, args):
    """(n, 6) detections in the original image's pixels, and the ms spent in each stage."""
    t0 = time.perf_counter()
    x, ratio, pad = preprocess(img_rgb, imgsz)
    t1 = time.perf_counter()
    output = model["run"](x)
    if output.is_cuda:  # CUDA runs asynchronously: wait, or its time would be counted as NMS time
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    dets = postprocess(output, model, args.conf, args.iou, args.classes, args.max_det)[0].cpu()
    dets[:, :4] = scale_boxes_to_original(dets[:, :4], ratio, pad, img_rgb.shape[:2])
    return dets, (t1 - t0, t2 - t1, time.perf_counter() - t2)


def describe(dets, names):
    if not len(dets):
        return "no detections"
    counts = torch.bincount(dets[:, 5].long(), minlength=len(names))
    return ", ".join(f"{int(n)} {names[c]}" for c, n in enumerate(counts) if n)


def save_results(dets, name, shape, out, args, coco):
    """Write --save-txt and collect --save-json rows for one image or frame."""
    if args.save_txt:
        h, w = shape
        xywh = xyxy_to_xywh(dets[:, :4]) / torch.tensor([w, h, w, h])
        rows = [
            f"{int(c)} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f} {s:.5f}"
            for (x, y, bw, bh), s, c in zip(xywh.tolist(), dets[:, 4].tolist(), dets[:, 5].tolist())
        ]
        (out / "labels" / f"{name}.txt").write_text("".join(r + "\n" for r in rows))
    if args.save_json:
        coco += detections_to_coco(dets.tolist(), int(name) if name.isdigit() else name)


def run_video(model, capture, name, imgsz, out, args, coco, seconds):
    """Every frame of an opened cv2.VideoCapture -> out/NAME.mp4 (Ctrl+C on a webcam stops and saves)."""
    fps = capture.get(cv2.CAP_PROP_FPS) or 30  # webcams often report 0
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))  # 0 or -1 for a webcam
    writer, frames, found = None, 0, 0
    bar = tqdm(total=total if total > 0 else None, desc=name, unit="frame", leave=False)
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            if writer is None:  # the size is known only once a frame is read
                writer = cv2.VideoWriter(
                    str(out / f"{name}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), fps, (frame.shape[1], frame.shape[0])
                )
            dets, times = detect(model, cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), imgsz, args)
            seconds += times
            save_results(dets, f"{name}_{frames}", frame.shape[:2], out, args, coco)
            writer.write(draw_detections(frame, dets.tolist(), model["names"]))
            frames, found = frames + 1, found + len(dets)
            bar.update()
            bar.set_postfix_str(describe(dets, model["names"]))
    except KeyboardInterrupt:  # a webcam has no end: Ctrl+C is how a user stops it, and the video is kept
        pass
    finally:
        bar.close()
        capture.release()
        if writer is not None:
            writer.release()
    return frames, found


def main(argv=None):
    args = parse_args(argv)
    weights = args.weights or find_best_checkpoint()
    if not weights:
        sys.exit("error: no --weights given and no runs/train/*/weights/best.pt found")
    device = select_device(args.device)
    try:
        model = open_model(weights, device)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    imgsz = args.imgsz * 2 if len(args.imgsz) == 1 else args.imgsz[:2]
    imgsz = tuple(s or m for s, m in zip(imgsz, model["imgsz"]))
    if not model["dynamic"] and imgsz != tuple(model["imgsz"]):
        print(
            f"note: {weights} was exported for {model['imgsz'][0]}x{model['imgsz'][1]} only "
            "(export with --dynamic for other sizes); using that"
        )
        imgsz = tuple(model["imgsz"])
    stride = model["stride"]
    imgsz = tuple(-(-s // stride) * stride for s in imgsz)  # the network needs multiples of its stride
    if model["nms"] and (args.conf < model["nms"]["conf"] or args.iou != model["nms"]["iou"]):
        print(
            f"note: NMS is inside {weights} with conf {model['nms']['conf']} and iou {model['nms']['iou']}; "
            "--conf can only raise it, --iou is ignored"
        )
    sources = list_sources(args.source)
    capture = cv2.VideoCapture(sources) if isinstance(sources, int) else None  # webcam
    if capture is not None and not capture.isOpened():
        sys.exit(f"error: webcam {sources} cannot be opened")

    out = Path(args.out) if args.out else next_run_dir("runs/detect/exp")
    (out / "labels" if args.save_txt else out).mkdir(parents=True, exist_ok=True)
    print(f"{model['backend']} {weights} on {device}, {imgsz[0]}x{imgsz[1]} px")
    coco, skipped, seconds, images = [], [], np.zeros(3), 0  # seconds: preprocess, inference, NMS
    if capture is not None:
        frames, found = run_video(model, capture, f"webcam{sources}", imgsz, out, args, coco, seconds)
        print(f"webcam {sources}: {frames} frames, {found} detections")
        images += frames
        sources = []
    bar = tqdm(sources, unit="file", disable=len(sources) < 2)
    for path in bar:
        name = Path(path).stem
        if Path(path).suffix.lower() in VIDEO_SUFFIXES:
            capture = cv2.VideoCapture(path)
            if not capture.isOpened():
                skipped.append(path)
                tqdm.write(f"{path}: cannot be read as a video, skipped")
                continue
            frames, found = run_video(model, capture, name, imgsz, out, args, coco, seconds)
            images += frames
            tqdm.write(f"{path}: {frames} frames, {found} detections -> {out / name}.mp4")
            continue
        img = read_image(path)
        if img is None:
            skipped.append(path)
            tqdm.write(f"{path}: cannot be read as an image, skipped")
            continue
        dets, times = detect(model, img, imgsz, args)
        seconds += times
        images += 1
        save_results(dets, name, img.shape[:2], out, args, coco)
        annotated = draw_detections(cv2.cvtColor(img, cv2.COLOR_RGB2BGR), dets.tolist(), model["names"])
        suffix = Path(path).suffix if Path(path).suffix.lower() in WRITABLE_SUFFIXES else ".jpg"
        cv2.imwrite(str(out / (name + suffix)), annotated)
        tqdm.write(
            f"{path}: {describe(dets, model['names'])} ({times[0] * 1000:.1f} ms preprocess, "
            f"{times[1] * 1000:.1f} ms inference, {times[2] * 1000:.1f} ms NMS)"
        )

    if args.save_json:
        (out / "predictions.json").write_text(json.dumps(coco))
    if images:
        pre, inference, nms = seconds / images * 1000
        print(
            f"speed per image: {pre:.1f} ms preprocess, {inference:.1f} ms inference, "
            f"{nms:.1f} ms NMS at {imgsz[0]}x{imgsz[1]}"
        )
    if skipped:
        print(f"skipped {len(skipped)} unreadable file(s): {', '.join(skipped)}")
    print(f"results in {out}")
    return out


if __name__ == "__main__":
    main()
