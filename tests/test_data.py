"""The data pipeline (issue 2): dataset yamls, verification and its cache, colour order,
augmentations that keep boxes right, determinism for exact resume, loader hygiene, validation
loading, the built-in shapes set and the COCO converters.

Every dataset here is a few tiny images written into tmp_path, so the file runs in seconds.
"""

import errno
import hashlib
import itertools
import logging
import os
import shutil
import signal
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from utils.boxes import scale_boxes_to_original
from utils.data import labels as L
from utils.data import loader as D
from utils.data.augment import (
    PAD_VALUE,
    draw_tiles,
    drawn_boxes,
    flip,
    letterbox,
    mosaic_offsets,
    random_affine_matrix,
    tile_boxes,
)
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.images import cache_images, read_image, resized_shapes
from utils.data.records import Records
from utils.data.shapes import NAMES, STYLES, draw_image, make_shapes
from utils.distributed import NodeShare
from utils.hyperparameters import HYP
from utils.settings import apply_dataset_defaults

REPO = Path(__file__).resolve().parents[1]

# The augmentation table train.py uses by default (the one table, not a copy), and one with every augmentation off.
NO_AUG = dict(HYP, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, translate=0.0, scale=0.0, fliplr=0.0, mosaic=0.0)

# Pure colours (RGB) of the test rectangles: colour k is class k.
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def write_image(path, w, h, rects=(), background=(0, 0, 0)):
    """An RGB image of a flat background with filled rectangles (x1, y1, x2, y2, class) in pixels,
    written with cv2 (which takes BGR: convert so the file holds the RGB colours we mean)."""
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = background
    for x1, y1, x2, y2, cls in rects:
        img[y1:y2, x1:x2] = COLOURS[cls]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    return path


def write_labels(image_path, w, h, rects):
    """YOLO labels (class cx cy w h, normalised) of pixel rectangles, at the conventional place."""
    lp = Path(L.label_path(str(image_path)))
    lp.parent.mkdir(parents=True, exist_ok=True)
    lp.write_text(
        "".join(
            f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}\n"
            for x1, y1, x2, y2, c in rects
        )
    )


def rect_dataset(root, n=4, w=96, h=96, split="train", suffix=".png"):
    """n images, image k with one centred rectangle of colour/class k % 4 on black."""
    paths = []
    for k in range(n):
        rect = (w // 3, h // 3, 2 * w // 3, 2 * h // 3, k % 4)
        p = write_image(Path(root) / "images" / split / f"im{k}{suffix}", w, h, [rect])
        write_labels(p, w, h, [rect])
        paths.append(p)
    return Path(root) / "images" / split


def hash_tree(root):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def colour_mask(img, cls):
    """Pixels of colour `cls`: its full channels above half, its empty ones below half (edges
    blended by resizing count when they are more than half the colour)."""
    c = np.array(COLOURS[cls])
    img = np.asarray(img).astype(int)
    return np.all(np.where(c > 0, img > 160, img < 96), axis=-1)


def mask_box(mask):
    ys, xs = np.nonzero(mask)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float) if len(xs) else None


def assert_boxes_tight(img, labels, tol=1.5, region_margin=3, require_all_pixels=False):
    """Each label box tightly encloses the pixels of its class's colour around it (within tol px).
    img: HWC RGB uint8; labels: rows (class, x1, y1, x2, y2) in pixels."""
    img = np.asarray(img)
    h, w = img.shape[:2]
    assert len(labels), "expected at least one box"
    for cls, x1, y1, x2, y2 in np.asarray(labels, float):
        mask = colour_mask(img, int(cls))
        region = np.zeros_like(mask)
        region[
            max(int(y1) - region_margin, 0) : min(int(np.ceil(y2)) + region_margin, h),
            max(int(x1) - region_margin, 0) : min(int(np.ceil(x2)) + region_margin, w),
        ] = True
        found = mask_box(mask & region)
        assert found is not None, f"no pixel of class {int(cls)} near its box {x1, y1, x2, y2}"
        assert np.abs(found - (x1, y1, x2, y2)).max() <= tol, (
            f"class {int(cls)}: box {[x1, y1, x2, y2]} but pixels span {found.tolist()}"
        )
    if require_all_pixels:  # nothing coloured was left without a box
        for cls in set(int(c) for c in np.asarray(labels)[:, 0]):
            covered = np.zeros((h, w), bool)
            for c, x1, y1, x2, y2 in labels:
                if int(c) == cls:
                    covered[max(int(y1) - 2, 0) : int(np.ceil(y2)) + 2, max(int(x1) - 2, 0) : int(np.ceil(x2)) + 2] = (
                        True
                    )
            assert not (colour_mask(img, cls) & ~covered).any()


def chw_to_hwc(image):
    return image.permute(1, 2, 0).numpy()


@pytest.fixture(autouse=True)
def user_cache_dir(tmp_path, monkeypatch):
    """Where a label cache goes when a dataset folder is read-only: inside the test's folder."""
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user_cache"))
    return tmp_path / "user_cache"


@pytest.fixture
def log_lines(caplog):
    """The messages the pipeline logged (the 'yolo' logger), as one list of strings."""
    caplog.set_level(logging.INFO, logger="yolo")
    return lambda: [r.getMessage() for r in caplog.records]


# ---------------------------------------------------------------------------------------------
# 1. Dataset yaml
# ---------------------------------------------------------------------------------------------


def test_yaml_sources_folder_txt_list_and_lists_resolve_against_path(tmp_path):
    root = tmp_path / "sets" / "mine"
    train_dir = rect_dataset(root, n=3, split="train")
    extra = rect_dataset(root, n=2, split="extra")
    (root / "val.txt").write_text("./images/train/im0.png\nimages/train/im1.png\n")
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    # path relative to the yaml's own folder; names as a dict; nc given and consistent
    (cfg_dir / "mine.yaml").write_text(
        "path: ../sets/mine\ntrain: [images/train, images/extra]\nval: val.txt\n"
        "nc: 4\nnames: {0: a, 1: b, 2: c, 3: d}\n"
    )
    cwd = os.getcwd()
    os.chdir(tmp_path / "sets")  # not the yaml's folder: path must not depend on the working directory
    try:
        data = load_dataset_yaml(cfg_dir / "mine.yaml")
    finally:
        os.chdir(cwd)
    assert data["root"] == root.resolve()
    assert data["names"] == ["a", "b", "c", "d"] and data["nc"] == 4
    assert data["train"] == [train_dir.resolve(), extra.resolve()] and data["test"] == []
    assert len(L.list_images(data["train"])) == 5
    assert [Path(f).name for f in L.list_images(data["val"])] == ["im0.png", "im1.png"]
    # An old YOLOv5 yaml: no `path`, folders named from the working directory.
    (cfg_dir / "old.yaml").write_text("train: ../mine/images/train\nval: ../mine/val.txt\nnames: [a, b, c, d]\n")
    os.chdir(tmp_path / "sets" / "mine")
    try:
        assert load_dataset_yaml(cfg_dir / "old.yaml")["train"] == [train_dir.resolve()]
    finally:
        os.chdir(cwd)
    # names as a list, no nc: nc is its length
    (cfg_dir / "list.yaml").write_text(
        f"path: {root}\ntrain: images/train\nval: images/train\nnames: [a, b, c, d, e]\n"
    )
    assert load_dataset_yaml(cfg_dir / "list.yaml")["nc"] == 5


