"""Train Ultralytics YOLOv8n on our shapes set, offline, for a side-by-side comparison with train.py.

Runs in a virtual environment of its own, never the project's (ultralytics is not a dependency of this repo). Make it
once with `bench/peer_env.sh DIR` (pinned versions, offline settings, its config dir DIR/yolo-config, which the script
finds from the python it runs in; YOLO_CONFIG_DIR overrides), then `export PEER_PYTHON=DIR/bin/python`.

Usage (from the repository root):

    # full run: train YOLOv8n from scratch with Ultralytics' defaults, validate best.pt, write OUT/summary.json
    $PEER_PYTHON bench/ultralytics_shapes.py --data data/shapes.yaml --epochs 100 --imgsz 320 --batch 16 \
       --out runs/peer/v8n
    # throughput only: images/s over N iterations after 2 warm-up iterations (like train.py --benchmark N)
    $PEER_PYTHON bench/ultralytics_shapes.py --imgsz 320 --batch 16 --benchmark-iters 20 --out runs/peer/bench
    # ONNX for latency: of the trained best.pt, or of an untrained model with --epochs 0
    $PEER_PYTHON bench/ultralytics_shapes.py --epochs 0 --imgsz 640 --export-onnx --out runs/peer/onnx
    # predictions of a trained .pt only (for YOLO26 in both of its modes, see save_predictions)
    $PEER_PYTHON bench/ultralytics_shapes.py --validate runs/peer/v8n/train/weights/best.pt \
       --data data/shapes.yaml --imgsz 320 --out runs/peer/v8n
    # smoke test: first 32 train and 32 val images
    $PEER_PYTHON bench/ultralytics_shapes.py --epochs 1 --imgsz 64 --batch 8 --subset 32 --out runs/peer/smoke

Everything not set here (optimizer 'auto', lr, warmup, augmentation, close_mosaic, deterministic, ...) is left at
Ultralytics' defaults on purpose: the point is to compare its defaults with ours. Only what the comparison needs is
pinned: from scratch (yolov8n.yaml, pretrained=False), CPU, fp32, no plots, 2 torch threads and 2 loader workers.

OUT/summary.json: mAP50-95, mAP50, precision, recall (Ultralytics' own validator on best.pt, val split), predictions
(its COCO-format detections of the val split, for `python bench/score_detections.py --category-offset 1`; for
YOLO26 those of its one-to-many head + NMS, Ultralytics' default, and predictions_end2end its NMS-free head's),
train_seconds (wall time of the whole train() call: setup, epochs, per-epoch val, final val), images_per_second
(training iterations after the run's first 2, data loading included, validation excluded), epochs, imgsz, batch, and
a few extras (versions, image counts, paths). In --benchmark-iters mode the metrics are null.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from peer import use_peer_config  # bench/, the script's own folder, is on sys.path

# Ultralytics reads these at import time, so they must be set before the import below.
os.environ["YOLO_OFFLINE"] = "1"  # no telemetry, no version checks, downloads fail fast instead of hanging
os.environ["YOLO_AUTOINSTALL"] = "0"  # never pip-install missing requirements at run time
use_peer_config()  # YOLO_CONFIG_DIR: settings.json and Ultralytics/Arial.ttf live there

import torch  # noqa: E402
import ultralytics  # noqa: E402
import yaml  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.utils import USER_CONFIG_DIR  # noqa: E402

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--data", default="data/shapes.yaml", help="our dataset yaml (path relative to its folder)")
    parser.add_argument(
        "--model",
        default="yolov8n.yaml",
        help="architecture file shipped inside the ultralytics package (nothing to download): yolov8n.yaml, "
        "yolo11s.yaml, ... (the scale letter in the name picks the scale)",
    )
    parser.add_argument("--epochs", type=int, default=100, help="0 = no training (only makes sense with --export-onnx)")
    parser.add_argument("--imgsz", type=int, default=320, help="train, val and export size")
    parser.add_argument("--batch", type=int, default=16, help="training batch (Ultralytics validates at 2x)")
    parser.add_argument("--out", required=True, help="output folder: summary.json, the mirrored dataset, the run")
    parser.add_argument(
        "--subset", type=int, default=0, help="use only the first N train and val images (like train.py --subset)"
    )
    parser.add_argument(
        "--benchmark-iters",
        type=int,
        default=0,
        help="measure train images/s over N iterations after 2 warm-up ones, then stop",
    )
    parser.add_argument(
        "--export-onnx",
        action="store_true",
        help="export best.pt (or an untrained model if nothing was trained) to ONNX",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch intra-op threads (Ultralytics would use 1 on 2 cores)"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="data-loader processes (Ultralytics would force 0 on CPU)"
    )
    parser.add_argument(
        "--deterministic", action=argparse.BooleanOptionalAction, default=None, help="default: Ultralytics' own (True)"
    )
    parser.add_argument(
        "--validate", default="", help="no training: only save the predictions of this .pt on the val split"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, or a GPU index (0): fp32 either way (amp=False)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra Ultralytics train() arguments, e.g. --set warmup_epochs=1 nbs=16 close_mosaic=3",
    )
    return parser.parse_args()


def list_images(folder):
    return sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def mirror_split(src_images, dst_root, split, limit):
    """Symlink the first `limit` images of a split (0 = all) and their labels into dst_root/{images,labels}/split.

    Why a mirror instead of pointing at datasets/shapes directly: Ultralytics writes its label cache next to the
    labels (labels/train.cache), and a subset would rewrite it each time. The mirror keeps our dataset folder
    untouched. Folders are real and files are links, so Ultralytics' path.resolve() of the split folder stays in
    the mirror and its '/images/' -> '/labels/' swap finds the mirrored labels.
    """
    src_images = Path(src_images)
    src_labels = Path("/labels/".join(str(src_images).rsplit("/images/", 1)))
    images = list_images(src_images)
    if not images:
        sys.exit(f"error: no images in {src_images}")
    images = images[:limit] if limit else images
    img_dir, lbl_dir = dst_root / "images" / split, dst_root / "labels" / split
    for folder in (img_dir, lbl_dir):  # start clean: a different --subset must not leave extra images behind
        if folder.exists():
            for old in folder.iterdir():
                old.unlink()
        folder.mkdir(parents=True, exist_ok=True)
    for cache in dst_root.glob("labels/*.cache"):
        cache.unlink()
    for image in images:
        rel = image.relative_to(src_images)
        (img_dir / rel.name).symlink_to(image.resolve())
        label = (src_labels / rel).with_suffix(".txt")
        if label.exists():  # no label file = image without objects, which Ultralytics accepts
            (lbl_dir / label.name).symlink_to(label.resolve())
    return len(images)


def write_dataset_yaml(data_yaml, out, train_limit, val_limit):
    """Write an Ultralytics-compatible yaml: absolute path and only path/train/val/names (no custom keys)."""
    data_yaml = Path(data_yaml).resolve()
    cfg = yaml.safe_load(data_yaml.read_text())
    root = (data_yaml.parent / cfg.get("path", ".")).resolve()  # our convention: path is relative to the yaml's folder
    mirror = out / "dataset"
    n_train = mirror_split(root / cfg["train"], mirror, "train", train_limit)
    n_val = mirror_split(root / cfg["val"], mirror, "val", val_limit)
    names = cfg["names"]
    names = {i: n for i, n in enumerate(names)} if isinstance(names, list) else {int(k): v for k, v in names.items()}
    path = out / "shapes_ultralytics.yaml"
    path.write_text(
        yaml.safe_dump(
            {"path": str(mirror), "train": "images/train", "val": "images/val", "names": names}, sort_keys=False
        )
    )
    return path, n_train, n_val, len(names)


def set_threads(n):
    # Ultralytics' select_device() calls torch.set_num_threads(min(8, cpu_count - 1)), i.e. 1 on this 2-core machine,
    # in the trainer's __init__ and again before the final validation, so this runs from callbacks after those points.
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def add_cpu_callbacks(model, threads, workers):
    def on_pretrain_routine_start(trainer):
        # The trainer has just forced workers=0 for CPU; put ours back before the data loaders are built.
        trainer.args.workers = workers
        set_threads(threads)

    def on_train_start(trainer):
        set_threads(threads)
        print(f"cpu: {torch.get_num_threads()} torch threads, {trainer.train_loader.num_workers} loader workers")

    model.add_callback("on_pretrain_routine_start", on_pretrain_routine_start)
    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_val_start", lambda validator: set_threads(threads))  # final val of best.pt re-selects device


def add_epoch_timer(model):
    """Images/s of a full run: every training iteration but the run's first 2 (worker start-up), without validation.

    An iteration's time runs from the previous iteration's end, or from the start of its epoch for the first one,
    so data loading counts and the validation between epochs does not.
    """
    timer = {"seconds": 0.0, "images": 0, "iterations": 0}

    def on_epoch_start(trainer):
        timer["last"], timer["in_epoch"] = time.perf_counter(), 0

    def on_batch_end(trainer):
        now = time.perf_counter()
        timer["iterations"] += 1
        timer["in_epoch"] += 1
        if timer["iterations"] > 2:
            n, batch = len(trainer.train_loader.dataset), trainer.batch_size
            timer["seconds"] += now - timer["last"]
            timer["images"] += min(batch, n - (timer["in_epoch"] - 1) * batch)  # the last batch may be short
        timer["last"] = now

    model.add_callback("on_train_epoch_start", on_epoch_start)
    model.add_callback("on_train_batch_end", on_batch_end)
    return timer


class BenchmarkDone(Exception):
    """Raised from a callback to leave training right after the timed iterations (no validation, no saving)."""


def add_benchmark_timer(model, iters):
    """Same measurement as train.py --benchmark: images/s from the end of iteration 2 to the end of iteration 2 + N."""
    timer = {"iteration": 0}

    def on_batch_end(trainer):
        timer["iteration"] += 1
        if timer["iteration"] == 2:
            timer["start"] = time.perf_counter()
        elif timer["iteration"] == iters + 2:
            timer["seconds"] = time.perf_counter() - timer["start"]
            raise BenchmarkDone

    model.add_callback("on_train_batch_end", on_batch_end)
    return timer


def train_kwargs(args, data_yaml, out, epochs):
    kwargs = dict(
        data=str(data_yaml),
        epochs=epochs,
        imgsz=args.imgsz,
        batch=args.batch,
        pretrained=False,  # from scratch, like our default; there are no weights to download anyway
        amp=False,  # fp32, like train.py on the CPU (on CUDA, AMP would also run a check that downloads yolo26n.pt)
        plots=False,
        device=args.device,
        workers=args.workers,
        seed=args.seed,
        val=True,
        project=str(out),
        name="train",
        exist_ok=True,
        verbose=True,
    )
    if args.deterministic is not None:
        kwargs["deterministic"] = args.deterministic
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"error: --set {item}: expected KEY=VALUE")
        kwargs[key] = yaml.safe_load(value)  # 1 -> int, 0.5 -> float, false -> bool
    return kwargs


def save_predictions(weights, data_yaml, args, out):
    """The weights once more through Ultralytics' validator with save_json, so that bench/score_detections.py
    scores the same detections with pycocotools, the evaluator our mAP comes from (one evaluator for both repos).
    {"predictions": path} with its defaults, which for YOLO26 means its one-to-many head + NMS (nms=None), and for
    YOLO26 also {"predictions_end2end": path}, its NMS-free one-to-one head (nms=False)."""
    end2end = getattr(YOLO(str(weights)).model.model[-1], "one2one_cv2", None) is not None
    modes = [("predictions", "val", None)] + ([("predictions_end2end", "val_end2end", False)] if end2end else [])
    found = {}
    for key, name, nms in modes:
        YOLO(str(weights)).val(
            data=str(data_yaml),
            imgsz=args.imgsz,
            batch=args.batch * 2,
            save_json=True,
            plots=False,
            device=args.device,
            workers=args.workers,
            project=str(out),
            name=name,
            exist_ok=True,
            nms=nms,
        )
        found[key] = str(out / name / "predictions.json")
    return found


def export_onnx(args, out, best):
    """ONNX at imgsz, batch 1, Ultralytics' default export settings (opset, onnxslim simplification)."""
    if best is not None:  # written next to it: weights/best.onnx
        path = Path(YOLO(str(best)).export(format="onnx", imgsz=args.imgsz, device=args.device)).resolve()
        print(f"onnx: {path}")
        return str(path)
    # No training: an untrained model with our class count, so its head is the size of a trained one. The yaml
    # keeps the file's name because Ultralytics reads the scale from the file name.
    from ultralytics.nn.tasks import yaml_model_load

    cfg = {k: v for k, v in yaml_model_load(args.model).items() if k not in {"scale", "yaml_file"}}
    cfg["nc"] = len(yaml.safe_load(Path(args.data).read_text())["names"])
    cfg_path = out / args.model
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cwd = os.getcwd()
    os.chdir(out)  # an export from a yaml model is written to the current folder: make that OUT
    try:
        path = Path(YOLO(str(cfg_path)).export(format="onnx", imgsz=args.imgsz, device=args.device)).resolve()
    finally:
        os.chdir(cwd)
    print(f"onnx: {path}")
    return str(path)


