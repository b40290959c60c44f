"""Pascal VOC read where it lies: Annotations/*.xml, JPEGImages/, ImageSets/Main/*.txt (lists of image ids, not
paths), or a folder of images with each one's .xml beside it (Roboflow's and LabelImg's export). Nothing is
converted or written into the dataset's folder.

Coordinates: VOC numbers pixels from 1 (xmin 1 is the first column, xmax = width the last), so a box covers
[xmin - 1, xmax] in the 0-based continuous pixels the rest of the repo uses (detectron2 reads VOC the same way).
`difficult` boxes: kept out of the training targets and scored as ignored regions (utils/coco.py gives them
iscrowd=1), as VOC's own evaluation ignores them: neither a miss nor a false positive.

Light (no cv2): utils/data/dataset_yaml.py imports it.
"""

import glob
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from utils.data.annotations import IMAGE_SUFFIXES, BadAnnotation, pixel_box, unique_rows
from utils.general import DatasetError


@dataclass(frozen=True)
class VocSplit:
    """One source of a split in VOC: an ImageSets .txt of ids, or a folder of images, inside the VOC folder `root`.
    names: the classes, in index order (the yaml's, else every name in the XML files, sorted)."""

    root: Path
    source: Path
    names: tuple = ()

    def __fspath__(self):  # where it came from: error messages and the label cache's name use it
        return str(self.source)

    def __str__(self):
        return str(self.source)


class VocItem(NamedTuple):
    """One image of a VOC split and its annotation file (which may not exist: an image without objects)."""

    image: str
    xml: str
    names: tuple

    def boxes(self, shape):
        """(training rows, ignored rows, duplicates) of this image of shape (h, w), each row [class, x1, y1, x2, y2]
        normalised; None when it has no XML (a background image). Raises BadAnnotation naming the file and object."""
        if not os.path.exists(self.xml):
            return None
        return read_xml(self.xml, self.names, shape)


def is_image_set(path):
    """An ImageSets/<task>/*.txt of a VOC folder: image ids, one a line, not image paths."""
    path = Path(path)
    return (
        path.suffix == ".txt" and path.parent.parent.name == "ImageSets" and (path.parents[2] / "Annotations").is_dir()
    )


def voc_source(root, value):
    """The VocSplit a yaml's train/val value names inside the VOC folder `root`: an ImageSets .txt, a folder of
    images, or a bare image-set name (`trainval` = ImageSets/Main/trainval.txt). None when none of these exists."""
    for candidate in (root / value, root / "ImageSets" / "Main" / f"{value}.txt"):  # root / an absolute = it
        if candidate.is_dir() or (candidate.is_file() and candidate.suffix == ".txt"):
            return VocSplit(root, candidate)
    return None


def split_items(split):
    """Every VocItem of a split, sorted by image path."""
    if split.source.is_dir():
        images = [p for p in glob.glob(str(split.source / "**" / "*"), recursive=True) if _is_image(p)]
        items = [VocItem(p, _xml_of_image(p, split.root), split.names) for p in images]
    else:
        images = _images_by_id(split.root / "JPEGImages")
        items = []
        for line in split.source.read_text().splitlines():
            parts = line.split()  # a class's own list (ImageSets/Main/cat_train.txt) adds a -1/0/1 column
            if parts:
                image = images.get(parts[0], str(split.root / "JPEGImages" / f"{parts[0]}.jpg"))
                items.append(VocItem(image, str(split.root / "Annotations" / f"{parts[0]}.xml"), split.names))
    unique = {os.path.normpath(item.image): item for item in reversed(items)}  # the first listing of an image wins
    return [unique[k]._replace(image=k) for k in sorted(unique)]


def _is_image(path):
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def _xml_of_image(image, root):
    """The image's own .xml beside it (Roboflow, LabelImg), else <root>/Annotations/<stem>.xml (VOC)."""
    beside = os.path.splitext(image)[0] + ".xml"
    return beside if os.path.exists(beside) else str(root / "Annotations" / (Path(image).stem + ".xml"))


def _images_by_id(folder):
    """{image id: path} of JPEGImages/ (an id's image may be a .png; one listing instead of a lookup per id)."""
    if not folder.is_dir():
        return {}
    return {Path(e.name).stem: e.path for e in os.scandir(folder) if _is_image(e.name)}


def read_xml(xml_path, names, shape):
    """(training rows, difficult rows, duplicates dropped) of one annotation file; see VocItem.boxes."""
    root = _parse(xml_path)
    w, h = _size(root, xml_path)
    if (h, w) != tuple(shape):
        raise BadAnnotation(f"{xml_path}: <size> says {w}x{h} but the image is {shape[1]}x{shape[0]}")
    index = {n: i for i, n in enumerate(names)}
    rows, difficult = [], []
    for k, obj in enumerate(root.findall("object"), 1):
        name = (obj.findtext("name") or "").strip()
        where = f"{xml_path} object {k} ({name or 'no name'})"
        if name not in index:
            raise BadAnnotation(f"{where}: class '{name}' is not one of the dataset yaml's names")
        try:
            xmin, ymin, xmax, ymax = (float(obj.find("bndbox").findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
        except (AttributeError, TypeError, ValueError):
            raise BadAnnotation(f"{where}: <bndbox> needs numbers xmin, ymin, xmax and ymax") from None
        if xmax <= xmin or ymax <= ymin:  # checked as written: xmin - 1 below would make a point 1 px wide
            raise BadAnnotation(f"{where}: box ({xmin:g}, {ymin:g}, {xmax:g}, {ymax:g}) has zero or negative size")
        row = [index[name], *pixel_box(xmin - 1, ymin - 1, xmax, ymax, w, h, where, (xmin, ymin, xmax, ymax))]
        (difficult if _is_set(obj.findtext("difficult")) else rows).append(row)
    rows, duplicates = unique_rows(rows)
    return rows, difficult, duplicates


def _parse(xml_path):
    try:
        return ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        raise BadAnnotation(f"{xml_path} is not valid XML ({e})") from None


def _size(root, xml_path):
    """(width, height) from <size>: the boxes are in its pixels, so an XML without one is refused."""
    try:
        w, h = (int(float(root.find("size").findtext(t))) for t in ("width", "height"))
    except (AttributeError, TypeError, ValueError):
        w = h = 0
    if w <= 0 or h <= 0:
        raise BadAnnotation(f"{xml_path} has no <size> with a positive width and height")
    return w, h


def _is_set(text):
    return (text or "0").strip().lower() in ("1", "true", "yes")


def class_names(splits):
    """Every object name in the XML files of these splits, sorted: the classes when the yaml has no `names`."""
    names = set()
    for split in splits:
        for item in split_items(split):
            if os.path.exists(item.xml):
                try:
                    names.update((o.findtext("name") or "").strip() for o in _parse(item.xml).findall("object"))
                except BadAnnotation:
                    continue  # said when the split is verified, where the image is excluded
    names.discard("")
    if not names:
        raise DatasetError(f"no object in the XML files of {', '.join(map(str, splits))}, so no class names")
    return sorted(names)
