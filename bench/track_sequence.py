"""A generated video for measuring trackers: shapes that move with constant and changing velocity, cross and hide
each other (and behind two pillars), enter and leave, with their ground-truth tracks, and the detections a
detector would give of them (jitter, misses, false positives, low scores when half hidden).

    python bench/track_sequence.py --out runs/track_sequence --seed 0 --video   # gt.txt, dets.txt, video.mp4

gt.txt and dets.txt are MOT-challenge text: `frame, id, x, y, w, h, score, class` (frame from 1; id -1 for a
detection). The video is only for looking at (and for detect.py --track with a model trained on shapes); the
benchmark feeds dets.txt to the trackers, so that all of them get the same detections.
"""

import argparse
from pathlib import Path

import cv2
import numpy as np

WIDTH, HEIGHT, FPS = 960, 540, 30
PILLARS = [(300, 0, 330, HEIGHT), (640, 0, 680, HEIGHT)]  # x1 y1 x2 y2, in front of every shape
MIN_VISIBLE = 0.25  # an object less visible than this is not in the ground truth of that frame
GRID = 8  # visibility is sampled on GRID x GRID points of each box


def motion(rng, frames, start, position, velocity):
    """(frames, 2) centres from `start` on: constant velocity, a steady turn, or a speed that swells and ebbs."""
    kind = rng.integers(3)
    steps = np.arange(frames - start)
    if kind == 0:
        path = position + steps[:, None] * velocity
    else:
        turn = rng.uniform(-0.02, 0.02) if kind == 1 else 0.0
        gain = 1 + (0.6 * np.sin(steps * rng.uniform(0.02, 0.06)) if kind == 2 else 0)
        angle = np.arctan2(velocity[1], velocity[0]) + turn * steps
        speed = np.hypot(*velocity) * gain
        step = np.stack([np.cos(angle), np.sin(angle)], axis=1) * np.atleast_1d(speed)[:, None]
        path = position + np.cumsum(np.r_[np.zeros((1, 2)), step[:-1]], axis=0)
    return np.r_[np.full((start, 2), np.nan), path]


def entering(rng, speed):
    """A start just outside a random edge and a velocity into the frame."""
    edge = rng.integers(4)
    along = rng.uniform(0.15, 0.85)
    position = [(-40, along * HEIGHT), (WIDTH + 40, along * HEIGHT), (along * WIDTH, -40), (along * WIDTH, HEIGHT + 40)]
    inward = [(1, 0), (-1, 0), (0, 1), (0, -1)][edge]
    angle = np.arctan2(inward[1], inward[0]) + rng.uniform(-0.6, 0.6)
    return np.array(position[edge], float), speed * np.array([np.cos(angle), np.sin(angle)])


