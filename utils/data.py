"""Data: the training and validation datasets, the deterministic sampler that makes exact resume
possible, and the loader with its workers' settings and signals.

The records come from utils/labels.py (verified once, cached), the images from utils/images.py (read as
RGB uint8, or from the RAM cache the caller built and passed in).
"""

import atexit
import functools
import multiprocessing
import os
import random
import resource
import signal
import sys

import cv2
import numpy as np
import torch

from utils.augment import augment_hsv, flip_lr, flip_ud, letterbox, mosaic4, random_affine
from utils.images import load_resized
from utils.records import as_records

# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


def sample_rng(seed, epoch, index):
    """The generator for every random choice of one sample: a pure function of (seed, epoch, index),
    so the data does not depend on the worker count, the worker's RNG, or restarts."""
    return np.random.default_rng([seed, epoch, index])


class TrainDataset(torch.utils.data.Dataset):
    """Training samples with mosaic, affine, HSV, flips (and mixup). Indexed by (epoch, index)."""

    def __init__(self, records, imgsz, hyp, seed=0, mosaic_epochs=None, cache=None):
        """cache: utils.images.cache_images(records, imgsz, ...), one image (or None) per record; None: from disk."""
        self.records, self.imgsz, self.hyp, self.seed = records, imgsz, hyp, seed
        self.mosaic_epochs = mosaic_epochs  # mosaic is used while epoch < mosaic_epochs (None: always)
        self.cache = cache
        self.warned = set()

    def __len__(self):
        return len(self.records)

    def load(self, index, rng):
        """Load one image; a file that broke or disappeared during training is reported and replaced."""
        for _ in range(len(self.records)):
            try:
                return load_resized(self.records[index], self.imgsz, self.cache, index)
            except OSError as e:
                if index not in self.warned:
                    self.warned.add(index)
                    print(f"WARNING: {e}; replaced by another image", file=sys.stderr)
                index = int(rng.integers(len(self.records)))
        raise OSError("no image of the training set can be read any more")

    def __getitem__(self, key):
        epoch, index = key
        rng = sample_rng(self.seed, epoch, index)
        hyp, s = self.hyp, self.imgsz
        use_mosaic = rng.random() < hyp["mosaic"] and (self.mosaic_epochs is None or epoch < self.mosaic_epochs)
        if use_mosaic:
            img, labels = self.load_mosaic(index, rng)
            if hyp["mixup"] and rng.random() < hyp["mixup"]:
                img2, labels2 = self.load_mosaic(int(rng.integers(len(self))), rng)
                lam = rng.beta(32.0, 32.0)
                img = (img * lam + img2 * (1 - lam)).astype(np.uint8)
                labels = np.concatenate((labels, labels2), 0)
        else:
            img, labels = self.load(index, rng)
            img, ratio, (left, top) = letterbox(img, (s, s))
            labels[:, 1:] = labels[:, 1:] * ratio + (left, top, left, top)
            img, labels = random_affine(img, labels, rng, hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"])
        augment_hsv(img, rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])
        if rng.random() < hyp["fliplr"]:
            img, labels = flip_lr(img, labels)
        if rng.random() < hyp["flipud"]:
            img, labels = flip_ud(img, labels)
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))  # uint8 RGB, CHW
        return image, torch.from_numpy(labels.astype(np.float32)).reshape(-1, 5)

    def load_mosaic(self, index, rng):
        indices = [index] + [int(i) for i in rng.integers(0, len(self), 3)]
        loaded = [self.load(i, rng) for i in indices]
        hyp = self.hyp
        images, labels = [im for im, _ in loaded], [lb for _, lb in loaded]
        canvas, labels = mosaic4(images, labels, self.imgsz, rng, hyp["mosaic_min_area"])
        border = (-self.imgsz // 2, -self.imgsz // 2)
        return random_affine(canvas, labels, rng, hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"], border)


class ValDataset(torch.utils.data.Dataset):
    """Letterboxed, unaugmented samples in rectangular batches: images are sorted by aspect ratio and
    each batch is padded only to its own shape (a multiple of the stride), which is faster and more
    accurate than squares. Keeps what is needed to map predictions back to original pixels."""

    def __init__(self, records, imgsz, batch_size, stride=32, pad=0.5, cache=None, shape=None):
        """cache: as TrainDataset's, in the order of `records` as given (they are sorted here). shape: (h, w) for
        every image instead of rectangular batches (an exported file without --dynamic takes only its own size);
        then imgsz is its longer side."""
        records = as_records(records)
        order = np.argsort(records.shapes[:, 0] / records.shapes[:, 1], kind="stable")  # similar shapes together
        self.records = records.take(order)
        self.imgsz = imgsz
        self.cache = None if cache is None else [cache[i] for i in order]
        aspect = self.records.shapes[:, 0] / self.records.shapes[:, 1]  # h / w
        self.shapes = []
        for start in range(0, len(self.records), batch_size):
            a = aspect[start : start + batch_size]
            hw = (a.max(), 1.0) if a.max() < 1 else (1.0, 1 / a.min()) if a.min() > 1 else (1.0, 1.0)
            rect = tuple(int(np.ceil(v * imgsz / stride + pad) * stride) for v in hw)
            self.shapes += [tuple(shape or rect)] * len(a)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        record = self.records[index]
        img, labels = load_resized(record, self.imgsz, self.cache, index)
        h0, w0 = record["shape"]
        # The long side was resized to exactly imgsz, the short one rounded to whole pixels:
        # scale_boxes_to_original recovers each side's exact factor from this nominal one.
        resize = max(img.shape[:2]) / max(h0, w0)
        img, ratio, (left, top) = letterbox(img, self.shapes[index], scaleup=False)
        labels[:, 1:] = labels[:, 1:] * ratio + (left, top, left, top)
        image = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        # total scale original -> network input, and the padding: what scale_boxes_to_original needs
        meta = {"index": index, "path": record["im"], "shape": (h0, w0), "ratio": resize * ratio, "pad": (left, top)}
        return image, torch.from_numpy(labels).reshape(-1, 5), meta


def collate(batch):
    """Stack images; targets become one (N, 6) tensor of (image index in batch, class, x1, y1, x2, y2)."""
    images = torch.stack([b[0] for b in batch])
    targets = [torch.cat((torch.full((len(b[1]), 1), i, dtype=torch.float32), b[1]), 1) for i, b in enumerate(batch)]
    out = (images, torch.cat(targets, 0))
    return out + ([b[2] for b in batch],) if len(batch[0]) > 2 else out


# ---------------------------------------------------------------------------------------------
# Sampling and loaders
# ---------------------------------------------------------------------------------------------


def epoch_order(n, seed, epoch):
    """The sample order of an epoch: a pure function of (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def multi_scale_size(imgsz, seed, iteration, stride=32):
    """--multi-scale: the training size of an iteration, 0.5x to 1.5x imgsz, always a multiple of the
    stride (the levels of the network must halve evenly). A pure function of (seed, iteration), so
    every DDP rank draws the same size without talking (pitfall M4: else a rank with a small size
    waits for one with a large size) and a resumed run draws the same."""
    rng = random.Random(seed * 1_000_003 + iteration)
    return max(rng.randrange(imgsz // 2, imgsz * 3 // 2 + stride) // stride * stride, stride)


def multi_scale_max(imgsz, stride=32):
    """The largest size multi_scale_size draws for imgsz (what --batch -1 must measure at)."""
    return (imgsz * 3 // 2 + stride - 1) // stride * stride


class EpochBatchSampler:
    """Yields batches of (epoch, index) forever, epoch after epoch, from (start_epoch, skip_batches).

    Never ending on purpose (pitfall D8): the DataLoader's workers are created once and live
    for the whole run, instead of being re-created each epoch with code the user has edited since.
    Each DDP rank takes a fixed slice of the epoch's order; all ranks get the same batch count."""

    def __init__(self, n, batch_size, seed=0, rank=0, world_size=1, start_epoch=0, skip_batches=0):
        if n < 1 or batch_size < 1:
            raise ValueError(
                f"EpochBatchSampler needs at least one sample and a batch size of at least 1, got {n} and {batch_size}"
            )
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.start_epoch, self.skip_batches = start_epoch, skip_batches
        self.per_rank = -(-n // world_size)
        self.batches_per_epoch = -(-self.per_rank // batch_size)

    def __len__(self):
        return self.batches_per_epoch

    def batches(self, epoch):
        order = epoch_order(self.n, self.seed, epoch)
        total = self.per_rank * self.world_size
        order = (order * -(-total // self.n))[:total]  # pad (wrapping) so every rank gets as many: no rank waits
        mine = order[self.rank :: self.world_size]
        return [[(epoch, i) for i in mine[k : k + self.batch_size]] for k in range(0, len(mine), self.batch_size)]

    def __iter__(self):
        epoch, skip = self.start_epoch, self.skip_batches
        while True:
            yield from self.batches(epoch)[skip:]  # resuming mid-epoch: skip what was already trained on
            epoch, skip = epoch + 1, 0


def fix_cv2_and_file_limits():
    """Call in the main process and in every DataLoader worker."""
    cv2.setNumThreads(0)  # pitfall D7: cv2's own threads inside forked workers deadlock or crawl
    cv2.ocl.setUseOpenCL(False)  # pitfall D7: OpenCL next to CUDA slows things down
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # pitfall D6: many workers exhaust file descriptors
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit some systems refuse as a soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


def _worker_init(main_exiting, _):
    fix_cv2_and_file_limits()  # every worker is a new process: apply the fixes there too
    # SIGTERM to the whole process group (SLURM pre-emption, kill -- -PGID) and Ctrl+C reach the workers
    # too: they must live on, so that the main process can finish its step and save last.pt. Once the
    # main process is exiting, SIGTERM ends them again (multiprocessing terminates its children then, and
    # waits for them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0) if main_exiting.is_set() else None)
    torch.set_num_threads(1)  # a worker needs no intra-op threads; they would fight the main process


@functools.cache
def _main_exiting():
    """One event per process, shared by all its loaders' workers, set when the process exits."""
    event = multiprocessing.Event()
    atexit.register(event.set)  # runs before multiprocessing's exit hook (registered earlier, by `import torch`)
    return event


def make_loader(dataset, batch_sampler=None, batch_size=None, workers=2, pin_memory=False):
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        batch_size=batch_size if batch_sampler is None else 1,
        shuffle=False,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        worker_init_fn=functools.partial(_worker_init, _main_exiting()),
        persistent_workers=workers > 0,  # pitfall D8: workers re-created each epoch would re-import code edited since
        prefetch_factor=4 if workers > 0 else None,
    )
