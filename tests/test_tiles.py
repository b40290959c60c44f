"""Sliced inference (utils/tiles.py, detect.py and val.py --tile): small objects that the whole-image pass cannot
see are found, an object that a seam cuts comes back once and whole, a large object comes from the whole-image
pass, bad --tile and --overlap values get one sentence, and the tiled path runs on an emulated GPU.

The finding and merging are checked with a fake detector that sees exactly the squares drawn (a trained model
small enough for a test is too weak to tell a lost box from a seam from one it never found); a real checkpoint
then runs the same path through detect.py and val.py.
"""

import runpy
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torchvision
import yaml
from calibrated_model import make_checkpoint, scene

import detect
from models.predict import detect_image
from utils.inference import Predictor
from utils.tiles import merge_tiles, tile_grid, tiled_predictor, tiling_error

REPO = Path(__file__).resolve().parents[1]
TILE = 128
MIN_SIDE = 5  # input px: what the fake detector needs to see an object, as a network needs a few pixels


def fake_run(x):
    """The raw output (n, 64, 4 + 2) of a detector that finds every red (class 0) and green (class 1) square of
    at least MIN_SIDE px in its input, clipped where the input ends, with score 0.9."""
    out = torch.zeros(len(x), 64, 6)
    for k, image in enumerate(x.cpu().numpy()):
        rows = []
        for c in (0, 1):
            mask = ((image[c] > 0.5) & (image[1 - c] < 0.5)).astype(np.uint8)
            n, _, stats, _ = cv2.connectedComponentsWithStats(mask)
            for x1, y1, w, h, _ in stats[1:n]:
                if min(w, h) >= MIN_SIDE:
                    rows.append([x1, y1, x1 + w, y1 + h, 0.9 * (c == 0), 0.9 * (c == 1)])
        if rows:
            out[k, : len(rows)] = torch.tensor(rows, dtype=torch.float32)
    return out.to(x.device)


FAKE = Predictor(fake_run, ["red", "green"], (TILE, TILE), 32, backend="fake", weights="fake")


def draw(h, w, squares):
    """A black RGB image with filled squares (class, x1, y1, side): class 0 red, class 1 green."""
    img = np.zeros((h, w, 3), np.uint8)
    for c, x1, y1, side in squares:
        img[y1 : y1 + side, x1 : x1 + side, c] = 255
    return img


def tiled(img, overlap=0.2):
    return detect_image(tiled_predictor(FAKE, (TILE, TILE), TILE, overlap), img, img.shape[:2])[0]


def boxes_of(squares):
    return torch.tensor([[x1, y1, x1 + s, y1 + s] for _, x1, y1, s in squares], dtype=torch.float32)


def test_the_grid_covers_the_image_with_the_overlap_asked_for():
    grid = tile_grid(700, 1000, TILE, 0.2)  # step 128 - 26 = 102; the last tile flush with the far edge
    xs, ys = sorted({g[0] for g in grid}), sorted({g[1] for g in grid})
    assert xs[:3] == [0, 102, 204] and xs[-1] == 1000 - TILE and ys[-1] == 700 - TILE
    assert all(x2 - x1 == TILE and y2 - y1 == TILE for x1, y1, x2, y2 in grid)
    assert len(grid) == len(xs) * len(ys) == 10 * 7
    assert tile_grid(100, 90, TILE) == [(0, 0, 90, 100)]  # smaller than a tile: the image itself


def test_tiles_find_the_small_objects_that_the_whole_image_misses_once_each():
    rng = np.random.default_rng(0)
    squares, taken = [], np.zeros((700, 1000), bool)
    while len(squares) < 30:  # 8-14 px, none touching another
        side = int(rng.integers(8, 15))
        x1, y1 = int(rng.integers(1, 1000 - side - 1)), int(rng.integers(1, 700 - side - 1))
        if not taken[y1 - 1 : y1 + side + 1, x1 - 1 : x1 + side + 1].any():
            taken[y1 : y1 + side, x1 : x1 + side] = True
            squares.append((len(squares) % 2, x1, y1, side))
    img = draw(700, 1000, squares)
    assert len(detect_image(FAKE, img, (TILE, TILE))[0]) == 0  # at 128 px the squares are ~1 px: nothing found
    dets = tiled(img)
    assert len(dets) == len(squares)  # every one, and none twice although many lie on seams
    iou = torchvision.ops.box_iou(dets[:, :4], boxes_of(squares))
    assert (iou.max(1).values > 0.99).all() and (iou.max(0).values > 0.99).all()
    assert dets[:, 5].tolist() == [float(squares[i][0]) for i in iou.argmax(1).tolist()]


def test_an_object_cut_by_a_seam_comes_back_once_and_whole():
    """Tiles start at x = 0, 102, 204, 272 (step 102; the last flush with the edge), and so at y: a square at x
    115..135 is whole in the second column's tile and cut at x = 128 by the first's, which sees 13 px of it, enough to
    "detect"; one at x 300..312, y 105..117 lies whole in four tiles (two columns and two rows overlap there). Plain
    NMS at IoU 0.7 would keep the cut box beside the whole one: their IoU is 0.65."""
    squares = [(0, 115, 40, 20), (1, 300, 105, 12)]
    img = draw(400, 400, squares)
    dets = tiled(img)
    assert len(dets) == 2
    iou = torchvision.ops.box_iou(dets[:, :4], boxes_of(squares))
    assert (iou.max(1).values > 0.99).all()
    # the same boxes before the merge: the duplicates are there to be removed
    raw = fake_run(torch.from_numpy(img[:128, :128].transpose(2, 0, 1)[None] / 255).float())[0]
    assert raw[:, 4].gt(0).sum() == 1 and raw[raw[:, 4] > 0][0, 2] == 128  # the cut piece, clipped at the seam
    cut_piece = torch.tensor([[115, 40, 128, 60]], dtype=torch.float32)
    assert torchvision.ops.box_iou(cut_piece, boxes_of(squares[:1])) < 0.7


