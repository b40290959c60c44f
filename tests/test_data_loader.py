"""The loaders (issue 2): sample order and DDP slices from seed and epoch, the same batches with any worker count and
after a mid-epoch restart, the workers' settings, a SIGTERM as a worker starts, validation's rectangular batches."""

import gc
import itertools
import os
import signal
import time

import cv2
import numpy as np
import pytest
import torch
from data_helpers import rect_dataset, write_image, write_labels

from utils.boxes import scale_boxes_to_original
from utils.data import labels as L
from utils.data import loader as D
from utils.data.images import read_image
from utils.hyperparameters import DEFAULTS

pytestmark = pytest.mark.usefixtures("user_cache_dir")  # the label caches in the test's own folder (data_helpers.py)


# ---------------------------------------------------------------------------------------------
# 5. Determinism: sample order, DDP slices, workers, mid-epoch resume
# ---------------------------------------------------------------------------------------------


def take(sampler, count):
    return list(itertools.islice(iter(sampler), count))


def test_sample_order_is_a_function_of_seed_and_epoch_and_ranks_split_it():
    one = D.EpochBatchSampler(10, 3, seed=5)
    assert len(one) == 4
    batches = take(one, 8)
    assert batches == take(D.EpochBatchSampler(10, 3, seed=5), 8)
    epoch0 = [i for b in batches[:4] for e, i in b if e == 0]
    epoch1 = [i for b in batches[4:] for e, i in b if e == 1]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10)) and epoch0 != epoch1  # each epoch a new permutation
    assert take(D.EpochBatchSampler(10, 3, seed=6), 4) != batches[:4]

    for n, world in ((12, 3), (10, 4), (7, 2), (2, 5)):  # (2, 5): fewer images than ranks
        slices = [
            [i for b in D.EpochBatchSampler(n, 2, seed=1, rank=r, world_size=world).batches(0) for _, i in b]
            for r in range(world)
        ]
        assert len({len(s) for s in slices}) == 1  # the same count on every rank: no rank waits at the end
        flat = [i for s in slices for i in s]
        assert set(flat) == set(range(n))  # covering
        assert len(flat) == -(-n // world) * world  # disjoint except the few repeats that even out the ranks
        if n % world == 0:
            assert len(set(flat)) == len(flat)
        assert [len(D.EpochBatchSampler(n, 2, seed=1, rank=r, world_size=world)) for r in range(world)] == [
            -(-(-(-n // world)) // 2)
        ] * world


def loader_batches(dataset, sampler, workers, count):
    loader = D.make_loader(dataset, sampler, workers=workers)
    out = list(itertools.islice(iter(loader), count))
    del loader
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (ia, ta), (ib, tb) in zip(a, b):
        assert torch.equal(ia, ib) and torch.equal(ta, tb)


def test_same_batches_with_0_1_and_2_workers_and_after_a_mid_epoch_restart(tmp_path):
    folder = rect_dataset(tmp_path, n=6, w=80, h=64)
    records = L.load_verified([folder], nc=4, split_name="train")
    dataset = D.TrainDataset(records, 64, dict(DEFAULTS, mixup=0.5), seed=7)
    # 6 images, batch 2: 3 batches per epoch; 5 batches cross into the second epoch
    reference = loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7), 0, 5)
    for workers in (1, 2):
        assert_same_batches(loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7), workers, 5), reference)
    # Restart after k batches: exactly the batches the uninterrupted run sees from batch k on.
    for k in (1, 2):
        resumed = loader_batches(dataset, D.EpochBatchSampler(6, 2, seed=7, skip_batches=k), 2 if k == 2 else 0, 5 - k)
        assert_same_batches(resumed, reference[k:])
    # Resuming at the start of epoch 1 is the same as skipping all of epoch 0.
    assert take(D.EpochBatchSampler(6, 2, seed=7, start_epoch=1), 3) == take(
        D.EpochBatchSampler(6, 2, seed=7, skip_batches=3), 3
    )
    # A fresh dataset object (a restarted process) produces the same samples.
    again = D.TrainDataset(records, 64, dict(DEFAULTS, mixup=0.5), seed=7)
    assert torch.equal(again[1, 4][0], dataset[1, 4][0])


# ---------------------------------------------------------------------------------------------
# 6. Loader hygiene
# ---------------------------------------------------------------------------------------------


