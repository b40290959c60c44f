"""The dataset yaml: the format YOLOv5 and Ultralytics users already have, read into the splits' sources,
the class names and the settings it recommends (or the same from a Darknet obj.data). A split may also be a Pascal
VOC folder (utils/data/voc.py) or a COCO json (utils/data/coco_json.py), read where they lie. Light on purpose (no
cv2, no torch): utils/settings.py imports it, and starts without torch.
"""

import logging
from dataclasses import replace
from pathlib import Path

import yaml

from utils.data import coco_json, folders, voc
from utils.data.annotations import (
    FORMATS_READ,
    HeldOut,
    without_darknet_prefix,
)
from utils.data.coco_json import CocoSplit
from utils.data.voc import VocSplit
from utils.general import DatasetError, write_run_file  # scripts import DatasetError from here too

log = logging.getLogger("yolo")
SPLITS = ("train", "val", "test")
REPO = Path(__file__).resolve().parents[2]  # its data/ holds coco.yaml and the built-in shapes.yaml


def load_dataset_yaml(path, save_inferred=None):
    """Read a YOLOv5/Ultralytics dataset yaml (or a Darknet obj.data: CVAT's Darknet YOLO export, or a labelling tool's
    export folder: the yaml it amounts to is inferred, logged, kept as `inferred_yaml` and written to the file
    `save_inferred` when given, so that the user can copy and edit it: utils/data/folders.py). Returns a dict with
    `root`, `train`, `val`, `test` (lists of resolved sources: folders or .txt lists; utils.data.voc.VocSplit or
    utils.data.coco_json.CocoSplit for those formats), `names` (list), `nc`, `yaml`, `coco_json` (the original json
    val is scored against: a CocoSplit or a path, or None), `coco_jsons` (the same for each split) and `defaults`
    (the train.py settings the yaml recommends: utils.settings.apply_dataset_defaults). Keys we do not use
    (`download`, `roboflow`, ...) are ignored, so a yaml copied from those repos works as is. The built-in shapes
    set is generated here on first use."""
    path = Path(path)
    try:
        if not path.exists() and not path.is_absolute():
            # `--data coco.yaml` finds data/coco.yaml, and train.py's default data/shapes.yaml is found from any folder
            path = next((p for p in (REPO / "data" / path, REPO / path) if p.exists()), path)
        return _read_folder(path, save_inferred) if path.is_dir() else _read_dataset(path)
    except OSError as e:  # a path the system refuses to look up (too long, a loop of links): was a traceback
        raise DatasetError(f"{_shown(path)}: {_shown(e.filename)} cannot be read ({e.strerror})") from None


def _read_folder(folder, save_to):
    """A folder as the dataset: read through its own data.yaml or obj.data, else through the yaml its layout
    amounts to; that yaml, with an absolute `path` so that it works from anywhere, is logged and saved."""
    own = folders.own_dataset_file(folder)
    if own is not None and own.suffix == ".data":
        cfg, layout = _read_darknet_data(own, held_out=folders.HELD_OUT), f"CVAT's YOLO 1.1 export ({own.name})"
    elif own is not None:
        cfg, layout = _read_yaml(own), f"the dataset yaml it holds ({own.name})"
        try:
            cfg["path"] = str(_dataset_root(cfg, own))
        except DatasetError:  # a `path` of the machine it was exported on (/content/datasets/...): this folder
            cfg["path"], layout = str(folder.resolve()), f"{layout}, with this folder as its `path`"
    else:
        cfg, layout = folders.infer_dataset_yaml(folder)
    out = _read_dataset(own or folder, cfg)
    out["inferred_yaml"] = folders.yaml_text(cfg, out["names"], folder, layout)
    if save_to is None:
        log.info(f"{folder}: a folder, read as {layout}; the dataset yaml it amounts to:\n{out['inferred_yaml']}")
    else:
        save_inferred_yaml(out, save_to)
    return out


