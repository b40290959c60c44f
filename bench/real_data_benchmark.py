"""Real photos side by side: this repo's train.py and Ultralytics on a Pascal VOC dataset (BCCD, blood cells), under
the same recipe or each repo's defaults, at several seeds and epoch budgets, every model scored by pycocotools
against one ground truth.

    # the first cells: YOLOv8n on both sides, same recipe, 20 epochs, seed 0, 320 px
    python bench/real_data_benchmark.py --voc ../datasets/BCCD --runs ours-n peer-v8n --seeds 0 --epochs 20
    # the full grid (cells already run are skipped, so it can be stopped and started again)
    python bench/real_data_benchmark.py --voc ../datasets/BCCD --runs ours-n peer-v8n ours-11n peer-11n \\
        ours-n-defaults peer-v8n-defaults --seeds 0 1 2 --epochs 20 40 --imgsz 320
    # the table of what has run so far
    python bench/real_data_benchmark.py --table
    # distillation: an s teacher fine-tuned here, converted (bench/to_ultralytics.py) so both repos use that file
    python bench/real_data_benchmark.py --voc ../datasets/BCCD --runs ours-n ours-n-kd peer-v8n peer-v8n-kd \\
        --teacher bccd_s_teacher.pt --seeds 0 1 2 --epochs 40 --imgsz 320
    # another set, from a dataset yaml of ours (real_suite.py writes one per set: OUT/<set>/data/data.yaml)
    python bench/real_data_benchmark.py --data runs/real_suite/cards/data/data.yaml --out runs/real_data/cards ...

The dataset is read where it lies and nothing is written into its folder. This repo trains through a dataset yaml
written to OUT/data/voc.yaml (`voc: FOLDER`: ImageSets/Main/train.txt and val.txt as published, utils/data/voc.py).
Ultralytics cannot read VOC, so it gets OUT/data/yolo: the images as symlinks and YOLO txt labels written from the
very records this repo trains on (the same images, the same boxes; `difficult` ones left out of training as on our
side; a box the reader refuses takes the same way on both). The ground truth, OUT/data/val_gt.json, is built once
from the VOC val annotations, `difficult` boxes as ignored regions (iscrowd, as VOC's evaluation ignores them).

Scoring: each side's own inference writes its detections of the val images to COCO json at conf 0.001, NMS IoU 0.7,
at most 300 per image (val.py --save-json; Ultralytics' validator with save_json, whose defaults these are), and
utils/evaluate.coco_map (pycocotools) scores both against val_gt.json: mAP50-95, mAP50 and AP per class. Neither
repo's own metric is compared (each result.json keeps it as "own" for a cross-check). Weights: those after the last
epoch (no validation between epochs on either side, as in bench/recipe_benchmark.py, whose train_command runs both).

Runs: "ours-*" / "peer-*" under the same recipe (AdamW lr0 0.002; batch, imgsz, epochs as given; warmup 3 epochs,
mosaic closed for the last 10 epochs and EMA are both repos' defaults; Ultralytics accumulates to 64 images per step,
our AdamW steps after every batch: --ours-args "--nominal-batch 64" gives the cells of ours the settings of the
figures measured before 2026-11-26, a run's own flags still winning); "*-defaults": each repo's
own choice at that imgsz, batch and epochs (ours: --optimizer auto = AdamW 0.002 below 10k iterations, the same as
the recipe; Ultralytics: optimizer=auto = AdamW at 0.002 * 5 / (4 + nc)). Ultralytics runs in its own venv
(bench/peer_env.sh DIR; --peer-python DIR/bin/python or PEER_PYTHON).

Fine-tuning: --weights FILE (a .pt of ours or Ultralytics') and the *-ft runs: both repos start from that file's
architecture and tensors (the class convolutions fresh when the class count differs); "ours-ft-*" are variants of
what a fine-tuning run could do differently. --device 0 --jobs N trains N cells at once on one GPU (fp32 both).

Results: OUT/<run>/<imgsz>px/e<epochs>/s<seed>/result.json; the table in OUT/table.md.
"""

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/real_data_benchmark.py`: find utils/ and bench/

from bench.peer import find_peer_python  # noqa: E402
from bench.recipe_benchmark import RECIPE, is_nms_free, run_logged, train_command  # noqa: E402
from models.yolo import E2E  # noqa: E402
from utils.coco import records_to_coco  # noqa: E402
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml  # noqa: E402
from utils.data.labels import load_verified  # noqa: E402
from utils.evaluate import coco_map  # noqa: E402
from utils.general import write_text_atomic  # noqa: E402

SAME = ["optimizer=AdamW", "lr0=0.002"]  # Ultralytics' spelling of RECIPE
BACKBONE = "stem,down2,stage2,down3,stage3,down4,stage4,down5,stage5,sppf"  # --freeze prefixes (models/yolo.py)
# name: (repo, extra arguments): train.py flags for this repo, train() settings for Ultralytics (--model: the file)
RUNS = {
    "ours-n": ("ours", RECIPE),
    "peer-v8n": ("peer", SAME),
    "peer-v8n-nbs16": ("peer", [*SAME, "nbs=16"]),  # Ultralytics with an optimizer step per batch too
    "ours-11n": ("ours", [*RECIPE, "--model", "11n"]),
    "peer-11n": ("peer", ["--model", "yolo11n.yaml", *SAME]),
    "ours-n-defaults": ("ours", []),
    "peer-v8n-defaults": ("peer", []),
    "ours-11n-defaults": ("ours", ["--model", "11n"]),
    "peer-11n-defaults": ("peer", ["--model", "yolo11n.yaml"]),
    "ours-n-clsw": ("ours", [*RECIPE, "--cls-weights", "auto"]),  # the rare class (platelets) weighted up
    "ours-n-nb64": ("ours", [*RECIPE, "--nominal-batch", "64"]),  # a step per 64 images (the old default)
    "ours-n-lr4": ("ours", [*RECIPE, "--lr0", "0.004"]),  # twice the rate: from scratch, with a step per batch
    "ours-n-lr1": ("ours", [*RECIPE, "--lr0", "0.001"]),  # half of it
    # an EMA that averages a short run's last epochs: its decay reaches 0.98 by the 520th update, not 0.23
    "ours-n-ema130": ("ours", [*RECIPE, "--ema-tau", "130"]),
    "ours-n-ms": ("ours", [*RECIPE, "--multi-scale"]),  # the image size varied +/-50% per batch
    "ours-n-scale25": ("ours", [*RECIPE, "--scale", "0.25"]),  # a milder scale jitter: cells have one magnification
    "ours-n-scale75": ("ours", [*RECIPE, "--scale", "0.75"]),  # a stronger one: 204 photos to learn from
    # AdamW's decay made felt (0.0005 * lr 0.002 shrinks a weight by 1e-6 a step), a cosine rate, mosaic closed
    # for the second half
    "ours-n-wd05": ("ours", [*RECIPE, "--weight-decay", "0.05"]),
    "ours-n-cos": ("ours", [*RECIPE, "--schedule", "cosine"]),
    "ours-n-close20": ("ours", [*RECIPE, "--close-mosaic", "20"]),
    # NMS-free (YOLO26n and 11n-e2e): scored as they answer and again with --nms
    "ours-26n": ("ours", [*RECIPE, "--model", "26n"]),
    "ours-26n-dfl": ("ours", [*RECIPE, "--model", "26n", "--reg-max", "16"]),  # DFL and 11n's 64-wide box branch
    **{f"ours-{name}": ("ours", [*RECIPE, "--model", name]) for name in E2E},
    # fine-tuning --weights FILE (its architecture, its tensors; the class convolutions are new: 3 classes here)
    "ours-ft": ("ours", ["--model", "{weights}"]),  # our defaults: a fine-tuning run's lr0 (utils/settings.py)
    "ours-ft-scratch": ("ours", ["--model", "{weights}", "--scratch-recipe"]),  # a scratch run's: lr0 0.002
    "peer-ft": ("peer", ["--model", "{weights}", "pretrained=True"]),  # False would build the architecture only
    "peer-ft-same": ("peer", ["--model", "{weights}", "pretrained=True", *SAME]),
    # what a fine-tuning run could do differently: no warmup, an optimizer step per batch, a lower rate, a frozen
    # backbone, less mosaic
    "ours-ft-warmup0": ("ours", ["--model", "{weights}", "--warmup-epochs", "0"]),
    "ours-ft-nb16": ("ours", ["--model", "{weights}", "--nominal-batch", "16"]),
    "ours-ft-w0-nb16": ("ours", ["--model", "{weights}", "--warmup-epochs", "0", "--nominal-batch", "16"]),
    "ours-ft-w0-nb16-lr1e-3": ("ours", ["--model", "{weights}", "--warmup-epochs", "0", "--nominal-batch", "16",
                                        "--lr0", "0.001"]),
    "ours-ft-w1": ("ours", ["--model", "{weights}", "--warmup-epochs", "1"]),
    "ours-ft-freeze": ("ours", ["--model", "{weights}", "--freeze", BACKBONE]),
    "ours-ft-close3": ("ours", ["--model", "{weights}", "--close-mosaic", "3"]),
    # Ultralytics' optimizer=auto choice here: AdamW at 0.002 * 5 / (4 + classes), beta1 0.9, biases not warmed up
    "ours-ft-auto": ("ours", ["--model", "{weights}", "--lr0", "0.00143", "--momentum", "0.9",
                              "--warmup-bias-lr", "0"]),
    "ours-ft-lr143": ("ours", ["--model", "{weights}", "--lr0", "0.00143"]),  # its rate alone
    "ours-ft-lr100": ("ours", ["--model", "{weights}", "--lr0", "0.001"]),  # lower still
    "ours-ft-bias0": ("ours", ["--model", "{weights}", "--warmup-bias-lr", "0"]),  # its bias warmup alone
    # the fine-tuning default until 2026-11-28: biases warmed up from 0.1, as in a scratch run; and from 0.01
    "ours-ft-bias01": ("ours", ["--model", "{weights}", "--warmup-bias-lr", "0.1"]),
    "ours-ft-bias001": ("ours", ["--model", "{weights}", "--warmup-bias-lr", "0.01"]),
    # an EMA that averages a short run's last updates (the usual ramp to 0.9999 over 2000 updates keeps a 10-epoch
    # fine-tune's 62 to 130 updates almost unaveraged), and a milder scale jitter
    "ours-ft-ema90": ("ours", ["--model", "{weights}", "--ema-decay", "0.9", "--ema-tau", "5"]),
    "ours-ft-ema95": ("ours", ["--model", "{weights}", "--ema-decay", "0.95", "--ema-tau", "5"]),
    "ours-ft-scale25": ("ours", ["--model", "{weights}", "--scale", "0.25"]),
    # knowledge distillation from --teacher (an Ultralytics .pt, bench/to_ultralytics.py: the very same file teaches
    # both sides): ours with --teacher and its default --distill-gain, Ultralytics with distill_model and its default
    # dis; from scratch, and fine-tuned from --weights
    "ours-n-kd": ("ours", [*RECIPE, "--teacher", "{teacher}"]),
    "peer-v8n-kd": ("peer", [*SAME, "distill_model={teacher}"]),
    "ours-ft-kd": ("ours", ["--model", "{weights}", "--teacher", "{teacher}"]),
    "peer-ft-kd": ("peer", ["--model", "{weights}", "pretrained=True", "distill_model={teacher}"]),
}  # fmt: skip
PAIRS = [("ours-n", "peer-v8n"), ("ours-11n", "peer-11n"), ("ours-n-defaults", "peer-v8n-defaults")]
PAIRS += [("ours-11n-defaults", "peer-11n-defaults"), ("ours-ft", "peer-ft"), ("ours-ft", "peer-ft-same")]
PAIRS += [("ours-n-kd", "peer-v8n-kd"), ("ours-ft-kd", "peer-ft-kd")]
CONF, IOU, MAX_DET = 0.001, 0.7, 300  # Ultralytics' validator defaults; passed to val.py explicitly


def prepare(voc, data_dir):
    """Write OUT/data: voc.yaml (ours), the YOLO txt copy and yolo.yaml (Ultralytics), val_gt.json (the ground
    truth). Returns (voc.yaml, yolo.yaml, names, {split: image count})."""
    data_dir.mkdir(parents=True, exist_ok=True)
    voc_yaml = data_dir / "voc.yaml"
    voc_yaml.write_text(f"voc: {Path(voc).resolve()}\n")
    return prepare_yaml(voc_yaml, data_dir, f"--voc {voc}")


def prepare_yaml(data_yaml, data_dir, what):
    """The same for any dataset yaml of ours (VOC, COCO json, YOLO txt): the train and val records it reads become
    data_dir/yolo (Ultralytics' copy) and data_dir/val_gt.json. what: how an error names the dataset."""
    try:
        data = load_dataset_yaml(data_yaml)
        splits = {s: load_verified(data[s], data["nc"], s) for s in ("train", "val")}
    except DatasetError as e:
        sys.exit(f"{what}: {e}")
    names = data["names"]
    for split, records in splits.items():
        write_yolo_split(records, data_dir / "yolo", split)
    yolo_yaml = data_dir / "yolo.yaml"
    write_if_changed(
        yolo_yaml,
        f"path: {(data_dir / 'yolo').resolve()}\ntrain: images/train\nval: images/val\nnames: {json.dumps(names)}\n",
    )
    val = splits["val"]
    gt = records_to_coco(val, names, file_names=[Path(r["im"]).name for r in val], first_image_id=1, decimals=3)
    write_if_changed(data_dir / "val_gt.json", json.dumps(gt))
    return data_yaml, yolo_yaml, names, {s: len(r) for s, r in splits.items()}


def write_if_changed(path, text):
    """True if path now holds text and did not before. A second suite started beside a running one prepares the same
    set again: rewriting what a running cell reads (or deleting it first) broke the cell; a changed file is replaced
    whole, never seen half written."""
    if path.is_file() and path.read_text() == text:
        return False
    write_text_atomic(path, text)
    return True


def write_yolo_split(records, root, split):
    """images/<split>/<name> -> the image, labels/<split>/<stem>.txt: the records' training boxes as YOLO rows; what
    is there already and right stays as it is (write_if_changed), what the records lack goes."""
    images, labels = root / "images" / split, root / "labels" / split
    links = {Path(r["im"]).name: Path(r["im"]).resolve() for r in records}
    texts = {
        f"{Path(r['im']).stem}.txt": "".join(
            f"{int(c)} {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f}\n"
            for c, x1, y1, x2, y2 in (map(float, row) for row in r["labels"])
        )
        for r in records
    }
    changed = False
    for folder, wanted in ((images, links), (labels, texts)):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if old.name not in wanted:  # another --voc must not leave images behind
                old.unlink(missing_ok=True)  # or a suite beside this one removed it first
                changed = True
    for name, target in links.items():
        link = images / name
        if not (link.is_symlink() and link.readlink() == target):
            link.unlink(missing_ok=True)
            link.symlink_to(target)
            changed = True
    for name, text in texts.items():
        changed = write_if_changed(labels / name, text) or changed
    if changed:  # Ultralytics' label cache of the old files
        for cache in root.glob("labels/*.cache"):
            cache.unlink(missing_ok=True)


def predict_ours(cell, voc_yaml, imgsz, device, nms=False):
    """Our detections of the val images from val.py --save-json on best.pt (the final epoch's weights: validated
    only once), as (file name, detection) pairs; and val.py's own mAP50-95. nms: a YOLO26 model's one-to-many
    branch and NMS answer instead of its one-to-one branch (val.py --nms)."""
    val = cell / ("val_nms" if nms else "val")
    command = [sys.executable, "val.py", "--weights", str(cell / "train" / "weights" / "best.pt")]
    command += ["--data", str(voc_yaml), "--imgsz", str(imgsz), "--conf", str(CONF), "--iou", str(IOU)]
    command += ["--max-det", str(MAX_DET), "--save-json", "--workers", "2", "--device", str(device)]
    command += ["--out", str(val), *(["--nms"] if nms else [])]
    run_logged(command, cell / f"log_{val.name}.txt")
    detections = json.loads((val / "predictions.json").read_text())
    own = json.loads((val / "metrics.json").read_text())["mAP50-95"]
    coco_json = load_dataset_yaml(voc_yaml)["coco_jsons"]["val"]
    if coco_json is None:  # val.py wrote the ground truth it scored against, category id = class index
        images = json.loads((val / "ground_truth.json").read_text())["images"]
    else:  # a val split of one COCO json: val.py scored against it, with its image and category ids
        images = json.loads(Path(coco_json.json).read_text())["images"]
        detections = [{**d, "category_id": coco_json.category_ids.index(d["category_id"])} for d in detections]
    file_of = {im["id"]: Path(im["file_name"]).name for im in images}
    return [(file_of[d["image_id"]], d) for d in detections], own


def predict_peer(cell):
    """Ultralytics' detections of the val images (its validator, save_json, on best.pt = the final epoch's weights
    when it validates only after the last), as (file name, detection) pairs with class indices; its own mAP50-95."""
    summary = json.loads((cell / "peer" / "summary.json").read_text())
    found = []
    for d in json.loads(Path(summary["predictions"]).read_text()):
        name = d.get("file_name") or f"{d['image_id']}.jpg"
        found.append((Path(name).name, {**d, "category_id": int(d["category_id"]) - 1}))  # it writes class + 1
    return found, summary["mAP50-95"]


def score(gt_path, named_detections, names):
    """pycocotools' mAP50-95, mAP50 and AP per class of (file name, detection) pairs against val_gt.json."""
    gt = json.loads(Path(gt_path).read_text())
    by_name = {im["file_name"]: im["id"] for im in gt["images"]}
    unknown = sorted({name for name, _ in named_detections if name not in by_name})
    if unknown:
        sys.exit(f"{len(unknown)} images with detections are not in {gt_path}, e.g. {unknown[0]}")
    detections = [
        {"image_id": by_name[name], "category_id": int(d["category_id"]), "bbox": d["bbox"], "score": d["score"]}
        for name, d in named_detections
    ]
    map5095, map50, ap, ap50, _ = coco_map(gt, detections, list(range(len(names))), max_det=MAX_DET)
    per_class = {n: {"AP50-95": round(float(a), 5), "AP50": round(float(b), 5)} for n, a, b in zip(names, ap, ap50)}
    return {"mAP50-95": round(map5095, 5), "mAP50": round(map50, 5), "per_class": per_class}


def run_cell(run, data, epochs, seed, cell, args):
    repo, flags = RUNS[run]
    extra = [a.format(weights=args.weights, teacher=getattr(args, "teacher", "")) for a in flags]
    extra = [*args.ours_args, *extra] if repo == "ours" else [*extra, *getattr(args, "peer_args", [])]
    data_yaml = data["voc_yaml"] if repo == "ours" else data["yolo_yaml"]
    imgsz, batch = args.imgsz, args.batch
    command = train_command(repo, extra, data_yaml, epochs, seed, cell, args.peer_python, imgsz, batch, args.device)
    start = time.perf_counter()
    run_logged(command, cell / "log.txt")
    seconds = time.perf_counter() - start
    named, own = predict_ours(cell, data["voc_yaml"], imgsz, args.device) if repo == "ours" else predict_peer(cell)
    result = score(data["gt"], named, data["names"])
    if is_nms_free(flags):  # the same weights with NMS, as Ultralytics' nms=True on YOLO26
        result["nms"] = score(
            data["gt"], predict_ours(cell, data["voc_yaml"], imgsz, args.device, True)[0], data["names"]
        )
    result.update(seconds=round(seconds, 1), own={"mAP50-95": own}, detections=len(named), command=command)
    result.update(epochs=epochs, seed=seed, imgsz=imgsz, batch=batch, images=data["counts"], device=args.device)
    (cell / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def run_and_report(run, epochs, seed, data, out, args, prefix=""):
    cell = out / run / f"{args.imgsz}px" / f"e{epochs}" / f"s{seed}"
    if (cell / "result.json").exists():
        return
    label = f"{prefix}{run} {args.imgsz} px {epochs} epochs seed {seed}"
    if cell.exists():  # stopped part-way in an earlier sitting: its half-trained run would be resumed or clash
        print(f"{label}: stopped before, started again", flush=True)
        shutil.rmtree(cell)
    cell.mkdir(parents=True)
    try:
        r = run_cell(run, data, epochs, seed, cell, args)
    except subprocess.CalledProcessError:  # one failed cell does not stop the others: its log says why
        print(f"{label}: failed, see {cell}/log*.txt", flush=True)
        return
    classes = ", ".join(f"{n} {v['AP50-95']:.3f}" for n, v in r["per_class"].items())
    print(f"{label}: mAP50-95 {r['mAP50-95']:.4f} mAP50 {r['mAP50']:.4f} ({classes}; {r['seconds']:.0f} s)", flush=True)


def mean_std(values, digits=3):
    spread = f" +/- {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{digits}f}{spread}"


def table(out):
    """Markdown, one table per image size: a row per run and epoch budget with mAP50-95, mAP50, AP50-95 per class
    (mean +/- sample std over seeds) and the training minutes; then the ratio ours / peer of the mAP50-95 means."""
    cells = {}
    for path in sorted(out.glob("*/*px/e*/s*/result.json")):
        run, imgsz, epochs = path.parts[-5], int(path.parts[-4][:-2]), int(path.parts[-3][1:])
        result = json.loads(path.read_text())
        cells.setdefault((imgsz, run, epochs), []).append(result)
        if "nms" in result:  # a YOLO26 cell scored a second time, with NMS
            cells.setdefault((imgsz, f"{run} +NMS", epochs), []).append({**result, **result["nms"]})
    if not cells:
        return f"no results under {out} yet: run the benchmark without --table first\n"
    names = list(next(iter(cells.values()))[0]["per_class"])
    lines = []
    for imgsz in sorted({k[0] for k in cells}):
        lines += [f"\n{imgsz} px: pycocotools on the val split, mean +/- std over seeds (n)\n"]
        lines += ["| run | epochs | seeds | mAP50-95 | mAP50 | " + " | ".join(f"AP {n}" for n in names) + " | min |"]
        lines += ["|---" * (6 + len(names)) + "|"]
        known = list(RUNS)  # a folder of a run that is no longer defined goes last
        order = lambda kv: (known.index(r) if (r := kv[0][1].split()[0]) in known else len(known), kv[0])  # noqa: E731
        for (size, run, epochs), results in sorted(cells.items(), key=order):
            if size != imgsz:
                continue
            row = [run, str(epochs), str(len(results))]
            row += [mean_std([r[key] for r in results]) for key in ("mAP50-95", "mAP50")]
            row += [mean_std([r["per_class"][n]["AP50-95"] for r in results]) for n in names]
            row.append(mean_std([r["seconds"] / 60 for r in results], 1))
            lines.append("| " + " | ".join(row) + " |")
        for ours, peer in PAIRS:
            for epochs in sorted({k[2] for k in cells if k[0] == imgsz}):
                a, b = cells.get((imgsz, ours, epochs)), cells.get((imgsz, peer, epochs))
                peer_mean = statistics.mean(r["mAP50-95"] for r in b) if b else 0
                if a and peer_mean:
                    ratio = statistics.mean(r["mAP50-95"] for r in a) / peer_mean
                    lines.append(f"| {ours} / {peer} (mAP50-95 means) | {epochs} | | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voc", help="the Pascal VOC folder (Annotations/, JPEGImages/, ImageSets/Main/)")
    parser.add_argument("--data", help="instead of --voc: a dataset yaml of ours (VOC, COCO json, YOLO txt)")
    parser.add_argument("--runs", nargs="+", default=["ours-n", "peer-v8n"], choices=list(RUNS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", nargs="+", type=int, default=[20, 40])
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", default=str(REPO / "runs" / "real_data"))
    parser.add_argument("--peer-python", help="the python of bench/peer_env.sh DIR (default: $PEER_PYTHON)")
    parser.add_argument("--weights", default="", help="the pretrained .pt that the *-ft runs fine-tune")
    parser.add_argument("--teacher", default="", help="the .pt that the *-kd runs distil from (both sides)")
    parser.add_argument("--device", default="cpu", help="cpu or a GPU index; fp32 on both sides either way")
    parser.add_argument("--jobs", type=int, default=1, help="cells at once (on a GPU: several share it)")
    parser.add_argument("--table", action="store_true", help="only print the table of the cells run so far")
    parser.add_argument(
        "--ours-args", type=shlex.split, default=[], help="train.py flags added to every cell of ours (not one it sets)"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if not args.table:
        if args.data and not Path(args.data).is_file():
            sys.exit(f"--data {args.data}: no such dataset yaml")
        if not args.data and (not args.voc or not Path(args.voc).is_dir()):
            sys.exit(f"--voc {args.voc}: give the Pascal VOC folder (Annotations/, JPEGImages/, ImageSets/Main/)")
        if any(run.startswith(("ours-ft", "peer-ft")) for run in args.runs) and not Path(args.weights).is_file():
            sys.exit(f"--weights {args.weights!r}: the *-ft runs fine-tune this .pt; give an existing file")
        for run in args.runs:  # a run's own flags win over --ours-args: say so rather than run the same cell twice
            clash = [a for a in args.ours_args if a.startswith("--") and a in RUNS[run][1] and RUNS[run][0] == "ours"]
            if clash:
                sys.exit(
                    f"--ours-args {' '.join(clash)}: run {run} sets it itself, and its value wins; add a run to RUNS"
                )
        if any(run.endswith("-kd") for run in args.runs) and not Path(args.teacher).is_file():
            sys.exit(f"--teacher {args.teacher!r}: the *-kd runs distil from this .pt; give an existing file")
        args.weights = str(Path(args.weights).resolve()) if args.weights else ""  # the cells run in the repo
        args.teacher = str(Path(args.teacher).resolve()) if args.teacher else ""
        if any(RUNS[run][0] == "peer" for run in args.runs):  # now, not after the first cells of ours
            args.peer_python = find_peer_python(args.peer_python)
        if args.data:  # the yaml as it is, its paths resolved where it lies
            voc_yaml, yolo_yaml, names, counts = prepare_yaml(Path(args.data).resolve(), out / "data", "--data")
        else:
            voc_yaml, yolo_yaml, names, counts = prepare(args.voc, out / "data")
        data = dict(voc_yaml=voc_yaml, yolo_yaml=yolo_yaml, names=names, counts=counts, gt=out / "data" / "val_gt.json")
        # seeds outermost: a run stopped early still has every cell at the first seed
        cells = [(run, epochs, seed) for seed in args.seeds for epochs in args.epochs for run in args.runs]
        with ThreadPoolExecutor(args.jobs) as pool:  # --jobs > 1: several cells share one GPU
            for _ in pool.map(lambda c: run_and_report(*c, data, out, args), cells):
                pass
    print(table(out))


if __name__ == "__main__":
    main()
