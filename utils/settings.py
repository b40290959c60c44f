"""The command line's settings as a run resolves them, before anything is built: which flags were given, a
dataset yaml's defaults, a resumed run's arguments and batch, the data-loader worker count, and where each value
that is not the parser's default came from (`sources`: printed at start and written beside it in args.yaml).
torch is not imported here (the data modules use this without it)."""

import argparse
import os
from pathlib import Path

import yaml

from utils.general import DatasetError


def explicit_flags(parser, argv):
    """The dest names of the options written on the command line (not left at their defaults)."""
    given = set()
    for action in parser._actions:
        for option in action.option_strings:
            if any(a == option or a.startswith(option + "=") for a in argv):
                given.add(action.dest)
    return given


def apply_dataset_defaults(args, parser, data, given_flags, sources=None):
    """Set the settings a dataset yaml recommends under `defaults:` (shapes.yaml does) on `args`, except
    those given as flags: a flag written on the command line wins. Values take the type of the flag.
    `sources` (a dict), where given, records each key set here as coming from the yaml."""
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
        if sources is not None:
            sources[key] = f"{data['yaml']} defaults"


def changed_settings(parser, args, sources):
    """{key: (value, source)} for every setting that is not the parser's default, or whose source was recorded:
    what a reader of the log or of args.yaml needs to know won over `python train.py --help`'s defaults."""
    changed = {}
    for key, value in vars(args).items():
        if key in sources or value != parser.get_default(key):
            changed[key] = (value, sources.get(key, "command line"))
    return changed


def sources_line(parser, args, sources):
    """One log line: `imgsz 256 <- data/shapes.yaml defaults | lr0 0.002 <- optimizer auto: adamw's | ...`."""
    changed = changed_settings(parser, args, sources)
    return "settings (not --help's defaults): " + " | ".join(f"{k} {v} <- {s}" for k, (v, s) in changed.items())


