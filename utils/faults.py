"""What a run does when something goes wrong: the mechanics. The decisions (skip a step, stop after N in a row)
are taken in train.py's loop, where they can be read in order; each fault that can be handled where it happens is
handled there (the label assignment's out-of-memory in utils/loss.py, an unreadable image in utils/data/loader.py).

- StopRequest:           SIGTERM (cluster pre-emption) and Ctrl+C become "save last.pt after this step, exit 0"
- realign_ddp:           after a dropped accumulation window, every DDP rank back in the same state
- too_large_batch:       the sentence a run stops with after repeated out-of-memory: what to try
- abort_run:             stop every rank, rank 0 writes crash/ (reason, environment, args, the batch)
- install_crash_handler: any uncaught exception writes crash/ too
"""

import json
import logging
import os
import platform
import signal
import sys
import traceback
from pathlib import Path

import torch
import yaml

log = logging.getLogger("yolo")


class StopRequest:
    """SIGTERM (cluster pre-emption, `kill -- -PGID`) or Ctrl+C: `requested` turns True; the loop finishes its
    optimizer step, saves last.pt and exits 0. A second Ctrl+C stops at once."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)

    def __call__(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log.warning(f"{signal.Signals(signum).name}: stopping after this step (last.pt will be saved)")


def realign_ddp(model, device):
    """Call on every rank after an accumulation window was dropped. A rank whose last forward finished
    has told DDP to expect a backward; a rank that ran out of memory in it has not; the next backward
    would then all-reduce on some ranks only, and they would wait forever. A tiny forward in eval mode
    (BN statistics untouched) and a zero backward on every rank bring all of them to the same state."""
    was_training = model.training
    model.eval()
    out = model(torch.zeros(1, 3, 32, 32, device=device))
    model.train(was_training)
    (out.float().sum() * 0).backward()


def too_large_batch(steps, total_batch, world_size, size, checkpointing):
    """The sentence a run stops with after `steps` optimizer steps in a row ran out of memory:
    what did not fit, and a smaller --batch (still a multiple of the process count) to try."""
    smaller = max(total_batch // 2 // world_size * world_size, world_size)
    advice = f"try --batch {smaller}" + ("" if checkpointing else " or --checkpoint-activations")
    return (
        f"stopping: out of memory in {steps} optimizer steps in a row: --batch {total_batch} "
        f"({total_batch // world_size} per process) does not fit at {size} px; {advice}"
    )


def environment_info():
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
