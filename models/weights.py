"""Weights files -> models: the one entry through which train.py, val.py, detect.py, export.py and
models/predict.py load weights.

    from models.weights import load_weights

    loaded = load_weights("best.pt")  # or yolo11n.pt (Ultralytics'), best.onnx, best_openvino_model/, ...
    loaded.kind   # "ours", "ultralytics", or the export format's name (utils/export/formats.py): "onnx", ...
    loaded.model  # a .pt: the YOLO network (eval, fused); an exported file: its utils.inference.Predictor

The path goes down once: load_weights -> utils/checkpoints/ours.py read_checkpoint, which opens and reads the file
once (torch.load(weights_only=True); Ultralytics' pickled objects through utils/checkpoints/safe_unpickle.py, then
utils/checkpoints/ultralytics.py) -> model_from_checkpoint here, which builds models.yolo.YOLO. A file or folder
export.py wrote (told by its suffix, utils/export/formats.py) goes to utils.inference.load_exported instead.

A module of its own because train.py needs a checkpoint without the inference code of models/predict.py, and
models/yolo.py stays the network alone. Also here: what fine-tuning takes from a checkpoint (architecture,
class_width, box_bins, initialise_from), and the files a training run reads, checked before it starts (run_files).
A weights argument that names one of Ultralytics' published checkpoints (yolo11n.pt) and no file is downloaded
once into a cache folder (utils/download.py).
"""

import os
from pathlib import Path
from typing import NamedTuple

import torch

from models.yolo import MODELS, YOLO
from utils.checkpoints.ours import FORMAT, CheckpointError, checkpoint_weights, read_checkpoint
from utils.checkpoints.ultralytics import LICENCE_URL
from utils.data.dataset_yaml import REPO
from utils.download import resolve_weights
from utils.export.formats import format_of
from utils.inference import load_exported


class Weights(NamedTuple):
    """What a weights file turned out to be (kind), and what load_weights built from it.
    checkpoint: a .pt's contents (utils/checkpoints/ours.py: scale, nc, names, imgsz, model, args, ...); None for an
    exported file. model: a .pt's network (models.yolo.YOLO in eval, Conv+BN fused), or the Predictor
    of utils.inference.load_exported for an exported file; None when load_weights was asked not to build."""

    kind: str
    checkpoint: dict | None
    model: object

    @property
    def train_args(self):
        """The arguments of the run that trained a .pt of ours (data, single_cls, ...); {} otherwise."""
        return (self.checkpoint or {}).get("args") or {}


def load_weights(path, device="cpu", build=True):
    """A weights file -> Weights(kind, checkpoint, model): one of our checkpoints, an Ultralytics .pt (YOLOv8,
    YOLO11, YOLO26) or a file exported by export.py, each read once. device: where the model runs (a .pt's
    network is built on the CPU, fused, then moved). build=False: a .pt's checkpoint only, no network (train.py
    builds its own for the dataset's classes); an exported file then is refused, it holds no checkpoint.
    A published name (yolo11n.pt) and no such file: the cached download (utils/download.py).
    A missing, broken or foreign file: CheckpointError (a ValueError), one sentence that names the file."""
    path = resolve_weights(path)
    exported = format_of(path)  # a file or folder export.py writes, told by its suffix; anything else is a .pt
    if exported and not build:
        raise CheckpointError(
            f"{path} is an exported {exported.title} model; give the .pt checkpoint it was exported from"
        )
    if exported:
        return Weights(exported.name, None, load_exported(path, torch.device(device)))
    kind, checkpoint = read_checkpoint(path)
    if checkpoint.get("licence") and os.environ.get("RANK", "0") == "0":  # said once, by rank 0 of a DDP run
        print(licence_line(path, checkpoint["licence"]))
    # fused: the output is the same, inference is faster and an exported graph has no training-only parts
    model = model_from_checkpoint(checkpoint, path).fuse().to(device) if build else None
    return Weights(kind, checkpoint, model)


def model_from_checkpoint(ckpt, source=""):
    """Rebuild the network from a checkpoint (its contents, or a path), with the EMA weights when it has
    them (last.pt), else its only weights (best.pt holds EMA weights). Returned in eval mode and in
    channels_last layout (oneDNN's and cuDNN's faster convolutions), with `names` and `imgsz`
    attached. A checkpoint that cannot be built: CheckpointError, one sentence."""
    if not isinstance(ckpt, dict):
        ckpt, source = read_checkpoint(ckpt)[1], ckpt
    try:
        model = YOLO(ckpt["scale"], ckpt["nc"], cls_width=class_width(ckpt), reg_max=box_bins(ckpt))
        model.load_state_dict(checkpoint_weights(ckpt))
        model.names, model.imgsz = ckpt["names"], ckpt["imgsz"]
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(
            f"{source or 'the checkpoint'} has the '{FORMAT}' tag but holds no model this code can build "
            f"({type(e).__name__}: {detail})"
        ) from None
    return model.eval().to(memory_format=torch.channels_last)


