"""tools/sweep.py --slurm on the single-node cluster of tests/slurm_cluster.py: one sbatch job per experiment, the
same folders as a local run, reruns that resubmit only what failed, and Ctrl+C cancelling what it submitted."""

import os
import signal
import subprocess
import sys
import time

from test_sweep import SWEEP, job, read, write_spec


def sweep(cluster, cwd, *args, timeout=120):
    env = {**cluster.env, "SWEEP_POLL": "0.5"}  # the tests' jobs take a second or two: poll often
    return subprocess.run(
        [sys.executable, str(SWEEP), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def files(folder):
    """What an experiment folder holds, with log time stamps and SLURM's own files left out."""
    names = {p.name for p in folder.iterdir() if p.name != "slurm_job" and not p.name.startswith("slurm-")}
    return sorted(n.rsplit(".", 1)[0] if n.startswith("log.") else n for n in names)


def test_slurm_runs_like_local_and_resubmits_only_the_failure(slurm_cluster, tmp_path):
    spec = {
        "template": {"train": job("train", "lr={lr} map={lr}"), "val": job("val", "need={need}")},
        "default": {"lr": 0.1, "need": "job.py"},
        "resource": ["cpu"],
        "slurm": {"partition": "debug", "time": "0:10:00", "cpus-per-task": 1},
    }
    # the third experiment's val needs a file that is not there yet
    grids = [{"lr": [0.1, 0.2]}, {"lr": 0.3, "need": "marker", "_slurm": {"time": "0:05:00"}}]
    (tmp_path / "local").mkdir()
    write_spec(tmp_path, dict(spec), *grids)
    write_spec(tmp_path / "local", dict(spec), *grids)
    r = sweep(slurm_cluster, tmp_path, "spec.yaml", "--slurm")
    assert r.returncode == 1, r.stdout + r.stderr
    local = sweep(slurm_cluster, tmp_path / "local", "spec.yaml")
    assert local.returncode == 1, local.stdout + local.stderr

    out, names = tmp_path / "out", ["default", "Lr_0.2", "Lr_0.3-Need_marker"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for name in names:
        folder, twin = out / name, tmp_path / "local" / "out" / name
        assert files(folder) == files(twin)
        assert read(folder / "param") == read(twin / "param")
        stat, twin_stat = read(folder / "stat"), read(twin / "stat")
        assert {c: s["status"] for c, s in stat.items()} == {c: s["status"] for c, s in twin_stat.items()}
        assert stat.keys() == twin_stat.keys() and stat["train"].keys() == twin_stat["train"].keys()
    assert read(out / "Lr_0.3-Need_marker" / "stat")["val"]["returncode"] == 3
    assert "FAILED" in r.stdout and "[queued" in r.stdout

    jobs = {name: read(out / name / "slurm_job")["job"] for name in names}
    limits = {name: slurm_cluster.run("scontrol", "show", "job", "-o", jobs[name]) for name in names}
    assert "TimeLimit=00:10:00" in limits["default"] and "TimeLimit=00:05:00" in limits["Lr_0.3-Need_marker"]

    table = subprocess.run([sys.executable, str(SWEEP), "table", "out"], cwd=tmp_path, capture_output=True, text=True)
    rows = {line.split("\t")[0]: line.split("\t") for line in table.stdout.splitlines()}
    assert rows["default"][1] == "success" and rows["Lr_0.3-Need_marker"][1] == "fail"
    assert "mAP50-95" in rows["name"] and "recall" in rows["name"]

    (tmp_path / "marker").touch()
    r = sweep(slurm_cluster, tmp_path, "spec.yaml", "--slurm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 experiments submitted" in r.stdout and "2 already done" in r.stdout
    failed = out / "Lr_0.3-Need_marker"
    assert read(failed / "slurm_job")["job"] != jobs["Lr_0.3-Need_marker"]
    assert read(failed / "slurm_job")["commands"] == ["val"]  # train had succeeded: only val again
    assert (failed / "train.count").read_text().count("ran") == 1
    assert (failed / "val.count").read_text().count("ran") == 2
    for name in ("default", "Lr_0.2"):
        assert read(out / name / "slurm_job")["job"] == jobs[name]
        assert (out / name / "val.count").read_text().count("ran") == 1
    table = subprocess.run([sys.executable, str(SWEEP), "table", "out"], cwd=tmp_path, capture_output=True, text=True)
    assert [line.split("\t")[1] for line in table.stdout.splitlines()[1:]] == ["success"] * 3


def test_slurm_no_wait_then_a_rerun_does_not_resubmit_live_jobs(slurm_cluster, tmp_path):
    spec = write_spec(
        tmp_path,
        {"template": {"train": job("train", "sleep=5 lr={lr}")}, "default": {"lr": 1}, "slurm": {"time": 5}},
        {"lr": [1, 2]},
    )
    started = time.monotonic()
    r = sweep(slurm_cluster, tmp_path, spec, "--slurm", "--no-wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - started < 5  # did not wait for the 5 s jobs
    out = tmp_path / "out"
    jobs = {name: read(out / name / "slurm_job")["job"] for name in ("default", "Lr_2")}
    r = sweep(slurm_cluster, tmp_path, spec, "--slurm")  # the jobs are still queued or running
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 experiments submitted, 2 still queued from before" in r.stdout
    assert r.stdout.count("not resubmitted") == 2
    for name, job_id in jobs.items():
        assert read(out / name / "slurm_job")["job"] == job_id
        assert (out / name / "train.count").read_text().count("ran") == 1
        assert read(out / name / "stat")["train"]["status"] == "success"


def test_slurm_ctrl_c_cancels_the_jobs_it_submitted(slurm_cluster, tmp_path):
    spec = write_spec(tmp_path, {"template": {"train": job("train", "sleep=60")}, "default": {}})
    env = {**slurm_cluster.env, "SWEEP_POLL": "0.5"}
    proc = subprocess.Popen(
        [sys.executable, str(SWEEP), spec, "--slurm"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    folder = tmp_path / "out" / "default"
    try:
        deadline = time.monotonic() + 60
        while not (folder / "train.pid").exists():  # the command itself is running inside the job
            assert proc.poll() is None and time.monotonic() < deadline, slurm_cluster.log_tail()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    job_id = read(folder / "slurm_job")["job"]
    assert slurm_cluster.wait(job_id, timeout=60) == ["CANCELLED"]
    pid = read(folder / "train.pid")["pid"]
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{pid}")
