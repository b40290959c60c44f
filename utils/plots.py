"""Plots written with matplotlib (results.png, PR curve, confusion matrix) and box drawing for detect.py."""

import csv

import cv2
import matplotlib

matplotlib.use("Agg")  # files only; never open a window (and work on machines without a display)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_results(csv_path, out_path):
    """One panel per column of results.csv, against the epoch."""
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    columns = [c for c in rows[0] if c not in ("epoch", "seconds")]
    epochs = [int(r["epoch"]) for r in rows]
    cols = 5
    fig, axes = plt.subplots(-(-len(columns) // cols), cols, figsize=(3.2 * cols, 2.6 * -(-len(columns) // cols)), squeeze=False)
    for ax, c in zip(axes.flat, columns):
        ax.plot(epochs, [float(r[c]) for r in rows], marker=".")
        ax.set_title(c, fontsize=9)
    for ax in axes.flat[len(columns):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def plot_pr_curve(curves, names, map50_per_class, out_path):
    map50_per_class = np.asarray(map50_per_class)
    fig, ax = plt.subplots(figsize=(6, 5))
    for k, name in enumerate(names):
        if curves["n_gt"][k] > 0 and len(names) <= 20:
            ax.plot(curves["recall"][k], curves["precision"][k], lw=1, label=f"{name} {map50_per_class[k]:.3f}")
    has = curves["n_gt"] > 0
    if has.any():
        ax.plot(curves["recall"][has].mean(0), curves["precision"][has].mean(0), lw=3, color="blue", label=f"all {map50_per_class[has].mean():.3f} mAP50")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.01), title="precision-recall at IoU 0.5")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def plot_confusion_matrix(matrix, names, out_path):
    labels = list(names) + ["background"]
    normalised = matrix / np.maximum(matrix.sum(0, keepdims=True), 1)  # per true class
    size = max(5, 0.35 * len(labels))
    fig, ax = plt.subplots(figsize=(size + 1, size))
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
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def colour(k):
    """A stable, distinct BGR colour per class."""
    hue = (k * 0.618034) % 1.0
    rgb = matplotlib.colors.hsv_to_rgb((hue, 0.85, 0.95))
    return tuple(int(255 * v) for v in rgb[::-1])


def draw_detections(img_bgr, detections, names):
    """Boxes and 'name score' labels on a BGR image (in place), for detect.py."""
    thickness = max(1, round(sum(img_bgr.shape[:2]) / 600))
    for x1, y1, x2, y2, score, cls in detections:
        c = colour(int(cls))
        p1, p2 = (int(x1), int(y1)), (int(x2), int(y2))
        cv2.rectangle(img_bgr, p1, p2, c, thickness, cv2.LINE_AA)
        label = f"{names[int(cls)] if int(cls) < len(names) else int(cls)} {score:.2f}"
        scale = thickness / 3
        (tw, th), _ = cv2.getTextSize(label, 0, scale, max(thickness - 1, 1))
        top = p1[1] - th - 3 if p1[1] - th - 3 >= 0 else p1[1] + th + 3
        cv2.rectangle(img_bgr, (p1[0], top), (p1[0] + tw, p1[1]), c, -1, cv2.LINE_AA)
        cv2.putText(img_bgr, label, (p1[0], p1[1] - 2 if top < p1[1] else top - 2), 0, scale, (255, 255, 255), max(thickness - 1, 1), cv2.LINE_AA)
    return img_bgr
