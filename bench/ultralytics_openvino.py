"""Ultralytics' own OpenVINO exports (fp32 and int8=True) of a YOLOv8n with our shapes set's 6 classes, for
bench/openvino_latency.py. Runs in the peer environment (`bench/peer_env.sh DIR`, then
`export PEER_PYTHON=DIR/bin/python`), never in ours:

    $PEER_PYTHON bench/ultralytics_openvino.py --data shapes_abs.yaml --out runs/peer/openvino

--data: a dataset yaml with an absolute `path:` (Ultralytics resolves relative ones under its own datasets folder);
INT8 is calibrated on its images. --weights: an Ultralytics .pt to export instead of an untrained yolov8n; with a
trained one, --val scores the .pt and both exports with Ultralytics' own validator on the dataset's val split at
--imgsz (mAP50-95, mAP50), for the INT8 drop beside ours:

    $PEER_PYTHON bench/ultralytics_openvino.py --data shapes_abs.yaml --out runs/peer/openvino-trained \
        --weights runs/recipe/shapes/peer/e10/s0/peer/train/weights/last.pt --val

Writes OUT/yolov8n_openvino_model/ and OUT/yolov8n_int8_openvino_model/ (or after the .pt's name).
"""

import argparse
import os
import sys
from pathlib import Path

from peer import use_peer_config  # bench/, the script's own folder, is on sys.path

os.environ["YOLO_OFFLINE"] = "1"  # read at import time: no telemetry, downloads fail fast
os.environ["YOLO_AUTOINSTALL"] = "0"
use_peer_config()  # YOLO_CONFIG_DIR: settings.json and Ultralytics/Arial.ttf live there

from ultralytics import YOLO  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", required=True)
parser.add_argument("--weights", default="", help="an Ultralytics .pt (default: an untrained yolov8n, nc 6)")
parser.add_argument("--imgsz", type=int, default=640)
parser.add_argument("--out", default="runs/peer/openvino")
parser.add_argument("--val", action="store_true", help="score the .pt and both exports (Ultralytics' validator)")
args = parser.parse_args()

out = Path(args.out).resolve()
out.mkdir(parents=True, exist_ok=True)
data = str(Path(args.data).resolve())
source = args.weights and str(Path(args.weights).resolve())
if not source:  # the architecture file with the shapes set's class count: the head's width depends on it
    import ultralytics

    yaml = Path(ultralytics.__file__).parent / "cfg/models/v8/yolov8.yaml"
    source = str(out / "yolov8n.yaml")
    Path(source).write_text(yaml.read_text().replace("nc: 80", "nc: 6", 1))
os.chdir(out)  # an export from a yaml model is written to the current folder
files = {"PyTorch fp32": source}
for int8 in (False, True):
    files[f"OpenVINO {'int8' if int8 else 'fp32'}"] = YOLO(source).export(
        format="openvino", imgsz=args.imgsz, device="cpu", int8=int8, data=data
    )
    print(files[f"OpenVINO {'int8' if int8 else 'fp32'}"], file=sys.stderr)
if args.val:
    scores = {}
    for name, path in files.items():
        metrics = YOLO(path, task="detect").val(data=data, imgsz=args.imgsz, batch=1, device="cpu", plots=False)
        scores[name] = (metrics.box.map, metrics.box.map50)
    print("| file | mAP50-95 | mAP50 | mAP50-95 drop |\n|---|---|---|---|")
    for name, (m, m50) in scores.items():
        print(f"| {name} | {m:.4f} | {m50:.4f} | {scores['PyTorch fp32'][0] - m:.4f} |")
