"""A labelling tool's export folder given as --data without a yaml (issue 80, item 3): each layout as the tool writes
it reads the same images and boxes as the yaml a user would have written for it, the class names come from its
files, a folder without a split holds out a fifth for val, the yaml inferred is printed and saved in the run folder,
val.py takes the folder, and a folder that matches no layout gets one sentence saying what was looked for."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from format_sets import NAMES, TINY, run, write_cvat_yolo, write_label_studio_yolo

from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.labels import load_verified

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


def by_name(records):
    """{image file name without an upload's hash: its label rows}."""
    rows = np.split(records.labels, records.label_offsets[1:-1])
    return {Path(records.path(i)).name.split("-")[-1]: rows[i].tolist() for i in range(len(records))}


def splits_of(data):
    return {s: by_name(load_verified(data[s], data["nc"], s)) if data[s] else {} for s in ("train", "val", "test")}


def read(folder):
    """(the data dict of a folder given as --data, each split's boxes by image name, the yaml it inferred)."""
    data = load_dataset_yaml(folder)
    return data, splits_of(data), yaml.safe_load(data["inferred_yaml"])


@pytest.fixture(scope="module")
def want(sets):
    """Each split's boxes by image name, as the hand-written yolo.yaml reads them, and every image's."""
    root, _ = sets
    splits = splits_of(load_dataset_yaml(root / "yolo.yaml"))
    return splits, splits["train"] | splits["val"]


def assert_held_out(parts, everything):
    """No split of its own: val is a part of the images (about a fifth), train the rest, each image once."""
    assert parts["train"] and parts["val"] and not parts["test"]
    assert parts["train"] | parts["val"] == everything and len(parts["train"]) + len(parts["val"]) == len(everything)
    assert len(parts["val"]) < len(parts["train"])


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def test_a_yolo_folder_with_or_without_splits_and_class_names(sets, want, tmp_path):
    root, _ = sets
    splits, everything = want
    folder = tmp_path / "yolo"
    shutil.copytree(root / "yolo", folder)
    (folder / "classes.txt").write_text("".join(n + "\n" for n in NAMES))
    data, parts, inferred = read(folder)
    assert data["names"] == NAMES and parts == splits
    assert inferred == {"path": str(folder.resolve()), "train": "images/train", "val": "images/val", "names": NAMES}
    (folder / "classes.txt").unlink()  # no names anywhere: one per class id its labels use
    largest = max(int(line.split()[0]) for f in folder.rglob("*.txt") for line in f.read_text().splitlines())
    data, parts, _ = read(folder)
    assert data["names"] == [f"class{i}" for i in range(largest + 1)] and parts == splits
    flat = tmp_path / "flat"  # images/ and labels/ with no split below them
    for sub in ("images", "labels"):
        (flat / sub).mkdir(parents=True)
        for f in (folder / sub).rglob("*.*"):
            shutil.copy(f, flat / sub / f.name)
    data, parts, inferred = read(flat)
    assert inferred["train"] == "images" and inferred["val"] == 0.2
    assert_held_out(parts, everything)


def test_a_roboflow_yolo_export_reads_its_data_yaml(sets, want, tmp_path):
    root, _ = sets
    splits, _ = want
    export = tmp_path / "roboflow"
    for split, folder in (("train", "train"), ("val", "valid"), ("val", "test")):
        for sub in ("images", "labels"):
            shutil.copytree(root / "yolo" / sub / split, export / folder / sub)
    splits = {**splits, "test": splits["val"]}
    (export / "data.yaml").write_text(
        f"train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 6\nnames: {NAMES}\n\n"
        "roboflow:\n  workspace: me\n  project: shapes\n  version: 1\n"
    )
    data, parts, inferred = read(export)
    assert data["names"] == NAMES and parts == splits and data["yaml"] == export / "data.yaml"
    assert inferred["path"] == str(export.resolve()) and inferred["roboflow"]["project"] == "shapes"
    yaml_text = (export / "data.yaml").read_text()
    (export / "data.yaml").write_text(f"path: /content/datasets/shapes-1\n{yaml_text}")  # where it was exported
    assert read(export)[1] == splits
    (export / "data.yaml").unlink()  # without it: the split folders, names by class id
    data, parts, inferred = read(export)
    assert (inferred["train"], inferred["val"], inferred["test"]) == ("train/images", "valid/images", "test/images")
    assert parts == splits
    assert len(data["names"]) == len(NAMES)


def test_a_roboflow_coco_export_reads_each_split_json(sets, tmp_path):
    root, _ = sets
    want = splits_of(load_dataset_yaml(root / "coco.yaml"))
    export = tmp_path / "roboflow_coco"
    for split, folder in (("train", "train"), ("val", "valid")):
        shutil.copytree(root / "coco" / "images" / split, export / folder)
        coco = json.loads((root / "coco" / "annotations" / f"instances_{split}.json").read_text())
        coco["categories"].insert(0, {"id": 0, "name": "shape", "supercategory": "none"})  # the root one
        (export / folder / "_annotations.coco.json").write_text(json.dumps(coco))
    (export / "README.roboflow.txt").write_text("Exported from Roboflow\n")
    data, parts, inferred = read(export)
    assert data["names"] == NAMES and parts == want
    assert inferred["val"] == {"json": "valid/_annotations.coco.json"}
    assert data["coco_jsons"]["val"].json == (export / "valid" / "_annotations.coco.json").resolve()


def test_a_cvat_yolo_export_with_or_without_a_validation_subset(sets, want, tmp_path):
    _, truth = sets
    splits, everything = want
    write_cvat_yolo(tmp_path / "cvat", truth)
    data, parts, inferred = read(tmp_path / "cvat")
    assert data["names"] == NAMES and parts == splits and inferred["val"] == "valid.txt" and "test" not in inferred
    train_only = {k: v for k, v in truth.items() if k[0] == "train"} | {
        ("train", k[1]): v for k, v in truth.items() if k[0] == "val"
    }
    write_cvat_yolo(tmp_path / "cvat_train", train_only, subsets=("train",))  # a task with no Validation subset
    data, parts, inferred = read(tmp_path / "cvat_train")
    assert data["names"] == NAMES and inferred["val"] == 0.2
    assert_held_out(parts, everything)


def test_label_studio_and_labelimg_yolo_exports_hold_out_a_fifth(sets, want, tmp_path):
    root, truth = sets
    _, everything = want
    write_label_studio_yolo(tmp_path / "ls", truth)  # images/, labels/, classes.txt, notes.json: not a COCO json
    data, parts, inferred = read(tmp_path / "ls")
    assert data["names"] == NAMES and inferred["names"] == NAMES and inferred["val"] == 0.2
    assert_held_out(parts, everything)
    labelimg = tmp_path / "labelimg"  # the images with their .txt beside them, and classes.txt
    labelimg.mkdir()
    for f in [*(root / "yolo" / "images").rglob("*.jpg"), *(root / "yolo" / "labels").rglob("*.txt")]:
        shutil.copy(f, labelimg / f.name)
    (labelimg / "classes.txt").write_text("".join(n + "\n" for n in NAMES))
    before = files_under(labelimg)
    data, parts, inferred = read(labelimg)
    assert data["names"] == NAMES and inferred["train"] == "."
    assert_held_out(parts, everything)
    assert files_under(labelimg) == before  # the label cache is not written among the user's files
    assert read(labelimg)[2] == inferred  # and a second start infers the same


def test_voc_folders_with_or_without_image_sets_and_images_beside_their_xml(sets, tmp_path):
    root, _ = sets
    want = splits_of(load_dataset_yaml(root / "voc.yaml"))
    everything = want["train"] | want["val"]
    shutil.copytree(root / "voc", tmp_path / "voc")
    data, parts, inferred = read(tmp_path / "voc")
    assert data["names"] == NAMES and parts == want and inferred["train"] == "ImageSets/Main/train.txt"
    studio = tmp_path / "studio_voc"  # Label Studio's VOC export: images/ and Annotations/, no image sets
    shutil.copytree(root / "voc" / "JPEGImages", studio / "images")
    shutil.copytree(root / "voc" / "Annotations", studio / "Annotations")
    data, parts, _ = read(studio)
    assert data["names"] == NAMES
    assert_held_out(parts, everything)
    roboflow, flat = tmp_path / "roboflow_voc", tmp_path / "labelimg_voc"  # each image's .xml beside it
    for split, folder in (("train", "train"), ("val", "valid")):
        (roboflow / folder).mkdir(parents=True)
        flat.mkdir(exist_ok=True)
        for stem in (root / "voc" / "ImageSets" / "Main" / f"{split}.txt").read_text().split():
            for f in (root / "voc" / "JPEGImages" / f"{stem}.jpg", root / "voc" / "Annotations" / f"{stem}.xml"):
                shutil.copy(f, roboflow / folder / f.name)
                shutil.copy(f, flat / f.name)
    data, parts, inferred = read(roboflow)
    assert data["names"] == NAMES and parts == want and (inferred["voc"], inferred["val"]) == (".", "valid")
    data, parts, _ = read(flat)
    assert data["names"] == NAMES
    assert_held_out(parts, everything)


def test_coco_exports_annotations_folder_or_a_json_beside_its_images(sets, tmp_path):
    root, _ = sets
    want = splits_of(load_dataset_yaml(root / "coco.yaml"))
    shutil.copytree(root / "coco", tmp_path / "coco")
    data, parts, inferred = read(tmp_path / "coco")
    assert data["names"] == NAMES and parts == want
    assert inferred["train"] == {"images": "images/train", "json": "annotations/instances_train.json"}
    beside = tmp_path / "beside"  # Label Studio's COCO export: result.json, its file_names under images/
    shutil.copytree(root / "coco" / "images" / "train", beside / "images")
    coco = json.loads((root / "coco" / "annotations" / "instances_train.json").read_text())
    for image in coco["images"]:
        image["file_name"] = f"images/{image['file_name']}"
    (beside / "result.json").write_text(json.dumps(coco))
    data, parts, inferred = read(beside)
    assert inferred["train"] == {"images": "images", "json": "result.json"} and inferred["val"] == 0.2
    assert data["names"] == NAMES
    assert_held_out(parts, want["train"])
    assert data["coco_jsons"]["val"].json == (beside / "result.json").resolve()  # scored against that json
    for image in coco["images"]:  # the file names alone, or the json beside the images themselves: the same
        image["file_name"] = image["file_name"].removeprefix("images/")
    (beside / "result.json").write_text(json.dumps(coco))
    assert read(beside)[1] == parts
    (beside / "result.json").rename(beside / "images" / "result.json")
    assert read(beside / "images")[1] == parts


def test_a_folder_that_matches_no_layout_says_what_was_looked_for(sets, tmp_path):
    root, _ = sets
    photos = tmp_path / "holiday photos"
    shutil.copytree(root / "yolo" / "images" / "train", photos)
    with pytest.raises(DatasetError) as e:
        load_dataset_yaml(photos)
    message = str(e.value)
    assert message.startswith(f"{photos} is a folder without a dataset yaml") and "\n" not in message
    assert "looked for a data.yaml or obj.data, Annotations/ with JPEGImages/" in message
    assert "images/ with labels/ (YOLO)" in message and "give a dataset yaml instead" in message
    unnamed = tmp_path / "unnamed"  # YOLO, but no class names and no box to count them from
    (unnamed / "labels").mkdir(parents=True)
    shutil.copytree(photos, unnamed / "images")
    for image in (unnamed / "images").iterdir():
        (unnamed / "labels" / f"{image.stem}.txt").write_text("")
    with pytest.raises(DatasetError, match=r"unnamed: no classes.txt and no label file names a class; write the c"):
        load_dataset_yaml(unnamed)


def test_train_on_a_folder_prints_and_saves_the_yaml_and_val_takes_the_folder(sets, want, tmp_path):
    _, truth = sets
    write_label_studio_yolo(tmp_path / "export", truth)
    before = files_under(tmp_path / "export")
    result = run(["train.py", "--data", tmp_path / "export", "--epochs", "1", "--out", tmp_path / "run", *TINY])
    saved = tmp_path / "run" / "data.yaml"
    text = saved.read_text()
    assert text.startswith(f"# {tmp_path / 'export'}, read as a YOLO layout (images/ with labels/); copy this file")
    assert text in result.stdout + result.stderr and text in (tmp_path / "run" / "train.log").read_text()
    assert splits_of(load_dataset_yaml(saved)) == splits_of(load_dataset_yaml(tmp_path / "export"))
    assert set(files_under(tmp_path / "export")) - set(before) <= {
        f for f in files_under(tmp_path / "export") if f.endswith((".cache.npz", ".verify.log"))
    }  # only the label caches beside labels/, as for any YOLO set
    out = tmp_path / "val"
    result = run(["val.py", "--weights", tmp_path / "run" / "weights" / "best.pt", "--data", tmp_path / "export",
                  "--out", out, "--workers", "0", "--batch", "4", "--device", "cpu"])  # fmt: skip
    assert (out / "data.yaml").read_text() == text and text in result.stdout + result.stderr  # as train.py's
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["mAP50"] <= 1 and len(metrics["per_class"]) == len(NAMES)
