"""A real single-node SLURM cluster on localhost for the tests: munged, slurmctld and slurmd from Debian's
slurm-wlm and munge packages (.ci/run installs them), every file in one temporary folder, ports of its own.

    def test_something(slurm_cluster):
        subprocess.run(["srun", "-n", "2", "hostname"], env=slurm_cluster.env, check=True)

The daemons run as root (SlurmUser=root), as CI does; they listen on 127.0.0.1 only and are stopped when
pytest ends, with every job still in the cluster cancelled first.
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import pytest

START_TIMEOUT = 60  # seconds for the node to show up idle: it takes 2-5 s here
STOP_TIMEOUT = 15
# Slurm counts CPUs from this figure, not the machine's (SlurmdParameters=config_overrides), so that a 1-core
# CI runner still fits the 2-task jobs of the tests; the tasks are tiny and share the cores.
CPUS = max(4, os.cpu_count() or 1)


class SlurmCluster(NamedTuple):
    root: Path  # the temporary folder: slurm.conf, state, spool, logs
    env: dict  # os.environ with SLURM_CONF pointing at this cluster; pass it to srun/sbatch/squeue/scancel
    node: str

    def run(self, *cmd, check=True, timeout=60, **kwargs):
        """A SLURM client command (sbatch, squeue, scancel, ...) against this cluster; its stdout."""
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise AssertionError(f"{cmd} exited {result.returncode}: {result.stdout[-2000:]}{result.stderr[-2000:]}")
        return result.stdout

    def wait(self, job, timeout=240):
        """The final state of each element of a job (COMPLETED, FAILED, CANCELLED, ...), once none is left
        pending or running; squeue would forget the job, `scontrol show job` keeps it for MinJobAge."""
        deadline = time.time() + timeout
        while True:
            lines = self.run("scontrol", "show", "job", "-o", str(job)).splitlines()
            states = [
                field.split("=", 1)[1] for line in lines for field in line.split() if field.startswith("JobState=")
            ]
            if states and not {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"} & set(states):
                return states
            if time.time() > deadline:
                raise AssertionError(f"job {job} still {states} after {timeout} s\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, chars=3000):
        """The end of each daemon's log, for a failure message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.root.glob("*.log"))
        )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(root, node, munge_socket):
    ctld_port, slurmd_port = free_port(), free_port()
    while slurmd_port == ctld_port:
        slurmd_port = free_port()
    lines = {
        "ClusterName": "testcluster",
        "SlurmctldHost": f"{node}(127.0.0.1)",
        "SlurmctldPort": ctld_port,
        "SlurmdPort": slurmd_port,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "AuthInfo": f"socket={munge_socket}",
        "StateSaveLocation": root / "state",
        "SlurmdSpoolDir": root / "spool",
        "SlurmctldPidFile": root / "slurmctld.pid",
        "SlurmdPidFile": root / "slurmd.pid",
        "SlurmctldLogFile": root / "slurmctld.log",
        "SlurmdLogFile": root / "slurmd.log",
        "SlurmctldDebug": "info",
        "SlurmdDebug": "info",
        "ProctrackType": "proctrack/linuxproc",  # no cgroups: containers and CI runners seldom delegate them
        "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "SlurmdParameters": "config_overrides",
        "ReturnToService": 2,
        "MpiDefault": "none",
        "SwitchType": "switch/none",
        "JobCompType": "jobcomp/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "SchedulerType": "sched/backfill",
        "SchedulerParameters": "sched_interval=1",  # a job submitted starts within a second, not a minute
        "MinJobAge": 600,  # finished jobs stay visible to squeue/scontrol for the whole test session
        "KillWait": 10,  # seconds between scancel's SIGTERM and SIGKILL: the time train.py has to save
        "InactiveLimit": 0,
        "SlurmctldTimeout": 30,
        "SlurmdTimeout": 30,
        "NodeName": f"{node} NodeAddr=127.0.0.1 NodeHostname={node} CPUs={CPUS} RealMemory=1000 State=UNKNOWN",
        "PartitionName": "debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
    }
    conf = root / "slurm.conf"
    conf.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
    return conf


def start(cmd, log, env):
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(processes):
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.time() + STOP_TIMEOUT
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what this daemon started
            proc.wait(timeout=STOP_TIMEOUT)


def wait_idle(cluster, processes):
    deadline = time.time() + START_TIMEOUT
    state = ""
    while time.time() < deadline:
        if any(p.poll() is not None for p in processes):
            break
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%t"], env=cluster.env, capture_output=True, text=True, timeout=30
        )
        state = result.stdout.strip() + result.stderr.strip()
        if state == "idle":
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"the test SLURM node is not idle after {START_TIMEOUT} s (sinfo: {state!r})\n{cluster.log_tail()}"
    )


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = [name for name in ("slurmctld", "slurmd", "munged", "sbatch") if not shutil.which(name)]
    if missing:
        why = f"{', '.join(missing)} not found: as root, apt-get install slurm-wlm munge (.ci/run does)"
        if os.environ.get("CI") == "true":  # .ci/run installs them: there a missing daemon is a failure, never a skip
            pytest.fail(why)
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool", "munge"):
        (root / folder).mkdir()
    (root / "munge").chmod(0o700)  # munged refuses a key or socket folder that others may write to
    key, munge_socket = root / "munge" / "munge.key", root / "munge" / "munge.socket"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=30)
    node = socket.gethostname().split(".")[0]
    conf = write_config(root, node, munge_socket)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
        if name != "SLURM_CONF":  # the tests may themselves run inside a SLURM job: not this cluster's
            del env[name]
    cluster = SlurmCluster(root, env, node)
    processes = []
    try:
        munge = [
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge_socket}",
            f"--key-file={key}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--seed-file={root / 'munge' / 'munged.seed'}",
            f"--log-file={root / 'munged.log'}",
        ]
        processes.append(start(munge, root / "munged.out", env))
        deadline = time.time() + START_TIMEOUT
        while not munge_socket.exists() and processes[0].poll() is None and time.time() < deadline:
            time.sleep(0.1)
        processes.append(start(["slurmctld", "-D", "-i", "-f", str(conf)], root / "slurmctld.out", env))
        processes.append(start(["slurmd", "-D", "-N", node, "-f", str(conf)], root / "slurmd.out", env))
        wait_idle(cluster, processes)
        yield cluster
    finally:
        if processes:
            cancel_jobs(cluster)
        stop(processes[::-1])  # slurmd, slurmctld, then munged, which the other two talk to
        stop_leftovers(conf)


def cancel_jobs(cluster):
    """Cancels every job of the cluster and waits (bounded) for them to end, while slurmd can still clean up."""
    subprocess.run(["scancel", "--full", "--partition=debug"], env=cluster.env, capture_output=True, timeout=30)
    deadline = time.time() + STOP_TIMEOUT
    while time.time() < deadline:
        result = subprocess.run(["squeue", "-h"], env=cluster.env, capture_output=True, text=True, timeout=30)
        if result.returncode != 0 or not result.stdout.strip():
            return
        time.sleep(0.5)


def stop_leftovers(conf):
    """SIGKILL for what outlived the daemons: slurmstepd and job tasks leave slurmd's session, but all of them,
    and nothing else on the machine, carry SLURM_CONF=<this cluster's slurm.conf> in their environment."""
    mark = f"SLURM_CONF={conf}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone meanwhile, or not ours to read
