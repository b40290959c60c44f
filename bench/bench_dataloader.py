"""Data-loader images/s (training pipeline: mosaic, affine, HSV, flip) next to what one training
step of the `n` model consumes, at each image size. If the loader is slower than the step, the
GPU/CPU waits on data: add --workers, use --cache ram, or lower the augmentation cost.

    python bench/bench_dataloader.py                      # shapes set, 640 and 320 px, 2 workers
    python bench/bench_dataloader.py --batches 3 --steps 1 --sizes 320   # a quick smoke run

The two are timed one after the other, never together, so neither steals the other's cores.
The augmentation settings are read from train.py's HYP table (the defaults a run uses).
"""

import argparse
import ast
import gc
import itertools
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/bench_dataloader.py`: find utils/ and models/

import cv2  # noqa: E402
import torch  # noqa: E402

from models.yolo import YOLO  # noqa: E402
from utils.data import EpochBatchSampler, TrainDataset, fix_cv2_and_file_limits, make_loader  # noqa: E402
from utils.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.labels import load_verified  # noqa: E402
from utils.loss import DetectionLoss  # noqa: E402
from utils.shapes import make_shapes  # noqa: E402


def train_hyp():
    """train.py's HYP table, read without running train.py (it is a script, not a module)."""
    tree = ast.parse((REPO / "train.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HYP" for t in node.targets):
            return {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
    raise SystemExit("error: no HYP table found in train.py")


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores | torch {torch.__version__}, {torch.get_num_threads()} threads"
        f" | opencv {cv2.__version__}"
    )


def time_loader(records, size, hyp, batch, workers, warmup, batches):
    """Images/s of the training loader, after `warmup` batches (worker start-up not counted).
    Returns (images/s, one batch to time the model with)."""
    dataset = TrainDataset(records, size, hyp, seed=0)
    loader = make_loader(dataset, EpochBatchSampler(len(dataset), batch, seed=0), workers=workers)
    it = iter(loader)
    sample = None
    for sample in itertools.islice(it, warmup):
        pass
    start = time.perf_counter()
    images = 0
    for sample in itertools.islice(it, batches):
        images += len(sample[0])
    seconds = time.perf_counter() - start
    del it, loader  # stop the workers before the model is timed
    gc.collect()
    return images / seconds, sample


def time_train_step(images, targets, nc, steps):
    """Images/s of forward + backward of the n model and its loss on one batch (as train.py does, fp32 CPU)."""
    model = YOLO("n", nc).train().to(memory_format=torch.channels_last)  # as train.py runs it
    loss_fn = DetectionLoss(model.head)
    x = (images.float() / 255).contiguous(memory_format=torch.channels_last)
    for _ in range(1):  # warm-up: first-call allocations and kernel selection
        loss_fn(model(x), targets)[0].backward()
    start = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss, _ = loss_fn(model(x), targets)
        loss.backward()
    return len(x) * steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", default=str(REPO / "data" / "shapes.yaml"), help="dataset yaml (its train split is read)"
    )
    parser.add_argument(
        "--tmp-shapes", type=int, default=0, help="instead of --data, generate this many shapes images in a temp folder"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[640, 320])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3, help="loader batches not timed (worker start-up)")
    parser.add_argument("--batches", type=int, default=30, help="loader batches timed")
    parser.add_argument("--steps", type=int, default=5, help="training steps timed")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads for the training step (0: torch's default)"
    )
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the verification totals
    fix_cv2_and_file_limits()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tmp_shapes:
        tmp = tempfile.TemporaryDirectory()
        root = make_shapes(Path(tmp.name) / "shapes", n_train=args.tmp_shapes, n_val=0)
        sources, nc = [root / "images" / "train"], 6
    else:
        data = load_dataset_yaml(args.data)
        sources, nc = data["train"], data["nc"]
    records = load_verified(sources, nc, "train")
    hyp = train_hyp()

    print(machine())
    print(
        f"{len(records)} train images | loader: {args.workers} workers, batch {args.batch}, mosaic {hyp['mosaic']}"
        f" | step: model n, batch {args.batch}, forward + backward"
    )
    rows = []
    for size in args.sizes:
        loader_rate, (images, targets) = time_loader(
            records, size, hyp, args.batch, args.workers, args.warmup, args.batches
        )
        if len(images) < args.batch:  # the last batch of an epoch can be short; time the step on a full one
            images = images.repeat((args.batch + len(images) - 1) // len(images), 1, 1, 1)[: args.batch]
        step_rate = time_train_step(images, targets, nc, args.steps)
        rows.append((size, loader_rate, step_rate))
        print(
            f"  {size} px: loader {loader_rate:7.1f} img/s | training step {step_rate:6.1f} img/s"
            f" | loader / step {loader_rate / step_rate:5.1f}x",
            flush=True,
        )
    print(f"{'imgsz':>5} | {'loader img/s':>12} | {'train step img/s':>16} | {'loader/step':>11}")
    for size, loader_rate, step_rate in rows:
        print(f"{size:>5} | {loader_rate:>12.1f} | {step_rate:>16.1f} | {loader_rate / step_rate:>10.1f}x")


if __name__ == "__main__":
    main()
