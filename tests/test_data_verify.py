"""Verification of a dataset's files and its cache (issue 2): bad files reported and the good kept, EXIF, the label
cache reused and invalidated, a read-only dataset, the array-backed records, the user's files never modified."""

import errno
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import NO_AUG, hash_tree, rect_dataset, write_image, write_labels

from utils.data import labels as L
from utils.data import loader as D
from utils.data.images import read_image
from utils.data.records import Records
from utils.data.shapes import NAMES, make_shapes
from utils.hyperparameters import DEFAULTS

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


def broken_dataset(root):
    """One good image plus one of each kind of bad file. Returns (image folder, {name: expected status})."""
    folder = root / "images" / "train"
    good = write_image(folder / "good.jpg", 64, 64, [(8, 8, 40, 40, 0)])
    write_labels(good, 64, 64, [(8, 8, 40, 40, 0)])
    expected = {"good.jpg": "labelled"}

    full = (folder / "good.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(full[: len(full) // 2])  # cv2 still decodes it (grey bottom)
    png = write_image(folder / "whole.png", 64, 48).read_bytes()
    (folder / "whole.png").unlink()
    (folder / "truncated.png").write_bytes(png[: len(png) - 40])  # its header still reads fine
    expected["truncated.png"] = "corrupt"
    (folder / "zero.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("this is not an image\n")
    write_image(folder / "tiny.png", 6, 6)
    expected.update({"truncated.jpg": "corrupt", "zero.jpg": "corrupt", "text.jpg": "corrupt", "tiny.png": "corrupt"})
    # A JPEG with harmless padding after the end-of-image marker is fine.
    (folder / "padded.jpg").write_bytes(full + b"\x00" * 16)
    expected["padded.jpg"] = "background"

    rows = {
        "four_values": "0 0.5 0.5 0.2\n",
        "nan": "0 0.5 nan 0.2 0.2\n",
        "class_out_of_range": "7 0.5 0.5 0.2 0.2\n",
        "class_not_integer": "1.5 0.5 0.5 0.2 0.2\n",
        "far_outside": "0 0.5 0.5 1.6 0.2\n",
        "not_numbers": "person 0.5 0.5 0.2 0.2\n",
        "binary_label": None,
    }
    for name, row in rows.items():
        p = write_image(folder / f"{name}.png", 32, 32)
        lp = Path(L.label_path(str(p)))
        lp.parent.mkdir(parents=True, exist_ok=True)
        lp.write_bytes(b"\xff\xfe\x00\x81garbage" if row is None else row.encode())
        expected[f"{name}.png"] = "corrupt"
    # Kept: a box just outside [0, 1] (clipped), duplicated rows (dropped), an empty label file.
    p = write_image(folder / "clip_and_duplicates.png", 32, 32)
    Path(L.label_path(str(p))).write_text("1 0.5 0.5 1.004 0.3\n1 0.5 0.5 1.004 0.3\n2 0.25 0.25 0.1 0.1\n")
    expected["clip_and_duplicates.png"] = "labelled"
    p = write_image(folder / "empty_label.png", 32, 32)
    Path(L.label_path(str(p))).write_text("\n")
    expected["empty_label.png"] = "empty"
    return folder, expected


def test_verification_reports_every_bad_file_and_keeps_the_good(tmp_path, log_lines):
    folder, expected = broken_dataset(tmp_path / "set")
    (tmp_path / "set" / "list.txt").write_text(
        "".join(f"images/train/{n}\n" for n in expected) + "images/train/vanished.jpg\n"
    )
    expected["vanished.jpg"] = "missing"
    for name, status in expected.items():
        assert L.verify_one(str(folder / name), nc=4)[0] == status, name

    records = L.load_verified([tmp_path / "set" / "list.txt"], nc=4, split_name="train")
    kept = {Path(r["im"]).name: r for r in records}
    assert set(kept) == {n for n, s in expected.items() if s not in ("corrupt", "missing")}
    clip = kept["clip_and_duplicates.png"]["labels"]
    assert len(clip) == 2 and clip[0][3] == 1.0  # duplicate dropped, x2 = 1.002 clipped to 1
    assert len(kept["empty_label.png"]["labels"]) == 0 and len(kept["padded.jpg"]["labels"]) == 0

    # The log: one line per bad file (status, path, reason), plus the file kept after a repair.
    log_files = list((tmp_path / "set" / "labels").glob("*.verify.log"))
    assert len(log_files) == 1
    lines = [line.split("\t") for line in log_files[0].read_text().splitlines()]
    assert all(len(parts) == 3 and parts[2] for parts in lines)
    by_name = {Path(path).name: (status, reason) for status, path, reason in lines}
    bad = {n for n, s in expected.items() if s in ("corrupt", "missing")}
    assert set(by_name) == bad | {"clip_and_duplicates.png"}
    assert all(by_name[n][0] == expected[n] for n in bad)
    assert "truncated" in by_name["truncated.jpg"][1] and "empty" in by_name["zero.jpg"][1]
    assert "not a readable image" in by_name["text.jpg"][1] and "6x6" in by_name["tiny.png"][1]
    assert "line 1" in by_name["nan.png"][1] and "class 7" in by_name["class_out_of_range.png"][1]
    assert by_name["clip_and_duplicates.png"] == ("fixed", "1 duplicate label rows removed")

    # The totals line, and a warning that points at the log.
    messages = "\n".join(log_lines())
    n_bad = len(bad)
    assert (
        f"{len(expected)} found, 2 labelled, 2 background (1 without label file, 1 with an empty one), "
        f"1 missing, {n_bad - 1} corrupt" in messages
    )
    assert f"{n_bad} of {len(expected)} images excluded" in messages and str(log_files[0]) in messages


def test_exif_orientation_is_applied(tmp_path):
    from PIL import Image  # only here: the pipeline itself reads with cv2

    img = np.zeros((40, 80, 3), np.uint8)
    img[:, :40] = (255, 0, 0)  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    path = tmp_path / "images" / "rotated.jpg"
    path.parent.mkdir()
    Image.fromarray(img).save(path, exif=exif.tobytes(), quality=95)
    status, record, _ = L.verify_one(str(path), nc=1)
    assert status == "background" and record["shape"] == [80, 40]  # (h, w): stored 80 wide, shown 80 tall
    shown = read_image(str(path))
    assert shown.shape == (80, 40, 3)
    assert shown[:30, :, 0].mean() > 200 and shown[50:, :, 0].mean() < 50  # the red half is now on top


def test_verification_in_processes_finds_what_threads_find_and_header_sizes_are_cv2s(tmp_path, monkeypatch):
    # A large set is verified in a process pool (from VERIFY_IN_PROCESSES_FROM images): the same verdicts.
    folder, expected = broken_dataset(tmp_path / "set")
    for name, (w, h) in {"wide.bmp": (90, 30), "tall.webp": (20, 70), "plain.jpg": (33, 65)}.items():
        write_image(folder / name, w, h)
    files = L.list_images([folder])
    in_threads = [L.verify_one(f, 4) for f in files]
    monkeypatch.setattr(L, "VERIFY_IN_PROCESSES_FROM", 0)
    records = L.load_verified([folder], nc=4, split_name="train", workers=2)
    assert [r["im"] for r in records] == [f for f, (_, rec, _) in zip(files, in_threads) if rec is not None]
    statuses = {Path(f).name: status for f, (status, _, _) in zip(files, in_threads)}
    assert all(statuses[name] == status for name, status in expected.items() if name in statuses)
    for r in records:  # the size from the header is the size of the decoded image training will use
        assert tuple(r["shape"]) == read_image(r["im"]).shape[:2], r["im"]


def test_cache_is_reused_and_invalidated_when_files_change(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=3)
    first = L.load_verified([folder], nc=4, split_name="train")
    assert len(list((tmp_path / "labels").glob("*.cache.npz"))) == 1

    real_verify = L.verify_one
    calls = []
    monkeypatch.setattr(L, "verify_one", lambda f, nc, **kw: calls.append(f) or real_verify(f, nc, **kw))
    assert L.load_verified([folder], nc=4, split_name="train") == first and calls == []  # from the cache

    label = tmp_path / "labels" / "train" / "im0.txt"
    label.write_text("3 0.5 0.5 0.5 0.5\n")
    os.utime(label, ns=(1, 1))  # even with an old timestamp: the size changed
    again = L.load_verified([folder], nc=4, split_name="train")
    assert len(calls) == 3 and next(r for r in again if r["im"].endswith("im0.png"))["labels"][0][0] == 3

    calls.clear()
    write_image(folder / "new.png", 40, 40)  # an added image
    assert len(L.load_verified([folder], nc=4, split_name="train")) == 4 and len(calls) == 4
    calls.clear()
    L.load_verified([folder], nc=5, split_name="train")  # another class count: the checks differ
    assert len(calls) == 4


def test_train_and_val_lists_over_one_folder_keep_their_own_cache(tmp_path, monkeypatch):
    folder = rect_dataset(tmp_path, n=4)
    (tmp_path / "train.txt").write_text("images/train/im0.png\nimages/train/im1.png\nimages/train/im2.png\n")
    (tmp_path / "val.txt").write_text("images/train/im3.png\n")
    L.load_verified([tmp_path / "train.txt"], 4, "train")
    L.load_verified([tmp_path / "val.txt"], 4, "val")
    monkeypatch.setattr(L, "verify_one", lambda f, nc: pytest.fail("verified again instead of using the cache"))
    assert len(L.load_verified([tmp_path / "train.txt"], 4, "train")) == 3
    assert len(L.load_verified([tmp_path / "val.txt"], 4, "val")) == 1
    assert folder.exists()


def test_read_only_dataset_folder_still_works(tmp_path, monkeypatch, log_lines):
    dataset = tmp_path / "readonly"
    folder = rect_dataset(dataset, n=2)
    before = hash_tree(dataset)
    real_write = L.write_text_atomic

    def refuse_inside_dataset(path, text):  # a read-only mount (chmod does not stop root, so simulate it)
        if Path(path).resolve().is_relative_to(dataset.resolve()):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_write(path, text)

    monkeypatch.setattr(L, "write_text_atomic", refuse_inside_dataset)
    records = L.load_verified([folder], nc=4, split_name="train")
    assert len(records) == 2 and hash_tree(dataset) == before
    assert any("the file system is read-only" in m for m in log_lines())
    assert len(list((tmp_path / "user_cache").glob("*.cache.npz"))) == 1  # cached in the user's folder instead
    monkeypatch.setattr(L, "verify_one", lambda f, nc: pytest.fail("verified again instead of using the cache"))
    assert L.load_verified([folder], nc=4, split_name="train") == records
    monkeypatch.undo()

    # Nowhere writable at all: a warning, and it still works.
    monkeypatch.setattr(L, "write_text_atomic", lambda path, text: (_ for _ in ()).throw(PermissionError(13, "denied")))
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "other_cache"))
    assert len(L.load_verified([folder], nc=4, split_name="train")) == 2
    assert any("verification will run again next time" in m for m in log_lines())


