"""Which layers export.py --int8 must leave in float: the INT8 ONNX and OpenVINO exports with each candidate set
of float layers (KEEP_FLOAT in utils/export/writers.py), their mAP50-95 next to the checkpoint's and their median
latency at batch 1.

    python bench/int8_float_layers.py --weights runs/train/exp/weights/best.pt --imgsz 640 --val-images 100

Prints one row per (candidate, format). The figures behind the README's choice are in bench/RESULTS.md.
"""

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import export  # noqa: E402
from utils.export import writers as export_writers  # noqa: E402

DECODE = r"^/head/(?!(box|cls)\.)"  # everything of the head after its convolutions: DFL, anchors, concatenations
CANDIDATES = {
    "nothing": [],
    "decode": [DECODE],
    "decode + last 1x1 convs": [DECODE, r"^/head/(box|cls)\.\d+/(box|cls)\.\d+\.2/"],
    "decode + box branch": [DECODE, r"^/head/box\."],
}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--weights", required=True)
parser.add_argument("--imgsz", default="640")
parser.add_argument("--val-images", default="100")
parser.add_argument("--calib-images", default="300")
parser.add_argument("--runs", default="20")
parser.add_argument("--formats", nargs="+", default=["onnx", "openvino"])
args = parser.parse_args()

print(f"{'kept in float':<26} {'format':<9} {'mAP50-95':>9} {'checkpoint':>10} {'drop':>7} {'latency ms':>10}")
for name, patterns in CANDIDATES.items():
    export_writers.KEEP_FLOAT[:] = patterns
    for fmt in args.formats:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            export.main(
                ["--weights", args.weights, f"--{fmt}", "--int8", "--imgsz", args.imgsz, "--runs", args.runs]
                + ["--val-images", args.val_images, "--calib-images", args.calib_images, "--max-map-drop", "1"]
            )
        text = printed.getvalue()
        ours, reference = map(float, re.search(r"mAP50-95 ([\d.]+) vs the checkpoint's ([\d.]+)", text).groups())
        latency = float(re.search(r"median latency ([\d.]+) ms", text)[1])
        print(f"{name:<26} {fmt:<9} {ours:>9.4f} {reference:>10.4f} {reference - ours:>7.4f} {latency:>10.1f}")
