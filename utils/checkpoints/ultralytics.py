"""Ultralytics YOLOv8 / YOLO11 / YOLO26 checkpoints (yolov8n.pt ... yolo26x.pt, or a `yolo train` run's weights/*.pt)
turned into this repo's checkpoint format, without the ultralytics package and without running code from
the file: utils/checkpoints/ours.py reads the file (utils/checkpoints/safe_unpickle.py, every class stubbed) and
hands what it read to `convert_ultralytics` here, which only looks at data.

Their network is a list of layers `model.0 ... model.22` (YOLOv8) or `model.0 ... model.23` (YOLO11) whose
inner names (conv, bn, cv1, cv2, m.0, attn.qkv, ...) are the ones models/yolo.py uses, so the conversion is
a rename of the layer index to our module name, plus `cv2 -> box` and `cv3 -> cls` in the head (YOLO26:
`one2one_cv2 -> one2one_box`, `one2one_cv3 -> one2one_cls` too). The family comes from the layer classes (C2f:
YOLOv8, C3k2 and C2PSA: YOLO11 or YOLO26, which has the same layer classes and a head with a one-to-one branch),
the scale from the widths, and loading the renamed weights into our model then checks every shape.
"""

import torch

from utils.checkpoints.safe_unpickle import Stub, stub_name

# Layer classes, in order, of each family's detection model.
_V8 = "Conv Conv C2f Conv C2f Conv C2f Conv C2f SPPF Upsample Concat C2f Upsample Concat C2f Conv Concat C2f Conv "
_V8 += "Concat C2f Detect"
_11 = "Conv Conv C3k2 Conv C3k2 Conv C3k2 Conv C3k2 SPPF C2PSA Upsample Concat C3k2 Upsample Concat C3k2 Conv Concat "
_11 += "C3k2 Conv Concat C3k2 Detect"
FAMILIES = {"": _V8.split(), "11": _11.split(), "26": _11.split()}  # our model names' prefix: n.., 11n.., 26n..
# Their layer index -> our module name (layers without weights, Upsample and Concat, are not listed).
_BACKBONE = ["stem", "down2", "stage2", "down3", "stage3", "down4", "stage4", "down5", "stage5", "sppf"]
LAYER_NAMES = {
    "": dict(enumerate(_BACKBONE))
    | {12: "top4", 15: "top3", 16: "down_p3", 18: "bottom4", 19: "down_p4"}
    | {21: "bottom5", 22: "head"},
    "11": dict(enumerate(_BACKBONE))
    | {10: "psa", 13: "top4", 16: "top3", 17: "down_p3", 19: "bottom4"}
    | {20: "down_p4", 22: "bottom5", 23: "head"},
}
LAYER_NAMES["26"] = LAYER_NAMES["11"]
# Stem width (64 channels times the scale's width multiple) -> scale; load_state_dict then checks every shape.
_SCALE_BY_STEM = {"": {16: "n", 32: "s", 48: "m", 64: "l", 80: "x"}, "11": {16: "n", 32: "s", 96: "x"}}
_SCALE_BY_STEM["26"] = _SCALE_BY_STEM["11"]
# Modules whose objects a checkpoint legitimately rebuilds by calling them (numpy scalars, paths, ...).
_DATA_MODULES = {"ultralytics", "torch", "numpy", "collections", "pathlib", "datetime"}
LICENCE = "AGPL-3.0"  # Ultralytics' weights' licence; a model fine-tuned from them keeps it (their licence page)
LICENCE_URL = "https://www.ultralytics.com/license"
_OTHER_TASKS = {
    "SegmentationModel": "segmentation",
    "PoseModel": "pose",
    "ClassificationModel": "classification",
    "OBBModel": "oriented-box",
    "RTDETRDetectionModel": "RT-DETR",
    "WorldModel": "YOLO-World",
}


def _find_model(obj):
    """The pickled model object: the checkpoint's `ema` if set, else `model`, else the object itself."""
    if isinstance(obj, dict):
        for key in ("ema", "model"):
            if isinstance(obj.get(key), Stub):
                return obj[key]
        return None
    return obj if isinstance(obj, Stub) else None


def _describe(obj):
    if isinstance(obj, dict):
        return "a dict with keys " + ", ".join(map(str, list(obj)[:8]))
    return stub_name(obj) or type(obj).__name__


def named_modules(module, prefix=""):
    """(name prefix, stub) of a stubbed nn.Module and of every module under it, like Module.named_modules."""
    if isinstance(module, Stub):
        yield prefix, module
        for name, child in (module.state.get("_modules") or {}).items():
            yield from named_modules(child, f"{prefix}{name}.")


def module_tensors(module):
    """The state_dict of a stubbed nn.Module: its parameters, persistent buffers and children's, by name."""
    tensors = {}
    for prefix, stub in named_modules(module):
        skip = stub.state.get("_non_persistent_buffers_set") or set()
        parameters, buffers = stub.state.get("_parameters") or {}, stub.state.get("_buffers") or {}
        for name, value in [*parameters.items(), *((n, v) for n, v in buffers.items() if n not in skip)]:
            if isinstance(value, torch.Tensor):
                tensors[prefix + name] = value
    return tensors


