"""The calibrated test model (make_checkpoint) and the images it runs on (scene), shared by the export, detect,
predict, deploy, streams, tracking, tiles and weights tests.

A randomly initialised network gives flat, near-identical scores (its activations shrink layer
after layer), which would make any comparison of detections vacuous. So the test model gets its
BatchNorm statistics calibrated on test-like images (as if trained on them) and a zero class bias: scores then spread
over 0.1..0.9, there are dozens of detections above 0.3, and they differ from image to image.
"""

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml

from models.predict import load, predict
from models.weights import model_from_checkpoint
from models.yolo import YOLO
from utils.checkpoints.ours import FORMAT, save_checkpoint
from utils.inference import compare_detections, postprocess, preprocess

ROOT = Path(__file__).resolve().parents[1]
CONF = 0.3


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: on a busy machine, two spinning threads cost far more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scene(seed, h=64, w=64):
    """A uint8 RGB image: noise plus a few filled shapes."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    for _ in range(4):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(4, max(h, w) // 3))
        cv2.rectangle(img, (x - r, y - r), (x + r, y + r), colour, -1) if seed % 2 else cv2.circle(
            img, (x, y), r, colour, -1
        )
    return img


def make_checkpoint(path, imgsz=64, scale="n"):
    torch.manual_seed(0)
    model = YOLO(scale, nc=3)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average of the calibration batches
    model.train()
    with torch.no_grad():  # at every size the tests use: the statistics of a 2x2 and a 4x3 map differ
        for k, (h, w) in enumerate([(imgsz, imgsz), (128, 96), (96, 128)]):
            model(batch_of(range(10 * k, 10 * k + 4), h, w))
    for branch in [*model.head.cls, *getattr(model.head, "one2one_cls", [])]:
        torch.nn.init.constant_(branch[-1].bias, 0.0)
    save_checkpoint(
        {
            "format": FORMAT,
            "scale": scale,
            "nc": 3,
            "names": ["ring", "box", "blob"],
            "imgsz": imgsz,
            "model": model.state_dict(),
        },
        path,
    )
    return path


def pytorch_model(weights):
    return model_from_checkpoint(weights).fuse()


def batch_of(seeds, h, w):
    return torch.cat([preprocess(scene(s, h, w), (h, w))[0] for s in seeds])


def assert_gives_the_final_detections(weights, model):
    """An exported end-to-end model (load_exported's dict of YOLO26's file) gives the .pt's final detections on a
    96 px scene: scores best first within 1e-4, each detection above CONF matched to the .pt's, boxes within 0.01 px."""
    assert model.end2end and model.nms is None
    x = batch_of([3], 96, 96)
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = model.run(x)
    assert theirs.shape == ours.shape == (1, 189, 6)
    assert torch.allclose(theirs[..., 4], ours[..., 4], atol=1e-4)  # scores, best first
    detections = postprocess(theirs, model, CONF)[0]
    boxes, scores, unmatched = compare_detections(ours[0][ours[0, :, 4] > CONF], detections, CONF)
    assert len(detections) >= 5 and unmatched == 0 and boxes < 1e-2 and scores < 1e-4


def write_split(folder, model, seeds, size=64):
    """Images of the test scenes and, as labels, the model's own detections above 0.3 (YOLO txt)."""
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir(parents=True)
    for seed in seeds:
        img = scene(seed, size, size)
        cv2.imwrite(str(folder / "images" / f"{seed}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        found = predict(model, img, conf=0.3, rgb=True)
        rows = [
            f"{c} {(x1 + x2) / 2 / size:.6f} {(y1 + y2) / 2 / size:.6f} {(x2 - x1) / size:.6f} {(y2 - y1) / size:.6f}"
            for (x1, y1, x2, y2), c in zip(found.boxes.clip(0, size), found.classes)
        ]
        (folder / "labels" / f"{seed}.txt").write_text("\n".join(rows))


def labelled_checkpoint(root, names, train, val=range(200, 208)):
    """root/run/best.pt (the calibrated model) whose checkpoint names a dataset it labelled itself (write_split: its
    own detections above 0.3 are the labels), so that it scores a high mAP there and an export that moves boxes or
    scores loses some of it. train, val: the seeds of each split's scenes."""
    weights = make_checkpoint(root / "run" / "best.pt")
    model = load(weights)
    write_split(root / "set" / "train", model, train)
    write_split(root / "set" / "val", model, val)
    data = root / "set.yaml"
    data.write_text(
        yaml.safe_dump({"path": str(root / "set"), "train": "train/images", "val": "val/images", "names": names})
    )
    torch.save({**torch.load(weights, weights_only=True), "args": {"data": str(data)}}, weights)
    return weights
