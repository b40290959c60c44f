"""The label audit measured on known errors, ours beside cleanlab's, on the same out-of-sample predictions.

    python bench/audit_inject.py --voc ../datasets/BCCD --out runs/audit_bench/bccd          # the known errors
    python audit.py --data runs/audit_bench/bccd/noisy.yaml --out runs/audit_bench/bccd/audit --folds 2 \\
        --imgsz 320 --epochs 3 --batch 8 --model fall_yolov8s.pt                                # the predictions
    python bench/audit_bench.py --set runs/audit_bench/bccd --cleanlab-python cleanlab-venv/bin/python

For each kind of injected error: the average precision of each method's ranking (every annotated box ranked for
wrong class, badly placed and spurious; the candidate boxes of each for missing, found at IoU 0.5 with a removed box)
and the recall within a review budget of 5% of the set's boxes (the top of the list a person would check). cleanlab's
subtypes: overlooked (missing), swap (wrong class), badloc (badly placed; and spurious, which it has no subtype of:
a box with nothing there scores low on badloc), with its default thresholds and with them lowered to 0.5 / 0.25
(cleanlab-0.5: its 0.95 is rarely reached by a small model). Prints one markdown table; writes SET/measured.json.
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.audit.score import box_iou, score_image  # noqa: E402
from utils.data.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.data.labels import load_verified  # noqa: E402

KINDS = ("missing", "wrong_class", "badly_placed", "spurious")
LOOSER = (0.5, 0.25)  # cleanlab's thresholds lowered to where this small model is sure: high 0.5, low 0.25
CLEANLAB = {"missing": "overlooked", "wrong_class": "swap", "badly_placed": "badloc", "spurious": "badloc"}


def noisy_labels(yaml_path, images):
    """{image: (n, 5) class x1 y1 x2 y2 pixels} of the audited images, read as audit.py reads them."""
    data = load_dataset_yaml(yaml_path)
    labels = {}
    for split in ("train", "val"):
        for r in load_verified(data[split], data["nc"], split):
            if r["im"] in images:
                h, w = r["shape"]
                labels[r["im"]] = np.asarray(r["labels"], np.float64).reshape(-1, 5) * [1, w, h, w, h]
    return labels, data["names"]


def label_index(rows, error, names):
    """The index of the injected box among the image's labels (same class, corners within 1 px), or None."""
    for j, row in enumerate(rows):
        if names[int(row[0])] == error["class"] and np.abs(row[1:] - error["box"]).max() <= 1:
            return j
    return None


def average_precision(hits, positives):
    """AP of a ranking: hits (bool, best first), out of `positives` (the ones never ranked count as missed)."""
    hits = np.asarray(hits, bool)
    if not positives:
        return float("nan")
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(precision[hits].sum() / positives)


def rank_boxes(scores, positives, budget):
    """(AP, recall in the top `budget`) of per-box scores {(image, j): score} against the set of positive boxes."""
    order = sorted(scores, key=lambda key: -scores[key])
    hits = [key in positives for key in order]
    return average_precision(hits, len(positives)), sum(hits[:budget]) / max(len(positives), 1)


def rank_found(candidates, removed, budget):
    """(AP, recall in the top `budget`) of candidate boxes [(score, image, box)] finding the removed boxes at IoU
    0.5, each removed box found once."""
    found, hits = set(), []
    for _, image, box in sorted(candidates, key=lambda c: -c[0]):
        originals = removed.get(image, [])
        hit = False
        if originals:
            iou = box_iou(np.array([box]), np.array(originals))[0]
            for k in np.argsort(-iou):
                if iou[k] < 0.5:
                    break
                if (image, int(k)) not in found:
                    found.add((image, int(k)))
                    hit = True
                    break
        hits.append(hit)
    total = sum(len(v) for v in removed.values())
    return average_precision(hits, total), sum(hits[:budget]) / max(total, 1)


def ours(labels, predictions, nc):
    """Our scores: {kind: {(image, j): score}} for box kinds, and missing as [(score, image, box)]."""
    boxes = {kind: {} for kind in KINDS if kind != "missing"}
    missing = []
    for image, rows in labels.items():
        for key in boxes:  # a box the model has no match for gets no badly-placed score: it ranks last there
            boxes[key].update({(image, j): 0.0 for j in range(len(rows))})
        for issue in score_image(rows, predictions[image], nc):
            if issue["kind"] == "missing":
                missing.append((issue["score"], image, issue["box"]))
            elif issue["kind"] in boxes:
                boxes[issue["kind"]][(image, issue["label"])] = issue["score"]
    return boxes, missing


