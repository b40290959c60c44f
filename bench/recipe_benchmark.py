"""Side-by-side recipe benchmark: this repo's train.py and Ultralytics YOLOv8n under the same recipe, on two
generated datasets, at several seeds and epoch budgets, both scored by pycocotools. Also runs the ablations.

    # the main table (same recipe on both sides + each repo's defaults): 2 datasets x 3 seeds x 10/20/40 epochs
    python bench/recipe_benchmark.py --runs ours peer peer-defaults
    # ablations: one difference switched at a time, against "ours"
    python bench/recipe_benchmark.py --runs ours no-ramp bias-capped lr-nc tiny-box-16 --epochs 20
    # print the table of what has run so far (cells run earlier are never run again)
    python bench/recipe_benchmark.py --table
    # YOLO26 cells trained before both of its modes were scored: score the missing one (no training)
    python bench/recipe_benchmark.py --rescore

The recipe: from scratch, 320 px, batch 16, AdamW lr0 0.002, CPU, fp32, everything else at each repo's defaults (warmup
3 epochs, mosaic closed for the last 10 epochs, EMA; Ultralytics accumulates gradients to 64 images per step, this
repo's AdamW steps after every batch). --ours-args "--nominal-batch 64" gives every cell of ours the settings figures
measured before 2026-11-26 had (AdamW then accumulated too); a run's own flags still win. Each cell is scored once, on
the weights after its last epoch (per-epoch validation is off on both sides: it changes nothing but the time), by
utils/evaluate.coco_map, i.e. pycocotools: this repo's numbers come from train.py's metrics.json, Ultralytics' from its
saved predictions through bench/score_detections.py. YOLO26 cells are scored in both of its modes: the NMS-free
one-to-one head (the row under the run's name; our default, Ultralytics' nms=False) and the one-to-many head + NMS (the
"+NMS" row; Ultralytics' default in 8.4, our val.py --nms). Datasets (generated here, never used for tuning):
  shapes  make_shapes(seed 7, 300 train / 100 val, 320 px): 1-12 objects of 6 outline classes, 6-107 px
  crowd   make_shapes(style crowd, seed 11, 300 / 100, 320 px): 15-60 rings, crescents, arrows, bars and tees,
          6-24 px across
Ultralytics runs in its own venv: `bench/peer_env.sh DIR` makes it; pass --peer-python DIR/bin/python or set
PEER_PYTHON.

Results: OUT/<dataset>/<run>/e<epochs>/s<seed>/result.json, and the table (mean +/- sample std over seeds) in
OUT/table.md. A cell whose result.json exists is skipped, so the command can be stopped and started again.
"""

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/recipe_benchmark.py`: find utils/ and score_detections

from bench.peer import find_peer_python  # noqa: E402
from bench.score_detections import score  # noqa: E402
from models.yolo import E2E  # noqa: E402
from utils.data.shapes import STYLES, make_shapes  # noqa: E402

DATASETS = {  # name: make_shapes arguments
    "shapes": dict(n_train=300, n_val=100, seed=7, size=320, style="shapes"),
    "crowd": dict(n_train=300, n_val=100, seed=11, size=320, style="crowd"),
}
RECIPE = ["--optimizer", "adamw", "--lr0", "0.002"]  # this repo's defaults pick the same (auto: AdamW 0.002)
# name: (repo, extra arguments). For this repo, train.py flags on top of RECIPE; for Ultralytics, train() settings.
RUNS = {
    "ours": ("ours", []),
    "peer": ("peer", ["optimizer=AdamW", "lr0=0.002"]),
    "peer-defaults": ("peer", []),  # optimizer=auto
    # ablations: one difference from Ultralytics at a time, each is what Ultralytics does
    "no-ramp": ("ours", ["--accumulate-warmup", "0"]),  # accumulate 4 from the first step
    "bias-capped": ("ours", ["--warmup-bias-lr", "0.002"]),  # AdamW bias warmup capped at lr0 (the old default)
    "nb64": ("ours", ["--nominal-batch", "64"]),  # AdamW steps after 64 images, accumulated (the old default)
    "lr-nc": ("ours", ["--lr0", "{lr_nc}"]),  # Ultralytics' optimizer=auto rate: 0.002 * 5 / (4 + nc)
    "tiny-box-16": ("ours", ["--tiny-box", "16"]),  # assigner counts sides under 16 px as 16 (Ultralytics'), not 8.5
    "mosaic-keep-cut": ("ours", ["--mosaic-min-area", "0"]),  # mosaic keeps boxes cut to under 10% of their area
    "musgd": ("ours", ["--optimizer", "musgd", "--lr0", "0.01"]),  # YOLO26's optimizer on YOLOv8n
    "sgd": ("ours", ["--optimizer", "sgd", "--lr0", "0.01"]),  # the plain SGD MuSGD adds its Muon step to
    # the model families (issue 25): the runs above train YOLOv8n on both sides
    "ours-11n": ("ours", ["--model", "11n"]),
    "11n-no-dfl": ("ours", ["--model", "11n", "--reg-max", "1"]),  # 11n's box branch as YOLO26's: 4 distances, L1
    "ours-26n": ("ours", ["--model", "26n"]),
    "26n-dfl": ("ours", ["--model", "26n", "--reg-max", "16"]),  # the other way: 26n with 11n's DFL box branch
    "26n-l1-x10": ("ours", ["--model", "26n", "--dfl", "15"]),  # 10x the gain of the L1 term that replaces DFL
    "26n-tiny-box-16": ("ours", ["--model", "26n", "--tiny-box", "16"]),  # Ultralytics' small-target rule, on 26n
    "26n-no-progloss": ("ours", ["--model", "26n", "--o2m-final", "0.8"]),  # constant 0.8 / 0.2 branch weights
    "ours-26n-musgd": ("ours", ["--model", "26n", "--optimizer", "musgd", "--lr0", "0.01"]),
    "peer-26n": ("peer", ["--model", "yolo26n.yaml", "optimizer=AdamW", "lr0=0.002"]),
    "peer-26n-defaults": ("peer", ["--model", "yolo26n.yaml"]),  # optimizer=auto (AdamW here: short runs)
}


def make_dataset(name, root):
    folder = make_shapes(root / name, **DATASETS[name])
    yaml_path = root / f"{name}.yaml"
    names = STYLES[DATASETS[name]["style"]]["names"]
    yaml_path.write_text(f"path: {folder.resolve()}\ntrain: images/train\nval: images/val\nnames: {names}\n")
    return yaml_path, len(names)


def train_command(repo, extra, data_yaml, epochs, seed, cell, peer_python, imgsz=320, batch=16, device="cpu"):
    """The command that trains one cell: train.py with `extra` flags into cell/train (validated once, after the last
    epoch), or bench/ultralytics_shapes.py with `extra` train() settings (a leading `--model FILE` is the script's
    flag) into cell/peer (no per-epoch validation; its final one saves the predictions). bench/real_data_benchmark.py
    trains with it too. On a GPU both train in fp32, as on the CPU (Ultralytics' AMP check would download a model)."""
    common = ["--data", str(data_yaml), "--epochs", str(epochs), "--imgsz", str(imgsz), "--batch", str(batch)]
    common += ["--seed", str(seed), "--device", str(device)]
    if repo == "ours":
        command = [sys.executable, "train.py", *common, *extra, "--val-every", str(epochs), "--no-amp"]
        return command + ["--workers", "2", "--out", str(cell / "train")]
    model = extra[1:2] if extra[:1] == ["--model"] else []  # a script flag, the rest are train() settings
    command = [peer_python, "bench/ultralytics_shapes.py", *common, "--out", str(cell / "peer")]
    return command + [*(["--model", *model] if model else []), "--set", "val=False", *extra[2 if model else 0 :]]


def run_cell(run, data_yaml, nc, epochs, seed, cell, peer_python, ours_args=()):
    repo, extra = RUNS[run]
    extra = [a.format(lr_nc=round(0.002 * 5 / (4 + nc), 6)) for a in extra]
    command = train_command(
        repo, [*RECIPE, *ours_args, *extra] if repo == "ours" else extra, data_yaml, epochs, seed, cell, peer_python
    )
    start = time.perf_counter()
    run_logged(command, cell / "log.txt")
    seconds = time.perf_counter() - start
    result = {**scores(run, cell, data_yaml, peer_python), "seconds": round(seconds, 1), "command": command}
    (cell / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def scores(run, cell, data_yaml, peer_python):
    """{"mAP50-95", "mAP50"} of a trained cell; for YOLO26 those of its NMS-free head, plus "nms": the same of its
    one-to-many head + NMS (Ultralytics' default for YOLO26, our val.py --nms): both repos scored in both modes."""
    repo, nms_free = RUNS[run][0], is_nms_free(RUNS[run][1])
    if repo == "ours":
        metrics = json.loads((cell / "train" / "metrics.json").read_text())  # the NMS-free head for YOLO26
        found = {"mAP50-95": metrics["mAP50-95"], "mAP50": metrics["mAP50"]}
        if nms_free:
            command = [sys.executable, "val.py", "--weights", str(cell / "train" / "weights" / "best.pt"), "--nms"]
            run_logged([*command, "--workers", "2", "--out", str(cell / "val_nms")], cell / "log_nms.txt")
            metrics = json.loads((cell / "val_nms" / "metrics.json").read_text())
            found["nms"] = {"mAP50-95": metrics["mAP50-95"], "mAP50": metrics["mAP50"]}
        return found
    summary = json.loads((cell / "peer" / "summary.json").read_text())
    if nms_free and "predictions_end2end" not in summary:  # a cell trained before both modes were saved
        command = [find_peer_python(peer_python), "bench/ultralytics_shapes.py", "--validate", summary["best"]]
        command += ["--data", str(data_yaml)]
        run_logged([*command, "--imgsz", "320", "--batch", "16", "--out", str(cell / "peer_val")], cell / "log_val.txt")
        summary = json.loads((cell / "peer_val" / "summary.json").read_text())
    default = dict(zip(("mAP50-95", "mAP50"), score(data_yaml, summary["predictions"], category_offset=1)))
    if not nms_free:
        return default
    end2end = score(data_yaml, summary["predictions_end2end"], category_offset=1)
    return {"mAP50-95": end2end[0], "mAP50": end2end[1], "nms": default}


def is_nms_free(extra):
    """Whether a run's flags (ours) or settings (Ultralytics) train an NMS-free model: the --model they name is a
    YOLO26 (26n, yolo26n.yaml ...) or our NMS-free YOLO11 (11n-e2e)."""
    model = extra[extra.index("--model") + 1] if "--model" in extra else ""
    return "26" in model or model in E2E


def run_logged(command, log_path):
    with open(log_path, "w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)


def table(out):
    """Markdown: per dataset, one row per run, one column per epoch budget; mean +/- std (seeds)."""
    cells = {}
    for path in sorted(out.glob("*/*/e*/s*/result.json")):
        dataset, run, epochs = path.parts[-5], path.parts[-4], int(path.parts[-3][1:])
        result = json.loads(path.read_text())
        cells.setdefault((dataset, run, epochs), []).append(result["mAP50-95"])
        if "nms" in result:  # YOLO26: its one-to-many head + NMS, a row of its own
            cells.setdefault((dataset, f"{run} +NMS", epochs), []).append(result["nms"]["mAP50-95"])
    if not cells:
        return f"no results under {out} yet: run the benchmark without --table first\n"
    lines = []
    for dataset in sorted({k[0] for k in cells}):
        budgets = sorted({k[2] for k in cells if k[0] == dataset})
        lines += [f"\n{dataset}: mAP50-95, mean +/- std over seeds (n)\n"]
        lines += ["| run | " + " | ".join(f"{e} epochs" for e in budgets) + " |"]
        lines += ["|---" * (len(budgets) + 1) + "|"]
        rows = [name for r in RUNS for name in (r, f"{r} +NMS")]  # a YOLO26 run's +NMS row right under it
        for run in [r for r in rows if any(k[:2] == (dataset, r) for k in cells)]:
            row = []
            for e in budgets:
                v = cells.get((dataset, run, e), [])
                spread = f" +/- {statistics.stdev(v):.3f}" if len(v) > 1 else ""
                row.append(f"{statistics.mean(v):.3f}{spread} ({len(v)})" if v else "")
            lines.append(f"| {run} | " + " | ".join(row) + " |")
        # this repo's defaults are the recipe: one "ours" row for both
        pairs = [
            ("ours", "peer"),
            ("ours", "peer-defaults"),
            ("ours-26n", "peer-26n"),
            ("ours-26n", "peer-26n-defaults"),
            ("ours-26n +NMS", "peer-26n +NMS"),
            ("ours-26n +NMS", "peer-26n-defaults +NMS"),
        ]
        for ours, peer in pairs:
            ratios = [
                f"{statistics.mean(cells[dataset, ours, e]) / statistics.mean(cells[dataset, peer, e]):.2f}"
                if (dataset, ours, e) in cells and (dataset, peer, e) in cells
                else ""
                for e in budgets
            ]
            if any(ratios):
                lines.append(f"| {ours} / {peer} (means) | " + " | ".join(ratios) + " |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["ours", "peer", "peer-defaults"], choices=list(RUNS))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", nargs="+", type=int, default=[10, 20, 40])
    parser.add_argument("--out", default=str(REPO / "runs" / "recipe"))
    parser.add_argument("--peer-python", help="the python of bench/peer_env.sh DIR (default: $PEER_PYTHON)")
    parser.add_argument("--table", action="store_true", help="only print the table of the cells run so far")
    parser.add_argument("--ours-args", type=shlex.split, default=[], help="train.py flags added to every cell of ours")
    parser.add_argument(
        "--rescore", action="store_true", help="only score the YOLO26 cells run before both of its modes were scored"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.rescore:
        for path in sorted(out.glob("*/*/e*/s*/result.json")):
            dataset, run, result = path.parts[-5], path.parts[-4], json.loads(path.read_text())
            if "nms" not in result and run in RUNS and is_nms_free(RUNS[run][1]):
                data_yaml = out / "data" / f"{dataset}.yaml"
                result.update(scores(run, path.parent, data_yaml, args.peer_python))
                path.write_text(json.dumps(result, indent=2) + "\n")
                print(f"{path.parent}: NMS-free {result['mAP50-95']:.4f}, +NMS {result['nms']['mAP50-95']:.4f}")
    elif not args.table:
        if any(RUNS[run][0] != "ours" for run in args.runs):  # now, not after the first cells of ours
            args.peer_python = find_peer_python(args.peer_python)
        data = {name: make_dataset(name, out / "data") for name in args.datasets}
        # seeds outermost: a run stopped early still has every cell at the first seed
        for seed in args.seeds:
            for epochs in args.epochs:
                for dataset in args.datasets:
                    for run in args.runs:
                        cell = out / dataset / run / f"e{epochs}" / f"s{seed}"
                        if (cell / "result.json").exists():
                            continue
                        cell.mkdir(parents=True, exist_ok=True)
                        result = run_cell(run, *data[dataset], epochs, seed, cell, args.peer_python, args.ours_args)
                        print(
                            f"{dataset} {run} {epochs} epochs seed {seed}: mAP50-95 {result['mAP50-95']:.4f} "
                            f"mAP50 {result['mAP50']:.4f} ({result['seconds']:.0f} s)",
                            flush=True,
                        )
    print(table(out))


if __name__ == "__main__":
    main()
