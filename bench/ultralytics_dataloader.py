"""Images/s of Ultralytics' training data loader, per loader worker, for a side-by-side with ours
(`python bench/bench_dataloader.py --per-worker 1 2 --peer-python "$PEER_PYTHON"` runs this script
itself, on the same images, and prints both in one table).

Runs in the peer virtual environment, never the project's (ultralytics is not a dependency of this repo), which
`bench/peer_env.sh DIR` makes (then `export PEER_PYTHON=DIR/bin/python`). Usage:

    $PEER_PYTHON bench/ultralytics_dataloader.py --images runs/bench_dataloader/shapes640/images/train \
        --imgsz 640 --batch 16 --workers 1 2 --batches 30 --repeats 3

The loader is the one its trainer builds for mode='train' (DetectionTrainer.get_dataloader does exactly this):
`build_yolo_dataset(cfg, images, batch, data, mode="train")` + `build_dataloader(dataset, batch, workers,
shuffle=True)`, with Ultralytics' default augmentation (mosaic 1.0, RandomPerspective translate 0.1 scale 0.5, HSV,
fliplr 0.5; mixup, cutmix, copy-paste 0) and no image cache unless --cache-ram. Labels are found by swapping the
last /images/ of each path for /labels/ (the layout utils/data/shapes.make_shapes writes). Its label cache
(labels/<split>.cache) is written next to the labels, so point it at a generated set, not a dataset you keep.

Timing: `--warmup` batches are not timed (worker start-up, the mosaic buffer filling), then `--batches` batches
are. --repeats runs the whole measurement again with fresh workers and keeps the best (a shared CPU is noisy).
Images per CPU-second of the workers (their user + system time in /proc over the timed batches) is printed beside
images/s: what one core delivers when it is the worker's alone, far less noisy than images/s on a shared machine.
--json FILE writes {"workers": {W: {"images_per_second": best, "images_per_cpu_second": best, "runs": [...],
"cpu_runs": [...], "loadavg": [...]}}}.
"""

import argparse
import itertools
import json
import os
import sys
import time

from peer import use_peer_config  # bench/, the script's own folder, is on sys.path

# Ultralytics reads these at import time, so they must be set before the import below.
os.environ["YOLO_OFFLINE"] = "1"  # no telemetry, no version checks, downloads fail fast instead of hanging
os.environ["YOLO_AUTOINSTALL"] = "0"  # never pip-install missing requirements at run time
use_peer_config()  # YOLO_CONFIG_DIR: settings.json and Ultralytics/Arial.ttf live there

import torch  # noqa: E402
import ultralytics  # noqa: E402
from cpu_time import cpu_seconds  # noqa: E402  (bench/, the script's own folder, is on sys.path)
from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.data import build_dataloader, build_yolo_dataset  # noqa: E402
from ultralytics.utils import DEFAULT_CFG, LOGGER  # noqa: E402


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def batches_forever(loader):
    """InfiniteDataLoader yields one epoch per iter() (its workers persist): chain the epochs."""
    return itertools.chain.from_iterable(loader for _ in itertools.count())


def time_loader(args, workers):
    """Images/s of a fresh training loader with `workers` workers, after args.warmup batches."""
    cfg = get_cfg(
        DEFAULT_CFG,
        {"imgsz": args.imgsz, "batch": args.batch, "workers": workers, "cache": "ram" if args.cache_ram else False},
    )
    data = {"names": {i: f"class{i}" for i in range(args.nc)}, "nc": args.nc, "channels": 3}
    dataset = build_yolo_dataset(cfg, args.images, args.batch, data, mode="train")
    loader = build_dataloader(dataset, args.batch, workers, shuffle=True, rank=-1, device="cpu")
    if loader.num_workers != workers:
        raise SystemExit(f"error: asked for {workers} workers, build_dataloader gave {loader.num_workers}")
    if not args.found:  # once: what it read, so a wrong layout (no labels found) does not go unnoticed
        boxes = sum(len(label["cls"]) for label in dataset.labels)
        print(
            f"  {len(dataset)} images, {sum(len(label['cls']) > 0 for label in dataset.labels)} with labels,"
            f" {boxes} boxes",
            flush=True,
        )
        args.found = True
    it = batches_forever(loader)
    for _ in itertools.islice(it, args.warmup):
        pass
    pids = [w.pid for w in getattr(loader.iterator, "_workers", [])]
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    images = sum(len(batch["img"]) for batch in itertools.islice(it, args.batches))
    rate = images / (time.perf_counter() - start)
    cpu_end = cpu_seconds(pids)
    load = loadavg()
    loader.close()
    del it, loader, dataset
    cpu_rate = images / (cpu_end - cpu) if pids and cpu is not None and cpu_end is not None and cpu_end > cpu else None
    return rate, cpu_rate, load


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", required=True, help="folder of training images (.../images/train)")
    parser.add_argument("--nc", type=int, default=6, help="number of classes in the labels")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure")
    parser.add_argument("--warmup", type=int, default=5, help="batches not timed")
    parser.add_argument("--batches", type=int, default=30, help="batches timed")
    parser.add_argument("--repeats", type=int, default=3, help="measure each worker count N times, keep the best")
    parser.add_argument("--cache-ram", action="store_true", help="cache='ram' (decoded images kept in RAM)")
    parser.add_argument(
        "--target-rate", type=float, default=700, help="images/s a GPU consumes: cores = this / per-worker"
    )
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    args.found = False
    LOGGER.setLevel("WARNING")  # the dataset scan's progress lines

    print(
        f"ultralytics {ultralytics.__version__}, torch {torch.__version__}, {os.cpu_count()} cores | "
        f"{args.images}, {args.imgsz} px, batch {args.batch}, mosaic on, cache {'ram' if args.cache_ram else 'off'}",
        flush=True,
    )
    results = {w: {"runs": [], "cpu_runs": [], "loadavg": []} for w in args.workers}
    for repeat in range(args.repeats):
        for workers in args.workers:
            rate, cpu_rate, load = time_loader(args, workers)
            results[workers]["runs"].append(rate)
            results[workers]["cpu_runs"].append(cpu_rate)
            results[workers]["loadavg"].append(load)
            per_cpu = f"{cpu_rate:6.1f}" if cpu_rate else "     ?"
            print(
                f"  run {repeat + 1}: {workers} workers {rate:7.1f} img/s ({rate / workers:6.1f} per worker,"
                f" {per_cpu} per worker CPU-second) | loadavg {load}",
                flush=True,
            )
    target = args.target_rate
    print(f"best of {args.repeats}; cores for {target:g} img/s = {target:g} / per-worker rate (wall, or CPU-second)")
    print(
        f"{'workers':>7} | {'img/s':>7} | {'img/s/worker':>12} | {'img/CPU-s':>9} | {'cores (wall)':>12} | cores (CPU)"
    )
    for workers, r in results.items():
        best = r["images_per_second"] = max(r["runs"])
        cpu = r["images_per_cpu_second"] = max((c for c in r["cpu_runs"] if c), default=None)
        cpu_cells = f"{cpu:>9.1f} | {target / (best / workers):>12.1f} | {target / cpu:.1f}" if cpu else "?"
        print(f"{workers:>7} | {best:>7.1f} | {best / workers:>12.1f} | {cpu_cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ultralytics": ultralytics.__version__, "workers": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
