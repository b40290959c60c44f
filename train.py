"""Train a YOLO detector. One loop, top to bottom; each trick sits where it acts, with the reason.

    python train.py                                         # the n model on the built-in shapes set
    python train.py --data coco.yaml --model s --batch 64 --device 0
    python train.py --data mydata.yaml --model yolo11n.pt     # fine-tune Ultralytics' COCO weights (fetched by name)
    torchrun --nproc_per_node 8 train.py --data coco.yaml --batch 256
    python train.py --resume                                # newest runs/train/*/weights/last.pt

In order: the command line (every hyperparameter of utils/hyperparameters.py is also a flag: --lr0 auto); Settings,
resolved once (resume, devices, the dataset's defaults, --batch -1, the optimizer; each value that is not --help's
default is printed with its source and written so in args.yaml; after that args is read-only);
the model, EMA, optimizer, loss; the Loop state (what last.pt saves, restored on resume) beside training_state;
the data loaders; a micro-step's pieces (forward_loss, backward, skip_step); the loop (Warmup,
Forward/Backward, Step, Save/stop, Log; then validation and results.csv); the final evaluation. Helpers: utils/.
"""

import argparse
import contextlib
import json
import math
import sys
import time

import torch
from tqdm import tqdm

from models.teacher import load_teacher
from models.weights import architecture, class_width, initialise_from, run_files
from models.yolo import YOLO, assignment_of, count_gflops, count_parameters
from utils import mlflow_logging, monitor, settings  # MLflow; results.csv, TensorBoard, progress; settings resolved
from utils.autobatch import batch_from_memory
from utils.checkpoints.ours import FORMAT, load_checkpoint, restore_training_state, rng_states, save_checkpoint
from utils.data.dataset_yaml import DatasetError, load_dataset_yaml
from utils.data.images import cache_images
from utils.data.labels import MAX_PIXELS, load_verified, select_records
from utils.data.loader import (
    EpochBatchSampler,
    TrainDataset,
    ValDataset,
    batch_to_device,
    fix_cv2_and_file_limits,
    make_loader,
    multi_scale_max,
    multi_scale_size,
)
from utils.distributed import (
    amp_settings,
    any_rank,
    barrier,
    leave_together,
    make_run_dir,
    node_share,
    setup_distributed,
    sync_batchnorm,
    teacher_dtype_for,
    wrap_ddp,
)
from utils.ema import ModelEMA, unwrap
from utils.evaluate import FITNESS, epoch_metrics, evaluate, format_table
from utils.faults import StopRequest, abort_run, install_crash_handler, realign_ddp, too_large_batch
from utils.general import seed_everything, setup_logging, write_run_file
from utils.hyperparameters import HYP, flag_type  # the learning-rate, loss and augmentation table: each a flag
from utils.loss import DetectionLoss, resolve_class_weights
from utils.optim import accumulation_windows, build_optimizer, optimizer_step, set_learning_rate
from utils.plots import LatestOnly, in_background, plot_batch, plot_evaluation, plot_labels, plot_results

MAX_NONFINITE_STEPS = 5  # optimizer steps in a row with NaN/Inf gradients before the run stops and writes crash/
MAX_OOM_STEPS = 3  # optimizer steps in a row lost to out-of-memory before the run stops (--batch is too large)
FAULTS = ("assign_on_cpu", "oom_skipped_steps", "nonfinite_skipped_steps")

