"""One generated set written as YOLO txt, a Pascal VOC folder and COCO json (issue 39), with what labelling tools
export (difficult and crowd boxes, category ids out of order, boxes poking out): the `sets` of test_formats_*.py."""

import json
import shutil
import sys
from pathlib import Path

import cv2
import pytest
import warm_python

from utils.data import shapes

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]
NAMES = sorted(shapes.NAMES)  # a VOC yaml without `names` takes its XML's names, sorted: the same order everywhere
CATEGORY_IDS = [3, 8, 11, 20, 42, 77]  # of class 0..5: gaps, and listed out of order in the json


def read_shapes(root):
    """{(split, image path): [w, h, boxes]} from the generated shapes set; boxes [class, x1, y1, x2, y2, ignored] in
    whole pixels, so that every format writes them exactly."""
    truth = {}
    for split in ("train", "val"):
        for image in sorted((root / "images" / split).glob("*.jpg")):
            h, w = cv2.imread(str(image)).shape[:2]
            label = root / "labels" / split / f"{image.stem}.txt"
            boxes = []
            for line in label.read_text().splitlines() if label.exists() else []:
                c, cx, cy, bw, bh = map(float, line.split())
                x1, y1, x2, y2 = (
                    round(v) for v in ((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h)
                )
                if x2 > x1 and y2 > y1:
                    boxes.append([NAMES.index(shapes.NAMES[int(c)]), x1, y1, x2, y2, False])
            truth[(split, image)] = [w, h, boxes]
    return truth


def add_label_tool_cases(truth):
    """An image without boxes, boxes to ignore (VOC difficult, COCO crowd) in both splits, boxes poking out of the
    image by half a pixel (training only: scoring reads the COCO json unclipped, the others clipped)."""
    val = [k for k in truth if k[0] == "val"]
    train = [k for k in truth if k[0] == "train" and truth[k][2]]
    truth[val[1]][2] = []
    for key in (val[2], val[3], train[0]):
        w, h, boxes = truth[key]
        c, x1, y1, x2, y2, _ = boxes[0]
        boxes.append([(c + 1) % len(NAMES), max(x1 - 3, 0), max(y1 - 3, 0), min(x2 + 3, w), min(y2 + 3, h), True])
    w, h, boxes = truth[train[1]]
    boxes += [[0, w - 12, 3, w + 0.5, 15, False], [1, -0.5, h - 20, 10, h - 4, False]]


def yolo_rows(w, h, boxes):
    return "".join(
        f"{c} {(x1 + x2) / 2 / w:.10f} {(y1 + y2) / 2 / h:.10f} {(x2 - x1) / w:.10f} {(y2 - y1) / h:.10f}\n"
        for c, x1, y1, x2, y2, ignored in boxes
        if not ignored  # YOLO txt has no way to say "ignore"
    )


def write_yolo(root, truth):
    for (split, image), (w, h, boxes) in truth.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, root / "images" / split / image.name)
        (root / "labels" / split / f"{image.stem}.txt").write_text(yolo_rows(w, h, boxes))


def write_cvat_yolo(root, truth, prefix="data/", subsets=("train", "valid")):
    """CVAT's "YOLO 1.1" export (Darknet's layout, as datumaro writes it): obj.data and obj.names, each subset's
    images with their labels beside them in obj_<subset>_data/ and listed in <subset>.txt, every path written from
    the folder Darknet runs in (`data/`, CVAT's default) or without it."""
    subset_of = dict(zip(("train", "val"), subsets))
    lists = {subset: [] for subset in subsets}
    for (split, image), (w, h, boxes) in truth.items():
        folder = root / f"obj_{subset_of[split]}_data"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folder / image.name)
        (folder / f"{image.stem}.txt").write_text(yolo_rows(w, h, boxes))
        lists[subset_of[split]].append(f"{prefix}{folder.name}/{image.name}\n")
    for subset, lines in lists.items():
        (root / f"{subset}.txt").write_text("".join(lines))
    (root / "obj.names").write_text("".join(n + "\n" for n in NAMES))
    (root / "obj.data").write_text(
        f"classes = {len(NAMES)}\n"
        + "".join(f"{subset} = {prefix}{subset}.txt\n" for subset in subsets)
        + f"names = {prefix}obj.names\nbackup = backup/\n"
    )


