"""Tests for tools/sweep.py (and the one sentence that sweep.py, its old path, answers with). Commands are tiny python
scripts instead of training runs."""

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tools" / "sweep.py"
PY = shlex.quote(sys.executable)

# Stands in for train.py / val.py: records when it ran, where (CUDA_VISIBLE_DEVICES),
# its pid and its arguments into OUT/STEP.json, then sleeps, fails or writes metrics
# as its key=value arguments say.
JOB = r"""
import json, os, subprocess, sys, time
out, step = sys.argv[1], sys.argv[2]
opts = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
record = {"start": time.time(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
          "argv": sys.argv[3:]}
if "child" in opts:  # a grandchild that ignores SIGTERM: only SIGKILL stops it
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    record["child"] = subprocess.Popen([sys.executable, "-c", code]).pid
with open(os.path.join(out, step + ".pid"), "w") as f:
    json.dump(record, f)
with open(os.path.join(out, step + ".count"), "a") as f:
    f.write("ran\n")
time.sleep(float(opts.get("sleep", 0)))
if "--fail" in sys.argv or ("need" in opts and not os.path.exists(opts["need"])):
    sys.exit(3)
if "map" in opts:  # fake train.py / val.py outputs
    m = float(opts["map"])
    os.makedirs(os.path.join(out, "train"), exist_ok=True)
    with open(os.path.join(out, "train", "results.csv"), "w") as f:
        f.write("epoch,box_loss,mAP50,mAP50-95\n0,2.0,0.1,0.05\n1,1.5,%s,%s\n" % (m * 2, m))
    os.makedirs(os.path.join(out, "val"), exist_ok=True)
    with open(os.path.join(out, "val", "metrics.json"), "w") as f:
        json.dump({"precision": 0.5, "recall": m + 0.1}, f)
record["end"] = time.time()
with open(os.path.join(out, step + ".json"), "w") as f:
    json.dump(record, f)
"""


def job(step, args=""):
    return f"{PY} job.py {{_output}} {step} {args}"


def write_spec(tmp_path, spec, *grids, name="spec.yaml"):
    (tmp_path / "job.py").write_text(JOB)
    spec.setdefault("output", "out")
    (tmp_path / name).write_text(yaml.safe_dump_all([spec, *grids], sort_keys=False))
    return name


def sweep(tmp_path, *args, timeout=60):
    return subprocess.run(
        [sys.executable, str(SWEEP), *map(str, args)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )


def read(path):
    return json.loads(Path(path).read_text())


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, whether or not anyone has reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_grid_runs_concurrently_on_workers(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "template": {"train": job("train", "lr={lr} gpus={_gpus} name={_name} sleep=1"), "val": job("val")},
            "default": {"lr": 0.01, "mosaic": 0.5},
            "resource": ["cpu", "0,1"],
        },
        {"lr": [0.1, 0.2], "mosaic": [0.0, 1]},
    )
    r = sweep(tmp_path, spec)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    names = {"Lr_0.1-Mosaic_0.0", "Lr_0.1-Mosaic_1", "Lr_0.2-Mosaic_0.0", "Lr_0.2-Mosaic_1"}
    assert {p.name for p in out.iterdir()} == names
    intervals, workers = [], set()
    for name in names:
        folder = out / name
        params = read(folder / "param")
        assert params["lr"] in (0.1, 0.2) and params["mosaic"] in (0.0, 1)
        stat = read(folder / "stat")
        assert [stat[c]["status"] for c in ("train", "val")] == ["success", "success"]
        assert stat["train"]["returncode"] == 0 and stat["train"]["start"] and stat["train"]["end"]
        assert len(list(folder.glob("log.train.*"))) == 1 and len(list(folder.glob("log.val.*"))) == 1
        rec = read(folder / "train.json")
        opts = dict(a.split("=", 1) for a in rec["argv"])
        assert opts["name"] == name and float(opts["lr"]) == params["lr"]
        # each command sees exactly its worker's GPUs
        assert rec["cvd"] == {"cpu": "", "0,1": "0,1"}[opts["gpus"]]
        workers.add(opts["gpus"])
        intervals.append((rec["start"], rec["end"]))
    assert workers == {"cpu", "0,1"}
    intervals.sort()
    assert any(b[0] < a[1] for a, b in zip(intervals, intervals[1:])), "no two experiments overlapped"
    assert "START" in r.stdout and "DONE" in r.stdout