# -----------------------------------------------------------------------------------------------
# Command line
# allow_abbrev=False: "--epo 3" must not slip past explicit_flags and be overridden by the dataset's defaults
parser = argparse.ArgumentParser(
    description="Train a YOLO detector",
    epilog=settings.help_epilog(),  # what changes a default, and the tables of what each `auto` becomes
    formatter_class=settings.HelpFormatter,
    allow_abbrev=False,
)
add = parser.add_argument
add("--data", default="data/shapes.yaml", help="dataset yaml, a Darknet / CVAT obj.data, or an export's folder")
add("--model", default="n", help="YOLOv8 n..x, YOLO11 11n..x, YOLO26 26n..x, NMS-free 11n-e2e; .pt: ours, Ultralytics'")
add("--weights", default="", help="initialise from this .pt, ours or Ultralytics' or yolo11n.pt (tensors that match)")
add("--teacher", default="", help="distil from this trained .pt, ours or Ultralytics' (docs/training.md)")
add("--scratch-recipe", action="store_true", help="with --weights: keep a scratch run's lr0 (docs/data.md)")
add("--reg-max", type=int, default=0, help="box bins per side: 16 = DFL, 1 = no DFL; 0: the family's (26: 1, else 16)")
add("--epochs", type=int, default=100)
add("--batch", type=int, default=16, help="total batch size over all GPUs; -1: from the free GPU memory (one GPU)")
add("--imgsz", type=int, default=640, help="training image size")
add("--device", default="", help="cpu, 0, or under torchrun 0,1,2,3 (one GPU per process; default: GPU LOCAL_RANK)")
add("--workers", type=int, default=None, help="data-loader processes per rank (default: CPU cores per rank, <= 8)")
add("--out", default="", help="run folder (default runs/train/exp, exp2, ...)")
add("--resume", nargs="?", const=True, default=False, help="resume from last.pt (newest if no path)")
add("--seed", type=int, default=0)
add("--deterministic", action="store_true", help="deterministic algorithms (exact resume on CPU)")
add("--subset", type=int, default=0, help="use only the first N train and val images (debugging)")
add("--fraction", type=float, default=1.0, help="train on this fraction of the training images (the first ones)")
add("--single-cls", action="store_true", help="train every class as one class, 'object'")
add("--max-pixels", type=int, default=MAX_PIXELS, help="exclude images with more pixels (decompression bombs)")
add("--patience", type=int, default=100, help="stop when --fitness has not improved for N epochs (0: never)")
add("--fitness", default="map", choices=FITNESS, help="picks best.pt: mAP50-95, mAP50, or 0.1 mAP50 + 0.9 mAP50-95")
add("--cache", nargs="?", const="ram", default="", choices=["", "ram"], help="keep decoded images in RAM")
add("--multi-scale", action="store_true", help="vary the image size +/-50%% per iteration")
add("--sync-bn", action="store_true", help="SyncBatchNorm across GPUs (DDP)")
add("--accumulate", type=int, default=0, help="micro-batches per optimizer step; 0 = reach --nominal-batch")
add("--amp", action=argparse.BooleanOptionalAction, default=None, help="mixed precision (default: on for CUDA)")
add("--amp-dtype", default="auto", choices=["auto", "bf16", "fp16"], help="auto: bf16 where native, else fp16")
add("--freeze", default="", help="comma-separated parameter-name prefixes to freeze, e.g. stem,down2,stage2")
add("--save-every", type=int, default=0, help="also save last.pt every N iterations")
add("--val-every", type=int, default=1, help="validate every N epochs (and after the last)")
add("--benchmark", type=int, default=0, help="train N iterations, print images/s, exit")
add("--profile", action="store_true", help="write a torch profiler trace of a few steps")
add("--checkpoint-activations", action="store_true", help="recompute activations in backward to save memory")
add("--compile", action="store_true", help="torch.compile the model (docs/training.md: when it pays)")
add("--mlflow", action="store_true", help="log to MLflow: MLFLOW_TRACKING_URI, else a file store beside the run folder")
for key, (value, text) in HYP.items():
    names = [f"--{key}", f"--{key.replace('_', '-')}"] if "_" in key else [f"--{key}"]
    add(*names, dest=key, type=flag_type(key), default=value, help=text)
args = parser.parse_args()
given_flags = settings.explicit_flags(parser, sys.argv[1:])
sources = dict.fromkeys(given_flags, "command line")  # where each value that is not --help's default came from

# -----------------------------------------------------------------------------------------------
# Settings, resolved once: a resumed run's arguments, the devices, the dataset yaml's defaults, the batch, the
# optimizer and its lr0. args.yaml records the result; `args` is not written after it.
fix_cv2_and_file_limits()  # pitfalls D6-D7: file descriptors and cv2's threads (and again in every data-loader worker)
# --resume: the saved arguments, with this machine's devices and workers (and --batch, --amp where given);
# resume_ckpt: the last.pt continued, or None
try:
    args, resume_ckpt = settings.resume_arguments(parser, args, given_flags, sources)