def image_limits(args):
    """(train, val) image counts to mirror: --subset, or for --benchmark-iters just enough train images for 2 + N
    iterations in one epoch, so the label scan stays short (the val set is built by the trainer but never used)."""
    if not args.benchmark_iters:
        return args.subset, args.subset
    train_limit = (args.benchmark_iters + 2) * args.batch
    if args.subset and args.subset < train_limit:
        sys.exit(
            f"error: --benchmark-iters {args.benchmark_iters} at batch {args.batch} "
            f"needs {train_limit} images, --subset is {args.subset}"
        )
    return train_limit, args.batch


def run_benchmark(model, args, data_yaml, out, summary):
    """Train images/s over --benchmark-iters iterations after 2 warm-up ones, into summary."""
    # Ultralytics turns mosaic off for the last close_mosaic (10) epochs, so with a short epoch count the timed
    # iterations would run without mosaic; ask for more epochs than that (the run stops early anyway).
    epochs = max(args.epochs, 11)
    timer = add_benchmark_timer(model, args.benchmark_iters)
    try:
        model.train(**train_kwargs(args, data_yaml, out, epochs))
        sys.exit("error: training ended before the benchmark iterations were done")
    except BenchmarkDone:
        for loader in (model.trainer.train_loader, model.trainer.test_loader):
            loader.close()  # the loop was left by an exception: stop the workers ourselves
    seconds = timer["seconds"]
    rate = args.benchmark_iters * args.batch / seconds
    summary.update(
        images_per_second=round(rate, 3),
        benchmark_iters=args.benchmark_iters,
        ms_per_iteration=round(seconds / args.benchmark_iters * 1000, 1),
        epochs=None,
    )
    print(
        f"benchmark: {rate:.2f} images/s ({seconds / args.benchmark_iters * 1000:.0f} ms/iteration, "
        f"batch {args.batch}, {args.imgsz} px, {args.device}, {args.threads} threads, {args.workers} workers)"
    )


