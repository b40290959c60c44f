"""--cache ram (issue 2): the same samples as from disk, a cache that would not fit falls back to reading from
disk, validation's cache follows the records it sorts, one cache shared by the two processes of a machine.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from data_helpers import rect_dataset, write_image, write_labels

from utils.data import labels as L
from utils.data import loader as D
from utils.data.images import cache_images, resized_shapes
from utils.distributed import NodeShare
from utils.hyperparameters import DEFAULTS

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


def test_cache_ram_gives_the_same_samples(tmp_path):
    # Images already at the training size: bitwise the same. Larger ones: the cache holds them resized once (INTER_AREA,
    # as validation does) where from disk the load resize is folded into the one resize that places each image.
    for (w, h), exact in (((64, 48), True), ((80, 60), False)):
        records = L.load_verified([rect_dataset(tmp_path / f"{w}", n=4, w=w, h=h)], nc=4, split_name="train")
        a = D.TrainDataset(records, 64, DEFAULTS, seed=3)
        b = D.TrainDataset(records, 64, DEFAULTS, seed=3, cache=cache_images(records, 64))
        for keys in [[(0, 0)], [(0, 3)], [(1, i) for i in range(4)]]:
            for (ia, la), (ib, lb) in zip(a.__getitems__(keys), b.__getitems__(keys)):
                if exact:
                    assert torch.equal(la, lb) and torch.equal(ia, ib)
                else:  # each image is resized from whole source pixels: the boxes follow, within one pixel
                    assert la.shape == lb.shape and (la - lb).abs().max() < 1
                    assert (ia.float() - ib.float()).abs().mean() < 3
        before = [im.copy() for im in b.cache]
        for i in range(4):
            b[0, i]
        assert all(np.array_equal(x, y) for x, y in zip(before, b.cache))  # augmentation never writes into the cache


def test_cache_ram_that_would_not_fit_falls_back_to_reading_from_disk(tmp_path, monkeypatch, log_lines):
    folder = rect_dataset(tmp_path, n=4, w=80, h=60)
    records = L.load_verified([folder], nc=4, split_name="train")
    need = int((resized_shapes(records.shapes, 64).prod(1) * 3).sum())
    assert need == 4 * 48 * 64 * 3  # estimated from the sizes in the records, before anything is decoded
    monkeypatch.setattr("utils.data.images.available_memory", lambda: need)  # fits, but without 20% to spare
    dataset = D.TrainDataset(records, 64, DEFAULTS, seed=3, cache=cache_images(records, 64))
    assert dataset.cache is None
    warning = next(m for m in log_lines() if m.startswith("--cache ram"))
    assert "training without the RAM cache" in warning and f"{need / 1e9:.1f} GB" in warning
    assert torch.equal(dataset[0, 1][0], D.TrainDataset(records, 64, DEFAULTS, seed=3)[0, 1][0])  # and it trains
    monkeypatch.setattr("utils.data.images.available_memory", lambda: 2 * need)
    assert D.TrainDataset(records, 64, DEFAULTS, seed=3, cache=cache_images(records, 64)).cache is not None


def test_cache_ram_for_validation_follows_the_records_it_sorts(tmp_path):
    # ValDataset sorts its records by aspect ratio; the cache comes in the caller's order and must follow.
    for k, (w, h) in enumerate([(90, 30), (30, 90), (60, 60), (80, 40)]):
        rect = (w // 3, h // 3, 2 * w // 3, 2 * h // 3, k)
        write_labels(write_image(tmp_path / "images" / "val" / f"im{k}.png", w, h, [rect]), w, h, [rect])
    records = L.load_verified([tmp_path / "images" / "val"], nc=4, split_name="val")
    plain, cached = D.ValDataset(records, 64, 2), D.ValDataset(records, 64, 2, cache=cache_images(records, 64))
    assert [m["path"] for *_, m in plain] != [r["im"] for r in records]  # the order did change
    for (a, la, ma), (b, lb, mb) in zip(plain, cached):
        assert torch.equal(a, b) and torch.equal(la, lb) and ma == mb


def test_cache_ram_shared_by_two_processes_of_a_machine_is_told_not_read_from_the_environment(tmp_path, monkeypatch):
    # Two "ranks" as two threads: what cache_images needs of the other processes comes in the NodeShare, so no
    # process group, no LOCAL_RANK: local rank 0 fills one /dev/shm file, rank 1 maps it, and the name is removed.
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    for key in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    records = L.load_verified([rect_dataset(tmp_path, n=3, w=80, h=60)], nc=4, split_name="train")
    barrier, calls = threading.Barrier(2, timeout=60), []

    def rank(local_rank):
        share = NodeShare(local_rank, 2, f"test-{os.getpid()}", lambda objects: calls.append("broadcast"), barrier.wait)
        return cache_images(records, 64, share=share)

    with ThreadPoolExecutor(2) as pool:
        filled, mapped = pool.map(rank, (0, 1))
    assert calls == ["broadcast"] * 2
    plain = cache_images(records, 64)
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(plain, filled, mapped))
    name = mapped[0].filename  # np.memmap's views keep the file's name
    assert (
        filled[0].filename == name
        and name.startswith("/dev/shm/yolo-cache-")
        and not os.path.exists(name)
        and not mapped[0].flags.writeable
    )
