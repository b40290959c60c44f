"""train.py under SLURM: the rendezvous derived from SLURM's variables (faked here), then real srun/sbatch runs
on a single-node cluster started on localhost for these tests (tests/slurm_cluster.py)."""

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from train_runs import load, tensors_equal

from utils import distributed
from utils.data.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]

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
    # setup_distributed writes these into os.environ: set then deleted here, monkeypatch restores them afterwards
    # (a key it only deleted while absent is not restored, and the ranks would leak into the next tests' runs)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
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


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    names = ["circle", "square", "triangle", "star", "cross", "hexagon"]
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": names}))
    return cfg


def saving_rank_weights(tmp_path):
    """A script that runs train.py unchanged, then saves this rank's final model as rank{RANK}.pt."""
    saver = tmp_path / "save_ranks.py"
    saver.write_text(
        textwrap.dedent(f"""
        import json, os, runpy, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        sys.argv = ["train.py"] + sys.argv[1:]
        g = runpy.run_path("train.py", run_name="__main__")
        from utils.ema import unwrap
        out = {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}"
        torch.save(unwrap(g["model"]).state_dict(), out + ".pt")
        seen = {{k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID")}}
        with open(out + ".json", "w") as f:
            json.dump({{**seen, "world_size": g["world_size"], "local_rank": g["local_rank"]}}, f)
        """)
    )
    return saver


def without_rendezvous(env):
    """The cluster's environment without anything a user might have exported for torch.distributed."""
    return {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def test_srun_two_cpu_tasks_end_with_identical_weights(slurm_cluster, tiny_data, tmp_path):
    cmd = ["srun", "-n", "2", "--kill-on-bad-exit=1", "--time=5", sys.executable, saving_rank_weights(tmp_path)]
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "8", "--out", tmp_path / "run", *TINY]
    result = subprocess.run(
        list(map(str, cmd + args)),
        cwd=REPO,
        env=without_rendezvous(slurm_cluster.env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "run/weights/last.pt").exists()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    port = str(10000 + int(seen[0]["SLURM_JOB_ID"]) % 20000)
    expected = {"MASTER_ADDR": slurm_cluster.node, "MASTER_PORT": port, "LOCAL_WORLD_SIZE": "2", "world_size": 2}
    assert [{k: s[k] for k in expected} for s in seen] == [expected] * 2  # one run of two ranks, not two runs
    assert sorted(s["local_rank"] for s in seen) == [0, 1]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    params = [k for k in rank0 if "running" not in k and "num_batches" not in k]  # BN stats stay per rank (M2)
    assert [k for k in params if not torch.equal(rank0[k], rank1[k])] == []


def test_a_preempted_job_saves_and_a_second_submission_resumes_it_exactly(slurm_cluster, tiny_data, tmp_path):
    """`scancel --signal=TERM JOB` sends SIGTERM to every task of the job's steps, as `#SBATCH --signal=TERM@120`
    does before the time limit. Not --full: srun itself, given SIGTERM, kills its tasks at once ("srun: forcing
    job termination") and last.pt of the step under way is lost."""
    cluster = slurm_cluster._replace(env=without_rendezvous(slurm_cluster.env))
    train = ["--data", tiny_data, "--epochs", "3", "--save-every", "1", "--deterministic", "--val-every", "3", *TINY]

    def submit(name, *args):
        return cluster.run(
            *("sbatch", "--parsable", "-n", "2", "--time=10", "-J", name, "-o", tmp_path / f"{name}.out"),
            *("--chdir", REPO, "--wrap", "srun --kill-on-bad-exit=1 " + shlex.join(map(str, args))),
        ).strip()

    def log(name):
        path = tmp_path / f"{name}.out"
        return path.read_text()[-3000:] if path.exists() else ""

    # two jobs on one node at once: each listens on a port of its own
    straight = submit("straight", sys.executable, "train.py", *train, "--out", tmp_path / "straight")
    out = tmp_path / "preempted"
    job = submit("preempted", sys.executable, "train.py", *train, "--out", out)
    last, seen, deadline = out / "weights" / "last.pt", set(), time.time() + 240
    while len(seen) < 2 and time.time() < deadline:  # the second save: it trains, its handlers are in place
        if last.exists():
            seen.add(last.stat().st_mtime_ns)
        time.sleep(0.02)
    cluster.run("scancel", "--signal=TERM", job)
    assert cluster.wait(job) == ["COMPLETED"], log("preempted")  # exit 0: stopped on purpose, not failed
    assert "resume with --resume" in log("preempted")
    state = load(last)
    assert (state["epoch"], state["iteration"]) < (3, 0), "the job finished before it was pre-empted"

    resumed = submit("resumed", sys.executable, "train.py", "--resume", last)
    assert cluster.wait(resumed) == ["COMPLETED"], log("resumed")
    assert cluster.wait(straight) == ["COMPLETED"], log("straight")
    straight, resumed = load(tmp_path / "straight/weights/last.pt"), load(last)
    for key in ("model", "ema", "optimizer"):
        assert tensors_equal(straight[key], resumed[key]), key
    assert straight["ema_updates"] == resumed["ema_updates"]
