"""Labels: what a split is made of, and whether it can be trained on. The image files of a split (the
sources utils/data/dataset_yaml.py resolved), their label files, the verification of every image/label pair,
and the label cache that makes that verification a one-time cost. YOLO txt labels are read here; a Pascal
VOC or COCO json split is listed and its boxes read by utils/data/voc.py and utils/data/coco_json.py, then verified,
cached and logged here the same way (its cache and log in our cache folder: never in the dataset's).

Nothing here imports torch: data/yolo2coco.py and utils/coco.py read datasets without it.
"""

import functools
import glob
import hashlib
import logging
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from utils.data import coco_json, voc
from utils.data.annotations import (
    COORD_TOLERANCE,
    DARKNET_PREFIX,
    FORMATS_READ,
    IMAGE_SUFFIXES,
    READER_VERSION,
    BadAnnotation,
    DatasetError,
    HeldOut,
    cache_dir,
    without_darknet_prefix,
)
from utils.data.coco_json import CocoSplit
from utils.data.images import MAX_PIXELS, BadImage, limit_pixels, usable_shape
from utils.data.records import Records, as_records
from utils.data.voc import VocSplit
from utils.disk import why_not_written
from utils.general import atomic_write, write_text_atomic  # tests replace the writers (read-only)
from utils.locks import remove_stale_temporary_files
from utils.settings import default_workers

CACHE_VERSION = 4  # bump when the record or the checks change: old caches are then rebuilt
VERIFY_IN_PROCESSES_FROM = 2000  # images; fewer are verified in threads, which start at once where a pool does not
log = logging.getLogger("yolo")


# ---------------------------------------------------------------------------------------------
# The files of a split
# ---------------------------------------------------------------------------------------------


def list_images(sources):
    """Image files from folders (recursive) and .txt lists (one path per line, relative to the list), and the
    images of VOC and COCO json sources."""
    files = []
    for src in sources:
        if isinstance(src, (VocSplit, CocoSplit)):
            files += [item.image for item in annotated_items([src])]
            continue
        if isinstance(src, HeldOut):
            files += src.pick(list_images(src.sources))
            continue
        src = Path(src)
        if not src.exists():
            raise DatasetError(f"{src} does not exist")
        if src.is_dir():
            files += [
                p for p in glob.glob(str(src / "**" / "*"), recursive=True) if Path(p).suffix.lower() in IMAGE_SUFFIXES
            ]
        elif src.suffix == ".txt":
            files += _listed_images(src)
        elif src.suffix.lower() in IMAGE_SUFFIXES:
            files.append(str(src))
        else:
            raise DatasetError(
                f"{src} is neither a folder, a .txt list nor an image; the formats read are {FORMATS_READ}"
            )
    return sorted(set(os.path.normpath(f) for f in files))


def _listed_images(list_file):
    """The image paths of a .txt list, one per line, relative to the list. Darknet lists name them from the folder
    that holds the dataset as `data/` (CVAT's YOLO export: `data/obj_train_data/x.jpg` in the train.txt
    beside obj_train_data/): when the first line exists only without that prefix, it is dropped from every line."""
    lines = [line.strip() for line in list_file.read_text().splitlines() if line.strip()]
    if lines and without_darknet_prefix(list_file.parent, lines[0]) != lines[0]:
        lines = [line.removeprefix(DARKNET_PREFIX) for line in lines]
    return [str(p if p.is_absolute() else list_file.parent / p) for p in map(Path, lines)]


def label_path(image_path):
    """The YOLO convention: .../images/x.jpg -> .../labels/x.txt (the last /images/ is swapped)."""
    head, sep, tail = image_path.rpartition(f"{os.sep}images{os.sep}")
    base = f"{head}{os.sep}labels{os.sep}{tail}" if sep else image_path
    return os.path.splitext(base)[0] + ".txt"


# ---------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------


class _Corrupt(Exception):
    """Raised by verify_one's helpers for a label file it excludes; the message is the reason (an image:
    utils.data.images.BadImage)."""