def test_label_path_convention_and_background_images(tmp_path):
    assert L.label_path("/d/images/train/x.jpg") == "/d/labels/train/x.txt"
    assert L.label_path("/images/d/images/a.b.PNG") == "/images/d/labels/a.b.txt"  # the last /images/ only
    assert L.label_path("/d/flat/x.jpg") == "/d/flat/x.txt"  # no images/ folder: label next to the image
    folder = rect_dataset(tmp_path, n=2)
    write_image(folder / "no_label.png", 64, 64)  # no label file: a background image, not an error
    records = L.load_verified([folder], nc=4, split_name="train")
    by_name = {Path(r["im"]).name: r for r in records}
    assert len(records) == 3 and len(by_name["no_label.png"]["labels"]) == 0
    assert by_name["im1.png"]["labels"].tolist() == [
        [
            1,
            pytest.approx(1 / 3, abs=1e-5),
            pytest.approx(1 / 3, abs=1e-5),
            pytest.approx(2 / 3, abs=1e-5),
            pytest.approx(2 / 3, abs=1e-5),
        ]
    ]


def make_layout(dataset_root, image_folders, lists=()):
    """An Ultralytics-style dataset: images/<f>/*.jpg and labels/<f>/*.txt, plus .txt image lists."""
    for f in image_folders:
        for k in range(2):
            p = write_image(dataset_root / "images" / f / f"{f}_{k}.jpg", 64, 48, [(10, 10, 30, 30, 0)])
            write_labels(p, 64, 48, [(10, 10, 30, 30, 0)])
    for name, folder in lists:
        (dataset_root / name).write_text("".join(f"./images/{folder}/{folder}_{k}.jpg\n" for k in range(2)))


def test_ultralytics_yamls_load_unchanged(tmp_path, log_lines):
    """data/coco.yaml and data/coco128.yaml (Ultralytics' format, `path: ../datasets/...`, names as a
    dict, a `download:` entry) and a VOC-style yaml (lists of folders) load without an edit."""
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    for name in ("coco.yaml", "coco128.yaml"):
        shutil.copy(REPO / "data" / name, repo / "data" / name)
    coco = repo / "datasets" / "coco"
    make_layout(coco, ["train2017", "val2017"], [("train2017.txt", "train2017"), ("val2017.txt", "val2017")])
    (coco / "annotations").mkdir()
    (coco / "annotations" / "instances_val2017.json").write_text('{"images": [], "annotations": [], "categories": []}')
    make_layout(repo / "datasets" / "coco128", ["train2017"])

    data = load_dataset_yaml(repo / "data" / "coco.yaml")
    assert data["nc"] == 80 and data["names"][0] == "person" and data["names"][79] == "toothbrush"
    assert data["coco_json"] == coco.resolve() / "annotations" / "instances_val2017.json"
    # optional, not downloaded: a warning
    assert data["test"] == [] and any("test-dev2017.txt" in m for m in log_lines())
    assert len(L.load_verified(data["train"], data["nc"], "train")) == 2
    data = load_dataset_yaml(repo / "data" / "coco128.yaml")
    assert data["nc"] == 80 and data["train"] == data["val"] == [
        repo.resolve() / "datasets" / "coco128" / "images" / "train2017"
    ]

    voc_names = (
        "aeroplane bicycle bird boat bottle bus car cat chair cow diningtable dog horse motorbike person pottedplant "
        "sheep sofa train tvmonitor"
    ).split()
    voc = (
        textwrap.dedent(
            """\
        # Ultralytics YOLO, VOC.yaml as users have it
        path: ../datasets/VOC
        train: # train images (relative to 'path')  16551 images
          - images/train2012
          - images/train2007
          - images/val2012
          - images/val2007
        val: # val images (relative to 'path')  4952 images
          - images/test2007
        test: # test images (optional)
          - images/test2007

        # Classes
        names:
        """
        )
        + "".join(f"  {i}: {n}\n" for i, n in enumerate(voc_names))
        + textwrap.dedent(
            """
        # Download script/URL (optional) ---------------------------------------------------------------
        download: |
          import xml.etree.ElementTree as ET
          from ultralytics.utils.downloads import download
          dir = Path(yaml['path'])  # dataset root dir
        """
        )
    )
    (repo / "data" / "VOC.yaml").write_text(voc)
    make_layout(repo / "datasets" / "VOC", ["train2012", "train2007", "val2012", "val2007", "test2007"])
    data = load_dataset_yaml(repo / "data" / "VOC.yaml")
    assert data["nc"] == 20 and data["names"][19] == "tvmonitor" and len(data["train"]) == 4
    assert len(L.load_verified(data["train"], data["nc"], "train")) == 8
    assert len(L.load_verified(data["val"], data["nc"], "val")) == 2


@pytest.mark.parametrize(
    "text, culprit",
    [
        ("path: {root}\nval: images/train\nnames: [a]\n", "'train'"),  # missing key
        ("path: {root}\ntrain: images/train\nnames: [a]\n", "'val'"),
        (
            "path: {root}\ntrain: images/nowhere\nval: images/train\nnames: [a]\n",
            "images/nowhere",
        ),  # folder that does not exist
        ("path: {root}\ntrain: images/train\nval: [images/train, gone.txt]\nnames: [a]\n", "gone.txt"),
        ("path: {root}/missing_root\ntrain: images/train\nval: images/train\nnames: [a]\n", "'path'"),
        ("path: {root}\ntrain: images/train\nval: images/train\nnc: 3\nnames: [a, b]\n", "'nc'"),  # names/nc mismatch
        ("path: {root}\ntrain: images/train\nval: images/train\nnames: {{0: a, 2: b}}\n", "'names'"),
        ("path: {root}\ntrain: images/train\nval: images/train\n", "'names'"),
        ("- just\n- a list\n", "mapping"),
        ("path: {root}\ntrain: [images/train\n", "not valid yaml"),
    ],
)
def test_wrong_yaml_stops_with_one_sentence_naming_the_culprit(tmp_path, text, culprit):
    root = tmp_path / "set"
    rect_dataset(root, n=1)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text.format(root=root))
    with pytest.raises(DatasetError) as info:
        load_dataset_yaml(cfg)
    message = str(info.value)
    assert culprit in message and "\n" not in message
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset_yaml(tmp_path / "no_such.yaml")


# ---------------------------------------------------------------------------------------------
# 2. Verification, cache, and broken files
# ---------------------------------------------------------------------------------------------


