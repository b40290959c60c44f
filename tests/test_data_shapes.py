"""The built-in shapes set (utils/data/shapes.py; issue 2): deterministic, generated on first use through a
dataset yaml, its crowd style, and images with what makes them worth learning.
"""

import itertools

import numpy as np
import pytest

from utils.data import labels as L
from utils.data.dataset_yaml import load_dataset_yaml
from utils.data.shapes import NAMES, STYLES, draw_image, make_shapes

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


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