def args_yaml(parser, args, sources):
    """args.yaml: every setting as the run resolved it (yaml.safe_load reads it back), each one that is not the
    parser's default followed by a comment naming its source."""
    changed = changed_settings(parser, args, sources)
    lines = []
    for key, value in vars(args).items():
        line = yaml.safe_dump({key: value}, default_flow_style=False, width=1_000_000).rstrip("\n")
        if key in changed and "\n" not in line:
            line += f"  # <- {changed[key][1]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def default_workers(local_world_size=1, most=None):
    """The cores this process may use, shared out between the `local_world_size` processes of its machine (at
    least 1, at most `most`): the default number of data-loader workers, and of label verification workers."""
    workers = max(1, len(os.sched_getaffinity(0)) // local_world_size)
    return min(workers, most) if most else workers


def resume_arguments(parser, args, given_flags, sources=None):
    """--resume: (the arguments to continue with, the last.pt). A resumed run keeps the arguments it started with;
    only where and how it runs may change (another machine: its devices, its cores, and where given, the AMP its
    GPU supports and the batch its GPUs fit), and --epochs, to extend a run: the schedule is a pure function of
    (epoch, epochs), so the run goes on exactly as one started with the larger --epochs would from the same state
    (the learning rate is recomputed over the new total from where the run is: it rises again from lrf and decays
    to lrf at the new end; --close-mosaic's last epochs move to the new end). Without --resume: (args, None).
    CheckpointError (a ValueError) for a missing or unusable file, ValueError for fewer --epochs than trained.
    `sources`, where given, records the values the resumed run brings back, and an --epochs that extends it."""
    if not args.resume:
        return args, None
    from utils.checkpoints.ours import load_resume_checkpoint  # torch: only when resuming

    path, ckpt = load_resume_checkpoint(args.resume if isinstance(args.resume, str) else None)
    changeable = ["device", "workers"] + [k for k in ("amp", "amp_dtype", "batch", "epochs") if k in given_flags]
    if "batch" in given_flags and args.batch < 1:  # --batch -1 measures before anything is resumed: too late here
        raise ValueError(
            f"--batch {args.batch}: give the total batch to continue with (it was {ckpt['args']['batch']})"
        )
    if "epochs" in given_flags and args.epochs < ckpt["epoch"]:
        raise ValueError(
            f"--epochs {args.epochs} is fewer than the {ckpt['epoch']} epochs {path} has trained: "
            f"give more than {ckpt['epoch']} to extend the run, or leave --epochs out to finish it"
        )
    where = {k: getattr(args, k) for k in changeable}
    resumed = argparse.Namespace(**{**vars(parser.parse_args([])), **ckpt["args"], **where, "resume": path})
    resumed.out = str(Path(path).parents[1])
    if sources is not None:
        for key, value in ckpt["args"].items():
            if key not in where and value != parser.get_default(key):
                sources[key] = f"resumed run {path}"
        if "epochs" in given_flags and args.epochs != ckpt["args"]["epochs"]:
            sources["epochs"] = f"command line, resumed run had {ckpt['args']['epochs']}"
    return resumed, ckpt


def resumed_batch(args, ckpt, world_size, batch_given):
    """(--batch, --accumulate) of a run resumed on `world_size` processes. On another number of GPUs each keeps
    the images it had (the saved total would put several GPUs' worth on each, and run out of memory), unless
    --batch was given; an explicit accumulation scales so that a step still sees as many images. The schedule
    then continues, though not bitwise as on the original GPUs."""
    if ckpt is None:
        return args.batch, args.accumulate
    saved = ckpt["args"]["batch"]
    batch = args.batch if batch_given else saved // ckpt.get("world_size", world_size) * world_size
    accumulate = max(1, round(args.accumulate * saved / batch)) if args.accumulate else 0
    return batch, accumulate


# AdamW's rate for a fine-tuning run that outlasts its warmup (BCCD from a COCO-trained YOLOv8s: bench/RESULTS.md)
FINE_TUNE_LR0 = 0.00143
FINE_TUNE_BIAS_LR = 0.01  # where a fine-tuning AdamW run's bias warmup starts (a scratch run's: 0.1)
# A fine-tuning run this many times its warmup or longer also takes Ultralytics' AdamW settings (fine_tuning_recipe)
LONG_FINE_TUNING = 1.5
# and an EMA of about its last 1 / (1 - this) steps from the start (utils/ema.py: ModelEMA's floor)
FINE_TUNE_EMA_FLOOR = 0.9


def fine_tuning_choices(args, sources):
    """What --weights chose in the recipe, for the line that names the file: `lr0 0.00143 <- fine-tuning: ...;
    warmup_bias_lr 0.01 <- fine-tuning: ...` (and nominal_batch, momentum and ema_floor, where a long run's recipe set
    them)."""
    keys = ("lr0", "warmup_bias_lr", "nominal_batch", "momentum", "ema_floor")
    return "; ".join(
        f"{key} {getattr(args, key)} <- {sources.get(key, 'default')}"
        for key in keys
        if key in ("lr0", "warmup_bias_lr") or sources.get(key, "").startswith("fine-tuning")
    )


def warmup_length(warmup_epochs, batches_per_epoch):
    """The warmup's iterations: --warmup-epochs of batches, at least 100 (YOLOv5's and Ultralytics' floor); 0: none."""
    return max(round(warmup_epochs * batches_per_epoch), 100) if warmup_epochs > 0 else 0


def resolve_optimizer(args, batches_per_epoch, sources, fine_tuning=False):
    """{optimizer, lr0, nominal_batch, warmup_bias_lr, momentum, ema_floor}: those flags' values for a run of
    `batches_per_epoch` batches per epoch; `sources` notes what was chosen. auto: Adam-style for short runs, SGD for
    long ones, as Ultralytics' "auto"; it counts optimizer steps (batches of max(batch, nominal_batch)), this counts
    batches: SGD from 4x shorter runs at batch 16 (unmeasured; see bench/RESULTS.md). nominal_batch 0: 64 images per
    step for SGD and MuSGD (YOLOv5's and Ultralytics' value, with their rates), a step per batch for AdamW: its short
    runs on a few hundred images have few steps to spare (BCCD from scratch, 20 epochs: 0.558 against 0.466 with 64).
    fine_tuning (--weights, unless --scratch-recipe) with AdamW: fine_tuning_recipe. ValueError for an optimizer not
    offered or an --ema-floor outside [0, 1)."""
    given = set(sources)  # the command line's, a dataset yaml's: fine-tuning changes none of them
    optimizer, iterations = args.optimizer, args.epochs * batches_per_epoch
    if optimizer == "auto":
        optimizer = "adamw" if iterations < 10_000 else "sgd"
        sources["optimizer"] = f"--optimizer auto: {iterations} iterations"
    if optimizer not in ("sgd", "adamw", "musgd"):
        raise ValueError(f"--optimizer {optimizer}: give sgd, adamw, musgd or auto")
    if not 0 <= args.ema_floor < 1:
        raise ValueError(f"--ema-floor {args.ema_floor}: give 0 (off) or more, under 1 (0.9: about the last 10 steps)")
    chosen = dict(lr0=args.lr0, nominal_batch=args.nominal_batch, warmup_bias_lr=args.warmup_bias_lr)
    chosen |= dict(momentum=args.momentum, ema_floor=args.ema_floor)
    if not args.lr0:
        chosen["lr0"] = {"sgd": 0.01, "adamw": 0.002, "musgd": 0.01}[optimizer]
        sources["lr0"] = f"{optimizer}'s usual rate"
    if not args.nominal_batch:
        chosen["nominal_batch"] = args.batch if optimizer == "adamw" else 64
        sources["nominal_batch"] = "adamw: a step per batch" if optimizer == "adamw" else f"{optimizer}'s usual"
    if fine_tuning and optimizer == "adamw":
        free = {"lr0": not args.lr0, "nominal_batch": not args.nominal_batch}
        free |= {key: key not in given for key in ("warmup_bias_lr", "momentum", "ema_floor")}
        warmup = warmup_length(args.warmup_epochs, batches_per_epoch)
        for key, (value, why) in fine_tuning_recipe(iterations, warmup, chosen).items():
            if free[key]:
                chosen[key], sources[key] = value, why
    return {"optimizer": optimizer, **chosen}


def fine_tuning_recipe(iterations, warmup, usual):
    """{setting: (value, why)} for a fine-tuning AdamW run of `iterations` with a `warmup`; `usual`: a scratch run's
    values (--scratch-recipe). AdamW moves each weight by about its rate at every step, whatever the gradient, so a
    run that spends long at a high rate tears down the pretrained features and rebuilds them. By the run's length:
    - within its warmup the rate never reaches lr0 (it peaks at about a fifth of it mid-run): the usual rate (0.002)
      and a step per batch (BCCD, 5 epochs: 0.595 against 0.577 at 0.00143);
    - past it, lr0 FINE_TUNE_LR0 (BCCD, 10 epochs: 0.623 against 0.616, 5 seeds; chess, 13 classes: 0.763 against
      0.754 at Ultralytics' 0.0006);
    - LONG_FINE_TUNING times the warmup or longer, also Ultralytics' AdamW settings: a step per 64 images, biases
      warmed up from 0, beta1 0.9. With a step per batch, cards (190 iterations) fell to 52% and 25% of its best
      mid-run and cells (330) to nothing at epoch 2; with these cards no longer dips and ends at 0.781 against
      0.715 (3 and 4 runs; Ultralytics 0.767), cells ends level (0.481 against 0.485, 3 seeds), 20 epochs of chess
      lose 0.013 (2 seeds). Chess at 130 iterations lost with them (0.676 against 0.763), hence the margin past the
      warmup. Ultralytics' rate by class count (0.002 x 5 / (4 + nc)) did not pay: cards 0.800, but a 20-epoch
      chess run 0.763 against 0.784 (2 seeds each).
      Such a run also averages its weights over about its last ten steps (ema_floor FINE_TUNE_EMA_FLOOR): it ends
      long before the usual EMA averages anything, and validated on its last step's weights cells fell to 60% of
      its best at epoch 3 and 20 epochs of chess to 88% at epoch 13; with it neither dips, at the same training,
      and they end at 0.489 against 0.486 and 0.777 against 0.774, 20 epochs of BCCD level (0.640), cards at
      0.718 and 0.800 against 0.725 and 0.807 (seeds 0 and 1): the four sets' mean is level. Over 3 seeds, cards
      0.772 against 0.781 and cells 0.486 against 0.481.
    Biases warm up from FINE_TUNE_BIAS_LR, not 0.1, in the shorter runs: 0.1 shifts the pretrained biases (batch
    norm's among them) far in a few steps (BCCD from the shapes checkpoint, 5 epochs: 0.373 against 0.260, 3 seeds)."""
    run = f"fine-tuning: {iterations} iterations"
    bias = (FINE_TUNE_BIAS_LR, f"fine-tuning: adamw moves a bias by about this rate a step (--scratch-recipe: "
            f"{usual['warmup_bias_lr']})")  # fmt: skip
    lr0 = usual["lr0"]  # adamw's usual rate
    if iterations <= warmup:
        return {"lr0": (lr0, f"{run} end within the {warmup}-iteration warmup: {lr0}"), "warmup_bias_lr": bias}
    recipe = {"lr0": (FINE_TUNE_LR0, f"{run} outlast the {warmup}-iteration warmup (--scratch-recipe: {lr0})")}
    if iterations < LONG_FINE_TUNING * warmup:
        return recipe | {"warmup_bias_lr": bias}
    why = f"{run}, {LONG_FINE_TUNING}x the {warmup}-iteration warmup or more: Ultralytics' AdamW settings"
    return recipe | {
        "nominal_batch": (64, f"{why}, a step per 64 images"),
        "warmup_bias_lr": (0.0, f"{why} (--scratch-recipe: {usual['warmup_bias_lr']})"),
        "momentum": (0.9, f"{why}, its beta1 (--scratch-recipe: {usual['momentum']})"),
        "ema_floor": (FINE_TUNE_EMA_FLOOR, f"{run}: an EMA of about its last 10 steps (the usual one: the last step)"),
    }
