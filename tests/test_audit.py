"""The label audit's parts on small constructed cases: each kind of issue is found where it was made, the K-fold split
is deterministic, issues.csv and the corrections read back (the corrections through the dataset readers themselves)."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import yaml
from data_helpers import write_image, write_labels

from utils.audit.corrections import write_corrections
from utils.audit.folds import fold_of_images
from utils.audit.page import read_issues_csv, write_issues_csv
from utils.audit.score import score_image
from utils.data.dataset_yaml import load_dataset_yaml
from utils.data.labels import annotated_items, load_verified
from utils.data.records import Records

pytestmark = pytest.mark.usefixtures("user_cache_dir")

# three objects of a 200 x 200 image, each well apart: class, x1, y1, x2, y2
OBJECTS = np.array([[0, 10, 10, 60, 60], [1, 100, 20, 160, 70], [0, 40, 120, 110, 180]], np.float64)


def model_sees(objects, confidence=0.9):
    """Predictions (x1 y1 x2 y2 conf class) of a model that finds every object exactly, and a weak second guess."""
    sure = [[*o[1:], confidence, o[0]] for o in objects]
    doubt = [[*o[1:], 0.02, (o[0] + 1) % 2] for o in objects]
    return np.array(sure + doubt, np.float64)


def top(issues, kind):
    return max((i for i in issues if i["kind"] == kind), key=lambda i: i["score"])


def test_a_removed_box_is_found_as_missing():
    issues = score_image(OBJECTS[[0, 2]], model_sees(OBJECTS), nc=2)
    missing = top(issues, "missing")
    assert missing["score"] > 0.8 and missing["label"] is None
    assert missing["suggestion"] == OBJECTS[1, 1:].tolist() and missing["cls"] == 1
    assert all(i["score"] < 0.1 for i in issues if i["kind"] == "missing" and i is not missing)


def test_a_swapped_class_is_found_with_the_class_it_should_be():
    labels = OBJECTS.copy()
    labels[2, 0] = 1  # the model sees class 0 there
    issues = score_image(labels, model_sees(OBJECTS), nc=2)
    wrong = top(issues, "wrong_class")
    assert wrong["label"] == 2 and wrong["suggestion"] == 0 and wrong["score"] > 0.5
    others = [i["score"] for i in issues if i["kind"] == "wrong_class" and i["label"] != 2]
    assert max(others) < 0.1


def test_a_shifted_box_is_found_as_badly_placed_with_the_models_box():
    labels = OBJECTS.copy()
    labels[1, 1:] += [25, 0, 25, 0]  # 60 px wide, moved 25 px: IoU 0.41 with the object
    issues = score_image(labels, model_sees(OBJECTS), nc=2)
    placed = top(issues, "badly_placed")
    assert placed["label"] == 1 and placed["suggestion"] == OBJECTS[1, 1:].tolist()
    assert placed["score"] > 0.4
    assert max(i["score"] for i in issues if i["kind"] == "badly_placed" and i["label"] != 1) < 0.05
    assert top(issues, "spurious")["label"] != 1 or top(issues, "spurious")["score"] < 0.5  # it is still an object


def test_a_box_with_nothing_there_is_spurious_and_a_copy_is_a_duplicate():
    extra = np.array([[1, 150, 130, 190, 190], [0, 11, 11, 60, 61]], np.float64)  # empty place; a copy of object 0
    issues = score_image(np.concatenate([OBJECTS, extra]), model_sees(OBJECTS), nc=2)
    assert top(issues, "spurious")["label"] == 3 and top(issues, "spurious")["score"] > 0.9
    assert [i["label"] for i in issues if i["kind"] == "spurious" and i["score"] > 0.5] == [3]
    duplicates = sorted((i for i in issues if i["kind"] == "duplicate"), key=lambda i: -i["score"])
    assert {duplicates[0]["label"], duplicates[1]["label"]} == {0, 4}  # one of the two is kept, the other flagged
    assert duplicates[0]["score"] > 0.5 > duplicates[1]["score"]


def test_an_unlabelled_object_inside_an_ignored_region_is_no_issue():
    issues = score_image(OBJECTS[[0, 2]], model_sees(OBJECTS), nc=2, ignored=np.array([[95, 15, 165, 75]]))
    assert all(i["score"] < 0.1 for i in issues if i["kind"] == "missing")


def test_the_fold_split_is_deterministic_balanced_and_independent_of_listing_order():
    names = [f"img{i}.jpg" for i in range(23)]
    folds = fold_of_images(names, 4, seed=0)
    again = dict(zip(names[::-1], fold_of_images(names[::-1], 4, seed=0)))
    assert folds == [again[n] for n in names]
    assert sorted(np.bincount(folds).tolist()) == [5, 6, 6, 6]
    assert fold_of_images(names, 4, seed=1) != folds  # the seed chooses another split


def issue(index, label, kind, cls, box, score, suggestion=None):
    return dict(index=index, label=label, kind=kind, cls=cls, box=box, score=score, suggestion=suggestion)


def test_issues_csv_round_trips(tmp_path):
    issues = [
        {**issue(0, None, "missing", 1, [1.0, 2.0, 30.5, 40.0], 0.9, [1.0, 2.0, 30.5, 40.0]), "image": "/d/a b.jpg"},
        {**issue(0, 2, "wrong_class", 0, [5.0, 5.0, 9.0, 9.0], 0.5, 1), "image": "/d/a,b.jpg"},
        {**issue(1, 0, "spurious", 1, [3.0, 4.0, 5.0, 6.0], 0.25), "image": "/d/c.jpg"},
    ]
    write_issues_csv(issues, ["cat", "dog"], tmp_path / "issues.csv")
    rows = read_issues_csv(tmp_path / "issues.csv")
    assert [r["image"] for r in rows] == ["/d/a b.jpg", "/d/a,b.jpg", "/d/c.jpg"]
    assert [r["kind"] for r in rows] == ["missing", "wrong_class", "spurious"]
    assert [r["class"] for r in rows] == ["dog", "cat", "dog"]
    assert rows[0]["box"] == [1.0, 2.0, 30.5, 40.0] and rows[0]["suggested_box"] == [1.0, 2.0, 30.5, 40.0]
    assert rows[1]["suggested_class"] == "dog" and rows[1]["suggested_box"] is None
    assert rows[2]["suggested_class"] == "" and [r["score"] for r in rows] == [0.9, 0.5, 0.25]


# Each format's dataset: two 200 x 200 images, the first with OBJECTS; the fixes below make it the second's labels.
FIXED = [[0, 10, 10, 60, 60], [0, 100, 20, 160, 70], [1, 150, 150, 190, 190]]  # class changed, a box added
ISSUES = [
    issue(0, 1, "wrong_class", 1, OBJECTS[1, 1:].tolist(), 0.9, 0),
    issue(0, 2, "spurious", 0, OBJECTS[2, 1:].tolist(), 0.8),
    issue(0, None, "missing", 1, [150, 150, 190, 190], 0.7, [150.0, 150.0, 190.0, 190.0]),
    issue(1, 0, "badly_placed", 0, [0, 0, 1, 1], 0.2, [0, 0, 5, 5]),  # below --fix-score: not applied
]


def yolo_set(root):
    for name in ("a", "b"):
        image = write_image(root / "images" / f"{name}.png", 200, 200)
        write_labels(image, 200, 200, [(*map(int, o[1:]), int(o[0])) for o in OBJECTS] if name == "a" else [])
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images", "val": "images",
                                                    "names": ["cat", "dog"]}))  # fmt: skip
    return root / "data.yaml", lambda folder: {"path": str(folder), "train": "images", "val": "images"}


def voc_set(root):
    for name in ("a", "b"):
        write_image(root / "JPEGImages" / f"{name}.png", 200, 200)
        top = ET.Element("annotation")
        size = ET.SubElement(top, "size")
        ET.SubElement(size, "width").text, ET.SubElement(size, "height").text = "200", "200"
        for c, x1, y1, x2, y2 in OBJECTS if name == "a" else []:
            obj = ET.SubElement(top, "object")
            ET.SubElement(obj, "name").text = ["cat", "dog"][int(c)]
            box = ET.SubElement(obj, "bndbox")
            for tag, v in zip(("xmin", "ymin", "xmax", "ymax"), (x1 + 1, y1 + 1, x2, y2)):
                ET.SubElement(box, tag).text = str(int(v))
        (root / "Annotations").mkdir(exist_ok=True)
        ET.ElementTree(top).write(root / "Annotations" / f"{name}.xml")
    (root / "data.yaml").write_text(yaml.safe_dump({"voc": str(root), "train": "JPEGImages", "val": "JPEGImages",
                                                    "names": ["cat", "dog"]}))  # fmt: skip
    return root / "data.yaml", lambda folder: {"voc": str(folder), "train": "JPEGImages", "val": "JPEGImages"}


def coco_set(root):
    images = [{"id": i + 1, "file_name": f"{n}.png", "width": 200, "height": 200} for i, n in enumerate("ab")]
    for n in "ab":
        write_image(root / "images" / f"{n}.png", 200, 200)
    annotations = [{"id": k + 1, "image_id": 1, "category_id": int(c) + 1, "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": 1.0, "iscrowd": 0} for k, (c, x1, y1, x2, y2) in enumerate(OBJECTS.tolist())]  # fmt: skip
    categories = [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]
    (root / "images" / "labels.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/labels.json",
                                                    "val": "images/labels.json"}))  # fmt: skip
    split = lambda folder: {"images": str(root / "images"), "json": str(folder / "images" / "labels.json")}  # noqa: E731
    return root / "data.yaml", lambda folder: {"train": split(folder), "val": split(folder)}


@pytest.mark.parametrize("make", [yolo_set, voc_set, coco_set], ids=["yolo", "voc", "coco"])
def test_corrections_read_back_through_the_dataset_readers(tmp_path, make):
    data_yaml, corrected_yaml = make(tmp_path / "set")
    data = load_dataset_yaml(data_yaml)
    records = load_verified(data["train"], data["nc"], "train")
    items = {item.image: item for item in annotated_items(data["train"]) or []}
    issues = [{**i, "image": records.path(i["index"])} for i in ISSUES]
    before = {p.name: p.read_bytes() for p in (tmp_path / "set").rglob("*") if p.is_file()}
    write_corrections(issues, records, items, data, tmp_path / "fixes", fix_score=0.5)
    assert {p.name: p.read_bytes() for p in (tmp_path / "set").rglob("*") if p.is_file()} == before

    cfg = {**corrected_yaml(tmp_path / "fixes"), "names": ["cat", "dog"]}
    (tmp_path / "fixes.yaml").write_text(yaml.safe_dump(cfg))
    fixes = load_dataset_yaml(tmp_path / "fixes.yaml")
    read = load_verified(fixes["train"], 2, "train")
    assert len(read) == 1  # only the image with a fix applied
    rows = sorted((read.labels_of(0).astype(np.float64) * [1, 200, 200, 200, 200]).round(1).tolist())
    assert rows == sorted(np.array(FIXED, np.float64).tolist())
    assert isinstance(records, Records)
