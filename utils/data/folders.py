"""A labelling tool's export folder given as `--data` without a dataset yaml: the yaml it amounts to, inferred from
the folder's layout (YOLO images/ with labels/, a Roboflow export's split folders, Pascal VOC, COCO json, labelImg's
images beside their .txt), so that the user can print it, copy it and edit it. A folder with its own data.yaml or a
CVAT obj.data is read through that file (utils/data/dataset_yaml.py). Nothing is written into the folder.

Light (no cv2, no torch): utils/data/dataset_yaml.py imports it, and starts without torch.
"""

import json
import os
from pathlib import Path

import yaml

from utils.data.annotations import IMAGE_SUFFIXES
from utils.general import DatasetError

HELD_OUT = 0.2  # an export with no split of its own holds out a fifth of its images for val, as a yaml's fraction does
SPLIT_FOLDERS = {"train": ("train",), "val": ("valid", "val", "validation"), "test": ("test",)}  # Roboflow's first
OWN_FILES = ("data.yaml", "data.yml", "obj.data")  # a folder's own dataset file (Roboflow, Ultralytics, CVAT)
LOOKED_FOR = (
    "a data.yaml or obj.data, Annotations/ with JPEGImages/ or images/ (Pascal VOC), a COCO json "
    "(annotations/instances_*.json, or beside its images), train/ and valid/ folders, images/ with labels/ (YOLO), "
    "or images beside their .txt or .xml files"
)


def own_dataset_file(folder):
    """The dataset file a folder holds (a Roboflow export's data.yaml, CVAT's obj.data), or None."""
    return next((Path(folder) / name for name in OWN_FILES if (Path(folder) / name).is_file()), None)


def infer_dataset_yaml(folder):
    """(the dataset yaml a folder amounts to, as a dict with an absolute `path`; the layout in words). The first
    layout that matches wins; a folder that matches none raises DatasetError saying what was looked for."""
    folder = Path(folder).resolve()
    for layout in (_voc_root, _coco_annotations, _coco_at_root, _split_folders, _images_and_labels, _flat):
        found = layout(folder)
        if found is not None:
            cfg, words = found
            return {"path": str(folder), **cfg}, words
    raise DatasetError(
        f"{folder} is a folder without a dataset yaml, and none of the layouts read matches it: looked for "
        f"{LOOKED_FOR}; give a dataset yaml instead (README: Train on your own data)"
    )


def yaml_text(cfg, names, where, layout):
    """The inferred yaml as a file the user can keep: `path` and the splits first, the class names as a list."""
    ordered = {k: cfg[k] for k in ("path", "voc", "train", "val", "test") if cfg.get(k) is not None}
    ordered["names"] = list(names)
    ordered.update({k: v for k, v in cfg.items() if k not in ordered and k != "nc" and v is not None})
    header = f"# {where}, read as {layout}; copy this file, edit it and give it as --data\n"
    return header + yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True, default_flow_style=None, width=120)


def _voc_root(folder):
    """Annotations/ with JPEGImages/ (or images/, Label Studio's VOC export); its ImageSets/Main lists if any."""
    images = next((d for d in ("JPEGImages", "images") if (folder / d).is_dir()), None)
    if not (folder / "Annotations").is_dir() or images is None:
        return None
    sets = folder / "ImageSets" / "Main"
    listed = {
        s: f"ImageSets/Main/{s}.txt" for s in ("train", "trainval", "val", "test") if (sets / f"{s}.txt").is_file()
    }
    cfg = {"voc": ".", "train": listed.get("train") or listed.get("trainval") or images}
    cfg["val"] = listed.get("val") if "train" in listed and "val" in listed else HELD_OUT
    if "test" in listed:
        cfg["test"] = listed["test"]
    return cfg, f"a Pascal VOC folder (Annotations/ with {images}/)"


