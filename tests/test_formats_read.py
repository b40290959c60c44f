"""Datasets read in their own formats (issue 39): VOC and COCO json give YOLO txt's training targets, other spellings
and yolo2coco.py's output the same records; refusals name the file and entry; the cache follows XML/json edits."""

import json
import logging
import re
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import warm_python
import yaml
from format_sets import CATEGORY_IDS, NAMES, REPO, TINY, run, voc_xml, write_cvat_yolo, write_label_studio_yolo
from pycocotools.coco import COCO

from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.labels import load_verified

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


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
    entities = "".join(f'<!ENTITY e{k + 1} "{f"&e{k};" * 10}">' for k in range(9))  # a billion laughs: 10 ** 9 x
    xml[stems[4]].write_text(f'<!DOCTYPE a [<!ENTITY e0 "ha">{entities}]><annotation><name>&e9;</name></annotation>')
    caplog.set_level(logging.INFO, logger="yolo")
    data = load_dataset_yaml(cfg)
    records = load_verified(data["val"], data["nc"], "val")
    assert len(records) == len(stems) - 4
    said = "\n".join(problems(caplog))
    assert f"{xml[stems[0]]} has no <size> with a positive width and height" in said
    assert f"{xml[stems[2]]} object 2 ({NAMES[1]}): box (6, 6, {w + 9}, 20) is outside the {w}x{h} image" in said
    assert f"{xml[stems[3]]}: <size> says {w3 + 1}x{h3} but the image is {w3}x{h3}" in said
    assert f"{xml[stems[4]]} is not valid XML (limit on input amplification factor" in said  # expat's own guard
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
    path.write_text('{"images": ' + "[" * 100_000 + "]" * 100_000 + ', "categories": []}')  # crafted: no traceback
    with pytest.raises(DatasetError, match="it nests lists or mappings thousands deep"):
        load_dataset_yaml(cfg)
    named = dict(  # image ids that are names (a VGG or VisDrone converter's): refused, not a traceback from numpy
        original,
        images=[dict(im, id=f"im{im['id']}") for im in original["images"]],
        annotations=[dict(a, image_id=f"im{a['image_id']}") for a in original["annotations"]],
    )
    path.write_text(json.dumps(named))
    with pytest.raises(DatasetError) as error:
        load_verified(load_dataset_yaml(cfg)["val"], data["nc"], "val")
    first = original["images"][0]
    assert str(error.value) == (
        f"{path}: image {first['file_name']!r} has id 'im{first['id']}', but COCO image ids are whole numbers; "
        "renumber the images and their annotations' image_id"
    )
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
    cmd = [sys.executable, "train.py", "--data", str(cfg), "--epochs", "1", *TINY, "--out", str(tmp_path / "run")]
    result = warm_python.run(cmd, REPO)  # --out: not a run folder in the clone
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
    LabelImg's VOC), a COCO json named alone with its images beside it and the root category that groups the others
    first (Roboflow's COCO), bare image-set names."""
    root, _ = sets
    flat = tmp_path / "flat"
    for (split, image), _ in sets[1].items():
        (flat / split).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, flat / split / image.name)
        shutil.copy(root / "voc" / "Annotations" / f"{image.stem}.xml", flat / split / f"{image.stem}.xml")
    roboflow = json.loads((root / "coco" / "annotations" / "instances_val.json").read_text())
    roboflow["categories"].insert(0, {"id": 0, "name": "shape", "supercategory": "none"})  # Roboflow's root category
    (flat / "val" / "_annotations.coco.json").write_text(json.dumps(roboflow))
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


def by_name(records):
    """{image file name without an upload's hash: its label rows}."""
    rows = np.split(records.labels, records.label_offsets[1:-1])
    return {Path(records.path(i)).name.split("-")[-1]: rows[i].tolist() for i in range(len(records))}