except ValueError as e:  # CheckpointError too
    sys.exit(f"--resume: {e}")
if args.mlflow and not mlflow_logging.mlflow_installed():  # optional: said before anything is written
    sys.exit(mlflow_logging.MLFLOW_MISSING)
init_path, init_ckpt, teacher_path, licence = run_files(args, resume_ckpt, sources)  # checked before any dataset work

device, rank, local_rank, world_size, flags_group = setup_distributed(args.device)
is_main = rank == 0
# resumed on another number of GPUs: the same images per GPU and per optimizer step
args.batch, args.accumulate = settings.resumed_batch(args, resume_ckpt, world_size, "batch" in given_flags)
node = node_share(local_rank, world_size)  # this machine's processes: they share its cores and the RAM cache
if args.workers is None:  # every core feeds the GPUs: the processes of this node share them
    args.workers, sources["workers"] = settings.default_workers(node.local_world_size, most=8), "this machine's cores"
run_dir = make_run_dir(args.out, is_main, world_size)
sources.setdefault("out", "the next free run folder")
args.out = str(run_dir)
log = setup_logging(run_dir / "train.log" if is_main else None, rank)
crash_context = {"args": vars(args), "epoch": None, "iteration": None, "last_checkpoint": None, "batch": None}
if is_main:
    install_crash_handler(run_dir, crash_context)  # any uncaught exception writes crash/ first

try:  # rank 0 verifies the labels and writes the label cache; the others then read it
    if not is_main:
        barrier(world_size, flags_group)
    data = load_dataset_yaml(args.data, run_dir / "data.yaml" if is_main else None)  # a folder: the yaml inferred
    verify_workers = settings.default_workers(node.local_world_size)
    train_records = load_verified(data["train"], data["nc"], "train", verify_workers, max_pixels=args.max_pixels)
    val_records = load_verified(data["val"], data["nc"], "val", verify_workers, max_pixels=args.max_pixels)
    if is_main:
        barrier(world_size, flags_group)
    if not resume_ckpt:  # a resumed run keeps the settings it started with
        settings.apply_dataset_defaults(args, parser, data, given_flags, sources)
    train_records, val_records, names, nc = select_records(
        train_records, val_records, data["names"], args.subset, args.fraction, args.single_cls
    )
except DatasetError as e:
    sys.exit(f"error: {e}")
if args.imgsz % 32:
    sys.exit(f"--imgsz {args.imgsz} must be a multiple of 32 (the largest stride)")
try:  # auto: counted over the training boxes, then kept as numbers (args.yaml, last.pt): a resume weighs the same
    if args.cls_weights == "auto":
        sources["cls_weights"] = "--cls-weights auto: inverse class frequency in the train labels"
    args.cls_weights, class_weights = resolve_class_weights(args.cls_weights, train_records.labels[:, 0], nc)
except ValueError as e:
    sys.exit(f"error: {e}")

# The architecture: the resumed run's, the .pt given as --model's, or a scale. --weights (or a .pt --model)
# initialises the tensors that match (ours or an Ultralytics .pt, read without running code from it).
use_amp, amp_dtype = amp_settings(device, args.amp, args.amp_dtype)  # auto: bf16 where the hardware has it, else fp16
teacher_dtype = teacher_dtype_for(device, use_amp, amp_dtype)  # bf16 on a CPU that has it, even in an fp32 run
try:
    scale, reg_max = architecture(args.model, args.reg_max, resume_ckpt, init_ckpt)
    # --teacher: read once, on every rank, frozen; the run's classes and imgsz; on resume, the file it started with
    resumed_teacher = resume_ckpt.get("teacher") if resume_ckpt else None
    teacher, teacher_record = load_teacher(teacher_path, names, args.imgsz, device, teacher_dtype, resumed_teacher)
except ValueError as e:  # CheckpointError too: one sentence naming the file
    sys.exit(f"error: {e}")

