"""Small helpers the scripts share: logging, run folders, atomic writes, seeds. (Settings: utils/settings.py;
what a run records: utils/monitor.py; crash reports: utils/faults.py.)

numpy and torch are imported inside the functions that use them: tools/sweep.py imports this module
and must start in a fraction of a second, without torch.
"""

import contextlib
import logging
import os
import random
import re
import sys
from pathlib import Path

from utils.disk import DiskFull, disk_full_sentence, is_disk_full, not_written_sentence


class DatasetError(ValueError):
    """A dataset yaml or folder that cannot be used; the message is one sentence naming the culprit. Here, not in
    utils/data/, because utils/settings.py raises it too and utils/data/ imports settings."""


def setup_logging(log_file=None, rank=0):
    """Readable lines on the console (rank 0 only) and, when given, the same lines in a log file."""
    log = logging.getLogger("yolo")
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(console)
    if log_file:
        f = LogFileHandler(log_file)
        f.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(f)
    return log


class LogFileHandler(logging.FileHandler):
    """The log file. A full disk (or a log file that cannot be written) is said once, in one sentence, and the
    lines go on to the console only: logging's default prints a traceback per line instead, and a log is not
    worth a run (when the disk stays full, the next checkpoint stops it with its sentence)."""

    def handleError(self, record):
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return super().handleError(record)
        logging.getLogger("yolo").removeHandler(self)
        with contextlib.suppress(OSError):  # what is left in its buffer cannot be written either
            self.close()
        print(
            f"warning: {not_written_sentence(self.baseFilename, error, 'its lines go to the console only')}",
            file=sys.stderr,
        )


def write_run_file(path, text, kept="nothing written before is lost"):
    """A run's small text file (args.yaml, metrics.json) written all at once (a kill leaves the previous one or
    none). A full disk stops the run with one sentence naming the path and the free space (DiskFull, a
    SystemExit), and so does a folder that cannot be written."""
    path = Path(path)
    try:
        write_text_atomic(path, text)
    except OSError as e:
        if is_disk_full(e, path.parent):
            raise DiskFull(disk_full_sentence(path, kept, "free some space and run again")) from None
        raise SystemExit(f"stopping: {not_written_sentence(path, e, kept)}") from None


def next_run_dir(base="runs/train/exp"):
    """runs/train/exp, then exp2, exp3, ...: never overwrite an earlier run."""
    base = Path(base)
    if not base.exists():
        return base
    taken = [
        int(m.group(1) or 1)
        for p in base.parent.glob(base.name + "*")
        if (m := re.fullmatch(re.escape(base.name) + r"(\d*)", p.name))
    ]
    return base.with_name(f"{base.name}{max(taken) + 1}")


def atomic_write(path, write, fsync=False):
    """Write `path` all at once: `write(f)` fills a temporary file (opened in binary mode) in the same
    folder, which is then renamed over `path`. A reader (another process, a DDP rank, a rerun) never
    sees half a file; if `write` fails, the previous file is left as it was and the temporary file is
    removed. fsync=True also flushes the data to the disk before the rename, so that a power cut or a
    kill while saving leaves the previous file intact, never a truncated one (for checkpoints)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path, text):
    """atomic_write for a string (UTF-8)."""
    atomic_write(path, lambda f: f.write(text.encode()))


def seed_everything(seed, deterministic=False):
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # cuDNN's per-shape algorithm search stays off: every new batch shape searches again, which costs more than it
    # gains (bench/RESULTS.md#the-gpu-path); Ultralytics leaves it off too
    torch.backends.cudnn.benchmark = False
    if deterministic:
        # Pitfall M6: floating-point sums depend on the order; pin the algorithms that choose it.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
