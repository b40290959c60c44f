"""bench/audit_inject.py: known label errors injected into a copy of a set in its own format (COCO json, photos with
their XML beside them), the original untouched, and truth.json saying exactly what changed (bench/audit_bench.py
scores the audit against it)."""

import json
from pathlib import Path

import numpy as np
import pytest
from format_sets import REPO, run, voc_xml

from utils.audit.score import box_iou
from utils.data.dataset_yaml import load_dataset_yaml
from utils.data.labels import load_verified

COCO_SPLITS = [
    "train: {images: images/train, json: annotations/instances_train.json}",
    "val: {images: images/val, json: annotations/instances_val.json}",
]


def labelled(yaml_path):
    """{(split folder, image name): [(class name, [x1, y1, x2, y2] pixels)]} of train and val, as audit.py reads
    them."""
    data = load_dataset_yaml(yaml_path)
    found = {}
    for split in ("train", "val"):
        for r in load_verified(data[split], data["nc"], split, workers=1):
            h, w = r["shape"]
            rows = np.asarray(r["labels"], np.float64).reshape(-1, 5) * [1, w, h, w, h]
            found[(Path(r["im"]).parent.name, Path(r["im"]).name)] = [(data["names"][int(c)], b) for c, *b in rows]
    return found


def take(boxes, name, box):
    """Remove and return the box of this class within 1 px of `box` (rounding, clipping at the border)."""
    for k, (n, b) in enumerate(boxes):
        if n == name and np.abs(np.subtract(b, box)).max() <= 1:
            return boxes.pop(k)
    raise AssertionError(f"no {name} box at {box} among {boxes}")


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_beside(root, truth):
    """The set as photos with each one's XML beside it, one folder a split (LabelImg's, Roboflow's VOC export)."""
    for (split, image), (w, h, boxes) in truth.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / image.name).write_bytes(image.read_bytes())
        (root / split / f"{image.stem}.xml").write_text(voc_xml(image.name, w, h, boxes))


@pytest.mark.parametrize("form", ["coco", "voc-beside"])
def test_inject_writes_the_errors_it_reports(sets, tmp_path, form):
    root, truth = sets
    if form == "coco":
        source, flags = root / "coco", ["--coco", root / "coco", "--splits", *COCO_SPLITS]
    else:
        source, flags = tmp_path / "beside", ["--voc", tmp_path / "beside", "--splits", "train: train", "val: val"]
        write_beside(source, truth)
    before = snapshot(source)
    out = tmp_path / "bench"
    run([REPO / "bench" / "audit_inject.py", *flags, "--out", out, "--seed", "1"])
    assert snapshot(source) == before, "the original set was written to"
    clean, noisy = labelled(out / "clean.yaml"), labelled(out / "noisy.yaml")
    errors = json.loads((out / "truth.json").read_text())["errors"]
    n = sum(len(boxes) for boxes in clean.values())
    counts = {kind: sum(e["kind"] == kind for e in errors) for kind in ("missing", "wrong_class", "badly_placed")}
    assert counts["missing"] == round(0.10 * n) > 0 and counts["wrong_class"] == round(0.05 * n) > 0
    assert 0 < counts["badly_placed"] <= round(0.05 * n)
    assert 0 < sum(e["kind"] == "spurious" for e in errors) <= round(0.03 * n)
    expected = {key: list(boxes) for key, boxes in clean.items()}
    for e in errors:  # the clean labels with every reported error applied must be exactly the noisy copy
        image = (Path(e["image"]).parent.name, Path(e["image"]).name)
        assert Path(e["image"]).is_file(), e["image"]
        if e["kind"] != "spurious":
            take(expected[image], e["original_class"], e["original_box"])
        if e["kind"] != "missing":
            expected[image].append((e["class"], e["box"]))
        if e["kind"] == "wrong_class":
            assert e["class"] != e["original_class"]
        if e["kind"] == "badly_placed":
            assert 0.35 <= box_iou(np.array([e["box"]]), np.array([e["original_box"]]))[0, 0] <= 0.65
    assert set(noisy) == set(expected)
    for image, boxes in noisy.items():
        for name, box in boxes:
            take(expected[image], name, box)
        assert not expected[image], f"{image}: boxes the truth reports but the copy lacks: {expected[image]}"
    ignored = {"coco": '"iscrowd": 1', "voc-beside": "<difficult>1</difficult>"}[form]
    files = "*.json" if form == "coco" else "*.xml"
    kept = sum(p.read_text().count(ignored) for p in (out / "noisy").rglob(files))
    assert kept == sum(p.read_text().count(ignored) for p in source.rglob(files)) > 0, "crowd/difficult boxes lost"