class WorkerSettings(torch.utils.data.Dataset):
    """Reports, from inside the DataLoader worker, the settings pitfalls D6-D8 are about
    (file descriptors, cv2 threads, persistent workers)."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        info = [cv2.getNumThreads(), int(cv2.ocl.useOpenCL()), int(soft == hard), os.getpid(), torch.get_num_threads()]
        return torch.tensor(info), torch.zeros(0, 5)


def test_workers_have_cv2_threads_off_opencl_off_file_limit_raised_and_persist():
    cv2.setNumThreads(3)  # as if the main process had not called the fix: the worker must apply it itself
    try:
        # train.py: True on CUDA
        assert D.make_loader(WorkerSettings(), batch_size=2, workers=0, pin_memory=True).pin_memory
        loader = D.make_loader(WorkerSettings(), batch_size=2, workers=2)
        assert loader.persistent_workers
        pids = set()
        for _ in range(2):  # two epochs: the same worker processes (not re-created with re-imported code)
            for info, _ in loader:
                threads, opencl, raised, pid, torch_threads = info[0].tolist()
                # cv2.setNumThreads(0) = run sequentially; OpenCV 5 (pthreads) then reports 1, OpenCV 4 reports 0
                assert threads <= 1 and (opencl, raised, torch_threads) == (0, 1, 1) and pid != os.getpid()
                pids.add(pid)
        assert len(pids) == 2
        del loader
    finally:
        cv2.setNumThreads(-1)
    D.fix_cv2_and_file_limits()  # and in the main process
    assert cv2.getNumThreads() <= 1 and not cv2.ocl.useOpenCL()


def _slow_worker_start(report):
    """A loader worker whose start is slow (as under load): a SIGTERM reaches it before _worker_init runs."""
    report.put("started")
    time.sleep(1.0)
    D._worker_init(D._main_exiting(), 0)
    report.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_a_sigterm_while_a_worker_starts_waits_for_its_handler_and_does_not_kill_it():
    """SLURM pre-emption as the validation loader's workers start (the first epoch's end): the worker must live
    on so that the step can finish and last.pt be saved (the SIGTERM test of test_train_resume.py crashed on this)."""
    context = D._worker_context()  # the context make_loader gives the DataLoader
    report = context.Queue()
    worker = context.Process(target=_slow_worker_start, args=(report,))
    worker.start()
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the main process: unblocked again
    assert report.get(timeout=60) == "started"
    os.kill(worker.pid, signal.SIGTERM)  # before the worker's handler is set
    mask = report.get(timeout=60)
    worker.join(timeout=60)
    assert worker.exitcode == 0 and signal.SIGTERM not in mask and signal.SIGINT not in mask


class _Garbage:
    """In a reference cycle: only the cyclic collector frees it, and its destructor says in which process."""

    def __init__(self, log):
        self.log, self.cycle = log, self

    def __del__(self):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


class _Collecting(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        gc.collect()
        return index


def test_a_worker_leaves_the_parents_garbage_to_the_parent(tmp_path):
    """A forked worker's collector must not run the destructors of garbage it inherited: some are not safe after a
    fork (an ONNX Runtime session's waited forever for the parent's threads, and the test suite hung)."""
    log = tmp_path / "freed.txt"
    gc.disable()  # so that the garbage is still there when the worker starts
    try:
        _Garbage(log)
        loader = torch.utils.data.DataLoader(_Collecting(), num_workers=1, multiprocessing_context=D._worker_context())
        assert [int(x) for x in loader] == [0, 1]
    finally:
        gc.enable()
    gc.collect()
    assert log.read_text().split() == [str(os.getpid())]  # freed once, by the parent


# ---------------------------------------------------------------------------------------------
# 7. Validation loading
# ---------------------------------------------------------------------------------------------


def test_validation_rectangular_batches_map_back_to_original_pixels(tmp_path):
    folder = tmp_path / "images" / "val"
    # (w, h). 200 x 60 at 64 px: the short side is rounded to 19 px (not 19.2); a ratio taken from
    # it would put the right box 2 px off in the original image.
    sizes = [(100, 60), (60, 100), (80, 80), (200, 60), (96, 50), (50, 96), (120, 90)]
    truth = {}
    for k, (w, h) in enumerate(sizes):
        rects = [(3, 2, w // 2, h // 3, 0), (w // 2, h // 2, w - 12, h - 2, 1)]
        p = write_image(folder / f"v{k}.png", w, h, rects)
        write_labels(p, w, h, rects)
        truth[str(p)] = np.array([r[:4] for r in rects], float)
    records = L.load_verified([folder], nc=4, split_name="val")
    for imgsz in (64, 128):
        val = D.ValDataset(records, imgsz, batch_size=2)
        assert sorted(r["im"] for r in val.records) == sorted(truth)
        loader = D.make_loader(val, batch_size=2, workers=0)
        shapes, aspects = [], []
        for images, targets, metas in loader:
            h, w = images.shape[2:]
            assert h % 32 == 0 and w % 32 == 0 and max(h, w) <= imgsz + 32
            shapes.append((h, w))
            aspects += [m["shape"][0] / m["shape"][1] for m in metas]
            for j, meta in enumerate(metas):
                assert tuple(meta["shape"]) == tuple(read_image(meta["path"]).shape[:2])  # the original size is kept
                boxes = targets[targets[:, 0] == j][:, 2:]
                back = scale_boxes_to_original(boxes, meta["ratio"], meta["pad"], meta["shape"])
                assert np.abs(back.numpy() - truth[meta["path"]]).max() <= 1.0, meta["path"]
        assert aspects == sorted(aspects)  # similar shapes together: batches follow the aspect ratio
        assert any(h != w for h, w in shapes)  # rectangles, not all squares
        assert shapes[0][0] < shapes[0][1] and shapes[-1][0] > shapes[-1][1]  # wide first, tall last
    # no augmentation: the same sample every time
    image_a, labels_a, _ = val[3]
    image_b, labels_b, _ = val[3]
    assert torch.equal(image_a, image_b) and torch.equal(labels_a, labels_b)