def save_inferred_yaml(data, path):
    """A folder read as --data: the yaml it amounts to (its first line names the folder and layout) saved as `path`
    and logged, so that the user can copy and edit it. A script whose logging starts after it read the data calls
    this itself; train.py passes `path` to load_dataset_yaml."""
    write_run_file(path, data["inferred_yaml"])
    log.info(f"the dataset yaml it amounts to, saved as {path}: copy it, edit it and give it as --data\n"
             f"{data['inferred_yaml']}")  # fmt: skip


def _read_dataset(path, cfg=None):
    if cfg is None:
        cfg = _read_darknet_data(path) if path.suffix == ".data" else _read_yaml(path)
    root = _dataset_root(cfg, path)
    if isinstance(cfg.get("names"), str):
        cfg["names"] = _names_file(cfg["names"], root, path)
    voc_root = _voc_root(cfg, root, path)
    fractions = _held_out_fractions(cfg, path)
    out = {"root": root, "yaml": path, "coco_json": None, "defaults": cfg.get("defaults") or {}, "inferred_yaml": None}
    for key in SPLITS:
        out[key] = [] if key in fractions else _split_sources(cfg, key, root, path, voc_root)
    names, category_ids = _names_of(cfg, path, [s for key in SPLITS for s in out[key]])
    out.update(names=names, nc=len(names))
    for key in SPLITS:  # the sources that read class names themselves learn the class order
        out[key] = [_with_classes(s, names, category_ids) for s in out[key]]
    if fractions:
        _hold_out(out, fractions, path)
    out["coco_jsons"] = {key: _json_of(out[key]) for key in SPLITS}
    out["coco_json"] = out["coco_jsons"]["val"]
    if cfg.get("coco_json"):
        p = Path(cfg["coco_json"])
        p = p if p.is_absolute() else root / p
        if p.exists():
            out["coco_json"] = p
        else:  # training still works; only the mAP is then computed from the YOLO labels, not the official json
            log.warning(
                f"{path}: key 'coco_json' names {p}, which does not exist; mAP will be computed from the YOLO labels"
            )
        out["coco_jsons"]["val"] = out["coco_json"]
    return out