def run_training(model, args, data_yaml, out, summary):
    """Train --epochs, put best.pt's val metrics and the times into summary, save its predictions; best.pt or None."""
    epoch_timer = add_epoch_timer(model)
    start = time.perf_counter()
    model.train(**train_kwargs(args, data_yaml, out, args.epochs))
    train_seconds = time.perf_counter() - start
    trainer = model.trainer
    best = trainer.best if trainer.best.exists() else None
    # model.metrics is the validator's result from the trainer's final_eval(), i.e. best.pt on the val split.
    box = model.metrics.box
    rate = epoch_timer["images"] / epoch_timer["seconds"] if epoch_timer["images"] else None
    summary.update(
        {"mAP50-95": round(float(box.map), 5), "mAP50": round(float(box.map50), 5)},
        precision=round(float(box.mp), 5),
        recall=round(float(box.mr), 5),
        train_seconds=round(train_seconds, 1),
        epochs=trainer.epoch + 1,
        images_per_second=round(rate, 3) if rate else None,
        run_dir=str(trainer.save_dir),
        best=str(best) if best else None,
    )
    print(
        f"train: {summary['epochs']} epochs in {train_seconds:.1f} s, {summary['images_per_second']} train "
        f"images/s (iterations after the first 2, without val)"
    )
    print(f"best.pt on val: mAP50-95 {box.map:.4f} mAP50 {box.map50:.4f} P {box.mp:.4f} R {box.mr:.4f}")
    if best is not None:
        summary.update(save_predictions(best, data_yaml, args, out))
    return best


