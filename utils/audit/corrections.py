"""The audit's suggested fixes, written in the dataset's own format to a folder of their own (never into the dataset),
for a labelling tool to load and a person to accept or reject: YOLO txt (images/ linked, labels/ beside them,
classes.txt), Pascal VOC (JPEGImages/ linked, Annotations/ with each XML's other fields kept, ImageSets/Main/review.txt)
or COCO json (the json's images that have a fix, with their annotations replaced). Only images with a fix are written.
"""

import copy
import json
import os
import shutil
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import numpy as np

from utils.data.coco_json import CocoItem
from utils.data.labels import label_path
from utils.data.voc import VocItem


def corrected_labels(issues, records, fix_score):
    """{record index: (k, 5) class x1 y1 x2 y2 in pixels} of every image an issue scored fix_score or more changes:
    each box takes its most likely issue (a wrong class gets its suggested class, a badly placed box the model's box,
    a spurious or duplicate box is deleted), and each missing object is added."""
    chosen, added = {}, defaultdict(list)
    for issue in sorted(issues, key=lambda issue: -issue["score"]):
        if issue["score"] < fix_score:
            break
        if issue["kind"] == "missing":
            added[issue["index"]].append([issue["cls"], *issue["suggestion"]])
        else:
            chosen.setdefault((issue["index"], issue["label"]), issue)
    changed = {i for i, _ in chosen} | set(added)
    fixed = {}
    for i in sorted(changed):
        h, w = records.shapes[i]
        rows = []
        for j, row in enumerate(records.labels_of(i).astype(np.float64) * [1, w, h, w, h]):
            issue = chosen.get((i, j))
            kind = issue["kind"] if issue else None
            if kind in ("spurious", "duplicate"):
                continue
            if kind == "wrong_class":
                row[0] = issue["suggestion"]
            elif kind == "badly_placed":
                row[1:] = issue["suggestion"]
            rows.append(row)
        fixed[i] = np.array(rows + added[i], np.float64).reshape(-1, 5)
    return fixed


def write_corrections(issues, records, items, data, folder, fix_score):
    """Write the fixes of corrected_labels in the format each image's labels came in; a sentence saying what."""
    fixed = corrected_labels(issues, records, fix_score)
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)  # this run's fixes only: an older run's would mix in
    folder.mkdir(parents=True)
    by_format = defaultdict(dict)
    for i, rows in fixed.items():
        item = items.get(records.path(i))
        kind = "voc" if isinstance(item, VocItem) else "coco" if isinstance(item, CocoItem) else "yolo"
        by_format[kind][i] = (item, rows)
    if by_format["yolo"]:
        write_yolo(by_format["yolo"], records, data, folder)
    if by_format["voc"]:
        write_voc(by_format["voc"], records, data["names"], folder)
    if by_format["coco"]:
        write_coco(by_format["coco"], data, folder)
    return f"{len(fixed)} images with the fixes scored {fix_score} or more in {folder}"


def link(source, target):
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        try:
            target.symlink_to(Path(source).resolve())
        except OSError:  # a file system without links
            shutil.copyfile(source, target)


def write_yolo(fixed, records, data, folder):
    """Each image linked at its path under the dataset folder (else images/<name>), its .txt where the YOLO rule looks
    (utils/data/labels.py label_path), and classes.txt (labelImg and CVAT read it)."""
    root = Path(data["root"]).resolve()
    for i, (_, rows) in fixed.items():
        image = Path(records.path(i)).resolve()
        target = folder / (image.relative_to(root) if image.is_relative_to(root) else Path("images") / image.name)
        link(image, target)
        h, w = records.shapes[i]
        lines = [
            f"{int(c)} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n"
            for c, x1, y1, x2, y2 in rows
        ]
        label = Path(label_path(str(target)))
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(lines))
    (folder / "classes.txt").write_text("".join(f"{n}\n" for n in data["names"]))


def write_voc(fixed, records, names, folder):
    """Annotations/<stem>.xml: the original XML with its boxes replaced (difficult ones kept as they were)."""
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    stems = []
    for i, (item, rows) in fixed.items():
        link(item.image, folder / "JPEGImages" / Path(item.image).name)
        tree = ET.parse(item.xml) if os.path.exists(item.xml) else _empty_xml(item.image, records.shapes[i])
        top = tree.getroot()
        for obj in top.findall("object"):
            if (obj.findtext("difficult") or "0").strip().lower() not in ("1", "true", "yes"):
                top.remove(obj)
        for c, x1, y1, x2, y2 in rows:  # VOC numbers pixels from 1: xmin = x1 + 1 (utils/data/voc.py)
            obj = ET.SubElement(top, "object")
            ET.SubElement(obj, "name").text = names[int(c)]
            ET.SubElement(obj, "difficult").text = "0"
            box = ET.SubElement(obj, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), (x1 + 1, y1 + 1, x2, y2)):
                ET.SubElement(box, tag).text = str(int(round(v)))
        stem = Path(item.image).stem
        tree.write(folder / "Annotations" / f"{stem}.xml")
        stems.append(stem)
    (folder / "ImageSets" / "Main" / "review.txt").write_text("".join(f"{s}\n" for s in stems))


def _empty_xml(image, shape):
    """The XML of an image that had none (a background image the model finds objects in)."""
    top = ET.Element("annotation")
    ET.SubElement(top, "filename").text = Path(image).name
    size = ET.SubElement(top, "size")
    for tag, v in (("width", shape[1]), ("height", shape[0]), ("depth", 3)):
        ET.SubElement(size, tag).text = str(int(v))
    return ET.ElementTree(top)


def write_coco(fixed, data, folder):
    """<its folder>/<json name> for each source json: its images with a fix, crowd annotations kept, others replaced."""
    by_json = defaultdict(dict)
    for _, (item, rows) in fixed.items():
        by_json[item.json][item.image_id] = rows
    category_ids = _category_ids(data)
    for source, rows_of in by_json.items():
        original = json.loads(Path(source).read_text(encoding="utf-8"))
        out = {k: copy.deepcopy(v) for k, v in original.items() if k not in ("images", "annotations")}
        out["images"] = [im for im in original["images"] if im["id"] in rows_of]
        kept = [a for a in original.get("annotations") or [] if a["image_id"] in rows_of and a.get("iscrowd")]
        next_id = max((a["id"] for a in original.get("annotations") or []), default=0) + 1
        for image_id, rows in rows_of.items():
            for c, x1, y1, x2, y2 in rows:
                bbox = [round(float(v), 2) for v in (x1, y1, x2 - x1, y2 - y1)]
                kept.append({"id": next_id, "image_id": image_id, "category_id": category_ids[int(c)], "bbox": bbox,
                             "area": round(bbox[2] * bbox[3], 2), "iscrowd": 0})  # fmt: skip
                next_id += 1
        out["annotations"] = kept
        target = folder / Path(source).parent.name / Path(source).name  # train/ and valid/ may share a json name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(out))


def _category_ids(data):
    """The original category id of each class (the json's own numbering), from the first COCO source."""
    for key in ("train", "val"):
        for source in data[key]:
            if getattr(source, "category_ids", None):
                return list(source.category_ids)
    return list(range(data["nc"]))
