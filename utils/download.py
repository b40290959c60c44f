"""Ultralytics' published detection checkpoints by name: `--weights yolo11n.pt`, where no such file exists, is
downloaded once into a cache folder and read from there on, as Ultralytics' own tools do.

    resolve_weights("yolo11n.pt")  # -> ~/.cache/yolo/weights/yolo11n.pt (downloaded the first time)

The cache folder: $WEIGHTS_DIR, else $XDG_CACHE_HOME/yolo/weights, else ~/.cache/yolo/weights. $WEIGHTS_URL, when
set, is a flat mirror (a company's file server): a name is fetched from $WEIGHTS_URL/<name> instead of GitHub.
A download goes to a temporary name, is checked (all the bytes the server announced, and a checkpoint that the safe
loader reads as the model its name says), and only then renamed; a lock on the folder makes two processes asking
for one name at once (DDP ranks, two runs) download it once. Standard library and tqdm only.
"""

import fcntl
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from utils.checkpoints.ours import CheckpointError, read_checkpoint
from utils.locks import remove_stale_temporary_files

RELEASES = "https://github.com/ultralytics/assets/releases/download"
# name -> (the ultralytics/assets release holding it, the model it must convert to)
PUBLISHED = {f"yolov8{s}.pt": ("v8.3.0", s) for s in "nsmlx"}
PUBLISHED |= {f"yolo11{s}.pt": ("v8.3.0", f"11{s}") for s in "nsmlx"}
PUBLISHED |= {f"yolo26{s}.pt": ("v8.4.0", f"26{s}") for s in "nsmlx"}
LOOKS_PUBLISHED = re.compile(r"yolo.*\.pt", re.IGNORECASE)  # a bare name that was meant as one of them
TIMEOUT = 30  # seconds without a byte before a download is given up: a stalled server fails instead of hanging
CHUNK = 1 << 20


def cache_folder():
    """Where published checkpoints are kept: $WEIGHTS_DIR, else the user's cache folder's yolo/weights."""
    if os.environ.get("WEIGHTS_DIR"):
        return Path(os.environ["WEIGHTS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "yolo" / "weights"


def published_url(name):
    """$WEIGHTS_URL/<name> when that mirror is set, else the file's Ultralytics release URL."""
    mirror = os.environ.get("WEIGHTS_URL", "").rstrip("/")
    return f"{mirror}/{name}" if mirror else f"{RELEASES}/{PUBLISHED[name][0]}/{name}"


def resolve_weights(value, flag="", timeout=TIMEOUT):
    """The file a weights argument means: itself where it exists (or is empty); for a published name (yolo11n.pt),
    the cached file, downloaded first if missing; any other path unchanged (its reader names it when missing).
    A bare name like a published one that is none (yolo11q.pt): CheckpointError listing the known names. A download
    that fails: CheckpointError, one sentence naming the URL, the cache path and how to place the file by hand."""
    if not value or Path(value).exists():
        return value
    name = str(value)  # a str or a Path
    if name in PUBLISHED:
        cached = cache_folder() / name
        return str(cached if cached.is_file() else download_published(name, timeout))
    if os.sep not in name and LOOKS_PUBLISHED.fullmatch(name):
        raise CheckpointError(
            f"{flag + ' ' if flag else ''}{name} is neither a file nor one of Ultralytics' published detection "
            f"checkpoints ({', '.join(PUBLISHED)}); give a checkpoint's path or one of those names"
        )
    return value


def download_published(name, timeout=TIMEOUT):
    """Download the published checkpoint `name` into the cache folder and return its path. Under the folder's lock:
    a process that waited on another's download finds the file there and returns it."""
    folder, url = cache_folder(), published_url(name)
    target = folder / name
    by_hand = (
        f"download it by hand from that URL (or a machine that has it) to {target}, or set WEIGHTS_DIR to a folder "
        f"holding {name}, or WEIGHTS_URL to a mirror"
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise CheckpointError(f"{name} cannot be cached in {folder} ({e.strerror}); {by_hand}") from None
    try:
        _wait_for(lock, name)
        if target.is_file():  # another process downloaded it while this one waited
            return target
        remove_stale_temporary_files(folder)  # those of a download that was killed
        temporary = folder / f".{name}.{os.getpid()}.tmp"
        try:
            _fetch(url, temporary, name, timeout)
            _check(temporary, name)
            os.replace(temporary, target)  # atomic: a reader sees no file or the whole, checked one
        except (OSError, http.client.HTTPException, ValueError) as e:  # URLError, HTTPError, timeouts, disk full
            raise CheckpointError(f"{name} could not be downloaded from {url} ({_reason(e)}); {by_hand}") from None
        finally:
            temporary.unlink(missing_ok=True)
    finally:
        os.close(lock)  # drops the flock
    print(f"{name}: saved in {target}")
    return target


def _wait_for(lock, name):
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"{name}: waiting for another process that is downloading it into {cache_folder()}")
        fcntl.flock(lock, fcntl.LOCK_EX)  # the kernel drops a holder's lock however it ends


def _fetch(url, path, name, timeout):
    """The body at `url` into `path`, with a progress bar; ValueError when it ends before its announced length."""
    print(f"{name}: downloading {url} to {cache_folder() / name}")
    request = urllib.request.Request(url, headers={"User-Agent": "yolo-flat"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(path, "wb") as f:
        size = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr) as bar:
            while block := response.read(CHUNK):
                f.write(block)
                bar.update(len(block))
        if size and f.tell() != size:
            raise ValueError(f"truncated: {f.tell()} of the {size} bytes the server announced")
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename: a power cut leaves no file rather than a renamed empty one


def _check(path, name):
    """ValueError unless `path` reads, through the safe loader, as the model its published name says."""
    with open(path, "rb") as f:
        start = f.read(512).lstrip()
    if start.startswith(b"<"):
        raise ValueError("the server sent an HTML page, not a checkpoint: a proxy's, a login's or an error page")
    try:
        checkpoint = read_checkpoint(path)[1]
    except CheckpointError as e:
        raise ValueError(str(e).replace(str(path), "the file")) from None
    if checkpoint["scale"] != PUBLISHED[name][1]:
        raise ValueError(f"it holds model {checkpoint['scale']}, not {PUBLISHED[name][1]}")


def _reason(e):
    """What went wrong, in words: the HTTP status, the network's error, or a stall."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, Exception) else e  # a refused connection, an unknown host, a timeout
    if isinstance(e, TimeoutError):
        return "no data within the timeout: the server stalled or the network is down"
    return str(e) or type(e).__name__