def main():
    args = parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    font = USER_CONFIG_DIR / "Arial.ttf"
    if not font.exists():  # dataset checks would try to download it and fail offline
        sys.exit(f"error: {font} missing; copy matplotlib's DejaVuSans.ttf there (bench/peer_env.sh does)")

    modes = [("benchmark", args.benchmark_iters), ("validate", args.validate), ("train", args.epochs > 0)]
    mode = next((name for name, given in modes if given), "export")
    summary = {
        "mode": mode,
        "mAP50-95": None,
        "mAP50": None,
        "precision": None,
        "recall": None,
        "train_seconds": None,
        "epochs": args.epochs,
        "imgsz": args.imgsz,
        "batch": args.batch,
        "images_per_second": None,
        "model": args.model,
        "ultralytics": ultralytics.__version__,
        "torch": torch.__version__,
        "threads": args.threads,
        "workers": args.workers,
        "set": args.set,
    }
    best = None
    if (args.benchmark_iters or args.epochs > 0) and not args.validate:
        data_yaml, n_train, n_val, nc = write_dataset_yaml(args.data, out, *image_limits(args))
        summary.update(n_train=n_train, n_val=n_val, nc=nc, data_yaml=str(data_yaml))
        print(f"dataset: {data_yaml} ({n_train} train, {n_val} val images, {nc} classes)")

        model = YOLO(args.model)
        add_cpu_callbacks(model, args.threads, args.workers)
        if args.benchmark_iters:
            run_benchmark(model, args, data_yaml, out, summary)
        else:
            best = run_training(model, args, data_yaml, out, summary)
    elif args.validate:
        data_yaml, summary["n_train"], summary["n_val"], summary["nc"] = write_dataset_yaml(args.data, out, 0, 0)
        summary.update(save_predictions(Path(args.validate), data_yaml, args, out), model=args.validate)

    if args.export_onnx:
        summary["onnx"] = export_onnx(args, out, best)

    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {out / 'summary.json'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
