"""Gone: a COCO json is read as it is; this stub only says how."""

import sys

sys.exit(
    "data/coco2yolo.py is gone: name the json in the dataset yaml and it is read as it is, e.g. "
    "train: {images: images/train2017, json: annotations/instances_train2017.json} (docs/data.md)"
)
