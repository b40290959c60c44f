"""Detect objects in images, folders, globs, .txt lists, videos, webcams or streams, and save the results.

    python detect.py --source photo.jpg                        # newest runs/train/*/weights/best.pt
    python detect.py --weights best.onnx --source images/ --save-txt --save-json
    python detect.py --weights best.torchscript --source "shots/*.png" --conf 0.4 --classes 0 2
    python detect.py --weights best.pt --source aerial.jpg --tile 640   # small objects in large images (utils/tiles.py)
    python detect.py --weights best_int8_openvino_model --source images/   # any folder export.py --openvino wrote
    python detect.py --weights best.pt --source video.mp4     # writes an annotated video
    python detect.py --weights best.pt --source video.mp4 --track   # ids kept from frame to frame (utils/track.py)
    python detect.py --weights best.pt --source 0              # webcam 0; Ctrl+C stops and saves
    python detect.py --weights best.pt --source rtsp://user:pass@camera:554/stream1  # also http(s)://
    python detect.py --weights best.pt --source cameras.streams --vid-stride 2  # one source a line, all at once

A stream URL and each source of a .streams file are read in a thread of their own that keeps only the
newest frame (utils/streams.py): a slow model skips frames instead of falling behind. A source that
drops is reopened a few times, then reported in one sentence; the others go on.

--weights: a .pt checkpoint, or an .onnx / .torchscript / .tflite file or OpenVINO folder from export.py (they
carry their class names, image size and NMS settings, so nothing else is needed).

From Python, in an application: models/predict.py (load, predict), the same path every image here takes.

Outputs in runs/detect/exp (exp2, ... or --out): the annotated images, and a .mp4 per video or stream
(named after the URL's host, port and path for a stream);
  --save-txt   labels/NAME.txt (labels/NAME_FRAME.txt for videos, FRAME counting every frame of the source,
               --vid-stride's skipped ones too), one row per detection:
               class cx cy w h conf, coordinates normalised to 0..1 (YOLO format plus confidence)
  --save-json  predictions.json in COCO format: image_id (the file name's stem, as a number when it
               is one, so COCO val images match their ids; NAME_FRAME for videos), category_id (the
               class index), bbox (x y w h in pixels), score
  --track      videos, webcams and streams: each object's id drawn, and tracks/NAME.txt in MOT-challenge text,
               frame,id,x,y,w,h,score,class (frame from 1, counting every frame of the source)
Unreadable files are reported and skipped; the run goes on.
"""

import argparse
import contextlib
import glob
import json
import math
import signal
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import torch
from tqdm import tqdm

from models.predict import detect_image, inference_size, load, nms_note
from utils.boxes import xyxy_to_xywh
from utils.checkpoints.ours import CheckpointError, weights_or_newest
from utils.coco import detections_to_coco
from utils.data.images import read_image
from utils.data.labels import IMAGE_SUFFIXES
from utils.distributed import select_device
from utils.general import next_run_dir
from utils.plots import draw_detections
from utils.streams import Stream, StreamError, VideoOut, is_url, quiet_video_logs, read_streams_file, source_names
from utils.tiles import DEFAULT_OVERLAP, tiled_predictor, tiling_error
from utils.track import TrackWriter, draw_tracks

WRITABLE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}  # cv2 writes these; others become .jpg
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".m4v", ".mpg", ".mpeg", ".wmv", ".webm", ".gif"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Detect objects in images and videos", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--weights",
        default="",
        help=".pt, .onnx, .torchscript, .tflite or OpenVINO folder (default: newest runs/train/*/weights/best.pt)",
    )
    parser.add_argument(
        "--source",
        required=True,
        help="image, folder, glob, .txt list, video, webcam index, rtsp:// or http(s):// URL, or .streams list",
    )
    parser.add_argument("--imgsz", type=int, nargs="+", default=[0], help="h w, or one size for both; 0 = the model's")
    parser.add_argument("--conf", type=float, default=0.25, help="confidence threshold")
    parser.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    parser.add_argument(
        "--nms", action="store_true", help="YOLO26 .pt: its one-to-many head + NMS instead of the NMS-free head"
    )
    parser.add_argument("--classes", type=int, nargs="+", help="keep only these class indices")
    parser.add_argument("--max-det", type=int, default=300, help="at most this many detections per image")
    parser.add_argument("--tile", type=int, default=0, help="run on overlapping tiles of this many px")
    parser.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP, help="--tile: the part shared by neighbours")
    parser.add_argument("--device", default="", help="cpu, 0, ... (default: the first GPU if any)")
    parser.add_argument("--vid-stride", type=int, default=1, help="process every Nth frame of videos and streams")
    parser.add_argument("--track", action="store_true", help="ids kept across frames: drawn, and in tracks/NAME.txt")
    parser.add_argument("--save-txt", action="store_true", help="labels/*.txt: class cx cy w h conf (normalised)")
    parser.add_argument("--save-json", action="store_true", help="predictions.json in COCO format")
    parser.add_argument("--out", default="", help="output folder (default runs/detect/exp, exp2, ...)")
    args = parser.parse_args(argv)
    if args.vid_stride < 1:
        parser.error("--vid-stride must be 1 or more")
    return args


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