def verify_one(image_path, nc, max_pixels=MAX_PIXELS):
    """Check one image and its label file; never modifies them. Returns (status, record, note):
    status in labelled / background / empty / missing / corrupt; record (None when the image is
    excluded) is what the dataset keeps; note says what was wrong or what was fixed. max_pixels: --max-pixels."""
    lp = label_path(image_path)
    try:
        if not os.path.exists(image_path):
            return "missing", None, "image not found"
        h, w = usable_shape(image_path, max_pixels)
        if not os.path.exists(lp):
            return "background", {"im": image_path, "shape": [h, w], "labels": []}, ""
        rows, duplicates = _label_rows(lp, nc)
        note = f"{duplicates} duplicate label rows removed" if duplicates else ""
        return (
            ("labelled" if rows else "empty"),
            {"im": image_path, "shape": [h, w], "labels": rows, "dup": duplicates},
            note,
        )
    except (_Corrupt, BadImage) as e:
        return "corrupt", None, str(e)
    except UnicodeDecodeError:
        return "corrupt", None, f"label {lp} is not a text file"
    except (OSError, cv2.error) as e:
        return "corrupt", None, f"cannot be read ({e})"


def verify_annotated(item, max_pixels=MAX_PIXELS):
    """verify_one for an image of a VOC or COCO json split (item: utils.data.voc.VocItem or
    utils.data.coco_json.CocoItem): the same image checks, then the item's boxes; its record also keeps the boxes to
    ignore and the json's id."""
    try:
        if not os.path.exists(item.image):
            return "missing", None, "image not found"
        h, w = usable_shape(item.image, max_pixels)
        boxes = item.boxes((h, w))  # None: no annotation file (VOC), a background image
    except (BadImage, BadAnnotation) as e:
        return "corrupt", None, str(e)
    except (OSError, cv2.error) as e:
        return "corrupt", None, f"cannot be read ({e})"
    rows, ignored, duplicates = boxes or ([], [], 0)
    record = {"im": item.image, "shape": [h, w], "labels": rows, "ignored": ignored, "dup": duplicates}
    record["image_id"] = getattr(item, "image_id", -1)  # a VocItem has none
    status = "background" if boxes is None else "labelled" if rows else "empty"
    return status, record, f"{duplicates} duplicate boxes removed" if duplicates else ""


def _label_rows(lp, nc):
    """The label file's boxes as [cls, x1, y1, x2, y2] rows, duplicates dropped, and how many were dropped."""
    rows, duplicates, seen = [], 0, set()
    with open(lp, encoding="utf-8-sig") as f:  # -sig: a byte-order mark (Windows Notepad) is not part of a number
        for line_no, line in enumerate(f, 1):
            if not line.split():
                continue
            row = _label_row(line, nc, f"label {lp} line {line_no}")
            key = (row[0], *(round(v, 6) for v in row[1:]))
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            rows.append(row)
    return rows, duplicates


def _label_row(line, nc, where):
    """One line (class cx cy w h, or a polygon) as [cls, x1, y1, x2, y2], normalised and clipped to 0..1."""
    parts = line.split()
    try:
        values = [float(v) for v in parts]
    except ValueError:
        raise _Corrupt(f"{where}: not numbers: {line.strip()[:60]!r}") from None
    if not all(np.isfinite(values)):
        raise _Corrupt(f"{where}: a value is not finite")
    if len(values) > 5 and len(values) % 2 == 1:  # a polygon (segment) row: keep its box
        xs, ys = values[1::2], values[2::2]
        values = [values[0], (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2, max(xs) - min(xs), max(ys) - min(ys)]
    if len(values) != 5:
        raise _Corrupt(f"{where}: expected 5 values (class cx cy w h), got {len(values)}")
    cls, cx, cy, bw, bh = values
    if cls == int(cls) and cls >= nc:  # the usual cause: a names list shorter than the classes the labels use
        raise _Corrupt(f"{where}: class {parts[0]} is beyond the dataset yaml's key 'names', which lists {nc} classes")
    if cls != int(cls) or not 0 <= cls < nc:
        raise _Corrupt(f"{where}: class {parts[0]} is not an integer in 0..{nc - 1}")
    if bw <= 0 or bh <= 0:
        raise _Corrupt(f"{where}: box has zero or negative size")
    x1, y1, x2, y2 = cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2
    if min(x1, y1) < -COORD_TOLERANCE or max(x2, y2) > 1 + COORD_TOLERANCE:
        raise _Corrupt(f"{where}: box is outside the image (coordinates must be normalised to 0..1)")
    x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))  # just outside: clip
    if x2 <= x1 or y2 <= y1:  # all of it just outside, or thinner than a float step: nothing left to learn from
        raise _Corrupt(f"{where}: box has zero size inside the image")
    return [int(cls), x1, y1, x2, y2]


