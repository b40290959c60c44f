"""Augmentations keep the boxes right (issue 2): letterbox, flips, affine and mosaic move boxes with their pixels, also
through TrainDataset, whose batches decode each image once; and colour order (a red image arrives red)."""

import itertools

import numpy as np
import pytest
import torch
from data_helpers import (
    COLOURS,
    NO_AUG,
    assert_boxes_tight,
    chw_to_hwc,
    colour_mask,
    rect_dataset,
    write_image,
    write_labels,
)

from utils.data import labels as L
from utils.data import loader as D
from utils.data.augment import (
    PAD_VALUE,
    draw_tiles,
    drawn_boxes,
    flip,
    letterbox,
    mosaic_offsets,
    random_affine_matrix,
    tile_boxes,
)
from utils.hyperparameters import DEFAULTS

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


# ---------------------------------------------------------------------------------------------
# 3. Colour order
# ---------------------------------------------------------------------------------------------


def test_thin_strip_image_does_not_break_loading(tmp_path):
    folder = tmp_path / "images" / "train"
    p = write_image(folder / "strip.png", 1200, 10, [(100, 0, 300, 10, 0)])
    write_labels(p, 1200, 10, [(100, 0, 300, 10, 0)])
    write_image(folder / "normal.png", 64, 64)
    records = L.load_verified([folder], nc=1, split_name="train")
    for hyp in (NO_AUG, DEFAULTS):
        dataset = D.TrainDataset(records, 32, hyp, seed=0)
        assert all(dataset[0, i][0].shape == (3, 32, 32) for i in range(2))
    val = D.ValDataset(records, 32, batch_size=2)
    assert all(val[i][0].shape[0] == 3 for i in range(2))


def test_red_image_arrives_red_first_channel(tmp_path):
    folder = tmp_path / "images" / "train"
    for k in range(4):
        write_image(folder / f"red{k}.png", 64 + 16 * k, 48, background=(255, 0, 0))
    records = L.load_verified([folder], nc=1, split_name="train")

    for hyp in (NO_AUG, DEFAULTS):  # with HSV jitter the red is lighter or darker but still red
        dataset = D.TrainDataset(records, 64, hyp, seed=0)
        for i in range(4):
            image, _ = dataset[0, i]
            assert image.dtype == torch.uint8 and image.shape == (
                3,
                64,
                64,
            )  # uint8: train.py divides by 255 on the device
            pixels = image.reshape(3, -1).int()
            coloured = pixels[
                :, pixels.max(0).values - pixels.min(0).values > 30
            ]  # not the grey padding (HSV moves it too)
            assert coloured.shape[1] > 0.3 * pixels.shape[1]
            assert ((coloured[0] > coloured[1] + 30) & (coloured[0] > coloured[2] + 30)).all()

    val = D.ValDataset(records, 64, batch_size=2)
    for i in range(4):
        image, _, _ = val[i]
        pixels = image.reshape(3, -1)
        content = pixels[:, (pixels != 114).any(0)]
        assert (content[0] > 240).all() and (content[1:] < 15).all()


# ---------------------------------------------------------------------------------------------
# 4. Augmentation keeps the boxes right
# ---------------------------------------------------------------------------------------------


def canvas_with_rects(w, h, rects):
    img = np.zeros((h, w, 3), np.uint8)
    for x1, y1, x2, y2, c in rects:
        img[y1:y2, x1:x2] = COLOURS[c]
    return img, np.array([[c, x1, y1, x2, y2] for x1, y1, x2, y2, c in rects], np.float32)


RECTS = [(10, 12, 40, 30, 0), (50, 40, 90, 70, 1), (20, 50, 28, 66, 2)]


def test_letterbox_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for shape, scaleup in (((64, 64), True), ((128, 96), True), ((160, 160), False)):
        out, ratio, (left, top) = letterbox(img, shape, scaleup=scaleup)
        assert out.shape[:2] == shape
        boxes = labels.copy()
        boxes[:, 1:] = boxes[:, 1:] * ratio + (left, top, left, top)
        assert_boxes_tight(out, boxes, require_all_pixels=True)


def place(images, labels, offsets, canvas, m, out_shape, min_area=0.1):
    """What TrainDataset.place does with given images and matrix: each image resized straight into the output."""
    tiles = [(img, (1.0, 1.0), xy) for img, xy in zip(images, offsets)]
    out = np.full((*out_shape, 3), PAD_VALUE, np.uint8)
    return out, drawn_boxes(tile_boxes(labels, offsets, canvas, min_area), draw_tiles(out, tiles, canvas, m))


