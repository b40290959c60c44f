"""--cls-weights auto on a set with a 1:50 class ratio: the rare class's AP and the mAP, with and without.

    python bench/class_imbalance.py                                  # 200 train images, 224 px, 15 epochs, twice
    python bench/class_imbalance.py --only plain & python bench/class_imbalance.py --only auto   # side by side
    python bench/class_imbalance.py --epochs 2 --train 40 --val 20   # a quick look

The set: the built-in shapes (utils/data/shapes.py) with two classes, circle and star, drawn 50:1 in the train split;
the val split draws both equally often, so that the rare class's AP is measured on as many objects as the common
one's (at 50:1 the val split would hold a handful of stars). Both runs: the same seed, settings, data; one with
`--cls-weights auto`. Each best.pt is then scored by val.py (pycocotools). Printed: a table row per run (the rare
class's AP50-95 and AP50, the common one's, mAP, training time) and the weights auto chose. Runs in OUT/plain and
OUT/auto; the set, drawn at the training size, in OUT/data. Sized for a busy 2-core CPU: a run takes ~25 minutes
there when other programs load it (about 1.5 images/s), so the set holds few rare boxes (~20): read the
difference with that in mind.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from utils.data.shapes import NAMES, make_shapes  # noqa: E402

COMMON, RARE = "circle", "star"


def make_set(root, n_train, n_val, ratio, seed, size):
    """The two-class set: shapes drawn with odds ratio:1 (all other classes 0), its labels renumbered 0, 1."""
    odds = [ratio if n == COMMON else 1 if n == RARE else 0 for n in NAMES]
    make_shapes(root, n_train, n_val, seed=seed, size=size, class_odds=odds)
    renumbered = root / "renumbered.json"  # make_shapes returns early on a set it made before: renumber once
    if not renumbered.exists() or json.loads(renumbered.read_text()) != odds:
        ids = {str(NAMES.index(COMMON)): "0", str(NAMES.index(RARE)): "1"}
        for path in root.glob("labels/*/*.txt"):
            rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
            path.write_text("".join(f"{ids.get(c, c)} {rest}\n" for c, rest in rows))
        renumbered.write_text(json.dumps(odds))
    counts = [0, 0]
    for path in root.glob("labels/train/*.txt"):
        for line in path.read_text().splitlines():
            counts[int(line.split()[0])] += 1
    cfg = root.parent / "imbalance.yaml"
    cfg.write_text(
        yaml.safe_dump({"path": root.name, "train": "images/train", "val": "images/val", "names": [COMMON, RARE]})
    )
    return cfg, counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/class_imbalance")
    parser.add_argument("--train", type=int, default=200)
    parser.add_argument("--val", type=int, default=100)
    parser.add_argument("--ratio", type=int, default=50, help="common : rare objects in the train split")
    parser.add_argument("--imgsz", type=int, default=224, help="also the size the set is drawn at")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--val-every", type=int, default=5, help="validation (which picks best.pt) every N epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["plain", "auto"], help="run one of the two")
    a = parser.parse_args()
    out = Path(a.out).resolve()
    cfg, counts = make_set(out / "data", a.train, a.val, a.ratio, a.seed, a.imgsz)
    print(f"train boxes: {COMMON} {counts[0]}, {RARE} {counts[1]}")
    # the shapes set's own recommendations (data/shapes.yaml) for a short CPU run: no accumulation, short warmup
    settings = ["--data", cfg, "--imgsz", a.imgsz, "--epochs", a.epochs, "--seed", a.seed, "--batch", 16]
    settings += ["--nominal-batch", 16, "--warmup-epochs", 1, "--close-mosaic", 3, "--cache", "ram"]
    settings += ["--val-every", a.val_every]
    rows = {}
    for name, extra in (("plain", []), ("auto", ["--cls-weights", "auto"])):
        if a.only and a.only != name:
            continue
        run_dir = out / name
        start = time.time()
        subprocess.run(
            [sys.executable, "train.py", *map(str, settings + extra), "--out", run_dir], cwd=REPO, check=True
        )
        seconds = time.time() - start
        val = [
            sys.executable,
            "val.py",
            "--weights",
            run_dir / "weights/best.pt",
            "--data",
            cfg,
            "--out",
            run_dir / "val",
        ]
        subprocess.run(list(map(str, val)), cwd=REPO, check=True, capture_output=True)
        metrics = json.loads((run_dir / "val" / "metrics.json").read_text())
        weights = yaml.safe_load((run_dir / "args.yaml").read_text())["cls_weights"]
        rows[name] = (metrics, seconds, weights)
    print(f"\n{a.train} train images ({COMMON} {counts[0]} : {RARE} {counts[1]} boxes), {a.val} val images, "
          f"{a.imgsz} px, {a.epochs} epochs")  # fmt: skip
    print("| run | class weights | AP50-95 star (rare) | AP50 star | AP50-95 circle | mAP50-95 | mAP50 | time |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (m, seconds, weights) in rows.items():
        rare, common = m["per_class"][1], m["per_class"][0]
        shown = ", ".join(f"{float(w):.3f}" for w in weights.split(",")) if weights else "none"
        print(
            f"| {name} | {shown} | {rare['mAP50-95']:.3f} | {rare['mAP50']:.3f} | {common['mAP50-95']:.3f} "
            f"| {m['mAP50-95']:.3f} | {m['mAP50']:.3f} | {seconds / 60:.1f} min |"
        )


if __name__ == "__main__":
    main()
