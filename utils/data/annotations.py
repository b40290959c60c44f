"""What the three label formats read here share: YOLO txt (utils/data/labels.py), Pascal VOC xml (utils/data/voc.py) and
COCO json (utils/data/coco_json.py). The error a bad annotation raises, the rule every box passes, and where our own
files go. Light on purpose (no cv2, no numpy): utils/data/dataset_yaml.py imports it, and starts without torch.
"""

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from utils.general import DatasetError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".dng", ".mpo", ".pfm"}
READER_VERSION = 1  # bump when voc.py or coco_json.py read boxes differently: their caches rebuild
COORD_TOLERANCE = 0.01  # coordinates this far outside the image (a fraction of its size) are clipped; further: refused
DARKNET_PREFIX = "data/"  # Darknet runs from the folder that holds a dataset as data/: its paths start so
FORMATS_READ = (
    "YOLO txt (an image folder or a .txt list of images, labels in the matching labels/ folder or beside the images; "
    "or a Darknet / CVAT obj.data given as the dataset yaml), "
    "Pascal VOC (key 'voc: FOLDER', or an ImageSets/Main/*.txt inside a VOC folder) "
    "and COCO json (a split written as {images: FOLDER, json: FILE}, or the .json file alone)"
)


def without_darknet_prefix(folder, path):
    """`path`, relative to `folder`, as Darknet's obj.data and image lists write it from the folder that holds the
    dataset as data/ (CVAT's Darknet YOLO export): without that prefix where it exists only so, else as given."""
    bare = path.removeprefix(DARKNET_PREFIX)
    return bare if bare != path and not (folder / path).exists() and (folder / bare).exists() else path


@dataclass(frozen=True)
class HeldOut:
    """A part of the train split's images, for a dataset yaml that gives val (or test) as a fraction of them: a
    labelling tool's export with no split of its own (Label Studio's). An image belongs to a held-out
    split when the hash of its file name falls in [start, end) (file_fraction), so the same images are held out in
    every run and on every machine, an image added later leaves the others where they were, and no list of the split
    is written. key "train" is the rest: every image that no held-out split takes."""

    key: str  # the split this part is: "train", "val" or "test"
    sources: tuple  # the train split's sources, as the yaml names them
    start: float
    end: float
    spec: str  # the yaml's words for every held-out split, for messages: "val: F" with F its fraction
    yaml: str = field(default="", compare=False, repr=False)  # the dataset yaml, for messages

    def __fspath__(self):  # where it came from: error messages and the label cache's name use it
        return str(self)

    def __str__(self):
        part = "the rest" if self.key == "train" else f"{self.key}, the part held out"
        return f"{', '.join(map(str, self.sources))} ({part} by `{self.spec}`)"

    def pick(self, entries, image=str):
        """The entries (image paths, or the items of a VOC or COCO json split: `image` gives the path) of this part.
        DatasetError when none is left: a fraction too small for a small set."""
        inside = [self.start <= file_fraction(image(e)) < self.end for e in entries]
        kept = [e for e, i in zip(entries, inside) if i != (self.key == "train")]
        if entries and not kept:
            raise DatasetError(
                f"{self.yaml}: `{self.spec}` leaves {self.key} none of the {len(entries)} train images; give "
                f"{'a smaller' if self.key == 'train' else 'a larger'} fraction, or name the {self.key} images"
            )
        return kept


def file_fraction(image):
    """A number in [0, 1) that an image's file name alone decides (not its folder: a moved dataset splits alike)."""
    return int.from_bytes(hashlib.sha256(Path(image).name.encode()).digest()[:8], "big") / 2**64


class BadAnnotation(ValueError):
    """One image's annotation cannot be used (the image is excluded); the message names the file and the entry."""


def cache_dir():
    """Where our own files about a dataset go when they must not go into the dataset's folders: the label cache
    of a read-only folder, and every cache of a VOC or COCO json set (read where it lies, never written into)."""
    return Path(
        os.environ.get("YOLO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "yolo"
    )


def pixel_box(x1, y1, x2, y2, w, h, where, written=None):
    """A box in pixels of a w x h image as normalised corners, clipped to the image when it pokes out by at most
    COORD_TOLERANCE of the image's size (as YOLO rows are: utils/data/labels.py), or 1 px: exporters disagree by one on
    where pixel 0 is (VOC counts from 1). Raises BadAnnotation naming `where` when it is further out or empty,
    quoting the box as `written` in the file (default: the corners given)."""
    corners = (x1, y1, x2, y2)
    shown = ", ".join(f"{v:g}" for v in written or corners)
    if not all(math.isfinite(v) for v in corners):
        raise BadAnnotation(f"{where}: a coordinate of box ({shown}) is not a finite number")
    if x2 <= x1 or y2 <= y1:
        raise BadAnnotation(f"{where}: box ({shown}) has zero or negative size")
    dx, dy = max(COORD_TOLERANCE * w, 1.0), max(COORD_TOLERANCE * h, 1.0)
    if x1 < -dx or y1 < -dy or x2 > w + dx or y2 > h + dy:
        raise BadAnnotation(f"{where}: box ({shown}) is outside the {w}x{h} image")
    return [min(max(v / size, 0.0), 1.0) for v, size in zip(corners, (w, h, w, h))]


def unique_rows(rows):
    """(rows without exact repeats, how many were dropped): the rule YOLO label files get (utils/data/labels.py)."""
    kept, seen = [], set()
    for row in rows:
        key = (row[0], *(round(v, 6) for v in row[1:]))
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept, len(rows) - len(kept)
