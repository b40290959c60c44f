"""The command line's settings as a run resolves them, before anything is built: which flags were given, a
dataset yaml's defaults, a resumed run's arguments and batch, the data-loader worker count, and where each value
that is not the parser's default came from (`sources`: printed at start and written beside it in args.yaml).
torch is not imported here (the data modules use this without it)."""

import argparse
import os
import textwrap
from pathlib import Path

import yaml

from utils.general import DatasetError
from utils.hyperparameters import AUTO_ADAMW_UNDER, FINE_TUNING, SCRATCH, is_auto


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
    actions = {action.dest: action for action in parser._actions}
    for key, value in data["defaults"].items():
        if not hasattr(args, key):
            raise DatasetError(f"{data['yaml']}: key 'defaults' names '{key}', which is not a train.py setting")
        if key in given_flags:
            continue
        default, convert = parser.get_default(key), actions[key].type
        if convert is None and default is not None and not isinstance(default, bool):
            convert = type(default)
        try:
            setattr(args, key, convert(value) if convert else value)
        except (TypeError, ValueError):  # "many" or [7] for an int
            raise DatasetError(
                f"{data['yaml']}: key 'defaults' sets '{key}' to {value!r}, which is not a {convert.__name__}"
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
    """One log line: `imgsz 256 <- data/shapes.yaml defaults | optimizer adamw <- --optimizer auto: 500 iterations`."""
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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help: each flag with its default, and the epilog's tables as written."""


def help_epilog():
    """--help's end: what changes the defaults shown, and the tables of what `auto` becomes."""
    lines = textwrap.wrap(
        "The defaults shown are the parser's: a dataset yaml's `defaults:` (data/shapes.yaml sets imgsz and epochs) "
        "and a resumed run's arguments change them, and each `auto` is chosen as below (utils/hyperparameters.py); "
        "a run prints each value that differs with its source, and writes it so in args.yaml.",
        116,
    )
    lines += ["", "auto from scratch (and --weights --scratch-recipe), by optimizer:"]
    for optimizer, values in SCRATCH.items():
        chosen = ", ".join(f"{key} {'one batch' if value is None else value}" for key, value in values.items())
        lines.append(f"  {optimizer:<6} {chosen}")
    lines += [
        "",
        "the fine-tuning table: auto in an AdamW run from --weights, by the first row that holds; n: the run's",
    ]
    lines += ["iterations (epochs x batches an epoch), w: its warmup's (--warmup-epochs of batches, at least 100):"]
    for when, _, values, why in FINE_TUNING:
        lines.append(f"  {when.format(n='n', w='w')}: " + ", ".join(f"{key} {value}" for key, value in values.items()))
        lines.append(f"      why: {why}")
    return "\n".join(lines)


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


def fine_tuning_choices(args, sources):
    """What a run from --weights took for the fine-tuning table's settings, for the line that names the file: lr0 and
    warmup_bias_lr with their sources, and the table's other settings where its row chose them."""
    keys = ("lr0", "warmup_bias_lr", "nominal_batch", "momentum", "ema_floor")
    return "; ".join(
        f"{key} {getattr(args, key)} <- {sources.get(key, 'default')}"
        for key in keys
        if key in ("lr0", "warmup_bias_lr") or sources.get(key, "").startswith("auto, fine-tuning")
    )


def warmup_length(warmup_epochs, batches_per_epoch):
    """The warmup's iterations: --warmup-epochs of batches, at least 100 (YOLOv5's and Ultralytics' floor); 0: none."""
    return max(round(warmup_epochs * batches_per_epoch), 100) if warmup_epochs > 0 else 0


def resolve_optimizer(args, batches_per_epoch, sources, fine_tuning=False):
    """{optimizer, lr0, nominal_batch, warmup_bias_lr, momentum, ema_floor} of a run of `batches_per_epoch` batches an
    epoch: a given value as given, an `auto` one from utils/hyperparameters.py's SCRATCH table or, for an AdamW run
    that fine-tunes (--weights, not --scratch-recipe), its fine-tuning table; `sources` notes each choice. ValueError
    for an optimizer not offered or an --ema-floor outside [0, 1)."""
    optimizer, iterations = args.optimizer, args.epochs * batches_per_epoch
    if optimizer == "auto":  # counts batches where Ultralytics' auto counts optimizer steps
        optimizer = "adamw" if iterations < AUTO_ADAMW_UNDER else "sgd"
        sources["optimizer"] = f"--optimizer auto: {iterations} iterations"
    if optimizer not in SCRATCH:
        raise ValueError(f"--optimizer {optimizer}: give sgd, adamw, musgd or auto")
    auto, why = dict(SCRATCH[optimizer]), dict.fromkeys(SCRATCH[optimizer], f"auto: {optimizer}'s usual")
    if auto["nominal_batch"] is None:  # a short run has few steps to spare
        auto["nominal_batch"], why["nominal_batch"] = args.batch, f"auto: {optimizer}'s usual, a step per batch"
    if fine_tuning and optimizer == "adamw":
        warmup = warmup_length(args.warmup_epochs, batches_per_epoch)
        when, _, values, _ = next(row for row in FINE_TUNING if row[1](iterations, warmup))
        auto |= values
        why |= dict.fromkeys(values, "auto, fine-tuning: " + when.format(n=iterations, w=warmup))
    chosen = {"optimizer": optimizer}
    for key, value in auto.items():
        chosen[key] = getattr(args, key)
        if is_auto(key, chosen[key]):
            chosen[key], sources[key] = value, why[key]
    if not 0 <= chosen["ema_floor"] < 1:
        floor = chosen["ema_floor"]
        raise ValueError(f"--ema-floor {floor}: give 0 (off) or more, under 1 (0.9: about the last 10 steps), or auto")
    return chosen
