"""utils/plots.py: the pictures a user looks at (batch mosaics, labels.jpg, F1/P/R curves) are
written, decode, and show what they claim to show. Tiny inputs, CPU, a few seconds."""

import logging
import threading

import cv2
import numpy as np
import torch

from utils.plots import (
    LatestOnly,
    colour,
    in_background,
    plot_batch,
    plot_confidence_curves,
    plot_labels,
    plot_results,
)

NAMES = ["circle", "square", "triangle", "star", "cross", "hexagon"]


def black(b=1, h=320, w=320):
    return torch.zeros((b, 3, h, w), dtype=torch.uint8)


def read(path):
    img = cv2.imread(str(path))
    assert img is not None, f"{path} was not written or does not decode"
    return img


def close(pixel, bgr, tol=60):
    return np.abs(pixel.astype(int) - np.array(bgr)).max() <= tol


def test_box_lands_where_the_target_says(tmp_path):
    # one 320x320 image is drawn at scale 1: the grid pixels are the image's pixels
    targets = torch.tensor([[0, 2, 100, 60, 220, 200]], dtype=torch.float32)
    img = read(plot_batch(black(), targets, NAMES, tmp_path / "batch.jpg"))
    assert img.shape == (320, 320, 3)
    c = colour(2)
    for y in range(90, 190, 10):  # left and right edges, below the label
        assert close(img[y, 100], c) and close(img[y, 220], c), y
    for x in range(110, 215, 10):  # bottom edge
        assert close(img[200, x], c), x
    assert img[90:190, 110:210].max() < 40  # inside the box: still the black image
    assert img[230:320, 240:320].max() < 40  # far from the box: nothing drawn
    assert np.abs(img[40:60, 100:160].astype(int) - c).max(-1).min() < 30  # the name's filled label sits above the box


def test_class_colours_are_the_same_in_every_call(tmp_path):
    a = read(plot_batch(black(2), torch.tensor([[1, 3, 50, 50, 150, 150]]), NAMES, tmp_path / "a.jpg"))
    b = read(
        plot_batch(
            black(), torch.tensor([[0, 3, 150, 100, 300, 250], [0, 4, 10, 200, 60, 300]]), NAMES, tmp_path / "b.jpg"
        )
    )
    tile_x = a.shape[1] - 320  # image 1 is the second tile of the first row
    edge_a, edge_b, other = a[100, tile_x + 50], b[175, 150], b[250, 10]
    assert close(edge_a, colour(3), 40) and close(edge_b, colour(3), 40)
    assert np.abs(edge_a.astype(int) - edge_b).max() < 40
    assert not close(other, colour(3), 40)  # another class, another colour


def test_predictions_are_drawn_instead_of_targets(tmp_path):
    targets = torch.tensor([[0, 0, 20, 20, 80, 80]])
    predictions = [np.array([[150, 150, 250, 250, 0.9, 1], [20, 200, 80, 300, 0.05, 2]])]  # the second is below conf
    img = read(plot_batch(black(), targets, NAMES, tmp_path / "pred.jpg", predictions=predictions))
    assert close(img[200, 150], colour(1)) and close(img[200, 250], colour(1))
    assert img[30:80, 30:80].max() < 40  # the target is not drawn in predictions mode
    assert img[220:300, 10:90].max() < 40  # nor a prediction under the confidence threshold


def test_many_classes_images_and_no_boxes_do_not_crash(tmp_path):
    names = [f"class{k}" for k in range(365)]
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 255, (64, 3, 64, 96), dtype=np.uint8))  # H != W
    targets = torch.tensor(
        [[i, k, 5, 5, 60, 40] for i, k in zip(range(64), rng.integers(0, 365, 64))], dtype=torch.float32
    )
    img = read(plot_batch(images, targets, names, tmp_path / "many.jpg", max_images=64))
    assert 1000 <= img.shape[1] <= 1920 and img.shape[0] < img.shape[1]  # 8x8 tiles wider than tall, within 1920
    img = read(plot_batch(images[:3], torch.zeros((0, 6)), names, tmp_path / "none.jpg"))  # images without any box
    assert img.shape[0] >= 64 and img.shape[1] >= 96
    assert plot_batch(images[:0], torch.zeros((0, 6)), names, tmp_path / "empty.jpg") is None
    assert not (tmp_path / "empty.jpg").exists()