def test_flip_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for lr, ud in ((True, False), (False, True), (True, True)):
        out, boxes = flip(img, labels, lr, ud)
        assert_boxes_tight(out, boxes, tol=0, require_all_pixels=True)
        assert not np.array_equal(boxes, labels)
        assert np.array_equal(out, img[:: -1 if ud else 1, :: -1 if lr else 1])


def test_affine_without_rotation_moves_boxes_with_pixels():
    img, labels = canvas_with_rects(100, 80, RECTS)
    for seed in range(6):
        m, _ = random_affine_matrix(np.random.default_rng(seed), (80, 100), (80, 100), 0, 0.1, 0.5, 0)
        out, boxes = place([img], [labels], [(0, 0)], 100, m, (80, 100))
        assert out.shape == img.shape and len(boxes)
        assert_boxes_tight(out, boxes)


def test_mosaic_min_area_drops_mostly_cut_boxes_unless_zero():
    # a grid of 7x7 boxes in each image: the mosaic's cuts leave some of them with slivers of every size
    size = 64
    grid = [(0, x, y, x + 7, y + 7) for x in np.arange(0.6, 57, 8) for y in np.arange(0.6, 57, 8)]
    labels = [np.array(grid, np.float32)] * 4
    slivers = 0
    for seed in range(10):
        offsets = mosaic_offsets([(64, 64)] * 4, size, np.random.default_rng(seed))
        strict, loose = (np.concatenate(tile_boxes(labels, offsets, 2 * size, a)) for a in (0.1, 0.0))
        area = lambda b: (b[:, 3] - b[:, 1]) * (b[:, 4] - b[:, 2])  # noqa: E731
        assert (area(loose) > 0).all() and (area(strict) >= 0.1 * 49).all()  # empty boxes never survive
        assert {tuple(b) for b in strict.tolist()} <= {tuple(b) for b in loose.tolist()}
        slivers += int((area(loose) < 0.1 * 49).sum())
    assert slivers > 0  # kept only with min_area 0, as Ultralytics' mosaic keeps them


