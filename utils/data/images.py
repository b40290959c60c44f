"""Images: reading one (RGB), resizing it for training, --cache ram, the decoded and resized images
of a split held in memory (one copy per machine under DDP), and whether a file is an image training can use
(usable_shape, from its header: verification, utils/data/labels.py).

Images are read as RGB once, in `read_image` (the decoder writes RGB; older OpenCV: BGR, converted); everything after
works on uint8 RGB; the training loop divides by 255 on the device (pitfalls D1-D4: channel order
and value range mixed up between libraries).

Nothing here reads the environment or calls torch.distributed: cache_images is told about the other
processes of its machine (utils.distributed.node_share), so a dataset can be built on any rank alone.
"""

import hashlib
import logging
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from PIL import Image
from tqdm import tqdm

from utils.data.records import as_records

log = logging.getLogger("yolo")


RGB_FLAG = getattr(cv2, "IMREAD_COLOR_RGB", None)  # newer OpenCV: the decoder writes RGB itself, no conversion
REDUCED_FLAGS = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def read_image(path, reduce=1):
    """Read an image as RGB uint8, EXIF orientation applied (cv2.imread does), or None. reduce (2, 4 or 8): at
    that fraction of its size, which a JPEG decodes in a fraction of the time (libjpeg scales its DCT)."""
    flags = REDUCED_FLAGS.get(reduce, cv2.IMREAD_COLOR)
    # pitfalls D1-D2: cv2 reads BGR, the model and the HSV code expect RGB: convert once, here
    if RGB_FLAG is not None:
        return cv2.imread(path, flags & ~cv2.IMREAD_COLOR | RGB_FLAG)
    img = cv2.imread(path, flags)
    return None if img is None else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def load_original(record, cache=None, index=None, reduce=1):
    """The record's image as read (RGB uint8; reduce: see read_image), or its copy in the RAM cache (already
    resized); OSError when the file can no longer be read."""
    img = cache[index] if cache is not None and cache[index] is not None else None
    if img is None:
        img = read_image(record["im"], reduce)
        if img is None:
            raise OSError(f"image {record['im']} can no longer be read")
    return img


def labels_in_pixels(record, h, w):
    """The record's boxes (class, x1, y1, x2, y2) in pixels of an h x w image (they are stored normalised)."""
    labels = np.array(record["labels"], dtype=np.float32).reshape(-1, 5)
    labels[:, [1, 3]] *= w
    labels[:, [2, 4]] *= h
    return labels


def load_resized(record, imgsz, cache=None, index=None):
    """RGB uint8 image resized so its long side is imgsz, and its labels in pixels of that size."""
    img = load_original(record, cache, index)
    h, w = img.shape[:2]
    r = imgsz / max(h, w)
    if r != 1:  # resized_shapes: the one rounding rule, also behind the RAM cache's buffer
        nh, nw = resized_shapes((h, w), imgsz)[0]
        img = cv2.resize(img, (int(nw), int(nh)), interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_LINEAR)
    return img, labels_in_pixels(record, *img.shape[:2])


def resized_shapes(shapes, imgsz):
    """(h, w) of each image after load_resized, from the (h, w) as read: the long side becomes imgsz, the
    short one is rounded, and never below 1 px (utils/boxes.resized_side's rule, for many shapes at once)."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
    r = imgsz / shapes.max(1, keepdims=True)
    return np.maximum(1, np.round(shapes * r)).astype(np.int64)  # round half to even, as Python's round()


def available_memory():
    """Bytes of RAM the kernel can give without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def cache_images(records, imgsz, workers=8, share=None):
    """--cache ram: decode and resize every image once, into one buffer, before the workers fork (they
    share its pages). Returns one image (or None: unreadable, read from disk when drawn) per record, in the
    records' order, or None when it does not fit: the memory it needs is estimated from the image sizes and
    compared with what is free first, one warning instead of the kernel killing the run hours later.

    share (utils.distributed.NodeShare; None: this process alone): under DDP, the processes of one machine
    share one copy, a file in /dev/shm that local rank 0 fills and every process maps; it is unlinked as
    soon as all have mapped it, so nothing is left behind, even after a kill -9. Every rank must then call
    this, with the same records: it runs collectives."""
    records = as_records(records)
    shapes = resized_shapes(records.shapes, imgsz)
    offsets = np.concatenate(([0], np.cumsum(shapes[:, 0] * shapes[:, 1] * 3)))
    shared = share is not None and share.local_world_size > 1 and os.path.isdir("/dev/shm")
    copies = 1 if shared or share is None else share.local_world_size  # unshared, each process holds its own
    if not _fits(len(records), imgsz, int(offsets[-1]) * copies, copies, share if shared else None):
        return None
    # One buffer: every image, then one byte per image (1: cached; 0: unreadable, read again when drawn).
    size = int(offsets[-1]) + len(records)
    fills = not shared or share.local_rank == 0
    if shared:
        key = hashlib.sha256(records.path_bytes.tobytes() + f"{imgsz}|{share.run_key}".encode())
        path = f"/dev/shm/yolo-cache-{key.hexdigest()[:16]}"
        buffer = np.memmap(path, np.uint8, "w+", shape=(size,)) if fills else None
    else:
        buffer = np.empty(size, np.uint8)
    if fills:
        _fill(buffer, records, imgsz, shapes, offsets, workers)
    if shared:
        buffer = _map_on_every_process(buffer, path, size, share)
    cached = buffer[offsets[-1] :]
    images = [
        buffer[offsets[i] : offsets[i + 1]].reshape(h, w, 3) if cached[i] else None for i, (h, w) in enumerate(shapes)
    ]
    where = f", one copy shared by the {share.local_world_size} processes of this machine" if shared else ""
    log.info(f"cached {len(records)} images in RAM ({offsets[-1] / 1e9:.2f} GB{where})")
    return images


