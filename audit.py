"""Find what is wrong in a dataset's labels: missing boxes, wrong classes, badly placed, spurious and duplicate boxes,
ranked from the most likely, with the model's suggested fix.

    python audit.py --data mydata.yaml --model n --epochs 30 --imgsz 640        # 4 folds: out-of-sample predictions
    python audit.py --data mydata.yaml --folds 0 --weights best.pt              # a trained model, no training
    python audit.py --data mydata.yaml --epochs 30 --print-sweep > folds.yaml   # the folds as a tools/sweep.py grid
    python audit.py --data mydata.yaml --epochs 30 --out runs/audit/exp         # again: stopped folds resume

Every train and val image gets predictions from a model that never trained on it: the images are dealt into --folds
folds, and for each fold train.py trains on the others (with every flag audit.py does not know itself: --model,
--epochs, --weights, ...) and val.py predicts the fold. Each annotated box and each confident prediction no box explains
is scored for each kind of issue (utils/audit/score.py). In the run folder (runs/audit/exp, exp2, ...): issues.csv
(sorted by score), index.html (one row per issue: the crop, the label and the model's box; opens offline) and
corrections/ (the suggested fixes in the dataset's own format: YOLO txt, VOC XML or COCO json; the dataset itself is
never written to). How to read and use them: docs/audit.md.
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from utils.audit.corrections import write_corrections
from utils.audit.folds import (
    fold_of_images,
    fold_state,
    predict_command,
    sweep_spec,
    train_command,
    write_fold_yaml,
    write_workspace,
)
from utils.audit.page import write_issues_csv, write_page
from utils.audit.score import KINDS, score_image
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.labels import MAX_PIXELS, annotated_items, load_verified
from utils.data.records import Records
from utils.general import next_run_dir, setup_logging

REPO = Path(__file__).resolve().parent
parser = argparse.ArgumentParser(
    description="Rank the likely label errors of a dataset (flags it does not know go to train.py)",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    allow_abbrev=False,  # a train.py flag that starts like one of ours (--fi for --fitness) goes to train.py whole
)
parser.add_argument("--data", required=True, help="dataset yaml (YOLO txt, VOC or COCO json splits)")
parser.add_argument("--folds", type=int, default=4, help="K of the K-fold training; 0 = score with --weights as it is")
parser.add_argument("--weights", default="", help="with --folds 0: the trained model; else train.py's --weights")
parser.add_argument("--fold", type=int, default=None, help="train and predict this fold only (a sweep's experiment)")
parser.add_argument("--print-sweep", action="store_true", help="print a tools/sweep.py spec of the folds and exit")
parser.add_argument("--seed", type=int, default=0, help="the split into folds (and train.py's --seed)")
parser.add_argument(
    "--imgsz", type=int, default=0, help="image size for training and prediction (0: train.py's, the checkpoint's)"
)
parser.add_argument("--device", default="", help="cpu, 0, ... (train.py's and val.py's --device)")
parser.add_argument("--min-score", type=float, default=0.1, help="issues scored lower are left out of the outputs")
parser.add_argument("--fix-score", type=float, default=0.5, help="issues from this score are applied in corrections/")
parser.add_argument("--page-rows", type=int, default=500, help="index.html shows the most likely this many issues")
parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS, help="exclude images with more pixels")
parser.add_argument("--out", default="", help="run folder (default runs/audit/exp, exp2, ...); an existing one resumes")
args, train_flags = parser.parse_known_args()
if args.folds == 1 or args.folds < 0:
    sys.exit(f"error: --folds {args.folds}: give 2 or more (each fold's images are predicted by the others' model), "
             "or 0 to score with a trained --weights")  # fmt: skip
if args.folds == 0 and not args.weights:
    sys.exit("error: --folds 0 scores with a trained model: give it as --weights best.pt")

# -----------------------------------------------------------------------------------------------
# The images: every verified train and val image once (excluded ones as train.py excludes them)
try:
    data = load_dataset_yaml(args.data)
    dicts, items, splits = [], {}, {}
    for split in ("train", "val"):
        if not data[split]:
            continue
        for item in annotated_items(data[split]) or []:  # VOC / COCO json: where each image's boxes are written
            items.setdefault(item.image, item)
        for r in load_verified(data[split], data["nc"], split, max_pixels=args.max_pixels):
            if r["im"] not in splits:
                splits[r["im"]] = split
                dicts.append(r)
except DatasetError as e:
    sys.exit(f"error: {e}")
records = Records.from_dicts(dicts)
if not len(records.labels):
    sys.exit(f"error: {data['yaml']} has no box in its {len(records)} train and val images, so nothing to audit")
names, nc = data["names"], data["nc"]

if args.print_sweep:  # the spec's experiments run this script with --fold K and the same folder
    out = Path(args.out or "runs/audit/exp").resolve()
    given, skip = [], False
    for a in sys.argv[1:]:  # every flag but these, which the spec sets itself
        if not skip and a != "--print-sweep" and not a.startswith(("--out", "--fold=")) and a != "--fold":
            given.append(shlex.quote(a))
        skip = a in ("--out", "--fold")
    print(sweep_spec(given, out, args.folds))
    sys.exit(0)
out = Path(args.out) if args.out else next_run_dir("runs/audit/exp")
out.mkdir(parents=True, exist_ok=True)
out = out.resolve()
log = setup_logging(out / "audit.log")
images = write_workspace(records, names, out / "data")  # YOLO-txt links: one dataset yaml format for every fold
log.info(f"{len(records)} images, {len(records.labels)} boxes, {nc} classes; working in {out}")


# -----------------------------------------------------------------------------------------------
# Predictions for every image: one model per fold, trained on the other folds (or --weights on all)
def run_logged(command, log_file):
    """A train.py / val.py subprocess from the repository, its output in log_file; its exit code."""
    with open(log_file, "a") as f:
        return subprocess.run(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode


def read_predictions(val_dir):
    """{image path: (m, 6) x1 y1 x2 y2 confidence class} from val.py's predictions.json and ground_truth.json."""
    truth = json.loads((val_dir / "ground_truth.json").read_text())
    found = {im["id"]: [] for im in truth["images"]}
    for d in json.loads((val_dir / "predictions.json").read_text()):
        x, y, w, h = d["bbox"]
        found[d["image_id"]].append([x, y, x + w, y + h, d["score"], d["category_id"]])
    return {im["file_name"]: np.array(found[im["id"]], np.float64).reshape(-1, 6) for im in truth["images"]}


