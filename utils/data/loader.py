"""Data: the training and validation datasets, the deterministic sampler that makes exact resume
possible, and the loader with its workers' settings and signals.

The records come from utils/data/labels.py (verified once, cached), the images from utils/data/images.py (read as
RGB uint8, or from the RAM cache the caller built and passed in).
"""

import atexit
import functools
import gc
import math
import multiprocessing
import os
import random
import resource
import signal
import sys

import cv2
import numpy as np
import torch

from utils.data.augment import (
    PAD_VALUE,
    augment_hsv,
    draw_tiles,
    drawn_boxes,
    flip,
    letterbox,
    mosaic_offsets,
    random_affine_matrix,
    tile_boxes,
    transform_boxes,
    warp,
)
from utils.data.images import labels_in_pixels, load_original, load_resized, resized_shapes
from utils.data.records import as_records

# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


def sample_rng(seed, epoch, index):
    """The generator for every random choice of one sample: a pure function of (seed, epoch, index),
    so the data does not depend on the worker count, the worker's RNG, or restarts."""
    return np.random.default_rng([seed, epoch, index])


class TrainDataset(torch.utils.data.Dataset):
    """Training samples with mosaic, affine, HSV, flips (and mixup). Indexed by (epoch, index).

    The DataLoader asks for a whole batch at once (__getitems__): each image of the batch is decoded once, and
    a mosaic takes its three other images from the same batch (a batch of one draws them from the whole set).
    Ultralytics draws them from a buffer of the images its worker decoded last, which depends on the worker
    count and on the past; a batch is a pure function of (seed, epoch, batch index), so a sample stays one of
    (seed, epoch, index, its batch), whatever the workers, and exact resume holds."""

    def __init__(self, records, imgsz, hyp, seed=0, mosaic_epochs=None, cache=None):
        """cache: utils.data.images.cache_images(records, imgsz, ...), one image (or None) per record; None: disk."""
        self.records, self.imgsz, self.hyp, self.seed = records, imgsz, hyp, seed
        self.mosaic_epochs = mosaic_epochs  # mosaic is used while epoch < mosaic_epochs (None: always)
        self.cache = cache
        self.warned = set()

    def __len__(self):
        return len(self.records)

    def load(self, index, epoch):
        """One image as decoded (its resize to the training size is folded into the resize that places it), its
        (h, w) at the training size, and its boxes in pixels of that size. A file that broke or disappeared
        during training is reported and replaced by another, drawn from a generator of its own."""
        rng = None
        for _ in range(len(self.records)):
            try:
                record = self.records[index]
                # an image 2, 4 or 8 times the training size is decoded at 1/2, 1/4 or 1/8 of it
                reduce = max((f for f in (8, 4, 2) if max(record["shape"]) >= f * self.imgsz), default=1)
                img = load_original(record, self.cache, index, reduce)
                shape = tuple(int(v) for v in resized_shapes(img.shape[:2], self.imgsz)[0])
                return img, shape, labels_in_pixels(record, *shape)
            except OSError as e:
                if index not in self.warned:
                    self.warned.add(index)
                    print(f"WARNING: {e}; replaced by another image", file=sys.stderr)
                rng = rng or np.random.default_rng([self.seed, epoch, index, 1])  # made only when needed: it costs
                index = int(rng.integers(len(self.records)))
        raise OSError("no image of the training set can be read any more")

    def __getitems__(self, keys):
        """The samples of one batch of (epoch, index) keys, each image decoded once. Each sample is written straight
        into its slice of the batch tensor (shared memory in a loader worker), which collate then takes as it is."""
        loaded = {}

        def get(index, epoch):
            if index not in loaded:
                loaded[index] = self.load(index, epoch)
            return loaded[index]

        batch = [index for _, index in keys]
        images = batch_buffer((len(keys), self.imgsz, self.imgsz, 3))
        samples = Samples(self.sample(epoch, index, batch, get, out) for (epoch, index), out in zip(keys, images))
        samples.images = images.permute(0, 3, 1, 2)  # HWC memory seen as NCHW: channels_last, the model's layout
        return samples

    def __getitem__(self, key):
        return self.__getitems__([key])[0]

    def partners(self, index, batch, rng, k=3):
        """k images to go with `index` (a mosaic's other three, or mixup's second mosaic): drawn from the others of
        its batch, or from the whole set when the batch has fewer than k others (a batch of one)."""
        others = sorted(i for i in batch if i != index)  # sorted: the batch's order does not matter
        if len(others) < k:
            others += [int(i) for i in rng.integers(0, len(self), k - len(others))]
        return [others[i] for i in rng.integers(0, len(others), k)]

    def sample(self, epoch, index, batch, get, out):
        """One sample, its image written into `out` (uint8 HWC tensor); returns the image seen as CHW and the boxes."""
        rng = sample_rng(self.seed, epoch, index)
        hyp = self.hyp
        use_mosaic = rng.random() < hyp["mosaic"] and (self.mosaic_epochs is None or epoch < self.mosaic_epochs)
        flips = rng.random() < hyp["fliplr"], rng.random() < hyp["flipud"]  # left-right, up-down
        if use_mosaic:
            img, labels = self.place([get(i, epoch) for i in [index, *self.partners(index, batch, rng)]], rng, flips)
            if hyp["mixup"] and rng.random() < hyp["mixup"]:
                img = img.copy()  # the next place() draws into the same scratch buffers
                other = self.partners(index, batch, rng, 1)[0]
                second = [get(i, epoch) for i in [other, *self.partners(other, batch, rng)]]
                img2, labels2 = self.place(second, rng, flips)
                lam = rng.beta(32.0, 32.0)
                img = (img * lam + img2 * (1 - lam)).astype(np.uint8)
                labels = np.concatenate((labels, labels2), 0)
        else:
            img, labels = self.place([get(index, epoch)], rng, flips)
        augment_hsv(img, rng, hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"], dst=out.numpy())
        return out.permute(2, 0, 1), torch.from_numpy(labels.astype(np.float32)).reshape(-1, 5)

    def scratch(self, name, shape):
        """A buffer this process reuses from sample to sample (fresh arrays of a few MB cost page faults each time)."""
        buffers = self.__dict__.setdefault("buffers", {})
        if name not in buffers or buffers[name].shape != shape:
            buffers[name] = np.empty(shape, np.uint8)
        return buffers[name]

    def place(self, loaded, rng, flips):
        """Four loaded images as a mosaic (one: letterboxed), then the random affine and the flips, each image drawn
        once from its decoded pixels into the output. Returns the image and its boxes."""
        hyp, s = self.hyp, self.imgsz
        images, shapes, labels = zip(*loaded)
        if len(loaded) == 4:
            canvas, offsets = 2 * s, mosaic_offsets(shapes, s, rng)
        else:
            canvas, offsets = s, [((s - shapes[0][1]) // 2, (s - shapes[0][0]) // 2)]  # letterbox, centred
        labels = tile_boxes(labels, offsets, canvas, hyp["mosaic_min_area"] if len(loaded) == 4 else 0)
        m, scale = random_affine_matrix(
            rng, (canvas, canvas), (s, s), hyp["degrees"], hyp["translate"], hyp["scale"], hyp["shear"]
        )
        tiles = [(im, (w / im.shape[1], h / im.shape[0]), xy) for im, (h, w), xy in zip(images, shapes, offsets)]
        if m[0, 1] == 0 and m[1, 0] == 0 and m[0, 0] > 0 and m[1, 1] > 0:  # scale and shift: each image into the output
            out = self.scratch("tiles", (s, s, 3))
            out.fill(PAD_VALUE)
            boxes = drawn_boxes(labels, draw_tiles(out, tiles, canvas, m))
        else:  # rotation or shear: a rectangle would not tile the output, so the images go on the canvas first
            pasted = self.scratch("canvas", (canvas, canvas, 3))
            pasted.fill(PAD_VALUE)
            boxes = drawn_boxes(labels, draw_tiles(pasted, tiles, canvas, np.eye(3)))
            out, boxes = (
                warp(pasted, m, (s, s), self.scratch("tiles", (s, s, 3))),
                transform_boxes(boxes, m, (s, s), scale),
            )
        return flip(out, boxes, *flips, dst=self.scratch("flipped", (s, s, 3)))


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
    """Stack images; targets become one (N, 6) tensor of (image index in batch, class, x1, y1, x2, y2).

    Training images come already in one channels_last batch tensor (TrainDataset.__getitems__), validation ones
    are stacked here; in a loader worker either is in shared memory, so it reaches the main process uncopied."""
    if isinstance(batch, Samples):  # TrainDataset wrote them into one batch tensor already
        images = batch.images
    else:
        images = stack([b[0] for b in batch])
    targets = [torch.cat((torch.full((len(b[1]), 1), i, dtype=torch.float32), b[1]), 1) for i, b in enumerate(batch)]
    out = (images, torch.cat(targets, 0))
    return out + ([b[2] for b in batch],) if len(batch[0]) > 2 else out


def stack(images):
    """One batch tensor of these images, in the memory layout they come in (HWC seen as CHW: channels_last)."""
    first = images[0]
    channels_last = first.dim() == 3 and first.stride(0) == 1 and not first.is_contiguous()  # HWC seen as CHW
    shape = (len(images), *first.shape[1:], first.shape[0]) if channels_last else (len(images), *first.shape)
    out = batch_buffer(shape, first.dtype)
    if channels_last:
        return torch.stack([im.permute(1, 2, 0) for im in images], out=out).permute(0, 3, 1, 2)
    return torch.stack(images, out=out)


def batch_buffer(shape, dtype=torch.uint8):
    """An empty tensor for a batch: inside a loader worker, in shared memory, as torch's default_collate allocates
    it, so that the batch reaches the main process without another copy."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


class Samples(list):
    """TrainDataset's samples of one batch; their images are the slices of one batch tensor, `images`."""

    images = None


# ---------------------------------------------------------------------------------------------
# Sampling and loaders
# ---------------------------------------------------------------------------------------------


def epoch_order(n, seed, epoch):
    """The sample order of an epoch: a pure function of (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def multi_scale_size(imgsz, seed, iteration, stride=32):
    """--multi-scale: the training size of an iteration, from half to three halves of imgsz, a multiple of the
    stride (the levels of the network must halve evenly). A pure function of (seed, iteration), so
    every DDP rank draws the same size without talking (pitfall M4: else a rank with a small size
    waits for one with a large size) and a resumed run draws the same."""
    rng = random.Random(seed * 1_000_003 + iteration)
    return max(rng.randrange(imgsz // 2, imgsz * 3 // 2 + stride) // stride * stride, stride)


def batch_to_device(images, targets, device, size=None):
    """pitfall D3: a training batch of uint8 RGB -> float 0..1, channels last, on the device. The targets stay on
    the host: the loss pads them there and copies them over without a sync (a blocking targets.to(device) waits
    for the GPU). size (--multi-scale, multi_scale_size): the batch resized to size x size, its boxes with it."""
    # the training batch comes channels_last (HWC samples): .float() keeps the layout, .contiguous() copies nothing
    images = images.to(device, non_blocking=True).float().div_(255).contiguous(memory_format=torch.channels_last)
    if size and size != images.shape[-1]:
        # a new tensor: crash/ keeps the original
        targets = torch.cat((targets[:, :2], targets[:, 2:] * (size / images.shape[-1])), 1)
        images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    return images, targets


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


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _worker_init(main_exiting, _):
    fix_cv2_and_file_limits()  # every worker is a new process: apply the fixes there too
    # SIGTERM to the whole process group (SLURM pre-emption, kill -- -PGID) and Ctrl+C reach the workers
    # too: they must live on, so that the main process can finish its step and save last.pt. Once the
    # main process is exiting, SIGTERM ends them again (multiprocessing terminates its children then, and
    # waits for them).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0) if main_exiting.is_set() else None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since the fork: see _worker_context
    torch.set_num_threads(1)  # a worker needs no intra-op threads; they would fight the main process


@functools.cache
def _worker_context():
    """The default start method's multiprocessing context, whose processes start with SIGTERM and SIGINT blocked
    (they inherit the mask): a signal to the process group while a worker starts waits until _worker_init has
    set the worker's handlers. Without it, a SIGTERM in that window (torch sets its own SIGTERM handler in the
    worker first, which ends it) killed the worker, and the run crashed instead of saving last.pt: the
    validation loader's workers start at the first epoch's end, a likely moment for a pre-emption to land."""
    concrete = multiprocessing.get_context().get_context()  # fork, spawn or forkserver: the default

    class Process(concrete.Process):
        def start(self):
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            # Frozen, the parent's objects are out of the forked worker's garbage collection: a collection there
            # would run the destructors of the parent's garbage, and some are not safe after a fork (an ONNX
            # Runtime session's waits forever for the parent's threads: an export check's val.py hung so).
            gc.freeze()
            try:
                super().start()
            finally:
                gc.unfreeze()
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    return type(type(concrete).__name__, (type(concrete),), {"Process": Process})()


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
        multiprocessing_context=_worker_context() if workers > 0 else None,
        persistent_workers=workers > 0,  # pitfall D8: workers re-created each epoch would re-import code edited since
        prefetch_factor=4 if workers > 0 else None,
        # Each iter() draws the workers' base seed from this generator, not from torch's global one: a resumed run
        # makes its iterator at another point of the global stream, and its last.pt would then save other RNG
        # states than an uninterrupted run's (the data's own randomness is per sample, utils/data/augment.py).
        generator=torch.Generator().manual_seed(0),
    )
