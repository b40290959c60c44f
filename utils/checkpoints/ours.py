"""Checkpoints: written atomically, loadable with torch.load(weights_only=True), self-describing; and the one
place a .pt file is read (read_checkpoint), ours or Ultralytics'.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so loading one from a
stranger cannot run code. It holds what is needed to rebuild the model without the training
command (scale, nc, names, imgsz); last.pt adds the whole training state for an exact resume.

Reading goes down, never back: read_checkpoint opens the file once and tries torch.load(weights_only=True);
a file of pickled objects (Ultralytics') is read from the same open file by utils/checkpoints/safe_unpickle.py and
converted by utils/checkpoints/ultralytics.py, which only looks at what was read. models/weights.py builds
the network from the result.
"""

import glob
import os
import random
from pathlib import Path

import numpy as np
import torch

from utils.checkpoints.safe_unpickle import read_pickled_checkpoint
from utils.checkpoints.ultralytics import convert_ultralytics
from utils.disk import DiskFull, disk_full_sentence, is_disk_full
from utils.general import atomic_write
from utils.optim import load_optimizer_state

FORMAT = "yolo-flat/1"


class CheckpointError(ValueError):
    """A file that is not one of our checkpoints; the message says which file and why."""


def save_checkpoint(ckpt, path):
    """Written atomically and fsynced (utils.general.atomic_write): a crash or a kill while saving
    leaves the previous file intact, never a truncated one. A full disk stops the run with one sentence
    (utils.disk.DiskFull); the previous file is intact and the unfinished one removed."""
    path = Path(path)
    full = []

    def write(f):
        try:
            torch.save(ckpt, f)
        except RuntimeError as e:  # asked here, while the unfinished temporary file still fills the disk
            full.append(is_disk_full(e, path.parent))
            raise

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, write, fsync=True)
    except (OSError, RuntimeError) as e:
        if not (any(full) or is_disk_full(e, path.parent)):
            raise  # not a full disk (a RuntimeError of torch's for another reason): its own traceback
        raise DiskFull(_disk_full_sentence(path)) from None


def _disk_full_sentence(path):
    last = path.with_name("last.pt")
    if path.exists():
        kept = f"the previous {path.name} is intact"
    else:
        kept = f"there is no {path.name} yet"
    if path.name in ("last.pt", "best.pt") and last.exists():
        then = f"free some space, then continue with: python train.py --resume {last}"
    else:
        then = "free some space and run again"
    return disk_full_sentence(path, kept, then)


def read_checkpoint(path, map_location="cpu"):
    """(kind, contents) of a .pt file: kind "ours" (one of this repo's checkpoints) or "ultralytics" (their
    YOLOv8 / YOLO11 / YOLO26 file, converted to the contents of ours). The file is opened and read once. A
    missing, broken or foreign file: CheckpointError, one sentence that names it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        try:
            ckpt = torch.load(f, map_location=map_location, weights_only=True)  # never unpickles code
        except Exception as e:  # torch raises several types for broken or foreign files
            if "Weights only load failed" not in str(e):
                reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                raise CheckpointError(f"{path} is not a checkpoint this repo can read ({reason})") from None
            # Pickled Python objects, which torch refuses at the first class, before reading any tensor: an
            # Ultralytics file (yolov8n.pt, yolo11s.pt, ...) is read again from the same open file with every
            # class stubbed, so nothing from it runs; anything else is named and refused.
            return "ultralytics", {"format": FORMAT, **_read_ultralytics(f, path)}
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not a checkpoint of this repo (no '{FORMAT}' format tag); train one with train.py"
        )
    return "ours", ckpt


def _read_ultralytics(f, path):
    f.seek(0)
    try:
        obj, calls = read_pickled_checkpoint(f)
    except ValueError as broken:
        raise CheckpointError(f"{path} is not a checkpoint this repo can read ({broken})") from None
    try:
        return convert_ultralytics(obj, calls)
    except ValueError as foreign:
        raise CheckpointError(f"{path} {foreign}") from None


def load_checkpoint(path, map_location="cpu"):
    """The contents of a .pt file, ours or Ultralytics' (read_checkpoint, without the kind)."""
    return read_checkpoint(path, map_location)[1]


def checkpoint_weights(ckpt):
    """The weights to build on: the EMA's where the checkpoint has them (last.pt), else its only ones
    (best.pt holds EMA weights; so do converted Ultralytics files)."""
    return ckpt["ema"] if ckpt.get("ema") else ckpt["model"]


def find_last_checkpoint(root="runs/train"):
    """The most recently written runs/train/*/weights/last.pt, or None."""
    files = glob.glob(f"{root}/*/weights/last.pt")
    return max(files, key=os.path.getmtime) if files else None


def load_resume_checkpoint(path=None):
    """(path, checkpoint) for --resume: `path`, else the newest runs/train/*/weights/last.pt. It must hold the
    training state (last.pt does, best.pt does not)."""
    path = path or find_last_checkpoint()
    if path is None:
        raise CheckpointError("no runs/train/*/weights/last.pt found; give the checkpoint's path")
    checkpoint = load_checkpoint(path)
    if "optimizer" not in checkpoint:
        raise CheckpointError(f"{path} holds no training state (best.pt has none); resume from last.pt")
    return str(path), checkpoint


def weights_or_newest(weights):
    """--weights, or when none is given the newest runs/train/*/weights/best.pt (detect.py, val.py, export.py)."""
    weights = weights or find_best_checkpoint()
    if not weights:
        raise CheckpointError("no --weights given and no runs/train/*/weights/best.pt found")
    return weights


def find_best_checkpoint(root="runs/train"):
    files = glob.glob(f"{root}/*/weights/best.pt")
    return max(files, key=os.path.getmtime) if files else None


def rng_states():
    """Every RNG a run touches, as checkpoint-safe values (no numpy objects, no tuples of objects)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def restore_training_state(ckpt, model, ema, optimizer, scaler):
    """--resume: the weights, the EMA (None on the ranks that keep none) and its update count, the optimizer, the fp16
    loss scale and every random generator, as train.py's training_state saved them in last.pt. The loop's own
    counters (epoch, iteration, best fitness) train.py takes back itself."""
    model.load_state_dict(ckpt["model"])
    if ema:
        ema.ema.load_state_dict(ckpt["ema"])
        ema.updates = ckpt["ema_updates"]
    load_optimizer_state(optimizer, ckpt["optimizer"])
    if ckpt["scaler"]:  # empty when saved without fp16: a run resumed in fp16 then starts a new loss scale
        scaler.load_state_dict(ckpt["scaler"])
    set_rng_states(ckpt["rng"])


def set_rng_states(states):
    torch.set_rng_state(states["torch"])
    if torch.cuda.is_available():  # a run resumed on a machine with fewer or more GPUs: those present
        for index, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
    n = states["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), *n[2:]))
    p = states["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
