"""Small helpers the scripts share: logging, command-line settings (flags given, a dataset's defaults, the
worker count), run folders, atomic writes, seeds, crash reports.

numpy and torch are imported inside the functions that use them: sweep.py imports this module and
must start in a fraction of a second, without torch.
"""

import csv
import json
import logging
import os
import platform
import random
import re
import sys
import traceback
from pathlib import Path

import yaml

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


def environment_info():
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpu_threads": torch.get_num_threads(),
        "argv": sys.argv,
        "cwd": os.getcwd(),
    }


def write_crash(run_dir, reason, context):
    """Write what is needed to understand a dead run into run_dir/crash/: the reason (traceback),
    the environment, the args, the offending batch, and the path of the last good checkpoint."""
    crash = Path(run_dir) / "crash"
    crash.mkdir(parents=True, exist_ok=True)
    (crash / "reason.txt").write_text(reason)
    (crash / "environment.json").write_text(json.dumps(environment_info(), indent=2))
    info = {k: v for k, v in context.items() if k != "batch"}
    (crash / "context.yaml").write_text(yaml.safe_dump(info, sort_keys=False))
    if context.get("batch") is not None:
        import torch

        torch.save(context["batch"], crash / "batch.pt")
    return crash


def abort_run(run_dir, message, context, is_main):
    """Stop the run on every rank with exit status 1 (all ranks call it at the same step); rank 0
    prints the message and writes crash/ with it as the reason."""
    if is_main:
        path = write_crash(run_dir, message, context)
        logging.getLogger("yolo").error(f"{message} (context written to {path})")
    sys.exit(1)


def install_crash_handler(run_dir, context):
    """Any uncaught exception writes crash/ before the process exits non-zero. `context` is a dict
    the training loop keeps up to date (args, epoch, iteration, batch, last checkpoint)."""
    previous = sys.excepthook

    def handler(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            try:
                path = write_crash(run_dir, "".join(traceback.format_exception(kind, value, tb)), context)
                print(f"The run crashed; the context is in {path}", file=sys.stderr)
            except Exception as e:  # the crash report must never hide the original error
                print(f"(could not write the crash report: {e})", file=sys.stderr)
        previous(kind, value, tb)

    sys.excepthook = handler
