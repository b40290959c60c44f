"""Plots written with matplotlib (results.png, PR/F1/P/R curves, confusion matrix, labels.jpg) and
box drawing with cv2 (detect.py, training batch mosaics).

Every chart draws on a `matplotlib.figure.Figure` created directly, never through pyplot: pyplot
keeps global state and is not thread-safe, and `in_background` runs these functions in a thread."""

import csv
import logging
import math
import threading
from pathlib import Path

import cv2
import matplotlib

matplotlib.use("Agg")  # files only; never open a window (and work on machines without a display)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from utils.disk import not_written_sentence  # noqa: E402
from utils.evaluate import model_outputs  # noqa: E402
from utils.general import atomic_write  # noqa: E402
from utils.inference import postprocess  # noqa: E402


def save_figure(fig, path):
    save_image_file(path, lambda f: fig.savefig(f, format=Path(path).suffix[1:], dpi=100))


def save_image_file(path, write):
    """A plot written all at once (atomic_write): a run killed while it is drawn leaves the previous file or none,
    never half an image. A full disk or a folder that cannot be written is one warning naming the path, not a
    stop: a plot is not worth a run (when the disk stays full, the next checkpoint stops it with its sentence)."""
    try:
        atomic_write(path, write)
    except OSError as e:
        logging.getLogger("yolo").warning(not_written_sentence(path, e, "the previous one, if any, is intact"))


