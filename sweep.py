#!/usr/bin/env python
"""Run a grid of experiments over a pool of GPU (or CPU) workers, then tabulate them.

    python sweep.py data/sweep_shapes.yaml             # run every experiment of the spec
    python sweep.py data/sweep_shapes.yaml --dry-run   # only print the commands
    python sweep.py data/sweep_shapes.yaml --slurm     # one SLURM job per experiment
    python sweep.py table runs/sweep_shapes --sort mAP50-95

The spec is a YAML file of several documents. The first says how to run one
experiment; each later one is a grid of experiments:

    template:                   # named commands, run in this order for each experiment
      train: python train.py --data data/{data}.yaml --imgsz {imgsz} --lr0 {lr0} [resume] --out {_output}/train
      val: python val.py --weights {_output}/train/weights/best.pt --out {_output}/val
    default: {data: shapes, lr0: 0.01, imgsz: 128, resume: null}  # every parameter's baseline
    resource: [0, 1, "2,3", cpu]   # one worker per entry: its GPU ids, or cpu
    alias:                      # optional: one value standing for several parameters
      data: {coco: {imgsz: 640}}
    output: runs/sweep          # optional: where experiment folders go (this is the default)
    ---
    lr0: [0.005, 0.02]          # every combination of the lists is one experiment,
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
    {_name}    that folder's name, e.g. Lr0_0.02-Data_coco
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
interrupted. sweep.py exits 0 when every experiment succeeded, 1 when one
failed, 2 for a mistake in the spec, 130 after Ctrl+C.

With --slurm each experiment is one sbatch job instead, with the options of a
`slurm:` mapping in the first document (a grid's `_slurm:` overrides some):

    slurm: {partition: gpu, time: "4:00:00", gres: "gpu:1", cpus-per-task: 8}

The job runs `sweep.py --run-experiment <folder>`: the same commands, files and
stat as a local worker, with SLURM's CUDA_VISIBLE_DEVICES; the folder also gets
slurm_job (the job id) and slurm-<id>.out. sweep.py polls squeue and prints
progress until every job ended (--no-wait: submit and exit). A rerun skips
successes, resubmits failures and leaves alone jobs still queued or running;
Ctrl+C cancels the jobs this run submitted, and only those.

`sweep.py table OUT` prints one row per experiment folder: the parameters that
differ across them, then the last row of any results.csv and the numbers of any
metrics.json in the folder (tab-separated; --sort METRIC, --csv FILE).
"""

import argparse
import asyncio
import csv
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import yaml

from utils.general import write_text_atomic

BUILTINS = ("_output", "_name", "_gpus")
SPEC_KEYS = ("template", "default", "resource", "alias", "output", "slurm")
GRACE = 5.0  # seconds a stopped command gets between SIGTERM and SIGKILL
TIME = "%Y-%m-%d %H:%M:%S"
# {name} and [name]; the (?<!\$) leaves the shell's own ${VAR} alone.
PLACEHOLDER = re.compile(r"(?<!\$)\{(\w+)\}|\[(\w+)\]")


class SpecError(Exception):
    """A mistake in the spec or the command line: one sentence on stderr, exit code 2."""


# ---------------------------------------------------------------- the spec