if args.batch == -1:  # measured on the GPU with a model of this run's size (utils/autobatch.py)
    probe = YOLO(scale, nc, args.checkpoint_activations, reg_max=reg_max).to(device, memory_format=torch.channels_last)
    largest, amp = multi_scale_max(args.imgsz) if args.multi_scale else args.imgsz, amp_dtype if use_amp else None
    args.batch = batch_from_memory(probe, largest, device, amp, world_size, parser.get_default("batch"))
    probe, sources["batch"] = None, "--batch -1: measured in the free GPU memory"
if args.batch < 1 or args.batch % world_size:
    sys.exit(f"--batch {args.batch} must be positive and divisible by the {world_size} processes, or -1 (measured)")
batch = args.batch // world_size  # --batch is the total over all GPUs
try:  # each `auto`: utils/hyperparameters.py's tables, by the optimizer, the run's length and whether it fine-tunes
    per_epoch, fine_tuning = math.ceil(len(train_records) / args.batch), bool(init_ckpt) and not args.scratch_recipe
    vars(args).update(settings.resolve_optimizer(args, per_epoch, sources, fine_tuning))
except ValueError as e:
    sys.exit(str(e))
accumulate = args.accumulate or max(round(args.nominal_batch / args.batch), 1)
weight_decay = args.weight_decay * args.batch * accumulate / args.nominal_batch
if is_main:  # every setting as this run resolved it, and where it came from when not --help's default
    log.info(settings.sources_line(parser, args, sources))
    write_run_file(run_dir / "args.yaml", settings.args_yaml(parser, args, sources))

# -----------------------------------------------------------------------------------------------
# Model, EMA, optimizer, loss
seed_everything(args.seed + rank, args.deterministic)  # per-rank seeds; the data's randomness is per sample
# The class branch keeps the width of the weights it starts from (or resumes): with another class count,
# all but its last convs then transfer.
cls_width = class_width(resume_ckpt or init_ckpt) if resume_ckpt or init_ckpt else 0
model = YOLO(scale, nc, checkpoint_activations=args.checkpoint_activations, cls_width=cls_width, reg_max=reg_max)
if init_ckpt:
    log.info(f"{initialise_from(model, init_ckpt, init_path)}; {settings.fine_tuning_choices(args, sources)}")
for name, p in model.named_parameters():
    p.requires_grad_(not any(name.startswith(prefix) for prefix in args.freeze.split(",") if prefix))
model.to(device, memory_format=torch.channels_last)  # oneDNN's and cuDNN's fastest layout
if args.sync_bn and world_size > 1:
    model = sync_batchnorm(model, device)  # pitfall M3: torch's own, current SyncBN
ema = ModelEMA(model, args.ema_decay, args.ema_tau, floor=args.ema_floor) if is_main else None  # rank 0 alone validates
optimizer = build_optimizer(model, args.optimizer, args.lr0, args.momentum, weight_decay)
# fp16 only (bf16 has fp32's range); its scale goes into last.pt (pitfall T1: else a resume searches it again)
scaler = torch.amp.GradScaler(device.type, enabled=use_amp and amp_dtype == torch.float16)
loss_settings = dict(tiny_box=args.tiny_box, class_weights=class_weights, epochs=args.epochs, o2m_final=args.o2m_final)
loss_settings["distill_gain"] = args.distill_gain if teacher else None  # --teacher: a fourth loss part, `distill`
loss_settings["assignment"] = assignment_of(model.scale)  # the one-to-one branch's (YOLO26, 11n-e2e)
loss_fn = DetectionLoss(model.head, args.box, args.cls, args.dfl, **loss_settings)
# results.csv's columns; the loss names its parts (loss_fn.names: box, cls, and dfl, or l1 for a model without DFL)
METRICS = ("precision", "recall", "mAP50", "mAP50-95", *loss_fn.val_columns)
COLUMNS = ("epoch", *loss_fn.columns, *METRICS, "lr", "seconds", *FAULTS)

