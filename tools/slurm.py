"""tools/sweep.py --slurm: one sbatch job per experiment, each running `tools/sweep.py --run-experiment <folder>`
(run_experiment below), then squeue polled until every job ended; Ctrl+C cancels the jobs this run submitted."""

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from tools.sweep_spec import TIME, SpecError, read_json, write_json
from tools.sweep_workers import run_all

SWEEP = Path(__file__).resolve().with_name("sweep.py")  # what each job runs, from whatever folder it starts in
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
    """One sbatch job that runs `tools/sweep.py --run-experiment <folder>`; its id, also written to the folder."""
    folder = exp["dir"]
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "param", exp["params"])
    # the job reads what to run from the folder, so a spec edited meanwhile cannot change a queued job
    record = {"job": None, "commands": exp["todo"], "template": {c: exp["template"][c] for c in exp["todo"]}}
    write_json(folder / SLURM_JOB, record)
    run_line = shlex.join([sys.executable, str(SWEEP), "--run-experiment", str(folder)])
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
    ours, tracked = submit_all(queue, caught)
    print(
        f"{len(ours)} experiments submitted, {len(tracked) - len(ours)} still queued from before, "
        f"{skipped} already done",
        flush=True,
    )
    if no_wait and not caught:
        return 0
    state = wait_for(tracked, caught)
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


def submit_all(queue, caught):
    """Submit every experiment of the queue but those whose job from an earlier run is still alive; (the job ids
    this run submitted, the experiments to wait for)."""
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
    return ours, tracked


def wait_for(tracked, caught):
    """Poll squeue until every tracked job ended (or a signal came); {job id: queued, running, done or failed}."""
    state = {exp["job"]: "queued" for exp in tracked}
    last_print = 0.0
    while not caught:
        alive = job_states(list(state))
        if alive is not None:  # squeue failing now and then (a busy controller) only delays the news
            changed = update_states(tracked, state, alive)
            counts = {k: list(state.values()).count(k) for k in ("queued", "running", "done", "failed")}
            if changed or time.monotonic() - last_print > 60:
                print("[" + ", ".join(f"{k} {v}" for k, v in counts.items()) + "]", flush=True)
                last_print = time.monotonic()
            if counts["queued"] + counts["running"] == 0:
                break
        deadline = time.monotonic() + POLL
        while time.monotonic() < deadline and not caught:
            time.sleep(0.1)
    return state


def update_states(tracked, state, alive):
    """Move each job's state on from what squeue says (alive: {job id: SLURM state}), printing each change."""
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
    return changed


def run_experiment(argv):
    """The body of a SLURM job: the commands that slurm_job lists, run like a local worker runs them."""
    folder = Path(argv[0])
    record, params = read_json(folder / SLURM_JOB), read_json(folder / "param")
    if not isinstance(record, dict) or not isinstance(params, dict):
        raise SpecError(f"{folder} has no {SLURM_JOB} and param files written by tools/sweep.py --slurm")
    exp = {"name": folder.name, "dir": folder, "params": params, "template": record["template"], "index": 1}
    exp["todo"] = record["commands"]
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu"  # for {_gpus}; SLURM's own numbering is kept
    counts, caught = asyncio.run(run_all(deque([exp]), [gpus], keep_gpus=True))
    if caught:
        return 128 + caught
    return 1 if counts["failed"] else 0
