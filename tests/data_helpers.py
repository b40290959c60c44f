"""Tiny image and label files for the data-pipeline tests (test_data_*.py), a check that boxes enclose their drawn
pixels, their shared fixtures (user_cache_dir, log_lines), and a PNG declaring more pixels than it holds (a bomb)."""

import hashlib
import logging
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from utils.data import labels as L
from utils.hyperparameters import DEFAULTS

# The augmentation table train.py uses by default (the one table, not a copy), and one with every augmentation off.
NO_AUG = dict(DEFAULTS, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, translate=0.0, scale=0.0, fliplr=0.0, mosaic=0.0)

# Pure colours (RGB) of the test rectangles: colour k is class k.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def write_image(path, w, h, rects=(), background=(0, 0, 0)):
    """An RGB image of a flat background with filled rectangles (x1, y1, x2, y2, class) in pixels,
    written with cv2 (which takes BGR: convert so the file holds the RGB colours we mean)."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = background
    for x1, y1, x2, y2, cls in rects:
        img[y1:y2, x1:x2] = COLOURS[cls]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    return path


def write_labels(image_path, w, h, rects):
    """YOLO labels (class cx cy w h, normalised) of pixel rectangles, at the conventional place."""
    lp = Path(L.label_path(str(image_path)))
    lp.parent.mkdir(parents=True, exist_ok=True)
    lp.write_text(
        "".join(
            f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n"
            for x1, y1, x2, y2, c in rects
        )
    )


def rect_dataset(root, n=4, w=96, h=96, split="train", suffix=".png"):
    """n images, image k with one centred rectangle of colour/class k % 4 on black."""
    paths = []
    for k in range(n):
        rect = (w // 3, h // 3, 2 * w // 3, 2 * h // 3, k % 4)
        p = write_image(Path(root) / "images" / split / f"im{k}{suffix}", w, h, [rect])
        write_labels(p, w, h, [rect])
        paths.append(p)
    return Path(root) / "images" / split


def hash_tree(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def colour_mask(img, cls):
    """Pixels of colour `cls`: its full channels above half, its empty ones below half (edges
    blended by resizing count when they are more than half the colour)."""
    c = np.array(COLOURS[cls])
    img = np.asarray(img).astype(int)
    return np.all(np.where(c > 0, img > 160, img < 96), axis=-1)


def mask_box(mask):
    ys, xs = np.nonzero(mask)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float) if len(xs) else None


def assert_boxes_tight(img, labels, tol=1.5, region_margin=3, require_all_pixels=False):
    """Each label box tightly encloses the pixels of its class's colour around it (within tol px).
    img: HWC RGB uint8; labels: rows (class, x1, y1, x2, y2) in pixels."""
    img = np.asarray(img)
    h, w = img.shape[:2]
    assert len(labels), "expected at least one box"
    for cls, x1, y1, x2, y2 in np.asarray(labels, float):
        mask = colour_mask(img, int(cls))
        region = np.zeros_like(mask)
        region[
            max(int(y1) - region_margin, 0) : min(int(np.ceil(y2)) + region_margin, h),
            max(int(x1) - region_margin, 0) : min(int(np.ceil(x2)) + region_margin, w),
        ] = True
        found = mask_box(mask & region)
        assert found is not None, f"no pixel of class {int(cls)} near its box {x1, y1, x2, y2}"
        assert np.abs(found - (x1, y1, x2, y2)).max() <= tol, (
            f"class {int(cls)}: box {[x1, y1, x2, y2]} but pixels span {found.tolist()}"
        )
    if require_all_pixels:  # nothing coloured was left without a box
        for cls in set(int(c) for c in np.asarray(labels)[:, 0]):
            covered = np.zeros((h, w), bool)
            for c, x1, y1, x2, y2 in labels:
                if int(c) == cls:
                    covered[max(int(y1) - 2, 0) : int(np.ceil(y2)) + 2, max(int(x1) - 2, 0) : int(np.ceil(x2)) + 2] = (
                        True
                    )
            assert not (colour_mask(img, cls) & ~covered).any()


def chw_to_hwc(image):
    return image.permute(1, 2, 0).numpy()


@pytest.fixture
def user_cache_dir(tmp_path, monkeypatch):
    """Where a label cache goes when a dataset folder is read-only: inside the test's folder. Every test of the
    test_data_*.py and test_formats_*.py modules uses it (their `pytestmark`)."""
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user_cache"))
    return tmp_path / "user_cache"


@pytest.fixture
def log_lines(caplog):
    """The messages the pipeline logged (the 'yolo' logger), as one list of strings."""
    caplog.set_level(logging.INFO, logger="yolo")
    return lambda: [r.getMessage() for r in caplog.records]


def png_declaring(path, w, h, rows=4):
    """A valid-looking PNG whose header (IHDR) declares w x h RGB pixels, with only `rows` rows of data: a few
    hundred bytes that would be decoded into w * h * 3 bytes."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\0" * (1 + 3 * w) * rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path