def _coco_annotations(folder):
    """COCO's own layout (and CVAT's COCO export): annotations/instances_<split>.json, its images in <split>/,
    images/<split>/ or images/."""
    if not (folder / "annotations").is_dir():
        return None
    jsons = sorted((folder / "annotations").glob("instances_*.json")) or sorted((folder / "annotations").glob("*.json"))
    cfg = _coco_splits(folder, jsons, lambda file: _coco_images(folder, file.stem.removeprefix("instances_")))
    return (cfg, "a COCO json export (annotations/*.json)") if cfg else None


def _coco_at_root(folder):
    """A COCO json beside its images, or beside their images/ folder (Label Studio: file_names start with images/,
    which utils/data/coco_json.py finds there too)."""
    jsons = [p for p in sorted(folder.glob("*.json")) if _looks_coco(p)]
    images = folder / "images" if (folder / "images").is_dir() else None
    cfg = _coco_splits(folder, jsons, lambda file: images)
    return (cfg, f"a COCO json export ({', '.join(p.name for p in jsons)})") if cfg else None


def _coco_splits(folder, jsons, images_of):
    """{split: {images, json}} of COCO jsons named for their split (instances_train2017.json); one json named for
    none is the train split, and val is then held out of it."""
    cfg = {}
    for file in jsons:
        key = _split_named(file.stem)
        if key and key not in cfg:
            cfg[key] = _coco_entry(folder, file, images_of(file))
    if "train" not in cfg and len(jsons) == 1:
        cfg = {"train": _coco_entry(folder, jsons[0], images_of(jsons[0]))}
    if "train" not in cfg:
        return None
    cfg.setdefault("val", HELD_OUT)
    return {k: cfg[k] for k in SPLIT_FOLDERS if k in cfg}


def _coco_entry(folder, file, images):
    entry = {"json": file.relative_to(folder).as_posix()}
    if images is not None:
        entry = {"images": images.relative_to(folder).as_posix(), **entry}
    return entry


def _coco_images(folder, split):
    """The image folder of annotations/instances_<split>.json: <split>/, images/<split>/, images/, or the folder."""
    candidates = (folder / split, folder / "images" / split, folder / "images", folder)
    return next(c for c in candidates if c.is_dir())


def _split_folders(folder):
    """A Roboflow export without its data.yaml: train/, valid/ and test/, each with images/ and labels/ (YOLO), a
    COCO json beside its images, or images beside their .xml (VOC) or .txt files."""
    splits = {key: _first_folder(folder, names) for key, names in SPLIT_FOLDERS.items()}
    if splits["train"] is None:
        return None
    sources, kinds = {}, set()
    for key, split in splits.items():
        if split is not None:
            kind, sources[key] = _split_content(folder, split)
            kinds.add(kind)
    if len(kinds) > 1:
        raise DatasetError(f"{folder}: its split folders hold different formats ({', '.join(sorted(kinds))})")
    sources.setdefault("val", HELD_OUT)
    kind = kinds.pop()
    layout = f"split folders ({', '.join(splits[k].name + '/' for k in SPLIT_FOLDERS if splits[k])} in {kind})"
    if kind == "VOC":
        return {"voc": ".", **sources}, layout
    if kind == "COCO json":
        return sources, layout
    return {**sources, **_yolo_names(folder, sources)}, layout


def _split_content(folder, split):
    """(format, the split's source as a yaml names it) of one split folder."""
    name = split.relative_to(folder).as_posix()
    jsons = [p for p in sorted(split.glob("*.json")) if _looks_coco(p)]
    if jsons:
        return "COCO json", _coco_entry(folder, jsons[0], None)
    if (split / "images").is_dir():
        return "YOLO", f"{name}/images"
    if _images_beside(split, ".xml"):
        return "VOC", name
    return "YOLO", name