def _read_yaml(path):
    """The yaml's mapping, once it names train and val images."""
    if not path.is_file():
        raise DatasetError(f"dataset yaml {path} does not exist")
    try:  # utf-8 whatever the locale (a Windows one read non-ASCII paths wrongly); -sig: a Notepad byte-order mark
        cfg = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except yaml.YAMLError as e:
        raise DatasetError(f"{path} is not valid yaml ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError as e:  # these two were tracebacks (found by tests/test_hostile.py)
        raise DatasetError(f"{path} is not a UTF-8 text file (byte {e.start} cannot be decoded)") from None
    except RecursionError:
        raise DatasetError(f"{path} is not a dataset yaml (nested too deeply to read)") from None
    if not isinstance(cfg, dict):
        raise DatasetError(f"{path} must be a mapping with keys path, train, val and names")
    _check_types(cfg, path)
    for key in ("train", "val"):
        if not cfg.get(key) and not cfg.get("voc"):  # a VOC folder has its own ImageSets/Main/train.txt and val.txt
            raise DatasetError(
                f"{path}: key '{key}' is missing (it names the {key} images: a folder, a .txt list, or a list of these"
                + (", or a fraction of the train images to hold out: val: 0.2)" if key == "val" else ")")
            )
    return cfg


def _read_darknet_data(path, held_out=None):
    """A Darknet obj.data, as CVAT's Darknet YOLO export writes it: `key = value` lines naming the lists of the train
    and valid images and the class names file (obj.names), read into the mapping a dataset yaml gives. CVAT names
    them as Darknet runs (`train = data/train.txt`, from the folder holding the export as data/): a path found only
    without that prefix is read so. A split's key is its CVAT subset name (Train, Validation, ...) or Darknet's.
    held_out: the fraction of the train images val is without a valid list (the export folder given as --data)."""
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist")
    entries = {}
    for n, line in enumerate(path.read_text(encoding="utf-8-sig", errors="replace").splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not (sep and key.strip() and value.strip()):
            raise DatasetError(f"{path}, line {n}: expected 'key = value' (a Darknet obj.data), got {line!r}")
        entries[key.strip().lower()] = without_darknet_prefix(path.parent, value.strip())
    cfg = {"path": str(path.parent.resolve()), "names": entries.get("names")}
    for key, spellings in (("train", ("train",)), ("val", ("valid", "val", "validation")), ("test", ("test",))):
        cfg[key] = next((entries[k] for k in spellings if k in entries), None) or (held_out if key == "val" else None)
        if not cfg[key] and key != "test":
            raise DatasetError(
                f"{path} names no {key} images (key '{spellings[0]}': CVAT writes one per subset of the task, "
                f"so give the task a {'Train' if key == 'train' else 'Validation'} subset, or add the line"
                + (", e.g. 'valid = 0.2' to hold out a fifth of the train images)" if key == "val" else ")")
            )
        try:  # a number: a fraction of the train images, as `val:` given as a number in a yaml
            cfg[key] = float(cfg[key]) if key != "train" and cfg[key] else cfg[key]
        except ValueError:
            pass
    if not cfg["names"]:
        raise DatasetError(f"{path} has no 'names' line (the file of class names, one per line: obj.names)")
    return cfg


def _names_file(name, root, path):
    """The class names a text file lists, one per line (Darknet's obj.names, the classes.txt of Label Studio's and
    labelImg's YOLO exports); read from `path:`, else from the yaml's folder."""
    file = next((f for f in (root / name, path.parent / name) if f.is_file()), None)
    if file is None:
        raise DatasetError(
            f"{path}: key 'names' names {_shown(root / name)}, which is not a file (a list or a text file of names)"
        )
    names = [line.strip() for line in file.read_text(encoding="utf-8-sig", errors="replace").splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names or "" in names:  # a blank line inside would shift every class after it
        where = f"line {names.index('') + 1} is blank" if names else "it lists no class names"
        raise DatasetError(f"{path}: key 'names' names {_shown(file)}, but {where} (one class name per line)")
    return names


def _held_out_fractions(cfg, path):
    """{split: fraction} for `val` and `test` given as numbers, the parts of the train images they hold out."""
    fractions = {}
    for key in ("val", "test"):
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not 0 < value < 1:
                raise DatasetError(
                    f"{path}: key '{key}' as a number is the fraction of the train images it holds out, between 0 and "
                    f"1, got {value!r}"
                )
            fractions[key] = float(value)
    if sum(fractions.values()) >= 1:
        raise DatasetError(f"{path}: keys 'val' and 'test' hold out all the train images together; nothing is left")
    return fractions


def _hold_out(out, fractions, path):
    """Splits given as fractions of train (`val: F`) become HeldOut parts of its images, and train the rest: val
    takes the images whose file name hashes into [0, F), test the next fraction."""
    spec, start = ", ".join(f"{key}: {f:g}" for key, f in fractions.items()), 0.0
    for key, fraction in fractions.items():
        out[key] = [HeldOut(key, tuple(out["train"]), start, start + fraction, spec, str(path))]
        start += fraction
    out["train"] = [HeldOut("train", tuple(out["train"]), 0.0, start, spec, str(path))]
    log.info(f"{path}: {spec} of the train images, chosen by a hash of each file name (the same ones in every run)")


def _check_types(cfg, path):
    """The keys read as one type, checked before use: a number where a folder is named (`voc: 1`), a string for
    `nc`, or a setting that is not a name ended in a TypeError traceback or a misleading sentence (found by
    tests/test_hostile.py)."""
    for key in ("path", "voc", "coco_json"):
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            raise DatasetError(f"{path}: key '{key}' must name a file or folder (a string), got {cfg[key]!r}")
    nc = cfg.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int)):
        raise DatasetError(f"{path}: key 'nc' must be the number of classes (a whole number), got {nc!r}")
    defaults = cfg.get("defaults") or {}
    if not isinstance(defaults, dict) or not all(isinstance(k, str) for k in defaults):
        raise DatasetError(f"{path}: key 'defaults' must be a mapping of train.py settings to values")


def _class_names(cfg, path):
    """`names` as a list of strings, from a list, a dict of index to name, or (without names) `nc`."""
    names = cfg.get("names")
    if isinstance(names, dict) and names:  # an empty one is refused below: no class at all made every label corrupt
        try:  # keys may have been quoted ('0': person); what matters is that they are 0..n-1
            names = {int(k): v for k, v in names.items()}
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(.inf)
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
            raise DatasetError(
                f"{path}: key 'names' must be a non-empty list, a dict of class index to name or a text file of names"
            )
    names = [str(n) for n in names]
    if cfg.get("nc") is not None and cfg["nc"] != len(names):
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
    if cfg.get("generated_by") == "utils/data/shapes.py":
        from utils.data.shapes import make_shapes  # the built-in set: generated on first use, no download

        settings = cfg.get("generator_settings") or {}  # optional: n_train, n_val, seed, size
        make_shapes(root, **{k: int(v) for k, v in settings.items() if k in ("n_train", "n_val", "seed", "size")})
    if not root.is_dir():
        raise DatasetError(
            f"{path}: key 'path' names {_shown(root)}, which does not exist (a relative path is read from the yaml's "
            f"folder {path.parent.resolve()}, then from the working directory)"
        )
    return root


def _split_sources(cfg, key, root, path, voc_root=None):
    """The sources of one split, resolved; [] for a split the yaml leaves out. A source is a folder or .txt list
    of images (YOLO txt labels), a VocSplit (an ImageSets .txt inside a VOC folder, or anything under `voc:`) or
    a CocoSplit (`{images: FOLDER, json: FILE}`, or a .json alone: its images beside it)."""
    value = cfg.get(key)
    if not value and voc_root is not None:  # `voc: FOLDER` alone: the folder's own image sets
        value = (
            f"ImageSets/Main/{key}.txt" if key != "test" or (voc_root / "ImageSets/Main/test.txt").exists() else None
        )
    if not value:
        return []
    sources = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict):
            source = _coco_source(cfg, key, item, root, path)
        elif not isinstance(item, str):
            raise DatasetError(
                f"{path}: key '{key}' must be a folder, a .txt list, a {{images, json}} mapping or a list of these"
                + (", or for val and test a fraction of the train images (val: 0.2)" if key != "train" else "")
                + f", got {item!r}"
            )
        elif voc_root is not None:
            source = voc.voc_source(voc_root, item)
            if source is None:
                _missing(key, path, f"{item} (neither an image folder nor an image set of {voc_root})")
        else:
            source = _resolve(cfg, key, item, root, path)
            if source is not None and source.suffix == ".json":
                source = _coco_source(cfg, key, {"json": item}, root, path)
            elif source is not None and voc.is_image_set(source):  # ids, not paths: read as VOC
                source = VocSplit(source.parents[2], source)
        if source is not None:
            sources.append(source)
    return sources