def predict_fold(weights, fold_yaml, val_dir, log_file):
    """val.py's predictions of one fold (kept on disk: a rerun reads them); None when it failed."""
    if not (val_dir / "predictions.json").exists():
        flags = ["--imgsz", str(args.imgsz), "--conf", "0.001"] + (["--device", args.device] if args.device else [])
        # --imgsz 0: the size the checkpoint was trained at; a low --conf: every box the model half-sees is evidence
        if run_logged(predict_command(sys.executable, weights, fold_yaml, val_dir, flags), log_file):
            return None
    return read_predictions(val_dir)


def train_fold(k, fold_yaml, run):
    """train.py on the other folds, resumed where it stopped; True when its best.pt is complete."""
    if fold_state(run) == "done":
        return True
    own = ["--seed", str(args.seed)] + (["--imgsz", str(args.imgsz)] if args.imgsz else [])
    own += ["--device", args.device] if args.device else []
    flags = own + (["--weights", args.weights] if args.weights else []) + train_flags
    log.info(f"fold {k}: {' '.join(train_command(sys.executable, run, fold_yaml, flags)[1:])}")
    code = run_logged(train_command(sys.executable, run, fold_yaml, flags), run.with_suffix(".log"))
    return code == 0 and fold_state(run) == "done"


predictions, in_sample_note = {}, ""
if args.folds == 0:
    all_yaml = write_fold_yaml(out / "data", names, images, images, "all")
    found = predict_fold(args.weights, all_yaml, out / "predict", out / "predict.log")
    if found is None:
        sys.exit(f"error: val.py could not predict with {args.weights}; its output is in {out / 'predict.log'}")
    predictions.update(found)
    in_sample_note = f"{args.weights} scored its own training images in sample, so it flags fewer issues there"
    log.info(f"note: {in_sample_note}")
else:
    fold = fold_of_images([Path(records.path(i)).name for i in range(len(records))], args.folds, args.seed)
    (out / "folds").mkdir(exist_ok=True)
    split = out / "folds" / "split.json"  # a resumed folder's folds were trained on this split, and no other
    if split.exists() and json.loads(split.read_text()) != {"folds": args.folds, "seed": args.seed}:
        sys.exit(f"error: {out} holds folds of another split ({split.read_text()}); give that --folds and --seed, "
                 "or another --out")  # fmt: skip
    split.write_text(json.dumps({"folds": args.folds, "seed": args.seed}))
    failed = []
    for k in range(args.folds) if args.fold is None else [args.fold]:
        held = [p for p, f in zip(images, fold) if f == k]
        fold_yaml = write_fold_yaml(out / "folds", names, [p for p, f in zip(images, fold) if f != k], held, f"{k}")
        run = out / "folds" / str(k)
        found = predict_fold(run / "weights" / "best.pt", fold_yaml, run / "val", run.with_suffix(".log")) if (
            train_fold(k, fold_yaml, run)) else None  # fmt: skip
        if found is None:
            failed.append(k)
            log.info(f"fold {k} failed ({run.with_suffix('.log')} says why); its {len(held)} images are left out, "
                     "the other folds are kept, and the same command again resumes it")  # fmt: skip
        else:
            predictions.update(found)
    if args.fold is not None:
        sys.exit(1 if failed else 0)
    if len(failed) == args.folds:
        sys.exit(f"error: every fold failed; their logs are in {out / 'folds'}")

by_image = {records.path(i): predictions[p].round(3).tolist() for i, p in enumerate(images) if p in predictions}
(out / "predictions.json").write_text(json.dumps({"names": names, "predictions": by_image}))  # what the scores read

# -----------------------------------------------------------------------------------------------
# Scores: each box and each unexplained prediction, for each kind of issue
issues = []
for i, path in enumerate(images):
    if path not in predictions:
        continue
    h, w = records.shapes[i]
    labels = records.labels_of(i).astype(np.float64) * [1, w, h, w, h]
    ignored = records.ignored_of(i)[:, 1:].astype(np.float64) * [w, h, w, h]
    for issue in score_image(labels, predictions[path], nc, ignored):
        if issue["score"] >= args.min_score:
            issues.append({**issue, "image": records.path(i), "index": i, "split": splits[records.path(i)]})
issues.sort(key=lambda issue: -issue["score"])
counts = ", ".join(f"{sum(issue['kind'] == kind for issue in issues)} {kind}" for kind in KINDS)
log.info(f"{len(issues)} issues scored {args.min_score} or more: {counts}")

write_issues_csv(issues, names, out / "issues.csv")
write_page(issues[: args.page_rows], names, out, in_sample_note)
written = write_corrections(issues, records, items, data, out / "corrections", args.fix_score)
log.info(f"issues.csv and index.html in {out}; {written}")
