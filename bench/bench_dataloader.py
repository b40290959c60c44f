"""Data-loader images/s (training pipeline: mosaic, affine, HSV, flip) next to what one training
step of the `n` model consumes, at each image size. If the loader is slower than the step, the
GPU/CPU waits on data: add --workers, use --cache ram, or lower the augmentation cost.

    python bench/bench_dataloader.py                      # shapes set, 640 and 320 px, 2 workers
    python bench/bench_dataloader.py --batches 3 --steps 1 --sizes 320   # a quick smoke run

The two are timed one after the other, never together, so neither steals the other's cores.
The augmentation settings are utils/hyperparameters.py's DEFAULTS (the HYP table's values, a run's defaults).

--per-worker: the loader alone, images/s per loader worker and images per CPU-second of a worker (what sizes the
CPU of a GPU machine: cores needed = --target-rate / per-worker rate), at each worker count given, on a generated
shapes set (--shapes-dir, --shapes-n images of --shapes-size px; made once, then reused) or --data. --peer-python runs
bench/ultralytics_dataloader.py with that interpreter (the peer venv that bench/peer_env.sh makes; alone, the flag
takes $PEER_PYTHON; ultralytics is never imported here) on the same images, same size, batch, workers, warm-up and
batch count, interleaved with ours repeat by repeat:

    python bench/bench_dataloader.py --per-worker 1 2 --sizes 640 --batch 16 --warmup 5 --batches 30 --repeats 3 \
        --peer-python
    python bench/bench_dataloader.py --per-worker 1 --sizes 640 --profile 200     # where our time goes (one process)
"""

import argparse
import cProfile
import gc
import itertools
import json
import logging
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as `python bench/bench_dataloader.py`: find utils/ and models/

import cv2  # noqa: E402
import torch  # noqa: E402
from cpu_time import cpu_seconds  # noqa: E402  (bench/, the script's own folder, is on sys.path)
from peer import find_peer_python  # noqa: E402

from models.yolo import YOLO, assignment_of  # noqa: E402
from utils.data.dataset_yaml import load_dataset_yaml  # noqa: E402
from utils.data.images import cache_images  # noqa: E402
from utils.data.labels import load_verified  # noqa: E402
from utils.data.loader import EpochBatchSampler, TrainDataset, fix_cv2_and_file_limits, make_loader  # noqa: E402
from utils.data.shapes import make_shapes  # noqa: E402
from utils.hyperparameters import DEFAULTS  # noqa: E402
from utils.loss import DetectionLoss  # noqa: E402


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


def time_loader(dataset, batch, workers, warmup, batches):
    """Images/s of the training loader, after `warmup` batches (worker start-up not counted).
    Returns (images/s, one batch to time the model with, images per CPU-second of the workers or None)."""
    loader = make_loader(dataset, EpochBatchSampler(len(dataset), batch, seed=0), workers=workers)
    it = iter(loader)
    sample = None
    for sample in itertools.islice(it, warmup):
        pass
    pids = [w.pid for w in getattr(it, "_workers", [])]
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    images = 0
    for sample in itertools.islice(it, batches):
        images += len(sample[0])
    seconds = time.perf_counter() - start
    cpu_end = cpu_seconds(pids)
    del it, loader  # stop the workers before the model is timed
    gc.collect()
    cpu_rate = images / (cpu_end - cpu) if pids and cpu is not None and cpu_end is not None and cpu_end > cpu else None
    return images / seconds, sample, cpu_rate