def live_sources(source):
    """The sources of a stream URL or a .streams file, or None for any other --source."""
    if is_url(source):
        return [source]
    if Path(source).suffix != ".streams":
        return None
    if not Path(source).is_file():
        sys.exit(f"error: --source {source}: no such .streams file")
    sources = read_streams_file(source)
    if not sources:
        sys.exit(f"error: --source {source} lists no source (one URL, webcam index or video a line)")
    return sources


def open_streams(sources, origin, stride, notify):
    """A Stream per source that opens, with its output name; one sentence for each that does not."""
    streams = []
    for source, name in zip(sources, source_names(sources)):
        try:
            streams.append((Stream(source, stride, notify), name))
        except StreamError as e:
            if sources == [origin]:  # a URL given as --source
                sys.exit(f"error: --source {e}")
            print(f"warning: {e} (in {origin}; skipped)")
    if not streams:
        sys.exit(f"error: none of the {len(sources)} source(s) in {origin} can be opened")
    return streams


@contextlib.contextmanager
def stop_on_ctrl_c():
    """An Event the first Ctrl+C sets: the frame at hand is finished and everything is saved, so that
    the labels and the videos agree. A second Ctrl+C stops at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield stop
        return
    previous = signal.getsignal(signal.SIGINT) or signal.default_int_handler  # None: set outside Python

    def first_ctrl_c(signum, frame):
        stop.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, first_ctrl_c)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def describe(dets, names):
    if not len(dets):
        return "no detections"
    counts = torch.bincount(dets[:, 5].long(), minlength=len(names))
    return ", ".join(f"{int(n)} {names[c]}" for c, n in enumerate(counts) if n)


class Outputs:
    """What a run writes into its folder (annotated pictures and videos, --save-txt labels, --track tracks,
    --save-json's rows), the files it skipped and the seconds of each stage, for one Predictor and this run's flags."""

    def __init__(self, predictor, imgsz, folder, args):
        self.predictor, self.names, self.imgsz, self.folder, self.args = predictor, predictor.names, imgsz, folder, args
        self.coco, self.skipped, self.images = [], [], 0
        self.seconds = np.zeros(3)  # preprocess, inference, NMS

    def detect(self, img_rgb):
        """(n, 6) detections in the original image's pixels and the seconds of each stage, with this run's flags."""
        args = self.args
        imgsz = img_rgb.shape[:2] if args.tile else self.imgsz  # the tiled predictor takes the image whole, slices it
        dets, times = detect_image(self.predictor, img_rgb, imgsz, args.conf, args.iou, args.classes, args.max_det)
        self.seconds += times
        self.images += 1
        return dets, times

    def save(self, dets, name, shape):
        """Write --save-txt and collect --save-json rows for one image or frame."""
        if self.args.save_txt:
            h, w = shape
            xywh = xyxy_to_xywh(dets[:, :4]) / torch.tensor([w, h, w, h])
            rows = [
                f"{int(c)} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f} {s:.5f}"
                for (x, y, bw, bh), s, c in zip(xywh.tolist(), dets[:, 4].tolist(), dets[:, 5].tolist())
            ]
            (self.folder / "labels" / f"{name}.txt").write_text("".join(r + "\n" for r in rows))
        if self.args.save_json:
            self.coco += detections_to_coco(dets.tolist(), int(name) if name.isdigit() else name)

    def frame(self, frame, label, video, tracks=None, index=0):
        """Detect in one BGR frame, save its results under `label` and append it, annotated, to `video`; with a
        TrackWriter `tracks`, the frame (number `index` of the source) is tracked and drawn with its ids."""
        dets, _ = self.detect(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        self.save(dets, label, frame.shape[:2])
        if tracks is None:
            video.write(draw_detections(frame, dets.tolist(), self.names))
        else:
            video.write(draw_tracks(frame, tracks.update(dets, index), self.names))
        return dets

    def video(self, name, fps):
        return VideoOut(self.folder / f"{name}.mp4", fps)

    def tracks(self, name):  # --track: the TrackWriter of the source `name`; else None
        return TrackWriter(self.folder / "tracks" / f"{name}.txt") if self.args.track else None


def run_video(outputs, capture, name, stop):
    """Every --vid-stride'th frame of an opened cv2.VideoCapture -> NAME.mp4, until its end or `stop`."""
    stride = outputs.args.vid_stride
    fps = capture.get(cv2.CAP_PROP_FPS) or 30  # webcams often report 0
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))  # 0 or -1 for a webcam
    video, index, frames, found = outputs.video(name, fps / stride), 0, 0, 0
    tracks = outputs.tracks(name)
    bar = tqdm(total=math.ceil(total / stride) if total > 0 else None, desc=name, unit="frame", leave=False)
    try:
        while not stop.is_set():
            if index % stride:
                if not capture.grab():  # skipped frames are not decoded
                    break
                index += 1
                continue
            ok, frame = capture.read()
            if not ok:
                break
            dets = outputs.frame(frame, f"{name}_{index}", video, tracks, index)
            index, frames, found = index + 1, frames + 1, found + len(dets)
            bar.update()
            bar.set_postfix_str(describe(dets, outputs.names))
    finally:
        bar.close()
        capture.release()
        video.close()
        if tracks is not None:
            tracks.close()
    return frames, found


