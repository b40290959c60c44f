"""Image augmentations for detection. All of them work on uint8 RGB images (pitfall D4:
an augmentation written for 0..255 breaks on a 0..1 tensor), and each one moves the boxes with
the pixels. Boxes are numpy arrays of rows (class, x1, y1, x2, y2) in pixels.

Randomness comes only from the `rng` argument (a numpy Generator seeded per sample by the
dataset), never from global state: the same sample is the same whatever the worker count.
"""

import math

import cv2
import numpy as np

from utils.boxes import resized_side

PAD_VALUE = 114  # grey padding, as the YOLO family uses: the model learns it means "nothing here"


def letterbox(img, new_shape, scaleup=True, centre=True):
    """Resize keeping the aspect ratio, then pad to new_shape (h, w).
    Returns the image, the scale ratio and the (left, top) padding, which undo the mapping."""
    h, w = img.shape[:2]
    ratio = min(new_shape[0] / h, new_shape[1] / w)
    if not scaleup:  # validation: never upsample, it only invents pixels
        ratio = min(ratio, 1.0)
    nh, nw = resized_side(h, ratio), resized_side(w, ratio)
    if (nh, nw) != (h, w):
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    dh, dw = new_shape[0] - nh, new_shape[1] - nw
    top, left = (dh // 2, dw // 2) if centre else (0, 0)
    img = cv2.copyMakeBorder(img, top, dh - top, left, dw - left, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3)
    return img, ratio, (left, top)


def augment_hsv(img, rng, hgain=0.015, sgain=0.7, vgain=0.4):
    """Random hue, saturation and value, in place. The image is RGB (converted once at read time),
    so the RGB<->HSV conversion here is the matching one (pitfall D1)."""
    if not (hgain or sgain or vgain):
        return
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x * r[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * r[2], 0, 255).astype(np.uint8)
    merged = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    cv2.cvtColor(merged, cv2.COLOR_HSV2RGB, dst=img)


def random_affine(img, labels, rng, degrees=0.0, translate=0.1, scale=0.5, shear=0.0, border=(0, 0)):
    """Rotate, scale, shear and translate. border < 0 crops (used after mosaic: 2s x 2s -> s x s).
    Boxes: the four corners are transformed, the new box encloses them, then boxes that became
    tiny or were mostly cut away are dropped."""
    height = img.shape[0] + border[0] * 2
    width = img.shape[1] + border[1] * 2

    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -img.shape[1] / 2, -img.shape[0] / 2
    rotate = np.eye(3)
    a, s = rng.uniform(-degrees, degrees), rng.uniform(1 - scale, 1 + scale)
    rotate[:2] = cv2.getRotationMatrix2D((0, 0), a, s)
    shear_m = np.eye(3)
    shear_m[0, 1] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    shear_m[1, 0] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    move = np.eye(3)
    move[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * width
    move[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * height
    m = move @ shear_m @ rotate @ centre
    if border[0] != 0 or border[1] != 0 or (m != np.eye(3)).any():
        img = cv2.warpAffine(img, m[:2], dsize=(width, height), borderValue=(PAD_VALUE,) * 3)

    if len(labels):
        n = len(labels)
        corners = np.ones((n * 4, 3))
        corners[:, :2] = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2)  # x1y1, x2y2, x1y2, x2y1
        corners = (corners @ m.T)[:, :2].reshape(n, 8)
        xs, ys = corners[:, [0, 2, 4, 6]], corners[:, [1, 3, 5, 7]]
        new = np.stack((xs.min(1), ys.min(1), xs.max(1), ys.max(1)), 1)
        new[:, [0, 2]] = new[:, [0, 2]].clip(0, width)
        new[:, [1, 3]] = new[:, [1, 3]].clip(0, height)
        keep = keep_boxes(labels[:, 1:5] * s, new)
        labels = np.concatenate((labels[keep, :1], new[keep]), 1)
    return img, labels


def keep_boxes(before, after, min_size=2, min_area_ratio=0.1, max_aspect=100):
    """Boxes worth keeping after a transform: not tiny, not mostly cut away, not a sliver.
    before: the boxes scaled as the transform scaled them but not clipped; after: clipped."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
    return (w2 > min_size) & (h2 > min_size) & (w2 * h2 / (w1 * h1 + 1e-16) > min_area_ratio) & (aspect < max_aspect)


def flip_lr(img, labels):
    img = np.ascontiguousarray(img[:, ::-1])
    if len(labels):
        labels = labels.copy()
        labels[:, [1, 3]] = img.shape[1] - labels[:, [3, 1]]
    return img, labels


def flip_ud(img, labels):
    img = np.ascontiguousarray(img[::-1])
    if len(labels):
        labels = labels.copy()
        labels[:, [2, 4]] = img.shape[0] - labels[:, [4, 2]]
    return img, labels


def mosaic4(images, labels, size, rng, min_area=0.1):
    """Place four images around a random centre on a 2*size canvas. The caller crops it back to
    size x size with random_affine(border=-size/2). images: resized so the long side is `size`.
    min_area: boxes cut to under this fraction of their area are dropped (0: only empty ones, and slivers
    over 100:1, which keep_boxes never keeps)."""
    canvas = np.full((size * 2, size * 2, 3), PAD_VALUE, dtype=np.uint8)
    xc, yc = (int(rng.uniform(size * 0.5, size * 1.5)) for _ in range(2))
    out = []
    for k, (img, lab) in enumerate(zip(images, labels)):
        h, w = img.shape[:2]
        if k == 0:  # top left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
        elif k == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, size * 2), yc
            x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
        elif k == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(size * 2, yc + h)
            x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, size * 2), min(size * 2, yc + h)
            x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
        canvas[y1a:y2a, x1a:x2a] = img[y1b:y2b, x1b:x2b]
        if len(lab):
            lab = lab.copy()
            lab[:, [1, 3]] += x1a - x1b
            lab[:, [2, 4]] += y1a - y1b
            out.append(lab)
    merged = np.concatenate(out, 0) if out else np.zeros((0, 5), np.float32)
    before = merged[:, 1:5].copy()
    merged[:, [1, 3]] = merged[:, [1, 3]].clip(0, 2 * size)
    merged[:, [2, 4]] = merged[:, [2, 4]].clip(0, 2 * size)
    keep = keep_boxes(before, merged[:, 1:5], 2 if min_area else 0, min_area) if len(merged) else np.zeros(0, bool)
    return canvas, merged[keep]
