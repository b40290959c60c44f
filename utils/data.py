"""Data: the dataset yaml, label verification and its cache, the training and validation
datasets, and the deterministic sampler that makes exact resume possible.

Images are read with cv2 (BGR) and converted to RGB once, in `read_image`; everything after
works on uint8 RGB; the training loop divides by 255 on the device (pitfalls D1-D4: channel order
and value range mixed up between libraries).
"""

import atexit
import functools
import glob
import hashlib
import logging
import multiprocessing
import os
import random
import resource
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch
import yaml
from PIL import Image
from tqdm import tqdm

from utils.augment import augment_hsv, flip_lr, flip_ud, letterbox, mosaic4, random_affine
from utils.general import atomic_write, write_text_atomic  # module globals: tests replace them (read-only folder)
from utils.records import Records, as_records

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".dng", ".mpo", ".pfm"}
CACHE_VERSION = 3  # bump when the record or the checks change: old caches are then rebuilt
VERIFY_IN_PROCESSES_FROM = 2000  # images; fewer are verified in threads (a process pool costs ~0.1 s to start)
COORD_TOLERANCE = 0.01  # coordinates this far outside [0, 1] are clipped; further out, the file is rejected
log = logging.getLogger("yolo")


class DatasetError(ValueError):
    """A dataset yaml or folder that cannot be used; the message is one sentence naming the culprit."""


def fix_cv2_and_file_limits():
    """Call in the main process and in every DataLoader worker."""
    cv2.setNumThreads(0)  # pitfall D7: cv2's own threads inside forked workers deadlock or crawl
    cv2.ocl.setUseOpenCL(False)  # pitfall D7: OpenCL next to CUDA slows things down
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # pitfall D6: many workers exhaust file descriptors
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit some systems refuse as a soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


# ---------------------------------------------------------------------------------------------
# The dataset yaml
# ---------------------------------------------------------------------------------------------


def apply_dataset_defaults(args, parser, data, given_flags):
    """Set the settings a dataset yaml recommends under `defaults:` (shapes.yaml does) on `args`, except
    those given as flags: a flag written on the command line wins. Values take the type of the flag."""
    for key, value in data["defaults"].items():
        if not hasattr(args, key):
            raise DatasetError(f"{data['yaml']}: key 'defaults' names '{key}', which is not a train.py setting")
        if key in given_flags:
            continue
        default = parser.get_default(key)
        try:
            setattr(args, key, value if default is None or isinstance(default, bool) else type(default)(value))
        except (TypeError, ValueError):  # "many" or [7] for an int
            raise DatasetError(
                f"{data['yaml']}: key 'defaults' sets '{key}' to {value!r}, which is not a {type(default).__name__}"
            ) from None


def load_dataset_yaml(path):
    """Read a YOLOv5/Ultralytics dataset yaml. Returns a dict with `root`, `train`, `val`, `test`
    (lists of resolved sources: folders or .txt lists), `names` (list), `nc`, `yaml`, `coco_json` and
    `defaults` (the train.py settings the yaml recommends: apply_dataset_defaults).
    Keys we do not use (`download`, ...) are ignored, so a yaml copied from those repos works as is.
    The built-in shapes set is generated here on first use."""
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (Path(__file__).parents[1] / "data" / path).exists():
        path = Path(__file__).parents[1] / "data" / path  # `--data coco.yaml` finds data/coco.yaml
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

    defaults = cfg.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise DatasetError(f"{path}: key 'defaults' must be a mapping of train.py settings to values")
    out = {"root": root, "names": names, "nc": len(names), "yaml": path, "coco_json": None, "defaults": defaults}
    for key in ("train", "val", "test"):
        value = cfg.get(key)
        if not value:
            out[key] = []
            continue
        sources = []
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str):
                raise DatasetError(
                    f"{path}: key '{key}' must be a folder, a .txt list or a list of these, got {item!r}"
                )
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
        out[key] = sources
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


