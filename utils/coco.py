"""COCO-format conversion: YOLO labels -> COCO ground truth (what pycocotools evaluates against),
and a COCO annotation json -> YOLO txt labels (for training on a COCO-format dataset)."""

import json
import os
from pathlib import Path


def records_to_coco(records, names):
    """Ground truth in COCO format from verified YOLO records. Image id = position in `records`,
    category id = class index."""
    images, annotations = [], []
    for image_id, r in enumerate(records):
        h, w = r["shape"]
        images.append({"id": image_id, "file_name": str(r["im"]), "height": h, "width": w})
        for cls, x1, y1, x2, y2 in r["labels"]:
            bw, bh = (x2 - x1) * w, (y2 - y1) * h
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls), "bbox": [x1 * w, y1 * h, bw, bh], "area": bw * bh, "iscrowd": 0}
            )
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


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
    gt = dict(gt, images=[im for im in gt["images"] if im["id"] in keep], annotations=[a for a in gt["annotations"] if a["image_id"] in keep])
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
        rows[a["image_id"]].append(f"{index[a['category_id']]} {cx:.6f} {cy:.6f} {(x2 - x1) / W:.6f} {(y2 - y1) / H:.6f}")
    out = Path(labels_dir)
    out.mkdir(parents=True, exist_ok=True)
    for im_id, lines in rows.items():
        if lines:  # no file for an image without objects: a background image
            (out / Path(images[im_id]["file_name"]).with_suffix(".txt").name).write_text("\n".join(lines) + "\n")
    return [c["name"] for c in categories]


def yolo_to_coco(sources, names):
    """A COCO instances dict from YOLO images + labels (folders or .txt lists). Every image is verified
    first (see utils.data.verify_one): broken ones are left out and returned with their reason.
    Ids start at 1, as COCO's do (some tools read 0 as "none"); category id = class index + 1;
    file_name is the path relative to the images' common folder. Returns (dict, problems)."""
    from utils.data import list_images, verify_one

    files = list_images(sources)
    common = Path(os.path.commonpath([str(Path(f).parent) for f in files])) if files else Path(".")
    images, annotations, problems = [], [], []
    for f in files:
        status, record, note = verify_one(f, len(names))
        if record is None:
            problems.append(f"{status}\t{f}\t{note}")
            continue
        h, w = record["shape"]
        image_id = len(images) + 1
        images.append({"id": image_id, "file_name": Path(f).relative_to(common).as_posix(), "height": h, "width": w})
        for cls, x1, y1, x2, y2 in record["labels"]:
            bw, bh = (x2 - x1) * w, (y2 - y1) * h
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": int(cls) + 1, "bbox": [round(x1 * w, 3), round(y1 * h, 3), round(bw, 3), round(bh, 3)],
                 "area": round(bw * bh, 3), "iscrowd": 0}
            )  # fmt: skip
    categories = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}, problems