# ---------------------------------------------------------------------------------------------
# The label cache
# ---------------------------------------------------------------------------------------------


def files_fingerprint(image_files):
    """Changes when any image or label is added, removed, resized or touched."""
    h = hashlib.sha256()
    hash_file_stats(h, (p for f in image_files for p in (f, label_path(f))))
    return h.hexdigest()


def hash_file_stats(h, paths):
    """Each path's size and modification time (or its absence) into the hash h."""
    for p in paths:
        try:
            st = os.stat(p)
            h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}|-\n".encode())


def cache_locations(sources, image_files):
    """(cache, log) path pairs: next to the labels first, the user's cache folder second.
    The name carries a digest of the split's sources, so a train.txt and a val.txt listing images
    of the same folder do not overwrite each other's cache and log."""
    labels = Path(label_path(image_files[0])).parent
    if not labels.is_dir():  # no label at all (all background): next to the images, never a folder of ours
        labels = Path(image_files[0]).parent
    digest = hashlib.sha256("\n".join(sorted(str(Path(s).resolve()) for s in sources)).encode()).hexdigest()
    stem = f"{labels.name}.{digest[:8]}"
    elsewhere = f"{stem}.{hashlib.sha256(str(labels.resolve()).encode()).hexdigest()[:8]}"
    return [
        (labels.with_name(stem + ".cache.npz"), labels.with_name(stem + ".verify.log")),
        (cache_dir() / (elsewhere + ".cache.npz"), cache_dir() / (elsewhere + ".verify.log")),
    ]


def annotated_items(sources):
    """The utils.data.voc.VocItem / utils.data.coco_json.CocoItem of every image of a VOC or COCO json split, sorted by
    image path (as list_images sorts a YOLO split); None for a YOLO split."""
    if len(sources) == 1 and isinstance(sources[0], HeldOut):
        items = annotated_items(sources[0].sources)
        return None if items is None else sources[0].pick(items, image=lambda item: item.image)
    kinds = {type(s) for s in sources}
    if not kinds & {VocSplit, CocoSplit}:
        return None
    if len(kinds) > 1:
        raise DatasetError(f"{', '.join(map(str, sources))} mix formats; a split is one of {FORMATS_READ}")
    items = {}
    for src in sources:
        for item in (voc if isinstance(src, VocSplit) else coco_json).split_items(src):
            items.setdefault(item.image, item)
    return [items[k] for k in sorted(items)]


def annotated_fingerprint(sources, items):
    """files_fingerprint for a VOC or COCO json split: every image and annotation file, and the class order."""
    h = hashlib.sha256(f"reader {READER_VERSION}\n".encode())
    for source in sources:  # its repr carries the class order: names (VOC) or category ids (COCO json)
        h.update(f"{source!r}\n".encode())
    annotations = sorted({getattr(item, "xml", None) or item.json for item in items})
    hash_file_stats(h, [item.image for item in items] + annotations)
    return h.hexdigest()


