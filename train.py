"""Train a YOLO detector. One loop, top to bottom; each trick sits where it acts, with the reason.

    python train.py                                         # the n model on the built-in shapes set
    python train.py --data coco.yaml --model s --batch 64 --device 0
    python train.py --data mydata.yaml --model yolo11n.pt            # fine-tune Ultralytics' COCO weights
    torchrun --nproc_per_node 8 train.py --data coco.yaml --batch 256
    python train.py --resume                                # newest runs/train/*/weights/last.pt

Hyperparameters live in the HYP table below; every entry is also a flag (--lr0 0.02).
"""

import argparse
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from tqdm import tqdm

from models.yolo import SCALES, YOLO, class_width, count_gflops, count_parameters, load_matching
from utils.autobatch import batch_from_memory, too_large_batch
from utils.checkpoint import (
    FORMAT,
    CheckpointError,
    checkpoint_weights,
    load_checkpoint,
    load_resume_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from utils.data import (
    EpochBatchSampler,
    TrainDataset,
    ValDataset,
    fix_cv2_and_file_limits,
    make_loader,
    multi_scale_max,
    multi_scale_size,
)
from utils.dataset_yaml import DatasetError, load_dataset_yaml
from utils.distributed import amp_dtype_for, any_rank, barrier, node_share, realign_ddp, setup_distributed, wrap_ddp
from utils.ema import ModelEMA, unwrap
from utils.evaluate import evaluate, format_table
from utils.general import (
    abort_run,
    apply_dataset_defaults,
    default_workers,
    explicit_flags,
    install_crash_handler,
    next_run_dir,
    seed_everything,
    setup_logging,
    start_results_csv,
)
from utils.images import cache_images
from utils.labels import load_verified, single_class
from utils.loss import DetectionLoss
from utils.optim import accumulation_windows, build_optimizer, load_optimizer_state, optimizer_step, set_learning_rate
from utils.plots import in_background, plot_batch, plot_evaluation, plot_labels, plot_results

# -----------------------------------------------------------------------------------------------
# Hyperparameters (each is also a flag: --lr0 0.02, --close-mosaic 5, ...)
HYP = dict(
    optimizer="auto",  # sgd | adamw | auto = adamw for runs under 10k iterations, sgd otherwise
    lr0=0.0,  # initial learning rate; 0 = the optimizer's usual value (sgd 0.01, adamw 0.002)
    lrf=0.01,  # final learning rate = lr0 * lrf
    schedule="linear",  # linear | cosine decay after warmup
    momentum=0.937,  # SGD momentum / AdamW beta1
    weight_decay=5e-4,  # scaled by (batch * accumulate / nominal_batch)
    warmup_epochs=3.0,  # at least 100 iterations
    warmup_momentum=0.8,
    warmup_bias_lr=0.1,  # biases start high and come down, with adamw too (bench/RESULTS.md: recipe ablation)
    nominal_batch=64,  # gradients are accumulated until a step has seen this many images
    accumulate_warmup=1,  # accumulation ramps from 1 micro-batch to the full count over the warmup (0: off)
    clip_grad=10.0,  # max gradient norm
    box=7.5,  # loss gains
    cls=0.5,
    dfl=1.5,
    tiny_box=8.5,  # assigner: box sides under 8.5 px count as this long when picking anchors (one stride-8 centre)
    hsv_h=0.015,  # augmentation: HSV jitter fractions
    hsv_s=0.7,
    hsv_v=0.4,
    degrees=0.0,  # rotation (+/- deg)
    translate=0.1,  # translation (+/- fraction)
    scale=0.5,  # scale gain (+/-)
    shear=0.0,  # shear (+/- deg)
    flipud=0.0,  # probabilities
    fliplr=0.5,
    mosaic=1.0,
    mosaic_min_area=0.1,  # a box the mosaic cuts to under this fraction of its area is dropped (0: only empty ones)
    mixup=0.0,
    close_mosaic=10,  # no mosaic in the last N epochs: finish on images that look like test images
    ema_decay=0.9999,
    ema_tau=2000,  # EMA decay ramps up over ~tau updates
)
MAX_NONFINITE_STEPS = 5  # optimizer steps in a row with NaN/Inf gradients before the run stops and writes crash/
MAX_OOM_STEPS = 3  # optimizer steps in a row lost to out-of-memory before the run stops (--batch is too large)

# -----------------------------------------------------------------------------------------------
# Command line
# allow_abbrev=False: "--epo 3" must not slip past explicit_flags and be overridden by the dataset's defaults
parser = argparse.ArgumentParser(
    description="Train a YOLO detector", formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False
)
parser.add_argument("--data", default="data/shapes.yaml", help="dataset yaml")
parser.add_argument(
    "--model", default="n", help="YOLOv8 n, s, m, l, x; YOLO11 11n .. 11x; or a .pt (ours or Ultralytics'): its model"
)
parser.add_argument("--weights", default="", help="initialise from this .pt, ours or Ultralytics' (tensors that match)")
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument(
    "--batch", type=int, default=16, help="total batch size over all GPUs; -1: from the free GPU memory (one GPU)"
)
parser.add_argument("--imgsz", type=int, default=640, help="training image size")
parser.add_argument(
    "--device", default="", help="cpu, 0, or under torchrun 0,1,2,3 (one GPU per process; default: GPU LOCAL_RANK)"
)
parser.add_argument(
    "--workers",
    type=int,
    default=None,
    help="data-loader processes per rank (default: the CPU cores per rank, at most 8)",
)
parser.add_argument("--out", default="", help="run folder (default runs/train/exp, exp2, ...)")
parser.add_argument("--resume", nargs="?", const=True, default=False, help="resume from last.pt (newest if no path)")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--deterministic", action="store_true", help="deterministic algorithms (exact resume on CPU)")
parser.add_argument("--subset", type=int, default=0, help="use only the first N train and val images (debugging)")
parser.add_argument(
    "--fraction", type=float, default=1.0, help="train on this fraction of the training images (the first ones)"
)
parser.add_argument("--single-cls", action="store_true", help="train every class as one class, 'object'")
parser.add_argument(
    "--patience", type=int, default=100, help="stop when mAP50-95 has not improved for N epochs (0: never)"
)
parser.add_argument(
    "--cache", nargs="?", const="ram", default="", choices=["", "ram"], help="keep decoded images in RAM"
)
parser.add_argument("--multi-scale", action="store_true", help="vary the image size +/-50%% per iteration")
parser.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across GPUs (DDP)")
parser.add_argument(
    "--accumulate", type=int, default=0, help="micro-batches per optimizer step; 0 = reach nominal_batch"
)
parser.add_argument(
    "--amp", action=argparse.BooleanOptionalAction, default=None, help="mixed precision (default: on for CUDA)"
)
parser.add_argument(
    "--amp-dtype",
    default="auto",
    choices=["auto", "bf16", "fp16"],
    help="auto: bf16 on CPUs and GPUs of compute capability 8.0+, else fp16 with loss scaling",
)
parser.add_argument(
    "--freeze", default="", help="comma-separated parameter-name prefixes to freeze, e.g. stem,down2,stage2"
)
parser.add_argument("--save-every", type=int, default=0, help="also save last.pt every N iterations")
parser.add_argument("--val-every", type=int, default=1, help="validate every N epochs (and after the last)")
parser.add_argument("--benchmark", type=int, default=0, help="train N iterations, print images/s, exit")
parser.add_argument("--profile", action="store_true", help="write a torch profiler trace of a few steps")
parser.add_argument(
    "--checkpoint-activations", action="store_true", help="recompute activations in backward to save memory"
)
parser.add_argument("--compile", action="store_true", help="torch.compile the model (see README: when it pays)")
for key, value in HYP.items():
    names = [f"--{key}"] + ([f"--{key.replace('_', '-')}"] if "_" in key else [])
    parser.add_argument(*names, dest=key, type=type(value), default=value, help="hyperparameter")
args = parser.parse_args()
given_flags = explicit_flags(parser, sys.argv[1:])

# -----------------------------------------------------------------------------------------------
# Set-up: resume, devices, run folder, logging
fix_cv2_and_file_limits()  # pitfalls D6-D7: file descriptors and cv2's threads (and again in every data-loader worker)
checkpoint = None
if args.resume:
    try:
        path, checkpoint = load_resume_checkpoint(args.resume if isinstance(args.resume, str) else None)
    except CheckpointError as e:
        sys.exit(f"--resume: {e}")
    # The run continues with the arguments it was started with; only where and how it runs may change
    # (another machine: its devices, its cores, the AMP its GPU supports, the batch its GPUs fit).
    changeable = ["device", "workers"] + [k for k in ("amp", "amp_dtype", "batch") if k in given_flags]
    where = {k: getattr(args, k) for k in changeable}
    args = argparse.Namespace(**{**vars(parser.parse_args([])), **checkpoint["args"], **where, "resume": path})
    args.out = str(Path(path).parents[1])

device, rank, local_rank, world_size, flags_group = setup_distributed(args.device)
is_main = rank == 0
if checkpoint is not None:
    # Resumed on another number of GPUs: each keeps the images it had (the total would put several GPUs' worth
    # on each, and run out of memory), unless --batch says otherwise. Steps keep their size through the
    # accumulation; the schedule continues, though not bitwise as on the original GPUs.
    saved_batch = checkpoint["args"]["batch"]
    if "batch" not in given_flags:
        args.batch = saved_batch // checkpoint.get("world_size", world_size) * world_size
    if args.accumulate and args.batch != saved_batch:
        args.accumulate = max(1, round(args.accumulate * saved_batch / args.batch))
node = node_share(local_rank, world_size)  # this machine's processes: they share its cores and the RAM cache
if args.workers is None:  # every core feeds the GPUs: the processes of this node share them
    args.workers = default_workers(node.local_world_size, most=8)
seed_everything(args.seed + rank, args.deterministic)  # per-rank seeds; the data's randomness is per sample
if is_main:
    run_dir = Path(args.out) if args.out else next_run_dir("runs/train/exp")
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
if world_size > 1:  # every rank writes nothing, but all must agree on the folder
    shared = [str(run_dir) if is_main else None]
    dist.broadcast_object_list(shared, src=0)
    run_dir = Path(shared[0])
args.out = str(run_dir)
last_pt = run_dir / "weights" / "last.pt"
log = setup_logging(run_dir / "train.log" if is_main else None, rank)
crash_context = {"args": vars(args), "epoch": None, "iteration": None, "last_checkpoint": None, "batch": None}
if is_main:
    install_crash_handler(run_dir, crash_context)  # any uncaught exception writes crash/ first

# -----------------------------------------------------------------------------------------------
# Data (rank 0 verifies the labels and writes the cache; the others then read it)
try:
    if not is_main:
        barrier(world_size, flags_group)
    data = load_dataset_yaml(args.data)
    train_records = load_verified(data["train"], data["nc"], "train", default_workers(node.local_world_size))
    val_records = load_verified(data["val"], data["nc"], "val", default_workers(node.local_world_size))
    if is_main:
        barrier(world_size, flags_group)
    if checkpoint is None:  # a resumed run keeps the settings it started with
        apply_dataset_defaults(args, parser, data, given_flags)
except DatasetError as e:
    sys.exit(f"error: {e}")
if args.subset:
    train_records, val_records = train_records[: args.subset], val_records[: args.subset]
if not 0 < args.fraction <= 1:
    sys.exit(f"--fraction {args.fraction} must be in (0, 1]")
train_records = train_records[: max(1, round(len(train_records) * args.fraction))]
names, nc = data["names"], data["nc"]
if args.single_cls:  # one class "object": a detector of where things are, whatever they are
    names, nc, train_records, val_records = ["object"], 1, single_class(train_records), single_class(val_records)
if not args.model.endswith(".pt") and args.model not in SCALES:
    sys.exit(f"error: --model {args.model}: give one of {', '.join(SCALES)} or a .pt file")
if args.imgsz % 32:
    sys.exit(f"--imgsz {args.imgsz} must be a multiple of 32 (the largest stride)")

# -----------------------------------------------------------------------------------------------
# Model, EMA, optimizer, loss
init_from = args.model if args.model.endswith(".pt") else args.weights
try:  # ours or an Ultralytics .pt (read without running code from it: utils/ultralytics_checkpoint.py)
    source = load_checkpoint(init_from) if init_from and checkpoint is None else None  # a resume has its own
except CheckpointError as e:
    sys.exit(f"error: {e}")
scale = checkpoint["scale"] if checkpoint else source["scale"] if args.model.endswith(".pt") else args.model
# The class branch keeps the width of the weights it starts from (or resumes): with another class count,
# all but its last convs then transfer.
start = source or checkpoint
cls_width = class_width(checkpoint_weights(start)) if start else 0
model = YOLO(scale, nc, checkpoint_activations=args.checkpoint_activations, cls_width=cls_width)
if source:
    fresh, total = load_matching(model, checkpoint_weights(source)), len(model.state_dict())
    log.info(
        f"initialised {total - len(fresh)}/{total} tensors from {init_from} "
        f"({source.get('source', 'this repo')}, model {source['scale']}, {source['nc']} classes)"
        + (f"; starting fresh: {', '.join(fresh[:6])}{' ...' * (len(fresh) > 6)}" if fresh else "")
    )
for name, p in model.named_parameters():
    p.requires_grad_(not any(name.startswith(prefix) for prefix in args.freeze.split(",") if prefix))
# channels_last: the layout oneDNN (CPU) and cuDNN tensor cores (AMP) run convolutions fastest in
# (~12% per step on a 2-core CPU)
model.to(device, memory_format=torch.channels_last)
if args.sync_bn and world_size > 1 and device.type == "cpu":
    log.warning("--sync-bn: torch's SyncBatchNorm has no CPU kernel; each process keeps its own BN statistics")
elif args.sync_bn and world_size > 1:
    # pitfall M3: torch's own, current SyncBN (older ones had bugs)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
ema = ModelEMA(model, args.ema_decay, args.ema_tau) if is_main else None  # rank 0 alone validates and saves it

use_amp = args.amp if args.amp is not None else device.type == "cuda"
amp_dtype = amp_dtype_for(device, args.amp_dtype)  # auto: bf16 where the hardware has it, else fp16
if args.batch == -1:  # measured on the GPU (utils/autobatch.py)
    amp = amp_dtype if use_amp else None
    largest = multi_scale_max(args.imgsz) if args.multi_scale else args.imgsz
    args.batch = batch_from_memory(model, largest, device, amp, world_size, default=parser.get_default("batch"))
if args.batch < 1 or args.batch % world_size:
    sys.exit(
        f"--batch {args.batch} must be positive and divisible by the number of processes ({world_size}), "
        "or -1 (from free GPU memory)"
    )
batch = args.batch // world_size  # --batch is the total over all GPUs
accumulate = args.accumulate or max(round(args.nominal_batch / args.batch), 1)

# Adam-style for short runs, SGD for long ones, as Ultralytics' "auto"; it counts optimizer steps (batches of
# max(batch, nominal_batch)), this counts batches: SGD from 4x shorter runs at batch 16 (unmeasured; see RESULTS.md)
if args.optimizer == "auto":
    args.optimizer = "adamw" if args.epochs * -(-len(train_records) // args.batch) < 10_000 else "sgd"
args.lr0 = args.lr0 or {"sgd": 0.01, "adamw": 0.002}[args.optimizer]
weight_decay = args.weight_decay * args.batch * accumulate / args.nominal_batch
optimizer = build_optimizer(model, args.optimizer, args.lr0, args.momentum, weight_decay)
hyp = {k: getattr(args, k) for k in HYP}
if is_main:  # every setting as this run resolved it: flags, dataset defaults, optimizer choice
    (run_dir / "args.yaml").write_text(yaml.safe_dump(vars(args), sort_keys=False))

# The loss scale goes into the checkpoint (pitfall T1: else a resumed run searches the scale again);
# bf16 has fp32's range and needs no scaling.
scaler = torch.amp.GradScaler(device.type, enabled=use_amp and amp_dtype == torch.float16)
loss_fn = DetectionLoss(model.head, args.box, args.cls, args.dfl, tiny_box=args.tiny_box)

start_epoch, start_iteration, best_fitness, best_epoch = 0, 0, -1.0, 0
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
    if ema:
        ema.ema.load_state_dict(checkpoint["ema"])
        ema.updates = checkpoint["ema_updates"]
    load_optimizer_state(optimizer, checkpoint["optimizer"])
    if checkpoint["scaler"]:  # empty when saved without fp16: a run resumed in fp16 then starts a new loss scale
        scaler.load_state_dict(checkpoint["scaler"])
    # the iteration counts batches of the saved size: the same images seen, in batches of this run's
    start_epoch, start_iteration = checkpoint["epoch"], checkpoint["iteration"] * saved_batch // args.batch
    best_fitness, best_epoch = checkpoint["best_fitness"], checkpoint.get("best_epoch", start_epoch)  # --patience
    set_rng_states(checkpoint["rng"])
    log.info(f"resuming {args.resume} at epoch {start_epoch}, iteration {start_iteration}")
if world_size > 1:
    model = wrap_ddp(model, device)
if args.compile:  # after DDP: torch's DDP optimizer then splits the graph at the gradient buckets
    model = torch.compile(model)

# every rank calls it (collectives); the processes of a machine map one copy
train_cache = cache_images(train_records, args.imgsz, share=node) if args.cache == "ram" else None
train_set = TrainDataset(
    train_records,
    args.imgsz,
    hyp,
    args.seed,
    mosaic_epochs=args.epochs - args.close_mosaic,
    cache=train_cache,
)
sampler = EpochBatchSampler(len(train_set), batch, args.seed, rank, world_size, start_epoch, start_iteration)
# pinned: async copies
train_loader = make_loader(train_set, sampler, workers=args.workers, pin_memory=device.type == "cuda")
batches = iter(train_loader)  # one iterator for the whole run: workers live as long as the run
if is_main:
    val_cache = cache_images(val_records, args.imgsz) if args.cache == "ram" else None  # rank 0 alone validates
    val_set = ValDataset(val_records, args.imgsz, batch * 2, cache=val_cache)
    val_loader = make_loader(val_set, batch_size=batch * 2, workers=args.workers, pin_memory=device.type == "cuda")
nb = len(sampler)
# Look before training: shifted, swapped or mislabelled boxes show in labels.jpg (drawn in a thread).
if is_main and checkpoint is None:
    in_background(plot_labels, train_records, names, run_dir / "labels.jpg")
warmup_iterations = max(round(args.warmup_epochs * nb), 100) if args.warmup_epochs > 0 else 0
log.info(
    f"model {scale}: {count_parameters(unwrap(model)) / 1e6:.2f} M parameters, "
    f"{count_gflops(unwrap(model), 640):.1f} GFLOPs at 640 | "
    f"{len(train_records)} train / {len(val_records)} val images, {nc} classes | "
    f"{args.epochs} epochs at {args.imgsz} px, "
    f"batch {args.batch} x accumulate {accumulate}{' (from 1 over the warmup)' * bool(args.accumulate_warmup)} | "
    f"{args.optimizer} lr0 {args.lr0} | {device}"
    + (f" x {world_size} processes" if world_size > 1 else "")
    + (f" | amp {str(amp_dtype).split('.')[-1]}" if use_amp else "")
    + f" | {args.workers} loader workers"
)


# What rebuilds the model without the training command; last.pt and best.pt both start with it
checkpoint_header = {"format": FORMAT, "scale": scale, "nc": nc, "names": names, "imgsz": args.imgsz}


def training_state(epoch, iteration):
    """last.pt: everything an exact resume needs. Plain tensors and numbers only (weights_only)."""
    return {
        **checkpoint_header,
        "model": unwrap(model).state_dict(), "ema": ema.ema.state_dict(), "ema_updates": ema.updates,
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
        "epoch": epoch, "iteration": iteration, "best_fitness": best_fitness, "best_epoch": best_epoch,
        "rng": rng_states(), "args": vars(args), "world_size": world_size,
    }  # fmt: skip


def save_last(epoch, iteration):
    """Rank 0: last.pt, written atomically, and its path in the crash context."""
    save_checkpoint(training_state(epoch, iteration), last_pt)
    crash_context["last_checkpoint"] = str(last_pt)


stop_requested = False


def request_stop(signum, frame):
    """SIGTERM (cluster pre-emption) or Ctrl+C: finish the step, save last.pt, exit 0.
    A second Ctrl+C stops at once."""
    global stop_requested
    if stop_requested and signum == signal.SIGINT:
        raise KeyboardInterrupt
    stop_requested = True
    log.warning(f"{signal.Signals(signum).name}: stopping after this step (last.pt will be saved)")


signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)
results_csv = run_dir / "results.csv"
columns = "epoch box_loss cls_loss dfl_loss precision recall mAP50 mAP50-95 lr seconds".split()
columns += ["assign_on_cpu", "oom_skipped_steps", "nonfinite_skipped_steps"]  # faults, counted per epoch
if is_main:  # a resumed run keeps its rows up to its last save (a killed run may have written more)
    start_results_csv(results_csv, columns, start_epoch if checkpoint else None)
try:
    from torch.utils.tensorboard import SummaryWriter  # optional: scalars when tensorboard is installed

    tensorboard = SummaryWriter(str(run_dir)) if is_main else None
except ImportError:
    tensorboard = None
profiler = None
if args.profile and is_main:
    profiler = torch.profiler.profile(
        # once: repeat=0 would rewrite the trace every 5 steps
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(run_dir / "profile_trace.json")),
        record_shapes=True,
    )
    profiler.start()

