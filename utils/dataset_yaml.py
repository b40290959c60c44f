"""The dataset yaml: the format YOLOv5 and Ultralytics users already have, read into the splits' sources,
the class names and the settings it recommends. Light on purpose (no cv2, no torch): utils/settings.py
imports it, and starts without torch.
"""

import logging
from pathlib import Path

import yaml

log = logging.getLogger("yolo")


class DatasetError(ValueError):
    """A dataset yaml or folder that cannot be used; the message is one sentence naming the culprit."""


def load_dataset_yaml(path):
    """Read a YOLOv5/Ultralytics dataset yaml. Returns a dict with `root`, `train`, `val`, `test`
    (lists of resolved sources: folders or .txt lists), `names` (list), `nc`, `yaml`, `coco_json` and
    `defaults` (the train.py settings the yaml recommends: utils.settings.apply_dataset_defaults).
    Keys we do not use (`download`, ...) are ignored, so a yaml copied from those repos works as is.
    The built-in shapes set is generated here on first use."""
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (Path(__file__).parents[1] / "data" / path).exists():
        path = Path(__file__).parents[1] / "data" / path  # `--data coco.yaml` finds data/coco.yaml
    cfg = _read_yaml(path)
    names = _class_names(cfg, path)
    root = _dataset_root(cfg, path)
    defaults = cfg.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise DatasetError(f"{path}: key 'defaults' must be a mapping of train.py settings to values")
    out = {"root": root, "names": names, "nc": len(names), "yaml": path, "coco_json": None, "defaults": defaults}
    for key in ("train", "val", "test"):
        out[key] = _split_sources(cfg, key, root, path)
    if cfg.get("coco_json"):
        p = Path(cfg["coco_json"])
        p = p if p.is_absolute() else root / p
        if p.exists():
            out["coco_json"] = p
        else:  # training still works; only the mAP is then computed from the YOLO labels, not the official json
            log.warning(
                f"{path}: key 'coco_json' names {p}, which does not exist; mAP will be computed from the YOLO labels"
            )
    return out


def _read_yaml(path):
    """The yaml's mapping, once it names train and val images."""
    if not path.is_file():
        raise DatasetError(f"dataset yaml {path} does not exist")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise DatasetError(f"{path} is not valid yaml ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise DatasetError(f"{path} must be a mapping with keys path, train, val and names")
    for key in ("train", "val"):
        if not cfg.get(key):
            raise DatasetError(
                f"{path}: key '{key}' is missing (it names the {key} images: a folder, a .txt list, or a list of these)"
            )
    return cfg


def _class_names(cfg, path):
    """`names` as a list of strings, from a list, a dict of index to name, or (without names) `nc`."""
    names = cfg.get("names")
    if isinstance(names, dict):
        try:  # keys may have been quoted ('0': person); what matters is that they are 0..n-1
            names = {int(k): v for k, v in names.items()}
        except (TypeError, ValueError):
            raise DatasetError(
                f"{path}: key 'names' as a dict must map class indices 0..{len(names) - 1} to names"
            ) from None
        if sorted(names) != list(range(len(names))):
            raise DatasetError(
                f"{path}: key 'names' as a dict must map 0..{len(names) - 1} to names, got keys {sorted(names)}"
            )
        names = [names[i] for i in range(len(names))]
    elif not isinstance(names, list) or not names:
        if names is None and isinstance(cfg.get("nc"), int) and cfg["nc"] > 0:
            names = [f"class{i}" for i in range(cfg["nc"])]
        else:
            raise DatasetError(f"{path}: key 'names' must be a non-empty list or a dict of class index to name")
    names = [str(n) for n in names]
    if "nc" in cfg and cfg["nc"] != len(names):
        raise DatasetError(f"{path}: key 'nc' is {cfg['nc']} but key 'names' lists {len(names)} classes")
    return names


def _dataset_root(cfg, path):
    """The folder `path:` names (generating the built-in shapes set there on first use)."""
    root = Path(cfg.get("path") or ".")
    if not root.is_absolute():
        # `path` is relative to the yaml's folder. Fall back to where YOLOv5 (the working directory)
        # and Ultralytics (<working directory>/datasets) read `path: ../datasets/coco` from.
        candidates = [(path.parent / root).resolve(), root.resolve(), (Path("datasets") / root).resolve()]
        root = next((c for c in candidates if c.exists()), candidates[0])
    if cfg.get("generated_by") == "utils/shapes.py":
        from utils.shapes import make_shapes  # the built-in set: generated on first use, no download

        settings = cfg.get("generator_settings") or {}  # optional: n_train, n_val, seed, size
        make_shapes(root, **{k: int(v) for k, v in settings.items() if k in ("n_train", "n_val", "seed", "size")})
    if not root.is_dir():
        raise DatasetError(
            f"{path}: key 'path' names {root}, which does not exist (a relative path is read from the yaml's "
            f"folder {path.parent.resolve()}, then from the working directory)"
        )
    return root


def _split_sources(cfg, key, root, path):
    """The folders and .txt lists of one split, resolved; [] for a split the yaml leaves out."""
    value = cfg.get(key)
    if not value:
        return []
    sources = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, str):
            raise DatasetError(f"{path}: key '{key}' must be a folder, a .txt list or a list of these, got {item!r}")
        p = Path(item)
        if not p.is_absolute():
            # Old YOLOv5 yamls have no `path` and name folders from the working directory
            # (`train: ../coco128/images/train2017`): try there too before giving up.
            tried = [root / p] + ([Path(item).resolve()] if not cfg.get("path") else [])
            p = next((c for c in tried if c.exists()), tried[0])
        if not p.exists():
            if key == "test":  # optional and often not downloaded (COCO test-dev): only val.py --task test needs it
                log.warning(f"{path}: key 'test' names {p}, which does not exist; the test split is not available")
                continue
            raise DatasetError(f"{path}: key '{key}' names {p}, which does not exist")
        sources.append(p)
    return sources
