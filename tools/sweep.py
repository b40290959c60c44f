#!/usr/bin/env python
"""Run a grid of experiments over a pool of GPU (or CPU) workers, then tabulate them.

    python tools/sweep.py data/sweep_shapes.yaml             # run every experiment of the spec
    python tools/sweep.py data/sweep_shapes.yaml --dry-run   # only print the commands
    python tools/sweep.py data/sweep_shapes.yaml --slurm     # one SLURM job per experiment
    python tools/sweep.py table runs/sweep_shapes --sort mAP50-95

The spec is a YAML file of several documents. The first says how to run one
experiment; each later one is a grid of experiments:

    template:                   # named commands, run in this order for each experiment
      train: python train.py --data data/{data}.yaml --imgsz {imgsz} --epochs {epochs} [resume] --out {_output}/train
      val: python val.py --weights {_output}/train/weights/best.pt --out {_output}/val
    default: {data: shapes, epochs: 30, imgsz: 128, resume: null}  # every parameter's baseline
    resource: [0, 1, "2,3", cpu]   # one worker per entry: its GPU ids, or cpu
    alias:                      # optional: one value standing for several parameters
      data: {coco: {imgsz: 640}}
    output: runs/sweep          # optional: where experiment folders go (this is the default)
    ---
    epochs: [10, 50]            # every combination of the lists is one experiment,
    data: [shapes, coco]        # a scalar counts as a one-element list
    ---
    _title: resume              # optional: run only the grids named with -t resume
    _cmd: [train]               # optional: run only these commands for this grid (-c wins)
    resume: runs/last.pt

In a command {name} becomes the parameter's value and [name] becomes
"--name value", or nothing when the value is null or false ("--name" alone when
it is true, for on/off flags). "${VAR}" is left to the shell. Built-ins:
    {_output}  the experiment's folder: <output>/<name>, relative to the current
               directory unless 'output' is an absolute path
    {_name}    that folder's name, e.g. Epochs_50-Data_coco
    {_gpus}    the worker's resource entry: "0", "2,3" or "cpu"
Commands run with CUDA_VISIBLE_DEVICES set to the worker's GPUs ("" for cpu), so
inside a command its GPUs are numbered from 0.

An experiment's folder is named after the grid parameters that differ from the
defaults, in grid order ("default" if none), and holds
    param                 every parameter's value (json)
    stat                  per command: success/fail/running/interrupted, exit code, times
    log.<command>.<time>  the command's stdout and stderr
A grid may name parameters that no command uses: they only tag the folder
(e.g. note: [nms-fix] to keep apart the runs of a quick code edit).
Running a spec again runs only what has not succeeded yet, command by command;
--force runs everything again, -c val only the val commands, -t NAME only the
grids with that _title, -r 0 1 uses other workers than the spec's. Ctrl+C (or
SIGTERM) stops every command with all the processes it started and marks it
interrupted. tools/sweep.py exits 0 when every experiment succeeded, 1 when one
failed, 2 for a mistake in the spec, 130 after Ctrl+C.

With --slurm each experiment is one sbatch job instead, with the options of a
`slurm:` mapping in the first document (a grid's `_slurm:` overrides some):

    slurm: {partition: gpu, time: "4:00:00", gres: "gpu:1", cpus-per-task: 8}

The job runs `tools/sweep.py --run-experiment <folder>`: the same commands, files and
stat as a local worker, with SLURM's CUDA_VISIBLE_DEVICES; the folder also gets
slurm_job (the job id) and slurm-<id>.out. tools/sweep.py polls squeue and prints
progress until every job ended (--no-wait: submit and exit). A rerun skips
successes, resubmits failures and leaves alone jobs still queued or running;
Ctrl+C cancels the jobs this run submitted, and only those.

`tools/sweep.py table OUT` prints one row per experiment folder: the parameters that
differ across them, then the last row of any results.csv and the numbers of any
metrics.json in the folder (tab-separated; --sort METRIC, --csv FILE).
"""

# The parts: tools/sweep_spec.py (the spec and its experiments), tools/sweep_workers.py (local workers),
# tools/slurm.py (sbatch jobs and the job body), tools/sweep_table.py (the table).
import argparse
import asyncio
import sys
from collections import deque
from pathlib import Path