def make_objects(rng, frames, count):
    """Centres (count, frames, 2) (NaN before an object appears), sizes (count, 2), depths (count,), classes.
    A third of the objects come in pairs set to meet at one point at one time: crossings for sure."""
    centres, sizes = np.full((count, frames, 2), np.nan), rng.uniform(24, 80, (count, 2))
    for k in range(count):
        start = int(rng.integers(0, frames * 3 // 4)) if k >= 6 else 0
        speed = rng.uniform(1.5, 7)
        if k >= 6 and k % 3 == 0:  # meets object k - 1 where that one is 40..100 frames later
            later = start + int(rng.integers(40, 100))
            meeting = centres[k - 1, min(later, frames - 1)]
            if not np.isnan(meeting).any():
                position, _ = entering(rng, speed)
                velocity = (meeting - position) / (min(later, frames - 1) - start)
                centres[k] = np.r_[
                    np.full((start, 2), np.nan), position + np.arange(frames - start)[:, None] * velocity
                ]
                continue
        if start == 0:  # in the frame from the first one
            position = rng.uniform([60, 60], [WIDTH - 60, HEIGHT - 60])
            angle = rng.uniform(0, 2 * np.pi)
            velocity = speed * np.array([np.cos(angle), np.sin(angle)])
        else:
            position, velocity = entering(rng, speed)
        centres[k] = motion(rng, frames, start, position, velocity)
    return centres, sizes, rng.permutation(count), rng.integers(0, 3, count)


def visibility(box, covers):
    """The fraction of `box` inside the frame and under none of `covers` (boxes in front of it)."""
    xs = np.linspace(box[0], box[2], GRID + 2)[1:-1]
    ys = np.linspace(box[1], box[3], GRID + 2)[1:-1]
    x, y = np.meshgrid(xs, ys)
    seen = (x >= 0) & (x < WIDTH) & (y >= 0) & (y < HEIGHT)
    for c in covers:
        seen &= ~((x >= c[0]) & (x <= c[2]) & (y >= c[1]) & (y <= c[3]))
    return seen.mean()


def frame_boxes(centres, sizes, depths, t):
    """(id, box, visibility) of each object present at frame t."""
    present = [k for k in range(len(centres)) if not np.isnan(centres[k, t]).any()]
    boxes = {k: np.r_[centres[k, t] - sizes[k] / 2, centres[k, t] + sizes[k] / 2] for k in present}
    result = []
    for k in present:
        covers = [boxes[j] for j in present if depths[j] > depths[k]] + PILLARS
        result.append((k, boxes[k], visibility(boxes[k], covers)))
    return result


def detections(rng, objects):
    """What a detector gives for one frame: rows x1 y1 x2 y2 score class."""
    rows = []
    for k, box, seen, cls in objects:
        if seen < 0.3 or rng.random() > (0.97 if seen > 0.75 else 0.3 + 0.6 * seen):
            continue
        size = box[2:] - box[:2]
        centre = (box[:2] + box[2:]) / 2 + rng.normal(0, 0.04, 2) * size
        size = size * (1 + rng.normal(0, 0.05, 2))
        score = rng.uniform(0.45, 0.95) if seen > 0.75 else rng.uniform(0.12, 0.5)
        rows.append([*(centre - size / 2), *(centre + size / 2), score, cls])
    for _ in range(rng.poisson(0.4)):  # clutter
        xy, wh = rng.uniform([0, 0], [WIDTH - 80, HEIGHT - 80]), rng.uniform(20, 80, 2)
        rows.append([*xy, *(xy + wh), rng.uniform(0.1, 0.45), rng.integers(0, 3)])
    return np.array(rows, dtype=np.float64).reshape(-1, 6)


def make_sequence(seed=0, frames=450, count=30):
    """Ground truth and detections of one generated sequence: gt (rows frame id x y w h 1 class, boxes clipped
    to the frame), dets {frame: (n, 6) x1 y1 x2 y2 score class}, and what draw_frame needs. Frames from 0."""
    rng = np.random.default_rng(seed)
    centres, sizes, depths, classes = make_objects(rng, frames, count)
    gt, dets = [], {}
    for t in range(frames):
        objects = [(k, box, seen, classes[k]) for k, box, seen in frame_boxes(centres, sizes, depths, t)]
        for k, box, seen, cls in objects:
            if seen >= MIN_VISIBLE:
                x1, y1 = max(box[0], 0), max(box[1], 0)
                x2, y2 = min(box[2], WIDTH), min(box[3], HEIGHT)
                gt.append([t, k + 1, x1, y1, x2 - x1, y2 - y1, 1, cls])
        dets[t] = detections(rng, objects)
    return np.array(gt), dets, (centres, sizes, depths, classes)


def draw_frame(scene, t):
    """A BGR frame of the sequence: a textured background, the shapes back to front, then the pillars."""
    centres, sizes, depths, classes = scene
    rng = np.random.default_rng(t % 7)
    img = cv2.GaussianBlur(rng.integers(90, 140, (HEIGHT, WIDTH, 3), dtype=np.uint8), (0, 0), 3)
    for k in np.argsort(depths):
        if np.isnan(centres[k, t]).any():
            continue
        (cx, cy), (w, h) = centres[k, t], sizes[k]
        colour = tuple(int(c) for c in np.random.default_rng(k).integers(30, 255, 3))
        if classes[k] == 0:
            cv2.ellipse(img, (int(cx), int(cy)), (int(w / 2), int(h / 2)), 0, 0, 360, colour, -1)
        elif classes[k] == 1:
            cv2.rectangle(img, (int(cx - w / 2), int(cy - h / 2)), (int(cx + w / 2), int(cy + h / 2)), colour, -1)
        else:
            points = np.array([[cx, cy - h / 2], [cx - w / 2, cy + h / 2], [cx + w / 2, cy + h / 2]], np.int32)
            cv2.fillPoly(img, [points], colour)
    for x1, y1, x2, y2 in PILLARS:
        cv2.rectangle(img, (x1, y1), (x2, y2), (70, 70, 70), -1)
    return img


def write_mot(path, rows):
    """MOT-challenge text from rows frame(0-based) id x y w h score class: frames written from 1."""
    lines = [
        f"{int(f) + 1},{int(i)},{x:.2f},{y:.2f},{w:.2f},{h:.2f},{s:.4f},{int(c)}" for f, i, x, y, w, h, s, c in rows
    ]
    Path(path).write_text("".join(line + "\n" for line in lines))


def detection_rows(dets):
    """{frame: (n, 6) x1 y1 x2 y2 score class} -> MOT rows (frame, -1, x, y, w, h, score, class)."""
    return [[t, -1, x1, y1, x2 - x1, y2 - y1, s, c] for t, d in dets.items() for x1, y1, x2, y2, s, c in d]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/track_sequence", help="folder for gt.txt, dets.txt, video.mp4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=450)
    parser.add_argument("--video", action="store_true", help="also write video.mp4")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gt, dets, scene = make_sequence(args.seed, args.frames)
    write_mot(out / "gt.txt", gt)
    write_mot(out / "dets.txt", detection_rows(dets))
    if args.video:
        writer = cv2.VideoWriter(str(out / "video.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
        for t in range(args.frames):
            writer.write(draw_frame(scene, t))
        writer.release()
    print(f"{len(np.unique(gt[:, 1]))} objects, {len(gt)} boxes in {args.frames} frames -> {out}")


if __name__ == "__main__":
    main()