def annotated_cache_locations(sources):
    """cache_locations for a VOC or COCO json split: our cache folder only (never the dataset's folders)."""
    first = sources[0].sources[0] if isinstance(sources[0], HeldOut) else sources[0]
    kind = "voc" if isinstance(first, VocSplit) else "coco"
    digest = hashlib.sha256("\n".join(str(Path(s).resolve()) for s in sources).encode()).hexdigest()[:16]
    return [(cache_dir() / f"{kind}.{digest}.cache.npz", cache_dir() / f"{kind}.{digest}.verify.log")]


def read_cache(cache_path, fingerprint, nc, max_pixels=MAX_PIXELS):
    """(Records, meta) of a cache written for exactly these files, this class count and this --max-pixels (it
    decides which images are excluded), else None."""
    wanted = {"version": CACHE_VERSION, "fingerprint": fingerprint, "nc": nc, "max_pixels": max_pixels}
    try:
        records, meta = Records.load(cache_path)
        if all(meta.get(k) == v for k, v in wanted.items()):
            return records, meta
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # missing or unreadable: verified again
    return None


def load_verified(sources, nc, split_name="", workers=None, max_pixels=MAX_PIXELS):
    """Verify every image/label of a split once and cache the result next to the labels.
    Returns the good records as utils.data.records.Records (flat arrays; records[i] is {"im", "shape" (h, w),
    "labels" (k, 5) [cls, x1, y1, x2, y2] normalised}). The cache is a binary .npz that loads in a fraction
    of a second. Never writes to the user's images or labels; a read-only dataset folder works (cache elsewhere).
    workers: how many verify at once (default: every core this process may use; under DDP the caller shares
    the machine's cores out, utils.settings.default_workers). max_pixels: --max-pixels, images with more are excluded.
    """
    limit_pixels(max_pixels)
    items = annotated_items(sources)  # None: YOLO txt
    image_files = list_images(sources) if items is None else [item.image for item in items]
    if not image_files:
        raise DatasetError(f"no images found in {', '.join(str(s) for s in sources) or 'an empty list of sources'}")
    if items is None:
        fingerprint, locations = files_fingerprint(image_files), cache_locations(sources, image_files)
    else:
        fingerprint, locations = annotated_fingerprint(sources, items), annotated_cache_locations(sources)
    for cache_path, log_path in locations:
        cached = read_cache(cache_path, fingerprint, nc, max_pixels)
        if cached is not None:
            records, meta = cached
            print_verification_totals(meta["totals"], split_name, log_path, meta["problems"], cached=True)
            # checked from the cache too: the second run on a set with no usable image went on with none
            # (found by tests/test_hostile.py)
            return _some_usable(records, image_files, split_name, log_path, meta["problems"])

    records, totals, problems = _verify_all(
        items or image_files, nc, split_name, workers or default_workers(), max_pixels
    )
    meta = {"version": CACHE_VERSION, "fingerprint": fingerprint, "nc": nc, "max_pixels": max_pixels}
    meta.update(totals=totals, problems=problems)
    written = _write_cache(locations, records, meta, split_name)
    print_verification_totals(totals, split_name, written, problems, cached=False)
    return _some_usable(records, image_files, split_name, written, problems)


def _some_usable(records, image_files, split_name, log_path, problems):
    """The records, unless there are none: DatasetError with the first reason (the sentence is often all a user
    reads: a names list shorter than the classes used excludes every image) and where the others are."""
    if not records:
        first = ": ".join(problems[0].split("\t")[1:]) if problems else "no reason recorded"  # path: reason
        raise DatasetError(
            f"none of the {len(image_files)} {split_name} images is usable (e.g. {first}"
            + (f"; every reason is in {log_path})" if log_path else ")")
        )
    return records


