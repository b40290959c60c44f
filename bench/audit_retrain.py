"""What fixing the audit's top issues is worth: retrain after the fixes, against as many fixes picked at random.

    python bench/audit_retrain.py --set runs/audit_bench/bccd --out runs/audit_bench/bccd/retrain -- \\
        --model fall_yolov8s.pt --epochs 3 --imgsz 320 --batch 8
    python bench/audit_retrain.py --set runs/audit_bench/bccd --out runs/audit_bench/bccd/retrain --table

A fix is simulated: a reviewer who opens a flagged issue restores the injected original where it lands on an
injected error (a removed box found at IoU 0.5, or a box that was changed, moved or added) and changes nothing
elsewhere. Budget: 5% of the set's boxes, the top of our list or as many issues of the list picked at random (seed 0).
Four trainings on the train split (clean, noisy, fixed by the audit, fixed at random), each scored by val.py on the
clean val split; the table gives each mAP50-95 and the share of the noise's cost each fix recovers.
"""

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.audit_bench import label_index, noisy_labels  # noqa: E402
from bench.audit_inject import read_voc, write_voc  # noqa: E402
from utils.audit.score import box_iou, score_image  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNS = ("clean", "noisy", "audit", "random")


def flagged_errors(issues, labels, truth, names):
    """The indices of the injected errors that these issues land on."""
    by_box, removed = {}, {}
    for n, error in enumerate(truth):
        if error["image"] not in labels:
            continue
        if error["kind"] == "missing":
            removed.setdefault(error["image"], []).append((n, error["original_box"]))
        else:
            j = label_index(labels[error["image"]], error, names)
            if j is not None:
                by_box[(error["image"], j)] = n
    found = set()
    for issue in issues:
        if issue["label"] is not None:
            if (issue["image"], issue["label"]) in by_box:
                found.add(by_box[(issue["image"], issue["label"])])
        elif removed.get(issue["image"]):
            iou = box_iou(np.array([issue["box"]]), np.array([b for _, b in removed[issue["image"]]]))[0]
            if iou.max() >= 0.5:
                found.add(removed[issue["image"]][int(iou.argmax())][0])
    return found


def restored(noisy, truth, fixed, root):
    """{image: [(name, box)]} of the noisy VOC objects (images relative to the copy's `root`, as read_voc keys them)
    with the errors in `fixed` put back as they were."""
    objects = {image: [(name, list(box)) for _, name, box in o] for image, _, _, _, o in noisy}
    for n in sorted(fixed):
        error = truth[n]
        stem = str(Path(error["image"]).absolute().relative_to(root.absolute()))
        voc = lambda box: [box[0] + 1, box[1] + 1, box[2], box[3]]  # noqa: E731  back to VOC's 1-based numbers
        if error["kind"] == "missing":
            objects[stem].append((error["original_class"], voc(error["original_box"])))
            continue
        k = next(
            k for k, (name, box) in enumerate(objects[stem]) if name == error["class"] and box == voc(error["box"])
        )
        if error["kind"] == "spurious":
            objects[stem].pop(k)
        else:
            objects[stem][k] = (error["original_class"], voc(error["original_box"]))
    return objects


def prepare(folder, out):
    """The noisy, audit-fixed and random-fixed VOC copies and their yamls; the number of fixes each got."""
    truth = json.loads((folder / "truth.json").read_text())
    predictions = json.loads((folder / "audit" / "predictions.json").read_text())["predictions"]
    predictions = {k: np.array(v, np.float64).reshape(-1, 6) for k, v in predictions.items()}
    labels, names = noisy_labels(folder / "noisy.yaml", set(predictions))
    issues = [
        {**issue, "image": image}
        for image, rows in labels.items()
        for issue in score_image(rows, predictions[image], len(names))
        if issue["score"] >= 0.1  # audit.py's --min-score: the list a user gets
    ]
    issues.sort(key=lambda issue: -issue["score"])
    budget = math.ceil(0.05 * sum(len(rows) for rows in labels.values()))
    rng = np.random.default_rng(0)
    picks = {"audit": issues[:budget], "random": [issues[i] for i in rng.permutation(len(issues))[:budget]]}
    fixes = {}
    for run, picked in picks.items():
        noisy = read_voc(folder / "noisy")  # afresh: write_voc takes the objects out of these trees
        fixed = flagged_errors(picked, labels, truth["errors"], names)
        write_voc(folder / "noisy", out / run / "voc", noisy, restored(noisy, truth["errors"], fixed, folder / "noisy"))
        (out / run / "data.yaml").write_text(f"voc: {out / run / 'voc'}\nnames: {json.dumps(names)}\n")
        fixes[run] = len(fixed)
    return fixes, budget


def train_and_score(run, data_yaml, clean_yaml, out, flags):
    """train.py on the run's train split, then val.py on the clean val split: mAP50-95 (None when either failed)."""
    folder = out / run
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "train" / "metrics.json").exists():
        command = [sys.executable, "train.py", "--data", str(data_yaml), "--out", str(folder / "train"), *flags]
        if subprocess.run(command, cwd=REPO).returncode:
            return None
    if not (folder / "val" / "metrics.json").exists():
        command = [sys.executable, "val.py", "--weights", str(folder / "train" / "weights" / "best.pt"), "--data",
                   str(clean_yaml), "--out", str(folder / "val")]  # fmt: skip
        if subprocess.run(command, cwd=REPO).returncode:
            return None
    return json.loads((folder / "val" / "metrics.json").read_text())["mAP50-95"]


def table(out):
    results = json.loads((out / "results.json").read_text())
    maps = results["mAP50-95"]
    lines = ["| run | fixes | mAP50-95 (clean val) | noise cost recovered |", "|---|---|---|---|"]
    cost = maps["clean"] - maps["noisy"] if None not in (maps.get("clean"), maps.get("noisy")) else None
    for run in RUNS:
        if maps.get(run) is None:
            continue
        share = (
            "" if cost in (None, 0) or run not in ("audit", "random") else f"{(maps[run] - maps['noisy']) / cost:.0%}"
        )
        lines.append(f"| {run} | {results['fixes'].get(run, '')} | {maps[run]:.3f} | {share} |")
    return "\n".join(lines) + f"\n\nbudget: {results['budget']} issues (5% of the boxes)"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", required=True, help="bench/audit_inject.py's --out, with audit.py's run in audit/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--table", action="store_true", help="print the table of what has run")
    args, flags = parser.parse_known_args()
    flags = [f for f in flags if f != "--"]
    folder, out = Path(args.set).resolve(), Path(args.out).resolve()
    if args.table:
        print(table(out))
        return
    out.mkdir(parents=True, exist_ok=True)
    fixes, budget = prepare(folder, out)
    yamls = {"clean": folder / "clean.yaml", "noisy": folder / "noisy.yaml"}
    yamls.update({run: out / run / "data.yaml" for run in ("audit", "random")})
    maps = {}
    for run in RUNS:
        maps[run] = train_and_score(run, yamls[run], folder / "clean.yaml", out, flags)
        (out / "results.json").write_text(json.dumps({"mAP50-95": maps, "fixes": fixes, "budget": budget}))
        print(table(out), flush=True)


if __name__ == "__main__":
    main()
