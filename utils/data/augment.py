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


def augment_hsv(img, rng, hgain=0.015, sgain=0.7, vgain=0.4, dst=None):
    """Random hue, saturation and value, in place or into dst. The image is RGB (converted once at read time),
    so the RGB<->HSV conversion here is the matching one (pitfall D1)."""
    dst = img if dst is None else dst
    if not (hgain or sgain or vgain):
        np.copyto(dst, img)
        return
    r = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
    # Each channel times its gain, rounded, saturated at 255: faster than a lookup table. A hue pushed past 179
    # (at most 182 with the gains used: 1 +- hgain) is the same colour as that minus 180: HSV2RGB wraps it, as the old
    # "% 180" table did.
    cv2.transform(hsv, np.diag(r).astype(np.float32), dst=hsv)  # a float32 matrix: OpenCV's fast path
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=dst)


def random_affine_matrix(rng, in_shape, out_shape, degrees=0.0, translate=0.1, scale=0.5, shear=0.0):
    """A random rotation, scale, shear and translation from an image of in_shape (h, w) to one of out_shape,
    around the input's centre, as a 3x3 matrix on continuous pixel coordinates (a box edge at x maps to
    m @ (x, y, 1)). Returns the matrix and the scale drawn (what keep_boxes compares areas with)."""
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -in_shape[1] / 2, -in_shape[0] / 2
    rotate = np.eye(3)
    a, s = rng.uniform(-degrees, degrees), rng.uniform(1 - scale, 1 + scale)
    rotate[:2] = cv2.getRotationMatrix2D((0, 0), a, s)
    shear_m = np.eye(3)
    shear_m[0, 1] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    shear_m[1, 0] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    move = np.eye(3)
    move[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_shape[1]
    move[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_shape[0]
    return move @ shear_m @ rotate @ centre, s


def flip(img, labels, lr, ud, dst=None):
    """Mirror left-right and/or up-down, the boxes with the pixels (the image into dst if given)."""
    if not (lr or ud):
        return img, labels
    img = cv2.flip(img, -1 if lr and ud else 1 if lr else 0, dst=dst)
    labels = labels.copy()
    if lr:
        labels[:, [1, 3]] = img.shape[1] - labels[:, [3, 1]]
    if ud:
        labels[:, [2, 4]] = img.shape[0] - labels[:, [4, 2]]
    return img, labels


def warp(img, m, out_shape, dst=None):
    """cv2.warpAffine with m on continuous coordinates (as the boxes use): OpenCV maps pixel indices, whose
    centres lie half a pixel in, so the matrix is shifted by half a pixel each side; else the image drifts from its
    boxes by up to half a pixel times the scale."""
    half = np.array([[1.0, 0, 0.5], [0, 1, 0.5], [0, 0, 1]])
    index_m = np.linalg.inv(half) @ m @ half
    return cv2.warpAffine(img, index_m[:2], (out_shape[1], out_shape[0]), dst=dst, borderValue=(PAD_VALUE,) * 3)


def transform_boxes(labels, m, out_shape, s=1.0):
    """Boxes (class, x1, y1, x2, y2) through m: the four corners are transformed, the new box encloses them, it is
    clipped to out_shape (h, w), then boxes that became tiny or were mostly cut away are dropped (s: the scale m
    applies, which the areas are compared with)."""
    if not len(labels):
        return labels.reshape(0, 5)
    n = len(labels)
    corners = np.ones((n * 4, 3))
    corners[:, :2] = labels[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2)  # x1y1, x2y2, x1y2, x2y1
    corners = (corners @ m.T)[:, :2].reshape(n, 8)
    xs, ys = corners[:, [0, 2, 4, 6]], corners[:, [1, 3, 5, 7]]
    new = np.stack((xs.min(1), ys.min(1), xs.max(1), ys.max(1)), 1)
    new[:, [0, 2]] = new[:, [0, 2]].clip(0, out_shape[1])
    new[:, [1, 3]] = new[:, [1, 3]].clip(0, out_shape[0])
    keep = keep_boxes(labels[:, 1:5] * s, new)
    return np.concatenate((labels[keep, :1], new[keep]), 1).astype(labels.dtype)


def keep_boxes(before, after, min_size=2, min_area_ratio=0.1, max_aspect=100):
    """Boxes worth keeping after a transform: not tiny, not mostly cut away, not a sliver.
    before: the boxes scaled as the transform scaled them but not clipped; after: clipped."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + 1e-16), h2 / (w2 + 1e-16))
    return (w2 > min_size) & (h2 > min_size) & (w2 * h2 / (w1 * h1 + 1e-16) > min_area_ratio) & (aspect < max_aspect)


def mosaic_offsets(shapes, size, rng):
    """Mosaic: where the four images of these (h, w) shapes (long side `size`) go on a 2*size canvas, around a
    random centre: top left, top right, bottom left, bottom right. Returns each one's (x, y) top-left corner; the
    parts that fall off the canvas are cut (tile_boxes clips their boxes the same way)."""
    xc, yc = (int(rng.uniform(size * 0.5, size * 1.5)) for _ in range(2))
    (h0, w0), (h1, _), (_, w2) = shapes[0], shapes[1], shapes[2]
    return [(xc - w0, yc - h0), (xc, yc - h1), (xc - w2, yc), (xc, yc)]


def tile_boxes(labels, offsets, canvas, min_area=0.1):
    """The boxes of images placed at these (x, y) offsets on a canvas of `canvas` px square, clipped to it, one
    array per image. min_area: boxes cut to under this fraction of their area are dropped (0: only empty ones, and
    slivers over 100:1, which keep_boxes never keeps)."""
    out = []
    for lab, (x, y) in zip(labels, offsets):
        lab = lab + np.array([0, x, y, x, y], lab.dtype)
        before = lab[:, 1:5].copy()
        lab[:, 1:5] = lab[:, 1:5].clip(0, canvas)
        out.append(lab[keep_boxes(before, lab[:, 1:5], 2 if min_area else 0, min_area)] if len(lab) else lab)
    return out


def draw_tiles(out, tiles, canvas, m):
    """Resize each tile straight into its part of `out` (uint8 HWC, filled with the padding beforehand), one
    interpolation from the image as decoded. A tile is (image, (sx, sy), (x, y)): the image scaled by sx, sy (its
    load resize) and placed at x, y on a canvas of `canvas` px square (the mosaic's 2*size, or the letterbox's
    size), cut to that canvas; m (3x3: a scale > 0 and a shift, no rotation, shear or flip) maps the canvas to
    `out`. No resized image, no mosaic canvas and no warp of the whole are made: they cost more than the decoding.

    Each output pixel is drawn from the tile whose rectangle holds its centre. cv2.resize is faster than
    cv2.warpAffine but maps whole source pixels onto whole output pixels, so a tile's shift moves by up to half a
    source pixel: returned is what each tile got, for its boxes to follow: (ax, bx, ay, by), the map from canvas to
    `out` its pixels follow (x -> ax * x + bx), and its rectangle (x1, y1, x2, y2) in `out` (empty when out of
    sight)."""
    oh, ow = out.shape[:2]
    drawn = []
    (mx, _, mbx), (_, my, mby) = m[:2].tolist()
    for img, (sx, sy), (x, y) in tiles:
        ih, iw = img.shape[:2]
        # the tile's part of the canvas, then the output pixels whose centres fall in it, [lo, hi):
        # neighbouring tiles share each edge exactly
        cx0, cx1, cy0, cy1 = max(x, 0), min(x + iw * sx, canvas), max(y, 0), min(y + ih * sy, canvas)
        x0, x1 = (min(max(math.ceil(mx * v + mbx - 0.5), 0), ow) for v in (cx0, cx1))
        y0, y1 = (min(max(math.ceil(my * v + mby - 0.5), 0), oh) for v in (cy0, cy1))
        # the whole source pixels that land there, nearest to where m puts them
        u0, u1 = (min(max(round(((v - mbx) / mx - x) / sx), 0), iw) for v in (x0, x1))
        v0, v1 = (min(max(round(((v - mby) / my - y) / sy), 0), ih) for v in (y0, y1))
        if x1 <= x0 or y1 <= y0 or u1 <= u0 or v1 <= v0:  # out of sight: an empty rectangle, which no box survives
            drawn.append(((mx, mbx, my, mby), (0, 0, 0, 0)))
            continue
        cv2.resize(img[v0:v1, u0:u1], (x1 - x0, y1 - y0), dst=out[y0:y1, x0:x1], interpolation=cv2.INTER_LINEAR)
        ax, ay = (x1 - x0) / (u1 - u0) / sx, (y1 - y0) / (v1 - v0) / sy  # canvas -> out, as resized
        drawn.append(((ax, x0 - (u0 * sx + x) * ax, ay, y0 - (v0 * sy + y) * ay), (x0, y0, x1, y1)))
    return drawn


def drawn_boxes(labels, drawn):
    """The boxes of each tile (canvas coordinates, one array per tile) through the map its pixels got from
    draw_tiles, clipped to its rectangle; boxes cut down to almost nothing are dropped. All tiles at once."""
    counts = [len(lab) for lab in labels]
    if not sum(counts):
        return np.zeros((0, 5), np.float32)
    lab = np.concatenate(labels)
    maps = np.repeat(np.array([d[0] for d in drawn]), counts, 0)  # (ax, bx, ay, by) per box
    rect = np.repeat(np.array([d[1] for d in drawn], np.float64), counts, 0)
    before = lab[:, 1:5] * maps[:, [0, 2, 0, 2]] + maps[:, [1, 3, 1, 3]]
    after = before.clip(rect[:, [0, 1, 0, 1]], rect[:, [2, 3, 2, 3]])
    keep = keep_boxes(before, after)
    return np.concatenate((lab[keep, :1], after[keep]), 1).astype(np.float32)
