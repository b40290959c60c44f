"""export.py's accuracy gate: the exported file and the checkpoint scored by pycocotools (val.py's settings) on the
same validation images at the same size, the drop held to --max-map-drop, and the --benchmark table."""

import os
import shutil
import sys
from pathlib import Path

import numpy as np

from utils.data.labels import load_verified
from utils.data.loader import ValDataset, make_loader
from utils.evaluate import evaluate
from utils.export import formats as export_formats
from utils.export.formats import file_size, label
from utils.inference import from_pytorch, load_exported

MAX_MAP_DROP = {"fp32": 0.002, "fp16": 0.002, "int8": 0.01}
GATE_ADVICE = {  # what to try when a file of this precision fails the gate
    "int8": "export without --int8, or calibrate on more images (--calib-images)",
    "fp16": "export without --half",
    "fp32": "the export is broken: look at the raw-output differences above, or try another --opset",
}


class Scores:
    """The accuracy gate's evaluations: mAP50-95 and mAP50 by pycocotools (val.py's settings) on the validation
    split, or its first --val-images, for the checkpoint and each exported file, on the same images at the same
    size (a file without --dynamic takes only its own size: the checkpoint is then scored at that size too). mode:
    what the checkpoint's head answers (models/head.py Detect.forward), as the exported graph does."""

    def __init__(self, data, train_args, args, device, mode=None):
        self.records = load_verified(data["val"], data["nc"], "val") if data["val"] else None
        if self.records is None or not len(self.records):
            sys.exit(f"error: {data['yaml']} has no validation images to score the export on; give another --data")
        if args.val_images:
            self.records = self.records.take(np.arange(min(args.val_images, len(self.records))))
        self.names, self.coco_json = data["names"], data["coco_json"]
        if train_args.get("single_cls"):
            self.records, self.names = self.records.single_class(), ["object"]
        self.args, self.device, self.mode, self.reference = args, device, mode, {}

    def __call__(self, predictor, imgsz):
        fixed = None if predictor.dynamic else tuple(imgsz)
        dataset = ValDataset(self.records, max(imgsz), self.args.batch_val, stride=predictor.stride, shape=fixed)
        loader = make_loader(dataset, batch_size=self.args.batch_val, workers=self.args.workers)
        metrics = evaluate(predictor, loader, self.names, self.device, self.coco_json, conf=0.001, iou=0.7)["metrics"]
        return metrics["mAP50-95"], metrics["mAP50"]

    def checkpoint(self, network, dynamic, imgsz):
        """The checkpoint's (mAP50-95, mAP50) as the exported file is scored (computed once per kind of input)."""
        if dynamic not in self.reference:
            predictor = from_pytorch(network, self.device, mode=self.mode).replace(dynamic=dynamic)
            self.reference[dynamic] = self(predictor, imgsz)
        return self.reference[dynamic]


def gate(path, row, precision, scores, network, args, imgsz):
    """Score the exported file and the checkpoint; print both. Returns (mAP50-95, mAP50, None or the sentence of
    a failure)."""
    predictor = load_exported(path, scores.device)
    ours, ours50 = scores(predictor, imgsz)
    reference, _ = scores.checkpoint(network, predictor.dynamic, imgsz)
    limit = MAX_MAP_DROP[precision] if args.max_map_drop is None else args.max_map_drop
    n = len(scores.records)
    print(
        f"{label(path):>24}: mAP50-95 {ours:.4f} vs the checkpoint's {reference:.4f} on {n} val images "
        f"(drop {reference - ours:+.4f}, allowed {limit})"
    )
    failure = (
        f"{label(path)} ({row.runtime} {precision}) scores mAP50-95 {ours:.4f} against the checkpoint's "
        f"{reference:.4f} on {n} val images, a drop of {reference - ours:.4f} > --max-map-drop {limit}: "
        f"{GATE_ADVICE[precision]}"
    )
    return ours, ours50, None if reference - ours <= limit else failure


def print_benchmark(weights, reference, written, results, timings):
    """One row per format: file size, mAP50-95, mAP50 (pycocotools, at the size the files were scored at), then the
    median latency at batch 1 and the speed-up over PyTorch at each size of timings ({(h, w): (PyTorch's ms,
    {(format, precision): ms})}, the scored size first)."""
    rows = [("PyTorch", "fp32", file_size(weights), *reference, [torch_ms for torch_ms, _ in timings.values()])]
    for path, row, p, *_ in written:
        ms = [at.get((row.name, p)) for _, at in timings.values()]
        rows.append((row.runtime, p, file_size(path), *results[path], ms))
    sizes = [f"{h} px" if h == w else f"{h}x{w} px" for h, w in timings]
    header = ("format", "precision", "size MB", "mAP50-95", "mAP50", *(f"{s} ms  speed-up" for s in sizes))
    print(f"\n{header[0]:<16} {header[1]:<9} {header[2]:>8} {header[3]:>9} {header[4]:>7}", *header[5:])
    for name, precision, size, m, m50, ms in rows:
        cells = [
            f"{t:>{len(s) + 3}.1f} {torch_ms / t:>8.2f}x" if t else f"{'-':>{len(s) + 3}} {'':>9}"
            for s, t, (torch_ms, _) in zip(sizes, ms, timings.values())
        ]
        print(f"{name:<16} {precision:<9} {size / 1e6:>8.1f} {m:>9.4f} {m50:>7.4f}", *cells)


def set_aside(path, sentences):
    """Rename a file (or folder) that failed the check or the gate to <name>.rejected beside it, so that it keeps no
    name val.py, detect.py or a glob for *.onnx would ship, and say so at the end of its last sentence."""
    path = Path(path)
    target = path.parent if export_formats.format_of(path).folder else path
    rejected = target.with_name(target.name + ".rejected")
    if rejected.is_dir():
        shutil.rmtree(rejected)
    os.replace(target, rejected)
    *first, last = sentences
    return [*first, f"{last}; the file is renamed {rejected.name}, where nothing picks it up as a model"]