def loadavg():
    """The 1-minute load average: on a shared machine, what else was running during a measurement."""
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def run_peer(args, images_dir, size, workers):
    """bench/ultralytics_dataloader.py in the peer venv, one repeat; returns {workers: (images/s, images per
    CPU-second of the workers, loadavg)}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [
            args.peer_python,
            str(REPO / "bench" / "ultralytics_dataloader.py"),
            "--images",
            str(images_dir),
            "--nc",
            str(args.nc),
            "--imgsz",
            str(size),
            "--batch",
            str(args.batch),
            "--workers",
            *map(str, workers),
            "--warmup",
            str(args.warmup),
            "--batches",
            str(args.batches),
            "--repeats",
            "1",
            "--json",
            str(out),
        ] + (["--cache-ram"] if args.cache_ram else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"error: {' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
        found = [line.strip() for line in done.stdout.splitlines() if "with labels" in line]
        if found and not getattr(args, "peer_found", None):
            args.peer_found = found[0]
            print(f"  Ultralytics read: {found[0]}", flush=True)
        result = json.loads(out.read_text())["workers"]
        return {int(w): (r["runs"][0], r["cpu_runs"][0], r["loadavg"][0]) for w, r in result.items()}


def profile_samples(records, size, hyp, n, cache_ram, batch):
    """cProfile of n training samples made in this process (workers=0), a batch at a time as the loader asks for
    them: where a worker's time goes."""
    dataset = TrainDataset(records, size, hyp, seed=0, cache=cache_images(records, size) if cache_ram else None)
    batches = iter(EpochBatchSampler(len(dataset), batch, seed=0))
    dataset.__getitems__(next(batches))  # first-call costs (imports, allocations)
    profiler = cProfile.Profile(time.process_time)  # CPU time: on a shared machine, wall time counts the others too
    start = time.process_time()
    profiler.enable()
    done = 0
    while done < n:
        done += len(dataset.__getitems__(next(batches)))
    profiler.disable()
    seconds = time.process_time() - start
    print(
        f"\nprofile: {done} samples at {size} px in one process: {seconds / done * 1000:.1f} CPU-ms/sample"
        f" ({done / seconds:.1f} img per CPU-second, cProfile overhead included) | loadavg {loadavg()}"
    )
    stats = pstats.Stats(profiler).stats
    rows = sorted(((tt, calls, func) for func, (_, calls, tt, _, _) in stats.items()), reverse=True)[:15]
    print(f"{'ms/sample':>9} | {'share':>5} | {'calls/sample':>12} | function (own time, callees excluded)")
    for tt, calls, (file, line, name) in rows:
        where = name if file == "~" else f"{Path(file).name}:{line} {name}"
        print(f"{tt / done * 1000:>9.2f} | {tt / seconds:>5.0%} | {calls / done:>12.1f} | {where}")


def per_worker(args, records, images_dir):
    """--per-worker: images/s of the loader at each worker count (best of --repeats), ours and the peer's."""
    hyp = dict(DEFAULTS)
    print(machine())
    print(
        f"{len(records)} train images ({images_dir}) | batch {args.batch}, mosaic {hyp['mosaic']},"
        f" cache {'ram' if args.cache_ram else 'off'} | {args.warmup} batches warm-up, {args.batches} timed,"
        f" best of {args.repeats}"
    )
    runs = {}  # (repo, size, workers) -> [(images/s, images per worker CPU-second, loadavg)]
    caches = {size: cache_images(records, size) if args.cache_ram else None for size in args.sizes}

    def record(repo, repeat, size, workers, rate, cpu_rate, load):
        runs.setdefault((repo, size, workers), []).append((rate, cpu_rate, load))
        per_cpu = f"{cpu_rate:6.1f}" if cpu_rate else "     ?"
        print(
            f"  run {repeat + 1} {repo:<11} {size} px, {workers} workers: {rate:6.1f} img/s"
            f" ({rate / workers:5.1f} per worker, {per_cpu} per worker CPU-second) | loadavg {load}",
            flush=True,
        )

    for repeat in range(args.repeats):
        for size in args.sizes:
            for workers in args.per_worker:
                dataset = TrainDataset(records, size, hyp, seed=repeat, cache=caches[size])
                rate, _, cpu_rate = time_loader(dataset, args.batch, workers, args.warmup, args.batches)
                record("ours", repeat, size, workers, rate, cpu_rate, loadavg())
            if args.peer_python:
                for workers, (rate, cpu_rate, load) in run_peer(args, images_dir, size, args.per_worker).items():
                    record("ultralytics", repeat, size, workers, rate, cpu_rate, load)
    target = args.target_rate
    print(
        f"\nbest of {args.repeats}; cores for {target:g} img/s = {target:g} / per-worker rate (wall: images/s per"
        " worker; CPU: images per CPU-second of a worker, i.e. a core of its own)"
    )
    print(
        f"{'repo':<11} | {'imgsz':>5} | {'workers':>7} | {'img/s':>6} | {'img/s/worker':>12} | {'img/CPU-s':>9} |"
        f" {'cores (wall)':>12} | {'cores (CPU)':>11} | loadavg of each run"
    )
    best, best_cpu = {}, {}
    for (repo, size, workers), measured in runs.items():
        rate = best[repo, size, workers] = max(r for r, _, _ in measured)
        cpu_rate = best_cpu[repo, size, workers] = max((c for _, c, _ in measured if c), default=None)
        per_cpu, cores_cpu = (f"{cpu_rate:.1f}", f"{target / cpu_rate:.1f}") if cpu_rate else ("?", "?")
        print(
            f"{repo:<11} | {size:>5} | {workers:>7} | {rate:>6.1f} | {rate / workers:>12.1f} | {per_cpu:>9} |"
            f" {target / (rate / workers):>12.1f} | {cores_cpu:>11} | {' '.join(load for _, _, load in measured)}"
        )
    if args.peer_python:
        for size in args.sizes:
            for workers in args.per_worker:
                ratio = best["ours", size, workers] / best["ultralytics", size, workers]
                ours_cpu, peer_cpu = best_cpu["ours", size, workers], best_cpu["ultralytics", size, workers]
                cpu = f", {ours_cpu / peer_cpu:.2f}x per worker CPU-second" if ours_cpu and peer_cpu else ""
                print(f"ours / Ultralytics, {size} px, {workers} workers: {ratio:.2f}x images/s per worker{cpu}")
    if args.profile:
        for size in args.sizes:
            profile_samples(records, size, hyp, args.profile, args.cache_ram, args.batch)


