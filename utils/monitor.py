"""What a run records while it trains, besides the log: results.csv (one row per epoch, trimmed on resume),
TensorBoard scalars when it is installed, a profiler trace (--profile), and the images/s of --benchmark."""

import csv
import os
import time
from pathlib import Path

from utils.disk import DiskFull, disk_full_sentence, is_disk_full
from utils.general import write_text_atomic

# Columns renamed since a run may have started: a resumed run keeps its rows' numbers under the new name. YOLO26's
# L1 distance term was written as dfl_loss before the loss named its parts (utils/loss.py, DetectionLoss.names).
RENAMED_COLUMNS = {"l1_loss": "dfl_loss", "val_l1_loss": "val_dfl_loss"}


def start_results_csv(path, columns, resumed_epoch=None):
    """Write results.csv's header. A resumed run keeps its rows up to `resumed_epoch`, where its last.pt was
    saved: a killed run may have written rows past that, and those epochs are trained again. A column new since
    then is filled with 0 in the kept rows."""
    path = Path(path)
    rows = []
    if resumed_epoch is not None and path.exists():
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["epoch"]) <= resumed_epoch]
    kept = [[r.get(c) or r.get(RENAMED_COLUMNS.get(c)) or "0" for c in columns] for r in rows]
    lines = [",".join(columns)] + [",".join(values) for values in kept]
    try:  # atomic: a full disk must not leave the kept rows truncated
        write_text_atomic(path, "\n".join(lines) + "\n")
    except OSError as e:
        _stop_if_disk_full(e, path, "the previous results.csv is intact")
        raise


def append_results_row(path, row):
    """One epoch's line of results.csv: floats to 5 significant digits, the rest as written. A full disk stops the
    run with one sentence (utils.disk.DiskFull), the rows before intact."""
    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    try:
        with path.open("a") as f:
            f.write(",".join(f"{v:.5g}" if isinstance(v, float) else str(v) for v in row) + "\n")
    except OSError as e:
        if path.exists():
            os.truncate(path, size)  # no half row for a resumed run to read (truncating needs no space)
        _stop_if_disk_full(e, path, "its rows before this epoch are intact")
        raise


def epoch_loss_sums(checkpoint, parts, device):
    """(sums of the loss parts, batches summed) at an epoch's start: zeros, or for a run resumed in the middle of
    an epoch what its last.pt saved (training_state's "epoch_sums"), so that results.csv's losses of that epoch
    average all its batches, as an uninterrupted run's do, not only those after the resume."""
    import torch

    saved = checkpoint.get("epoch_sums") if checkpoint else None  # None: an epoch's start, or an older last.pt
    if saved is None:
        return torch.zeros(parts, device=device), 0
    return saved[0].to(device), int(saved[1])


def _stop_if_disk_full(error, path, kept):
    if is_disk_full(error, path.parent):
        last = path.parent / "weights" / "last.pt"
        then = f"free some space, then continue with: python train.py --resume {last}" if last.exists() else ""
        raise DiskFull(disk_full_sentence(path, kept, then or "free some space and run again")) from None


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
    """train.py --benchmark N: images/s over N iterations after 3 warm-up ones (CUDA's first calls, the loader's
    first batches). Call finished(iteration) once per iteration, at the same point; report() once it is True."""

    def __init__(self, iterations, batch, imgsz, device):
        self.iterations, self.batch, self.imgsz, self.device = iterations, batch, imgsz, device
        self.start = None

    def finished(self, iteration):
        if iteration == 2:
            self.start = time.time()
        return iteration == self.iterations + 2

    def report(self):
        seconds = time.time() - self.start
        return (
            f"benchmark: {self.iterations * self.batch / seconds:.2f} images/s "
            f"({seconds / self.iterations * 1000:.0f} ms/iteration, batch {self.batch}, {self.imgsz} px, {self.device})"
        )


def progress_text(names, losses, lr, memory_gb, images_per_second):
    """The progress bar's postfix: the epoch's mean losses so far (named by `names`, DetectionLoss.names), the
    learning rate, GPU memory, speed."""
    shown = [f"{name} {value:.3f}" for name, value in zip(names, losses)]
    return " ".join([*shown, f"lr {lr:.2e}", f"mem {memory_gb:.1f}G", f"{images_per_second:.1f} img/s"])


def epoch_line(epoch, epochs, names, losses, metrics, seconds, faults):
    """The log line of an epoch, its parts joined with ' | ': losses (named by `names`, DetectionLoss.names), P/R/mAP,
    the validation losses (metrics' val_<name>_loss, shown as `val box B cls C dfl D`), time, and
    faults if any."""
    parts = [f"epoch {epoch}/{epochs}: " + " ".join(f"{n} {v:.3f}" for n, v in zip(names, losses))]
    short = {"precision": "P", "recall": "R"}
    scores = [f"{short.get(k, k)} {v:.3f}" for k, v in metrics.items() if not k.startswith("val_")]
    validation = [f"{k[4:].removesuffix('_loss')} {v:.3f}" for k, v in metrics.items() if k.startswith("val_")]
    parts += [" ".join(scores), "val " * bool(validation) + " ".join(validation), f"{seconds:.0f} s"]
    return " | ".join(parts + [f"{k.replace('_', ' ')} {v}" for k, v in faults.items() if v])


def run_summary(network, images, args, accumulate, device, world_size, amp, names, class_weights):
    """The one line a run starts with: the network, the data, the schedule, the optimizer, where it runs, the AMP
    dtype (empty: off), the loader, the class weights when there are any, and the teacher (--teacher)."""
    schedule = f"{args.epochs} epochs at {args.imgsz} px, batch {args.batch} x accumulate {accumulate}"
    if args.accumulate_warmup and accumulate > 1:
        schedule += " (from 1 over the warmup)"
    parts = [network, images, schedule, f"{args.optimizer} lr0 {args.lr0}"]
    parts.append(f"{device} x {world_size} processes" if world_size > 1 else device)
    if amp:
        parts.append(f"amp {amp}")
    parts.append(f"{args.workers} loader workers")
    if class_weights:
        parts.append("class weights " + ", ".join(f"{n} {w:.3g}" for n, w in zip(names, class_weights)))
    if args.teacher:
        parts.append(f"teacher {args.teacher}, distill gain {args.distill_gain}")
    return " | ".join(parts)


def log_epoch(tensorboard, mlflow_run, values, epoch):
    """An epoch's results.csv values (column -> number) in TensorBoard and MLflow, where they are open."""
    if tensorboard:
        for column, value in values.items():
            tensorboard.add_scalar(column, value, epoch)
    if mlflow_run:
        mlflow_run.log_epoch(values, epoch)
