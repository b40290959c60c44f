"""What grows with the dataset, measured on a generated COCO-like set, to extrapolate to COCO (118k train / 5k val).

    python bench/bench_scale.py                          # 20k train + 5k val images in runs/bench_scale
    python bench/bench_scale.py --train 2000 --val 500   # a quick look

The set: small JPEGs (160x120 .. 320x240) with COCO's spread of boxes per image: mean 7.3 (860k boxes over 118k
images), 1% without any box, and 1.5% crowded ones with 100 to 300 boxes. Printed:
- first-use verification: images/s, and per core (load_verified on a cold cache, all cores);
- the label cache: its size, and the time to load it (the whole load_verified on a warm cache, file stats
  included, and the .npz read alone);
- resident memory of each data-loader worker (2 workers, mosaic) after its first batch, one epoch and two:
  RSS, and the private part (pages the worker copied or allocated for itself); with the records as flat arrays
  (this repo) and, for comparison, as the list of dicts the code held before;
- per-epoch validation on the val images: inference (the n model) and, separately, the metric over 300
  detections per image such as a trained model gives at conf 0.001: fast_map against pycocotools.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.yolo import YOLO  # noqa: E402
from utils.coco import detections_to_coco, ground_truth  # noqa: E402
from utils.data import labels as L  # noqa: E402
from utils.data import loader as D  # noqa: E402
from utils.data.records import Records  # noqa: E402
from utils.evaluate import coco_map, fast_map, predict_dataset  # noqa: E402

COCO_TRAIN, COCO_VAL = 118_287, 5_000


def boxes_per_image(rng, n):
    counts = rng.negative_binomial(1.2, 1.2 / (1.2 + 5.2), n)  # mean ~5.2 for the ordinary images
    counts[rng.random(n) < 0.01] = 0
    crowded = rng.random(n) < 0.015
    counts[crowded] = rng.integers(100, 300, crowded.sum())
    return counts  # mean ~7.3, as COCO's


def generate(root, split, n, seed):
    folder, labels = root / "images" / split, root / "labels" / split
    if folder.is_dir() and len(os.listdir(folder)) == n:
        return folder
    folder.mkdir(parents=True, exist_ok=True), labels.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, k in enumerate(boxes_per_image(rng, n)):
        w, h = int(rng.integers(160, 321)), int(rng.integers(120, 241))
        img = np.full((h, w, 3), rng.integers(0, 256, 3), np.uint8)
        size = rng.uniform(0.02, 0.5, (k, 2)) * (0.2 if k >= 100 else 1)
        centre = rng.uniform(size / 2, 1 - size / 2)
        classes = rng.integers(0, 80, k)
        for (cx, cy), (bw, bh), c in zip(centre, size, classes):
            corners = (int((cx - bw / 2) * w), int((cy - bh / 2) * h)), (int((cx + bw / 2) * w), int((cy + bh / 2) * h))
            cv2.rectangle(img, *corners, tuple(int(v) for v in rng.integers(0, 256, 3)), -1)
        cv2.imwrite(str(folder / f"{i:06d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        rows = [f"{c} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f}\n" for (x, y), (bw, bh), c in zip(centre, size, classes)]
        (labels / f"{i:06d}.txt").write_text("".join(rows))
    return folder


def detections_like_a_trained_model(records, per_image=300, seed=0):
    """What the metric gets after NMS at conf 0.001: each box found (90%) with a jittered box and a high score,
    then low-score guesses up to 300 per image (max_det)."""
    rng = np.random.default_rng(seed)
    results = {}
    for i in range(len(records)):
        h, w = records.shapes[i]
        gt = records.labels_of(i)
        found = gt[rng.random(len(gt)) < 0.9]
        boxes = found[:, 1:] * [w, h, w, h] + rng.normal(0, 0.05, (len(found), 4)) * max(h, w) * 0.1
        boxes = np.concatenate((np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:])), 1)
        hits = np.column_stack((boxes, rng.uniform(0.3, 1.0, len(found)), found[:, 0]))
        k = max(0, per_image - len(hits))
        xy = rng.uniform(0, [w, h], (k, 2))
        guesses = np.column_stack((xy, xy + rng.uniform(4, 80, (k, 2)), rng.uniform(0.001, 0.3, k)))
        det = np.concatenate((hits, np.column_stack((guesses, rng.integers(0, 80, k)))))
        results[i] = det[np.argsort(-det[:, 4])]
    return results


def memory(pid):
    """(RSS, private) MB of a process, from /proc/<pid>/smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return fields["Rss"], fields["Private_Clean"] + fields["Private_Dirty"]


