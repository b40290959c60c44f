"""Sliced inference (--tile) on large images: val.py's mAP and time per image with and without it.

    python bench/tiles.py                                  # make the sets, train (33 min on a busy 2-core CPU), score
    python bench/tiles.py --weights runs/tiles/train/weights/best.pt    # score an existing model only
    python bench/tiles.py --train 40 --val 2 --epochs 1 --out runs/tiles_smoke   # a quick look

The set: the shapes of utils/data/shapes.py (the same backgrounds, clutter and outlines), four classes (circle,
square, triangle, cross: outlines still told apart at 8 px), every object 8-30 px across, about 12 per 640x640 px
and never overlapping. The test split is --val images of 3000x2000, the ones scored; the train and val splits
(val picks best.pt) are images of --imgsz x --imgsz px, what a tile of a test image looks like, on which the n model
trains at --imgsz (320: at 640 px the 2-core CPU trained at ~0.5 images/s, too slow for a run of minutes). Then
val.py scores the test split twice with the same best.pt at the same model size: the whole image letterboxed to
--imgsz, and `--tile IMGSZ` (20 % overlap; the whole image at --imgsz added for large objects). Printed: a row per
way (mAP50-95, mAP50, seconds per image as val.py measures them: preprocessing + inference + NMS, for --tile the
slicing and merging included), and for reference the whole image at its own resolution (--imgsz 3008).
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# the drawing of the built-in set, reused so that these images look like the ones the project trains on
from utils.data.shapes import _background, _clutter, _colour, _draw_mask  # noqa: E402

NAMES = ["circle", "square", "triangle", "cross"]
OBJECTS_PER_TILE = (6, 18)  # per 640x640 px: ~175 objects on a 3000x2000 image, under val.py's --max-det 300
DIAMETER = (8, 30)  # px


def draw_large(rng, w, h):
    """One image of w x h px and its labels as rows of (class, x1, y1, x2, y2): small shapes that never overlap,
    each drawn in its own box (a full-size mask per object would take gigabytes at 3000x2000)."""
    img = _background(rng, h, w)
    for _ in range(max(1, round(w * h / 640**2))):  # clutter as dense as on a 640 px image
        _clutter(rng, img)
    n = round(rng.uniform(*OBJECTS_PER_TILE) * w * h / 640**2)
    taken, labels = [], []
    for _ in range(n):
        cls = int(rng.integers(0, len(NAMES)))
        r = math.exp(rng.uniform(math.log(DIAMETER[0] / 2), math.log(DIAMETER[1] / 2)))
        cx, cy = rng.uniform(r + 2, w - r - 2), rng.uniform(r + 2, h - r - 2)
        x1, y1, x2, y2 = int(cx - r) - 2, int(cy - r) - 2, int(cx + r) + 3, int(cy + r) + 3
        if any(x1 < b[2] and b[0] < x2 and y1 < b[3] and b[1] < y2 for b in taken):
            continue
        mask = np.zeros((y2 - y1, x2 - x1), np.uint8)
        _draw_mask(mask, NAMES[cls], cx - x1, cy - y1, r, rng)
        inside = mask > 127
        if inside.sum() < 12:
            continue
        roi = img[y1:y2, x1:x2]
        colour = np.array(_colour(rng, roi[inside].mean(0)), np.float32)
        alpha = (mask.astype(np.float32) / 255)[..., None]
        img[y1:y2, x1:x2] = (roi * (1 - alpha) + colour * alpha).astype(np.uint8)
        ys, xs = np.nonzero(inside)
        taken.append((x1, y1, x2, y2))
        labels.append((cls, x1 + xs.min(), y1 + ys.min(), x1 + xs.max() + 1, y1 + ys.max() + 1))
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.3, 1.0))
    return img, labels


def make_set(root, n_train, n_val, size, seed=0):
    """images/ and labels/ of the splits under root, and root/tiles.yaml; kept when made with these settings. train and
    val (which picks best.pt): 640x640; test: the 3000x2000 images scored."""
    root = Path(root)
    settings = {"n_train": n_train, "n_val": n_val, "size": size, "seed": seed, "names": NAMES, "diameter": DIAMETER}
    marker = root / "settings.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return root / "tiles.yaml"
    splits = (
        ("train", n_train, (size, size)),
        ("val", max(n_train // 10, 2), (size, size)),
        ("test", n_val, (3000, 2000)),
    )
    for k, (split, n, (w, h)) in enumerate(splits):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img, labels = draw_large(np.random.default_rng([seed, k, i]), w, h)
            cv2.imwrite(str(root / "images" / split / f"{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
            rows = [
                f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n"
                for c, x1, y1, x2, y2 in labels
            ]
            (root / "labels" / split / f"{i:05d}.txt").write_text("".join(rows))
    cfg = {"path": ".", "train": "images/train", "val": "images/val", "test": "images/test", "names": NAMES}
    (root / "tiles.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    marker.write_text(json.dumps(settings))
    return root / "tiles.yaml"


def run(*args):
    print("$", " ".join(map(str, args)), flush=True)
    subprocess.run([sys.executable, *map(str, args)], cwd=REPO, check=True)


def score(weights, data, out, flags):
    """val.py's metrics.json of one way of running the model on the test split; a run of these weights that is there
    already is read back (the tiled one takes minutes on a busy 2-core CPU)."""
    metrics = Path(out) / "metrics.json"
    done = metrics.exists() and Path(json.loads(metrics.read_text())["weights"]).resolve() == Path(weights).resolve()
    if not done:
        run("val.py", "--weights", weights, "--data", data, "--split", "test", "--workers", 1, "--out", out, *flags)
    return json.loads(metrics.read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/tiles")
    parser.add_argument("--train", type=int, default=500, help="train images of --imgsz px")
    parser.add_argument("--val", type=int, default=20, help="3000x2000 test images, the ones scored")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--imgsz", type=int, default=320, help="the model's input size, and --tile's")
    parser.add_argument("--weights", default="", help="score this best.pt instead of training one")
    args = parser.parse_args()
    out = (REPO / args.out).resolve()
    data = make_set(out / "data", args.train, args.val, args.imgsz)
    weights = args.weights
    if not weights:
        start = time.perf_counter()
        run(
            "train.py", "--data", data, "--model", "n", "--imgsz", args.imgsz, "--epochs", args.epochs, "--batch", 16,
            "--workers", 2, "--cache", "ram", "--close_mosaic", 2, "--warmup_epochs", 1, "--nominal_batch", 16,
            "--out", out / "train",
        )  # fmt: skip
        print(f"training: {time.perf_counter() - start:.0f} s", flush=True)
        weights = out / "train/weights/best.pt"
    ways = [
        ("whole image", "val_whole", []),
        (f"--tile {args.imgsz}", "val_tiled", ["--tile", args.imgsz]),
        # for reference, not at the same model size: the network run on the whole image at its own resolution
        ("--imgsz 3008", "val_full_size", ["--imgsz", 3008, "--batch", 1]),
    ]
    print(f"\n{'val.py':<14} {'mAP50-95':>9} {'mAP50':>7} {'s/image':>8} {'images':>7}")
    rows = {}
    for name, folder, flags in ways:
        metrics = score(weights, data, out / folder, flags)
        rows[folder] = metrics["mAP50-95"]
        per_image = sum(metrics["speed_ms"].values()) / 1000  # val.py's own: preprocessing, inference, NMS
        print(
            f"{name:<14} {metrics['mAP50-95']:>9.3f} {metrics['mAP50']:>7.3f} {per_image:>8.2f} {metrics['images']:>7}"
        )
    whole, tiled = rows["val_whole"], rows["val_tiled"]
    print(f"tiled / whole mAP50-95: {tiled / whole:.1f}x" if whole else "the whole image at this size found nothing")


if __name__ == "__main__":
    main()