def list_images(sources):
    """Image files from folders (recursive) and .txt lists (one path per line, relative to the list)."""
    files = []
    for src in sources:
        src = Path(src)
        if not src.exists():
            raise DatasetError(f"{src} does not exist")
        if src.is_dir():
            files += [
                p for p in glob.glob(str(src / "**" / "*"), recursive=True) if Path(p).suffix.lower() in IMAGE_SUFFIXES
            ]
        elif src.suffix == ".txt":
            for line in src.read_text().splitlines():
                line = line.strip()
                if line:
                    p = Path(line)
                    files.append(str(p if p.is_absolute() else (src.parent / p)))
        elif src.suffix.lower() in IMAGE_SUFFIXES:
            files.append(str(src))
        else:
            raise DatasetError(f"{src} is neither a folder, a .txt list nor an image")
    return sorted(set(os.path.normpath(f) for f in files))


def label_path(image_path):
    """The YOLO convention: .../images/x.jpg -> .../labels/x.txt (the last /images/ is swapped)."""
    head, sep, tail = image_path.rpartition(f"{os.sep}images{os.sep}")
    base = f"{head}{os.sep}labels{os.sep}{tail}" if sep else image_path
    return os.path.splitext(base)[0] + ".txt"


# ---------------------------------------------------------------------------------------------
# Verification and cache
# ---------------------------------------------------------------------------------------------