def _resolve(cfg, key, item, root, path):
    """A path of the yaml, resolved; None for a missing test split (said), DatasetError for another."""
    p = Path(item)
    if not p.is_absolute():
        # Old YOLOv5 yamls have no `path` and name folders from the working directory
        # (`train: ../mydata/images/train`): try there too before giving up.
        tried = [root / p] + ([Path(item).resolve()] if not cfg.get("path") else [])
        if item.startswith("../"):  # Roboflow's YOLO export: `train: ../train/images` for the train/ beside the yaml
            tried.append(root / item[3:])
        p = next((c for c in tried if c.exists()), tried[0])
    if not p.exists():
        _missing(key, path, p)
        return None
    return p


def _shown(path):
    """A path as a message quotes it: in quotes when it holds a line break or another control character (found by
    tests/test_hostile.py), so that the message stays one line, and cut short past 200 characters."""
    text = str(path) if len(str(path)) <= 200 else f"{str(path)[:200]}..."
    return text if text.isprintable() else repr(text)


def _missing(key, path, what):
    if key == "test":  # optional and often not downloaded (COCO test-dev): only val.py --task test needs it
        log.warning(f"{path}: key 'test' names {_shown(what)}, which does not exist; the test split is not available")
        return
    raise DatasetError(f"{path}: key '{key}' names {_shown(what)}, which does not exist")