def test_cvat_and_label_studio_yolo_exports_read_as_exported(sets, tmp_path):
    """CVAT's "YOLO 1.1" export is given as it is (`--data export/obj.data`): Darknet's obj.data and obj.names, the
    labels beside the images, its paths written from Darknet's data/ folder (CVAT's default) or not, and a task's
    subsets under CVAT's names. Label Studio's YOLO export (one folder, classes.txt) needs `names: classes.txt`."""
    root, truth = sets
    want = {s: load_verified(load_dataset_yaml(root / "yolo.yaml")[s], len(NAMES), s) for s in ("train", "val")}
    for prefix, subsets in (("data/", ("train", "valid")), ("", ("Train", "Validation"))):
        export = tmp_path / f"cvat_{subsets[0]}"
        write_cvat_yolo(export, truth, prefix, subsets)
        data = load_dataset_yaml(export / "obj.data")
        assert data["names"] == NAMES and data["test"] == [], subsets
        for split in ("train", "val"):
            assert by_name(load_verified(data[split], data["nc"], split)) == by_name(want[split]), subsets
    write_label_studio_yolo(tmp_path / "ls", truth)
    (tmp_path / "ls.yaml").write_text("path: ls\ntrain: images\nval: images\nnames: classes.txt\n")
    data = load_dataset_yaml(tmp_path / "ls.yaml")
    assert data["names"] == NAMES
    assert by_name(load_verified(data["val"], data["nc"], "val")) == by_name(want["train"]) | by_name(want["val"])


def split_by_name(cfg):
    data = load_dataset_yaml(cfg)
    return {s: by_name(load_verified(data[s], data["nc"], s)) if data[s] else {} for s in ("train", "val", "test")}


def test_val_and_test_as_fractions_hold_out_the_same_train_images_everywhere(sets, tmp_path):
    """`val: 0.25` and `test: 0.25` (Label Studio's export has no split): parts of the train images, train the rest,
    with the same images in a moved copy and after images are added; a too small part says so; a part of a COCO json
    is scored against that json."""
    root, truth = sets
    data = load_dataset_yaml(root / "yolo.yaml")
    everything = {k: v for s in ("train", "val") for k, v in by_name(load_verified(data[s], data["nc"], s)).items()}
    write_label_studio_yolo(tmp_path / "ls", truth)
    text = "path: {}\ntrain: images\nval: 0.25\ntest: 0.25\nnames: classes.txt\n"
    (tmp_path / "ls.yaml").write_text(text.format("ls"))
    parts = split_by_name(tmp_path / "ls.yaml")
    assert all(parts.values()) and sum(map(len, parts.values())) == len(everything)
    assert parts["train"] | parts["val"] | parts["test"] == everything  # every image once, with its boxes
    shutil.copytree(tmp_path / "ls", tmp_path / "moved" / "copy")
    (tmp_path / "moved" / "copy.yaml").write_text(text.format("copy"))
    assert split_by_name(tmp_path / "moved" / "copy.yaml") == parts
    (tmp_path / "ls" / "obj.data").write_text("train = train.txt\nvalid = 0.25\ntest = 0.25\nnames = classes.txt\n")
    listed = "".join(f"images/{p.name}\n" for p in (tmp_path / "ls/images").iterdir())
    (tmp_path / "ls" / "train.txt").write_text(listed)
    assert split_by_name(tmp_path / "ls" / "obj.data") == parts  # the same in a Darknet obj.data
    image = next((tmp_path / "ls" / "images").iterdir())
    for k in range(6):  # more images: those there stay where they were
        shutil.copy(image, image.with_name(f"added{k}.jpg"))
        shutil.copy(tmp_path / "ls" / "labels" / f"{image.stem}.txt", tmp_path / "ls" / "labels" / f"added{k}.txt")
    grown = split_by_name(tmp_path / "ls.yaml")
    assert {s: {n: r for n, r in grown[s].items() if not n.startswith("added")} for s in grown} == parts
    assert sum(map(len, grown.values())) == len(everything) + 6

    (tmp_path / "tiny.yaml").write_text("path: ls\ntrain: images\nval: 0.000001\nnames: classes.txt\n")
    with pytest.raises(
        DatasetError, match=r"tiny.yaml: `val: 1e-06` leaves val none of the \d+ train images; give a la"
    ):
        load_verified(load_dataset_yaml(tmp_path / "tiny.yaml")["val"], len(NAMES), "val")

    from utils.coco import ground_truth

    cfg = tmp_path / "coco.yaml"
    cfg.write_text(
        f"path: {root / 'coco'}\ntrain: {{images: images/train, json: annotations/instances_train.json}}\nval: 0.3\n"
    )
    data = load_dataset_yaml(cfg)
    train, val = (load_verified(data[s], data["nc"], s) for s in ("train", "val"))
    assert len(val) and not set(train.image_ids) & set(val.image_ids)
    gt, ids, category_ids = ground_truth(val, data["names"], data["coco_jsons"]["val"])
    assert data["coco_jsons"]["val"].json.name == "instances_train.json" and category_ids == list(CATEGORY_IDS)
    assert sorted(im["id"] for im in gt["images"]) == sorted(val.image_ids) == sorted(ids)