def _verify_all(image_files, nc, split_name, workers, max_pixels=MAX_PIXELS):
    """verify_one on every file (verify_annotated on every item of a VOC or COCO json split): (Records of the
    usable ones, totals by status, one line per problem)."""
    totals = dict.fromkeys(("found", "labelled", "background", "empty", "missing", "corrupt", "duplicates"), 0)
    records, problems = [], []
    annotated = not isinstance(image_files[0], str)
    # Header and label parsing is Python, held by the GIL: a large set is spread over processes, one per
    # core this process may use; a small one runs in threads.
    processes = len(image_files) >= VERIFY_IN_PROCESSES_FROM and workers > 1
    pool = multiprocessing.get_context("fork").Pool(workers) if processes else ThreadPoolExecutor(workers)
    with pool:
        check = functools.partial(verify_annotated, max_pixels=max_pixels)
        if not annotated:
            check = functools.partial(verify_one, nc=nc, max_pixels=max_pixels)
        results = pool.imap(check, image_files, chunksize=64) if processes else pool.map(check, image_files)
        for entry, (status, record, note) in tqdm(
            zip(image_files, results), total=len(image_files), desc=f"verifying {split_name} images", leave=False
        ):
            image_path = entry.image if annotated else entry
            totals["found"] += 1
            totals[status] += 1
            if record is not None:
                totals["duplicates"] += record.pop("dup", 0)
                records.append(record)
            if note:  # one line per file: status, path, reason (fixed = kept after a repair in memory)
                problems.append(f"{status if record is None else 'fixed'}\t{image_path}\t{note}")
    return Records.from_dicts(records), totals, problems


def _write_cache(locations, records, meta, split_name):
    """Write the cache and the problem log at the first of `locations` that takes them; returns that log's
    path, or None where none could be written (then the split is verified again next time)."""
    error = None
    for i, (cache_path, log_path) in enumerate(locations):
        try:
            if cache_path.parent == cache_dir():  # ours may not exist yet; the user's folders are never created
                cache_path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporary_files(cache_path.parent)  # of a build killed while it wrote its cache
            write_text_atomic(log_path, "".join(p + "\n" for p in meta["problems"]))
            atomic_write(cache_path, lambda f: records.save(f, meta))
            if i:
                log.warning(
                    f"{split_name}: cannot write the label cache next to the labels ({error}); "
                    f"it is in {cache_path.parent}"
                )
            return log_path
        except OSError as e:
            # the disk full (with the space left), read-only, no permission: the run goes on
            error = why_not_written(e, cache_path.parent)
    log.warning(
        f"{split_name}: cannot write the label cache {locations[0][0]} ({error}); verification will run again next time"
    )
    return None


def single_class(records):
    """--single-cls: the same records with every box of class 0 (the cached records are not changed)."""
    return as_records(records).single_class()


def select_records(train, val, names, subset=0, fraction=1.0, single_cls=False):
    """--subset, --fraction and --single-cls applied: (train, val, names, nc). --single-cls trains every class as
    one, 'object': a detector of where things are, whatever they are."""
    if not 0 < fraction <= 1:
        raise DatasetError(f"--fraction {fraction} must be in (0, 1]")
    if subset:
        train, val = train[:subset], val[:subset]
    train = train[: max(1, round(len(train) * fraction))]
    if single_cls:
        return single_class(train), single_class(val), ["object"], 1
    return train, val, names, len(names)


def print_verification_totals(totals, split_name, log_path, problems, cached):
    """One line of totals; when files were excluded, the log file's path and the first few reasons."""
    t = totals
    excluded = t["missing"] + t["corrupt"]
    log.info(
        f"{split_name} images: {t['found']} found, {t['labelled']} labelled, {t['background'] + t['empty']} background "
        f"({t['background']} without label file, {t['empty']} with an empty one), "
        f"{t['missing']} missing, {t['corrupt']} corrupt"
        + (f", {t['duplicates']} duplicate label rows removed" if t["duplicates"] else "")
        + (" (from the cache)" if cached else "")
    )
    if excluded or t["duplicates"]:
        where = f"every file and its reason is in {log_path}" if log_path else "the reasons follow"
        log.warning(f"{split_name}: {excluded} of {t['found']} images excluded; {where}")
        shown = problems if not log_path else problems[:5]
        for p in shown:
            log.warning("  " + p.replace("\t", "  "))
        if len(problems) > len(shown):
            log.warning(f"  ... and {len(problems) - len(shown)} more")