def _coco_source(cfg, key, item, root, path):
    """A CocoSplit from `{images: FOLDER, json: FILE}` (images default to the json's folder), or None (test)."""
    unknown = set(item) - {"images", "json"}
    if unknown or not isinstance(item.get("json"), str) or not isinstance(item.get("images", ""), str):
        raise DatasetError(
            f"{path}: key '{key}' as a mapping must be {{images: FOLDER, json: FILE}} (a COCO json), got {item!r}"
        )
    json_path = _resolve(cfg, key, item["json"], root, path)
    if json_path is None:
        return None
    images = _resolve(cfg, key, item["images"], root, path) if item.get("images") else json_path.parent
    if images is not None and not images.is_dir():
        raise DatasetError(f"{path}: key '{key}' names images {_shown(images)}, which is not a folder")
    return CocoSplit(images, json_path) if images is not None else None


def _voc_root(cfg, root, path):
    """The VOC folder `voc:` names (relative to `path` when there is one, else read as `path` is), or None."""
    if not cfg.get("voc"):
        return None
    voc_root = _dataset_root({"path": cfg["voc"]}, path) if not cfg.get("path") else root / cfg["voc"]
    if not voc_root.is_dir():
        raise DatasetError(f"{path}: key 'voc' names {_shown(voc_root)}, which is not a folder")
    return voc_root


def _names_of(cfg, path, sources):
    """(class names, the original category id of each class or None). A VOC set without `names` takes the object
    names of its XML files, sorted; a COCO json its categories, sorted by id (their names unless `names` is given).
    """
    kinds = {type(s) for s in sources}
    if len(kinds) > 1 and kinds & {VocSplit, CocoSplit}:
        raise DatasetError(f"{path}: its splits mix formats; one dataset yaml reads one of: {FORMATS_READ}")
    if CocoSplit in kinds:
        return _coco_names(cfg, path, sources)
    if VocSplit in kinds and cfg.get("names") is None:
        names = voc.class_names(sources)
        log.info(f"{path} has no 'names': the classes are the object names of its XML files, sorted: {names}")
        if cfg.get("nc") is not None and cfg["nc"] != len(names):
            raise DatasetError(f"{path}: key 'nc' is {cfg['nc']} but its XML files name {len(names)} classes")
        return names, None
    return _class_names(cfg, path), None


def _coco_names(cfg, path, sources):
    """Names and category ids of the COCO jsons of every split, which must have the same categories."""
    found = {s.json: coco_json.categories(s.json) for s in sources}
    groups = set.intersection(*({c for c, _, group in cats if group} for cats in found.values()))
    if groups:
        grouping = [name for c, name, _ in next(iter(found.values())) if c in groups]
        log.info(f"{path}: categories {grouping} only group the others and have no box in any split: not classes")
    found = {source: [(c, name) for c, name, _ in cats if c not in groups] for source, cats in found.items()}
    (first, categories), *others = found.items()
    ids = [c for c, _ in categories]
    for other, theirs in others:
        if [c for c, _ in theirs] != ids:
            raise DatasetError(f"{path}: {other} has category ids {[c for c, _ in theirs]} but {first} has {ids}")
    if not categories:
        raise DatasetError(f"{first} has no categories")
    if cfg.get("names") is None:
        names = [name for _, name in categories]
        log.info(f"{path}: the classes are the categories of {first}, sorted by id: {names}")
    else:
        names = _class_names(cfg, path)
        if len(names) != len(categories):
            raise DatasetError(f"{path}: key 'names' lists {len(names)} classes but {first} has {len(categories)}")
    return names, tuple(ids)


def _with_classes(source, names, category_ids):
    if isinstance(source, VocSplit):
        return replace(source, names=tuple(names))
    if isinstance(source, CocoSplit):
        return replace(source, category_ids=category_ids)
    return source


def _json_of(sources):
    """The original json a split is scored against, if it is made of exactly one: its CocoSplit, a path that also
    knows which categories are classes (utils/coco.py ground_truth). A part held out of one json is scored against
    that json: ground_truth keeps the images that were predicted."""
    if len(sources) == 1 and isinstance(sources[0], HeldOut):
        sources = sources[0].sources
    return sources[0] if len(sources) == 1 and isinstance(sources[0], CocoSplit) else None