def broken_dataset(root):
    """One good image plus one of each kind of bad file. Returns (image folder, {name: expected status})."""
    folder = root / "images" / "train"
    good = write_image(folder / "good.jpg", 64, 64, [(8, 8, 40, 40, 0)])
    write_labels(good, 64, 64, [(8, 8, 40, 40, 0)])
    expected = {"good.jpg": "labelled"}

    full = (folder / "good.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(full[: len(full) // 2])  # cv2 still decodes it (grey bottom)
    png = write_image(folder / "whole.png", 64, 48).read_bytes()
    (folder / "whole.png").unlink()
    (folder / "truncated.png").write_bytes(png[: len(png) - 40])  # its header still reads fine
    expected["truncated.png"] = "corrupt"
    (folder / "zero.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("this is not an image\n")
    write_image(folder / "tiny.png", 6, 6)
    expected.update({"truncated.jpg": "corrupt", "zero.jpg": "corrupt", "text.jpg": "corrupt", "tiny.png": "corrupt"})
    # A JPEG with harmless padding after the end-of-image marker is fine.
    (folder / "padded.jpg").write_bytes(full + b"\x00" * 16)
    expected["padded.jpg"] = "background"

    rows = {
        "four_values": "0 0.5 0.5 0.2\n",
        "nan": "0 0.5 nan 0.2 0.2\n",
        "class_out_of_range": "7 0.5 0.5 0.2 0.2\n",
        "class_not_integer": "1.5 0.5 0.5 0.2 0.2\n",
        "far_outside": "0 0.5 0.5 1.6 0.2\n",
        "not_numbers": "person 0.5 0.5 0.2 0.2\n",
        "binary_label": None,
    }
    for name, row in rows.items():
        p = write_image(folder / f"{name}.png", 32, 32)
        lp = Path(L.label_path(str(p)))
        lp.parent.mkdir(parents=True, exist_ok=True)
        lp.write_bytes(b"\xff\xfe\x00\x81garbage" if row is None else row.encode())
        expected[f"{name}.png"] = "corrupt"
    # Kept: a box just outside [0, 1] (clipped), duplicated rows (dropped), an empty label file.
    p = write_image(folder / "clip_and_duplicates.png", 32, 32)
    Path(L.label_path(str(p))).write_text("1 0.5 0.5 1.004 0.3\n1 0.5 0.5 1.004 0.3\n2 0.25 0.25 0.1 0.1\n")
    expected["clip_and_duplicates.png"] = "labelled"
    p = write_image(folder / "empty_label.png", 32, 32)
    Path(L.label_path(str(p))).write_text("\n")
    expected["empty_label.png"] = "empty"
    return folder, expected


def test_verification_reports_every_bad_file_and_keeps_the_good(tmp_path, log_lines):
    folder, expected = broken_dataset(tmp_path / "set")
    (tmp_path / "set" / "list.txt").write_text(
        "".join(f"images/train/{n}\n" for n in expected) + "images/train/vanished.jpg\n"
    )
    expected["vanished.jpg"] = "missing"
    for name, status in expected.items():
        assert L.verify_one(str(folder / name), nc=4)[0] == status, name

    records = L.load_verified([tmp_path / "set" / "list.txt"], nc=4, split_name="train")
    kept = {Path(r["im"]).name: r for r in records}
    assert set(kept) == {n for n, s in expected.items() if s not in ("corrupt", "missing")}
    clip = kept["clip_and_duplicates.png"]["labels"]
    assert len(clip) == 2 and clip[0][3] == 1.0  # duplicate dropped, x2 = 1.002 clipped to 1
    assert len(kept["empty_label.png"]["labels"]) == 0 and len(kept["padded.jpg"]["labels"]) == 0

    # The log: one line per bad file (status, path, reason), plus the file kept after a repair.
    log_files = list((tmp_path / "set" / "labels").glob("*.verify.log"))
    assert len(log_files) == 1
    lines = [line.split("\t") for line in log_files[0].read_text().splitlines()]
    assert all(len(parts) == 3 and parts[2] for parts in lines)
    by_name = {Path(path).name: (status, reason) for status, path, reason in lines}
    bad = {n for n, s in expected.items() if s in ("corrupt", "missing")}
    assert set(by_name) == bad | {"clip_and_duplicates.png"}
    assert all(by_name[n][0] == expected[n] for n in bad)
    assert "truncated" in by_name["truncated.jpg"][1] and "empty" in by_name["zero.jpg"][1]
    assert "not a readable image" in by_name["text.jpg"][1] and "6x6" in by_name["tiny.png"][1]
    assert "line 1" in by_name["nan.png"][1] and "class 7" in by_name["class_out_of_range.png"][1]
    assert by_name["clip_and_duplicates.png"] == ("fixed", "1 duplicate label rows removed")

    # The totals line, and a warning that points at the log.
    messages = "\n".join(log_lines())
    n_bad = len(bad)
    assert (
        f"{len(expected)} found, 2 labelled, 2 background (1 without label file, 1 with an empty one), "
        f"1 missing, {n_bad - 1} corrupt" in messages
    )
    assert f"{n_bad} of {len(expected)} images excluded" in messages and str(log_files[0]) in messages


def test_exif_orientation_is_applied(tmp_path):
    from PIL import Image  # only here: the pipeline itself reads with cv2

    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :40] = (255, 0, 0)  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    path = tmp_path / "images" / "rotated.jpg"
    path.parent.mkdir()
    Image.fromarray(img).save(path, exif=exif.tobytes(), quality=95)
    status, record, _ = L.verify_one(str(path), nc=1)
    assert status == "background" and record["shape"] == [80, 40]  # (h, w): stored 80 wide, shown 80 tall
    shown = read_image(str(path))
    assert shown.shape == (80, 40, 3)
    assert shown[:30, :, 0].mean() > 200 and shown[50:, :, 0].mean() < 50  # the red half is now on top


def test_verification_in_processes_finds_what_threads_find_and_header_sizes_are_cv2s(tmp_path, monkeypatch):
    # A large set is verified in a process pool (from VERIFY_IN_PROCESSES_FROM images): the same verdicts.
    folder, expected = broken_dataset(tmp_path / "set")
    for name, (w, h) in {"wide.bmp": (90, 30), "tall.webp": (20, 70), "plain.jpg": (33, 65)}.items():
        write_image(folder / name, w, h)
    files = L.list_images([folder])
    in_threads = [L.verify_one(f, 4) for f in files]
    monkeypatch.setattr(L, "VERIFY_IN_PROCESSES_FROM", 0)
    records = L.load_verified([folder], nc=4, split_name="train", workers=2)
    assert [r["im"] for r in records] == [f for f, (_, rec, _) in zip(files, in_threads) if rec is not None]
    statuses = {Path(f).name: status for f, (status, _, _) in zip(files, in_threads)}
    assert all(statuses[name] == status for name, status in expected.items() if name in statuses)
    for r in records:  # the size from the header is the size of the decoded image training will use
        assert tuple(r["shape"]) == read_image(r["im"]).shape[:2], r["im"]


def test_cache_is_reused_and_invalidated_when_files_change(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=3)
    first = L.load_verified([folder], nc=4, split_name="train")
    assert len(list((tmp_path / "labels").glob("*.cache.npz"))) == 1

    real_verify = L.verify_one
    calls = []
    monkeypatch.setattr(L, "verify_one", lambda f, nc, **kw: calls.append(f) or real_verify(f, nc, **kw))
    assert L.load_verified([folder], nc=4, split_name="train") == first and calls == []  # from the cache

    label = tmp_path / "labels" / "train" / "im0.txt"
    label.write_text("3 0.5 0.5 0.5 0.5\n")
    os.utime(label, ns=(1, 1))  # even with an old timestamp: the size changed
    again = L.load_verified([folder], nc=4, split_name="train")
    assert len(calls) == 3 and next(r for r in again if r["im"].endswith("im0.png"))["labels"][0][0] == 3

    calls.clear()
    write_image(folder / "new.png", 40, 40)  # an added image
    assert len(L.load_verified([folder], nc=4, split_name="train")) == 4 and len(calls) == 4
    calls.clear()
    L.load_verified([folder], nc=5, split_name="train")  # another class count: the checks differ
    assert len(calls) == 4


def test_train_and_val_lists_over_one_folder_keep_their_own_cache(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4)
    (tmp_path / "train.txt").write_text("images/train/im0.png\nimages/train/im1.png\nimages/train/im2.png\n")
    (tmp_path / "val.txt").write_text("images/train/im3.png\n")
    L.load_verified([tmp_path / "train.txt"], 4, "train")
    L.load_verified([tmp_path / "val.txt"], 4, "val")
    monkeypatch.setattr(L, "verify_one", lambda f, nc: pytest.fail("verified again instead of using the cache"))
    assert len(L.load_verified([tmp_path / "train.txt"], 4, "train")) == 3
    assert len(L.load_verified([tmp_path / "val.txt"], 4, "val")) == 1
    assert folder.exists()


def test_read_only_dataset_folder_still_works(tmp_path, monkeypatch, log_lines):
    dataset = tmp_path / "readonly"
    folder = rect_dataset(dataset, n=2)
    before = hash_tree(dataset)
    real_write = L.write_text_atomic

    def refuse_inside_dataset(path, text):  # a read-only mount (chmod does not stop root, so simulate it)
        if Path(path).resolve().is_relative_to(dataset.resolve()):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_write(path, text)

    monkeypatch.setattr(L, "write_text_atomic", refuse_inside_dataset)
    records = L.load_verified([folder], nc=4, split_name="train")
    assert len(records) == 2 and hash_tree(dataset) == before
    assert any("the file system is read-only" in m for m in log_lines())
    assert len(list((tmp_path / "user_cache").glob("*.cache.npz"))) == 1  # cached in the user's folder instead
    monkeypatch.setattr(L, "verify_one", lambda f, nc: pytest.fail("verified again instead of using the cache"))
    assert L.load_verified([folder], nc=4, split_name="train") == records
    monkeypatch.undo()

    # Nowhere writable at all: a warning, and it still works.
    monkeypatch.setattr(L, "write_text_atomic", lambda path, text: (_ for _ in ()).throw(PermissionError(13, "denied")))
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "other_cache"))
    assert len(L.load_verified([folder], nc=4, split_name="train")) == 2
    assert any("verification will run again next time" in m for m in log_lines())