def time_train_step(images, targets, nc, steps):
    """Images/s of forward + backward of the n model and its loss on one batch (as train.py does, fp32 CPU)."""
    model = YOLO("n", nc).train().to(memory_format=torch.channels_last)  # as train.py runs it
    loss_fn = DetectionLoss(model.head, assignment=assignment_of(model.scale))
    x = (images.float() / 255).contiguous(memory_format=torch.channels_last)
    for _ in range(1):  # warm-up: first-call allocations and kernel selection
        loss_fn(model(x), targets)[0].backward()
    start = time.perf_counter()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss, _ = loss_fn(model(x), targets)
        loss.backward()
    return len(x) * steps / (time.perf_counter() - start)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        help="dataset yaml (its train split is read); default data/shapes.yaml, or with --per-worker the"
        " --shapes-dir set",
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
    parser.add_argument(
        "--per-worker",
        type=int,
        nargs="+",
        metavar="WORKERS",
        help="time only the loader, at each of these worker counts: images/s and images/s per worker",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--per-worker: measure N times, keep the best")
    parser.add_argument(
        "--target-rate",
        type=float,
        default=700,
        help="--per-worker: images/s a GPU consumes (cores = this / per worker)",
    )
    parser.add_argument(
        "--shapes-dir",
        default=str(REPO / "runs" / "bench_dataloader" / "shapes640"),
        help="--per-worker without --data: the shapes set made (once) and read here",
    )
    parser.add_argument("--shapes-n", type=int, default=800, help="--shapes-dir: train images")
    parser.add_argument("--shapes-size", type=int, default=640, help="--shapes-dir: image height in px")
    parser.add_argument("--cache-ram", action="store_true", help="--per-worker: decoded images in RAM (both repos)")
    parser.add_argument(
        "--peer-python",
        nargs="?",
        const="",
        help="--per-worker: also time Ultralytics' loader with this interpreter (the flag alone: $PEER_PYTHON)",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="--per-worker: cProfile N of our samples")
    args = parser.parse_args()
    if args.peer_python is not None:  # given, even empty ("$PEER_PYTHON" unset): a path that exists, or a sentence
        args.peer_python = find_peer_python(args.peer_python)
    return args


def train_sources(args, tmp):
    """(train image folders, number of classes): a shapes set generated in tmp (--tmp-shapes) or in --shapes-dir
    (--per-worker without --data), else --data's train split."""
    if args.tmp_shapes:
        root = make_shapes(Path(tmp.name) / "shapes", n_train=args.tmp_shapes, n_val=0)
        return [root / "images" / "train"], 6
    if args.per_worker and not args.data:
        root = make_shapes(args.shapes_dir, n_train=args.shapes_n, n_val=0, size=args.shapes_size)
        return [Path(root).resolve() / "images" / "train"], 6
    data = load_dataset_yaml(args.data or REPO / "data" / "shapes.yaml")
    return data["train"], data["nc"]


def loader_against_step(args, records, nc):
    """The default mode: loader images/s and training-step images/s at each size, then the table of both."""
    hyp = dict(DEFAULTS)
    print(machine())
    print(
        f"{len(records)} train images | loader: {args.workers} workers, batch {args.batch}, mosaic {hyp['mosaic']}"
        f" | step: model n, batch {args.batch}, forward + backward"
    )
    rows = []
    for size in args.sizes:
        loader_rate, (images, targets), _ = time_loader(
            TrainDataset(records, size, hyp, seed=0), args.batch, args.workers, args.warmup, args.batches
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


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the verification totals
    fix_cv2_and_file_limits()
    if args.threads:
        torch.set_num_threads(args.threads)
    # held until main returns: a --tmp-shapes set lives in it, and the loader workers read the images from there
    tmp = tempfile.TemporaryDirectory() if args.tmp_shapes else None
    sources, nc = train_sources(args, tmp)
    records = load_verified(sources, nc, "train")
    if args.per_worker:
        args.nc = nc
        if args.peer_python and len(sources) != 1:
            raise SystemExit("error: --peer-python needs a train split that is one folder of images")
        return per_worker(args, records, sources[0])
    loader_against_step(args, records, nc)


if __name__ == "__main__":
    main()