def architecture(model_arg, reg_max=0, resume_ckpt=None, init_ckpt=None):
    """The network a run builds, (scale, reg_max): a resumed run's, that of the .pt given as --model, or --model
    itself with --reg-max (0: the family's)."""
    ckpt = resume_ckpt or (init_ckpt if model_arg.endswith(".pt") else None)
    if ckpt:
        return ckpt["scale"], box_bins(ckpt)
    if model_arg not in MODELS:
        raise ValueError(f"--model {model_arg}: give one of {', '.join(MODELS)} or a .pt file")
    if reg_max < 0:
        raise ValueError(f"--reg-max {reg_max}: give 0 (the family's), 1 (no DFL) or the DFL bins per side (16)")
    return model_arg, reg_max


def class_width(ckpt):
    """The class branch's width in a checkpoint's weights (the input width of its last conv)."""
    return checkpoint_weights(ckpt)["head.cls.0.2.weight"].shape[1]


def box_bins(ckpt):
    """The box branch's bins per side (reg_max) in a checkpoint's weights: its last conv has 4 of them per anchor."""
    return checkpoint_weights(ckpt)["head.box.0.2.weight"].shape[0] // 4


def load_matching(model, weights):
    """Copy every tensor of `weights` whose name and shape match the model's (fine-tuning from another
    class count or model). Returns the names of the model's tensors left as they were."""
    own = model.state_dict()
    matching = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(matching, strict=False)
    return [k for k in own if k not in matching]


def initialise_from(model, ckpt, path):
    """Fine-tuning: copy the checkpoint's tensors that match (load_matching); returns the sentence that says what
    transferred and what starts fresh."""
    fresh, total = load_matching(model, checkpoint_weights(ckpt)), len(model.state_dict())
    starting_fresh = f"; starting fresh: {', '.join(fresh[:6])}{' ...' * (len(fresh) > 6)}" if fresh else ""
    return (
        f"initialised {total - len(fresh)}/{total} tensors from {path} ({ckpt.get('source', 'this repo')}, "
        f"model {ckpt['scale']}, {ckpt['nc']} classes){starting_fresh}"
    )


def licence_line(path, licence):
    """The line that says under which licence weights are (Ultralytics' weights, and what is fine-tuned from them)."""
    return f"{path}: weights under {licence}, as Ultralytics' are ({LICENCE_URL}); so is a model fine-tuned from them"


class RunFiles(NamedTuple):
    """The files a training run reads, resolved: init_path, the file of --weights or of a .pt --model ("" when
    there is none, or on resume: last.pt has the weights), and its checkpoint; teacher, the file of --teacher; licence,
    that of the weights the run starts from or resumes (Ultralytics' and what derives from them), else None."""

    init_path: str
    init_checkpoint: dict | None
    teacher: str
    licence: str | None


def run_files(args, resume_ckpt, sources):
    """train.py: the dataset yaml, --weights (or a .pt --model, read here once) and --teacher, resolved (a published
    name is downloaded once) and checked before any dataset is generated, verified or cached, so that a wrong path
    stops the run at once; the resumed last.pt was read before. The weights' file and licence go into `sources`, and
    so beside their flag into args.yaml. SystemExit with one sentence naming the flag."""
    flag = "model" if args.model.endswith(".pt") else "weights"
    given = getattr(args, flag)
    data = Path(args.data)
    if not any(p.exists() for p in (data, REPO / "data" / data, REPO / data)):
        raise SystemExit(f"error: --data {data}: dataset yaml does not exist (nor as data/{data} of this repo)")
    try:
        init_path = "" if resume_ckpt else resolve_weights(given)
        init_ckpt = load_weights(init_path, build=False).checkpoint if init_path else None
    except CheckpointError as e:
        raise SystemExit(f"error: --{flag}: {e}") from None
    try:
        teacher = resolve_weights(args.teacher)
        if teacher and not format_of(teacher):  # an exported one: load_teacher says why it cannot teach
            read_checkpoint(teacher)
    except CheckpointError as e:
        raise SystemExit(f"error: --teacher: {e}") from None
    licence = (resume_ckpt or init_ckpt or {}).get("licence")
    notes = [sources.get(flag, "command line")]
    if init_path and init_path != given:
        notes.append(f"read from {init_path}")
    if licence:
        notes.append(f"licence {licence}")
    if len(notes) > 1:
        sources[flag] = "; ".join(notes)
    return RunFiles(init_path, init_ckpt, teacher, licence)