def test_array_backed_records_yield_exactly_the_samples_of_the_list_of_dicts(tmp_path):
    # The records as the code held them before utils/data/records.py: a list of dicts with the float64 label rows
    # verify_one returns. The flat-array Records must give bitwise the same samples (same seed, epoch, index),
    # else a run resumed across the change would not be exact.
    make_shapes(tmp_path / "shapes", n_train=10, n_val=2, seed=5, size=96)
    files = L.list_images([tmp_path / "shapes" / "images" / "train"])
    dicts = [record for _, record, _ in (L.verify_one(f, len(NAMES)) for f in files) if record is not None]
    for record in dicts:
        record.pop("dup", None)  # background records have none
    records = L.load_verified([tmp_path / "shapes" / "images" / "train"], len(NAMES), "train")
    assert isinstance(records, Records) and len(records) == len(dicts) == 10
    hyp = HYP | {"mosaic": 0.5, "mixup": 0.3, "degrees": 5.0}
    old, new = D.TrainDataset(dicts, 64, hyp, seed=3), D.TrainDataset(records, 64, hyp, seed=3)
    for key in itertools.product((0, 4), range(10)):
        (image_a, labels_a), (image_b, labels_b) = old[key], new[key]
        assert torch.equal(image_a, image_b) and torch.equal(labels_a, labels_b), key
    for (a, la, ma), (b, lb, mb) in zip(D.ValDataset(dicts, 64, 4), D.ValDataset(records, 64, 4)):
        assert torch.equal(a, b) and torch.equal(la, lb) and ma == mb
    # slicing (--subset, --fraction) and --single-cls keep the arrays
    assert records[2:5] == records.take([2, 3, 4]) and records[3]["im"] == dicts[3]["im"]
    assert (L.single_class(records).labels[:, 0] == 0).all() and (records.labels[:, 0] > 0).any()


def test_users_files_are_never_modified(tmp_path):
    folder, _ = broken_dataset(tmp_path / "set")
    before = hash_tree(tmp_path / "set" / "images") | {
        k: v for k, v in hash_tree(tmp_path / "set" / "labels").items() if k.endswith(".txt")
    }
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, HYP, seed=0)
    for i in range(len(dataset)):
        dataset[0, i]
    val = D.ValDataset(records, 64, batch_size=2)
    for i in range(len(val)):
        val[i]
    after = hash_tree(tmp_path / "set" / "images") | {
        k: v for k, v in hash_tree(tmp_path / "set" / "labels").items() if k.endswith(".txt")
    }
    assert after == before


@pytest.mark.parametrize("how", ["deleted", "overwritten with garbage"])
def test_image_that_breaks_during_training_is_replaced_and_reported(tmp_path, capfd, how):
    folder = rect_dataset(tmp_path, n=4)
    records = L.load_verified([folder], nc=4, split_name="train")
    victim = folder / "im2.png"
    if how == "deleted":
        victim.unlink()
    else:
        victim.write_bytes(b"not a png any more")
    for hyp in (NO_AUG, HYP):  # the image on its own, and as a mosaic partner
        dataset = D.TrainDataset(records, 64, hyp, seed=0)
        image, labels = dataset[0, 2]
        assert image.shape == (3, 64, 64) and len(labels) >= 1
        for i in range(len(dataset)):
            dataset[1, i]
    assert str(victim) in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------
# 3. Colour order
# ---------------------------------------------------------------------------------------------


def test_thin_strip_image_does_not_break_loading(tmp_path):
    folder = tmp_path / "images" / "train"
    p = write_image(folder / "strip.png", 1200, 10, [(100, 0, 300, 10, 0)])
    write_labels(p, 1200, 10, [(100, 0, 300, 10, 0)])
    write_image(folder / "normal.png", 64, 64)
    records = L.load_verified([folder], nc=1, split_name="train")
    for hyp in (NO_AUG, HYP):
        dataset = D.TrainDataset(records, 32, hyp, seed=0)
        assert all(dataset[0, i][0].shape == (3, 32, 32) for i in range(2))
    val = D.ValDataset(records, 32, batch_size=2)
    assert all(val[i][0].shape[0] == 3 for i in range(2))


def test_red_image_arrives_red_first_channel(tmp_path):
    folder = tmp_path / "images" / "train"
    for k in range(4):
        write_image(folder / f"red{k}.png", 64 + 16 * k, 48, background=(255, 0, 0))
    records = L.load_verified([folder], nc=1, split_name="train")

    for hyp in (NO_AUG, HYP):  # with HSV jitter the red is lighter or darker but still red
        dataset = D.TrainDataset(records, 64, hyp, seed=0)
        for i in range(4):
            image, _ = dataset[0, i]
            assert image.dtype == torch.uint8 and image.shape == (
                3,
                64,
                64,
            )  # uint8: train.py divides by 255 on the device
            pixels = image.reshape(3, -1).int()
            coloured = pixels[
                :, pixels.max(0).values - pixels.min(0).values > 30
            ]  # not the grey padding (HSV moves it too)
            assert coloured.shape[1] > 0.3 * pixels.shape[1]
            assert ((coloured[0] > coloured[1] + 30) & (coloured[0] > coloured[2] + 30)).all()

    val = D.ValDataset(records, 64, batch_size=2)
    for i in range(4):
        image, _, _ = val[i]
        pixels = image.reshape(3, -1)
        content = pixels[:, (pixels != 114).any(0)]
        assert (content[0] > 240).all() and (content[1:] < 15).all()


# ---------------------------------------------------------------------------------------------
# 4. Augmentation keeps the boxes right
# ---------------------------------------------------------------------------------------------