def _fits(n, imgsz, need, copies, share):
    """Whether `need` bytes fit in the free memory with 20% to spare (the rest is for the model, workers, the
    OS); else one warning. With a share, rank 0's verdict for all: every process must take the same way
    through the collectives that follow."""
    free = available_memory()
    fits = free is None or need <= 0.8 * free
    if share is not None:
        verdict = [fits]
        share.broadcast(verdict)
        fits = verdict[0]
    if not fits:
        log.warning(
            f"--cache ram: {n} images at {imgsz} px need {need / 1e9:.1f} GB "
            f"({copies} {'copy' if copies == 1 else 'copies'}) but {(free or 0) / 1e9:.1f} GB of RAM are free; "
            "training without the RAM cache (images are read from disk each time)"
        )
    return fits


def _fill(buffer, records, imgsz, shapes, offsets, workers):
    """Decode and resize every image into its place in `buffer`, and mark it cached (or not) in the last bytes."""

    def fill(i):
        try:
            image = buffer[offsets[i] : offsets[i + 1]].reshape(shapes[i][0], shapes[i][1], 3)
            image[...] = load_resized(records[i], imgsz)[0]
            buffer[offsets[-1] + i] = 1
        except (OSError, ValueError):  # unreadable now, or another size than at verification
            buffer[offsets[-1] + i] = 0

    with ThreadPoolExecutor(workers) as pool:
        list(tqdm(pool.map(fill, range(len(records))), total=len(records), desc="caching images", leave=False))


def _map_on_every_process(buffer, path, size, share):
    """The /dev/shm file local rank 0 filled, mapped read-only by the others; its name is removed once every
    process has mapped it (the memory stays while mapped). Returns this process's mapping."""
    fills = share.local_rank == 0
    if fills:
        buffer.flush()
    share.barrier()  # filled
    if not fills:
        buffer = np.memmap(path, np.uint8, "r", shape=(size,))
    share.barrier()  # mapped everywhere: the name can go, the memory stays while mapped
    if fills:
        os.unlink(path)
    return buffer


# ---------------------------------------------------------------------------------------------
# Verification: whether a file is an image training can use (utils/data/labels.py verifies a split with it)
# ---------------------------------------------------------------------------------------------

# --max-pixels: an image whose header declares more pixels is excluded at verification, read from the header alone.
# A few KB of PNG can declare 30000x30000 (a decompression bomb): decoded, gigabytes per copy, in every loader worker.
# 40 million is more than a 6000x6000 photo (36 Mpx; a 50 Mpx camera's 8192x5464 is more: raise it for those), and
# training resizes to --imgsz anyway, so a larger image only costs memory and decoding time.
MAX_PIXELS = 40_000_000
# PIL's own limit (limit_pixels sets it to ours) warns between 1x and 2x it and raises DecompressionBombError beyond:
# header_shape turns the error into the exclusion's sentence, and the warning would only repeat that sentence
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
# PIL warns (a UserWarning, with no file name) while reading the header of a truncated TIFF: usable_shape then decodes
# it and excludes it with a sentence that names it (found by tests/test_hostile.py)
warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.TiffImagePlugin")