def _images_and_labels(folder):
    """YOLO's own layout: images/ and labels/, split into train/ and val/ below them or not (Label Studio)."""
    if not ((folder / "images").is_dir() and (folder / "labels").is_dir()):
        return None
    splits = {key: _first_folder(folder / "images", names) for key, names in SPLIT_FOLDERS.items()}
    if splits["train"] is None:
        sources = {"train": "images", "val": HELD_OUT}
    else:
        sources = {key: f"images/{d.name}" for key, d in splits.items() if d is not None}
        sources.setdefault("val", HELD_OUT)
    return {**sources, **_yolo_names(folder, sources)}, "a YOLO layout (images/ with labels/)"


def _flat(folder):
    """Images with their annotation files beside them, as labelImg saves them: .xml (VOC) or .txt (YOLO)."""
    if _images_beside(folder, ".xml"):
        return {"voc": ".", "train": ".", "val": HELD_OUT}, "images beside their .xml files (Pascal VOC, labelImg)"
    if _images_beside(folder, ".txt"):
        sources = {"train": ".", "val": HELD_OUT}
        return {**sources, **_yolo_names(folder, sources)}, "images beside their .txt labels (YOLO, labelImg)"
    return None


def _yolo_names(folder, sources):
    """{"names": ...} of a YOLO export: its classes.txt (Label Studio, labelImg), else the categories of Label
    Studio's notes.json, else class0, class1, ... up to the largest class id its labels use."""
    label_dirs = [_label_dir(folder / s) for s in sources.values() if isinstance(s, str)]
    for candidate in [folder, folder / "labels", *label_dirs]:
        if (candidate / "classes.txt").is_file():
            return {"names": (candidate / "classes.txt").relative_to(folder).as_posix()}
    notes = _notes_names(folder / "notes.json")
    if notes:
        return {"names": notes}
    largest = max((_largest_class(f) for d in dict.fromkeys(label_dirs) for f in d.rglob("*.txt")), default=-1)
    if largest < 0:
        raise DatasetError(
            f"{folder}: no classes.txt and no label file names a class; write the class names, one per line, "
            f"in {folder / 'classes.txt'}"
        )
    return {"names": [f"class{i}" for i in range(largest + 1)]}


def _label_dir(source):
    """Where a YOLO source's label files lie: the labels/ that matches its last images/, else beside the images."""
    parts = source.parts
    if "images" not in parts:
        return source
    k = len(parts) - 1 - parts[::-1].index("images")
    labels = Path(*parts[:k], "labels", *parts[k + 1 :])
    return labels if labels.is_dir() else source


def _largest_class(label_file):
    """The largest class id a YOLO label file's rows start with; -1 for none (a list of paths or a note reads so)."""
    if label_file.name == "classes.txt":
        return -1
    ids = []
    for line in label_file.read_text(encoding="utf-8", errors="replace").splitlines():
        first = line.split()[:1]
        if first and first[0].isdigit() and len(line.split()) >= 5:
            ids.append(int(first[0]))
    return max(ids, default=-1)


def _notes_names(path):
    """The class names of Label Studio's notes.json ({"categories": [{"id", "name"}]}), by id; None without it."""
    try:
        categories = json.loads(path.read_text(encoding="utf-8"))["categories"]
        return [str(c["name"]) for c in sorted(categories, key=lambda c: int(c["id"]))] or None
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _looks_coco(path):
    """A .json whose start names `images`, as a COCO json's does (Label Studio's notes.json does not)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return '"images"' in f.read(1 << 16)
    except OSError:
        return False


def _images_beside(folder, suffix):
    """Whether a folder holds an image with its annotation file of this suffix beside it (same stem)."""
    stems = {}
    for entry in os.scandir(folder):
        stem, ext = os.path.splitext(entry.name)
        stems.setdefault(stem, set()).add(ext.lower())
    return any(suffix in exts and exts & IMAGE_SUFFIXES for exts in stems.values())


def _first_folder(parent, names):
    return next((parent / n for n in names if (parent / n).is_dir()), None)


def _split_named(stem):
    """The split a file is named for (instances_train2017, instances_Validation), or None (instances_default)."""
    stem = stem.lower()
    return next((key for key in ("train", "val", "test") if key in stem), None)