def canvas_with_rects(w, h, rects):
    img = np.zeros((h, w, 3), np.uint8)
    for x1, y1, x2, y2, c in rects:
        img[y1:y2, x1:x2] = COLOURS[c]
    return img, np.array([[c, x1, y1, x2, y2] for x1, y1, x2, y2, c in rects], np.float32)


RECTS = [(10, 12, 40, 30, 0), (50, 40, 90, 70, 1), (20, 50, 28, 66, 2)]


def test_letterbox_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for shape, scaleup in (((64, 64), True), ((128, 96), True), ((160, 160), False)):
        out, ratio, (left, top) = letterbox(img, shape, scaleup=scaleup)
        assert out.shape[:2] == shape
        boxes = labels.copy()
        boxes[:, 1:] = boxes[:, 1:] * ratio + (left, top, left, top)
        assert_boxes_tight(out, boxes, require_all_pixels=True)


def place(images, labels, offsets, canvas, m, out_shape, min_area=0.1):
    """What TrainDataset.place does with given images and matrix: each image resized straight into the output."""
    tiles = [(img, (1.0, 1.0), xy) for img, xy in zip(images, offsets)]
    out = np.full((*out_shape, 3), PAD_VALUE, np.uint8)
    return out, drawn_boxes(tile_boxes(labels, offsets, canvas, min_area), draw_tiles(out, tiles, canvas, m))


def test_flip_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for lr, ud in ((True, False), (False, True), (True, True)):
        out, boxes = flip(img, labels, lr, ud)
        assert_boxes_tight(out, boxes, tol=0, require_all_pixels=True)
        assert not np.array_equal(boxes, labels)
        assert np.array_equal(out, img[:: -1 if ud else 1, :: -1 if lr else 1])


def test_affine_without_rotation_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for seed in range(6):
        m, _ = random_affine_matrix(np.random.default_rng(seed), (80, 100), (80, 100), 0, 0.1, 0.5, 0)
        out, boxes = place([img], [labels], [(0, 0)], 100, m, (80, 100))
        assert out.shape == img.shape and len(boxes)
        assert_boxes_tight(out, boxes)


def test_mosaic_min_area_drops_mostly_cut_boxes_unless_zero():
    # a grid of 7x7 boxes in each image: the mosaic's cuts leave some of them with slivers of every size
    size = 64
    grid = [(0, x, y, x + 7, y + 7) for x in np.arange(0.6, 57, 8) for y in np.arange(0.6, 57, 8)]
    labels = [np.array(grid, np.float32)] * 4
    slivers = 0
    for seed in range(10):
        offsets = mosaic_offsets([(64, 64)] * 4, size, np.random.default_rng(seed))
        strict, loose = (np.concatenate(tile_boxes(labels, offsets, 2 * size, a)) for a in (0.1, 0.0))
        area = lambda b: (b[:, 3] - b[:, 1]) * (b[:, 4] - b[:, 2])  # noqa: E731
        assert (area(loose) > 0).all() and (area(strict) >= 0.1 * 49).all()  # empty boxes never survive
        assert {tuple(b) for b in strict.tolist()} <= {tuple(b) for b in loose.tolist()}
        slivers += int((area(loose) < 0.1 * 49).sum())
    assert slivers > 0  # kept only with min_area 0, as Ultralytics' mosaic keeps them


