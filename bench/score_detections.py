"""Score another detector's COCO-format detections with this repo's evaluator, so that two repos' mAP
come from the same code: pycocotools, against ground truth built from the YOLO labels of a split.

    python bench/score_detections.py --detections runs/peer/v8n/val/predictions.json --category-offset 1

Each detection's image is found by its `file_name` (Ultralytics writes it) or, failing that, by its
`image_id` read as the image's file stem. Category id minus --category-offset = class index
(Ultralytics writes class + 1 for a custom dataset).
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/score_detections.py`: find utils/

from utils.coco import records_to_coco  # noqa: E402
from utils.data.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.data.labels import load_verified  # noqa: E402
from utils.evaluate import coco_map  # noqa: E402


def score(data_yaml, detections_json, split="val", category_offset=0):
    """pycocotools' (mAP50-95, mAP50) of a COCO-format detections file against the YOLO labels of a split."""
    data = load_dataset_yaml(data_yaml)
    records = load_verified(data[split], data["nc"], split)
    gt = records_to_coco(records, data["names"])  # image id = position in records, category id = class index
    by_name = {Path(r["im"]).name: i for i, r in enumerate(records)}
    by_stem = {Path(r["im"]).stem: i for i, r in enumerate(records)}
    detections, unmatched = [], 0
    for d in json.loads(Path(detections_json).read_text()):
        index = by_name.get(d.get("file_name", ""), by_stem.get(str(d["image_id"])))
        if index is None:
            unmatched += 1
            continue
        detections.append(
            {
                "image_id": index,
                "category_id": int(d["category_id"]) - category_offset,
                "bbox": d["bbox"],
                "score": d["score"],
            }
        )
    if unmatched:
        sys.exit(
            f"error: {unmatched} detections of {detections_json} name no image of the {split} split of {data_yaml}"
        )
    map5095, map50, *_ = coco_map(gt, detections, list(range(data["nc"])))
    return map5095, map50, len(detections), len(records)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO / "data" / "shapes.yaml"))
    parser.add_argument("--split", default="val")
    parser.add_argument(
        "--detections",
        required=True,
        help="COCO-format json: a list of {image_id or file_name, category_id, bbox (x, y, w, h), score}",
    )
    parser.add_argument(
        "--category-offset", type=int, default=0, help="subtracted from category_id to give the class index"
    )
    args = parser.parse_args()
    map5095, map50, n_detections, n_images = score(args.data, args.detections, args.split, args.category_offset)
    print(
        f"{args.detections}: {n_detections} detections on {n_images} images"
        f" | pycocotools mAP50-95 {map5095:.4f} mAP50 {map50:.4f}"
    )


if __name__ == "__main__":
    main()