def run_streams(outputs, streams, notify, stop):
    """Round-robin over the live sources, each time on the newest frame a source received since its last
    turn, until all have stopped or `stop`; a source's video is closed as soon as it stops."""
    videos = {stream: outputs.video(name, stream.fps / stream.stride) for stream, name in streams}
    tracks = {stream: outputs.tracks(name) for stream, name in streams} if outputs.args.track else {}
    counts = {stream: [0, 0, 0] for stream, _ in streams}  # frames, detections, reconnections reported
    live = list(streams)

    def report(stream):
        frames, found, _ = counts[stream]
        summary = f"{frames} frames, {found} detections" + (f" -> {videos[stream].path}" if frames else "")
        if stream.error:
            tqdm.write(f"stream {stream.name} stopped: {stream.error} ({summary})")
        else:
            tqdm.write(f"{stream.name}: {summary}")

    bar = tqdm(desc="streams", unit="frame", leave=False)
    try:
        while live and not stop.is_set():
            notify.clear()  # before the round: a frame that arrives during it wakes the wait below at once
            busy = False
            for stream, name in list(live):
                finished = stream.finished  # read before take(): the last frame of a source is not lost
                got = stream.take()
                if stream.reconnections > counts[stream][2]:
                    counts[stream][2] = stream.reconnections
                    note = f"; {tracks[stream].reconnected()}" if tracks else ""
                    tqdm.write(f"stream {stream.name} dropped and was reopened{note}")
                if got is None:
                    if finished:
                        live.remove((stream, name))
                        videos[stream].close()
                        report(stream)
                    continue
                index, frame = got
                dets = outputs.frame(frame, f"{name}_{index}", videos[stream], tracks.get(stream), index)
                counts[stream][0] += 1
                counts[stream][1] += len(dets)
                busy = True
                bar.update()
                bar.set_postfix_str(f"{stream.name}: {describe(dets, outputs.names)}")
            if not busy:
                notify.wait(0.1)
    finally:
        bar.close()
        for stream, _ in streams:
            stream.close()
        for video in [*videos.values(), *tracks.values()]:
            video.close()
    for stream, _ in live:  # stopped by Ctrl+C
        report(stream)