def write_label_studio_yolo(root, truth):
    """Label Studio's "YOLO with Images" export: one images/ and labels/ for the whole project (no splits), the class
    names in classes.txt, notes.json beside; every file name prefixed with the upload's hash."""
    for sub in ("images", "labels"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for (_, image), (w, h, boxes) in truth.items():
        shutil.copy(image, root / "images" / f"8f3a9c2e-{image.name}")
        (root / "labels" / f"8f3a9c2e-{image.stem}.txt").write_text(yolo_rows(w, h, boxes))
    (root / "classes.txt").write_text("".join(n + "\n" for n in NAMES))
    notes = {"categories": [{"id": i, "name": n} for i, n in enumerate(NAMES)], "info": {"contributor": "Label Studio"}}
    (root / "notes.json").write_text(json.dumps(notes))


def voc_xml(name, w, h, boxes, size=True):
    objects = "".join(
        f"<object><name>{NAMES[c]}</name><pose>Unspecified</pose><truncated>0</truncated>"
        f"<difficult>{int(ignored)}</difficult><bndbox><xmin>{x1 + 1:g}</xmin><ymin>{y1 + 1:g}</ymin>"
        f"<xmax>{x2:g}</xmax><ymax>{y2:g}</ymax></bndbox></object>"
        for c, x1, y1, x2, y2, ignored in boxes
    )  # VOC counts pixels from 1
    size = f"<size><width>{w}</width><height>{h}</height><depth>3</depth></size>" if size else ""
    return f"<annotation><folder>JPEGImages</folder><filename>{name}</filename>{size}{objects}</annotation>"


def write_voc(root, truth):
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = {"train": [], "val": []}
    for (split, image), (w, h, boxes) in truth.items():
        shutil.copy(image, root / "JPEGImages" / image.name)
        (root / "Annotations" / f"{image.stem}.xml").write_text(voc_xml(image.name, w, h, boxes))
        ids[split].append(image.stem)
    for split, stems in ids.items():
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(s + "\n" for s in stems))


def write_coco(root, truth):
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for k, ((s, image), (w, h, boxes)) in enumerate(truth.items()):
            if s != split:
                continue
            shutil.copy(image, root / "images" / split / image.name)
            images.append({"id": 100 + 7 * k, "file_name": image.name, "width": w, "height": h})
            for c, x1, y1, x2, y2, crowd in boxes:
                annotations.append(
                    {"id": 1000 + len(annotations), "image_id": 100 + 7 * k, "category_id": CATEGORY_IDS[c],
                     "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": int(crowd)}
                )  # fmt: skip
        categories = [{"id": i, "name": n, "supercategory": "shape"} for i, n in zip(CATEGORY_IDS, NAMES)][::-1]
        (root / "annotations").mkdir(exist_ok=True)
        coco = {"images": images, "annotations": annotations, "categories": categories}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same data as yolo.yaml, voc.yaml and coco.yaml (written as a user writes them), plus the truth."""
    root = tmp_path_factory.mktemp("formats")
    shapes.make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    truth = read_shapes(root / "shapes")
    add_label_tool_cases(truth)
    write_yolo(root / "yolo", truth)
    write_voc(root / "voc", truth)
    write_coco(root / "coco", truth)
    write_cvat_yolo(root / "cvat", truth)
    (root / "yolo.yaml").write_text(f"path: yolo\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    (root / "voc.yaml").write_text("voc: voc  # a Pascal VOC folder: its ImageSets/Main/train.txt and val.txt\n")
    (root / "coco.yaml").write_text(
        "path: coco\n"
        "train: {images: images/train, json: annotations/instances_train.json}\n"
        "val: {images: images/val, json: annotations/instances_val.json}\n"
    )
    return root, truth


def run(args, **kwargs):
    cmd = [sys.executable, *map(str, args)]
    result = warm_python.run(cmd, REPO, timeout=300, **kwargs)
    assert result.returncode == 0, f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result