def test_array_backed_records_yield_exactly_the_samples_of_the_list_of_dicts(tmp_path):
    # The records as the code held them before utils/data/records.py: a list of dicts with the float64 label rows
    # verify_one returns. The flat-array Records must give bitwise the same samples (same seed, epoch, index),
    # else a run resumed across the change would not be exact.
    make_shapes(tmp_path / "shapes", n_train=10, n_val=2, seed=5, size=96)
    files = L.list_images([tmp_path / "shapes" / "images" / "train"])
    dicts = [record for _, record, _ in (L.verify_one(f, len(NAMES)) for f in files) if record is not None]
    for record in dicts:
        record.pop("dup", None)  # background records have none
    records = L.load_verified([tmp_path / "shapes" / "images" / "train"], len(NAMES), "train")
    assert isinstance(records, Records) and len(records) == len(dicts) == 10
    hyp = DEFAULTS | {"mosaic": 0.5, "mixup": 0.3, "degrees": 5.0}
    old, new = D.TrainDataset(dicts, 64, hyp, seed=3), D.TrainDataset(records, 64, hyp, seed=3)
    for key in itertools.product((0, 4), range(10)):
        (image_a, labels_a), (image_b, labels_b) = old[key], new[key]
        assert torch.equal(image_a, image_b) and torch.equal(labels_a, labels_b), key
    for (a, la, ma), (b, lb, mb) in zip(D.ValDataset(dicts, 64, 4), D.ValDataset(records, 64, 4)):
        assert torch.equal(a, b) and torch.equal(la, lb) and ma == mb
    # slicing (--subset, --fraction) and --single-cls keep the arrays
    assert records[2:5] == records.take([2, 3, 4]) and records[3]["im"] == dicts[3]["im"]
    assert (L.single_class(records).labels[:, 0] == 0).all() and (records.labels[:, 0] > 0).any()