def load_spec(path):
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as e:
        raise SpecError(f"cannot read spec {path}: {e.strerror}")
    except yaml.YAMLError as e:
        raise SpecError(f"spec {path} is not valid YAML: {' '.join(str(e).split())}")
    if not docs or not isinstance(docs[0], dict):
        raise SpecError(f"the first document of {path} must be a mapping with 'template' and 'default'")
    spec, grids = docs[0], docs[1:]
    for key in spec:
        if key not in SPEC_KEYS:
            raise SpecError(f"unknown key '{key}' in the spec (expected {', '.join(SPEC_KEYS)})")
    template, default, alias = spec.get("template"), spec.get("default"), spec.get("alias") or {}
    if not isinstance(template, dict) or not template or not all(isinstance(c, str) for c in template.values()):
        raise SpecError("the spec needs 'template': a mapping from command name to command line")
    if not isinstance(default, dict):
        raise SpecError("the spec needs 'default': a mapping from every parameter to its baseline value")
    if not isinstance(alias, dict) or not all(
        isinstance(values, dict) and all(isinstance(m, dict) for m in values.values()) for values in alias.values()
    ):
        raise SpecError("'alias' must map a parameter to {value: {parameter: value, ...}, ...}")
    for name, command in template.items():
        for key in placeholders(command):
            if key not in default and key not in BUILTINS:
                raise SpecError(
                    f"placeholder '{key}' in template command '{name}' is neither a parameter "
                    f"in 'default' nor a built-in ({', '.join(BUILTINS)})"
                )
    for i, grid in enumerate(grids, 1):
        if not isinstance(grid, dict):
            raise SpecError(f"grid document {i} must be a mapping of parameter: [values]")
        for key, values in grid.items():
            if str(key).startswith("_") and key not in ("_title", "_cmd", "_slurm"):
                raise SpecError(f"unknown key '{key}' in grid document {i} (only _title, _cmd and _slurm start with _)")
            if isinstance(values, list) and not values:
                raise SpecError(f"parameter '{key}' in grid document {i} has an empty list of values")
        if "_cmd" in grid:
            grid["_cmd"] = check_commands(grid["_cmd"], template, f"_cmd of grid document {i}")
        if not isinstance(grid.get("_slurm", {}), dict):
            raise SpecError(f"_slurm of grid document {i} must be a mapping of sbatch options")
    if not isinstance(spec.get("slurm") or {}, dict):
        raise SpecError("'slurm' must be a mapping of sbatch options, e.g. {partition: gpu, time: '1:00:00'}")
    spec["alias"] = alias
    return spec, grids


def placeholders(command):
    return [m.group(1) or m.group(2) for m in PLACEHOLDER.finditer(command)]


def check_commands(names, template, where):
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names:
        raise SpecError(f"{where} must list template commands ({', '.join(template)})")
    for name in names:
        if name not in template:
            raise SpecError(f"{where} names command '{name}', which is not in the template ({', '.join(template)})")
    return names


def parse_resources(entries):
    if not isinstance(entries, list) or not entries:
        raise SpecError("the spec needs 'resource': a list of workers such as [0, 1, \"2,3\", cpu] (or pass -r)")
    workers = []
    for entry in entries:
        text = str(entry).replace(" ", "").lower()
        # bool is an int to Python, but "true" is no GPU id
        if (
            isinstance(entry, bool)
            or not isinstance(entry, (int, str))
            or not (text == "cpu" or re.fullmatch(r"\d+(,\d+)*", text))
        ):
            raise SpecError(f'resource {entry!r} is neither a GPU id (0), GPU ids ("0,1") nor cpu')
        workers.append(text)
    return workers


def select_titles(grids, titles):
    if not titles:
        return grids
    for title in titles:
        if not any(str(g.get("_title")) == title for g in grids):
            raise SpecError(f"no grid document has _title '{title}'")
    return [g for g in grids if str(g.get("_title")) in titles]


# ---------------------------------------------------------------- experiments