# -----------------------------------------------------------------------------------------------
# Loop state: what the loop carries from one step to the next. last.pt saves it (training_state, below) and a
# resumed run takes it back here, but for the skip counters, which start again at 0. The loss sums are this epoch's.
start_epoch, start_iteration = 0, 0  # where the loop starts: a resumed run skips what it trained
best_fitness, best_epoch = -1.0, 0  # best.pt and --patience
in_a_row = {"oom": 0, "nonfinite": 0}  # optimizer steps skipped in a row, by cause: too many stop the run
faults = dict.fromkeys(FAULTS, 0)  # this epoch's skipped steps and CPU assignments, by cause (results.csv)
if resume_ckpt:
    restore_training_state(resume_ckpt, model, ema, optimizer, scaler)  # weights, EMA, optimizer, loss scale, RNGs
    # the iteration counts batches of the saved size: the same images seen, in batches of this run's
    start_epoch = resume_ckpt["epoch"]
    start_iteration = resume_ckpt["iteration"] * resume_ckpt["args"]["batch"] // args.batch
    best_fitness, best_epoch = resume_ckpt["best_fitness"], resume_ckpt.get("best_epoch", start_epoch)
    log.info(f"resuming {args.resume} at epoch {start_epoch}, iteration {start_iteration}")
sums, batches_done = monitor.epoch_loss_sums(resume_ckpt if start_iteration else None, len(loss_fn.names), device)

# rebuilds the model; licence: that of the weights the run started from (Ultralytics' licence), else None
checkpoint_header = dict(format=FORMAT, scale=scale, nc=nc, names=names, imgsz=args.imgsz, licence=licence)
last_pt, best_pt = run_dir / "weights" / "last.pt", run_dir / "weights" / "best.pt"


def training_state(epoch, iteration):
    """last.pt: the loop state above, and everything else an exact resume needs (weights, optimizer, loss scale,
    random generators). Plain tensors and numbers only (weights_only)."""
    return {
        **checkpoint_header,
        "model": unwrap(model).state_dict(), "ema": ema.ema.state_dict(), "ema_updates": ema.updates,
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
        "epoch": epoch, "iteration": iteration, "best_fitness": best_fitness, "best_epoch": best_epoch,
        "rng": rng_states(), "args": vars(args), "world_size": world_size, "epoch_sums": [sums.cpu(), batches_done],
        "teacher": teacher_record,
    }  # fmt: skip


def save_last(epoch, iteration):
    """Rank 0: last.pt, written atomically, and its path in the crash context."""
    save_checkpoint(training_state(epoch, iteration), last_pt)
    crash_context["last_checkpoint"] = str(last_pt)


model = wrap_ddp(model, device) if world_size > 1 else model
model = torch.compile(model) if args.compile else model  # after DDP: its optimizer splits the graph at the buckets

# -----------------------------------------------------------------------------------------------
# Data loaders
mosaic_epochs = args.epochs - args.close_mosaic  # --close-mosaic: the last epochs see whole images, like test images
# every rank calls it (collectives); the processes of a machine map one copy
train_cache = cache_images(train_records, args.imgsz, share=node) if args.cache == "ram" else None
train_set = TrainDataset(train_records, args.imgsz, vars(args), args.seed, mosaic_epochs, cache=train_cache)
sampler = EpochBatchSampler(len(train_set), batch, args.seed, rank, world_size, start_epoch, start_iteration)
train_loader = make_loader(train_set, sampler, workers=args.workers, pin_memory=device.type == "cuda")  # async copies
batches = iter(train_loader)  # one iterator for the whole run: workers live as long as the run
if is_main:
    val_cache = cache_images(val_records, args.imgsz) if args.cache == "ram" else None  # rank 0 alone validates
    val_set = ValDataset(val_records, args.imgsz, batch * 2, cache=val_cache)
    val_loader = make_loader(val_set, batch_size=batch * 2, workers=args.workers, pin_memory=device.type == "cuda")
nb = len(sampler)
warmup_iterations = settings.warmup_length(args.warmup_epochs, nb)
# Look before training: shifted, swapped or mislabelled boxes show in labels.jpg (drawn in a thread).
if is_main and not resume_ckpt:
    in_background(plot_labels, train_records, names, run_dir / "labels.jpg")
