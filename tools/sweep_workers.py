"""The local worker pool of tools/sweep.py: one asyncio task per resource entry takes the next experiment and runs its
commands, each in a process group of its own, so that Ctrl+C or SIGTERM stops every process a command started."""

import asyncio
import os
import signal
import sys
import time

from tools.sweep_spec import TIME, read_json, render, write_json
from utils.locks import FolderTaken, claim, release

SWEEP_LOCK = ".sweep.lock"  # not train.py's .lock: a command's --out may be the experiment's folder itself

GRACE = 5.0  # seconds a stopped command gets between SIGTERM and SIGKILL


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
    left = counts["total"] - counts["done"] - counts["failed"] - counts["running"] - counts.get("elsewhere", 0)
    where = "cpu" if gpus == "cpu" else f"gpu {gpus}"
    print(
        f"{word:<5} {where}: {command} {exp['index']}/{counts['total']} {exp['dir']}{note}  "
        f"[done {counts['done']}, failed {counts['failed']}, running {counts['running']}, left {left}]",
        flush=True,
    )


def claim_experiment(exp, sweep_started):
    """None once this process holds the experiment's folder (an flock, utils/locks.py: two tools/sweep.py on one
    spec never run one experiment twice at once); else why another process has it: running it now, or it ran it
    to success after this sweep listed what to run."""
    try:
        claim(exp["dir"], SWEEP_LOCK)
    except FolderTaken as taken:
        return f"another tools/sweep.py (process {taken.pid or 'unknown'}) is running it"
    stat_path = exp["dir"] / "stat"
    stat = read_json(stat_path, {})
    if stat_path.exists() and stat_path.stat().st_mtime > sweep_started:
        if all(stat.get(command, {}).get("status") == "success" for command in exp["todo"]):
            release(exp["dir"], SWEEP_LOCK)
            return "another tools/sweep.py ran it since this one started"
    return None


async def worker(gpus, queue, stop, counts, keep_gpus=False):
    env = dict(os.environ)
    if not keep_gpus:  # a SLURM job keeps the CUDA_VISIBLE_DEVICES that SLURM gave it
        env["CUDA_VISIBLE_DEVICES"] = "" if gpus == "cpu" else gpus
    env.setdefault("PYTHONUNBUFFERED", "1")  # logs are files: python would hold output back in 8 KB blocks
    while queue and not stop.is_set():
        exp = queue.popleft()  # one event loop thread: no lock needed
        elsewhere = claim_experiment(exp, counts["started"])
        if elsewhere:
            counts["elsewhere"] += 1
            report("SKIP", gpus, "-", exp, counts, f": {elsewhere}")
            continue
        write_json(exp["dir"] / "param", exp["params"])
        counts["running"] += 1
        status = "success"
        try:
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
        finally:
            release(exp["dir"], SWEEP_LOCK)
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
    counts.update(elsewhere=0, started=time.time())  # experiments another tools/sweep.py on this spec had
    # let every worker clean up first
    results = await asyncio.gather(*(guarded(gpus) for gpus in workers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return counts, caught[0] if caught else None
