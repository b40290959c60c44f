"""Images: reading one (RGB), resizing it for training, and --cache ram, the decoded and resized images
of a split held in memory (one copy per machine under DDP).

Images are read with cv2 (BGR) and converted to RGB once, in `read_image`; everything after
works on uint8 RGB; the training loop divides by 255 on the device (pitfalls D1-D4: channel order
and value range mixed up between libraries).
"""

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import torch
from tqdm import tqdm

from utils.records import as_records

log = logging.getLogger("yolo")


def read_image(path):
    """Read an image as RGB uint8, EXIF orientation applied (cv2.imread does), or None."""
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        return None
    # pitfalls D1-D2: cv2 reads BGR, the model and the HSV code expect RGB: convert once, here
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def load_resized(record, imgsz, cache=None, index=None):
    """RGB uint8 image resized so its long side is imgsz, and its labels in pixels of that size."""
    img = cache[index] if cache is not None and cache[index] is not None else None
    if img is None:
        img = read_image(record["im"])
        if img is None:
            raise OSError(f"image {record['im']} can no longer be read")
        h, w = img.shape[:2]
        r = imgsz / max(h, w)
        if r != 1:  # resized_shapes: the one rounding rule, also behind the RAM cache's buffer
            nh, nw = resized_shapes((h, w), imgsz)[0]
            img = cv2.resize(img, (int(nw), int(nh)), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    h, w = img.shape[:2]
    labels = np.array(record["labels"], dtype=np.float32).reshape(-1, 5)
    labels[:, [1, 3]] *= w
    labels[:, [2, 4]] *= h
    return img, labels


def available_memory():
    """Bytes of RAM the kernel can give without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def resized_shapes(shapes, imgsz):
    """(h, w) of each image after load_resized, from the (h, w) as read: the long side becomes imgsz, the
    short one is rounded, and never below 1 px (utils/boxes.resized_side's rule, for many shapes at once)."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
    r = imgsz / shapes.max(1, keepdims=True)
    return np.maximum(1, np.round(shapes * r)).astype(np.int64)  # round half to even, as Python's round()


def cache_images(records, imgsz, workers=8, shared=False):
    """--cache ram: decode and resize every image once, into one buffer, before the workers fork (they
    share its pages). First the memory it needs is estimated from the image sizes and compared with what is
    free: if it does not fit, one warning and None (images are then read from disk), instead of the kernel
    killing the run hours later. shared=True (the training set under DDP): the processes of one machine
    share one copy, a file in /dev/shm that local rank 0 fills and every process maps; it is unlinked as
    soon as all have mapped it, so nothing is left behind, even after a kill -9."""
    records = as_records(records)
    shapes = resized_shapes(records.shapes, imgsz)
    sizes = shapes[:, 0] * shapes[:, 1] * 3
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    shared = shared and local_size > 1 and torch.distributed.is_initialized() and os.path.isdir("/dev/shm")
    copies = 1 if shared else local_size  # without sharing, each process of this machine holds its own
    free = available_memory()
    fits = free is None or offsets[-1] * copies <= 0.8 * free  # the rest is for the model, workers, the OS
    if shared:  # every process must take the same way through the barriers below: rank 0's verdict
        verdict = [fits]
        torch.distributed.broadcast_object_list(verdict, src=0)
        fits = verdict[0]
    if not fits:
        log.warning(
            f"--cache ram: {len(records)} images at {imgsz} px need {offsets[-1] * copies / 1e9:.1f} GB "
            f"({copies} {'copy' if copies == 1 else 'copies'}) but {(free or 0) / 1e9:.1f} GB of RAM are free; "
            "training without the RAM cache (images are read from disk each time)"
        )
        return None
    # One buffer: every image, then one byte per image (1: cached; 0: unreadable, read again when drawn).
    size, local_rank = int(offsets[-1]) + len(records), int(os.environ.get("LOCAL_RANK", 0))
    fills = not shared or local_rank == 0
    if shared:
        key = hashlib.sha256(records.path_bytes.tobytes() + f"{imgsz}|{os.environ.get('MASTER_PORT')}".encode())
        path = f"/dev/shm/yolo-cache-{key.hexdigest()[:16]}"
        buffer = np.memmap(path, np.uint8, "w+", shape=(size,)) if fills else None
    else:
        buffer = np.empty(size, np.uint8)

    def fill(i):
        try:
            image = buffer[offsets[i] : offsets[i + 1]].reshape(shapes[i][0], shapes[i][1], 3)
            image[...] = load_resized(records[i], imgsz)[0]
            buffer[offsets[-1] + i] = 1
        except (OSError, ValueError):  # unreadable now, or another size than at verification
            buffer[offsets[-1] + i] = 0

    if fills:
        with ThreadPoolExecutor(workers) as pool:
            list(tqdm(pool.map(fill, range(len(records))), total=len(records), desc="caching images", leave=False))
    if shared:
        if fills:
            buffer.flush()
        torch.distributed.barrier()  # filled
        if not fills:
            buffer = np.memmap(path, np.uint8, "r", shape=(size,))
        torch.distributed.barrier()  # mapped everywhere: the name can go, the memory stays while mapped
        if fills:
            os.unlink(path)
    cached = buffer[offsets[-1] :]
    images = [
        buffer[offsets[i] : offsets[i + 1]].reshape(h, w, 3) if cached[i] else None for i, (h, w) in enumerate(shapes)
    ]
    where = f", one copy shared by the {local_size} processes of this machine" if shared else ""
    log.info(f"cached {len(records)} images in RAM ({offsets[-1] / 1e9:.2f} GB{where})")
    return images
