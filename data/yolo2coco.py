"""YOLO images + txt labels (or any split a dataset yaml reads: a Pascal VOC one too) -> one COCO instances json
(for pycocotools, annotation tools, other repos). Training needs no conversion: a dataset yaml reads VOC and COCO
json where they lie.

    python data/yolo2coco.py --data data/shapes.yaml --split val --out instances_val.json
    python data/yolo2coco.py --images my_set/images/val --names cat dog --out instances_val.json

Every image is verified as for training; broken ones are left out and listed. Image and annotation
ids start at 1; category id = YOLO class index (0..nc-1), as in val.py's and detect.py's
predictions.json; file_name is relative to the images' common folder. A VOC set's difficult boxes are
written as iscrowd=1 (regions pycocotools ignores).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python data/yolo2coco.py`: find utils/

from utils.coco import yolo_to_coco  # noqa: E402
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description="YOLO images + txt labels -> COCO instances json")
    parser.add_argument("--data", help="dataset yaml (gives the images of --split and the names)")
    parser.add_argument("--split", default="val", choices=["train", "val", "test"])
    parser.add_argument("--images", nargs="+", help="image folders or .txt lists (instead of --data)")
    parser.add_argument("--names", nargs="+", help="class names in index order (with --images)")
    parser.add_argument("--out", required=True, help="the json to write")
    args = parser.parse_args(argv)
    try:
        if args.data:
            data = load_dataset_yaml(args.data)
            sources, names = data[args.split], data["names"]
            if not sources:
                raise DatasetError(f"{args.data} has no '{args.split}' split")
        elif args.images and args.names:
            sources, names = args.images, args.names
        else:
            raise DatasetError("give either --data (and --split) or --images and --names")
        coco, problems = yolo_to_coco(sources, names)
    except DatasetError as e:
        sys.exit(f"error: {e}")
    if not coco["images"]:
        sys.exit(f"error: no usable image in {', '.join(map(str, sources))}")
    for p in problems:
        print("left out: " + p.replace("\t", "  "), file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(coco))
    print(
        f"{out}: {len(coco['images'])} images, {len(coco['annotations'])} boxes, {len(names)} categories"
        + (f", {len(problems)} images left out" if problems else "")
    )


if __name__ == "__main__":
    main()