def expand(spec, grids, only_commands):
    """Every experiment of the grids, once each, as dicts with name, params and commands."""
    template, default, alias = spec["template"], spec["default"], spec["alias"]
    by_params, by_name = {}, {}
    for grid in grids or [{}]:  # a spec without grids runs the defaults once
        keys = [k for k in grid if not str(k).startswith("_")]
        choices = [grid[k] if isinstance(grid[k], list) else [grid[k]] for k in keys]
        wanted = only_commands or grid.get("_cmd") or list(template)
        for combo in itertools.product(*choices):
            chosen = dict(zip(keys, combo))
            implied = dict(default)
            for key, value in chosen.items():
                implied.update(lookup_alias(alias, key, value))
            params = {**implied, **chosen}  # a value the grid writes beats one an alias implies
            # Name only what the grid changed, measured against what its aliases imply,
            # so data: coco reads as Data_coco rather than Data_coco-Imgsz_640.
            name = folder_name([(k, chosen[k]) for k in keys if k not in implied or chosen[k] != implied[k]])
            canon = json.dumps(params, sort_keys=True, default=str)
            if by_name.get(name, {"canon": canon})["canon"] != canon:
                raise SpecError(
                    f"two different experiments would share the folder '{name}'; "
                    "set the parameter that tells them apart in the grid"
                )
            exp = by_params.get(canon)  # the same experiment from another grid runs once
            if exp is None:
                # sbatch options: the spec's, then the grid's; the first grid naming the experiment wins
                slurm = {**(spec.get("slurm") or {}), **grid.get("_slurm", {})}
                exp = {"name": name, "params": params, "canon": canon, "commands": [], "slurm": slurm}
                by_params[canon] = by_name[name] = exp
            exp["commands"] = [c for c in template if c in exp["commands"] or c in wanted]
    return list(by_params.values())


def lookup_alias(alias, key, value):
    try:
        return alias.get(key, {}).get(value, {})
    except TypeError:  # a list value cannot be an alias
        return {}


def folder_name(parts):
    if not parts:
        return "default"
    name = "-".join(f"{str(k)[:1].upper()}{str(k)[1:]}_{show(v)}" for k, v in parts)
    name = re.sub(r"[^\w.,=+-]", "_", name)  # no slashes, spaces or shell-special characters
    if len(name) > 200:  # file names stop at 255 bytes; the hash keeps shortened names apart
        name = name[:180] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def show(value):
    return ",".join(show(v) for v in value) if isinstance(value, list) else str(value)


def render(command, params):
    def replace(match):
        key = match.group(1) or match.group(2)
        value = params[key]
        if match.group(1):
            return quote(value)
        if value is None or value is False:
            return ""
        return f"--{key}" if value is True else f"--{key} {quote(value)}"

    return PLACEHOLDER.sub(replace, command)


def quote(value):
    if isinstance(value, list):  # for nargs='+' options: --imgsz 640 480
        return " ".join(quote(v) for v in value)
    return "" if value is None else shlex.quote(str(value))


def read_json(path, default=None):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path, data):
    # readers (sweep.py table, a rerun) never see half a file
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def still_to_run(exp, force):
    """The commands of exp to run now: everything from the first one that has not succeeded."""
    old = read_json(exp["dir"] / "param")
    if old is not None and old != json.loads(exp["canon"]):
        # The folder name only records differences from the defaults, so editing
        # 'default' can point a name at new values: its old results are stale.
        print(f"note: parameters of {exp['dir']} changed since its last run, running it again", file=sys.stderr)
        force = True
    stat = read_json(exp["dir"] / "stat", {})
    todo = []
    for command in exp["commands"]:
        # Once a command runs again, the later ones must too: they read its output.
        if force or todo or stat.get(command, {}).get("status") != "success":
            todo.append(command)
    return todo


# ---------------------------------------------------------------- running