def test_mosaic_moves_boxes_with_pixels():
    size = 64
    images, labels = [], []
    for k in range(4):  # each image a different aspect ratio and one rectangle of its own colour
        w, h = (64, 64, 48, 64)[k], (64, 40, 64, 52)[k]
        img, lab = canvas_with_rects(w, h, [(w // 4, h // 4, 3 * w // 4, 3 * h // 4, k)])
        images.append(img)
        labels.append(lab)
    shapes = [im.shape[:2] for im in images]
    for seed in range(6):
        rng = np.random.default_rng(seed)
        offsets = mosaic_offsets(shapes, size, rng)
        canvas, boxes = place(images, labels, offsets, 2 * size, np.eye(3), (2 * size, 2 * size))
        assert_boxes_tight(canvas, boxes, tol=0, require_all_pixels=True)  # the mosaic canvas, to the pixel
        # straight to size x size with a random scale and translation, as training does
        m, _ = random_affine_matrix(rng, (2 * size, 2 * size), (size, size), 0, 0.1, 0.5, 0)
        out, boxes = place(images, labels, offsets, 2 * size, m, (size, size))
        assert out.shape == (size, size, 3)
        if len(boxes):
            assert_boxes_tight(out, boxes)


def test_mosaic_sample_boxes_land_on_the_drawn_rectangles(tmp_path):
    """Through TrainDataset's batch path: images of other sizes than the training size (the load resize is folded
    into the warp), several rectangles each, mosaic partners from the batch, flips; and with rotation and shear
    (the canvas path), where a box encloses its turned rectangle."""
    folder = tmp_path / "images" / "train"
    for k, (w, h) in enumerate([(200, 150), (120, 160), (160, 160), (240, 120), (90, 150), (150, 100)]):
        rects = [(w // 8, h // 8, w // 2, h // 2, k % 4), (w // 2 + 8, h // 2 + 8, w - 8, h - 8, (k + 1) % 4)]
        write_labels(write_image(folder / f"im{k}.png", w, h, rects), w, h, rects)
    records = L.load_verified([folder], nc=4, split_name="train")
    hyp = dict(HYP, hsv_h=0, hsv_s=0, hsv_v=0, flipud=0.5, mosaic_min_area=0.5)  # no cut box below half its area
    dataset = D.TrainDataset(records, 96, hyp, seed=2)
    checked = 0
    for epoch in range(3):
        keys = [(epoch, i) for i in D.epoch_order(6, 2, epoch)]
        for image, labels in dataset.__getitems__(keys):
            assert image.shape == (3, 96, 96) and len(labels)
            assert_boxes_tight(chw_to_hwc(image), labels.numpy(), tol=2)
            checked += len(labels)
    assert checked >= 30
    turned = D.TrainDataset(records, 96, dict(hyp, degrees=20.0, shear=5.0, mosaic_min_area=0.1), seed=2)
    for image, labels in turned.__getitems__([(0, i) for i in range(6)]):
        img = chw_to_hwc(image)
        for cls, x1, y1, x2, y2 in labels.numpy():
            inside = np.zeros(img.shape[:2], bool)
            inside[max(int(y1) - 2, 0) : int(y2) + 3, max(int(x1) - 2, 0) : int(x2) + 3] = True
            assert (colour_mask(img, int(cls)) & inside).sum() > 0.2 * (x2 - x1) * (y2 - y1)


def test_a_batch_decodes_each_image_once_and_draws_mosaic_partners_from_itself(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=12, w=80, h=64)
    records = L.load_verified([folder], nc=4, split_name="train")
    reads = []
    real = D.load_original
    monkeypatch.setattr(D, "load_original", lambda record, *a: reads.append(record["im"]) or real(record, *a))
    dataset = D.TrainDataset(records, 64, dict(HYP, mixup=0.5), seed=0)
    sampler = D.EpochBatchSampler(12, 4, seed=0)
    for batch in itertools.islice(iter(sampler), 6):
        reads.clear()
        dataset.__getitems__(batch)
        assert sorted(reads) == sorted(records[i]["im"] for _, i in batch)  # each file once, no other file
    reads.clear()
    images, targets = next(iter(D.make_loader(dataset, D.EpochBatchSampler(12, 4, seed=0), workers=0)))
    assert len(reads) == 4 and images.shape == (4, 3, 64, 64)
    assert images.is_contiguous(memory_format=torch.channels_last)  # the model's layout: no copy on the device
    # a sample is a function of (seed, epoch, index) and its batch: the same in any batch of the same images
    batch = [(0, i) for i in (3, 7, 1, 9)]
    a, b = dataset.__getitems__(batch), dataset.__getitems__(batch[::-1])
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b[::-1]))


def test_train_dataset_boxes_stay_tight_through_every_transform(tmp_path):
    """End to end through TrainDataset: mosaic, affine (no rotation), flips, on and off."""
    folder = rect_dataset(tmp_path, n=4, w=96, h=72)
    records = L.load_verified([folder], nc=4, split_name="train")
    hyp_no_colour = dict(HYP, hsv_h=0, hsv_s=0, hsv_v=0, flipud=0.5)  # colour jitter would hide the colours we look for
    checked = 0
    for hyp in (hyp_no_colour, dict(hyp_no_colour, mosaic=0.0)):
        dataset = D.TrainDataset(records, 64, hyp, seed=1)
        for epoch, i in itertools.product(range(3), range(4)):
            image, labels = dataset[epoch, i]
            if len(labels):
                assert_boxes_tight(chw_to_hwc(image), labels.numpy())
                checked += 1
    assert checked >= 16


def test_an_image_many_times_the_training_size_is_decoded_reduced_and_its_boxes_follow(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4, w=512, h=384, suffix=".jpg")
    records = L.load_verified([folder], nc=4, split_name="train")
    reads = []
    real = D.load_original
    monkeypatch.setattr(D, "load_original", lambda *a: reads.append(a[-1]) or real(*a))
    hyp = dict(HYP, hsv_h=0, hsv_s=0, hsv_v=0)
    for imgsz, reduce in ((64, 8), (128, 4), (200, 2), (300, 1)):
        reads.clear()
        for image, labels in D.TrainDataset(records, imgsz, hyp, seed=0).__getitems__([(0, i) for i in range(4)]):
            assert image.shape == (3, imgsz, imgsz)
            assert_boxes_tight(chw_to_hwc(image), labels.numpy(), tol=2)
        assert reads == [reduce] * 4


def test_mosaic_is_switched_off_for_the_last_epochs_and_mixup_blends_two(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4)
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, HYP, seed=0, mosaic_epochs=2)
    calls = []
    real = D.TrainDataset.place
    monkeypatch.setattr(
        D.TrainDataset, "place", lambda self, loaded, *a: calls.append(len(loaded)) or real(self, loaded, *a)
    )
    for epoch in range(4):
        for i in range(4):
            dataset[epoch, i]
    assert calls == [4] * 8 + [1] * 8  # mosaics in epochs 0 and 1 only, then letterboxed single images
    calls.clear()
    mixed = D.TrainDataset(records, 64, dict(HYP, mixup=1.0), seed=0)
    image, labels = mixed[0, 0]
    assert calls == [4, 4] and image.shape == (3, 64, 64)


def test_cache_ram_gives_the_same_samples(tmp_path):
    # Images already at the training size: bitwise the same. Larger ones: the cache holds them resized once (INTER_AREA,
    # as validation does) where from disk the load resize is folded into the one resize that places each image.
    for (w, h), exact in (((64, 48), True), ((80, 60), False)):
        records = L.load_verified([rect_dataset(tmp_path / f"{w}", n=4, w=w, h=h)], nc=4, split_name="train")
        a = D.TrainDataset(records, 64, HYP, seed=3)
        b = D.TrainDataset(records, 64, HYP, seed=3, cache=cache_images(records, 64))
        for keys in [[(0, 0)], [(0, 3)], [(1, i) for i in range(4)]]:
            for (ia, la), (ib, lb) in zip(a.__getitems__(keys), b.__getitems__(keys)):
                if exact:
                    assert torch.equal(la, lb) and torch.equal(ia, ib)
                else:  # each image is resized from whole source pixels: the boxes follow, within one pixel
                    assert la.shape == lb.shape and (la - lb).abs().max() < 1
                    assert (ia.float() - ib.float()).abs().mean() < 3
        before = [im.copy() for im in b.cache]
        for i in range(4):
            b[0, i]
        assert all(np.array_equal(x, y) for x, y in zip(before, b.cache))  # augmentation never writes into the cache


def test_cache_ram_that_would_not_fit_falls_back_to_reading_from_disk(tmp_path, monkeypatch, log_lines):
    folder = rect_dataset(tmp_path, n=4, w=80, h=60)
    records = L.load_verified([folder], nc=4, split_name="train")
    need = int((resized_shapes(records.shapes, 64).prod(1) * 3).sum())
    assert need == 4 * 48 * 64 * 3  # estimated from the sizes in the records, before anything is decoded
    monkeypatch.setattr("utils.data.images.available_memory", lambda: need)  # fits, but without 20% to spare
    dataset = D.TrainDataset(records, 64, HYP, seed=3, cache=cache_images(records, 64))
    assert dataset.cache is None
    warning = next(m for m in log_lines() if m.startswith("--cache ram"))
    assert "training without the RAM cache" in warning and f"{need / 1e9:.1f} GB" in warning
    assert torch.equal(dataset[0, 1][0], D.TrainDataset(records, 64, HYP, seed=3)[0, 1][0])  # and it trains
    monkeypatch.setattr("utils.data.images.available_memory", lambda: 2 * need)
    assert D.TrainDataset(records, 64, HYP, seed=3, cache=cache_images(records, 64)).cache is not None


def test_cache_ram_for_validation_follows_the_records_it_sorts(tmp_path):
    # ValDataset sorts its records by aspect ratio; the cache comes in the caller's order and must follow.
    for k, (w, h) in enumerate([(90, 30), (30, 90), (60, 60), (80, 40)]):
        rect = (w // 3, h // 3, 2 * w // 3, 2 * h // 3, k)
        write_labels(write_image(tmp_path / "images" / "val" / f"im{k}.png", w, h, [rect]), w, h, [rect])
    records = L.load_verified([tmp_path / "images" / "val"], nc=4, split_name="val")
    plain, cached = D.ValDataset(records, 64, 2), D.ValDataset(records, 64, 2, cache=cache_images(records, 64))
    assert [m["path"] for *_, m in plain] != [r["im"] for r in records]  # the order did change
    for (a, la, ma), (b, lb, mb) in zip(plain, cached):
        assert torch.equal(a, b) and torch.equal(la, lb) and ma == mb


def test_cache_ram_shared_by_two_processes_of_a_machine_is_told_not_read_from_the_environment(tmp_path, monkeypatch):
    # Two "ranks" as two threads: what cache_images needs of the other processes comes in the NodeShare, so no
    # process group, no LOCAL_RANK: local rank 0 fills one /dev/shm file, rank 1 maps it, and the name is removed.
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    for key in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    records = L.load_verified([rect_dataset(tmp_path, n=3, w=80, h=60)], nc=4, split_name="train")
    barrier, calls = threading.Barrier(2, timeout=60), []

    def rank(local_rank):
        share = NodeShare(local_rank, 2, f"test-{os.getpid()}", lambda objects: calls.append("broadcast"), barrier.wait)
        return cache_images(records, 64, share=share)

    with ThreadPoolExecutor(2) as pool:
        filled, mapped = pool.map(rank, (0, 1))
    assert calls == ["broadcast"] * 2
    plain = cache_images(records, 64)
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(plain, filled, mapped))
    name = mapped[0].filename  # np.memmap's views keep the file's name
    assert (
        filled[0].filename == name
        and name.startswith("/dev/shm/yolo-cache-")
        and not os.path.exists(name)
        and not mapped[0].flags.writeable
    )


# ---------------------------------------------------------------------------------------------
# 5. Determinism: sample order, DDP slices, workers, mid-epoch resume
# ---------------------------------------------------------------------------------------------


def take(sampler, count):
    return list(itertools.islice(iter(sampler), count))


def test_sample_order_is_a_function_of_seed_and_epoch_and_ranks_split_it():
    one = D.EpochBatchSampler(10, 3, seed=5)
    assert len(one) == 4
    batches = take(one, 8)
    assert batches == take(D.EpochBatchSampler(10, 3, seed=5), 8)
    epoch0 = [i for b in batches[:4] for e, i in b if e == 0]
    epoch1 = [i for b in batches[4:] for e, i in b if e == 1]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10)) and epoch0 != epoch1  # each epoch a new permutation
    assert take(D.EpochBatchSampler(10, 3, seed=6), 4) != batches[:4]

    for n, world in ((12, 3), (10, 4), (7, 2), (2, 5)):  # (2, 5): fewer images than ranks
        slices = [
            [i for b in D.EpochBatchSampler(n, 2, seed=1, rank=r, world_size=world).batches(0) for _, i in b]
            for r in range(world)
        ]
        assert len({len(s) for s in slices}) == 1  # the same count on every rank: no rank waits at the end
        flat = [i for s in slices for i in s]
        assert set(flat) == set(range(n))  # covering
        assert len(flat) == -(-n // world) * world  # disjoint except the few repeats that even out the ranks
        if n % world == 0:
            assert len(set(flat)) == len(flat)
        assert [len(D.EpochBatchSampler(n, 2, seed=1, rank=r, world_size=world)) for r in range(world)] == [
            -(-(-(-n // world)) // 2)
        ] * world


def loader_batches(dataset, sampler, workers, count):
    loader = D.make_loader(dataset, sampler, workers=workers)
    out = list(itertools.islice(iter(loader), count))
    del loader
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (ia, ta), (ib, tb) in zip(a, b):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)


def test_same_batches_with_0_1_and_2_workers_and_after_a_mid_epoch_restart(tmp_path):
    folder = rect_dataset(tmp_path, n=6, w=80, h=64)
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, dict(HYP, mixup=0.5), seed=7)
    # 6 images, batch 2: 3 batches per epoch; 5 batches cross into the second epoch
    reference = loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7), 0, 5)
    for workers in (1, 2):
        assert_same_batches(loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7), workers, 5), reference)
    # Restart after k batches: exactly the batches the uninterrupted run sees from batch k on.
    for k in (1, 2):
        resumed = loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7, skip_batches=k), 2 if k == 2 else 0, 5 - k)
        assert_same_batches(resumed, reference[k:])
    # Resuming at the start of epoch 1 is the same as skipping all of epoch 0.
    assert take(D.EpochBatchSampler(6, 2, seed=7, start_epoch=1), 3) == take(
        D.EpochBatchSampler(6, 2, seed=7, skip_batches=3), 3
    )
    # A fresh dataset object (a restarted process) produces the same samples.
    again = D.TrainDataset(records, 64, dict(HYP, mixup=0.5), seed=7)
    assert torch.equal(again[1, 4][0], dataset[1, 4][0])