def read_image(path):
    """Read an image as RGB uint8, EXIF orientation applied (cv2.imread does), or None."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        return None
    # pitfalls D1-D2: cv2 reads BGR, the model and the HSV code expect RGB: convert once, here
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def jpeg_is_complete(path):
    """A JPEG must end with its end-of-image marker (FF D9); a truncated one still decodes in cv2
    (grey bottom, a warning on stderr), so decoding alone does not catch it. Padding after the
    marker (zeros, FF fill, a newline) is common and harmless."""
    return _tail(path).rstrip(b"\x00\xff\r\n\t ").endswith(b"\xff\xd9")


def png_is_complete(path):
    """A PNG ends with its IEND chunk; a header read alone would not notice a truncated file."""
    return b"IEND\xaeB`\x82" in _tail(path)


def _tail(path, n=1024):
    with open(path, "rb") as f:
        f.seek(max(os.path.getsize(path) - n, 0))
        return f.read()


def header_shape(path):
    """(h, w) read from the image's header (~0.1 ms, against 1-3 ms to decode a 640 px JPEG), as cv2.imread
    will return the image; None when the header cannot tell: a format PIL does not read, not an image at all,
    or an EXIF rotation (cv2 applies it: then the caller decodes, and gets the size cv2 will use)."""
    try:
        with Image.open(path) as image:
            if image.getexif().get(0x0112, 1) != 1:  # the EXIF orientation tag
                return None
            w, h = image.size
            return h, w
    except Exception:  # PIL raises a dozen different types for files it cannot parse; the caller decides
        return None


def verify_one(image_path, nc):
    """Check one image and its label file; never modifies them. Returns (status, record, note):
    status in labelled / background / empty / missing / corrupt; record (None when the image is
    excluded) is what the dataset keeps; note says what was wrong or what was fixed."""
    lp = label_path(image_path)
    try:
        if not os.path.exists(image_path):
            return "missing", None, "image not found"
        if os.path.getsize(image_path) == 0:
            return "corrupt", None, "image file is empty (0 bytes)"
        with open(image_path, "rb") as f:
            magic = f.read(8)
        if magic[:3] == b"\xff\xd8\xff" and not jpeg_is_complete(image_path):  # by content: suffixes lie
            return "corrupt", None, "truncated JPEG (no end-of-image marker)"
        if magic == b"\x89PNG\r\n\x1a\n" and not png_is_complete(image_path):
            return "corrupt", None, "truncated PNG (no IEND chunk)"
        shape = header_shape(image_path)  # the cheap check first: a header, plus the end markers above
        if shape is None:
            img = cv2.imread(image_path, cv2.IMREAD_COLOR)  # applies the EXIF orientation, as training will
            if img is None:
                return "corrupt", None, "not a readable image (cannot be decoded)"
            shape = img.shape[:2]
        h, w = shape
        if h < 10 or w < 10:
            return "corrupt", None, f"image is only {w}x{h} pixels"
        if not os.path.exists(lp):
            return "background", {"im": image_path, "shape": [h, w], "labels": []}, ""
        rows, duplicates, seen = [], 0, set()
        with open(lp, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                parts = line.split()
                if not parts:
                    continue
                where = f"label {lp} line {line_no}"
                try:
                    values = [float(v) for v in parts]
                except ValueError:
                    return "corrupt", None, f"{where}: not numbers: {line.strip()[:60]!r}"
                if not all(np.isfinite(values)):
                    return "corrupt", None, f"{where}: a value is not finite"
                if len(values) > 5 and len(values) % 2 == 1:  # a polygon (segment) row: keep its box
                    xs, ys = values[1::2], values[2::2]
                    values = [
                        values[0],
                        (min(xs) + max(xs)) / 2,
                        (min(ys) + max(ys)) / 2,
                        max(xs) - min(xs),
                        max(ys) - min(ys),
                    ]
                if len(values) != 5:
                    return "corrupt", None, f"{where}: expected 5 values (class cx cy w h), got {len(values)}"
                cls, cx, cy, bw, bh = values
                if cls != int(cls) or not 0 <= cls < nc:
                    return "corrupt", None, f"{where}: class {parts[0]} is not an integer in 0..{nc - 1}"
                if bw <= 0 or bh <= 0:
                    return "corrupt", None, f"{where}: box has zero or negative size"
                x1, y1, x2, y2 = cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2
                if min(x1, y1) < -COORD_TOLERANCE or max(x2, y2) > 1 + COORD_TOLERANCE:
                    return (
                        "corrupt",
                        None,
                        f"{where}: box is outside the image (coordinates must be normalised to 0..1)",
                    )
                x1, y1, x2, y2 = (min(max(v, 0.0), 1.0) for v in (x1, y1, x2, y2))  # just outside: clip
                key = (int(cls), round(x1, 6), round(y1, 6), round(x2, 6), round(y2, 6))
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
                rows.append([int(cls), x1, y1, x2, y2])
        note = f"{duplicates} duplicate label rows removed" if duplicates else ""
        return (
            ("labelled" if rows else "empty"),
            {"im": image_path, "shape": [h, w], "labels": rows, "dup": duplicates},
            note,
        )
    except UnicodeDecodeError:
        return "corrupt", None, f"label {lp} is not a text file"
    except (OSError, cv2.error) as e:
        return "corrupt", None, f"cannot be read ({e})"


def files_fingerprint(image_files):
    """Changes when any image or label is added, removed, resized or touched."""
    h = hashlib.sha256()
    for f in image_files:
        for p in (f, label_path(f)):
            try:
                st = os.stat(p)
                h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(f"{p}|-\n".encode())
    return h.hexdigest()


def cache_dir():
    """Where the label cache goes when the dataset folder is read-only (a shared mount)."""
    return Path(
        os.environ.get("YOLO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "yolo"
    )


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


def read_cache(cache_path, fingerprint, nc):
    """(Records, meta) of a cache written for exactly these files and this class count, else None."""
    try:
        records, meta = Records.load(cache_path)
        if meta.get("version") == CACHE_VERSION and meta.get("fingerprint") == fingerprint and meta.get("nc") == nc:
            return records, meta
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # missing or unreadable: verified again
    return None


def load_verified(sources, nc, split_name="", workers=None):
    """Verify every image/label of a split once and cache the result next to the labels.
    Returns the good records as utils.records.Records (flat arrays; records[i] is {"im", "shape" (h, w),
    "labels" (k, 5) [cls, x1, y1, x2, y2] normalised}). The cache is a binary .npz that loads in a fraction
    of a second. Never writes to the user's images or labels; a read-only dataset folder works (cache elsewhere)."""
    image_files = list_images(sources)
    if not image_files:
        raise DatasetError(f"no images found in {', '.join(str(s) for s in sources) or 'an empty list of sources'}")
    fingerprint = files_fingerprint(image_files)
    locations = cache_locations(sources, image_files)
    for cache_path, log_path in locations:
        cached = read_cache(cache_path, fingerprint, nc)
        if cached is not None:
            records, meta = cached
            print_verification_totals(meta["totals"], split_name, log_path, meta["problems"], cached=True)
            return records

    totals = dict.fromkeys(("found", "labelled", "background", "empty", "missing", "corrupt", "duplicates"), 0)
    records, problems = [], []
    # Header and label parsing is Python, held by the GIL: a large set is spread over processes, one per
    # core this process may use (~8 s for COCO's 118k images on 8 cores); a small one runs in threads.
    workers = workers or max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    processes = len(image_files) >= VERIFY_IN_PROCESSES_FROM and workers > 1
    pool = multiprocessing.get_context("fork").Pool(workers) if processes else ThreadPoolExecutor(workers)
    with pool:
        check = functools.partial(verify_one, nc=nc)
        results = pool.imap(check, image_files, chunksize=64) if processes else pool.map(check, image_files)
        for image_path, (status, record, note) in tqdm(
            zip(image_files, results), total=len(image_files), desc=f"verifying {split_name} images", leave=False
        ):
            totals["found"] += 1
            totals[status] += 1
            if record is not None:
                totals["duplicates"] += record.pop("dup", 0)
                records.append(record)
            if note:  # one line per file: status, path, reason (fixed = kept after a repair in memory)
                problems.append(f"{status if record is None else 'fixed'}\t{image_path}\t{note}")
    records = Records.from_dicts(records)
    meta = {"version": CACHE_VERSION, "fingerprint": fingerprint, "nc": nc, "totals": totals, "problems": problems}
    written, error = None, None
    for i, (cache_path, log_path) in enumerate(locations):
        try:
            if i:  # our own cache folder may not exist yet; the user's folders are never created
                cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(log_path, "".join(p + "\n" for p in problems))
            atomic_write(cache_path, lambda f: records.save(f, meta))
            written = log_path
            if i:
                log.warning(
                    f"{split_name}: cannot write the label cache next to the labels ({error}); "
                    f"it is in {cache_path.parent}"
                )
            break
        except OSError as e:
            error = e
    if written is None:  # nowhere writable: still works, verifies again next time
        log.warning(
            f"{split_name}: cannot write the label cache {locations[0][0]} ({error}); "
            "verification will run again next time"
        )
    print_verification_totals(totals, split_name, written, problems, cached=False)
    if not records:
        raise DatasetError(
            f"none of the {len(image_files)} {split_name} images is usable"
            + (f" (reasons in {written})" if written else f" (e.g. {problems[0]})")
        )
    return records