async def kill_group(pgid):
    """SIGTERM a command's whole process group, SIGKILL whatever outlives the grace period."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def run_command(exp, command, gpus, env, stop):
    """Run one command of exp in its own process group; return success, fail or interrupted."""
    folder, stat = exp["dir"], read_json(exp["dir"] / "stat", {})
    builtins = {"_output": str(folder), "_name": folder.name, "_gpus": gpus}
    line = render(exp["template"][command], {**exp["params"], **builtins})
    log_path = folder / f"log.{command}.{time.strftime('%Y%m%d-%H%M%S')}"
    stat[command] = {
        "status": "running",
        "returncode": None,
        "start": time.strftime(TIME),
        "end": None,
        "gpus": gpus,
        "log": log_path.name,
        "command": line,
    }
    write_json(folder / "stat", stat)
    exp["log"] = log_path
    with open(log_path, "ab") as log:
        log.write(f"$ CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')} {line}\n".encode())
        log.flush()
        # A session of its own keeps the terminal's Ctrl+C away from the command
        # and lets us stop it together with every process it started.
        proc = await asyncio.create_subprocess_shell(
            line, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
        )
    exited, stopping = asyncio.ensure_future(proc.wait()), asyncio.ensure_future(stop.wait())
    await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    interrupted = not exited.done()
    # Also after a normal exit: stray children (dataloader workers, say) would
    # otherwise keep the worker's GPU memory from the next experiment.
    await kill_group(proc.pid)
    code = await exited
    status = "interrupted" if interrupted else "success" if code == 0 else "fail"
    stat[command].update(status=status, returncode=code, end=time.strftime(TIME))
    write_json(folder / "stat", stat)
    return status


def report(word, gpus, command, exp, counts, note=""):
    left = counts["total"] - counts["done"] - counts["failed"] - counts["running"]
    where = "cpu" if gpus == "cpu" else f"gpu {gpus}"
    print(
        f"{word:<5} {where}: {command} {exp['index']}/{counts['total']} {exp['dir']}{note}  "
        f"[done {counts['done']}, failed {counts['failed']}, running {counts['running']}, left {left}]",
        flush=True,
    )


async def worker(gpus, queue, stop, counts, keep_gpus=False):
    env = dict(os.environ)
    if not keep_gpus:  # a SLURM job keeps the CUDA_VISIBLE_DEVICES that SLURM gave it
        env["CUDA_VISIBLE_DEVICES"] = "" if gpus == "cpu" else gpus
    env.setdefault("PYTHONUNBUFFERED", "1")  # logs are files: python would hold output back in 8 KB blocks
    while queue and not stop.is_set():
        exp = queue.popleft()  # one event loop thread: no lock needed
        exp["dir"].mkdir(parents=True, exist_ok=True)
        write_json(exp["dir"] / "param", exp["params"])
        counts["running"] += 1
        status = "success"
        for command in exp["todo"]:
            if stop.is_set():
                status = "interrupted"
                break
            report("START", gpus, command, exp, counts)
            started = time.monotonic()
            status = await run_command(exp, command, gpus, env, stop)
            if status != "success":
                break
            report("DONE", gpus, command, exp, counts, f" ({time.monotonic() - started:.0f}s)")
        counts["running"] -= 1
        if status == "fail":
            counts["failed"] += 1
            counts["failures"].append(f"{exp['dir']}: {command} failed, see {exp['log']}")
            report("FAIL", gpus, command, exp, counts)
        elif status == "interrupted":
            counts["interrupted"] += 1
        else:
            counts["done"] += 1


async def run_all(queue, workers, keep_gpus=False):
    stop, caught = asyncio.Event(), []
    loop = asyncio.get_running_loop()

    def on_signal(signum):
        if not caught:
            print(
                f"\n{signal.Signals(signum).name}: stopping every command (SIGKILL after {GRACE:g}s)",
                file=sys.stderr,
                flush=True,
            )
        caught.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)

    async def guarded(gpus):
        try:
            await worker(gpus, queue, stop, counts, keep_gpus)
        except BaseException:  # e.g. a full disk: stop the other workers' commands too
            stop.set()
            raise

    counts = {"total": len(queue), "done": 0, "failed": 0, "running": 0, "interrupted": 0, "failures": []}
    # let every worker clean up first
    results = await asyncio.gather(*(guarded(gpus) for gpus in workers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return counts, caught[0] if caught else None


def sweep(argv):
    parser = argparse.ArgumentParser(
        prog="sweep.py",
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

    if args.slurm and not args.dry_run:
        return run_slurm(queue, skipped, args.no_wait)

    if args.dry_run:
        for exp in queue:
            gpus = workers[(exp["index"] - 1) % len(workers)]  # a guess: the real one is whoever is free
            print(f"# {exp['index']}/{len(queue)} {exp['dir']} ({gpus})")
            builtins = {"_output": str(exp["dir"]), "_name": exp["name"], "_gpus": gpus}
            for command in exp["todo"]:
                print(render(spec["template"][command], {**exp["params"], **builtins}))
        where = "one SLURM job each" if args.slurm else f"{len(workers)} workers"
        print(f"{len(queue)} experiments to run, {skipped} already done, {where}")
        return 0

    print(
        f"{len(queue)} experiments to run, {skipped} already done, {len(workers)} workers: {' '.join(workers)}",
        flush=True,
    )
    counts, caught = asyncio.run(run_all(queue, workers))
    print(
        f"sweep: {counts['done']} done, {counts['failed']} failed, {counts['interrupted']} interrupted, "
        f"{counts['total'] - counts['done'] - counts['failed'] - counts['interrupted']} not started, "
        f"{skipped} already done",
        flush=True,
    )
    for line in counts["failures"]:
        print(f"FAIL  {line}")
    if caught:
        return 128 + caught
    return 1 if counts["failed"] else 0


# ---------------------------------------------------------------- SLURM

SLURM_JOB = "slurm_job"  # in the experiment folder: the job id and what the job is to run
POLL = float(os.environ.get("SWEEP_POLL", 2))  # seconds between squeue calls while waiting
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "RESIZING"}
ALIVE |= {"SIGNALING", "STAGE_OUT", "REQUEUE_FED"}


def slurm(*cmd):
    """A SLURM client command; a missing one is a SpecError (exit 2) rather than a traceback."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise SpecError(f"{cmd[0]} not found: --slurm needs the SLURM client commands on PATH")


