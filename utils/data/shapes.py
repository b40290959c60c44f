"""The built-in `shapes` dataset: generated on first use, deterministic, no download.

Run it by hand with `python -m utils.data.shapes --out datasets/shapes`; train.py and val.py
call `make_shapes` when `data/shapes.yaml` points at a folder that does not exist yet.

What makes it worth learning (and not a toy that a 3x3 filter solves):
- textured, noisy backgrounds (smooth colour fields, stripes, speckle, JPEG artefacts);
- 6 classes told apart by outline only: every class comes in every colour;
- sizes from ~6 px to a third of the image, log-uniform, so small objects dominate as in COCO;
- overlap and partial occlusion (a later shape may hide up to half of an earlier one;
  the label is the box of what stays visible, as COCO's boxes are);
- clutter that is not an object (lines, arcs, dots, scribbles), and images with no object.

A second style, `crowd` (`--style crowd`), is a set of another character for benchmarks: other object
types (rings, crescents, arrows, bars, tees: thin parts and holes), 15-60 objects per image and most of
them 6-16 px across, so the small-object and crowded-assignment paths carry the score.
"""

import argparse
import fcntl
import json
import math
from pathlib import Path

import cv2
import numpy as np

from utils.general import atomic_write, write_text_atomic

NAMES = ["circle", "square", "triangle", "star", "cross", "hexagon"]
GENERATOR_VERSION = 1  # bump when the drawing changes, so old copies are regenerated
# What each style draws: class names, objects per image (low, high), the radius range in px (low, high; None =
# a sixth of the image's short side), and the fraction of images left empty.
STYLES = {
    "shapes": dict(names=NAMES, objects=(1, 12), radius=(3, None), empty_fraction=0.08),
    "crowd": dict(
        names=["ring", "crescent", "arrow", "bar", "tee"], objects=(15, 60), radius=(3, 12), empty_fraction=0.02
    ),
}
# Outlines given as corner points of a shape of radius 1, every corner within the unit circle (the drawing
# works inside the shape's box).
# fmt: off
CORNERS = {
    "cross": [(-0.33, -1), (0.33, -1), (0.33, -0.33), (1, -0.33), (1, 0.33), (0.33, 0.33), (0.33, 1), (-0.33, 1),
              (-0.33, 0.33), (-1, 0.33), (-1, -0.33), (-0.33, -0.33)],  # a plus sign
    "arrow": [(-1, -0.14), (0.25, -0.14), (0.25, -0.45), (0.95, 0), (0.25, 0.45), (0.25, 0.14), (-1, 0.14)],
    "bar": [(-0.97, -0.24), (0.97, -0.24), (0.97, 0.24), (-0.97, 0.24)],
    "tee": [(-0.7, -0.7), (0.7, -0.7), (0.7, -0.35), (0.17, -0.35), (0.17, 0.95), (-0.17, 0.95), (-0.17, -0.35),
            (-0.7, -0.35)],
}
# fmt: on


def _polygon(kind, cx, cy, r, angle):
    """Outline points of a shape of radius r centred on (cx, cy), rotated by angle."""
    if kind == "square":
        t = np.arange(4) * math.pi / 2 + math.pi / 4
        rad = np.full(4, r)
    elif kind == "triangle":
        t = np.arange(3) * 2 * math.pi / 3 - math.pi / 2
        rad = np.full(3, r)
    elif kind == "hexagon":
        t = np.arange(6) * math.pi / 3
        rad = np.full(6, r)
    elif kind == "star":
        t = np.arange(10) * math.pi / 5 - math.pi / 2
        rad = np.where(np.arange(10) % 2 == 0, r, r * 0.42)
    else:
        pts = np.array(CORNERS[kind]) * r
        t = np.arctan2(pts[:, 1], pts[:, 0])
        rad = np.hypot(pts[:, 0], pts[:, 1])
    t = t + angle
    return np.stack([cx + rad * np.cos(t), cy + rad * np.sin(t)], 1)


def _disc(mask, cx, cy, r, value):
    cv2.circle(mask, (round(cx * 16), round(cy * 16)), round(r * 16), value, -1, cv2.LINE_AA, shift=4)


