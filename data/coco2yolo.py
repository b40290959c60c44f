"""COCO instances json -> YOLO txt labels (one `class cx cy w h` file per image, normalised).

    python data/coco2yolo.py datasets/coco/annotations/instances_val2017.json
        writes datasets/coco/labels/val2017/*.txt (next to images/val2017, where the loader looks)
    python data/coco2yolo.py instances.json --labels my_set/labels/train

Crowd regions are skipped; class i is the i-th category sorted by id. Images without objects get
no file (background). The `names:` block to paste into the dataset yaml is printed at the end.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python data/coco2yolo.py`: find utils/

from utils.coco import coco_to_yolo  # noqa: E402


def default_labels_dir(json_path):
    """<root>/annotations/instances_val2017.json -> <root>/labels/val2017 (the Ultralytics layout)."""
    json_path = Path(json_path).resolve()
    root = json_path.parent.parent if json_path.parent.name == "annotations" else json_path.parent
    return root / "labels" / json_path.stem.removeprefix("instances_")


def main(argv=None):
    parser = argparse.ArgumentParser(description="COCO instances json -> YOLO txt labels")
    parser.add_argument("json", help="COCO instances json (e.g. annotations/instances_val2017.json)")
    parser.add_argument(
        "--labels", default=None, help="output folder for the .txt files (default: <root>/labels/<split>)"
    )
    args = parser.parse_args(argv)
    if not Path(args.json).is_file():
        sys.exit(f"error: {args.json} does not exist")
    labels = Path(args.labels) if args.labels else default_labels_dir(args.json)
    names = coco_to_yolo(args.json, labels)
    count = len(list(labels.glob("*.txt")))
    print(f"{count} label files in {labels}, {len(names)} classes. For the dataset yaml:")
    print("names:\n" + "\n".join(f"  {i}: {n}" for i, n in enumerate(names)))


if __name__ == "__main__":
    main()