def test_a_large_object_comes_from_the_whole_image_pass_once():
    """A 300 px square spans several 128-px tiles, each of which sees only a piece; the whole image at 128 px sees it
    whole (~38 px). The pieces give way to it."""
    squares = [(0, 200, 150, 300), (1, 40, 40, 10)]
    dets = tiled(draw(700, 1000, squares))
    assert len(dets) == 2
    iou = torchvision.ops.box_iou(dets[:, :4], boxes_of(squares))
    assert iou.max(1).values.min() > 0.9  # the whole-image pass: 1 px there is 7.8 px here


def test_merge_keeps_adjacent_objects_of_one_tile_and_pieces_of_one_object_once():
    dets = np.array(
        [
            [0, 0, 10, 10, 0.9, 0],  # tile 0, whole
            [2, 2, 8, 8, 0.8, 0],  # tile 0, whole, nested in the first: the tile's own NMS kept both
            [1, 0, 11, 10, 0.7, 0],  # tile 1, whole: the first one seen again
            [50, 0, 60, 10, 0.95, 0],  # tile 1, cut (a piece)
            [50, 0, 70, 10, 0.6, 0],  # tile 2, whole: the whole object, lower score than its piece
        ],
        np.float32,
    )
    keep = merge_tiles(dets, np.array([0, 0, 1, 1, 2]), np.array([False, False, False, True, False]))
    assert sorted(keep.tolist()) == [0, 1, 4]


@pytest.mark.parametrize(
    "tile, overlap, sentence",
    [
        (32, 0.2, "--tile 32 is smaller than the model's input (64x64 px)"),
        (64, 0.95, "--overlap 0.95 must be between 0 and 0.9"),
        (64, -0.1, "--overlap -0.1 must be between 0 and 0.9"),
    ],
)
def test_bad_tile_or_overlap_gets_one_sentence(tile, overlap, sentence, weights, large_image, tmp_path):
    assert sentence in tiling_error(tile, overlap, (64, 64))
    with pytest.raises(SystemExit) as e:
        detect.main(["--weights", str(weights), "--source", str(large_image), "--tile", str(tile),
                     "--overlap", str(overlap), "--out", str(tmp_path)])  # fmt: skip
    assert sentence in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt")  # 64 px, calibrated (calibrated_model.py)


@pytest.fixture(scope="module")
def large_image(tmp_path_factory):
    path = tmp_path_factory.mktemp("large") / "large.png"
    cv2.imwrite(str(path), cv2.cvtColor(scene(1, 150, 230), cv2.COLOR_RGB2BGR))
    return path


def test_detect_and_val_run_tiled_with_a_real_model(weights, large_image, tmp_path):
    out = detect.main(["--weights", str(weights), "--source", str(large_image), "--tile", "64", "--conf", "0.3",
                       "--save-txt", "--out", str(tmp_path / "detect")])  # fmt: skip
    assert (out / "large.png").exists() and (out / "labels/large.txt").exists()
    images, labels = tmp_path / "data/images/val", tmp_path / "data/labels/val"
    images.mkdir(parents=True), labels.mkdir(parents=True)
    for k, (h, w) in enumerate([(150, 230), (120, 90)]):  # one sliced, one smaller than two tiles across
        cv2.imwrite(str(images / f"{k}.png"), cv2.cvtColor(scene(k, h, w), cv2.COLOR_RGB2BGR))
        (labels / f"{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    cfg = tmp_path / "data/set.yaml"
    cfg.write_text(yaml.safe_dump({"path": ".", "train": "images/val", "val": "images/val", "names": ["a", "b", "c"]}))
    argv = sys.argv
    try:
        sys.argv = ["val.py", "--weights", str(weights), "--data", str(cfg), "--tile", "80", "--workers", "0",
                    "--out", str(tmp_path / "val")]  # fmt: skip
        runpy.run_path(str(REPO / "val.py"), run_name="__main__")
    finally:
        sys.argv = argv
    metrics = yaml.safe_load((tmp_path / "val/metrics.json").read_text())
    assert metrics["images"] == 2 and 0 <= metrics["mAP50-95"] <= 1


def test_tiled_detect_on_the_gpu_finds_what_it_finds_on_the_cpu(weights, large_image, emulated_gpu, tmp_path):
    args = ["--weights", str(weights), "--source", str(large_image), "--tile", "64", "--conf", "0.3", "--save-txt"]
    on_gpu = detect.main([*args, "--device", "0", "--out", str(tmp_path / "gpu")])
    assert emulated_gpu.count("convolution", torch.float32) > 0
    on_cpu = detect.main([*args, "--device", "cpu", "--out", str(tmp_path / "cpu")])
    rows = (on_gpu / "labels/large.txt").read_text()
    assert rows and rows == (on_cpu / "labels/large.txt").read_text()