def test_a_voc_folder_without_image_sets_holds_out_val_too(sets, tmp_path):
    """Label Studio's VOC export: images/ beside Annotations/, no ImageSets; `train: images` and `val: 0.3`."""
    root, _ = sets
    shutil.copytree(root / "voc" / "JPEGImages", tmp_path / "export" / "images")
    shutil.copytree(root / "voc" / "Annotations", tmp_path / "export" / "Annotations")
    (tmp_path / "v.yaml").write_text("voc: export\ntrain: images\nval: 0.3\n")
    parts = split_by_name(tmp_path / "v.yaml")
    whole = {k: v for s in ("train", "val") for k, v in split_by_name(root / "voc.yaml")[s].items()}
    assert parts["train"] and parts["val"] and not parts["test"]
    assert parts["train"] | parts["val"] == whole and len(parts["train"]) + len(parts["val"]) == len(whole)


@pytest.mark.parametrize(
    "obj_data, names, culprit",
    [
        ("train = train.txt\nnames = obj.names\n", "a\n", "names no val images (key 'valid'"),
        ("train = train.txt\nvalid = train.txt\nnames obj.names\n", "a\n", "obj.data, line 3: expected 'key = value'"),
        ("train = train.txt\nvalid = train.txt\n", "a\n", "has no 'names' line"),
        ("train = train.txt\nvalid = train.txt\nnames = obj.names\n", "a\n\nb\n", "line 2 is blank"),
        ("train = train.txt\nvalid = train.txt\nnames = gone.names\n", "a\n", "gone.names, which is not a file"),
    ],
)
def test_a_wrong_obj_data_stops_with_one_sentence_naming_the_line_or_key(tmp_path, obj_data, names, culprit):
    write_cvat_yolo(tmp_path, {})
    (tmp_path / "obj.names").write_text(names)
    (tmp_path / "obj.data").write_text(obj_data)
    with pytest.raises(DatasetError) as info:
        load_dataset_yaml(tmp_path / "obj.data")
    assert culprit in str(info.value) and "\n" not in str(info.value)


def test_only_a_category_that_groups_others_and_has_no_box_is_left_out(tmp_path):
    """Roboflow's root category is left out; a parent with boxes of its own, COCO's `person` (its own supercategory)
    and a json whose categories all group another and have no box keep every category."""
    from utils.data.coco_json import categories

    def cats(*rows):
        return [{"id": i, "name": n, "supercategory": sup} for i, n, sup in rows]

    cases = {
        "roboflow": (cats((0, "cells", "none"), (1, "RBC", "cells"), (2, "WBC", "cells")), [1, 2], [0]),
        "annotated parent": (cats((1, "vehicle", "none"), (2, "car", "vehicle")), [1, 2], []),
        "coco person": (cats((1, "person", "person"), (2, "car", "vehicle")), [2], []),
        "all parents, no box": (cats((1, "a", "b"), (2, "b", "a")), [], []),
    }
    for name, (categories_, used, groups) in cases.items():
        path = tmp_path / f"{name}.json"
        image = {"id": 1, "file_name": "a.jpg", "width": 9, "height": 9}
        annotations = [{"id": k, "image_id": 1, "category_id": c, "bbox": [1, 1, 3, 3]} for k, c in enumerate(used)]
        path.write_text(json.dumps({"images": [image], "annotations": annotations, "categories": categories_}))
        assert [c for c, _, group in categories(path) if group] == groups, name