def our_weights(family, layers, model):
    """Their layers' tensors under our names, fp32; ValueError for what our modules would compute otherwise."""
    weights = {}
    for index, name in LAYER_NAMES[family].items():
        for key, tensor in module_tensors(layers[index]).items():
            if name == "head" and key.startswith("dfl."):
                if key == "dfl.conv.weight" and not torch.equal(tensor.float().flatten(), torch.arange(16.0)):
                    raise ValueError("has a head whose DFL weights are not 0..15; such a head is not YOLOv8/YOLO11")
                continue  # our head decodes with a fixed 0..15 ramp: the same numbers
            if name == "head":  # one2one_cv2. -> one2one_box. as well
                key = key.replace("cv2.", "box.", 1).replace("cv3.", "cls.", 1)
            weights[f"{name}.{key}"] = tensor.float() if tensor.is_floating_point() else tensor
    if family == "26" and "head.box.0.2.bias" not in weights:
        # Ultralytics' fuse() drops the branch its inference does not use; our model has both, and uses the
        # one-to-one branch in eval: the one-to-many branch starts as its copy (a fine-tuning run retrains it)
        weights |= {k.replace("head.one2one_", "head."): v for k, v in weights.items() if k.startswith("head.one2one_")}
    eps = {layer.state.get("eps") for _, layer in named_modules(model) if type(layer)._name == "BatchNorm2d"}
    if eps - {1e-3}:
        raise ValueError(f"has BatchNorm eps {sorted(eps)}; YOLOv8/YOLO11 use 0.001")
    return weights


def convert_ultralytics(obj, calls):
    """The contents of our checkpoint (scale, nc, names, imgsz, fp32 weights under our names, source) from what
    utils.checkpoints.safe_unpickle.read_pickled_checkpoint read from an Ultralytics .pt file: the object and the
    names its pickle called. Anything else: ValueError whose message says what the file is, to follow its path."""
    model = _find_model(obj)
    cls = stub_name(model)
    risky = [c for c in calls if c.split(".")[0] not in _DATA_MODULES]
    if model is None or not cls.startswith("ultralytics."):
        if risky:
            raise ValueError(f"was refused: its pickle would call {', '.join(risky)}, which can run code (nothing ran)")
        if cls.startswith("models.yolo."):
            raise ValueError(f"is a YOLOv5 checkpoint ({cls} from the yolov5 repository); only YOLOv8 and YOLO11 load")
        raise ValueError(f"holds pickled Python objects ({_describe(obj)}) but no Ultralytics model")
    kind = cls.rsplit(".", 1)[1]
    if kind in _OTHER_TASKS:
        raise ValueError(f"is an Ultralytics {_OTHER_TASKS[kind]} model ({kind}); only detection models load")
    layers = list((model.state.get("_modules", {}).get("model") or Stub()).state.get("_modules", {}).values())
    classes = [type(layer)._name if isinstance(layer, Stub) else "?" for layer in layers]
    head = layers[-1] if layers else None
    one2one = head is not None and head.state.get("_modules", {}).get("one2one_cv2") is not None
    family = next((f for f, expected in FAMILIES.items() if classes == expected and (f == "26") == one2one), None)
    if family is None:
        shown = " ".join(dict.fromkeys(c for c in classes if c not in ("Conv", "Upsample", "Concat")))
        raise ValueError(
            f"is an Ultralytics {kind} whose layers ({shown or 'none'}) are neither YOLOv8, YOLO11 nor YOLO26 "
            "(YOLOv5u, YOLOv9 and YOLOv10 files are not read)",
        )
    weights = our_weights(family, layers, model)
    if family == "26" and weights["head.box.0.2.bias"].numel() != 4:
        raise ValueError(
            f"is an Ultralytics {kind} with a one-to-one head on DFL boxes; only YOLO26's DFL-free one loads"
        )
    cls_bias = weights["head.cls.0.2.bias"]
    nc = cls_bias.numel()
    names = model.state.get("names")
    names = [str(names.get(i, i)) for i in range(nc)] if isinstance(names, dict) else list(names or [])
    names = names if len(names) == nc else [f"class{i}" for i in range(nc)]
    scale = _SCALE_BY_STEM[family].get(weights["stem.conv.weight"].shape[0])
    if family in ("11", "26") and scale is None:  # m and l share the stem width; l has two blocks per C3k2, m one
        scale = "l" if "stage2.m.1.cv1.conv.weight" in weights else "m"
    if scale is None:
        raise ValueError(f"is an Ultralytics {kind} whose widths match no standard scale (n, s, m, l, x)")
    train_args = obj.get("train_args") if isinstance(obj, dict) else None
    imgsz = train_args.get("imgsz", 640) if isinstance(train_args, dict) else 640
    version = obj.get("version", "") if isinstance(obj, dict) else ""
    return {
        "scale": family + scale,
        "nc": nc,
        "names": names,
        "imgsz": int(max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz),
        "model": weights,
        "source": f"ultralytics {version}".strip(),
        "licence": LICENCE,
        "args": {},  # their training settings mean other things here (their data yaml, their hyperparameters)
    }