def test_mosaic_moves_boxes_with_pixels():
    size = 64
    images, labels = [], []
    for k in range(4):  # each image a different aspect ratio and one rectangle of its own colour
        w, h = (64, 64, 48, 64)[k], (64, 40, 64, 52)[k]
        img, lab = canvas_with_rects(w, h, [(w // 4, h // 4, 3 * w // 4, 3 * h // 4, k)])
        images.append(img)
        labels.append(lab)
    shapes = [im.shape[:2] for im in images]
    for seed in range(6):
        rng = np.random.default_rng(seed)
        offsets = mosaic_offsets(shapes, size, rng)
        canvas, boxes = place(images, labels, offsets, 2 * size, np.eye(3), (2 * size, 2 * size))
        assert_boxes_tight(canvas, boxes, tol=0, require_all_pixels=True)  # the mosaic canvas, to the pixel
        # straight to size x size with a random scale and translation, as training does
        m, _ = random_affine_matrix(rng, (2 * size, 2 * size), (size, size), 0, 0.1, 0.5, 0)
        out, boxes = place(images, labels, offsets, 2 * size, m, (size, size))
        assert out.shape == (size, size, 3)
        if len(boxes):
            assert_boxes_tight(out, boxes)


def test_mosaic_sample_boxes_land_on_the_drawn_rectangles(tmp_path):
    """Through TrainDataset's batch path: images of other sizes than the training size (the load resize is folded
    into the warp), several rectangles each, mosaic partners from the batch, flips; and with rotation and shear
    (the canvas path), where a box encloses its turned rectangle."""
    folder = tmp_path / "images" / "train"
    for k, (w, h) in enumerate([(200, 150), (120, 160), (160, 160), (240, 120), (90, 150), (150, 100)]):
        rects = [(w // 8, h // 8, w // 2, h // 2, k % 4), (w // 2 + 8, h // 2 + 8, w - 8, h - 8, (k + 1) % 4)]
        write_labels(write_image(folder / f"im{k}.png", w, h, rects), w, h, rects)
    records = L.load_verified([folder], nc=4, split_name="train")
    hyp = dict(DEFAULTS, hsv_h=0, hsv_s=0, hsv_v=0, flipud=0.5, mosaic_min_area=0.5)  # no cut box below half its area
    dataset = D.TrainDataset(records, 96, hyp, seed=2)
    checked = 0
    for epoch in range(3):
        keys = [(epoch, i) for i in D.epoch_order(6, 2, epoch)]
        for image, labels in dataset.__getitems__(keys):
            assert image.shape == (3, 96, 96) and len(labels)
            assert_boxes_tight(chw_to_hwc(image), labels.numpy(), tol=2)
            checked += len(labels)
    assert checked >= 30
    turned = D.TrainDataset(records, 96, dict(hyp, degrees=20.0, shear=5.0, mosaic_min_area=0.1), seed=2)
    for image, labels in turned.__getitems__([(0, i) for i in range(6)]):
        img = chw_to_hwc(image)
        for cls, x1, y1, x2, y2 in labels.numpy():
            inside = np.zeros(img.shape[:2], bool)
            inside[max(int(y1) - 2, 0) : int(y2) + 3, max(int(x1) - 2, 0) : int(x2) + 3] = True
            assert (colour_mask(img, int(cls)) & inside).sum() > 0.2 * (x2 - x1) * (y2 - y1)


def test_a_batch_decodes_each_image_once_and_draws_mosaic_partners_from_itself(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=12, w=80, h=64)
    records = L.load_verified([folder], nc=4, split_name="train")
    reads = []
    real = D.load_original
    monkeypatch.setattr(D, "load_original", lambda record, *a: reads.append(record["im"]) or real(record, *a))
    dataset = D.TrainDataset(records, 64, dict(DEFAULTS, mixup=0.5), seed=0)
    sampler = D.EpochBatchSampler(12, 4, seed=0)
    for batch in itertools.islice(iter(sampler), 6):
        reads.clear()
        dataset.__getitems__(batch)
        assert sorted(reads) == sorted(records[i]["im"] for _, i in batch)  # each file once, no other file
    reads.clear()
    images, targets = next(iter(D.make_loader(dataset, D.EpochBatchSampler(12, 4, seed=0), workers=0)))
    assert len(reads) == 4 and images.shape == (4, 3, 64, 64)
    assert images.is_contiguous(memory_format=torch.channels_last)  # the model's layout: no copy on the device
    # a sample is a function of (seed, epoch, index) and its batch: the same in any batch of the same images
    batch = [(0, i) for i in (3, 7, 1, 9)]
    a, b = dataset.__getitems__(batch), dataset.__getitems__(batch[::-1])
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b[::-1]))


def test_train_dataset_boxes_stay_tight_through_every_transform(tmp_path):
    """End to end through TrainDataset: mosaic, affine (no rotation), flips, on and off."""
    folder = rect_dataset(tmp_path, n=4, w=96, h=72)
    records = L.load_verified([folder], nc=4, split_name="train")
    hyp_no_colour = dict(DEFAULTS, hsv_h=0, hsv_s=0, hsv_v=0, flipud=0.5)  # colour jitter would hide the colours
    checked = 0
    for hyp in (hyp_no_colour, dict(hyp_no_colour, mosaic=0.0)):
        dataset = D.TrainDataset(records, 64, hyp, seed=1)
        for epoch, i in itertools.product(range(3), range(4)):
            image, labels = dataset[epoch, i]
            if len(labels):
                assert_boxes_tight(chw_to_hwc(image), labels.numpy())
                checked += 1
    assert checked >= 16


def test_an_image_many_times_the_training_size_is_decoded_reduced_and_its_boxes_follow(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4, w=512, h=384, suffix=".jpg")
    records = L.load_verified([folder], nc=4, split_name="train")
    reads = []
    real = D.load_original
    monkeypatch.setattr(D, "load_original", lambda *a: reads.append(a[-1]) or real(*a))
    hyp = dict(DEFAULTS, hsv_h=0, hsv_s=0, hsv_v=0)
    for imgsz, reduce in ((64, 8), (128, 4), (200, 2), (300, 1)):
        reads.clear()
        for image, labels in D.TrainDataset(records, imgsz, hyp, seed=0).__getitems__([(0, i) for i in range(4)]):
            assert image.shape == (3, imgsz, imgsz)
            assert_boxes_tight(chw_to_hwc(image), labels.numpy(), tol=2)
        assert reads == [reduce] * 4


def test_mosaic_is_switched_off_for_the_last_epochs_and_mixup_blends_two(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4)
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, DEFAULTS, seed=0, mosaic_epochs=2)
    calls = []
    real = D.TrainDataset.place
    monkeypatch.setattr(
        D.TrainDataset, "place", lambda self, loaded, *a: calls.append(len(loaded)) or real(self, loaded, *a)
    )
    for epoch in range(4):
        for i in range(4):
            dataset[epoch, i]
    assert calls == [4] * 8 + [1] * 8  # mosaics in epochs 0 and 1 only, then letterboxed single images
    calls.clear()
    mixed = D.TrainDataset(records, 64, dict(DEFAULTS, mixup=1.0), seed=0)
    image, labels = mixed[0, 0]
    assert calls == [4, 4] and image.shape == (3, 64, 64)
