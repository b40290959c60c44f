"""CPU time of processes from /proc, shared by bench_dataloader.py and ultralytics_dataloader.py (which runs in
the peer venv: this file imports nothing of the repo)."""

import os


def cpu_seconds(pids):
    """User + system CPU seconds these processes have used so far (Linux /proc), or None. Images per CPU-second
    of the workers is what one core would deliver if it were theirs alone: far less noisy than images/s on a
    shared machine, where the workers also wait for the cores."""
    try:
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            total += int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of stat
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
