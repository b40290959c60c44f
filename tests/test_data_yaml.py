"""Dataset yamls (issue 2): sources resolved against `path`, the label path convention, Ultralytics' own yamls loaded
unchanged, a wrong yaml stopped with one sentence naming the culprit, the yaml's defaults: for the run's flags."""

import os
import shutil
import textwrap
from pathlib import Path

import pytest
from data_helpers import rect_dataset, write_image, write_labels

from utils.data import dataset_yaml
from utils.data import labels as L
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.shapes import make_shapes
from utils.settings import apply_dataset_defaults

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)

REPO = Path(__file__).resolve().parents[1]


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


def ultralytics_voc_yaml():
    """Ultralytics' VOC.yaml as users have it: lists of folders, names as a dict, a `download:` script."""
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
    return voc


def test_ultralytics_yamls_load_unchanged(tmp_path, log_lines, monkeypatch):
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
    # `--data coco128.yaml` (and train.py's default, data/shapes.yaml) from any folder: the repo's data/ yaml
    monkeypatch.setattr(dataset_yaml, "REPO", repo)
    monkeypatch.chdir(tmp_path)
    for given in ("coco128.yaml", "data/coco128.yaml"):
        assert load_dataset_yaml(given)["train"] == data["train"], given

    voc = ultralytics_voc_yaml()
    (repo / "data" / "VOC.yaml").write_text(voc)
    make_layout(repo / "datasets" / "VOC", ["train2012", "train2007", "val2012", "val2007", "test2007"])
    data = load_dataset_yaml(repo / "data" / "VOC.yaml")
    assert data["nc"] == 20 and data["names"][19] == "tvmonitor" and len(data["train"]) == 4
    assert len(L.load_verified(data["train"], data["nc"], "train")) == 8
    assert len(L.load_verified(data["val"], data["nc"], "val")) == 2


def test_roboflow_yolo_export_loads_as_downloaded(tmp_path):
    """Roboflow's YOLO export names its splits `../train/images` from a data.yaml that lies beside train/ and valid/
    (Ultralytics reads it so too); its test split is often absent, and its `roboflow:` key is not ours."""
    export = tmp_path / "BCCD-1"
    for split, n in (("train", 2), ("valid", 1)):
        for k in range(n):
            rect = (32, 32, 64, 64, k)
            write_labels(write_image(export / split / "images" / f"im{k}.jpg", 96, 96, [rect]), 96, 96, [rect])
    (export / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 4\nnames: ['a', 'b', 'c', 'd']\n\n"
        "roboflow:\n  workspace: w\n  project: bccd\n  version: 1\n  license: MIT\n"
    )
    data = load_dataset_yaml(export / "data.yaml")
    assert data["train"] == [export / "train" / "images"] and data["val"] == [export / "valid" / "images"]
    assert data["test"] == [] and data["nc"] == 4
    assert len(L.load_verified(data["train"], data["nc"], "train")) == 2


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
        ('path: {root}\ntrain: images/train\nval: "\\n"\nnames: [a]\n', "names '"),  # a line break, quoted
        ("path: {root}\ntrain: " + "a" * 5000 + "\nval: images/train\nnames: [a]\n", "cannot be read ("),
        ("path: {root}\ntrain: images/train\nval: images/train\nnames: " + "a" * 5000 + "\n", "cannot be read ("),
        ("path: {root}\ntrain: images/train\nval: 1.5\nnames: [a]\n", "'val' as a number is the fraction"),
        ("path: {root}\ntrain: images/train\nval: 0.6\ntest: 0.5\nnames: [a]\n", "'val' and 'test' hold out all"),
        ("path: {root}\ntrain: 0.5\nval: images/train\nnames: [a]\n", "key 'train' must be a folder"),
    ],
    ids=range(16),
)
def test_wrong_yaml_stops_with_one_sentence_naming_the_culprit(tmp_path, text, culprit):
    root = tmp_path / "set"
    rect_dataset(root, n=1)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text.format(root=root))
    with pytest.raises(DatasetError) as info:
        load_dataset_yaml(cfg)
    message = str(info.value)
    assert culprit in message and "\n" not in message and len(message) < 600
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset_yaml(tmp_path / "no_such.yaml")


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