network = f"model {scale}: {count_parameters(unwrap(model)) / 1e6:.2f} M parameters, "
network += f"{count_gflops(unwrap(model), 640):.1f} GFLOPs@640"
images = f"{len(train_records)} train / {len(val_records)} val images, {nc} classes"
amp_name = str(amp_dtype).split(".")[-1] if use_amp else ""
log.info(
    monitor.run_summary(network, images, args, accumulate, f"{device}", world_size, amp_name, names, class_weights)
)
stop_request = StopRequest()  # SIGTERM / Ctrl+C: save last.pt after this step, exit 0
results_csv, draw_results = run_dir / "results.csv", LatestOnly(plot_results)  # results.png, off the loop
if is_main:  # a resumed run keeps its rows up to its last save (a killed run may have written more)
    monitor.start_results_csv(results_csv, COLUMNS, start_epoch if resume_ckpt else None)
tensorboard = monitor.open_tensorboard(run_dir) if is_main else None
mlflow_run = mlflow_logging.start_mlflow_run(run_dir, vars(args)) if args.mlflow and is_main else None
profiler = monitor.start_profiler(run_dir / "profile_trace.json") if args.profile and is_main else None
benchmark = monitor.Benchmark(args.benchmark, args.batch, args.imgsz, device) if args.benchmark else None


# -----------------------------------------------------------------------------------------------
# One micro-step's pieces, and what a skipped optimizer step does
def forward_loss(images, targets, size, last_micro_step):
    """The batch onto the device, the forward under autocast, the loss in fp32 (utils/loss.py, which also redoes the
    label assignment on the CPU when that alone runs out of memory). Returns (loss, parts), or None when the batch's
    copy or the forward ran out of memory (--batch too large: the copy is where a nearly full GPU fails first).
    pitfall M5: under DDP only a window's last micro-step all-reduces gradients."""
    sync = contextlib.nullcontext() if world_size == 1 or last_micro_step else model.no_sync()
    try:
        images, targets = batch_to_device(images, targets, device, size)
        with sync, torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            maps = model(images)
        with torch.no_grad():  # --teacher: frozen and in eval, on the same augmented batch, in its own (AMP) dtype
            teacher_maps = teacher(images.to(teacher_dtype), mode="maps") if teacher else None
        return loss_fn(maps, targets, teacher_maps)
    except torch.OutOfMemoryError:
        return None  # returned from here, the failed step's graph is released with this frame


def backward(loss, last_micro_step):
    """False when the backward ran out of memory. Under DDP the other ranks are inside the all-reduce of a
    window's last backward by then: there is no way back."""
    try:
        scaler.scale(loss * world_size).backward()  # DDP averages over ranks; undo that
        return True
    except torch.OutOfMemoryError:
        if world_size > 1 and last_micro_step:
            raise
        return False


def skip_step(cause, epoch, i, size):
    """An optimizer step not taken, on every rank alike: `oom` (the window was dropped) or `nonfinite` (NaN/Inf
    gradients). Counted in results.csv; too many in a row stop the run with crash/ and what to try."""
    faults[f"{cause}_skipped_steps"] += 1
    in_a_row[cause] += 1
    if cause == "oom" and world_size > 1:
        realign_ddp(model, device)
    optimizer.zero_grad(set_to_none=True)  # half-accumulated gradients are not a step
    if cause == "nonfinite":
        in_a_row["oom"] = 0
    n, fp16 = in_a_row[cause], scaler.is_enabled()
    what = "out of memory" if cause == "oom" else "NaN/Inf gradients"
    note = f"; fp16 loss scale now {scaler.get_scale():g}" if fp16 and cause == "nonfinite" else ""
    log.warning(f"{what} at epoch {epoch + 1} iteration {i}: optimizer step skipped ({n} in a row{note})")
    # fp16: the loss scale starts at 2^16 and halves on each overflow; up to 16 such steps are its search, not a fault
    if n >= (MAX_OOM_STEPS if cause == "oom" else MAX_NONFINITE_STEPS + 16 * fp16):
        why = f"stopping: {n} optimizer steps in a row with NaN/Inf gradients"
        if cause == "oom":
            why = too_large_batch(n, args.batch, world_size, size, args.checkpoint_activations)
        abort_run(run_dir, why, crash_context, is_main)


