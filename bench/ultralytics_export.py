"""Ultralytics' own export of one of its checkpoints to one format, and that file's detections on a dataset's val split
as COCO json, for bench/export_side_by_side.py. Runs in the peer environment (`bench/peer_env.sh DIR`, plus the
format's packages), never in ours:

    $PEER_PYTHON bench/ultralytics_export.py --weights best.pt --data set_abs.yaml --format ncnn --imgsz 320 --out DIR

--data: a dataset yaml with an absolute `path:`. Prints a JSON line {"file": the exported file or folder} once
exported, then {"file": ..., "predictions": the predictions.json of YOLO(file).val(save_json=True)}; or {"error":
"..."} when the export or the validation fails (the side-by-side table lists it as such).
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from peer import use_peer_config  # bench/, the script's own folder, is on sys.path

os.environ["YOLO_OFFLINE"] = "1"  # read at import time: no telemetry, downloads fail fast
os.environ["YOLO_AUTOINSTALL"] = "0"
use_peer_config()

from ultralytics import YOLO  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--weights", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--format", required=True, help="Ultralytics' name: torchscript onnx openvino litert ncnn mnn ...")
parser.add_argument("--imgsz", type=int, default=320)
parser.add_argument("--out", required=True)
args = parser.parse_args()

out = Path(args.out).resolve()
out.mkdir(parents=True, exist_ok=True)
weights = out / Path(args.weights).name
shutil.copy(args.weights, weights)  # Ultralytics writes the export beside the weights
if args.format in ("saved_model", "pb"):
    # Offline, Ultralytics' TensorFlow export fails: it downloads onnx2tf's sample images (20x128x128x3) from GitHub
    # unless the file lies in the working directory. Random values of that shape, in a folder of the run's own.
    os.chdir(out)
    sample = Path("calibration_image_sample_data_20x128x128x3_float32.npy")
    if not sample.exists():
        import numpy as np

        np.save(sample, np.random.default_rng(0).random((20, 128, 128, 3), dtype=np.float32))
try:
    exported = YOLO(str(weights)).export(format=args.format, imgsz=args.imgsz, batch=1, device="cpu")
    print(json.dumps({"file": str(exported)}), flush=True)  # the file exists even if its own val below crashes
    val = YOLO(exported, task="detect").val(
        data=args.data,
        imgsz=args.imgsz,
        batch=1,
        conf=0.001,
        iou=0.7,
        max_det=300,
        save_json=True,
        plots=False,
        device="cpu",
        project=str(out),
        name=f"val_{args.format}",
        exist_ok=True,
        verbose=False,
    )
    print(json.dumps({"file": str(exported), "predictions": str(Path(val.save_dir) / "predictions.json")}))
except Exception as e:  # the table says which formats fail and how
    print(json.dumps({"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e) else ''}"}))
    sys.exit(0)
