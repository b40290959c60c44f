"""The teacher of train.py --teacher (knowledge distillation, docs/training.md): a trained .pt, ours or Ultralytics',
read once through models/weights.py, checked against the run it teaches, frozen. train.py runs it on each batch
under no_grad, beside the student; utils/loss.py compares their class scores (DetectionLoss, the `distill` part).

A resumed run does not save the teacher's tensors: last.pt names its file and SHA-256 (`record`), and a resume whose
teacher file has changed since is refused, since the run could not go on as it would have (exact resume)."""

import hashlib
from pathlib import Path

from models.weights import load_weights
from utils.checkpoints.ours import CheckpointError
from utils.export.formats import format_of


def file_sha256(path):
    """The SHA-256 of a file's bytes, hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_teacher(path, names, imgsz, device, dtype=None, resumed=None):
    """--teacher: (the network, its record for last.pt {"path", "sha256", "scale"}), or (None, None) without one.
    The network: fused, eval, no parameter requiring a gradient, in `dtype` where given (the run's AMP dtype: the
    teacher's forward then costs what the student's does under autocast, without casting its weights each step).
    train.py calls it with mode "maps" (Detect.forward), whose class logits the loss compares. `names`, `imgsz`: the
    run's; another list of classes or another image size is refused. `resumed`: the record of the last.pt a run
    resumes, whose file must be unchanged. ValueError: one sentence naming --teacher and the file."""
    if not path:
        return None, None
    exported = format_of(path)
    if exported:  # its graph ends in decoded boxes and scores (or final detections): no logits left to compare
        raise ValueError(
            f"--teacher {path} is an exported {exported.title} model, which cannot teach: distillation compares the "
            "class logits of every anchor, which only the .pt's network gives; give the .pt it was exported from"
        )
    if not Path(path).is_file():
        raise ValueError(f"--teacher {path} does not exist; give a trained .pt, ours or Ultralytics'")
    sha256 = file_sha256(path)
    if resumed and resumed["sha256"] != sha256:
        raise ValueError(
            f"--resume: the teacher {path} has changed since the run started (SHA-256 {resumed['sha256'][:12]} then, "
            f"{sha256[:12]} now), so the run cannot go on as it would have; put that file back, or start a new run "
            "from last.pt with --weights and --teacher"
        )
    try:
        loaded = load_weights(path, device)
    except CheckpointError as e:  # missing since, broken, or not a detector's checkpoint: its sentence names the file
        raise ValueError(f"--teacher: {e}") from None
    ckpt = loaded.checkpoint
    if list(ckpt["names"]) != list(names):
        raise ValueError(
            f"--teacher {path} was trained on the classes {list(ckpt['names'])}, the dataset has {list(names)}: a "
            "teacher must know the same classes in the same order"
        )
    if ckpt["imgsz"] != imgsz:
        raise ValueError(
            f"--teacher {path} was trained at {ckpt['imgsz']} px and this run trains at --imgsz {imgsz}: its scores "
            f"at another size teach the wrong sizes; give --imgsz {ckpt['imgsz']} or a teacher trained at {imgsz}"
        )
    teacher = loaded.model.requires_grad_(False).eval()
    if dtype is not None:
        teacher.to(dtype)
    return teacher, {"path": str(path), "sha256": sha256, "scale": ckpt["scale"]}