def job_states(ids):
    """{job id: SLURM state} for the ids that squeue still knows; None when squeue itself failed."""
    if not ids:
        return {}
    result = slurm("squeue", "-h", "-o", "%i %T", "-j", ",".join(ids))
    if result.returncode != 0:
        # squeue refuses the whole list when one id is unknown to it (forgotten after MinJobAge): ask one by one
        if len(ids) == 1:
            return {} if "Invalid job id" in result.stderr else None
        states = {}
        for job in ids:
            one = job_states([job])
            if one is None:
                return None
            states.update(one)
        return states
    return dict(line.split()[:2] for line in result.stdout.splitlines() if len(line.split()) >= 2)


def final_state(job):
    """How SLURM says an ended job ended, from sacct; None where accounting is disabled (sacct then fails)."""
    result = slurm("sacct", "-n", "-X", "-P", "-o", "State", "-j", job)
    lines = result.stdout.split() if result.returncode == 0 else []
    return lines[0] if lines else None


def sbatch_options(options):
    """{partition: gpu, gres: "gpu:1", exclusive: true} -> ["--partition=gpu", "--gres=gpu:1", "--exclusive"]"""
    args = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        args.append(f"--{key}" if value is True else f"--{key}={value}")
    return args


def submit(exp):
    """One sbatch job that runs `sweep.py --run-experiment <folder>`; its id, also written to the folder."""
    folder = exp["dir"]
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "param", exp["params"])
    # the job reads what to run from the folder, so a spec edited meanwhile cannot change a queued job
    record = {"job": None, "commands": exp["todo"], "template": {c: exp["template"][c] for c in exp["todo"]}}
    write_json(folder / SLURM_JOB, record)
    run_line = shlex.join([sys.executable, str(Path(__file__).resolve()), "--run-experiment", str(folder)])
    result = slurm(
        "sbatch",
        "--parsable",
        f"--job-name={exp['name'][:100]}",
        f"--output={folder / 'slurm-%j.out'}",
        f"--chdir={os.getcwd()}",  # folders and commands are relative to here, as in a local run
        *sbatch_options(exp["slurm"]),
        f"--wrap=exec {run_line}",
    )
    if result.returncode != 0:
        raise SpecError(f"sbatch refused {folder}: {' '.join(result.stderr.split())}")
    job = result.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    write_json(folder / SLURM_JOB, {**record, "job": job, "submitted": time.strftime(TIME)})
    return job