# -----------------------------------------------------------------------------------------------
# The loop
nonfinite_in_a_row, oom_in_a_row, pending_save, benchmark_start = 0, 0, False, None
for epoch in range(start_epoch, args.epochs):
    model.train()
    epoch_start = time.time()
    first = start_iteration if epoch == start_epoch else 0
    # Loss parts are summed on the device, per accumulation window, and read once per optimizer step.
    sums, window_sums = torch.zeros(3, device=device), torch.zeros(3, device=device)
    faults = dict(assign_on_cpu=0, oom_skipped_steps=0, nonfinite_skipped_steps=0)
    batches_done, window_batches, window_dropped = 0, 0, False
    assignments_on_cpu_before = loss_fn.assignments_on_cpu
    lr = optimizer.param_groups[-1]["lr"]  # (a run resumed at the very end of an epoch trains no step in it)
    windows = accumulation_windows(epoch, nb, accumulate, warmup_iterations, args.accumulate_warmup)
    if epoch == args.epochs - args.close_mosaic and is_main and hyp["mosaic"] > 0:
        log.info(f"epoch {epoch + 1}: mosaic off for the last {args.close_mosaic} epochs")
    progress = tqdm(
        range(first, nb),
        desc=f"{epoch + 1}/{args.epochs}",
        disable=not is_main,
        dynamic_ncols=True,
        initial=first,
        total=nb,
    )
    for i in progress:
        images, targets = next(batches)
        iteration = epoch * nb + i
        crash_context.update(epoch=epoch, iteration=i, batch={"images": images, "targets": targets})
        lr = set_learning_rate(optimizer, iteration, epoch, hyp, args.epochs, warmup_iterations)
        # The augmented batches as the model sees them, boxes and names drawn (in a thread).
        if is_main and iteration < 3 and not args.benchmark:
            in_background(plot_batch, images.clone(), targets.clone(), names, run_dir / f"train_batch{iteration}.jpg")
        # pitfall D3: uint8 RGB -> 0..1, last, on the device
        images = images.to(device, non_blocking=True).float().div_(255).contiguous(memory_format=torch.channels_last)
        targets = targets.to(device)
        if args.multi_scale:  # a multiple of 32, and a pure function of (seed, iteration): all ranks agree (pitfall M4)
            size = multi_scale_size(args.imgsz, args.seed, iteration)
            if size != images.shape[-1]:
                targets[:, 2:] *= size / images.shape[-1]
                images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
        last_micro_step = i in windows

        # Forward under autocast; the loss in fp32 (utils/loss.py, which also redoes the label assignment
        # on the CPU when that alone runs out of memory). Out of memory in the forward or the backward
        # (the activations: --batch too large) drops the rest of this accumulation window.
        # pitfall M5: under DDP only the last micro-step of an accumulation all-reduces gradients.
        sync = contextlib.nullcontext() if world_size == 1 or last_micro_step else model.no_sync()
        if not window_dropped:
            try:
                with sync, torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
                    maps = model(images)
                loss, parts = loss_fn(maps, targets)
            except torch.OutOfMemoryError:
                window_dropped = True
        if last_micro_step:  # the backward below all-reduces: every rank runs it, or none does
            window_dropped, stop = any_rank([window_dropped, stop_requested], world_size, flags_group)
        if not window_dropped:
            try:
                scaler.scale(loss * world_size).backward()  # DDP averages over ranks; undo that
                window_sums += parts
                window_batches += 1
            except torch.OutOfMemoryError:
                # Under DDP the other ranks are inside this backward's all-reduce: there is no way back.
                if world_size > 1 and last_micro_step:
                    raise
                window_dropped = True
        maps = loss = None  # out of the except blocks: a failed step's graph is really released here
        if window_dropped and device.type == "cuda":
            torch.cuda.empty_cache()

        if last_micro_step:
            # One decision per optimizer step, the same on every rank: the window was dropped (agreed
            # above), or its gradient norm, all-reduced by DDP by now, is NaN/Inf, or the step is taken.
            if window_dropped:
                if world_size > 1:
                    realign_ddp(model, device)
                optimizer.zero_grad(set_to_none=True)  # half-accumulated gradients are not a step
                faults["oom_skipped_steps"] += 1
                oom_in_a_row += 1
                log.warning(f"out of memory at epoch {epoch + 1} iteration {i}: step skipped ({oom_in_a_row} in a row)")
                if oom_in_a_row >= MAX_OOM_STEPS:
                    why = too_large_batch(
                        oom_in_a_row, args.batch, world_size, images.shape[-1], args.checkpoint_activations
                    )
                    abort_run(run_dir, why, crash_context, is_main)
            elif optimizer_step(model, optimizer, scaler, args.clip_grad):
                if ema:
                    ema.update(model)
                sums += window_sums
                batches_done += window_batches
                nonfinite_in_a_row = oom_in_a_row = 0
            else:
                faults["nonfinite_skipped_steps"] += 1
                nonfinite_in_a_row, oom_in_a_row = nonfinite_in_a_row + 1, 0
                note = f"; fp16 loss scale now {scaler.get_scale():g}" if scaler.is_enabled() else ""
                log.warning(
                    f"NaN/Inf gradients at epoch {epoch + 1} iteration {i}: optimizer step skipped "
                    f"({nonfinite_in_a_row} in a row{note})"
                )
                # fp16: the loss scale starts at 2^16 and halves on each overflow; up to 16 such steps are
                # its search, not a fault.
                if nonfinite_in_a_row >= MAX_NONFINITE_STEPS + (16 if scaler.is_enabled() else 0):
                    why = f"stopping: {nonfinite_in_a_row} optimizer steps in a row with NaN/Inf gradients"
                    abort_run(run_dir, why, crash_context, is_main)
            window_sums.zero_()
            window_batches, window_dropped = 0, False
            # Saving and stopping happen only here, between optimizer steps, so that no accumulated
            # gradient is lost: the saved state is exactly what an uninterrupted run has.
            pending_save |= bool(args.save_every) and (i + 1) % args.save_every < windows[i]
            if stop:
                if is_main:
                    save_last(epoch, i + 1)
                    log.info(f"saved {last_pt} at epoch {epoch + 1} iteration {i + 1}; resume with --resume")
                sys.exit(0)
            if pending_save and is_main:
                save_last(epoch, i + 1)
            pending_save = False
            if is_main:
                means = (sums / max(batches_done, 1)).tolist()
                memory = torch.cuda.memory_reserved(device) / 2**30 if device.type == "cuda" else 0
                rate = (i + 1 - first) * args.batch / (time.time() - epoch_start)
                progress.set_postfix_str(
                    f"box {means[0]:.3f} cls {means[1]:.3f} dfl {means[2]:.3f} lr {lr:.2e} "
                    f"mem {memory:.1f}G {rate:.1f} img/s"
                )

        if profiler:  # per micro-step, so that a trace is written even when an epoch has few optimizer steps
            profiler.step()
        if args.benchmark:  # images/s over N iterations after 2 warm-up iterations
            if iteration == 2:
                benchmark_start = time.time()
            if iteration == args.benchmark + 2:
                seconds = time.time() - benchmark_start
                progress.close()
                print(
                    f"benchmark: {args.benchmark * args.batch / seconds:.2f} images/s "
                    f"({seconds / args.benchmark * 1000:.0f} ms/iteration, batch {args.batch}, "
                    f"{args.imgsz} px, {device})"
                )
                sys.exit(0)
    if profiler:
        profiler.stop()
        profiler = None

    # End of epoch: rank 0 validates the EMA model and saves; the others wait.
    final_epoch = epoch == args.epochs - 1
    if is_main:
        metrics = {"precision": float("nan"), "recall": float("nan"), "mAP50": float("nan"), "mAP50-95": float("nan")}
        if (epoch + 1) % args.val_every == 0 or final_epoch:
            # The per-epoch number only picks best.pt and fills results.csv: fp16 on CUDA and the vectorised
            # mAP (utils/evaluate.py fast_map); the final one below is fp32 and pycocotools'
            half = device.type == "cuda"
            metrics = evaluate(ema.ema, val_loader, names, device, half=half, fast=True)["metrics"]
            fitness = metrics["mAP50-95"]
            if fitness > best_fitness:
                best_fitness, best_epoch = fitness, epoch + 1
                best = {
                    **checkpoint_header,
                    "model": ema.ema.state_dict(), "epoch": epoch + 1, "metrics": metrics, "args": vars(args),
                }  # fmt: skip
                save_checkpoint(best, run_dir / "weights" / "best.pt")  # deployable: EMA weights, no optimizer
        losses = (sums / max(batches_done, 1)).tolist()
        faults["assign_on_cpu"] = loss_fn.assignments_on_cpu - assignments_on_cpu_before
        scores = [metrics[k] for k in ("precision", "recall", "mAP50", "mAP50-95")]
        row = [epoch + 1, *losses, *scores, lr, time.time() - epoch_start, *faults.values()]
        with results_csv.open("a") as f:
            f.write(",".join(f"{v:.5g}" if isinstance(v, float) else str(v) for v in row) + "\n")
        plot_results(results_csv, run_dir / "results.png")
        if tensorboard:
            for column, value in zip(columns[1:], row[1:]):
                tensorboard.add_scalar(column, value, epoch + 1)
        log.info(
            f"epoch {epoch + 1}/{args.epochs}: box {losses[0]:.3f} cls {losses[1]:.3f} dfl {losses[2]:.3f} | "
            f"P {metrics['precision']:.3f} R {metrics['recall']:.3f} "
            f"mAP50 {metrics['mAP50']:.3f} mAP50-95 {metrics['mAP50-95']:.3f} | {time.time() - epoch_start:.0f} s"
            + "".join(f" | {k.replace('_', ' ')} {v}" for k, v in faults.items() if v)
        )
        save_last(epoch + 1, 0)
    # --patience: rank 0 saw the fitness; the vote is also the barrier where the other ranks wait for it
    patience_over = is_main and args.patience > 0 and epoch + 1 - best_epoch >= args.patience and not final_epoch
    if any_rank([patience_over], world_size, flags_group)[0]:
        log.info(
            f"stopping early: no better mAP50-95 in {args.patience} epochs (--patience); "
            f"the best was epoch {best_epoch}"
        )
        break

# -----------------------------------------------------------------------------------------------
# After training: evaluate best.pt once more with plots, and write metrics.json
if is_main:
    best = load_checkpoint(run_dir / "weights" / "best.pt")
    ema.ema.load_state_dict(best["model"])
    result = evaluate(ema.ema, val_loader, names, device, data["coco_json"])
    log.info(f"best.pt (epoch {best['epoch']}):\n" + format_table(result, names))
    (run_dir / "metrics.json").write_text(json.dumps(result["metrics"], indent=2))
    best_f1_confidence = plot_evaluation(result, ema.ema, val_loader, names, run_dir, device)
    log.info(f"best F1 at confidence {best_f1_confidence:.3f} (F1_curve.png; detect.py --conf)")
    log.info(f"done in {run_dir}: weights/best.pt, weights/last.pt, results.csv, results.png")
if world_size > 1:
    dist.destroy_process_group()
