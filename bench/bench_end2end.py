"""End-to-end latency of trained detectors in ONNX Runtime, batch 1, on this machine's CPU: letterbox, the network,
then NMS (YOLOv8/YOLO11) or only the confidence threshold (YOLO26, whose graph already gives the final boxes), per
image of a dataset's validation split, as detect.py and models/predict.py run them.

    # checkpoints trained by bench/recipe_benchmark.py; each is exported by export.py at every size
    python bench/bench_end2end.py --weights runs/recipe/shapes/{ours,ours-11n,ours-26n}/e10/s0/train/weights/best.pt
    # + Ultralytics' YOLO26n ONNX (end to end, (1, 300, 6)), one fixed-size file per size, timed the same way
    python bench/bench_end2end.py --weights ... --ultralytics-onnx 640/yolo26n.onnx 320/yolo26n.onnx

Ultralytics' files are made in its own environment with `YOLO("640/yolo26n.pt").export(format="onnx", imgsz=640,
nms=False)`: nms=False is its NMS-free head; its default (nms=None) exports the raw one-to-many output for NMS.

NMS time depends on how many boxes pass the threshold, so the models are trained ones and the images real:
conf 0.25 (detect.py's default) and 0.001 (val.py's, the worst case for NMS). Medians over the images, after a
warm-up, the faster of two passes (time_models). Close other programs first: on a shared CPU the figures measure
the neighbours.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import onnx
import onnxruntime
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from models.predict import detect_image, load  # noqa: E402
from utils.checkpoints.ours import load_checkpoint  # noqa: E402
from utils.data.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.data.labels import list_images  # noqa: E402
from utils.export.loaders import onnx_session  # noqa: E402
from utils.inference import Predictor  # noqa: E402


def export(weights, size, folder, data):
    """best.onnx of the checkpoint at size x size (export.py, its check and a short accuracy gate), in a folder
    named after the model (n, 11n, 26n, ...; 26n-reg-max-16 for train.py --reg-max 16)."""
    args = load_checkpoint(weights)["args"]
    name = args["model"] + (f"-reg-max-{args['reg_max']}" if args.get("reg_max") else "")
    copy = folder / f"{name}_{size}" / "best.pt"
    copy.parent.mkdir(parents=True)
    shutil.copy(weights, copy)
    command = [sys.executable, "export.py", "--weights", str(copy), "--onnx", "--imgsz", str(size)]
    subprocess.run(command + ["--data", data, "--val-images", "8", "--workers", "0"], cwd=REPO, check=True)
    return copy.with_suffix(".onnx")


def ultralytics_end2end(path):
    """An Ultralytics end-to-end .onnx (YOLO26: output (1, 300, 6) x1 y1 x2 y2 score class) as a Predictor."""
    session = onnx_session(path)  # subnormals flushed, as ours (utils/export/loaders.py)
    shape = session.get_inputs()[0].shape[2:]
    name = session.get_inputs()[0].name
    if session.get_outputs()[0].shape[-1] != 6:
        sys.exit(f"error: {path}: expected an end-to-end output (batch, 300, 6), got {session.get_outputs()[0].shape}")
    run = lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])  # noqa: E731
    return Predictor(run, [], tuple(shape), 32, dynamic=False, end2end=True, backend="ONNX Runtime", weights=str(path))


def time_models(models, images, conf, warmup=3):
    """Per model, median milliseconds per image of preprocessing, the network, the post-processing, and their sum.
    Each model runs all the images in a block, in two passes (the models in order, then reversed), and keeps the
    faster pass's medians. Not image by image in turns: after a run ONNX Runtime's threads keep spinning for a
    while, and on a 2-core CPU that slowed whichever model ran next by up to 60% (26n timed right after 11n's
    network: 79 ms; after 11n's 98 ms of NMS: 48 ms)."""
    best = [None] * len(models)
    for order in (range(len(models)), reversed(range(len(models)))):
        for i in order:
            for img in images[:warmup]:
                detect_image(models[i], img, models[i].imgsz, conf=conf)
            times = [detect_image(models[i], img, models[i].imgsz, conf=conf)[1] for img in images]
            # per image (preprocess, network, post-processing) -> per stage and in all, the median in ms
            ms = [1000 * statistics.median(stage) for stage in [*zip(*times), map(sum, times)]]
            best[i] = ms if best[i] is None or ms[-1] < best[i][-1] else best[i]
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", required=True, help="trained .pt checkpoints")
    parser.add_argument("--data", default="", help="dataset yaml for the images (default: the first checkpoint's)")
    parser.add_argument("--sizes", nargs="+", type=int, default=[640, 320])
    parser.add_argument("--images", type=int, default=100, help="validation images timed per model and size")
    parser.add_argument("--ultralytics-onnx", nargs="*", default=[], help="Ultralytics end-to-end .onnx files")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the torch side is only NMS and the letterbox; ORT runs with its own threads
    data = args.data or load_checkpoint(args.weights[0])["args"]["data"]
    files = list_images(load_dataset_yaml(data)["val"])[: args.images]
    images = [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in files]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            models = [load(export(w, size, Path(tmp), data)) for w in args.weights]
            for path in args.ultralytics_onnx:
                theirs = ultralytics_end2end(path)
                if theirs.imgsz == (size, size):
                    models.append(theirs)
            for conf in (0.25, 0.001):
                for model, ms in zip(models, time_models(models, images, conf)):
                    folder = Path(model.weights).parent.name
                    name = folder.rsplit("_", 1)[0] if "_" in folder else f"Ultralytics {Path(model.weights).name}"
                    post = "top-300 (no NMS)" if model.end2end else "NMS"
                    rows.append([name, size, post, conf, *ms])
    print(
        f"batch 1, median ms per image over {len(images)} images of {data}; onnxruntime {onnxruntime.__version__} "
        f"(onnx {onnx.__version__}), torch {torch.__version__} (1 thread, for the letterbox and NMS)"
    )
    print("| model | imgsz | after the network | conf | letterbox | network | post-processing | total |")
    print("|---|---|---|---|---|---|---|---|")
    for name, size, post, conf, *ms in rows:
        print(f"| {name} | {size} | {post} | {conf} | " + " | ".join(f"{t:.1f}" for t in ms) + " |")


if __name__ == "__main__":
    main()