def outcome(exp):
    """done or failed, from the stat file that the ended job left: the commands it ran must all have succeeded."""
    stat = read_json(exp["dir"] / "stat", {})
    return "done" if all(stat.get(c, {}).get("status") == "success" for c in exp["todo"]) else "failed"


def run_slurm(queue, skipped, no_wait):
    caught = []

    def on_signal(signum, frame):
        caught.append(signum)

    # a flag, not an exception: a Ctrl+C inside sbatch must not lose the id of a job it submitted
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return slurm_loop(queue, skipped, no_wait, caught)
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)


def slurm_loop(queue, skipped, no_wait, caught):
    previous = {}
    for exp in queue:
        exp["job"] = (read_json(exp["dir"] / SLURM_JOB, {}) or {}).get("job")
        if exp["job"]:
            previous[str(exp["job"])] = exp
    states = job_states(list(previous)) if previous else {}
    if states is None:
        raise SpecError("squeue failed: cannot tell which experiments are still queued or running")
    ours, tracked = [], []
    for exp in queue:
        if caught:
            break
        if str(exp["job"]) in previous and states.get(str(exp["job"])) in ALIVE:
            # submitted by an earlier run and not over yet: wait for it rather than run it twice
            print(
                f"QUEUED job {exp['job']} {exp['dir']} (still {states[str(exp['job'])]}, not resubmitted)", flush=True
            )
        else:
            exp["job"] = submit(exp)
            ours.append(exp["job"])
            print(f"SUBMIT job {exp['job']} {exp['dir']}: {' '.join(exp['todo'])}", flush=True)
        tracked.append(exp)
    print(
        f"{len(ours)} experiments submitted, {len(tracked) - len(ours)} still queued from before, "
        f"{skipped} already done",
        flush=True,
    )
    if no_wait and not caught:
        return 0

    state = {exp["job"]: "queued" for exp in tracked}
    last_print = 0.0
    while not caught:
        alive = job_states(list(state))
        if alive is not None:  # squeue failing now and then (a busy controller) only delays the news
            changed = False
            for exp in tracked:
                job, now = exp["job"], state[exp["job"]]
                if now in ("done", "failed"):
                    continue
                slurm_state = alive.get(job)
                if slurm_state in ALIVE:
                    new = "queued" if slurm_state == "PENDING" else "running"
                else:  # over: accounting is often disabled, so the folder's stat file tells how it went
                    new = outcome(exp)
                if new != now:
                    state[job], changed = new, True
                    note = ""
                    if new == "failed":  # TIMEOUT, OUT_OF_MEMORY... say more than a stat left "running"
                        final = final_state(job) or slurm_state
                        note = f" ({final}): see {exp['dir']}" if final else f": see {exp['dir']}"
                    print(f"{new.upper():<7} job {job} {exp['dir']}{note}", flush=True)
            counts = {k: list(state.values()).count(k) for k in ("queued", "running", "done", "failed")}
            if changed or time.monotonic() - last_print > 60:
                print("[" + ", ".join(f"{k} {v}" for k, v in counts.items()) + "]", flush=True)
                last_print = time.monotonic()
            if counts["queued"] + counts["running"] == 0:
                break
        deadline = time.monotonic() + POLL
        while time.monotonic() < deadline and not caught:
            time.sleep(0.1)

    if caught:
        # only what this run submitted: jobs of an earlier run were not ours to start, nor to stop
        live = [job for job in ours if state.get(job) in ("queued", "running")]
        print(f"\n{signal.Signals(caught[0]).name}: cancelling jobs {' '.join(live) or '(none)'}", file=sys.stderr)
        if live:
            slurm("scancel", *live)
        return 128 + caught[0]
    failed = [exp for exp in tracked if state[exp["job"]] == "failed"]
    print(f"sweep: {len(tracked) - len(failed)} done, {len(failed)} failed, {skipped} already done", flush=True)
    for exp in failed:
        print(f"FAIL  {exp['dir']}: job {exp['job']}, see its stat and logs")
    return 1 if failed else 0