# `python tools/sweep.py` puts tools/ on sys.path, not the repository root that holds tools/ and utils/
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.slurm import run_experiment, run_slurm  # noqa: E402
from tools.sweep_spec import (  # noqa: E402
    SpecError,
    check_commands,
    expand,
    load_spec,
    parse_resources,
    placeholders,
    render,
    select_titles,
    still_to_run,
)
from tools.sweep_table import table  # noqa: E402
from tools.sweep_workers import run_all  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="tools/sweep.py",
        usage="%(prog)s SPEC.yaml [options]  |  %(prog)s table OUT [--sort M] [--csv F]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", help="the YAML spec")
    parser.add_argument("-t", "--title", nargs="+", help="run only the grids with these _title")
    parser.add_argument("-r", "--resource", nargs="+", help='workers instead of the spec\'s: 0 1, "0,1", cpu')
    parser.add_argument("-c", "--cmd", nargs="+", help="run only these template commands")
    parser.add_argument("--force", action="store_true", help="run again what already succeeded")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--slurm", action="store_true", help="one sbatch job per experiment instead of workers")
    parser.add_argument("--no-wait", action="store_true", help="with --slurm: submit, then exit")
    args = parser.parse_args(argv)
    if args.no_wait and not args.slurm:
        raise SpecError("--no-wait goes with --slurm")
    return args


def sweep(argv):
    args = parse_args(argv)
    spec, grids = load_spec(args.spec)
    # on SLURM the jobs' resources come from the 'slurm' options, so no worker list is needed
    workers = ["slurm"] if args.slurm else parse_resources(args.resource or spec.get("resource"))
    grids = select_titles(grids, args.title)
    only = args.cmd and check_commands(args.cmd, spec["template"], "-c")
    experiments = expand(spec, grids, only)
    used = {k for command in spec["template"].values() for k in placeholders(command)}
    orphans = sorted({str(k) for g in grids for k in g if not str(k).startswith("_") and k not in used})
    if orphans:
        print(f"Orphan params: {', '.join(orphans)} (no command uses them; they only name folders)", file=sys.stderr)

    out = Path(str(spec.get("output") or "runs/sweep"))
    queue = deque()
    for exp in experiments:
        exp["dir"], exp["template"] = out / exp["name"], spec["template"]
        exp["todo"] = still_to_run(exp, args.force)
        if exp["todo"]:
            exp["index"] = len(queue) + 1
            queue.append(exp)
    skipped = len(experiments) - len(queue)

    if args.dry_run:
        return dry_run(spec, queue, skipped, workers, args.slurm)
    if args.slurm:
        return run_slurm(queue, skipped, args.no_wait)
    return run_local(queue, skipped, workers)


def dry_run(spec, queue, skipped, workers, on_slurm):
    for exp in queue:
        gpus = workers[(exp["index"] - 1) % len(workers)]  # a guess: the real one is whoever is free
        print(f"# {exp['index']}/{len(queue)} {exp['dir']} ({gpus})")
        builtins = {"_output": str(exp["dir"]), "_name": exp["name"], "_gpus": gpus}
        for command in exp["todo"]:
            print(render(spec["template"][command], {**exp["params"], **builtins}))
    where = "one SLURM job each" if on_slurm else f"{len(workers)} workers"
    print(f"{len(queue)} experiments to run, {skipped} already done, {where}")
    return 0


def run_local(queue, skipped, workers):
    print(
        f"{len(queue)} experiments to run, {skipped} already done, {len(workers)} workers: {' '.join(workers)}",
        flush=True,
    )
    counts, caught = asyncio.run(run_all(queue, workers))
    print(
        f"sweep: {counts['done']} done, {counts['failed']} failed, {counts['interrupted']} interrupted, "
        f"{counts['total'] - counts['done'] - counts['failed'] - counts['interrupted'] - counts['elsewhere']} not "
        f"started, {skipped} already done"
        + (f", {counts['elsewhere']} left to another tools/sweep.py on this spec" if counts["elsewhere"] else ""),
        flush=True,
    )
    for line in counts["failures"]:
        print(f"FAIL  {line}")
    if caught:
        return 128 + caught
    return 1 if counts["failed"] else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["--run-experiment"]:  # hidden: what each SLURM job runs
            return run_experiment(argv[1:])
        return table(argv[1:]) if argv[:1] == ["table"] else sweep(argv)
    except SpecError as e:
        print(f"tools/sweep.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C before any command started
        return 130


if __name__ == "__main__":
    sys.exit(main())