def _draw_mask(mask, kind, cx, cy, r, rng):
    """Fill the shape into mask (255 inside, anti-aliased edge)."""
    if kind == "circle":
        _disc(mask, cx, cy, r, 255)
        return
    angle = rng.uniform(0, 2 * math.pi)
    if kind == "ring":  # a hole: the inside is background, the box is the outer circle's
        _disc(mask, cx, cy, r, 255)
        _disc(mask, cx, cy, r * 0.55, 0)
    elif kind == "crescent":  # a disc with a bite taken out of one side
        _disc(mask, cx, cy, r, 255)
        _disc(mask, cx + 0.45 * r * math.cos(angle), cy + 0.45 * r * math.sin(angle), r * 0.8, 0)
    else:
        pts = _polygon(kind, cx, cy, r, angle) * 16
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 255, cv2.LINE_AA, shift=4)


def _background(rng, h, w):
    """A smooth colour field plus one texture, so the detector cannot rely on a flat background."""
    small = rng.integers(0, 256, (rng.integers(2, 6), rng.integers(2, 6), 3)).astype(np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    texture = rng.integers(0, 3)
    if texture == 0:  # stripes
        period = rng.uniform(6, 40)
        angle = rng.uniform(0, math.pi)
        yy, xx = np.mgrid[0:h, 0:w]
        img += 25 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)[..., None]
    elif texture == 1:  # blotches
        blotch = cv2.GaussianBlur(rng.normal(0, 1, (h, w)).astype(np.float32), (0, 0), rng.uniform(2, 8))
        img += blotch[..., None] / (blotch.std() + 1e-6) * 20
    img += rng.normal(0, rng.uniform(3, 12), (h, w, 3))  # sensor noise
    return np.clip(img, 0, 255).astype(np.uint8)


def _colour(rng, background_mean):
    """A random colour that is not nearly invisible against the local background."""
    for _ in range(20):
        c = rng.integers(0, 256, 3)
        if np.abs(c - background_mean).sum() > 120:
            break
    return tuple(int(v) for v in c)


