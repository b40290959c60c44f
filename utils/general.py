"""Small helpers the scripts share: logging, command-line settings (flags given, a dataset's defaults, the
worker count), run folders, atomic writes, seeds (crash reports: utils/faults.py).

numpy and torch are imported inside the functions that use them: sweep.py imports this module and
must start in a fraction of a second, without torch.
"""

import csv
import logging
import os
import random
import re
import sys
import time
from pathlib import Path

from utils.dataset_yaml import DatasetError


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
        f = logging.FileHandler(log_file)
        f.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(f)
    return log


def explicit_flags(parser, argv):
    """The dest names of the options written on the command line (not left at their defaults)."""
    given = set()
    for action in parser._actions:
        for option in action.option_strings:
            if any(a == option or a.startswith(option + "=") for a in argv):
                given.add(action.dest)
    return given


def apply_dataset_defaults(args, parser, data, given_flags):
    """Set the settings a dataset yaml recommends under `defaults:` (shapes.yaml does) on `args`, except
    those given as flags: a flag written on the command line wins. Values take the type of the flag."""
    for key, value in data["defaults"].items():
        if not hasattr(args, key):
            raise DatasetError(f"{data['yaml']}: key 'defaults' names '{key}', which is not a train.py setting")
        if key in given_flags:
            continue
        default = parser.get_default(key)
        try:
            setattr(args, key, value if default is None or isinstance(default, bool) else type(default)(value))
        except (TypeError, ValueError):  # "many" or [7] for an int
            raise DatasetError(
                f"{data['yaml']}: key 'defaults' sets '{key}' to {value!r}, which is not a {type(default).__name__}"
            ) from None


def default_workers(local_world_size=1, most=None):
    """The cores this process may use, shared out between the `local_world_size` processes of its machine (at
    least 1, at most `most`): the default number of data-loader workers, and of label verification workers."""
    workers = max(1, len(os.sched_getaffinity(0)) // local_world_size)
    return min(workers, most) if most else workers


def start_results_csv(path, columns, resumed_epoch=None):
    """Write results.csv's header. A resumed run keeps its rows up to `resumed_epoch`, where its last.pt was
    saved: a killed run may have written rows past that, and those epochs are trained again."""
    path = Path(path)
    rows = []
    if resumed_epoch is not None and path.exists():
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= resumed_epoch]
    lines = [",".join(columns)] + [",".join(r.get(c) or "0" for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n")


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
    torch.backends.cudnn.benchmark = not deterministic  # the fastest convolution per shape, found once per shape
    if deterministic:
        # Pitfall M6: floating-point sums depend on the order; pin the algorithms that choose it.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def append_results_row(path, row):
    """One epoch's line of results.csv: floats to 5 significant digits, the rest as written."""
    with Path(path).open("a") as f:
        f.write(",".join(f"{v:.5g}" if isinstance(v, float) else str(v) for v in row) + "\n")


def open_tensorboard(run_dir):
    """A SummaryWriter in the run folder when tensorboard is installed (it is optional), else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir))


def start_profiler(trace_path):
    """train.py --profile: a torch profiler over a few micro-steps (1 skipped, 1 warm-up, 3 recorded), whose
    Chrome trace is written once (repeat=0 would rewrite it every 5 steps). Call .step() per micro-step."""
    import torch

    profiler = torch.profiler.profile(
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        record_shapes=True,
    )
    profiler.start()
    return profiler


class Benchmark:
    """train.py --benchmark N: images/s over N iterations after 3 warm-up ones (cuDNN's search, the loader's
    first batches). Call finished(iteration) at the start of each iteration; report() once it is True."""

    def __init__(self, iterations, batch, imgsz, device):
        self.iterations, self.batch, self.imgsz, self.device = iterations, batch, imgsz, device
        self.start = None

    def finished(self, iteration):
        if iteration == 3:
            self.start = time.time()
        return iteration == self.iterations + 3

    def report(self):
        seconds = time.time() - self.start
        return (
            f"benchmark: {self.iterations * self.batch / seconds:.2f} images/s "
            f"({seconds / self.iterations * 1000:.0f} ms/iteration, batch {self.batch}, {self.imgsz} px, {self.device})"
        )
