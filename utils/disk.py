"""A full disk while a run writes its own files (last.pt, best.pt, results.csv): recognising it, and the one
sentence the run then stops with. The label cache only warns (utils/data/labels.py): it is a cache."""

import errno
import shutil
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_MESSAGES = ("No space left on device", "Disk quota exceeded")
# torch.save reports a failed write as a RuntimeError of its zip writer ("unexpected pos ...", "file write
# failed"), the OSError only as its context, or not at all when it writes to a path itself
TORCH_WRITER_MESSAGES = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
ALMOST_FULL = 1 << 20  # bytes: a writer error with less than this left in the folder is the disk filling up


class DiskFull(SystemExit):
    """A run's own file cannot be written for lack of space. A SystemExit on purpose: the run stops with the one
    sentence and exit status 1, no traceback, wherever the write was, and the crash handler (sys.excepthook, which
    would write crash/ on the same full disk) is not called."""


def free_bytes(folder):
    """Free bytes on the disk of `folder` (its nearest existing parent), or None where that cannot be asked."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def is_disk_full(error, folder):
    """Whether `error` comes from a full disk or quota: an ENOSPC / EDQUOT OSError anywhere in its chain, its
    message, or a torch zip-writer error while `folder` has almost nothing left. Other errors are not."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL_ERRNOS:
            return True
        if any(m in str(error) for m in FULL_MESSAGES):
            return True
        if isinstance(error, RuntimeError) and any(m in str(error) for m in TORCH_WRITER_MESSAGES):
            free = free_bytes(folder)
            if free is not None and free < ALMOST_FULL:
                return True
        error = error.__cause__ or error.__context__
    return False


def size_text(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def disk_full_sentence(path, kept, then):
    """The sentence a run stops with: what could not be written, the free space now, what is intact, what to do."""
    path = Path(path)
    free = free_bytes(path.parent)
    left = f"{size_text(free)} free" if free is not None else "free space unknown"
    return f"stopping: the disk is full, {path} could not be written ({left} on that disk now); {kept}; {then}"


# a folder a run cannot write in: --out on a read-only mount, a dataset folder shared read-only
UNWRITABLE = {
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "not allowed",
}


def why_not_written(error, folder):
    """The reason a write failed, in a few words: the disk full (and its free space), read-only, no permission,
    or the error's own words."""
    if is_disk_full(error, folder):
        free = free_bytes(folder)
        return f"the disk is full, {size_text(free) if free is not None else 'unknown space'} free"
    if isinstance(error, OSError) and error.errno in UNWRITABLE:
        return UNWRITABLE[error.errno]
    return getattr(error, "strerror", None) or str(error)


def not_written_sentence(path, error, kept):
    """'PATH could not be written (why); what is intact': one sentence for a file a run or a tool could not write."""
    return f"{path} could not be written ({why_not_written(error, Path(path).parent)}); {kept}"