def test_users_files_are_never_modified(tmp_path):
    folder, _ = broken_dataset(tmp_path / "set")
    before = hash_tree(tmp_path / "set" / "images") | {
        k: v for k, v in hash_tree(tmp_path / "set" / "labels").items() if k.endswith(".txt")
    }
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, DEFAULTS, seed=0)
    for i in range(len(dataset)):
        dataset[0, i]
    val = D.ValDataset(records, 64, batch_size=2)
    for i in range(len(val)):
        val[i]
    after = hash_tree(tmp_path / "set" / "images") | {
        k: v for k, v in hash_tree(tmp_path / "set" / "labels").items() if k.endswith(".txt")
    }
    assert after == before


@pytest.mark.parametrize("how", ["deleted", "overwritten with garbage"])
def test_image_that_breaks_during_training_is_replaced_and_reported(tmp_path, capfd, how):
    folder = rect_dataset(tmp_path, n=4)
    records = L.load_verified([folder], nc=4, split_name="train")
    victim = folder / "im2.png"
    if how == "deleted":
        victim.unlink()
    else:
        victim.write_bytes(b"not a png any more")
    for hyp in (NO_AUG, DEFAULTS):  # the image on its own, and as a mosaic partner
        dataset = D.TrainDataset(records, 64, hyp, seed=0)
        image, labels = dataset[0, 2]
        assert image.shape == (3, 64, 64) and len(labels) >= 1
        for i in range(len(dataset)):
            dataset[1, i]
    assert str(victim) in capfd.readouterr().err
