"""Two processes on one folder: a run folder that two train.py runs would both write, an experiment of a sweep spec
that two tools/sweep.py would both run. Each folder is claimed with an flock on a lock file in it: the kernel
drops the lock when its process ends, however it ends (SIGKILL included), so a killed run leaves no stale lock
for --resume to trip on, unlike a lock file made with O_EXCL. Also the temporary files (.NAME.PID.tmp, from
utils.general.atomic_write) that a process killed while writing left behind.

Standard library only: tools/sweep.py imports this and must start without torch.
"""

import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

from utils.disk import not_written_sentence

LOCK_NAME = ".lock"
TEMPORARY = re.compile(r"\..+\.(\d+)\.tmp(\.\w+)?")  # utils.general.atomic_write's and export.py's temporary names
_held = {}  # (folder, lock name) -> its open lock file, kept open as long as this process holds the folder


class FolderTaken(Exception):
    """The folder is claimed by another live process (its pid, when it wrote one, is in .pid)."""

    def __init__(self, folder, pid):
        super().__init__(f"{folder} is in use by process {pid or 'unknown'}")
        self.folder, self.pid = folder, pid


def _close_inherited():
    # A forked child (a data-loader worker) shares the parent's lock file; were it to keep its copy open, a run
    # killed with SIGKILL would stay claimed until its orphaned workers noticed and exited, and the --resume typed
    # right after would be refused. The parent's copy alone holds the flock: closing the child's does not drop it.
    for fd in _held.values():
        os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited)


def claim(folder, lock_name=LOCK_NAME):
    """Claim `folder` (made if missing) for this process until it exits or release()s it: FolderTaken when
    another process holds it; OSError when the folder cannot be made or written in (read-only, permission)."""
    folder = Path(folder)
    if (str(folder), lock_name) in _held:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / lock_name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FolderTaken(folder, holder) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the other process's sentence only; the flock is the claim
    _held[(str(folder), lock_name)] = fd
    return folder


def release(folder, lock_name=LOCK_NAME):
    fd = _held.pop((str(Path(folder)), lock_name), None)
    if fd is not None:
        os.close(fd)  # closing drops the flock


def claim_next_free(base):
    """runs/train/exp, exp2, ...: the first that this process makes itself with os.mkdir (atomic: of two runs
    started at once, one gets exp3 and the other exp4), then claimed."""
    from utils.general import next_run_dir

    while True:
        folder = next_run_dir(base)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue  # another run made it between the look and the mkdir: the next one
        return claim(folder)


def claim_run_dir(out, default="runs/train/exp"):
    """The run folder of a train.py run, claimed: --out, else the next free runs/train/expN. Two runs on one
    folder, or a folder that cannot be written, stop the second with one sentence (SystemExit) before it writes
    anything. Temporary files that a killed run left in it are removed."""
    try:
        folder = claim(out) if out else claim_next_free(default)
    except FolderTaken as taken:
        raise SystemExit(
            f"--out {taken.folder} is in use by another train.py run (process {taken.pid or 'unknown'}, still "
            "running): two runs writing one folder would overwrite each other's weights and rows; give another "
            "--out, or leave --out out for the next free runs/train/expN"
        ) from None
    except OSError as e:
        where = out or default
        raise SystemExit(f"--out: {not_written_sentence(where, e, 'give --out a folder this user can write in')}")
    remove_stale_temporary_files(folder)
    remove_stale_temporary_files(folder / "weights")
    return folder


def remove_stale_temporary_files(folder):
    """Delete the temporary files of writers that no longer run (a process killed while writing a checkpoint, a
    plot, results.csv). A live process's are left: it is still writing them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.iterdir():
        match = TEMPORARY.fullmatch(path.name)
        if match and not process_alive(int(match.group(1))):
            if path.is_dir():  # an OpenVINO export's folder
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