def _clutter(rng, img):
    """Things that are not objects: the detector must learn to ignore them."""
    h, w = img.shape[:2]
    for _ in range(rng.integers(0, 7)):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(0, 4)
        p = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        if kind == 0:
            q = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            cv2.line(img, p, q, colour, int(rng.integers(1, 3)), cv2.LINE_AA)
        elif kind == 1:
            axes = (int(rng.integers(5, w // 3)), int(rng.integers(5, h // 3)))
            start = int(rng.integers(0, 360))
            cv2.ellipse(
                img, p, axes, 0, start, start + int(rng.integers(30, 160)), colour, int(rng.integers(1, 3)), cv2.LINE_AA
            )
        elif kind == 2:
            for _ in range(rng.integers(5, 30)):
                q = (int(p[0] + rng.normal(0, 20)), int(p[1] + rng.normal(0, 20)))
                cv2.circle(img, q, int(rng.integers(1, 3)), colour, -1)
        else:
            pts = np.cumsum(rng.normal(0, 8, (int(rng.integers(4, 12)), 2)), 0) + p
            cv2.polylines(img, [pts.astype(np.int32)], False, colour, 1, cv2.LINE_AA)


def draw_image(rng, w, h, style="shapes", class_odds=None):
    """One image and its labels as rows of (class, x1, y1, x2, y2) in pixels; `class_odds`: each class's probability
    (default: all equally likely)."""
    spec = STYLES[style]
    names, (low, high), (r_min, r_max) = spec["names"], spec["objects"], spec["radius"]
    img = _background(rng, h, w)
    _clutter(rng, img)
    n = 0 if rng.random() < spec["empty_fraction"] else int(rng.integers(low, high + 1))
    masks, areas, classes = [], [], []
    r_max = r_max or min(h, w) / 6  # shapes: diameter 6 px .. a third of the image
    for _ in range(n):
        cls = int(rng.integers(0, len(names)) if class_odds is None else rng.choice(len(names), p=class_odds))
        r = math.exp(rng.uniform(math.log(r_min), math.log(r_max)))  # log-uniform: small objects dominate
        cx, cy = rng.uniform(r * 0.5, w - r * 0.5), rng.uniform(r * 0.5, h - r * 0.5)
        mask = np.zeros((h, w), np.uint8)
        _draw_mask(mask, names[cls], cx, cy, r, rng)
        x1, y1 = max(int(cx - r) - 2, 0), max(int(cy - r) - 2, 0)
        roi = (slice(y1, int(cy + r) + 3), slice(x1, int(cx + r) + 3))  # all work stays in the shape's box
        inside = mask[roi] > 127
        if inside.sum() < 12:
            continue
        # Occlusion: the new shape may hide at most half of any earlier one, or it is not placed.
        if any((m[roi] > 127)[inside].sum() > 0.5 * area for m, area in zip(masks, areas)):
            continue
        colour = np.array(_colour(rng, img[roi][inside].mean(0)), np.float32)
        alpha = (mask[roi].astype(np.float32) / 255)[..., None]
        img[roi] = (img[roi] * (1 - alpha) + colour * alpha).astype(np.uint8)
        for m in masks:
            m[roi][inside] = 0
        masks.append(mask)
        areas.append(inside.sum())
        classes.append(cls)
    labels = []
    for cls, m in zip(classes, masks):
        ys, xs = np.nonzero(m > 127)
        if len(xs) >= 6:  # a sliver left after occlusion is not a labelable object
            labels.append((cls, xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
    if rng.random() < 0.5:
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.3, 1.0))
    return img, labels


def make_shapes(root, n_train=1000, n_val=200, seed=0, size=320, style="shapes", class_odds=None):
    """Write images/{train,val}/*.jpg and labels/{train,val}/*.txt under root. Returns root.
    Does nothing when root already holds a set made with the same settings. `class_odds`: the relative frequency of
    each class in the train split (0: never drawn), for an imbalanced set
    (bench/RESULTS.md#rare-classes); the val split draws the classes whose odds are not 0 equally
    often, so that each class's AP is measured on as many objects."""
    root = Path(root)
    marker = root / "shapes.json"
    settings = {"version": GENERATOR_VERSION, "n_train": n_train, "n_val": n_val, "seed": seed, "size": size}
    if style != "shapes":  # the shapes sets made before styles existed stay valid
        settings["style"] = style
    odds = {}
    if class_odds is not None:
        settings["class_odds"] = list(class_odds)
        drawn = np.array(class_odds, dtype=np.float64) > 0
        odds = {"train": np.array(class_odds) / sum(class_odds), "val": drawn / drawn.sum()}
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return root
    root.mkdir(parents=True, exist_ok=True)
    # Several runs started at once on a fresh clone (tools/sweep.py, DDP) must not write the same files
    # together, nor verify a half-written set: one generates, the others wait and reuse it.
    with open(root / ".shapes.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and json.loads(marker.read_text()) == settings:
            return root
        marker.unlink(missing_ok=True)
        print(f"Generating the {style} dataset in {root} ({n_train} train + {n_val} val images)...")
        for split, n, split_seed in (("train", n_train, seed), ("val", n_val, seed + 1_000_003)):
            (root / "images" / split).mkdir(parents=True, exist_ok=True)
            (root / "labels" / split).mkdir(parents=True, exist_ok=True)
            # files of an earlier generation with other settings would otherwise stay in the set
            for old in [
                *(root / "images" / split).glob(f"{split}_*.jpg"),
                *(root / "labels" / split).glob(f"{split}_*.txt"),
            ]:
                old.unlink()
            for i in range(n):
                rng = np.random.default_rng([split_seed, i])  # each image depends only on (seed, index)
                w = int(size * rng.choice([1.0, 1.0, 1.25, 0.75]))  # a few aspect ratios, for rectangular batches
                img, labels = draw_image(rng, w, size, style, odds.get(split))
                stem = f"{split}_{i:05d}"
                jpeg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
                atomic_write(root / "images" / split / f"{stem}.jpg", lambda f: f.write(jpeg.tobytes()))
                rows = [
                    f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / size:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / size:.6f}"
                    for c, x1, y1, x2, y2 in labels
                ]
                # An image with no object gets no label file: the YOLO convention for a background image.
                if rows:
                    write_text_atomic(root / "labels" / split / f"{stem}.txt", "\n".join(rows) + "\n")
        marker.write_text(json.dumps(settings))
    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="datasets/shapes")
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--style", default="shapes", choices=list(STYLES))
    a = parser.parse_args()
    make_shapes(a.out, a.train, a.val, a.seed, a.size, a.style)
