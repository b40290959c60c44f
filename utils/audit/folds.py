"""The K-fold part of the label audit: a YOLO-txt view of the dataset (links to the images, our own label files) inside
the audit's folder, the split of its images into folds, each fold's dataset yaml, and the train.py / val.py commands
that give every image a prediction from a model that never trained on it. Nothing is written into the user's folder.
"""

import hashlib
import os
import shutil
from pathlib import Path

import yaml


def fold_of_images(names, folds, seed=0):
    """Fold index of each image name: images ranked by a seeded hash of their name, dealt out in turn, so the split
    is the same on every machine, in any listing order, and the folds differ in size by at most one."""
    keys = [hashlib.sha256(f"{seed}:{name}".encode()).hexdigest() for name in names]
    order = sorted(range(len(names)), key=lambda i: keys[i])
    fold = [0] * len(names)
    for rank, i in enumerate(order):
        fold[i] = rank % folds
    return fold


def write_workspace(records, names, folder):
    """A YOLO-txt copy of the records in `folder`: images/<n>_<name> linking to each image (copied where links are
    refused), labels/<n>_<name>.txt from the verified boxes; returns the image paths, in record order."""
    images, labels = Path(folder) / "images", Path(folder) / "labels"
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(len(records)):
        source = Path(records.path(i)).resolve()
        link = images / f"{i:06d}_{source.name}"  # the number keeps apart equal names from different folders
        if not link.exists():
            try:
                link.symlink_to(source)
            except FileExistsError:  # another fold's process (a sweep) made it first
                pass
            except OSError:  # a file system without links (some Windows and network drives)
                shutil.copyfile(source, link)
        rows = records.labels_of(i)
        lines = [
            f"{int(c)} {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f}"
            for c, x1, y1, x2, y2 in rows
        ]
        text = "\n".join(lines) + ("\n" if lines else "")
        label = labels / (link.stem + ".txt")
        if not label.exists() or label.read_text() != text:  # unchanged files keep their times: the cache stays valid
            part = label.with_name(f"{label.name}.{os.getpid()}")
            part.write_text(text)
            os.replace(part, label)  # whole: the folds of a sweep write the same files at once
        paths.append(str(link))
    return paths


def write_fold_yaml(folder, names, train_images, val_images, name):
    """<folder>/<name>.yaml naming .txt lists of the train and val images (absolute paths)."""
    folder = Path(folder)
    for split, images in (("train", train_images), ("val", val_images)):
        (folder / f"{name}_{split}.txt").write_text("".join(f"{os.path.abspath(p)}\n" for p in images))
    cfg = {"path": str(folder.resolve()), "train": f"{name}_train.txt", "val": f"{name}_val.txt", "names": list(names)}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def fold_state(run):
    """'done' (train.py wrote metrics.json, its last act), 'resume' (a last.pt to continue), or 'new'."""
    run = Path(run)
    if (run / "metrics.json").exists() and (run / "weights" / "best.pt").exists():
        return "done"
    return "resume" if (run / "weights" / "last.pt").exists() else "new"


def train_command(python, run, data_yaml, train_flags):
    """train.py for one fold: continued from its last.pt when it stopped midway (it keeps its own arguments)."""
    if fold_state(run) == "resume":
        return [python, "train.py", "--resume", str(Path(run) / "weights" / "last.pt")]
    return [python, "train.py", "--data", str(data_yaml), "--out", str(run), *train_flags]


def predict_command(python, weights, data_yaml, out, val_flags):
    """val.py on the fold's held-out images, writing its detections (COCO json, low confidence) to out/."""
    return [
        python, "val.py", "--weights", str(weights), "--data", str(data_yaml), "--split", "val",
        "--save-json", "--out", str(out), *val_flags,
    ]  # fmt: skip


def sweep_spec(audit_args, out, folds):
    """A tools/sweep.py spec that trains each fold as one experiment (locally over its workers, or one SLURM job
    each with --slurm); `python audit.py` with the same flags afterwards only gathers and scores."""
    command = " ".join(["python audit.py", *audit_args, "--out", str(out), "--fold {fold}"])
    spec = {"template": {"fold": command}, "default": {"fold": 0}, "resource": ["cpu"], "output": f"{out}/sweep"}
    return yaml.safe_dump(spec, sort_keys=False) + "---\n" + yaml.safe_dump({"fold": list(range(folds))})


def relative_link(path, start):
    """`path` relative to `start` for links in the page (it opens from any place the folder is copied to)."""
    return Path(os.path.relpath(path, start)).as_posix()