def test_plot_labels_writes_four_panels_and_survives_empty_sets(tmp_path):
    records = [
        {"im": "a.jpg", "shape": [100, 200], "labels": [[0, 0.1, 0.1, 0.3, 0.5], [5, 0.5, 0.5, 0.9, 0.7]]},
        {"im": "b.jpg", "shape": [100, 100], "labels": []},  # a background image
    ]
    img = read(plot_labels(records, NAMES, tmp_path / "labels.jpg"))
    assert 800 <= img.shape[0] <= 1200 and 800 <= img.shape[1] <= 1200
    read(plot_labels([], NAMES, tmp_path / "empty.jpg"))
    read(plot_labels([{"im": "c.jpg", "shape": [10, 10], "labels": []}], [], tmp_path / "no_names.jpg"))


def test_confidence_curves_return_where_mean_f1_peaks(tmp_path):
    grid = np.linspace(0, 1, 1000)
    f1 = np.stack([np.exp(-((grid - 0.3) ** 2) / 0.05), np.exp(-((grid - 0.5) ** 2) / 0.05), np.ones(1000)])
    f1[2, :] = 0
    f1[2, 900] = 50  # a class without ground truth must not move the operating point
    curves = {
        "confidence": grid,
        "precision": np.clip(f1, 0, 1),
        "recall": np.clip(f1, 0, 1),
        "f1": f1,
        "n_gt": np.array([4, 2, 0]),
    }
    best = plot_confidence_curves(curves, NAMES[:3], tmp_path)
    assert isinstance(best, float) and abs(best - 0.4) < 0.002  # the mean of two bumps at 0.3 and 0.5 peaks midway
    for name in ("F1_curve.png", "P_curve.png", "R_curve.png"):
        img = read(tmp_path / name)
        assert 300 <= img.shape[0] <= 1000 and 400 <= img.shape[1] <= 1400
    curves["n_gt"] = np.zeros(3)  # nothing to evaluate: still three files, confidence 0
    assert plot_confidence_curves(curves, NAMES[:3], tmp_path / "none") == 0.0
    assert (tmp_path / "none" / "F1_curve.png").exists()


def test_in_background_runs_in_a_thread_that_writes_the_file(tmp_path):
    records = [{"im": "a.jpg", "shape": [64, 64], "labels": [[1, 0.2, 0.2, 0.6, 0.8]]}]
    thread = in_background(plot_labels, records, NAMES, path=tmp_path / "labels.jpg")
    thread.join(timeout=60)
    assert not thread.daemon and not thread.is_alive()  # the interpreter waits for it at exit
    read(tmp_path / "labels.jpg")


def finish(draw):
    thread = draw.thread  # None once it has drawn the newest call
    if thread:
        thread.join(60)


def test_results_png_is_drawn_off_the_loop_and_ends_with_the_last_epoch(tmp_path, caplog):
    """train.py redraws results.png after each epoch through LatestOnly: a call returns at once, calls made while
    one draws collapse into the newest, and the file ends with the last row; an error is one warning, not a stop."""
    started, release, drawn = threading.Event(), threading.Event(), []

    def slow(*args):
        started.set()
        release.wait(30)
        drawn.append(args)

    draw = LatestOnly(slow)
    draw(1)
    assert started.wait(30)
    draw(2), draw(3), draw(4)  # while 1 draws: only the newest waits
    release.set()
    finish(draw)
    assert drawn == [(1,), (4,)] and draw.thread is None

    csv_path, png = tmp_path / "results.csv", tmp_path / "results.png"
    csv_path.write_text("epoch,box_loss,mAP50\n1,0.5,0.1\n2,0.4,")  # the loop is writing row 2
    draw = LatestOnly(plot_results)
    draw(csv_path, png)
    finish(draw)
    assert read(png).shape[0] > 100  # drawn from the complete row
    with caplog.at_level(logging.WARNING, logger="yolo"):
        draw(tmp_path / "missing.csv", png)
        finish(draw)
    assert [r.getMessage() for r in caplog.records] == [
        f"plot_results: [Errno 2] No such file or directory: '{tmp_path / 'missing.csv'}'"
    ]
    draw(csv_path, png)  # still draws after an error
    finish(draw)
    assert draw.thread is None
