"""train.py under SLURM: the rendezvous derived from SLURM's variables (faked here), then real srun/sbatch runs
on a single-node cluster started on localhost for these tests (tests/slurm_cluster.py)."""

import os
import stat
import subprocess

import pytest

from utils import distributed

SLURM_TASK = {  # what srun -N 2 -n 4 tells its task 3 (the second on the second node)
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7",
}


@pytest.fixture
def slurm_task(monkeypatch, tmp_path):
    """SLURM's variables for one task and a fake `scontrol` first on PATH; process-group creation recorded."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    # what the real one prints for gpu[07-08]; it logs its arguments to show it was asked
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/asked\nprintf "gpu07\\ngpu08\\n"\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    started = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **kw: started.append((a, kw)))
    return started


def test_srun_alone_gives_the_ranks_and_the_rendezvous_of_the_first_node(slurm_task, tmp_path):
    device, rank, local_rank, world_size, _ = distributed.setup_distributed("cpu")
    assert (str(device), rank, local_rank, world_size) == ("cpu", 3, 1, 4)
    assert slurm_task[0][0] == ("gloo",)
    assert os.environ["MASTER_ADDR"] == "gpu07" and os.environ["LOCAL_WORLD_SIZE"] == "2"
    assert os.environ["MASTER_PORT"] == str(10000 + 123456 % 20000)
    assert (tmp_path / "asked").read_text().split() == ["show", "hostnames", "gpu[07-08]"]


def test_the_users_master_addr_and_port_are_kept(slurm_task, monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    distributed.setup_distributed("cpu")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.1.2.3", "29500")
    assert not (tmp_path / "asked").exists()  # nothing to look up


def test_two_jobs_on_one_node_get_two_ports():
    ports = {distributed.slurm_rendezvous({"SLURM_JOB_ID": j, "MASTER_ADDR": "n1"})["MASTER_PORT"] for j in "78"}
    assert len(ports) == 2 and all(10000 <= int(p) < 30000 for p in ports)


def test_without_scontrol_a_plain_node_name_or_the_launch_address_is_the_master():
    def missing(*args, **kwargs):
        raise FileNotFoundError("scontrol")

    assert distributed.first_host("node17", "10.0.0.9", run=missing) == "node17"
    assert distributed.first_host("node[17-18]", "10.0.0.9", run=missing) == "10.0.0.9"
    failed = lambda *a, **kw: subprocess.CompletedProcess(a, 1, "", "error")  # noqa: E731
    assert distributed.first_host("a,b", "10.0.0.9", run=failed) == "10.0.0.9"
    with pytest.raises(SystemExit, match="export MASTER_ADDR"):
        distributed.first_host("node[17-18]", None, run=missing)


@pytest.mark.parametrize(
    "spec, node, tasks", [("2(x3),1", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4", 0, 4), (None, 0, 1)]
)
def test_tasks_on_this_node_from_slurms_compact_form(spec, node, tasks):
    env = {"SLURM_NODEID": str(node)} | ({"SLURM_STEP_TASKS_PER_NODE": spec} if spec else {})
    assert distributed.slurm_tasks_on_this_node(env) == tasks


def test_the_local_cluster_runs_tasks_and_job_arrays(slurm_cluster):
    assert slurm_cluster.run("srun", "-n", "2", "hostname").split() == [slurm_cluster.node] * 2
    job = slurm_cluster.run("sbatch", "--parsable", "--array=0-2", "-o", "/dev/null", "--wrap", "true").strip()
    assert slurm_cluster.wait(job) == ["COMPLETED"] * 3