def test_failure_stops_only_that_experiment(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "template": {"train": job("train", "[fail]"), "val": job("val")},
            "default": {"fail": False},
            "resource": ["cpu"],
        },
        {"fail": [False, True]},
    )
    r = sweep(tmp_path, spec)
    assert r.returncode == 1
    bad, good = tmp_path / "out" / "Fail_True", tmp_path / "out" / "default"
    stat = read(bad / "stat")
    assert stat["train"]["status"] == "fail" and stat["train"]["returncode"] == 3
    assert "val" not in stat and not (bad / "val.json").exists()
    assert "--fail" in read(bad / "train.pid")["argv"]
    assert [s["status"] for s in read(good / "stat").values()] == ["success", "success"]
    assert "FAIL" in r.stdout


def test_rerun_skips_successes_and_retries_failures(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "template": {"train": job("train"), "val": job("val", "need={marker}")},
            "default": {"marker": "marker", "lr": 1},
            "resource": ["cpu", "cpu"],
        },
        {"lr": [1, 2]},
    )
    out = tmp_path / "out"
    assert sweep(tmp_path, spec).returncode == 1
    assert read(out / "Lr_2" / "stat")["val"]["status"] == "fail"
    (tmp_path / "marker").touch()
    r = sweep(tmp_path, spec)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("default", "Lr_2"):
        assert (out / name / "train.count").read_text().count("ran") == 1  # train was not redone
        assert (out / name / "val.count").read_text().count("ran") == 2
        assert read(out / name / "stat")["val"]["status"] == "success"
    r = sweep(tmp_path, spec)  # all done: nothing runs
    assert r.returncode == 0 and "START" not in r.stdout
    assert (out / "Lr_2" / "val.count").read_text().count("ran") == 2
    r = sweep(tmp_path, spec, "--force", "-c", "val")
    assert r.returncode == 0
    assert (out / "Lr_2" / "val.count").read_text().count("ran") == 3
    assert (out / "Lr_2" / "train.count").read_text().count("ran") == 1


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_kills_every_child(tmp_path, signum, code):
    spec = write_spec(
        tmp_path,
        {
            "template": {"train": job("train", "sleep=30 child=1"), "val": job("val")},
            "default": {"lr": 1},
            "resource": ["cpu", "cpu"],
        },
        {"lr": [1, 2, 3]},
    )
    proc = subprocess.Popen(
        [sys.executable, str(SWEEP), spec], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pidfiles = [tmp_path / "out" / name / "train.pid" for name in ("default", "Lr_2")]
    pids = []
    try:
        deadline = time.time() + 15
        while not all(p.exists() and p.read_text() for p in pidfiles):
            assert time.time() < deadline and proc.poll() is None, "children never started"
            time.sleep(0.1)
        pids = [pid for p in pidfiles for pid in (read(p)["pid"], read(p)["child"])]
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=20)  # grace period included
        assert proc.returncode == code, stderr
        deadline = time.time() + 3
        while any(alive(pid) for pid in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)], "orphans left running"
    finally:  # whatever happened, leave nothing behind for the next test
        for pid in [proc.pid, *pids]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    for p in pidfiles:
        stat = read(p.parent / "stat")
        assert stat["train"]["status"] == "interrupted" and "val" not in stat
    assert not (tmp_path / "out" / "Lr_3").exists()  # never started


def test_table_sorted_by_metric(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "template": {"train": job("train", "map={map}")},
            "default": {"map": 0.3, "lr": 0.01},
            "resource": ["cpu", "cpu"],
        },
        {"map": [0.2, 0.4], "lr": 0.02},
        {"map": 0.3},
    )
    assert sweep(tmp_path, spec).returncode == 0
    r = sweep(tmp_path, "table", "out", "--sort", "mAP50-95", "--csv", "t.csv")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    header, body = rows[0], rows[1:]
    assert header[:4] == ["name", "status", "map", "lr"]  # params that differ, then metrics
    assert {"mAP50", "mAP50-95", "box_loss", "precision", "recall"} <= set(header)
    assert [row[0] for row in body] == ["Map_0.4-Lr_0.02", "default", "Map_0.2-Lr_0.02"]
    col = header.index("mAP50-95")
    assert [float(row[col]) for row in body] == [0.4, 0.3, 0.2]  # last row of results.csv
    assert float(body[0][header.index("recall")]) == pytest.approx(0.5)  # from metrics.json
    with open(tmp_path / "t.csv", newline="") as f:
        assert list(csv.reader(f)) == rows
    r = sweep(tmp_path, "table", "out", "--sort", "nope")
    assert r.returncode == 2 and "nope" in r.stderr