class BadImage(Exception):
    """An image verification excludes; the message is the reason."""


def limit_pixels(max_pixels):
    """PIL's own limit, Image.MAX_IMAGE_PIXELS, set to --max-pixels: wherever PIL opens an image in this process
    (header_shape), it refuses what verification excludes, no more, no less."""
    Image.MAX_IMAGE_PIXELS = max_pixels


def jpeg_is_complete(path):
    """A JPEG must end with its end-of-image marker (FF D9); a truncated one still decodes in cv2
    (grey bottom, a warning on stderr), so decoding alone does not catch it. Padding after the
    marker (zeros, FF fill, a newline) is common and harmless."""
    return _tail(path).rstrip(b"\x00\xff\r\n\t ").endswith(b"\xff\xd9")


def png_is_complete(path):
    """A PNG ends with its IEND chunk; a header read alone would not notice a truncated file."""
    return b"IEND\xaeB`\x82" in _tail(path)


def _tail(path, n=1024):
    with open(path, "rb") as f:
        f.seek(max(os.path.getsize(path) - n, 0))
        return f.read()


def header_shape(path, max_pixels=MAX_PIXELS):
    """(h, w) read from the image's header (far cheaper than decoding the image), as cv2.imread
    will return the image; None when the header cannot tell: a format PIL does not read, not an image at all,
    or an EXIF rotation (cv2 applies it: then the caller decodes, and gets the size cv2 will use). An image of more
    than max_pixels (--max-pixels): BadImage, never None, so that the caller does not decode it."""
    try:
        with Image.open(path) as image:
            w, h = image.size
            if w * h > max_pixels:
                raise BadImage(_too_large(w * h, max_pixels, f" ({w}x{h})"))
            if image.getexif().get(0x0112, 1) != 1:  # the EXIF orientation tag
                return None
            return h, w
    except BadImage:
        raise
    except Image.DecompressionBombError as e:  # raised before PIL tells the size: its pixel count is in the message
        pixels = int("".join(c for c in str(e).split(" pixels")[0] if c.isdigit()) or 0)  # "Image size (9000 pixels)"
        if pixels <= max_pixels:  # PIL's limit was left lower than ours (limit_pixels not called): ours decides
            return None
        raise BadImage(_too_large(pixels, max_pixels)) from None
    except Exception:  # PIL raises a dozen different types for files it cannot parse; the caller decides
        return None


def _too_large(pixels, max_pixels, size=""):
    return (
        f"image is {pixels / 1e6:.3g} megapixels{size}, more than --max-pixels {max_pixels} (decoding it could "
        "exhaust the memory); raise --max-pixels to train on it"
    )


def usable_shape(image_path, max_pixels=MAX_PIXELS):
    """(h, w) of an image training can use, checked the cheap way first: its end markers and its header; never
    decoded when its header declares more than max_pixels. BadImage (the reason) for one it cannot use."""
    if os.path.getsize(image_path) == 0:
        raise BadImage("image file is empty (0 bytes)")
    with open(image_path, "rb") as f:
        magic = f.read(8)
    if magic[:3] == b"\xff\xd8\xff" and not jpeg_is_complete(image_path):  # by content: suffixes lie
        raise BadImage("truncated JPEG (no end-of-image marker)")
    if magic == b"\x89PNG\r\n\x1a\n" and not png_is_complete(image_path):
        raise BadImage("truncated PNG (no IEND chunk)")
    shape = header_shape(image_path, max_pixels)
    # Only JPEG and PNG have an end checked above: a truncated BMP, TIFF or WebP keeps a valid header, was kept, and
    # then failed to decode in every epoch (found by tests/test_hostile.py). Decoding them is the sure check; they
    # are rare in detection sets, and the header has already refused one of more than max_pixels.
    if shape is None or not (magic[:3] == b"\xff\xd8\xff" or magic == b"\x89PNG\r\n\x1a\n"):
        img = cv2.imread(image_path, cv2.IMREAD_COLOR)  # applies the EXIF orientation, as training will
        if img is None:
            raise BadImage("not a readable image (cannot be decoded)")
        shape = img.shape[:2]
    h, w = shape
    if h < 10 or w < 10:
        raise BadImage(f"image is only {w}x{h} pixels")
    if h * w > max_pixels:
        raise BadImage(_too_large(h * w, max_pixels, f" ({w}x{h})"))
    return h, w
