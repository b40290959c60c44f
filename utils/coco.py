"""COCO-format conversion: YOLO labels -> COCO ground truth (what pycocotools evaluates against),
and a COCO annotation json -> YOLO txt labels (for training on a COCO-format dataset)."""

import json
import os
from pathlib import Path


def records_to_coco(records, names, file_names=None, first_image_id=0, decimals=None):
    """The one YOLO -> COCO conversion: a COCO instances dict from verified YOLO records (utils.records.Records
    or dicts {"im", "shape" (h, w), "labels" [[cls, x1, y1, x2, y2] normalised]}), boxes in pixels.

    Category ids, the same everywhere in this repo (val.py's ground_truth.json and predictions.json,
    detect.py --save-json, data/yolo2coco.py, bench/score_detections.py): category id = YOLO class
    index, 0..nc-1 (a tool that reads 0 as "background" needs 1 added). Only with a dataset's own
    COCO json (`ground_truth(coco_json=...)`) are its category ids used instead.
    Image id = first_image_id + position in `records`; annotation ids start at 1. file_name: the
    given `file_names`, else each record's path. decimals: round boxes and areas (for a file)."""
    fix = (lambda v: v) if decimals is None else (lambda v: round(v, decimals))
    images, annotations = [], []
    for i, r in enumerate(records):
        h, w = r["shape"]
        image_id = first_image_id + i
        images.append(
            {
                "id": image_id,
                "file_name": str(r["im"]) if file_names is None else file_names[i],
                "height": h,
                "width": w,
            }
        )
        for cls, x1, y1, x2, y2 in (map(float, row) for row in r["labels"]):  # numpy float32 -> JSON-able
            bw, bh = (x2 - x1) * w, (y2 - y1) * h
            bbox = [fix(x1 * w), fix(y1 * h), fix(bw), fix(bh)]
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls), "bbox": bbox,
                 "area": fix(bw * bh), "iscrowd": 0}
            )  # fmt: skip
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def detections_to_coco(dets, image_id, category_ids=None):
    """COCO detection dicts of one image from rows x1 y1 x2 y2 score class (pixels): bbox x y w h
    rounded to 1e-3 px, score to 1e-5. category_id = category_ids[class], by default the class index
    (the convention of records_to_coco)."""
    return [
        {
            "image_id": image_id,
            "category_id": int(c) if category_ids is None else category_ids[int(c)],
            "bbox": [round(float(x1), 3), round(float(y1), 3), round(float(x2 - x1), 3), round(float(y2 - y1), 3)],
            "score": round(float(s), 5),
        }
        for x1, y1, x2, y2, s, c in dets
    ]


def ground_truth(records, names, coco_json=None):
    """(COCO ground-truth dict, image id of each record, category id of each class index).
    With the dataset's original COCO json, the official annotations are used (crowd regions and
    all), so COCO val numbers are the official ones; images are matched by file name."""
    if coco_json is None:
        return records_to_coco(records, names), list(range(len(records))), list(range(len(names)))
    gt = json.loads(Path(coco_json).read_text())
    by_name = {Path(im["file_name"]).name: im["id"] for im in gt["images"]}
    missing = [r["im"] for r in records if Path(r["im"]).name not in by_name]
    if missing:
        raise ValueError(f"{coco_json} has no entry for {len(missing)} validation images, e.g. {missing[0]}")
    category_ids = sorted(c["id"] for c in gt["categories"])  # YOLO class i = i-th category by id
    if len(category_ids) != len(names):
        raise ValueError(f"{coco_json} has {len(category_ids)} categories but the dataset yaml names {len(names)}")
    ids = [by_name[Path(r["im"]).name] for r in records]
    keep = set(ids)
    gt = dict(
        gt,
        images=[im for im in gt["images"] if im["id"] in keep],
        annotations=[a for a in gt["annotations"] if a["image_id"] in keep],
    )
    return gt, ids, category_ids


def coco_to_yolo(json_path, labels_dir):
    """Write one YOLO txt per image (class cx cy w h, normalised) from a COCO instances json.
    Crowd annotations are skipped (they are regions to ignore, not objects). Class i is the i-th
    category sorted by id (COCO's 80 ids 1..90 become 0..79). Returns the names."""
    data = json.loads(Path(json_path).read_text())
    categories = sorted(data["categories"], key=lambda c: c["id"])
    index = {c["id"]: i for i, c in enumerate(categories)}
    images = {im["id"]: im for im in data["images"]}
    rows = {im_id: [] for im_id in images}
    for a in data["annotations"]:
        if a.get("iscrowd", 0):
            continue
        im = images[a["image_id"]]
        W, H = im["width"], im["height"]
        x, y, w, h = a["bbox"]
        x1, y1, x2, y2 = max(x, 0), max(y, 0), min(x + w, W), min(y + h, H)  # COCO boxes may poke out by a pixel
        if x2 <= x1 or y2 <= y1:
            continue
        cx, cy = (x1 + x2) / 2 / W, (y1 + y2) / 2 / H
        rows[a["image_id"]].append(
            f"{index[a['category_id']]} {cx:.6f} {cy:.6f} {(x2 - x1) / W:.6f} {(y2 - y1) / H:.6f}"
        )
    out = Path(labels_dir)
    out.mkdir(parents=True, exist_ok=True)
    for im_id, lines in rows.items():
        if lines:  # no file for an image without objects: a background image
            (out / Path(images[im_id]["file_name"]).with_suffix(".txt").name).write_text("\n".join(lines) + "\n")
    return [c["name"] for c in categories]


def yolo_to_coco(sources, names):
    """A COCO instances dict from YOLO images + labels (folders or .txt lists). Every image is verified
    first (see utils.labels.verify_one): broken ones are left out and returned with their reason.
    Image and annotation ids start at 1; category id = class index (records_to_coco's convention);
    file_name is the path relative to the images' common folder; boxes rounded to 1e-3 px.
    Returns (dict, problems)."""
    from utils.labels import list_images, verify_one

    files = list_images(sources)
    common = Path(os.path.commonpath([str(Path(f).parent) for f in files])) if files else Path(".")
    records, file_names, problems = [], [], []
    for f in files:
        status, record, note = verify_one(f, len(names))
        if record is None:
            problems.append(f"{status}\t{f}\t{note}")
            continue
        records.append(record)
        file_names.append(Path(f).relative_to(common).as_posix())
    return records_to_coco(records, names, file_names, first_image_id=1, decimals=3), problems
