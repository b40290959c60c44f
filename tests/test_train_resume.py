"""Stopping and resuming train.py (issue 4): SIGKILL then --resume to bitwise identical weights, SIGTERM to the process
group, --resume finding the newest last.pt, a change of --amp-dtype across a resume, a finished run extended."""

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from train_runs import REPO, TINY, load, make_wrapper, run, tensors_equal


# 26n: two heads, ProgLoss by epoch, no DFL; with MuSGD, whose two momentum buffers per conv weight last.pt keeps
@pytest.mark.parametrize("model, optimizer", [("n", "auto"), ("26n", "musgd")])
def test_killed_run_resumes_to_bitwise_identical_weights(tiny_data, tmp_path, model, optimizer):
    common = [
        "--data",
        tiny_data,
        "--epochs",
        "2",
        "--subset",
        "8",  # 2 iterations, one optimizer step an epoch: each MuSGD step orthogonalises every conv weight in bf16
        "--deterministic",
        "--accumulate",
        "2",
        "--save-every",
        "2",
        "--val-every",
        "3",
        *TINY,
    ]
    common[common.index("--workers") + 1] = "2"  # real worker processes: the data must not depend on them
    common[common.index("--model") + 1] = model
    common += ["--optimizer", optimizer]
    run([*common, "--out", tmp_path / "straight"])

    # Start the same run, SIGKILL it after its second mid-run save, resume it.
    out = tmp_path / "runs" / "train" / "killed"
    proc = subprocess.Popen(
        [sys.executable, "train.py", *map(str, common), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last, seen, deadline = out / "weights" / "last.pt", set(), time.time() + 240
    while len(seen) < 2 and proc.poll() is None and time.time() < deadline:
        if last.exists():
            seen.add(last.stat().st_mtime_ns)
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    state = load(last)
    assert (state["epoch"], state["iteration"]) < (2, 0)
    # --resume without a path: the newest runs/train/*/weights/last.pt under the working directory
    run([REPO / "train.py", "--resume", "--workers", "2"], cwd=tmp_path)

    straight, resumed = load(tmp_path / "straight/weights/last.pt"), load(last)
    for key in ("model", "ema", "optimizer"):
        assert tensors_equal(straight[key], resumed[key]), key
    assert straight["ema_updates"] == resumed["ema_updates"]


def test_sigterm_to_the_process_group_saves_and_exits_cleanly(tiny_data, tmp_path):
    """What SLURM pre-emption and `kill -- -PGID` do: every process of the group, the data-loader
    workers too, gets SIGTERM. The workers must live on so that the step can finish and last.pt be saved."""
    out = tmp_path / "run"
    args = ["--data", str(tiny_data), "--epochs", "50", "--out", str(out), *TINY]
    args[args.index("--workers") + 1] = "2"
    proc = subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while not (out / "results.csv").exists() and time.time() < deadline:  # written once the handlers are set
        time.sleep(0.05)
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-2000:]
    assert "resume with --resume" in output and "DataLoader worker" not in output
    state = load(out / "weights/last.pt")
    assert state["epoch"] < 50


def test_resume_wants_a_last_pt_and_finds_the_newest(tmp_path, monkeypatch):
    from utils.checkpoints.ours import CheckpointError, load_resume_checkpoint, save_checkpoint

    monkeypatch.chdir(tmp_path)  # --resume without a path looks under ./runs/train
    with pytest.raises(CheckpointError, match="no runs/train/"):
        load_resume_checkpoint()
    best = tmp_path / "runs/train/exp/weights/best.pt"
    save_checkpoint({"format": "yolo-flat/1", "model": {}}, best)
    with pytest.raises(CheckpointError, match="best.pt holds no training state"):
        load_resume_checkpoint(best)
    for epoch, run_name in enumerate(["exp", "exp2"]):
        save_checkpoint(
            {"format": "yolo-flat/1", "model": {}, "optimizer": {}, "epoch": epoch},
            f"runs/train/{run_name}/weights/last.pt",
        )
        time.sleep(0.05)  # distinct modification times
    path, checkpoint = load_resume_checkpoint()
    assert Path(path) == Path("runs/train/exp2/weights/last.pt") and checkpoint["epoch"] == 1


def test_results_csv_of_a_resumed_run_keeps_the_rows_up_to_its_last_save(tmp_path):
    from utils.monitor import start_results_csv

    path = tmp_path / "results.csv"
    start_results_csv(path, ["epoch", "box_loss"])
    path.write_text(path.read_text() + "1,3.5\n2,3.1\n3,2.9\n")  # epoch 3 ran, but last.pt was saved after 2
    start_results_csv(path, ["epoch", "box_loss", "lr"], resumed_epoch=2)  # a column added since: filled with 0
    assert path.read_text() == "epoch,box_loss,lr\n1,3.5,0\n2,3.1,0\n"
    start_results_csv(path, ["epoch", "box_loss"])  # a new run starts empty
    assert path.read_text() == "epoch,box_loss\n"


@pytest.mark.parametrize("before, after", [("fp16", "bf16"), ("bf16", "fp16")])
def test_resume_across_a_change_of_amp_dtype(tiny_data, tmp_path, before, after):
    """A run started in fp16 (GradScaler on) resumed where bf16 is chosen (scaler off), and the
    reverse: a scaler saved disabled is empty, and a resumed fp16 run starts a new loss scale."""
    out = tmp_path / "runs" / "train" / "exp"
    stop = make_wrapper(
        tmp_path,
        loss="""
        if n == 3:  # epoch 2's first step: a pre-emption
            os.kill(os.getpid(), signal.SIGTERM)
    """,
    )
    args = ["--data", tiny_data, "--epochs", "2", "--subset", "8", "--val-every", "2", "--accumulate", "1", "--amp"]
    args += ["--out", out, *TINY]
    run([*args, "--amp-dtype", before], wrapper=stop)
    stopped = load(out / "weights/last.pt")
    assert (stopped["epoch"], stopped["iteration"]) == (1, 1)
    assert bool(stopped["scaler"]) == (before == "fp16")
    run(["--resume", out / "weights/last.pt", "--amp-dtype", after])
    finished = load(out / "weights/last.pt")
    assert finished["epoch"] == 2 and bool(finished["scaler"]) == (after == "fp16")
    assert {"bf16": "amp bfloat16", "fp16": "amp float16"}[after] in (out / "train.log").read_text().split("resuming")[
        -1
    ]
    assert all(torch.isfinite(v).all() for v in finished["model"].values() if v.is_floating_point())


def test_extend_a_finished_run_as_if_started_with_more_epochs(tiny_data, tmp_path, monkeypatch):
    """--resume last.pt --epochs N continues a finished run: exactly as a run started with N epochs goes on from the
    same state (the schedule is a function of (epoch, epochs)), and --fitness picks best.pt by its own number.
    --cls-weights auto: counted from the labels once, then kept as numbers: a resume weighs as the run started.
    --mlflow: the resume continues the same MLflow run."""
    shutil.copytree(tiny_data.parent, tmp_path / "data")  # its labels change before the resumes
    data, label_files = tmp_path / "data" / tiny_data.name, sorted((tmp_path / "data").glob("*/labels/train/*.txt"))
    counts = [0] * 6
    for line in (line for f in label_files for line in f.read_text().splitlines()):
        counts[int(line.split()[0])] += 1
    common = ["--data", data, "--deterministic", "--accumulate", "1", "--fitness", "ultralytics", *TINY]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # the store: tmp_path / "mlruns"
    run([*common, "--epochs", "2", "--cls-weights", "auto", "--mlflow", "--out", tmp_path / "finished"], env=env)
    saved = yaml.safe_load((tmp_path / "finished/args.yaml").read_text())["cls_weights"]
    inverse = [1 / n if n else math.inf for n in counts]
    expected = [min(w, 10 * min(inverse)) for w in inverse]  # capped at 10x the smallest, then mean 1
    assert [float(w) for w in saved.split(",")] == pytest.approx([w * 6 / sum(expected) for w in expected], rel=1e-9)
    for f in label_files[:6]:
        f.write_text("0 0.5 0.5 0.2 0.2\n")
    finished = load(tmp_path / "finished/weights/last.pt")
    rows = list(csv.DictReader(open(tmp_path / "finished/results.csv")))
    best = rows[finished["best_epoch"] - 1]
    expected = 0.1 * float(best["mAP50"]) + 0.9 * float(best["mAP50-95"])
    assert finished["args"]["fitness"] == "ultralytics" and finished["best_fitness"] == pytest.approx(expected, 1e-3)
    for name in ("extended", "started_with_3"):
        shutil.copytree(tmp_path / "finished", tmp_path / name)
    as_if = load(tmp_path / "started_with_3/weights/last.pt")
    as_if["args"]["epochs"] = 3  # the same state, in a run that was started with 3 epochs and stopped after 2
    torch.save(as_if, tmp_path / "started_with_3/weights/last.pt")
    (tmp_path / "started_with_3/mlflow.json").unlink()  # a copy of the run: an MLflow run of its own

    before = (tmp_path / "extended/weights/last.pt").read_bytes()
    refused = run(["--resume", tmp_path / "extended/weights/last.pt", "--epochs", "1"], check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--epochs 1 is fewer than the 2 epochs" in refused.stderr and "give more than 2" in refused.stderr
    assert (tmp_path / "extended/weights/last.pt").read_bytes() == before  # nothing lost

    run(["--resume", tmp_path / "extended/weights/last.pt", "--epochs", "3"], env=env)
    run(["--resume", tmp_path / "started_with_3/weights/last.pt"], env=env)
    extended, reference = (load(tmp_path / f"{n}/weights/last.pt") for n in ("extended", "started_with_3"))
    assert extended["epoch"] == 3 and extended["args"]["epochs"] == 3 and extended["args"]["cls_weights"] == saved
    weighed = re.findall(r"class weights [^|\n]+", (tmp_path / "extended/train.log").read_text())
    assert len(weighed) == 2 and weighed[0] == weighed[1] and weighed[0].startswith("class weights circle ")
    for key in ("model", "ema", "optimizer"):
        assert tensors_equal(extended[key], reference[key]), key
    assert len(list(csv.DictReader(open(tmp_path / "extended/results.csv")))) == 3

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client, record = MlflowClient((tmp_path / "mlruns").as_uri()), tmp_path / "extended/mlflow.json"
    run_id = json.loads(record.read_text())["run_id"]
    assert run_id == json.loads((tmp_path / "finished/mlflow.json").read_text())["run_id"]  # the same MLflow run
    assert [m.step for m in client.get_metric_history(run_id, "mAP50-95")] == [1, 2, 3]
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED" and tracked.data.params["epochs"] == "2"
    assert tracked.data.tags["resumed.epochs"] == "3"  # MLflow's parameters cannot change: the new value in a tag