def test_dry_run_renders_and_runs_nothing(tmp_path):
    spec = write_spec(
        tmp_path,
        {
            "template": {
                "train": "python train.py --lr0 {lr0} [resume] [weights] [cos] --out {_output}/train",
                "val": "python val.py --gpus {_gpus} --out ${HOME}/{_name}",
            },
            "default": {"lr0": 0.01, "resume": None, "weights": None, "cos": False},
            "resource": ["cpu"],
            "alias": {"lr0": {"high": {"cos": True}}},
        },
        {"resume": [None, "last.pt"], "note": "fix"},
        {"_title": "b", "_cmd": ["train"], "resume": "last.pt", "note": "fix"},  # same experiment again
        {"_title": "c", "lr0": ["high", 0.01]},
    )
    r = sweep(tmp_path, spec, "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "python train.py --lr0 0.01    --out out/Note_fix/train" in lines  # null and false: nothing
    assert "python train.py --lr0 0.01 --resume last.pt   --out out/Resume_last.pt-Note_fix/train" in lines
    assert "python val.py --gpus cpu --out ${HOME}/Resume_last.pt-Note_fix" in lines
    assert "python train.py --lr0 high   --cos --out out/Lr0_high/train" in lines  # alias sets cos
    assert sum(line.startswith("#") for line in lines) == 4  # deduplicated; lr0 0.01 is "default"
    assert "# 4/4 out/default (cpu)" in lines
    assert "Orphan params: note" in r.stderr
    assert not (tmp_path / "out").exists()
    r = sweep(tmp_path, spec, "--dry-run", "-t", "c", "-r", "0", "1,2", "-c", "val")
    assert r.returncode == 0, r.stderr
    assert [x for x in r.stdout.splitlines() if x.startswith("python")] == [
        "python val.py --gpus 0 --out ${HOME}/Lr0_high",
        "python val.py --gpus 1,2 --out ${HOME}/default",
    ]


def test_example_spec():
    r = subprocess.run(
        [sys.executable, str(SWEEP), "data/sweep_shapes.yaml", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    commands = [x for x in r.stdout.splitlines() if x.startswith("python")]
    assert len(commands) == 8
    assert all("--data data/shapes.yaml" in c and "--device cpu" in c for c in commands)
    assert sum("--lr0 0.004 --mosaic 0.0" in c for c in commands) == 1


BASE = {"template": {"train": "echo {lr}"}, "default": {"lr": 1}, "resource": ["cpu"]}


@pytest.mark.parametrize(
    "spec,grids,args,culprit",
    [
        ({**BASE, "template": {"train": "echo {lr} {lr1}"}}, [], [], "lr1"),
        (BASE, [{"lr": []}], [], "'lr'"),
        ({**BASE, "resource": [0, "gpu3"]}, [], [], "gpu3"),
        ({**BASE, "resource": [0.5]}, [], [], "0.5"),
        ({**BASE, "resource": []}, [], [], "resource"),
        ({k: v for k, v in BASE.items() if k != "template"}, [], [], "template"),
        ({k: v for k, v in BASE.items() if k != "default"}, [], [], "default"),
        ({**BASE, "templates": {}}, [], [], "templates"),
        (BASE, [{"_cmd": ["tran"], "lr": 2}], [], "tran"),
        (BASE, [{"_tilte": "x", "lr": 2}], [], "_tilte"),
        (BASE, [{"lr": 2}], ["-t", "missing"], "missing"),
        (BASE, [{"lr": 2}], ["-c", "vall"], "vall"),
        (BASE, [{"lr": 2}], ["-r", "cpu", "x1"], "x1"),
        (BASE, [], ["nothere.yaml"], "nothere.yaml"),
    ],
)
def test_bad_spec(tmp_path, spec, grids, args, culprit):
    name = write_spec(tmp_path, dict(spec), *grids)
    if args[:1] == ["nothere.yaml"]:
        name, args = "nothere.yaml", []
    r = sweep(tmp_path, name, *args)
    assert r.returncode == 2
    message = r.stderr.strip()
    assert "\n" not in message and "Traceback" not in message and culprit in message, message
    assert not (tmp_path / "out").exists()


def test_bad_yaml(tmp_path):
    (tmp_path / "spec.yaml").write_text("template: {train: [\n")
    r = sweep(tmp_path, "spec.yaml")
    assert r.returncode == 2 and "not valid YAML" in r.stderr and "\n" not in r.stderr.strip()


@pytest.mark.parametrize("args", [["spec.yaml"], ["table", "out"], []])
def test_old_path_names_the_new_one(tmp_path, args):
    r = subprocess.run([sys.executable, str(ROOT / "sweep.py"), *args], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == ""
    message = r.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith("sweep.py moved: run python tools/sweep.py " + (" ".join(args) or "SPEC.yaml")), message
    assert not (tmp_path / "out").exists()
