"""Tests for models/predict.py, the Python call: a path, a BGR array and an RGB array of one image give the same
detections, the same as detect.py --save-txt writes; .onnx and .torchscript exports give those of the .pt; a list
gives a list; bad input gets one sentence; nothing found gives empty arrays of the right shapes and types.

The test model is the calibrated one of calibrated_model.py (a random one detects nothing: the comparisons would be
vacuous).
"""

import cv2
import numpy as np
import pytest
import torch
from calibrated_model import make_checkpoint, one_thread, scene  # noqa: F401 (one_thread: autouse fixture)

import detect
import export
from models.predict import Detections, load, predict
from utils.checkpoints.ours import CheckpointError
from utils.inference import compare_detections

CONF = 0.5


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """best.pt with best.onnx and best.torchscript beside it."""
    folder = tmp_path_factory.mktemp("weights")
    path = make_checkpoint(folder / "best.pt")
    export.main(["--weights", str(path), "--onnx", "--torchscript", "--dynamic", "--runs", "1"])
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Two images of other aspect ratios than the model's square: the letterbox must be undone right."""
    folder = tmp_path_factory.mktemp("images")
    paths = [folder / "wide.png", folder / "tall.png"]
    for seed, (h, w), path in zip((1, 2), [(80, 120), (128, 72)], paths):
        cv2.imwrite(str(path), cv2.cvtColor(scene(seed, h, w), cv2.COLOR_RGB2BGR))
    return paths


def as_tensor(result):
    return torch.cat(
        (
            torch.from_numpy(result.boxes),
            torch.from_numpy(result.scores)[:, None],
            torch.from_numpy(result.classes)[:, None].float(),
        ),
        1,
    )


def check_types(result, n=None):
    assert isinstance(result, Detections)
    assert result.boxes.dtype == np.float32 and result.scores.dtype == np.float32 and result.classes.dtype == np.int64
    n = len(result.scores) if n is None else n
    assert result.boxes.shape == (n, 4) and result.scores.shape == (n,) and result.classes.shape == (n,)
    assert isinstance(result.names, list) and len(result.names) == n


def test_path_bgr_and_rgb_arrays_agree_with_detect_txt(weights, images, tmp_path):
    model = load(weights)
    path = images[0]
    from_path = predict(model, path, conf=CONF)
    bgr = cv2.imread(str(path))
    from_bgr = predict(model, bgr, conf=CONF)
    from_rgb = predict(model, bgr[..., ::-1], conf=CONF, rgb=True)  # a view with negative strides, on purpose
    check_types(from_path)
    assert len(from_path.scores) > 0
    for other in (from_bgr, from_rgb):
        assert all(np.array_equal(a, b) for a, b in zip(from_path[:3], other[:3])) and from_path.names == other.names
    assert from_path.names == [model.names[c] for c in from_path.classes]

    out = detect.main(
        [
            "--weights",
            str(weights),
            "--source",
            str(path),
            "--conf",
            str(CONF),
            "--save-txt",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    rows = np.loadtxt(out / "labels" / f"{path.stem}.txt", ndmin=2)
    h, w = bgr.shape[:2]
    boxes = from_path.boxes
    xywh = np.stack(
        (
            (boxes[:, 0] + boxes[:, 2]) / 2 / w,
            (boxes[:, 1] + boxes[:, 3]) / 2 / h,
            (boxes[:, 2] - boxes[:, 0]) / w,
            (boxes[:, 3] - boxes[:, 1]) / h,
        ),
        1,
    )
    assert rows.shape == (len(boxes), 6)
    assert np.array_equal(rows[:, 0], from_path.classes)
    assert np.abs(rows[:, 1:5] - xywh).max() < 1e-3  # the txt rounds to 1e-6
    assert np.abs(rows[:, 5] - from_path.scores).max() < 1e-5  # and the score to 1e-5


def test_onnx_and_torchscript_match_the_pt_and_a_list_gives_a_list(weights, images):
    reference = predict(load(weights), images, conf=CONF)
    assert isinstance(reference, list) and len(reference) == 2 and all(len(r.scores) for r in reference)
    for suffix in (".onnx", ".torchscript"):
        results = predict(load(weights.with_suffix(suffix)), images, conf=CONF)
        assert isinstance(results, list) and len(results) == 2
        for ref, result in zip(reference, results):
            check_types(result)
            boxes, scores, unmatched = compare_detections(as_tensor(ref), as_tensor(result), CONF)
            assert unmatched == 0 and boxes < 1e-3 and scores < 1e-5, (suffix, boxes, scores)


def test_nothing_found_gives_empty_arrays(weights, images):
    result = predict(load(weights.with_suffix(".onnx")), images[1], conf=1.0)
    check_types(result, 0)
    assert result.names == []


def test_bad_input_gets_one_sentence(weights, images, tmp_path):
    model = load(weights)
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8 this is not a jpeg" * 20)
    missing = tmp_path / "missing.png"
    for path, error in ((missing, FileNotFoundError), (corrupt, OSError), (str(corrupt), OSError)):
        with pytest.raises(error) as info:
            predict(model, [images[0], path])
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    for array in (np.zeros((64, 64), np.uint8), np.zeros((64, 64, 4), np.uint8), np.zeros((64, 64, 3))):
        with pytest.raises(ValueError, match=r"uint8 \(H, W, 3\) array, not "):
            predict(model, array)
    for bad in (tmp_path / "nothing.pt", tmp_path / "nothing.onnx", tmp_path / "weights.h5"):
        with pytest.raises(CheckpointError) as info:
            load(bad)
        assert str(bad) in str(info.value) and "\n" not in str(info.value)
