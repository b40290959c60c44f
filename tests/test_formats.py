"""Datasets read in their own formats (issue 39): one generated set written as YOLO txt, as a Pascal VOC folder and
as COCO json, with what labelling tools export: VOC `difficult` and COCO `iscrowd` boxes, non-contiguous COCO
category ids listed out of order, an image without boxes, boxes poking out of their image. The three must give
the same training targets and, from the same weights, the same pycocotools mAP; a refusal is one sentence naming
the file and the entry."""

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import warm_python
import yaml
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from utils.coco import detections_to_coco, ground_truth
from utils.data import shapes
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.labels import load_verified
from utils.evaluate import coco_map, fast_map

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]
NAMES = sorted(shapes.NAMES)  # a VOC yaml without `names` takes its XML's names, sorted: the same order everywhere
CATEGORY_IDS = [3, 8, 11, 20, 42, 77]  # of class 0..5: gaps, and listed out of order in the json


def read_shapes(root):
    """{(split, image path): [w, h, boxes]} from the generated shapes set; boxes [class, x1, y1, x2, y2, ignored] in
    whole pixels, so that every format writes them exactly."""
    truth = {}
    for split in ("train", "val"):
        for image in sorted((root / "images" / split).glob("*.jpg")):
            h, w = cv2.imread(str(image)).shape[:2]
            label = root / "labels" / split / f"{image.stem}.txt"
            boxes = []
            for line in label.read_text().splitlines() if label.exists() else []:
                c, cx, cy, bw, bh = map(float, line.split())
                x1, y1, x2, y2 = (
                    round(v) for v in ((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h)
                )
                if x2 > x1 and y2 > y1:
                    boxes.append([NAMES.index(shapes.NAMES[int(c)]), x1, y1, x2, y2, False])
            truth[(split, image)] = [w, h, boxes]
    return truth


def add_label_tool_cases(truth):
    """An image without boxes, boxes to ignore (VOC difficult, COCO crowd) in both splits, boxes poking out of the
    image by half a pixel (training only: scoring reads the COCO json unclipped, the others clipped)."""
    val = [k for k in truth if k[0] == "val"]
    train = [k for k in truth if k[0] == "train" and truth[k][2]]
    truth[val[1]][2] = []
    for key in (val[2], val[3], train[0]):
        w, h, boxes = truth[key]
        c, x1, y1, x2, y2, _ = boxes[0]
        boxes.append([(c + 1) % len(NAMES), max(x1 - 3, 0), max(y1 - 3, 0), min(x2 + 3, w), min(y2 + 3, h), True])
    w, h, boxes = truth[train[1]]
    boxes += [[0, w - 12, 3, w + 0.5, 15, False], [1, -0.5, h - 20, 10, h - 4, False]]


def write_yolo(root, truth):
    for (split, image), (w, h, boxes) in truth.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, root / "images" / split / image.name)
        rows = [
            f"{c} {(x1 + x2) / 2 / w:.10f} {(y1 + y2) / 2 / h:.10f} {(x2 - x1) / w:.10f} {(y2 - y1) / h:.10f}"
            for c, x1, y1, x2, y2, ignored in boxes
            if not ignored  # YOLO txt has no way to say "ignore"
        ]
        (root / "labels" / split / f"{image.stem}.txt").write_text("".join(r + "\n" for r in rows))


def voc_xml(name, w, h, boxes, size=True):
    objects = "".join(
        f"<object><name>{NAMES[c]}</name><pose>Unspecified</pose><truncated>0</truncated>"
        f"<difficult>{int(ignored)}</difficult><bndbox><xmin>{x1 + 1:g}</xmin><ymin>{y1 + 1:g}</ymin>"
        f"<xmax>{x2:g}</xmax><ymax>{y2:g}</ymax></bndbox></object>"
        for c, x1, y1, x2, y2, ignored in boxes
    )  # VOC counts pixels from 1
    size = f"<size><width>{w}</width><height>{h}</height><depth>3</depth></size>" if size else ""
    return f"<annotation><folder>JPEGImages</folder><filename>{name}</filename>{size}{objects}</annotation>"