# ---------------------------------------------------------------------------------------------
# 6. Loader hygiene
# ---------------------------------------------------------------------------------------------


class WorkerSettings(torch.utils.data.Dataset):
    """Reports, from inside the DataLoader worker, the settings pitfalls D6-D8 are about
    (file descriptors, cv2 threads, persistent workers)."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        info = [cv2.getNumThreads(), int(cv2.ocl.useOpenCL()), int(soft == hard), os.getpid(), torch.get_num_threads()]
        return torch.tensor(info), torch.zeros(0, 5)


def test_workers_have_cv2_threads_off_opencl_off_file_limit_raised_and_persist():
    cv2.setNumThreads(3)  # as if the main process had not called the fix: the worker must apply it itself
    try:
        # train.py: True on CUDA
        assert D.make_loader(WorkerSettings(), batch_size=2, workers=0, pin_memory=True).pin_memory
        loader = D.make_loader(WorkerSettings(), batch_size=2, workers=2)
        assert loader.persistent_workers
        pids = set()
        for _ in range(2):  # two epochs: the same worker processes (not re-created with re-imported code)
            for info, _ in loader:
                threads, opencl, raised, pid, torch_threads = info[0].tolist()
                # cv2.setNumThreads(0) = run sequentially; OpenCV 5 (pthreads) then reports 1, OpenCV 4 reports 0
                assert threads <= 1 and (opencl, raised, torch_threads) == (0, 1, 1) and pid != os.getpid()
                pids.add(pid)
        assert len(pids) == 2
        del loader
    finally:
        cv2.setNumThreads(-1)
    D.fix_cv2_and_file_limits()  # and in the main process
    assert cv2.getNumThreads() <= 1 and not cv2.ocl.useOpenCL()


def _slow_worker_start(report):
    """A loader worker whose start is slow (as under load): a SIGTERM reaches it before _worker_init runs."""
    report.put("started")
    time.sleep(1.0)
    D._worker_init(D._main_exiting(), 0)
    report.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_a_sigterm_while_a_worker_starts_waits_for_its_handler_and_does_not_kill_it():
    """SLURM pre-emption as the validation loader's workers start (the first epoch's end): the worker must live
    on so that the step can finish and last.pt be saved (the SIGTERM test of test_train.py crashed on this)."""
    context = D._worker_context()  # the context make_loader gives the DataLoader
    report = context.Queue()
    worker = context.Process(target=_slow_worker_start, args=(report,))
    worker.start()
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the main process: unblocked again
    assert report.get(timeout=60) == "started"
    os.kill(worker.pid, signal.SIGTERM)  # before the worker's handler is set
    mask = report.get(timeout=60)
    worker.join(timeout=60)
    assert worker.exitcode == 0 and signal.SIGTERM not in mask and signal.SIGINT not in mask


# ---------------------------------------------------------------------------------------------
# 7. Validation loading
# ---------------------------------------------------------------------------------------------


def test_validation_rectangular_batches_map_back_to_original_pixels(tmp_path):
    folder = tmp_path / "images" / "val"
    # (w, h). 200 x 60 at 64 px: the short side is rounded to 19 px (not 19.2); a ratio taken from
    # it would put the right box 2 px off in the original image.
    sizes = [(100, 60), (60, 100), (80, 80), (200, 60), (96, 50), (50, 96), (120, 90)]
    truth = {}
    for k, (w, h) in enumerate(sizes):
        rects = [(3, 2, w // 2, h // 3, 0), (w // 2, h // 2, w - 12, h - 2, 1)]
        p = write_image(folder / f"v{k}.png", w, h, rects)
        write_labels(p, w, h, rects)
        truth[str(p)] = np.array([r[:4] for r in rects], float)
    records = L.load_verified([folder], nc=4, split_name="val")
    for imgsz in (64, 128):
        val = D.ValDataset(records, imgsz, batch_size=2)
        assert sorted(r["im"] for r in val.records) == sorted(truth)
        loader = D.make_loader(val, batch_size=2, workers=0)
        shapes, aspects = [], []
        for images, targets, metas in loader:
            h, w = images.shape[2:]
            assert h % 32 == 0 and w % 32 == 0 and max(h, w) <= imgsz + 32
            shapes.append((h, w))
            aspects += [m["shape"][0] / m["shape"][1] for m in metas]
            for j, meta in enumerate(metas):
                assert tuple(meta["shape"]) == tuple(read_image(meta["path"]).shape[:2])  # the original size is kept
                boxes = targets[targets[:, 0] == j][:, 2:]
                back = scale_boxes_to_original(boxes, meta["ratio"], meta["pad"], meta["shape"])
                assert np.abs(back.numpy() - truth[meta["path"]]).max() <= 1.0, meta["path"]
        assert aspects == sorted(aspects)  # similar shapes together: batches follow the aspect ratio
        assert any(h != w for h, w in shapes)  # rectangles, not all squares
        assert shapes[0][0] < shapes[0][1] and shapes[-1][0] > shapes[-1][1]  # wide first, tall last
    # no augmentation: the same sample every time
    image_a, labels_a, _ = val[3]
    image_b, labels_b, _ = val[3]
    assert torch.equal(image_a, image_b) and torch.equal(labels_a, labels_b)


# ---------------------------------------------------------------------------------------------
# 8. The built-in shapes set
# ---------------------------------------------------------------------------------------------


def test_shapes_set_is_deterministic_and_generated_on_first_use(tmp_path):
    a = make_shapes(tmp_path / "a", n_train=3, n_val=2, seed=11, size=96)
    b = make_shapes(tmp_path / "b", n_train=3, n_val=2, seed=11, size=96)
    files_a = {
        str(p.relative_to(a)): p.read_bytes() for p in a.rglob("*") if p.is_file() and not p.name.startswith(".")
    }
    files_b = {
        str(p.relative_to(b)): p.read_bytes() for p in b.rglob("*") if p.is_file() and not p.name.startswith(".")
    }
    assert len([f for f in files_a if f.endswith(".jpg")]) == 5 and files_a == files_b
    c = make_shapes(tmp_path / "c", n_train=3, n_val=2, seed=12, size=96)
    assert (c / "images" / "train" / "train_00000.jpg").read_bytes() != files_a["images/train/train_00000.jpg"]

    # First use through a dataset yaml: generated, then reused (not regenerated) the second time.
    (tmp_path / "shapes.yaml").write_text(
        "path: generated\ntrain: images/train\nval: images/val\nnames: [" + ", ".join(NAMES) + "]\n"
        "generated_by: utils/data/shapes.py\ngenerator_settings: {n_train: 4, n_val: 2, size: 64}\n"
    )
    data = load_dataset_yaml(tmp_path / "shapes.yaml")
    assert len(L.list_images(data["train"])) == 4 and len(L.list_images(data["val"])) == 2
    stamp = (tmp_path / "generated" / "images" / "train" / "train_00000.jpg").stat().st_mtime_ns
    load_dataset_yaml(tmp_path / "shapes.yaml")
    assert (tmp_path / "generated" / "images" / "train" / "train_00000.jpg").stat().st_mtime_ns == stamp
    # Regenerated with fewer images: no stale file of the bigger set stays behind.
    make_shapes(tmp_path / "generated", n_train=2, n_val=1, size=64)
    assert len(L.list_images([tmp_path / "generated" / "images" / "train"])) == 2
    assert len(list((tmp_path / "generated" / "labels" / "train").glob("*.txt"))) <= 2


def test_crowd_style_is_many_small_objects_of_other_types(tmp_path):
    counts, sides, classes = [], [], set()
    for i in range(12):
        img, labels = draw_image(np.random.default_rng([7, i]), 320, 320, "crowd")
        boxes = np.array(labels, float).reshape(-1, 5)
        assert (boxes[:, 1:3] >= 0).all() and (boxes[:, 3] <= 320).all() and (boxes[:, 4] <= 320).all()
        counts.append(len(boxes))
        sides += np.maximum(boxes[:, 3] - boxes[:, 1], boxes[:, 4] - boxes[:, 2]).tolist()
        classes.update(boxes[:, 0].astype(int).tolist())
    assert classes == set(range(len(STYLES["crowd"]["names"]))) and not set(STYLES["crowd"]["names"]) & set(NAMES)
    assert np.median(counts) >= 15 and np.median(sides) <= 16 and max(sides) <= 26
    # the style is part of the set's identity: asking for the other style regenerates it
    root = make_shapes(tmp_path / "set", n_train=2, n_val=1, size=96, style="crowd")
    crowd_labels = (root / "labels" / "train" / "train_00000.txt").read_text()
    make_shapes(root, n_train=2, n_val=1, size=96)
    assert (root / "labels" / "train" / "train_00000.txt").read_text() != crowd_labels


def test_shapes_images_have_what_makes_them_worth_learning():
    classes, sides, empty, overlapping, textured = set(), [], 0, 0, 0
    size = 96
    for i in range(120):
        img, labels = draw_image(np.random.default_rng([99, i]), size, size)
        textured += img.reshape(-1, 3).std(0).mean() > 8  # not a flat background
        if not labels:
            empty += 1
            continue
        boxes = np.array(labels, float)
        classes.update(boxes[:, 0].astype(int).tolist())
        sides += np.maximum(boxes[:, 3] - boxes[:, 1], boxes[:, 4] - boxes[:, 2]).tolist()
        for p, q in itertools.combinations(boxes[:, 1:], 2):
            overlapping += min(p[2], q[2]) > max(p[0], q[0]) and min(p[3], q[3]) > max(p[1], q[1])
    assert len(NAMES) >= 5 and classes == set(range(len(NAMES)))
    assert empty >= 1 and textured >= 110 and overlapping >= 5
    assert min(sides) <= 8 and max(sides) >= size / 3 * 0.8  # from a few pixels to a third of the image


# ---------------------------------------------------------------------------------------------
# 9. Converters
# ---------------------------------------------------------------------------------------------


def test_dataset_defaults_take_the_flag_type_and_never_override_a_given_flag(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--lr0", type=float, default=0.0)
    parser.add_argument("--cache", default="")
    args = parser.parse_args(["--lr0", "0.003"])
    data = {"yaml": tmp_path / "d.yaml", "defaults": {"epochs": "7", "lr0": 0.005, "cache": "ram"}}
    apply_dataset_defaults(args, parser, data, given_flags={"lr0"})
    assert (args.epochs, args.lr0, args.cache) == (7, 0.003, "ram")
    for defaults, named in [
        ({"epoch": 7}, "'epoch'"),
        ({"epochs": "many"}, "'epochs' to 'many'"),
        ({"epochs": [7]}, "'epochs' to \\[7\\]"),
    ]:
        with pytest.raises(DatasetError, match=named) as error:
            apply_dataset_defaults(args, parser, {**data, "defaults": defaults}, given_flags=set())
        assert "d.yaml" in str(error.value)


def test_dataset_yaml_defaults_must_be_a_mapping(tmp_path):
    make_shapes(tmp_path / "s", n_train=2, n_val=1, seed=0, size=64)
    cfg = tmp_path / "d.yaml"
    cfg.write_text("path: s\ntrain: images/train\nval: images/val\nnames: [a]\ndefaults: [epochs, 7]\n")
    with pytest.raises(DatasetError, match="d.yaml: key 'defaults' must be a mapping"):
        load_dataset_yaml(cfg)
    cfg.write_text("path: s\ntrain: images/train\nval: images/val\nnames: [a]\n")
    assert load_dataset_yaml(cfg)["defaults"] == {}