def copied_by_reading(records):
    """Private MB that a forked process (a loader worker) copies for itself by reading every record once,
    apart from any image work: the reference counts of Python objects are writes to their pages."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = memory(os.getpid())[1]
        for i in range(len(records)):
            record = records[i]
            record["im"], record["shape"], [row[0] for row in record["labels"]]
        os.write(write_end, f"{before} {memory(os.getpid())[1]}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    before, after = map(float, os.read(read_end, 100).split())
    return after - before


def worker_memory(records, imgsz, batch, workers):
    hyp = dict(mosaic=1.0, mosaic_min_area=0.1, mixup=0.0, degrees=0.0, translate=0.1, scale=0.5, shear=0.0)
    hyp |= dict(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, fliplr=0.5, flipud=0.0)
    dataset = D.TrainDataset(records, imgsz, hyp, seed=0)
    sampler = D.EpochBatchSampler(len(dataset), batch)
    loader = D.make_loader(dataset, sampler, workers=workers)
    batches = iter(loader)
    next(batches)
    pids = [w.pid for w in batches._workers]  # a private attribute: fine for a benchmark
    start = [memory(p) for p in pids]
    t = time.perf_counter()
    for _ in range(len(sampler) - 1):
        next(batches)
    seconds = time.perf_counter() - t
    first = [memory(p) for p in pids]
    for _ in range(len(sampler)):
        next(batches)
    second = [memory(p) for p in pids]
    del batches, loader
    return start, first, second, seconds


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20_000)
    parser.add_argument("--val", type=int, default=5_000)
    parser.add_argument("--root", default="runs/bench_scale")
    parser.add_argument("--imgsz", type=int, default=160, help="loader and validation size (small: the set is)")
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args()


def measure_verification(train, root, n_train, cores):
    """First use, on a cold cache (all cores): (images/s, the records)."""
    for cache in root.glob("labels/*.cache.npz"):
        cache.unlink()
    t = time.perf_counter()
    records = L.load_verified([train], 80, "train")
    verify = time.perf_counter() - t
    rate = n_train / verify
    print(
        f"verification, cold: {rate:.0f} images/s on {cores} cores = {rate / cores:.0f} images/s per core; "
        f"{len(records.labels)} boxes"
    )
    return rate, records


def measure_cache(train, root):
    """Seconds of a warm load_verified (file stats included) and of the .npz read alone: (warm, read)."""
    cache = next(root.glob("labels/train.*.cache.npz"))
    t = time.perf_counter()
    L.load_verified([train], 80, "train")
    warm = time.perf_counter() - t
    t = time.perf_counter()
    Records.load(cache)
    read = time.perf_counter() - t
    print(
        f"cache: {cache.stat().st_size / 1e6:.1f} MB; warm load_verified {warm:.2f} s (stats of every file "
        f"included), the .npz alone {read:.3f} s"
    )
    return warm, read


def measure_worker_memory(records, args):
    """Memory of the loader workers with the records as flat arrays and as the list of dicts held before."""
    as_dicts = lambda: [dict(r, labels=r["labels"].tolist()) for r in records]  # noqa: E731  (the old form)
    for name, held in (("arrays", lambda: records), ("list of dicts", as_dicts)):
        held = held()
        print(
            f"records as {name}: a forked process that reads every record once copies {copied_by_reading(held):.1f} MB"
        )
        start, first, second, seconds = worker_memory(held, args.imgsz, 32, args.workers)
        mb = lambda when, k: ", ".join(f"{m[k]:.0f}" for m in when)  # noqa: E731
        print(
            f"loader workers, records as {name}: an epoch of {args.train} mosaic samples in {seconds:.0f} s; "
            f"per worker, after the first batch / one epoch / two epochs: RSS {mb(start, 0)} / {mb(first, 0)} / "
            f"{mb(second, 0)} MB, private {mb(start, 1)} / {mb(first, 1)} / {mb(second, 1)} MB"
        )


def measure_validation(val, args):
    """Inference on the val images, then fast_map and pycocotools over detections such as a trained model gives:
    (fast_map seconds, pycocotools seconds)."""
    val_records = L.load_verified([val], 80, "val")
    dataset = D.ValDataset(val_records, args.imgsz, 32)
    loader = D.make_loader(dataset, batch_size=32, workers=args.workers)
    torch.manual_seed(0)
    model = YOLO("n", 80).eval().to(memory_format=torch.channels_last)
    t = time.perf_counter()
    predict_dataset(model, loader, torch.device("cpu"))
    inference = time.perf_counter() - t
    results = detections_like_a_trained_model(dataset.records)
    n_det = sum(len(d) for d in results.values())
    t = time.perf_counter()
    fast = fast_map(results, dataset.records, 80)
    fast_s = time.perf_counter() - t
    t = time.perf_counter()
    gt, ids, cats = ground_truth(dataset.records, [str(c) for c in range(80)])
    dets = [d for i, det in results.items() for d in detections_to_coco(det, ids[i], cats)]
    official = coco_map(gt, dets, cats)[0]
    coco_s = time.perf_counter() - t
    print(
        f"validation of {args.val} images at {args.imgsz} px: inference + NMS {inference:.0f} s; metric over "
        f"{n_det / args.val:.0f} detections per image: fast_map {fast_s:.2f} s, pycocotools {coco_s:.1f} s "
        f"(mAP50-95 {fast['mAP50-95']:.4f} / {official:.4f})"
    )
    return fast_s, coco_s


def main():
    args = parse_args()
    root = Path(args.root)
    cores = len(os.sched_getaffinity(0))

    t = time.perf_counter()
    train, val = generate(root, "train", args.train, 0), generate(root, "val", args.val, 1)
    print(f"set: {args.train} train + {args.val} val images in {root} ({time.perf_counter() - t:.0f} s to generate)")

    rate, records = measure_verification(train, root, args.train, cores)
    warm, read = measure_cache(train, root)
    measure_worker_memory(records, args)
    fast_s, coco_s = measure_validation(val, args)
    print(
        f"extrapolated to COCO on 8 cores: verification {COCO_TRAIN / (rate / cores * 8):.0f} s; "
        f"cache load {read * COCO_TRAIN / args.train:.2f} s (.npz) / {warm * COCO_TRAIN / args.train:.1f} s "
        f"(with file stats); per-epoch metric {fast_s * COCO_VAL / args.val:.1f} s (pycocotools "
        f"{coco_s * COCO_VAL / args.val:.0f} s)"
    )


if __name__ == "__main__":
    main()