def write_voc(root, truth):
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = {"train": [], "val": []}
    for (split, image), (w, h, boxes) in truth.items():
        shutil.copy(image, root / "JPEGImages" / image.name)
        (root / "Annotations" / f"{image.stem}.xml").write_text(voc_xml(image.name, w, h, boxes))
        ids[split].append(image.stem)
    for split, stems in ids.items():
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(s + "\n" for s in stems))


def write_coco(root, truth):
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for k, ((s, image), (w, h, boxes)) in enumerate(truth.items()):
            if s != split:
                continue
            shutil.copy(image, root / "images" / split / image.name)
            images.append({"id": 100 + 7 * k, "file_name": image.name, "width": w, "height": h})
            for c, x1, y1, x2, y2, crowd in boxes:
                annotations.append(
                    {"id": 1000 + len(annotations), "image_id": 100 + 7 * k, "category_id": CATEGORY_IDS[c],
                     "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": int(crowd)}
                )  # fmt: skip
        categories = [{"id": i, "name": n, "supercategory": "shape"} for i, n in zip(CATEGORY_IDS, NAMES)][::-1]
        (root / "annotations").mkdir(exist_ok=True)
        coco = {"images": images, "annotations": annotations, "categories": categories}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same data as yolo.yaml, voc.yaml and coco.yaml (written as a user writes them), plus the truth."""
    root = tmp_path_factory.mktemp("formats")
    shapes.make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    truth = read_shapes(root / "shapes")
    add_label_tool_cases(truth)
    write_yolo(root / "yolo", truth)
    write_voc(root / "voc", truth)
    write_coco(root / "coco", truth)
    (root / "yolo.yaml").write_text(f"path: yolo\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    (root / "voc.yaml").write_text("voc: voc  # a Pascal VOC folder: its ImageSets/Main/train.txt and val.txt\n")
    (root / "coco.yaml").write_text(
        "path: coco\n"
        "train: {images: images/train, json: annotations/instances_train.json}\n"
        "val: {images: images/val, json: annotations/instances_val.json}\n"
    )
    return root, truth


@pytest.fixture(autouse=True)
def user_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user_cache"))
    return tmp_path / "user_cache"


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def test_voc_and_coco_json_read_as_the_same_training_targets_as_yolo(sets, caplog):
    caplog.set_level(logging.INFO, logger="yolo")
    root, truth = sets
    before = {f: files_under(root / f) for f in ("voc", "coco")}
    split_records = {}
    for fmt in ("yolo", "voc", "coco"):
        data = load_dataset_yaml(root / f"{fmt}.yaml")
        assert data["names"] == NAMES, fmt
        split_records[fmt] = {s: load_verified(data[s], data["nc"], s) for s in ("train", "val")}
    assert "the classes are the object names of its XML files, sorted" in caplog.text  # voc.yaml has no names
    for split in ("train", "val"):
        yolo, voc, coco = (split_records[f][split] for f in ("yolo", "voc", "coco"))
        assert len(yolo) == len(voc) == len(coco) == sum(k[0] == split for k in truth)
        for other in (voc, coco):
            assert [Path(other.path(i)).name for i in range(len(other))] == [
                Path(yolo.path(i)).name for i in range(len(yolo))
            ]
            assert np.array_equal(other.shapes, yolo.shapes) and np.array_equal(other.label_offsets, yolo.label_offsets)
            assert np.abs(other.labels - yolo.labels).max() < 1e-6
        assert yolo.ignored is None
        assert np.array_equal(voc.ignored, coco.ignored) and np.array_equal(voc.ignored_offsets, coco.ignored_offsets)
        assert len(voc.ignored) == sum(b[5] for k, v in truth.items() if k[0] == split for b in v[2])
        assert (voc.image_ids == -1).all() and sorted(coco.image_ids) == sorted(set(coco.image_ids))
    train = split_records["coco"]["train"].labels
    assert train[:, 1:].min() == 0 and train[:, 1:].max() == 1  # the half pixel outside is clipped
    assert {f: files_under(root / f) for f in ("voc", "coco")} == before  # nothing written into the dataset


def run(args, **kwargs):
    cmd = [sys.executable, *map(str, args)]
    result = warm_python.run(cmd, REPO, timeout=300, **kwargs)
    assert result.returncode == 0, f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def val_metrics(root, weights, fmt, out):
    run(["val.py", "--weights", weights, "--data", root / f"{fmt}.yaml", "--save-json", "--out", out, "--workers", "0",
         "--batch", "4", "--device", "cpu"])  # fmt: skip
    return json.loads((out / "metrics.json").read_text())


def pycocotools_by_hand(gt, predictions):
    """mAP50-95, mAP50 of pycocotools' own COCOeval, up to 300 detections per image as val.py counts them.
    summarize() asks for 100 by name in its first figure, so that one is averaged here as summarize() does."""
    coco_gt = COCO()
    coco_gt.dataset = gt
    coco_gt.createIndex()
    ev = COCOeval(coco_gt, coco_gt.loadRes(predictions), "bbox")
    ev.params.maxDets = [1, 10, 300]
    ev.evaluate(), ev.accumulate(), ev.summarize()
    precision = ev.eval["precision"][:, :, :, 0, 2]  # area 'all', 300 detections
    return precision[precision > -1].mean(), ev.stats[1]


def test_train_on_voc_and_coco_json_then_val_scores_each_as_pycocotools(sets, tmp_path):
    """One epoch on the VOC and on the COCO json set; then the same best.pt scored by val.py against the three yamls:
    the same numbers, and for COCO the numbers of pycocotools run by hand on the original json (original ids).
    (One tiny epoch scores about 0: test_scoring_... below checks the same path with detections that score.)"""
    root, truth = sets
    for fmt in ("voc", "coco"):
        run(["train.py", "--data", root / f"{fmt}.yaml", "--epochs", "1", "--out", tmp_path / fmt, *TINY])
    weights = tmp_path / "coco" / "weights" / "best.pt"
    metrics = {fmt: val_metrics(root, weights, fmt, tmp_path / f"val_{fmt}") for fmt in ("yolo", "voc", "coco")}
    predictions = json.loads((tmp_path / "val_coco" / "predictions.json").read_text())
    original = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    assert predictions and {p["category_id"] for p in predictions} <= set(CATEGORY_IDS)
    assert {p["image_id"] for p in predictions} <= {im["id"] for im in original["images"]}
    by_hand = pycocotools_by_hand(original, predictions)  # the original json, as given
    assert (metrics["coco"]["mAP50-95"], metrics["coco"]["mAP50"]) == pytest.approx(by_hand, abs=1e-6)
    assert not (tmp_path / "val_coco" / "ground_truth.json").exists()  # scored against the original: nothing built
    for fmt in ("yolo", "voc"):
        assert metrics[fmt]["mAP50-95"] == pytest.approx(metrics["coco"]["mAP50-95"], abs=1e-6), fmt
    assert metrics["voc"]["instances"] == metrics["coco"]["instances"] == metrics["yolo"]["instances"]


def synthetic_detections(records, truth, seed=0):
    """{record index: (n, 6) x1 y1 x2 y2 score class} of a detector that is mostly right: every box found (the
    ignored ones too) a pixel or two off, sometimes as the wrong class, plus false positives."""
    rng = np.random.default_rng(seed)
    boxes_of = {image.name: (w, h, boxes) for (split, image), (w, h, boxes) in truth.items() if split == "val"}
    results = {}
    for i in range(len(records)):
        w, h, boxes = boxes_of[Path(records.path(i)).name]
        dets = []
        for c, x1, y1, x2, y2, _ in boxes:
            cls = c if rng.random() < 0.8 else (c + 1) % len(NAMES)
            dets.append([*(np.array([x1, y1, x2, y2]) + rng.normal(0, 1.5, 4)), rng.uniform(0.1, 1), cls])
        for _ in range(3):
            x, y = rng.uniform(0, [w - 10, h - 10])
            dets.append([x, y, x + 10, y + 10, rng.uniform(0, 0.6), rng.integers(len(NAMES))])
        results[i] = np.array(dets, dtype=np.float64).reshape(-1, 6)
    return results


def test_scoring_of_voc_coco_json_and_yolo_is_pycocotools_with_ignored_boxes(sets):
    """The scoring path of utils.evaluate.evaluate (ground_truth, detections_to_coco, coco_map) on each format's val
    records, with detections that score: VOC difficult and COCO crowd boxes ignored alike (a detection on one is no
    false positive), so all three equal pycocotools run by hand on the YOLO ground truth plus those boxes as crowds,
    and the COCO json one equals pycocotools on the original json."""
    root, truth = sets
    scores, detections = {}, {}
    for fmt in ("yolo", "voc", "coco"):
        data = load_dataset_yaml(root / f"{fmt}.yaml")
        records = load_verified(data["val"], data["nc"], "val")
        gt, image_ids, category_ids = ground_truth(records, data["names"], data["coco_jsons"]["val"])
        results = synthetic_detections(records, truth)
        detections[fmt] = [d for i, det in results.items() for d in detections_to_coco(det, image_ids[i], category_ids)]
        scores[fmt] = coco_map(gt, detections[fmt], category_ids)[:2]
        fast = fast_map(results, records, len(NAMES))  # the per-epoch metric: ignores the same boxes
        assert (fast["mAP50-95"], fast["mAP50"]) == pytest.approx(scores[fmt], abs=0.005), fmt
        if fmt == "yolo":
            yolo_gt = gt
    original = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    assert scores["coco"] == pytest.approx(pycocotools_by_hand(original, detections["coco"]), abs=1e-6)
    assert {d["category_id"] for d in detections["coco"]} <= set(CATEGORY_IDS)
    image_id = {Path(im["file_name"]).name: im["id"] for im in yolo_gt["images"]}
    with_crowds = dict(yolo_gt, annotations=list(yolo_gt["annotations"]))
    for (split, image), (w, h, boxes) in truth.items():
        for c, x1, y1, x2, y2, ignored in boxes:
            if split == "val" and ignored:
                with_crowds["annotations"].append(
                    {"id": len(with_crowds["annotations"]) + 1, "image_id": image_id[image.name], "category_id": c,
                     "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 1}
                )  # fmt: skip
    by_hand = pycocotools_by_hand(with_crowds, detections["yolo"])
    assert 0.2 < by_hand[0] < 0.95  # a score that means something
    for fmt in ("voc", "coco"):
        assert scores[fmt] == pytest.approx(by_hand, abs=1e-6), fmt
    assert scores["yolo"][0] < by_hand[0]  # without the ignored boxes, the detections on them are false positives


def copy_set(sets, fmt, tmp_path):
    root, _ = sets
    shutil.copytree(root / fmt, tmp_path / fmt)
    shutil.copy(root / f"{fmt}.yaml", tmp_path / f"{fmt}.yaml")
    return tmp_path / fmt, tmp_path / f"{fmt}.yaml"


def problems(caplog):
    return [r.getMessage().strip() for r in caplog.records if r.levelno >= logging.WARNING]


def test_voc_refusals_name_the_xml_and_the_object(sets, tmp_path, caplog):
    """Per image, as a bad YOLO label file is: excluded, logged with the XML file and the object, the rest kept."""
    voc, cfg = copy_set(sets, "voc", tmp_path)
    stems = (voc / "ImageSets" / "Main" / "val.txt").read_text().split()
    xml = {stem: voc / "Annotations" / f"{stem}.xml" for stem in stems}
    xml[stems[0]].write_text(voc_xml("x.jpg", 96, 96, [[0, 5, 5, 20, 20, False]], size=False))
    w, h = cv2.imread(str(voc / "JPEGImages" / f"{stems[2]}.jpg")).shape[1::-1]
    xml[stems[2]].write_text(voc_xml("x.jpg", w, h, [[0, 5, 5, 20, 20, False], [1, 5, 5, w + 9, 20, False]]))
    w3, h3 = cv2.imread(str(voc / "JPEGImages" / f"{stems[3]}.jpg")).shape[1::-1]
    xml[stems[3]].write_text(voc_xml("x.jpg", w3 + 1, h3, [[0, 5, 5, 20, 20, False]]))
    caplog.set_level(logging.INFO, logger="yolo")
    data = load_dataset_yaml(cfg)
    records = load_verified(data["val"], data["nc"], "val")
    assert len(records) == len(stems) - 3
    said = "\n".join(problems(caplog))
    assert f"{xml[stems[0]]} has no <size> with a positive width and height" in said
    assert f"{xml[stems[2]]} object 2 ({NAMES[1]}): box (6, 6, {w + 9}, 20) is outside the {w}x{h} image" in said
    assert f"{xml[stems[3]]}: <size> says {w3 + 1}x{h3} but the image is {w3}x{h3}" in said
    # a class the yaml's names leave out: that image is excluded, by name
    cfg.write_text(f"voc: voc\nnames: {NAMES[1:]}\n")
    data = load_dataset_yaml(cfg)
    caplog.clear()
    records = load_verified(data["train"], data["nc"], "train")
    said = "\n".join(problems(caplog))
    assert re.search(rf"Annotations/train_\d+\.xml object \d+ \({NAMES[0]}\): class '{NAMES[0]}' is not one of", said)


def test_coco_json_refusals_name_the_json_and_the_annotation(sets, tmp_path, caplog):
    coco, cfg = copy_set(sets, "coco", tmp_path)
    path = coco / "annotations" / "instances_val.json"
    original = json.loads(path.read_text())
    bad = json.loads(path.read_text())
    image = bad["images"][0]
    w, h = image["width"], image["height"]
    bad["annotations"] += [
        {"id": 7001, "image_id": image["id"], "category_id": CATEGORY_IDS[0], "bbox": [-0.5, 10, w + 1, 20]},
        {"id": 7002, "image_id": bad["images"][2]["id"], "category_id": CATEGORY_IDS[0], "bbox": [10, 10, 10, 96]},
    ]
    path.write_text(json.dumps(bad))
    caplog.set_level(logging.INFO, logger="yolo")
    data = load_dataset_yaml(cfg)
    records = load_verified(data["val"], data["nc"], "val")
    assert len(records) == len(bad["images"]) - 1
    w2, h2 = bad["images"][2]["width"], bad["images"][2]["height"]
    assert f"{path} annotation 7002: box (10, 10, 20, 106) is outside the {w2}x{h2} image" in "\n".join(
        problems(caplog)
    )
    first = [i for i in range(len(records)) if records.image_ids[i] == image["id"]][0]
    assert records.labels_of(first)[-1, 1:].tolist() == pytest.approx([0, 10 / h, 1, 30 / h])  # clipped: 0.5 px out
    for change, said in [
        ({"image_id": 999}, f"{path}: annotation 7003 has image_id 999, which names no image"),
        ({"category_id": 5}, f"{path}: annotation 7003 has category_id 5, which is not one of its categories"),
    ]:
        annotation = {"id": 7003, "image_id": image["id"], "category_id": CATEGORY_IDS[1], "bbox": [1, 1, 5, 5]}
        path.write_text(json.dumps(dict(original, annotations=original["annotations"] + [dict(annotation, **change)])))
        with pytest.raises(DatasetError) as error:
            load_verified(load_dataset_yaml(cfg)["val"], data["nc"], "val")
        assert str(error.value) == said
    # and as the user sees it: one sentence, no traceback
    result = warm_python.run([sys.executable, "train.py", "--data", str(cfg), "--epochs", "1", *TINY], REPO)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: {said}"


def test_a_format_not_read_says_which_are(sets, tmp_path):
    (tmp_path / "boxes.csv").write_text("image,x1,y1,x2,y2\n")
    (tmp_path / "d.yaml").write_text(f"path: .\ntrain: boxes.csv\nval: boxes.csv\nnames: {NAMES}\n")
    data = load_dataset_yaml(tmp_path / "d.yaml")
    with pytest.raises(
        DatasetError, match="boxes.csv is neither .*; the formats read are YOLO txt .*Pascal VOC .*COCO json"
    ):
        load_verified(data["train"], data["nc"], "train")


def test_the_cache_is_rebuilt_when_an_xml_or_the_json_changes(sets, tmp_path, caplog, user_cache_dir):
    caplog.set_level(logging.INFO, logger="yolo")
    for fmt in ("voc", "coco"):
        folder, cfg = copy_set(sets, fmt, tmp_path)
        data = load_dataset_yaml(cfg)
        first = load_verified(data["val"], data["nc"], "val")
        caplog.clear()
        assert load_verified(data["val"], data["nc"], "val") == first and "(from the cache)" in caplog.text
        if fmt == "voc":
            stem = (folder / "ImageSets" / "Main" / "val.txt").read_text().split()[0]
            xml = folder / "Annotations" / f"{stem}.xml"
            xml.write_text(xml.read_text().replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1))
        else:
            path = folder / "annotations" / "instances_val.json"
            coco = json.loads(path.read_text())
            coco["annotations"][0]["iscrowd"] = 1
            path.write_text(json.dumps(coco))
        caplog.clear()
        again = load_verified(data["val"], data["nc"], "val")
        assert "(from the cache)" not in caplog.text and len(again.labels) == len(first.labels) - 1
        assert len(again.ignored) == len(first.ignored) + 1
    assert {p.suffix for p in user_cache_dir.iterdir()} >= {".npz", ".log"}  # ours, not the dataset's


def test_yolo2coco_writes_what_reads_back_as_the_same_records(sets, tmp_path):
    """data/yolo2coco.py (any format a yaml reads -> COCO json): read back as a COCO json set, the same records;
    from VOC, the difficult boxes come out as crowds."""
    root, _ = sets
    for fmt in ("yolo", "voc"):
        out = tmp_path / f"{fmt}.json"
        given = ["--data", root / f"{fmt}.yaml", "--split", "val"]
        if fmt == "yolo":  # the images and the names alone
            given = ["--images", root / "yolo" / "images" / "val", "--names", *NAMES]
        run([REPO / "data" / "yolo2coco.py", *given, "--out", out])
        categories = json.loads(out.read_text())["categories"]
        assert [c["name"] for c in sorted(categories, key=lambda c: c["id"])] == NAMES
        assert len(COCO(str(out)).getAnnIds()) > 0  # what evaluation uses reads it
        data = load_dataset_yaml(root / f"{fmt}.yaml")
        records = load_verified(data["val"], data["nc"], "val")
        images = Path(records.path(0)).parent
        back = tmp_path / f"back_{fmt}.yaml"
        back.write_text(
            yaml.safe_dump(
                {"train": {"images": str(images), "json": str(out)}, "val": {"images": str(images), "json": str(out)}}
            )
        )
        again = load_verified(load_dataset_yaml(back)["val"], data["nc"], "val")
        assert np.abs(again.labels - records.labels).max() < 1e-4 and np.array_equal(again.shapes, records.shapes)
        crowds = sum(a["iscrowd"] for a in json.loads(out.read_text())["annotations"])
        assert crowds == (len(records.ignored) if fmt == "voc" else 0)


def test_other_spellings_read_the_same_records(sets, tmp_path):
    """An ImageSets .txt under `path:` (no `voc:` key), a folder of images with their .xml beside (Roboflow's and
    LabelImg's VOC), a COCO json named alone with its images beside it (Roboflow's COCO), bare image-set names."""
    root, _ = sets
    flat = tmp_path / "flat"
    for (split, image), _ in sets[1].items():
        (flat / split).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, flat / split / image.name)
        shutil.copy(root / "voc" / "Annotations" / f"{image.stem}.xml", flat / split / f"{image.stem}.xml")
    shutil.copy(root / "coco" / "annotations" / "instances_val.json", flat / "val" / "_annotations.coco.json")
    spellings = {
        "imageset": f"path: {root / 'voc'}\ntrain: ImageSets/Main/train.txt\nval: ImageSets/Main/val.txt\n",
        "names": f"voc: {root / 'voc'}\ntrain: train\nval: val\nnames: {NAMES}\n",
        "beside": f"voc: {flat}\ntrain: train\nval: val\n",
        "json": f"path: {flat}\ntrain: val/_annotations.coco.json\nval: val/_annotations.coco.json\n",
    }
    want = load_verified(load_dataset_yaml(root / "voc.yaml")["val"], len(NAMES), "val")
    for name, text in spellings.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        data = load_dataset_yaml(tmp_path / f"{name}.yaml")
        got = load_verified(data["val"], data["nc"], "val")
        assert data["names"] == NAMES and np.array_equal(got.labels, want.labels), name
        assert np.array_equal(got.ignored, want.ignored), name


@pytest.mark.parametrize(
    "command, new",
    [(["-m", "utils.shapes", "--style", "crowd"], "python -m utils.data.shapes --style crowd"),
     (["data/coco2yolo.py", "instances_train2017.json"], "json: annotations/instances_train2017.json")],
)  # fmt: skip
def test_old_commands_name_the_new_spelling_in_one_sentence(command, new):
    result = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and new in result.stderr and len(result.stderr.strip().splitlines()) == 1