def run_files(outputs, paths, stop):
    """Images and video files, one after the other, until the last or `stop`."""
    out = outputs.folder
    bar = tqdm(paths, unit="file", disable=len(paths) < 2)
    for path in bar:
        if stop.is_set():
            break
        name = Path(path).stem
        if Path(path).suffix.lower() in VIDEO_SUFFIXES:
            capture = cv2.VideoCapture(path)
            if not capture.isOpened():
                outputs.skipped.append(path)
                tqdm.write(f"{path}: cannot be read as a video, skipped")
                continue
            frames, found = run_video(outputs, capture, name, stop)
            tqdm.write(f"{path}: {frames} frames, {found} detections -> {out / name}.mp4")
            continue
        img = read_image(path)
        if img is None:
            outputs.skipped.append(path)
            tqdm.write(f"{path}: cannot be read as an image, skipped")
            continue
        dets, times = outputs.detect(img)
        outputs.save(dets, name, img.shape[:2])
        annotated = draw_detections(cv2.cvtColor(img, cv2.COLOR_RGB2BGR), dets.tolist(), outputs.names)
        suffix = Path(path).suffix if Path(path).suffix.lower() in WRITABLE_SUFFIXES else ".jpg"
        cv2.imwrite(str(out / (name + suffix)), annotated)
        tqdm.write(
            f"{path}: {describe(dets, outputs.names)} ({times[0] * 1000:.1f} ms preprocess, "
            f"{times[1] * 1000:.1f} ms inference, {times[2] * 1000:.1f} ms NMS)"
        )


def main(argv=None):
    args = parse_args(argv)
    try:
        weights = weights_or_newest(args.weights)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    device = select_device(args.device)
    try:
        predictor = load(weights, device, nms=args.nms)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    imgsz, note = inference_size(predictor, args.imgsz)
    if args.tile:
        error = tiling_error(args.tile, args.overlap, imgsz)
        if error:
            sys.exit(f"error: {error}")
        settings = (args.tile, args.overlap, args.conf, args.iou, args.classes, args.max_det)
        predictor = tiled_predictor(predictor, imgsz, *settings)
        print(f"tiles of {args.tile} px overlapping by {args.overlap:.0%}, and the whole image for large objects")
    for sentence in (note, nms_note(predictor, args.conf, args.iou)):
        if sentence:
            print(f"note: {sentence}")
    live, streams = live_sources(args.source), []
    if live:
        quiet_video_logs()
        notify = threading.Event()  # set by a stream's thread when it has a new frame or has stopped
        streams = open_streams(live, args.source, args.vid_stride, notify)
    sources = [] if live else list_sources(args.source)
    capture = cv2.VideoCapture(sources) if isinstance(sources, int) else None  # webcam
    if capture is not None and not capture.isOpened():
        sys.exit(f"error: webcam {sources} cannot be opened")
    in_order = live or capture is not None or any(Path(s).suffix.lower() in VIDEO_SUFFIXES for s in sources)
    if args.track and not in_order:  # frames that follow each other: a video, a webcam, a stream
        sys.exit(f"error: --track needs a video, a webcam or a stream; --source {args.source} names images only")

    out = Path(args.out) if args.out else next_run_dir("runs/detect/exp")
    (out / "labels" if args.save_txt else out).mkdir(parents=True, exist_ok=True)
    print(f"{predictor.backend} {weights} on {device}, {imgsz[0]}x{imgsz[1]} px")
    outputs = Outputs(predictor, imgsz, out, args)
    with stop_on_ctrl_c() as stop:
        if streams:
            run_streams(outputs, streams, notify, stop)
        if capture is not None:
            frames, found = run_video(outputs, capture, f"webcam{sources}", stop)
            print(f"webcam {sources}: {frames} frames, {found} detections")
            sources = []
        run_files(outputs, sources, stop)

    if args.save_json:
        (out / "predictions.json").write_text(json.dumps(outputs.coco))
    if outputs.images:
        pre, inference, nms = outputs.seconds / outputs.images * 1000
        print(
            f"speed per image: {pre:.1f} ms preprocess, {inference:.1f} ms inference, "
            f"{nms:.1f} ms NMS at {imgsz[0]}x{imgsz[1]}"
        )
    if outputs.skipped:
        print(f"skipped {len(outputs.skipped)} unreadable file(s): {', '.join(outputs.skipped)}")
    print(f"results in {out}")
    return out


if __name__ == "__main__":
    main()