def plot_results(csv_path, out_path):
    """One panel per column of results.csv, against the epoch."""
    with open(csv_path) as f:  # a row the loop is appending while this draws in the background: left out
        rows = [row for row in csv.DictReader(f) if all(row.values())]
    if not rows:
        return
    columns = [c for c in rows[0] if c not in ("epoch", "seconds")]
    epochs = [int(r["epoch"]) for r in rows]
    cols = 5
    fig = Figure(figsize=(3.2 * cols, 2.6 * -(-len(columns) // cols)))
    axes = fig.subplots(-(-len(columns) // cols), cols, squeeze=False)
    for ax, c in zip(axes.flat, columns):
        ax.plot(epochs, [float(r[c]) for r in rows], marker=".")
        ax.set_title(c, fontsize=9)
    for ax in axes.flat[len(columns) :]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, out_path)


def plot_pr_curve(curves, names, map50_per_class, out_path):
    map50_per_class = np.asarray(map50_per_class)
    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    for k, name in enumerate(names):
        if curves["n_gt"][k] > 0 and len(names) <= 20:
            ax.plot(curves["recall"][k], curves["precision"][k], lw=1, label=f"{name} {map50_per_class[k]:.3f}")
    has = curves["n_gt"] > 0
    if has.any():
        ax.plot(
            curves["recall"][has].mean(0),
            curves["precision"][has].mean(0),
            lw=3,
            color="blue",
            label=f"all {map50_per_class[has].mean():.3f} mAP50",
        )
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.01), title="precision-recall at IoU 0.5")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    save_figure(fig, out_path)


def plot_confusion_matrix(matrix, names, out_path):
    labels = list(names) + ["background"]
    normalised = matrix / np.maximum(matrix.sum(0, keepdims=True), 1)  # per true class
    size = max(5, 0.35 * len(labels))
    fig = Figure(figsize=(size + 1, size))
    ax = fig.subplots()
    im = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    if len(labels) <= 30:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        for (i, j), v in np.ndenumerate(normalised):
            if v > 0.005:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v > 0.5 else "black")
    ax.set(xlabel="true", ylabel="predicted", title="confusion matrix (columns sum to 1)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, out_path)


def colour(k):
    """A stable, distinct BGR colour per class."""
    hue = (k * 0.618034) % 1.0
    rgb = matplotlib.colors.hsv_to_rgb((hue, 0.85, 0.95))
    return tuple(int(255 * v) for v in rgb[::-1])


def draw_detections(img_bgr, detections, names):
    """Boxes and 'name score' labels on a BGR image (in place), for detect.py."""
    for x1, y1, x2, y2, score, cls in detections:
        label = f"{names[int(cls)] if int(cls) < len(names) else int(cls)} {score:.2f}"
        draw_labelled_box(img_bgr, (x1, y1, x2, y2), colour(int(cls)), label)
    return img_bgr


def draw_labelled_box(img_bgr, box, c, label):
    """One box in colour `c` with `label` in white on a filled tab above it (below, at the image's top edge)."""
    thickness = max(1, round(sum(img_bgr.shape[:2]) / 600))
    scale = thickness / 3
    p1, p2 = (int(box[0]), int(box[1])), (int(box[2]), int(box[3]))
    cv2.rectangle(img_bgr, p1, p2, c, thickness, cv2.LINE_AA)
    (tw, th), _ = cv2.getTextSize(label, 0, scale, max(thickness - 1, 1))
    top = p1[1] - th - 3 if p1[1] - th - 3 >= 0 else p1[1] + th + 3
    cv2.rectangle(img_bgr, (p1[0], top), (p1[0] + tw, p1[1]), c, -1, cv2.LINE_AA)
    text_y = p1[1] - 2 if top < p1[1] else top - 2
    cv2.putText(img_bgr, label, (p1[0], text_y), 0, scale, (255, 255, 255), max(thickness - 1, 1), cv2.LINE_AA)


def rgb01(k):
    """The class colour of `colour(k)` as matplotlib's RGB in 0..1, so charts match the images."""
    return tuple(v / 255 for v in colour(k)[::-1])


def class_name(names, k):
    return str(names[k]) if 0 <= k < len(names) else str(k)


def to_numpy(x, columns):
    """A tensor, array or list of rows as a float (n, columns) array (empty input gives (0, columns))."""
    x = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)
    return x.astype(np.float64).reshape(-1, columns)


def draw_label(img, text, x, y, c, scale=0.4, thickness=1):
    """`text` on a filled box of colour c above (x, y), or just inside the box when there is no room
    above; black or white text, whichever reads better on c; kept inside the image."""
    (tw, th), baseline = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    bh = th + baseline + 2
    top = y - bh if y - bh >= 0 else y
    x = max(0, min(x, img.shape[1] - tw - 2))
    cv2.rectangle(img, (x, top), (x + tw + 2, top + bh), c, -1)
    ink = (0, 0, 0) if 0.114 * c[0] + 0.587 * c[1] + 0.299 * c[2] > 150 else (255, 255, 255)
    cv2.putText(img, text, (x + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, scale, ink, thickness, cv2.LINE_AA)


def plot_batch(images, targets, names, path, predictions=None, max_images=16, conf=0.25):
    """The first images of a batch exactly as the model sees them (after mosaic, affine, HSV and flips)
    with their boxes and class names: the one look that catches wrong labels, boxes shifted by an
    augmentation, or a wrong class list before a run wastes hours on them. With `predictions` (one
    (n, 6) x1 y1 x2 y2 score class per image, scores below `conf` left out) it shows what the model
    found instead. images: uint8 (B, 3, H, W) RGB; targets: (N, 6) image index, class, x1 y1 x2 y2 in
    pixels (what `collate` yields). Writes a JPEG grid at most about 1920 px wide; returns the path
    (None for an empty batch, which writes nothing)."""
    images = images.detach().cpu().numpy() if hasattr(images, "detach") else np.asarray(images)
    n = min(len(images), max_images)
    if n == 0:
        return None
    images = images[:n]
    if images.dtype != np.uint8:  # a float batch, 0..1 or 0..255
        images = (images * (255.0 if images.max() <= 1 else 1.0)).clip(0, 255).astype(np.uint8)
    images = np.ascontiguousarray(images[:, ::-1].transpose(0, 2, 3, 1))  # RGB CHW -> BGR HWC, once, for cv2
    targets = to_numpy(targets, 6)
    h, w = images.shape[1:3]
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    # at most ~1920 px each way; small training sizes (64..256) are enlarged to ~320 to stay legible
    gap = 2  # white lines between tiles
    scale = min(
        (1920 - gap * (cols - 1)) / (cols * w), (1920 - gap * (rows - 1)) / (rows * h), max(1.0, 320 / max(h, w))
    )
    tw, th = max(int(w * scale), 1), max(int(h * scale), 1)
    grid = np.full((rows * th + (rows - 1) * gap, cols * tw + (cols - 1) * gap, 3), 255, np.uint8)
    thickness = max(1, round(min(tw, th) / 200))  # 2 px on 320 px tiles: visible on busy images
    for i in range(n):
        tile = cv2.resize(images[i], (tw, th), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
        if predictions is None:
            t = targets[targets[:, 0] == i]
            boxes, classes, scores = t[:, 2:6], t[:, 1], None
        else:
            p = to_numpy(predictions[i], 6) if i < len(predictions) else np.zeros((0, 6))
            p = p[p[:, 4] >= conf]
            boxes, classes, scores = p[:, :4], p[:, 5], p[:, 4]
        boxes = (boxes * [tw / w, th / h, tw / w, th / h]).round().clip(0, [tw - 1, th - 1, tw - 1, th - 1]).astype(int)
        for (x1, y1, x2, y2), k in zip(boxes, classes.astype(int)):
            cv2.rectangle(tile, (x1, y1), (x2, y2), colour(k), thickness)
        for j, ((x1, y1, _, _), k) in enumerate(zip(boxes, classes.astype(int))):  # labels over every box line
            draw_label(tile, class_name(names, k) + ("" if scores is None else f" {scores[j]:.2f}"), x1, y1, colour(k))
        draw_label(tile, str(i), 0, 0, (40, 40, 40), scale=0.3)  # the index in the batch, top-left corner
        r, c = divmod(i, cols)
        grid[r * (th + gap) : r * (th + gap) + th, c * (tw + gap) : c * (tw + gap) + tw] = tile
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    encoded = cv2.imencode(Path(path).suffix or ".jpg", grid, [cv2.IMWRITE_JPEG_QUALITY, 90])[1]
    save_image_file(path, lambda f: f.write(encoded.tobytes()))
    return path


def plot_labels(records, names, path):
    """What the training labels hold, written once before training: a missing or rare class, boxes
    that all sit in one place, or boxes too small for the input size show up here before hours of
    training do. Four panels: instances per class, box centres, box widths and heights, and a few
    hundred boxes drawn at their real aspect around one centre. records: load_verified's list, whose
    rows are [cls, x1, y1, x2, y2] corners normalised to 0..1 (not YOLO's cx cy w h)."""
    labels, sizes = label_rows(records)
    classes = labels[:, 0].astype(int)
    x1, y1, x2, y2 = labels[:, 1:].T
    cx, cy, bw, bh = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
    nc = max(len(names), int(classes.max()) + 1 if len(classes) else 0)
    counts = np.bincount(classes, minlength=nc)

    fig = Figure(figsize=(10, 10))
    axes = fig.subplots(2, 2)
    empty = sum(1 for r in records if not len(r.get("labels", [])))
    fig.suptitle(f"{len(labels)} boxes in {len(records)} images ({empty} without any box)", fontsize=11)
    ax = axes[0, 0]
    ax.bar(range(nc), counts, color=[rgb01(k) for k in range(nc)], width=0.8 if nc <= 30 else 1.0)
    if 0 < nc <= 30:
        ax.set_xticks(range(nc), [class_name(names, k) for k in range(nc)], rotation=90, fontsize=8)
    ax.set(xlabel="class" if nc <= 30 else "class index", ylabel="instances", title="instances per class")
    for ax, (a, b), title, labels_xy in (
        (axes[0, 1], (cx, cy), "box centres", ("x (fraction of width)", "y (fraction of height)")),
        (
            axes[1, 0],
            (bw, bh),
            "box widths and heights",
            ("width (fraction of image width)", "height (fraction of image height)"),
        ),
    ):
        if len(a):  # about sqrt(n) bins a side; empty bins blank, a bin of 1 box already visible
            bins = int(np.clip(round(math.sqrt(len(a))), 10, 50))
            ax.hist2d(a, b, bins=bins, range=[[0, 1], [0, 1]], cmap="Blues", cmin=1, vmin=0)
        else:
            ax.text(0.5, 0.5, "no boxes", ha="center", va="center", transform=ax.transAxes)
        ax.set(
            xlim=(0, 1),
            ylim=(1, 0) if title == "box centres" else (0, 1),
            xlabel=labels_xy[0],
            ylabel=labels_xy[1],
            title=title,
        )
        ax.set_aspect("equal")
    draw_box_shapes(axes[1, 1], bw, bh, sizes, classes)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return path


def label_rows(records):
    """All label rows [cls, x1, y1, x2, y2] (normalised) of the records, and each row's image (width, height)."""
    labels, sizes = [np.zeros((0, 5))], [np.zeros((0, 2))]
    for r in records:
        rows = to_numpy(r.get("labels", []), 5)
        h, w = r.get("shape", (1, 1))
        labels.append(rows)
        sizes.append(np.tile([w, h], (len(rows), 1)))
    return np.concatenate(labels), np.concatenate(sizes).astype(np.float64)


def draw_box_shapes(ax, bw, bh, sizes, classes, n=500):
    """Up to n boxes drawn around one centre, in pixels relative to their image's long side, so that each keeps
    its true shape."""
    pick = np.random.default_rng(0).permutation(len(bw))[:n]
    long_side = sizes.max(1, initial=1)
    for i in pick:
        bw_i, bh_i = bw[i] * sizes[i, 0] / long_side[i], bh[i] * sizes[i, 1] / long_side[i]
        corner = (0.5 - bw_i / 2, 0.5 - bh_i / 2)
        ax.add_patch(Rectangle(corner, bw_i, bh_i, fill=False, lw=0.6, alpha=0.5, edgecolor=rgb01(classes[i])))
    if not len(pick):
        ax.text(0.5, 0.5, "no boxes", ha="center", va="center")
    ax.set(xlim=(0, 1), ylim=(1, 0), title=f"{len(pick)} boxes at their real aspect")
    ax.set_aspect("equal")


def plot_confidence_curves(curves, names, out_dir):
    """F1_curve.png, P_curve.png and R_curve.png against the confidence threshold, from the curves of
    `evaluate.precision_recall`: where to set --conf when deploying (the best mean F1 is the usual
    choice) and which classes lose recall first as it rises. Returns the confidence of the best mean
    F1 over the classes with ground truth (the same point precision_recall reports P and R at)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    x = np.asarray(curves["confidence"], dtype=np.float64)
    has = np.asarray(curves["n_gt"]) > 0
    f1 = np.asarray(curves["f1"], dtype=np.float64)
    best = int(f1[has].mean(0).argmax()) if has.any() else 0
    best_conf = float(x[best])
    for key, short, file in (
        ("f1", "F1", "F1_curve.png"),
        ("precision", "P", "P_curve.png"),
        ("recall", "R", "R_curve.png"),
    ):
        y = np.asarray(curves[key], dtype=np.float64)
        fig = Figure(figsize=(8.5, 5))
        ax = fig.subplots()
        if len(names) <= 20:
            for k in np.flatnonzero(has):
                ax.plot(x, y[k], lw=1, color=rgb01(int(k)), label=class_name(names, int(k)))
        if has.any():
            mean = y[has].mean(0)
            ax.plot(
                x,
                mean,
                lw=3,
                color="blue",
                label=f"all classes {short} {mean[best]:.2f} at confidence {best_conf:.3f}"
                + ("" if key == "f1" else " (best F1)"),
            )
            ax.axvline(best_conf, color="grey", ls="--", lw=1)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))  # outside: never hides a curve
        else:
            ax.text(0.5, 0.5, "no class has ground truth", ha="center", va="center")
        ax.set(xlabel="confidence", ylabel=short, xlim=(0, 1), ylim=(0, 1.01), title=f"{short} against confidence")
        fig.tight_layout()
        save_figure(fig, out_dir / file)
    return best_conf


def in_background(function, *args, **kwargs):
    """Run function(*args, **kwargs) in a thread and return the thread, so the training loop never
    waits for a plot. Pass data the caller will not modify in place afterwards. Not a daemon thread:
    the interpreter waits for it at exit, so a run stopped early (--benchmark, SIGTERM) still writes it."""
    thread = threading.Thread(
        target=function, args=args, kwargs=kwargs, name=f"plot {getattr(function, '__name__', '')}"
    )
    thread.start()
    return thread


class LatestOnly:
    """Calls function(*args) in one background thread at a time, always with the newest arguments: a call made while
    it runs replaces any call still waiting. results.png is redrawn after every epoch, and a drawing takes about a
    second: on a GPU that trains a small set's epoch in one, the loop would wait as long for it as it trains. With
    this it never waits, and the file still ends with the last epoch. An error is one warning, and the next call
    draws again."""

    def __init__(self, function):
        self.function, self.waiting, self.thread = function, None, None
        self.lock = threading.Lock()

    def __call__(self, *args):
        with self.lock:
            self.waiting = args
            if self.thread is None:
                self.thread = in_background(self._run)

    def _run(self):
        while True:
            with self.lock:
                args, self.waiting = self.waiting, None
                if args is None:
                    self.thread = None
                    return
            try:
                self.function(*args)
            except Exception as e:  # a chart is not worth a run, nor the charts after it
                logging.getLogger("yolo").warning(f"{getattr(self.function, '__name__', 'a plot')}: {e}")


@torch.no_grad()
def plot_val_batch(model, loader, names, out_dir, device, conf=0.25):
    """val_batch0_labels.jpg and val_batch0_pred.jpg: the same validation images with the ground truth
    and with the model's detections above `conf`, side by side in a viewer. Boxes that sit beside
    their objects, or names that differ between the two, show a label or class mix-up at a glance."""
    images, targets, _ = next(iter(loader))
    output = model_outputs(model, images, device, False, np.zeros(3))[0]  # an nn.Module or any exported format
    predictions = [p.float().cpu() for p in postprocess(output.float(), model, conf, 0.7)]
    plot_batch(images, targets, names, Path(out_dir) / "val_batch0_labels.jpg")
    plot_batch(images, targets, names, Path(out_dir) / "val_batch0_pred.jpg", predictions=predictions, conf=conf)


def plot_evaluation(result, model, loader, names, out_dir, device):
    """The pictures of an evaluation (utils/evaluate.evaluate's result), as train.py and val.py both write them:
    pr_curve.png, confusion_matrix.png, F1/P/R_curve.png and val_batch0_labels/pred.jpg. Returns the
    confidence of the best mean F1 (a good detect.py --conf)."""
    out_dir = Path(out_dir)
    plot_pr_curve(result["curves"], names, [r["mAP50"] for r in result["per_class"]], out_dir / "pr_curve.png")
    plot_confusion_matrix(result["confusion"], names, out_dir / "confusion_matrix.png")
    best_f1_confidence = plot_confidence_curves(result["curves"], names, out_dir)
    plot_val_batch(model, loader, names, out_dir, device)
    return best_f1_confidence
