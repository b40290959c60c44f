"""COCO format for scoring: verified records -> COCO ground truth (what pycocotools evaluates against), or the
dataset's original COCO json; detections -> COCO detection dicts. A COCO json dataset is read as it is by
utils/data/coco_json.py, without converting it."""

import json
import os
from pathlib import Path


def records_to_coco(records, names, file_names=None, first_image_id=0, decimals=None):
    """The one YOLO -> COCO conversion: a COCO instances dict from verified YOLO records (utils.data.records.Records
    or dicts {"im", "shape" (h, w), "labels" [[cls, x1, y1, x2, y2] normalised]}), boxes in pixels.

    Category ids, the same everywhere in this repo (val.py's ground_truth.json and predictions.json,
    detect.py --save-json, data/yolo2coco.py, bench/score_detections.py): category id = YOLO class
    index, 0..nc-1 (a tool that reads 0 as "background" needs 1 added). Only with a dataset's own
    COCO json (`ground_truth(coco_json=...)`) are its category ids used instead.
    Image id = first_image_id + position in `records`; annotation ids start at 1. file_name: the
    given `file_names`, else each record's path. decimals: round boxes and areas (for a file).
    A record's "ignored" boxes (a VOC set's `difficult`, a COCO json's crowds) become iscrowd=1 annotations:
    pycocotools counts them neither as misses nor, when a detection lands on one, as false positives."""
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
        boxes = [(row, 0) for row in r["labels"]] + [(row, 1) for row in r.get("ignored", ())]
        for (cls, x1, y1, x2, y2), crowd in ((map(float, row), c) for row, c in boxes):  # float32 -> JSON-able
            bw, bh = (x2 - x1) * w, (y2 - y1) * h
            bbox = [fix(x1 * w), fix(y1 * h), fix(bw), fix(bh)]
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls), "bbox": bbox,
                 "area": fix(bw * bh), "iscrowd": crowd}
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
    all), so COCO val numbers are the official ones. Images are matched by the id a COCO json split's
    records carry (utils/data/coco_json.py), else by file name (YOLO labels beside a `coco_json:` key)."""
    if coco_json is None:
        return records_to_coco(records, names), list(range(len(records))), list(range(len(names)))
    gt = json.loads(Path(coco_json).read_text())
    if getattr(records, "image_ids", None) is not None and (records.image_ids >= 0).all():
        ids = records.image_ids.tolist()
    else:
        by_name = {Path(im["file_name"]).name: im["id"] for im in gt["images"]}
        missing = [r["im"] for r in records if Path(r["im"]).name not in by_name]
        if missing:
            raise ValueError(f"{coco_json} has no entry for {len(missing)} validation images, e.g. {missing[0]}")
        ids = [by_name[Path(r["im"]).name] for r in records]
    # YOLO class i = i-th category by id, of those that are classes (a CocoSplit knows; not a grouping category)
    category_ids = list(getattr(coco_json, "category_ids", ()) or sorted(c["id"] for c in gt["categories"]))
    keep, classes = set(ids), set(category_ids)
    gt = dict(
        gt,
        images=[im for im in gt["images"] if im["id"] in keep],
        annotations=[a for a in gt["annotations"] if a["image_id"] in keep],
        categories=[c for c in gt["categories"] if c["id"] in classes],
    )
    if len(names) == 1 < len(category_ids):  # --single-cls: every category is the one class, 'object'
        category_ids = category_ids[:1]
        gt["annotations"] = [dict(a, category_id=category_ids[0]) for a in gt["annotations"]]
        gt["categories"] = [{"id": category_ids[0], "name": names[0]}]
    if len(category_ids) != len(names):
        raise ValueError(f"{coco_json} has {len(category_ids)} categories but the dataset yaml names {len(names)}")
    return gt, ids, category_ids


def yolo_to_coco(sources, names):
    """A COCO instances dict from YOLO images + labels (folders or .txt lists), or from any split a dataset yaml
    reads (a VOC one too). Every image is verified first (see utils.data.labels.verify_one): broken ones are left out
    and returned with their reason. Image and annotation ids start at 1; category id = class index
    (records_to_coco's convention); file_name is the path relative to the images' common folder; boxes rounded
    to 1e-3 px. Returns (dict, problems)."""
    from utils.data.labels import annotated_items, list_images, verify_annotated, verify_one

    items = annotated_items(sources)
    files = list_images(sources) if items is None else items
    common = Path(os.path.commonpath([str(Path(getattr(f, "image", f)).parent) for f in files])) if files else Path(".")
    records, file_names, problems = [], [], []
    for entry in files:
        f = getattr(entry, "image", entry)
        status, record, note = verify_one(f, len(names)) if items is None else verify_annotated(entry)
        if record is None:
            problems.append(f"{status}\t{f}\t{note}")
            continue
        records.append(record)
        file_names.append(Path(f).relative_to(common).as_posix())
    return records_to_coco(records, names, file_names, first_image_id=1, decimals=3), problems
