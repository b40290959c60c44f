"""COCO json read where it lies (the export of CVAT, Label Studio, Roboflow, or COCO's own instances_*.json): the
split's images are the json's `images`, found in the split's image folder by `file_name`. Nothing is converted
or written into the dataset's folder.

Classes: the json's categories sorted by id become classes 0..n-1 (COCO's 80 ids 1..90 become 0..79), all but a
category that only groups the others (Roboflow's root category: `categories`); the original ids are kept for
scoring, which reads the original json itself (utils/coco.py ground_truth).
`iscrowd` annotations: kept out of the training targets (a crowd region is not one object) and ignored in scoring,
as pycocotools does.

Light (no cv2): utils/data/dataset_yaml.py imports it.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from utils.data.annotations import BadAnnotation, cache_dir, pixel_box, unique_rows
from utils.general import DatasetError


@dataclass(frozen=True)
class CocoSplit:
    """One source of a split in COCO json: the json and the folder its file_names are relative to.
    category_ids: the original category id of each class, in class order."""

    images: Path
    json: Path
    category_ids: tuple = ()

    def __fspath__(self):  # where it came from: error messages and the label cache's name use it
        return str(self.json)

    def __str__(self):
        return str(self.json)


class CocoItem(NamedTuple):
    """One image of a COCO json and its annotations as (annotation id, class, bbox, iscrowd)."""

    image: str
    json: str
    image_id: int
    size: tuple  # (width, height) as the json says, or () when it does not
    annotations: tuple

    def boxes(self, shape):
        """(training rows, crowd rows, duplicates) of this image of shape (h, w), each row [class, x1, y1, x2, y2]
        normalised. Raises BadAnnotation naming the json and the annotation id."""
        h, w = shape
        if self.size and tuple(self.size) != (w, h):
            raise BadAnnotation(
                f"{self.json} image {self.image_id}: width and height say {self.size[0]}x{self.size[1]} "
                f"but {self.image} is {w}x{h}"
            )
        rows, crowd = [], []
        for annotation_id, cls, bbox, iscrowd in self.annotations:
            where = f"{self.json} annotation {annotation_id}"
            if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4):
                raise BadAnnotation(f"{where}: 'bbox' must be [x, y, width, height], got {bbox!r}")
            try:
                x, y, bw, bh = (float(v) for v in bbox)
            except (TypeError, ValueError):
                raise BadAnnotation(f"{where}: 'bbox' must be 4 numbers, got {bbox!r}") from None
            (crowd if iscrowd else rows).append([cls, *pixel_box(x, y, x + bw, y + bh, w, h, where)])
        rows, duplicates = unique_rows(rows)
        return rows, crowd, duplicates


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path} is not valid json ({e})") from None
    except RecursionError:  # a crafted file: Python's json reader recurses once per nested bracket
        raise DatasetError(f"{path} is not a COCO json: it nests lists or mappings thousands deep") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "categories")):
        raise DatasetError(f"{path} is not a COCO json: it needs the lists 'images', 'annotations' and 'categories'")
    return data


def categories(path):
    """[(id, name, group), ...] of a COCO json, sorted by id. group: the category only groups others (another one
    names it as its supercategory) and no annotation has it, as the root category that Roboflow's export puts first
    (`{"id": 0, "name": "objects", "supercategory": "none"}`): not a class (utils/data/dataset_yaml.py). Remembered in
    our cache folder (keyed by the file's size and time): the dataset yaml is read at every start, and COCO's train
    json takes seconds to parse."""
    st = os.stat(path)
    key = hashlib.sha256(f"v2|{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    remembered = cache_dir() / f"coco_categories.{key}.json"
    try:
        return [tuple(c) for c in json.loads(remembered.read_text())]
    except (OSError, ValueError):
        pass
    data = read_json(path)
    used = {a.get("category_id") for a in data.get("annotations") or [] if isinstance(a, dict)}
    parents = {c.get("supercategory") for c in data["categories"] if c.get("supercategory") != c.get("name")}
    found = sorted(
        (c["id"], str(c.get("name", c["id"])), c.get("name") in parents and c["id"] not in used)
        for c in data["categories"]
    )
    if all(group for *_, group in found):  # nothing annotated at all: keep what the json lists
        found = [(c, name, False) for c, name, _ in found]
    try:
        remembered.parent.mkdir(parents=True, exist_ok=True)
        remembered.write_text(json.dumps(found))
    except OSError:
        pass  # read again next time
    return found


def split_items(split):
    """Every CocoItem of a split, sorted by image path. A json whose annotations name an image or a category it
    does not have is refused (DatasetError naming the annotation id)."""
    data = read_json(split.json)
    class_of = {c: i for i, c in enumerate(split.category_ids)}
    named = next((im for im in data["images"] if type(im.get("id")) is not int), None)
    if named is not None:  # records keep ids as int64 (utils/data/records.py); the COCO format's are whole numbers
        raise DatasetError(
            f"{split.json}: image {named.get('file_name')!r} has id {named.get('id')!r}, but COCO image ids are "
            "whole numbers; renumber the images and their annotations' image_id"
        )
    images = {im["id"]: im for im in data["images"]}
    annotations = {image_id: [] for image_id in images}
    for a in data.get("annotations") or []:
        if a.get("image_id") not in images:
            raise DatasetError(
                f"{split.json}: annotation {a.get('id')} has image_id {a.get('image_id')!r}, which names no image"
            )
        if a.get("category_id") not in class_of:
            raise DatasetError(
                f"{split.json}: annotation {a.get('id')} has category_id {a.get('category_id')!r}, "
                "which is not one of its categories"
            )
        annotations[a["image_id"]].append(
            (a.get("id"), class_of[a["category_id"]], a.get("bbox"), bool(a.get("iscrowd")))
        )
    items = {}
    for image_id, im in images.items():
        path = os.path.normpath(_image_path(split.images, str(im.get("file_name", ""))))
        size = (im["width"], im["height"]) if "width" in im and "height" in im else ()
        items.setdefault(path, CocoItem(path, str(split.json), image_id, size, tuple(annotations[image_id])))
    return [items[k] for k in sorted(items)]


def _image_path(folder, file_name):
    """file_name under the image folder; else its last part there (exporters write 'images/x.jpg', or a path on
    the annotator's machine); else the first, which verification then reports missing."""
    direct = folder / file_name
    if direct.is_file():
        return str(direct)
    by_name = folder / Path(file_name.replace("\\", "/")).name
    return str(by_name if by_name.is_file() else direct)