# -----------------------------------------------------------------------------------------------
# The loop
for epoch in range(start_epoch, args.epochs):
    model.train()
    loss_fn.epoch = epoch  # ProgLoss (end-to-end heads): a pure function of the epoch, nothing to save for resume
    epoch_start = time.time()
    first = start_iteration if epoch == start_epoch else 0
    if epoch > start_epoch:  # a resumed run's first epoch goes on with the sums its last.pt saved
        sums, batches_done = torch.zeros_like(sums), 0
    window_sums = torch.zeros_like(sums)
    faults.update(dict.fromkeys(FAULTS, 0))
    window_batches, window_dropped = 0, False  # sums: one per loss part, read once per optimizer step
    assignments_on_cpu_before = loss_fn.assignments_on_cpu
    lr = optimizer.param_groups[-1]["lr"]  # (a run resumed at the very end of an epoch trains no step in it)
    windows = accumulation_windows(epoch, nb, accumulate, warmup_iterations, args.accumulate_warmup)
    if epoch == args.epochs - args.close_mosaic and is_main and args.mosaic > 0:
        log.info(f"epoch {epoch + 1}: mosaic off for the last {args.close_mosaic} epochs")
    progress = tqdm(
        range(first, nb), f"{epoch + 1}/{args.epochs}", nb, disable=not is_main, initial=first, dynamic_ncols=True
    )
    for i in progress:
        iteration = epoch * nb + i
        images, targets = next(batches)
        crash_context.update(epoch=epoch, iteration=i, batch={"images": images, "targets": targets})

        # Warmup (and the whole schedule): a pure function of the iteration
        lr = set_learning_rate(optimizer, iteration, epoch, vars(args), args.epochs, warmup_iterations)
        if is_main and iteration < 3 and not args.benchmark:  # the augmented batches as the model sees them
            in_background(plot_batch, images.clone(), targets.clone(), names, run_dir / f"train_batch{iteration}.jpg")
        # --multi-scale: a multiple of 32, a pure function of (seed, iteration): all ranks agree (pitfall M4)
        size = multi_scale_size(args.imgsz, args.seed, iteration) if args.multi_scale else images.shape[-1]
        last_micro_step = i in windows

        # Forward, then Backward. An out-of-memory in either drops the rest of this accumulation window.
        result = forward_loss(images, targets, size, last_micro_step) if not window_dropped else None
        window_dropped = result is None
        if last_micro_step:  # the backward all-reduces: every rank runs it, or none does
            window_dropped, stop = any_rank([window_dropped, stop_request.requested], world_size, flags_group)
        if not window_dropped and backward(result[0], last_micro_step):
            window_sums += result[1]
            window_batches += 1
        else:
            window_dropped = True
        result = None
        if window_dropped and device.type == "cuda":
            torch.cuda.empty_cache()
        if profiler:  # per micro-step, so that a trace is written even when an epoch has few optimizer steps
            profiler.step()
        if benchmark and benchmark.finished(iteration):  # N iterations timed after 3 warm-up ones
            progress.close()
            print(benchmark.report())
            sys.exit(0)
        if not last_micro_step:
            continue

        # Step: taken, or skipped for a dropped window or NaN/Inf gradients (the norm is all-reduced by now:
        # the same decision on every rank)
        if window_dropped:
            skip_step("oom", epoch, i, size)
        elif optimizer_step(model, optimizer, scaler, args.clip_grad):
            if ema:
                ema.update(model)
            sums += window_sums
            batches_done += window_batches
            in_a_row.update(oom=0, nonfinite=0)
        else:
            skip_step("nonfinite", epoch, i, size)
        window_sums.zero_()
        window_batches, window_dropped = 0, False

        # Save, stop: only here, between optimizer steps, so that no accumulated gradient is lost: the saved
        # state is exactly what an uninterrupted run has.
        if stop and is_main:
            save_last(epoch, i + 1)
            log.info(f"saved {last_pt} at epoch {epoch + 1} iteration {i + 1}; resume with --resume")
        if stop:
            sys.exit(0)
        if is_main and args.save_every and (i + 1) % args.save_every < windows[i]:  # --save-every fell in the window
            save_last(epoch, i + 1)

        # Log
        if is_main:
            memory = torch.cuda.memory_reserved(device) / 2**30 if device.type == "cuda" else 0
            rate = (i + 1 - first) * args.batch / (time.time() - epoch_start)
            means = (sums / max(batches_done, 1)).tolist()
            progress.set_postfix_str(monitor.progress_text(loss_fn.names, means, lr, memory, rate))
    if profiler:
        profiler.stop()
        profiler = None

    # End of epoch: rank 0 validates the EMA model and saves; the others wait.
    final_epoch = epoch == args.epochs - 1
    if is_main:
        faults["assign_on_cpu"] = loss_fn.assignments_on_cpu - assignments_on_cpu_before  # before the validation's
        metrics = dict.fromkeys(METRICS, float("nan"))
        # --benchmark times training alone: an epoch end inside its span is not validated (the GPU would sit idle)
        if not args.benchmark and ((epoch + 1) % args.val_every == 0 or final_epoch):
            # only picks best.pt and fills results.csv: fp16 on CUDA, fast_map; the final one below is pycocotools'
            metrics = epoch_metrics(ema.ema, val_loader, nc, device, half=device.type == "cuda", loss_fn=loss_fn)
            if FITNESS[args.fitness](metrics) > best_fitness:
                best_fitness, best_epoch = FITNESS[args.fitness](metrics), epoch + 1
                best = {
                    **checkpoint_header,
                    "model": ema.ema.state_dict(), "epoch": epoch + 1, "metrics": metrics, "args": vars(args),
                }  # fmt: skip
                save_checkpoint(best, best_pt)  # deployable: EMA weights, no optimizer
        losses = (sums / max(batches_done, 1)).tolist()
        seconds = time.time() - epoch_start  # one figure for results.csv and the log line
        row = [epoch + 1, *losses, *(metrics[k] for k in METRICS), lr, seconds, *faults.values()]
        monitor.append_results_row(results_csv, row)
        draw_results(results_csv, run_dir / "results.png")
        monitor.log_epoch(tensorboard, mlflow_run, dict(zip(COLUMNS[1:], row[1:])), epoch + 1)
        log.info(monitor.epoch_line(epoch + 1, args.epochs, loss_fn.names, losses, metrics, seconds, faults))
        save_last(epoch + 1, 0)
    # --patience: rank 0 saw the fitness; the vote is also the barrier where the other ranks wait for it
    patience_over = is_main and args.patience > 0 and epoch + 1 - best_epoch >= args.patience and not final_epoch
    if any_rank([patience_over], world_size, flags_group)[0]:
        log.info(f"stopping early: {args.fitness} not better in {args.patience} epochs (--patience); best {best_epoch}")
        break

# -----------------------------------------------------------------------------------------------
# After training: evaluate best.pt once more with plots, and write metrics.json
if is_main:
    best = load_checkpoint(best_pt)
    ema.ema.load_state_dict(best["model"])
    result = evaluate(ema.ema, val_loader, names, device, data["coco_json"])
    log.info(f"best.pt (epoch {best['epoch']}):\n" + format_table(result, names))
    write_run_file(run_dir / "metrics.json", json.dumps(result["metrics"], indent=2), "best.pt and last.pt are intact")
    best_f1_confidence = plot_evaluation(result, ema.ema, val_loader, names, run_dir, device)
    log.info(f"best F1 at confidence {best_f1_confidence:.3f} (F1_curve.png; detect.py --conf)")
    if mlflow_run:
        mlflow_run.finish(run_dir)
    log.info(f"done in {run_dir}: weights/best.pt, weights/last.pt, results.csv, results.png")
leave_together(world_size, flags_group)  # DDP: no rank tears the process group down while rank 0 still evaluates