def single_class(records):
    """--single-cls: the same records with every box of class 0 (the cached records are not changed)."""
    return as_records(records).single_class()


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


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


def load_resized(record, imgsz, cache=None, index=None):
    """RGB uint8 image resized so its long side is imgsz, and its labels in pixels of that size."""
    img = cache[index] if cache is not None and cache[index] is not None else None
    if img is None:
        img = read_image(record["im"])
        if img is None:
            raise OSError(f"image {record['im']} can no longer be read")
        h, w = img.shape[:2]
        r = imgsz / max(h, w)
        if r != 1:  # resized_shapes: the one rounding rule, also behind the RAM cache's buffer
            nh, nw = resized_shapes((h, w), imgsz)[0]
            img = cv2.resize(img, (int(nw), int(nh)), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    h, w = img.shape[:2]
    labels = np.array(record["labels"], dtype=np.float32).reshape(-1, 5)
    labels[:, [1, 3]] *= w
    labels[:, [2, 4]] *= h
    return img, labels


def available_memory():
    """Bytes of RAM the kernel can give without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def resized_shapes(shapes, imgsz):
    """(h, w) of each image after load_resized, from the (h, w) as read: the long side becomes imgsz, the
    short one is rounded, and never below 1 px (utils/boxes.resized_side's rule, for many shapes at once)."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
    r = imgsz / shapes.max(1, keepdims=True)
    return np.maximum(1, np.round(shapes * r)).astype(np.int64)  # round half to even, as Python's round()


def cache_images(records, imgsz, workers=8, shared=False):
    """--cache ram: decode and resize every image once, into one buffer, before the workers fork (they
    share its pages). First the memory it needs is estimated from the image sizes and compared with what is
    free: if it does not fit, one warning and None (images are then read from disk), instead of the kernel
    killing the run hours later. shared=True (the training set under DDP): the processes of one machine
    share one copy, a file in /dev/shm that local rank 0 fills and every process maps; it is unlinked as
    soon as all have mapped it, so nothing is left behind, even after a kill -9."""
    records = as_records(records)
    shapes = resized_shapes(records.shapes, imgsz)
    sizes = shapes[:, 0] * shapes[:, 1] * 3
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    shared = shared and local_size > 1 and torch.distributed.is_initialized() and os.path.isdir("/dev/shm")
    copies = 1 if shared else local_size  # without sharing, each process of this machine holds its own
    free = available_memory()
    fits = free is None or offsets[-1] * copies <= 0.8 * free  # the rest is for the model, workers, the OS
    if shared:  # every process must take the same way through the barriers below: rank 0's verdict
        verdict = [fits]
        torch.distributed.broadcast_object_list(verdict, src=0)
        fits = verdict[0]
    if not fits:
        log.warning(
            f"--cache ram: {len(records)} images at {imgsz} px need {offsets[-1] * copies / 1e9:.1f} GB "
            f"({copies} {'copy' if copies == 1 else 'copies'}) but {(free or 0) / 1e9:.1f} GB of RAM are free; "
            "training without the RAM cache (images are read from disk each time)"
        )
        return None
    # One buffer: every image, then one byte per image (1: cached; 0: unreadable, read again when drawn).
    size, local_rank = int(offsets[-1]) + len(records), int(os.environ.get("LOCAL_RANK", 0))
    fills = not shared or local_rank == 0
    if shared:
        key = hashlib.sha256(records.path_bytes.tobytes() + f"{imgsz}|{os.environ.get('MASTER_PORT')}".encode())
        path = f"/dev/shm/yolo-cache-{key.hexdigest()[:16]}"
        buffer = np.memmap(path, np.uint8, "w+", shape=(size,)) if fills else None
    else:
        buffer = np.empty(size, np.uint8)

    def fill(i):
        try:
            image = buffer[offsets[i] : offsets[i + 1]].reshape(shapes[i][0], shapes[i][1], 3)
            image[...] = load_resized(records[i], imgsz)[0]
            buffer[offsets[-1] + i] = 1
        except (OSError, ValueError):  # unreadable now, or another size than at verification
            buffer[offsets[-1] + i] = 0

    if fills:
        with ThreadPoolExecutor(workers) as pool:
            list(tqdm(pool.map(fill, range(len(records))), total=len(records), desc="caching images", leave=False))
    if shared:
        if fills:
            buffer.flush()
        torch.distributed.barrier()  # filled
        if not fills:
            buffer = np.memmap(path, np.uint8, "r", shape=(size,))
        torch.distributed.barrier()  # mapped everywhere: the name can go, the memory stays while mapped
        if fills:
            os.unlink(path)
    cached = buffer[offsets[-1] :]
    images = [
        buffer[offsets[i] : offsets[i + 1]].reshape(h, w, 3) if cached[i] else None for i, (h, w) in enumerate(shapes)
    ]
    where = f", one copy shared by the {local_size} processes of this machine" if shared else ""
    log.info(f"cached {len(records)} images in RAM ({offsets[-1] / 1e9:.2f} GB{where})")
    return images


def sample_rng(seed, epoch, index):
    """The generator for every random choice of one sample: a pure function of (seed, epoch, index),
    so the data does not depend on the worker count, the worker's RNG, or restarts."""
    return np.random.default_rng([seed, epoch, index])


class TrainDataset(torch.utils.data.Dataset):
    """Training samples with mosaic, affine, HSV, flips (and mixup). Indexed by (epoch, index)."""

    def __init__(self, records, imgsz, hyp, seed=0, mosaic_epochs=None, cache_ram=False):
        self.records, self.imgsz, self.hyp, self.seed = records, imgsz, hyp, seed
        self.mosaic_epochs = mosaic_epochs  # mosaic is used while epoch < mosaic_epochs (None: always)
        self.cache = cache_images(records, imgsz, shared=True) if cache_ram else None
        self.warned = set()

    def __len__(self):
        return len(self.records)

    def load(self, index, rng):
        """Load one image; a file that broke or disappeared during training is reported and replaced."""
        for _ in range(len(self.records)):
            try:
                return load_resized(self.records[index], self.imgsz, self.cache, index)
            except OSError as e:
                if index not in self.warned:
                    self.warned.add(index)
                    print(f"WARNING: {e}; replaced by another image", file=sys.stderr)
                index = int(rng.integers(len(self.records)))
        raise OSError("no image of the training set can be read any more")

    def __getitem__(self, key):
        epoch, index = key
        rng = sample_rng(self.seed, epoch, index)
        hyp, s = self.hyp, self.imgsz
        use_mosaic = rng.random() < hyp["mosaic"] and (self.mosaic_epochs is None or epoch < self.mosaic_epochs)
        if use_mosaic:
            img, labels = self.load_mosaic(index, rng)
            if hyp["mixup"] and rng.random() < hyp["mixup"]:
                img2, labels2 = self.load_mosaic(int(rng.integers(len(self))), rng)
                lam = rng.beta(32.0, 32.0)
                img = (img * lam + img2 * (1 - lam)).astype(np.uint8)
                labels = np.concatenate((labels, labels2), 0)
        else:
            img, labels = self.load(index, rng)
            img, ratio, (left, top) = letterbox(img, (s, s))
            labels[:, 1:] = labels[:, 1:] * ratio + (left, top, left, top)
            img, labels = random_affine(img, labels, rng, hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"])
        augment_hsv(img, rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
        if rng.random() < hyp["fliplr"]:
            img, labels = flip_lr(img, labels)
        if rng.random() < hyp["flipud"]:
            img, labels = flip_ud(img, labels)
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))  # uint8 RGB, CHW
        return image, torch.from_numpy(labels.astype(np.float32)).reshape(-1, 5)

    def load_mosaic(self, index, rng):
        indices = [index] + [int(i) for i in rng.integers(0, len(self), 3)]
        loaded = [self.load(i, rng) for i in indices]
        hyp = self.hyp
        images, labels = [im for im, _ in loaded], [lb for _, lb in loaded]
        canvas, labels = mosaic4(images, labels, self.imgsz, rng, hyp["mosaic_min_area"])
        border = (-self.imgsz // 2, -self.imgsz // 2)
        return random_affine(canvas, labels, rng, hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"], border)


class ValDataset(torch.utils.data.Dataset):
    """Letterboxed, unaugmented samples in rectangular batches: images are sorted by aspect ratio and
    each batch is padded only to its own shape (a multiple of the stride), which is faster and more
    accurate than squares. Keeps what is needed to map predictions back to original pixels."""

    def __init__(self, records, imgsz, batch_size, stride=32, pad=0.5, cache_ram=False):
        records = as_records(records)
        order = np.argsort(records.shapes[:, 0] / records.shapes[:, 1], kind="stable")  # similar shapes together
        self.records = records.take(order)
        self.imgsz = imgsz
        self.cache = cache_images(self.records, imgsz) if cache_ram else None
        aspect = self.records.shapes[:, 0] / self.records.shapes[:, 1]  # h / w
        self.shapes = []
        for start in range(0, len(self.records), batch_size):
            a = aspect[start : start + batch_size]
            hw = (a.max(), 1.0) if a.max() < 1 else (1.0, 1 / a.min()) if a.min() > 1 else (1.0, 1.0)
            shape = tuple(int(np.ceil(v * imgsz / stride + pad) * stride) for v in hw)
            self.shapes += [shape] * len(a)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        record = self.records[index]
        img, labels = load_resized(record, self.imgsz, self.cache, index)
        h0, w0 = record["shape"]
        # The long side was resized to exactly imgsz, the short one rounded to whole pixels:
        # scale_boxes_to_original recovers each side's exact factor from this nominal one.
        resize = max(img.shape[:2]) / max(h0, w0)
        img, ratio, (left, top) = letterbox(img, self.shapes[index], scaleup=False)
        labels[:, 1:] = labels[:, 1:] * ratio + (left, top, left, top)
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        # total scale original -> network input, and the padding: what scale_boxes_to_original needs
        meta = {"index": index, "path": record["im"], "shape": (h0, w0), "ratio": resize * ratio, "pad": (left, top)}
        return image, torch.from_numpy(labels).reshape(-1, 5), meta


def collate(batch):
    """Stack images; targets become one (N, 6) tensor of (image index in batch, class, x1, y1, x2, y2)."""
    images = torch.stack([b[0] for b in batch])
    targets = [torch.cat((torch.full((len(b[1]), 1), i, dtype=torch.float32), b[1]), 1) for i, b in enumerate(batch)]
    out = (images, torch.cat(targets, 0))
    return out + ([b[2] for b in batch],) if len(batch[0]) > 2 else out


# ---------------------------------------------------------------------------------------------
# Sampling and loaders
# ---------------------------------------------------------------------------------------------


def epoch_order(n, seed, epoch):
    """The sample order of an epoch: a pure function of (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def multi_scale_size(imgsz, seed, iteration, stride=32):
    """--multi-scale: the training size of an iteration, 0.5x to 1.5x imgsz, always a multiple of the
    stride (the levels of the network must halve evenly). A pure function of (seed, iteration), so
    every DDP rank draws the same size without talking (pitfall M4: else a rank with a small size
    waits for one with a large size) and a resumed run draws the same."""
    rng = random.Random(seed * 1_000_003 + iteration)
    return max(rng.randrange(imgsz // 2, imgsz * 3 // 2 + stride) // stride * stride, stride)


def multi_scale_max(imgsz, stride=32):
    """The largest size multi_scale_size draws for imgsz (what --batch -1 must measure at)."""
    return (imgsz * 3 // 2 + stride - 1) // stride * stride


class EpochBatchSampler:
    """Yields batches of (epoch, index) forever, epoch after epoch, from (start_epoch, skip_batches).

    Never ending on purpose (pitfall D8): the DataLoader's workers are created once and live
    for the whole run, instead of being re-created each epoch with code the user has edited since.
    Each DDP rank takes a fixed slice of the epoch's order; all ranks get the same batch count."""

    def __init__(self, n, batch_size, seed=0, rank=0, world_size=1, start_epoch=0, skip_batches=0):
        if n < 1 or batch_size < 1:
            raise ValueError(
                f"EpochBatchSampler needs at least one sample and a batch size of at least 1, got {n} and {batch_size}"
            )
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.start_epoch, self.skip_batches = start_epoch, skip_batches
        self.per_rank = -(-n // world_size)
        self.batches_per_epoch = -(-self.per_rank // batch_size)

    def __len__(self):
        return self.batches_per_epoch

    def batches(self, epoch):
        order = epoch_order(self.n, self.seed, epoch)
        total = self.per_rank * self.world_size
        order = (order * -(-total // self.n))[:total]  # pad (wrapping) so every rank gets as many: no rank waits
        mine = order[self.rank :: self.world_size]
        return [[(epoch, i) for i in mine[k : k + self.batch_size]] for k in range(0, len(mine), self.batch_size)]

    def __iter__(self):
        epoch, skip = self.start_epoch, self.skip_batches
        while True:
            yield from self.batches(epoch)[skip:]  # resuming mid-epoch: skip what was already trained on
            epoch, skip = epoch + 1, 0


def _worker_init(main_exiting, _):
    fix_cv2_and_file_limits()  # every worker is a new process: apply the fixes there too
    # SIGTERM to the whole process group (SLURM pre-emption, kill -- -PGID) and Ctrl+C reach the workers
    # too: they must live on, so that the main process can finish its step and save last.pt. Once the
    # main process is exiting, SIGTERM ends them again (multiprocessing terminates its children then, and
    # waits for them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0) if main_exiting.is_set() else None)
    torch.set_num_threads(1)  # a worker needs no intra-op threads; they would fight the main process


@functools.cache
def _main_exiting():
    """One event per process, shared by all its loaders' workers, set when the process exits."""
    event = multiprocessing.Event()
    atexit.register(event.set)  # runs before multiprocessing's exit hook (registered earlier, by `import torch`)
    return event


def make_loader(dataset, batch_sampler=None, batch_size=None, workers=2, pin_memory=False):
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        batch_size=batch_size if batch_sampler is None else 1,
        shuffle=False,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        worker_init_fn=functools.partial(_worker_init, _main_exiting()),
        persistent_workers=workers > 0,  # pitfall D8: workers re-created each epoch would re-import code edited since
        prefetch_factor=4 if workers > 0 else None,
    )