def run_experiment(argv):
    """The body of a SLURM job: the commands that slurm_job lists, run like a local worker runs them."""
    folder = Path(argv[0])
    record, params = read_json(folder / SLURM_JOB), read_json(folder / "param")
    if not isinstance(record, dict) or not isinstance(params, dict):
        raise SpecError(f"{folder} has no {SLURM_JOB} and param files written by sweep.py --slurm")
    exp = {"name": folder.name, "dir": folder, "params": params, "template": record["template"], "index": 1}
    exp["todo"] = record["commands"]
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu"  # for {_gpus}; SLURM's own numbering is kept
    counts, caught = asyncio.run(run_all(deque([exp]), [gpus], keep_gpus=True))
    if caught:
        return 128 + caught
    return 1 if counts["failed"] else 0


# ---------------------------------------------------------------- the table


def last_row(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if len(rows) < 2:
        return {}
    # train.py may pad its columns with spaces to line them up
    return {k.strip(): number(v.strip()) for k, v in zip(rows[0], rows[-1])}


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def experiment_status(folder):
    states = {s.get("status") for s in read_json(folder / "stat", {}).values() if isinstance(s, dict)}
    for state in ("fail", "interrupted", "running", "success"):
        if state in states:
            return state
    return ""


def cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value)


def table(argv):
    parser = argparse.ArgumentParser(
        prog="sweep.py table",
        description=(
            "One row per experiment folder of OUT: the parameters that differ across them, then the "
            "last row of any results.csv and the numbers of any metrics.json found in the folder."
        ),
    )
    parser.add_argument("out", help="the sweep's output folder")
    parser.add_argument("--sort", metavar="METRIC", help="sort by this metric, best (largest) first")
    parser.add_argument("--csv", metavar="FILE", help="also write the table to FILE as CSV")
    args = parser.parse_args(argv)

    found = []
    for folder in sorted(Path(args.out).iterdir()) if Path(args.out).is_dir() else []:
        params = read_json(folder / "param")
        if not isinstance(params, dict):
            continue
        metrics = {}
        for path in sorted(folder.rglob("results.csv")):
            metrics.update(last_row(path))
        for path in sorted(folder.rglob("metrics.json")):  # val.py's numbers beat train's last epoch
            data = read_json(path, {})
            metrics.update(
                {k: v for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}
            )
        found.append((folder.name, experiment_status(folder), params, metrics))
    if not found:
        raise SpecError(f"no experiment folders (folders with a 'param' file) in {args.out}")

    def columns(dicts):
        return list(dict.fromkeys(k for d in dicts for k in d))

    varying = [
        k
        for k in columns(f[2] for f in found)
        if len({json.dumps(f[2].get(k), sort_keys=True, default=str) for f in found}) > 1
    ]
    metric_names = columns(f[3] for f in found)
    if args.sort:
        if args.sort not in metric_names:
            raise SpecError(f"no metric named '{args.sort}' in {args.out} (found: {', '.join(metric_names)})")
        # no value: last
        found.sort(key=lambda f: (0, -f[3][args.sort]) if isinstance(f[3].get(args.sort), (int, float)) else (1, 0))

    rows = [["name", "status", *varying, *metric_names]]
    rows += [
        [name, status, *(cell(params.get(k)) for k in varying), *(cell(metrics.get(m)) for m in metric_names)]
        for name, status, params, metrics in found
    ]
    for row in rows:
        print("\t".join(row))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["--run-experiment"]:  # hidden: what each SLURM job runs
            return run_experiment(argv[1:])
        return table(argv[1:]) if argv[:1] == ["table"] else sweep(argv)
    except SpecError as e:
        print(f"sweep.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl+C before any command started
        return 130


if __name__ == "__main__":
    sys.exit(main())