def cleanlab(labels, predictions, nc, python, thresholds=()):
    """cleanlab's scores on the same predictions, turned so that higher = more likely (1 - its score)."""
    images = list(labels)
    given = {
        "labels": [{"bboxes": labels[i][:, 1:].tolist(), "labels": labels[i][:, 0].astype(int).tolist()}
                   for i in images],
        "predictions": [
            [predictions[i][predictions[i][:, 5] == c, :5].tolist() for c in range(nc)] for i in images
        ],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.json", Path(tmp) / "out.json"
        source.write_text(json.dumps(given))
        script = str(Path(__file__).parent / "audit_cleanlab.py")
        subprocess.run([python, script, source, target, *map(str, thresholds)], check=True)
        scores = json.loads(target.read_text())
    boxes = {kind: {} for kind in KINDS if kind != "missing"}
    missing = []
    for n, image in enumerate(images):
        for kind in boxes:
            for j, s in enumerate(scores[CLEANLAB[kind]][n]):
                boxes[kind][(image, j)] = 1 - s if s is not None and not math.isnan(s) else -1.0
        flat = [box for c in range(nc) for box in given["predictions"][n][c]]
        for box, s in zip(flat, scores["overlooked"][n]):
            if s is not None and not math.isnan(s):
                missing.append((1 - s, image, box[:4]))
    return boxes, missing


def measure(labels, names, truth, predictions, cleanlab_python):
    """{method: {kind: (AP, recall at 5%)}} and the count of each injected kind among the audited images."""
    positives = {kind: set() for kind in KINDS}
    removed = {}
    for error in truth:
        if error["image"] not in labels:
            continue  # a test-split image: not audited
        if error["kind"] == "missing":
            removed.setdefault(error["image"], []).append(error["original_box"])
            positives["missing"].add((error["image"], len(removed[error["image"]])))
        else:
            j = label_index(labels[error["image"]], error, names)
            if j is not None:
                positives[error["kind"]].add((error["image"], j))
    budget = math.ceil(0.05 * sum(len(rows) for rows in labels.values()))
    methods = {"ours": ours(labels, predictions, len(names))}
    if cleanlab_python:
        methods["cleanlab"] = cleanlab(labels, predictions, len(names), cleanlab_python)
        methods["cleanlab-0.5"] = cleanlab(labels, predictions, len(names), cleanlab_python, LOOSER)
    results = {}
    for method, (boxes, missing) in methods.items():
        results[method] = {"missing": rank_found(missing, removed, budget)}
        for kind in boxes:
            results[method][kind] = rank_boxes(boxes[kind], positives[kind], budget)
    return results, {kind: len(v) for kind, v in positives.items()}, budget


def table(name, results, counts, budget):
    methods = ("ours", "cleanlab", "cleanlab-0.5")
    lines = [
        f"| set | kind | injected | AP: {' / '.join(methods)} | recall in the top 5% ({budget} boxes): same order |",
        "|---|---|---|---|---|",
    ]
    for kind in KINDS:
        figures = [results.get(m, {}).get(kind, (float("nan"),) * 2) for m in methods]
        ap = " / ".join(f"{f[0]:.3f}" for f in figures)
        recall = " / ".join(f"{f[1]:.3f}" for f in figures)
        lines.append(f"| {name} | {kind} | {counts[kind]} | {ap} | {recall} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", required=True, help="bench/audit_inject.py's --out (truth.json, noisy.yaml)")
    parser.add_argument("--audit", default="", help="audit.py's run folder (default SET/audit)")
    parser.add_argument("--cleanlab-python", default="", help="the Python of a venv with cleanlab (empty: ours only)")
    args = parser.parse_args()
    folder = Path(args.set)
    audit = Path(args.audit or folder / "audit")
    predictions = json.loads((audit / "predictions.json").read_text())["predictions"]
    predictions = {k: np.array(v, np.float64).reshape(-1, 6) for k, v in predictions.items()}
    labels, names = noisy_labels(folder / "noisy.yaml", set(predictions))
    truth = json.loads((folder / "truth.json").read_text())["errors"]
    results, counts, budget = measure(labels, names, truth, predictions, args.cleanlab_python)
    (folder / "measured.json").write_text(json.dumps({"results": results, "counts": counts, "budget": budget}))
    print(table(folder.name, results, counts, budget))


if __name__ == "__main__":
    main()
