"""cleanlab's side of bench/audit_bench.py, run by the Python of a venv of its own (never a dependency of the repo):

    python3 -m venv cleanlab-venv && cleanlab-venv/bin/pip install cleanlab numpy
    cleanlab-venv/bin/python bench/audit_cleanlab.py IN.json OUT.json [HIGH LOW]

IN.json: {"labels": [{"bboxes": [[x1, y1, x2, y2]], "labels": [c]}], "predictions": [[per class [[x1, y1, x2, y2,
conf]]]]}, one entry per image; OUT.json: cleanlab.object_detection.rank's three per-box subtype scores (lower = more
likely an issue, NaN = not a candidate): overlooked per predicted box (in class order), badloc and swap per label.
HIGH, LOW: its high_probability_threshold (overlooked, swap) and low_probability_threshold (badloc); default its own.
"""

import json
import sys

import numpy as np
from cleanlab.object_detection import rank


def main():
    source, target = sys.argv[1:3]
    given = json.load(open(source))
    labels = [
        {"bboxes": np.array(x["bboxes"], np.float64).reshape(-1, 4), "labels": np.array(x["labels"], int)}
        for x in given["labels"]
    ]
    predictions = [
        np.array([np.array(c, np.float64).reshape(-1, 5) for c in image], dtype=object)
        for image in given["predictions"]
    ]
    high, low = (float(v) for v in sys.argv[3:5]) if len(sys.argv) > 4 else (None, None)  # None: cleanlab's defaults
    given_labels = dict(labels=labels, predictions=predictions)
    scores = {
        "overlooked": rank.compute_overlooked_box_scores(**given_labels, high_probability_threshold=high),
        "badloc": rank.compute_badloc_box_scores(**given_labels, low_probability_threshold=low),
        "swap": rank.compute_swap_box_scores(**given_labels, high_probability_threshold=high),
    }
    quality = rank.get_label_quality_scores(labels, predictions)
    out = {k: [np.asarray(s, np.float64).tolist() for s in v] for k, v in scores.items()}
    out["image_quality"] = np.asarray(quality, np.float64).tolist()
    json.dump(out, open(target, "w"))


if __name__ == "__main__":
    main()
