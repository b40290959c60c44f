"""Tests for detect.py: the same detections with .pt, .onnx and .torchscript weights, a folder with
a corrupt image, a video, the source kinds, the output files, and bad weights.

The test model is the calibrated one of calibrated_model.py (see its docstring: a plain random model
detects nothing, which would make these comparisons vacuous).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from calibrated_model import make_checkpoint, one_thread, scene  # noqa: F401 (one_thread: autouse fixture)

import detect
import export
from utils.inference import compare_detections

ROOT = Path(__file__).resolve().parents[1]
CONF = "0.5"


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """best.pt with best.onnx and best.torchscript (dynamic, so that --imgsz may change) beside it."""
    folder = tmp_path_factory.mktemp("weights")
    path = make_checkpoint(folder / "best.pt")
    export.main(["--weights", str(path), "--onnx", "--torchscript", "--dynamic", "--runs", "1"])
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Three images of different sizes and aspect ratios (the letterbox must be undone right)."""
    folder = tmp_path_factory.mktemp("images")
    for seed, (h, w) in zip(range(3), [(64, 64), (80, 120), (150, 90)]):
        cv2.imwrite(str(folder / f"{seed}.png"), cv2.cvtColor(scene(seed, h, w), cv2.COLOR_RGB2BGR))
    return folder


def predictions(out):
    by_image = {}
    for p in json.loads((out / "predictions.json").read_text()):
        x, y, w, h = p["bbox"]
        by_image.setdefault(p["image_id"], []).append([x, y, x + w, y + h, p["score"], p["category_id"]])
    return {k: torch.tensor(v) for k, v in by_image.items()}


def test_same_detections_with_pt_onnx_torchscript(weights, images, tmp_path):
    results = {}
    for suffix in (".pt", ".onnx", ".torchscript"):
        out = detect.main(
            [
                "--weights",
                str(weights.with_suffix(suffix)),
                "--source",
                str(images),
                "--conf",
                CONF,
                "--save-json",
                "--out",
                str(tmp_path / suffix[1:]),
            ]
        )
        results[suffix] = predictions(out)
    reference = results[".pt"]
    assert sorted(reference) == [0, 1, 2] and all(len(d) > 0 for d in reference.values())
    for suffix in (".onnx", ".torchscript"):
        assert sorted(results[suffix]) == [0, 1, 2]
        for image_id, dets in reference.items():
            boxes, scores, unmatched = compare_detections(dets, results[suffix][image_id], float(CONF))
            assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4, (suffix, image_id)  # json rounds to 1e-3 px, 1e-5


def test_folder_with_corrupt_image_cli(weights, images, tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for p in images.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8 this is not a jpeg" * 20)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "detect.py",
            "--weights",
            str(weights.with_suffix(".onnx")),
            "--source",
            str(folder),
            "--conf",
            CONF,
            "--save-txt",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["0.png", "1.png", "2.png"]
    assert (
        "corrupt.jpg: cannot be read as an image, skipped" in done.stdout and "skipped 1 unreadable file" in done.stdout
    )
    assert "speed per image" in done.stdout and "ms inference" in done.stdout
    rows = np.loadtxt(out / "labels" / "1.txt", ndmin=2)
    assert rows.shape[1] == 6 and len(rows) > 0
    assert (rows[:, 1:5] >= 0).all() and (rows[:, 1:5] <= 1).all() and (rows[:, 5] > float(CONF)).all()
    assert set(rows[:, 0]) <= {0, 1, 2}


def test_video(weights, tmp_path):
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 64))
    for k in range(10):
        writer.write(cv2.cvtColor(scene(k, 64, 96), cv2.COLOR_RGB2BGR))
    writer.release()
    out = detect.main(
        [
            "--weights",
            str(weights),
            "--source",
            str(video),
            "--conf",
            CONF,
            "--save-txt",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    capture = cv2.VideoCapture(str(out / "clip.mp4"))
    frames = 0
    while capture.read()[0]:
        frames += 1
    assert frames == 10
    assert len(list((out / "labels").glob("clip_*.txt"))) == 10


def test_sources_and_fixed_size_onnx(weights, images, tmp_path):
    fixed = tmp_path / "fixed.pt"
    fixed.write_bytes(weights.read_bytes())
    export.main(["--weights", str(fixed), "--onnx", "--runs", "1"])  # 64x64 only
    listing = tmp_path / "list.txt"
    listing.write_text(f"{images / '0.png'}\n{images / '2.png'}\n")
    for source, expected in [
        (listing, ["0.png", "2.png"]),
        (f"{images}/[01].png", ["0.png", "1.png"]),
        (images / "1.png", ["1.png"]),
    ]:
        out = detect.main(
            [
                "--weights",
                str(fixed.with_suffix(".onnx")),
                "--source",
                str(source),
                "--imgsz",
                "128",
                "--out",
                str(tmp_path / f"out{len(expected)}{expected[-1]}"),
            ]
        )
        assert sorted(p.name for p in out.glob("*.png")) == expected


def test_next_run_dir(weights, images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = detect.main(["--weights", str(weights), "--source", str(images / "0.png")])
    second = detect.main(["--weights", str(weights), "--source", str(images / "0.png")])
    assert (first, second) == (Path("runs/detect/exp"), Path("runs/detect/exp2"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the legacy ONNX exporter, used on purpose
def test_bad_weights_get_one_sentence(weights, images, tmp_path):
    foreign_onnx = tmp_path / "foreign.onnx"
    model = torch.nn.Conv2d(3, 4, 1)
    torch.onnx.export(model, torch.zeros(1, 3, 8, 8), str(foreign_onnx), dynamo=False)  # no metadata of ours
    broken = tmp_path / "broken.torchscript"
    broken.write_bytes(b"PK garbage" * 10)
    foreign_pt = tmp_path / "foreign.pt"
    torch.save({"model": "theirs"}, foreign_pt)
    for path in (foreign_onnx, broken, foreign_pt, tmp_path / "nothing.onnx", tmp_path / "weights.h5"):
        with pytest.raises(SystemExit) as exit_info:
            detect.main(["--weights", str(path), "--source", str(images)])
        message = str(exit_info.value.code)
        assert message.startswith("error: ") and str(path) in message and "\n" not in message, message
    with pytest.raises(SystemExit, match="is not a file, folder"):
        detect.main(["--weights", str(weights), "--source", str(tmp_path / "no-such-thing.jpg")])
