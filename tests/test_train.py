"""train.py and val.py end to end, on a tiny generated dataset, on the CPU (issue 4).

Every run here is a real `python train.py ...` subprocess, as a user would start it. Faults
(out of memory, NaN loss) are injected by a small wrapper that patches the loss and then runs
train.py unchanged, so train.py itself has no test hooks.
"""

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import warm_python
import yaml

from utils.data.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    cfg = root / "tiny.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "path": "shapes",
                "train": "images/train",
                "val": "images/val",
                "names": ["circle", "square", "triangle", "star", "cross", "hexagon"],
            }
        )
    )
    return cfg


@pytest.fixture(scope="module")
def one_epoch_run(tiny_data, tmp_path_factory):
    """A finished one-epoch run (--accumulate 1) that several tests start from: each copies or reads it, none edits
    it (a train.py run fewer on the 2-core machines the suite is sized for)."""
    out = tmp_path_factory.mktemp("one_epoch") / "run"
    run(["--data", tiny_data, "--epochs", "1", "--accumulate", "1", "--out", out, *TINY])
    return out


def run(args, cwd=REPO, wrapper=None, check=True, **popen):
    """`python train.py ARGS` (or `python WRAPPER ARGS`); a first argument ending in .py replaces train.py."""
    script = [str(wrapper)] if wrapper else [] if str(args[0]).endswith(".py") else ["train.py"]
    cmd = [sys.executable, *script, *map(str, args)]
    result = warm_python.run(cmd, cwd, timeout=300, **popen)  # subprocess.run, less torch's import
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def tensors_equal(a, b):
    """Every tensor of two (nested) checkpoint dicts is bitwise identical, and every other value equal."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)  # checkpoints must load this way


def test_two_epoch_run_writes_every_output(tiny_data, tmp_path, monkeypatch):
    """Also --mlflow: the run read back with MLflow's own client from the local store (a resume continues it: below,
    in test_extend_a_finished_run_as_if_started_with_more_epochs)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # the default store: beside the run
    run(["--data", tiny_data, "--epochs", "2", "--mlflow", "--out", out, *TINY], env=env)
    pictures = [
        "labels.jpg",
        "train_batch0.jpg",
        "train_batch1.jpg",
        "train_batch2.jpg",
        "val_batch0_labels.jpg",
        "val_batch0_pred.jpg",
        "F1_curve.png",
        "P_curve.png",
        "R_curve.png",
    ]
    for name in [
        "weights/last.pt",
        "weights/best.pt",
        "results.csv",
        "results.png",
        "args.yaml",
        "train.log",
        "metrics.json",
        "pr_curve.png",
        "confusion_matrix.png",
        *pictures,
    ]:
        assert (out / name).exists(), name
    import cv2

    assert all(cv2.imread(str(out / name)) is not None for name in pictures)  # real images, not empty files
    assert "best F1 at confidence" in (out / "train.log").read_text()
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for column in ["box_loss", "cls_loss", "dfl_loss", "precision", "recall", "mAP50", "mAP50-95", "lr", "seconds"]:
        assert column in rows[0] and float(rows[-1][column]) == float(rows[-1][column])  # present, not NaN
    for column in ["val_box_loss", "val_cls_loss", "val_dfl_loss"]:  # beside the training losses, each epoch
        assert all(0 < float(r[column]) < 100 for r in rows), column
    last, best = load(out / "weights/last.pt"), load(out / "weights/best.pt")
    assert last["epoch"] == 2 and last["iteration"] == 0 and "optimizer" in last and "scaler" in last
    # deployable, self-describing
    assert "optimizer" not in best and best["names"][0] == "circle" and best["imgsz"] == 64
    assert torch.equal(best["model"]["head.cls.0.2.bias"], last["ema"]["head.cls.0.2.bias"]) or best["epoch"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"mAP50", "mAP50-95", "precision", "recall"} <= metrics.keys()
    assert yaml.safe_load((out / "args.yaml").read_text())["epochs"] == 2

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 reads its file store only when allowed
    client = MlflowClient((tmp_path / "mlruns").as_uri())
    run_id = json.loads((out / "mlflow.json").read_text())["run_id"]
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    assert client.get_experiment(tracked.info.experiment_id).name == "tiny"  # named after the dataset yaml
    params = tracked.data.params
    assert params["epochs"] == "2" and params["imgsz"] == "64" and params["optimizer"] == "adamw"
    assert params["data"] == str(tiny_data) and params["cls_weights"] == "" and float(params["lr0"]) == 0.002
    for column in ["box_loss", "cls_loss", "mAP50-95", "val_box_loss", "lr", "seconds"]:
        history = client.get_metric_history(run_id, column)
        assert [m.step for m in history] == [1, 2], column
        assert [m.value for m in history] == pytest.approx([float(r[column]) for r in rows], rel=1e-4), column
    artifacts = {a.path for folder in ("", "plots", "weights") for a in client.list_artifacts(run_id, folder)}
    assert {"weights/best.pt", "plots/results.png", "plots/labels.jpg", "results.csv", "args.yaml"} <= artifacts
    assert "weights/last.pt" not in artifacts
    downloaded = client.download_artifacts(run_id, "weights/best.pt", str(tmp_path))
    assert tensors_equal(load(downloaded)["model"], best["model"])


def test_accumulation_windows_ramp_over_the_warmup_and_partition_each_epoch():
    from utils.optim import accumulation_windows

    assert accumulation_windows(0, 10, 4, 0, ramp=True) == {3: 4, 7: 4, 9: 2}  # the last window ends the epoch
    assert accumulation_windows(0, 10, 4, 100, ramp=False) == {3: 4, 7: 4, 9: 2}
    epochs = [accumulation_windows(e, 50, 4, 120, ramp=True) for e in range(4)]
    for windows in epochs:  # contiguous windows that cover the epoch exactly
        ends = sorted(windows)
        assert ends[-1] == 49 and [e - windows[e] for e in ends] == [-1] + ends[:-1]
    sizes = [size for windows in epochs for size in windows.values()]
    assert sizes[:15] == [1] * 15 and sizes[-1] == 2 and max(sizes) == 4  # 1 at first, 4 after the warmup
    assert len(sizes) > 1.5 * sum(len(accumulation_windows(e, 50, 4, 120, ramp=False)) for e in range(4))
    assert accumulation_windows(2, 50, 4, 120, ramp=True) == epochs[2]  # a pure function: resume sees the same


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


WRAPPER = """
import os, runpy, signal, sys, torch
sys.path.insert(0, {repo!r})
import models.yolo, utils.loss
RANK = int(os.environ.get("RANK", 0))
calls = {{"loss": 0, "forward": 0}}
original_loss, original_forward = utils.loss.DetectionLoss.__call__, models.yolo.YOLO.forward

def patched_loss(self, maps, targets):
    if not torch.is_grad_enabled():  # the validation loss (utils/evaluate.py, under no_grad): not a training step
        return original_loss(self, maps, targets)
    calls["loss"] += 1
    n = calls["loss"]
{loss_body}
    return original_loss(self, maps, targets)

def patched_forward(self, x):
    if self.training:
        calls["forward"] += 1
        n = calls["forward"]
{forward_body}
    return original_forward(self, x)

utils.loss.DetectionLoss.__call__ = patched_loss
models.yolo.YOLO.forward = patched_forward
{setup}
sys.argv = ["train.py"] + sys.argv[1:]
g = runpy.run_path("train.py", run_name="__main__")
"""


def make_wrapper(tmp_path, loss="", forward="", setup="", name="wrapper.py"):
    """A script that runs train.py unchanged, after patching the loss and/or the model's training
    forward with the given bodies (which see `n`, the call count on this rank, and RANK)."""
    path = tmp_path / name
    body = {"loss_body": loss, "forward_body": forward}
    body = {k: textwrap.indent(textwrap.dedent(v), " " * (4 if k == "loss_body" else 8)) or "" for k, v in body.items()}
    path.write_text(WRAPPER.format(repo=str(REPO), setup=textwrap.dedent(setup), **body))
    return path


def test_out_of_memory_in_the_label_assignment_is_redone_on_the_cpu_with_the_same_result(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "4", "--deterministic", *TINY]
    run([*args, "--out", tmp_path / "plain"])
    wrapper = make_wrapper(
        tmp_path,
        setup="""
        original_assign, assign_calls = utils.loss.assign_targets, []
        def assign(*a, device=None, **kw):
            assign_calls.append(device)
            if len(assign_calls) == 1:  # the first assignment runs out of memory on the GPU
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return original_assign(*a, device=device, **kw)
        utils.loss.assign_targets = assign
        original_run = runpy.run_path
        def run_and_check(*a, **kw):
            try:
                return original_run(*a, **kw)
            finally:
                # the forward ran once
                assert assign_calls[:2] == [None, "cpu"] and calls["forward"] == 1, (assign_calls, calls)
        runpy.run_path = run_and_check
    """,
    )
    result = run([*args, "--out", tmp_path / "oom"], wrapper=wrapper)
    assert "redone on the CPU" in result.stdout + result.stderr
    row = next(csv.DictReader(open(tmp_path / "oom/results.csv")))
    assert row["assign_on_cpu"] == "1" and row["oom_skipped_steps"] == "0"
    plain, retried = load(tmp_path / "plain/weights/last.pt"), load(tmp_path / "oom/weights/last.pt")
    assert tensors_equal(plain["model"], retried["model"])  # BN statistics too: nothing ran twice


# An out-of-memory in the batch's copy to the GPU (where a nearly full GPU fails first, before the forward)
COPY_OOM = """
import utils.data.loader
original_copy, copies = utils.data.loader.batch_to_device, [0]
def batch_to_device(*a, **kw):
    copies[0] += 1
    if copies[0] in FAILING:
        raise torch.OutOfMemoryError("CUDA out of memory (injected in the batch's copy)")
    return original_copy(*a, **kw)
utils.data.loader.batch_to_device = batch_to_device
"""
FORWARD_OOM = """
if n in FAILING:
    raise torch.OutOfMemoryError("CUDA out of memory (injected)")
"""


def oom_wrapper(tmp_path, where, failing):
    """train.py with an out-of-memory in the forward or in the batch's copy, at the calls in `failing` (1-based)."""
    setup = f"FAILING = {failing!r}\n" + (COPY_OOM if where == "copy" else "")
    return make_wrapper(tmp_path, forward=FORWARD_OOM if where == "forward" else "", setup=setup)


@pytest.mark.parametrize("where", ["forward", "copy"])
def test_out_of_memory_in_every_step_stops_the_run_naming_the_batch_size(tiny_data, tmp_path, where):
    wrapper = oom_wrapper(tmp_path, where, range(1, 100))
    result = run(
        ["--data", tiny_data, "--epochs", "3", "--accumulate", "1", "--out", tmp_path / "run", *TINY],
        wrapper=wrapper,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert (
        "out of memory in 3 optimizer steps in a row" in output and "--batch 4" in output and "try --batch 2" in output
    )
    assert "Traceback" not in output
    assert "--batch 4" in (tmp_path / "run/crash/reason.txt").read_text()


@pytest.mark.parametrize("where", ["forward", "copy"])
def test_an_out_of_memory_skips_the_step_and_training_goes_on(tiny_data, tmp_path, where):
    wrapper = oom_wrapper(tmp_path, where, [2])
    run(["--data", tiny_data, "--epochs", "2", "--accumulate", "1", "--out", tmp_path / "run", *TINY], wrapper=wrapper)
    rows = list(csv.DictReader(open(tmp_path / "run/results.csv")))
    assert [r["oom_skipped_steps"] for r in rows] == ["1", "0"]
    assert load(tmp_path / "run/weights/last.pt")["ema_updates"] == 2 * 3 - 1


def test_nan_loss_is_skipped_and_repeated_nan_writes_crash(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", "--accumulate", "1", *TINY]
    once = make_wrapper(
        tmp_path,
        loss="""
        if n == 1:
            loss, parts = original_loss(self, maps, targets)
            return loss * float("nan"), parts
    """,
    )
    run([*args, "--out", tmp_path / "once"], wrapper=once)
    row = next(csv.DictReader(open(tmp_path / "once/results.csv")))
    assert row["nonfinite_skipped_steps"] == "1"
    state = load(tmp_path / "once/weights/last.pt")
    assert torch.isfinite(state["model"]["head.cls.0.2.weight"]).all() and state["ema_updates"] == 2
    # the NaN step is not in the means
    assert all(math.isfinite(float(row[k])) for k in ("box_loss", "cls_loss", "dfl_loss"))

    always = make_wrapper(
        tmp_path,
        name="always.py",
        loss="""
        loss, parts = original_loss(self, maps, targets)
        return loss * float("inf"), parts
    """,
    )
    result = run([*args, "--epochs", "3", "--out", tmp_path / "dead"], wrapper=always, check=False)
    assert result.returncode != 0
    crash = tmp_path / "dead" / "crash"
    assert "NaN/Inf gradients" in (crash / "reason.txt").read_text()
    batch = torch.load(crash / "batch.pt", weights_only=True)
    assert batch["images"].dtype == torch.uint8 and batch["images"].shape[1:] == (3, 64, 64)
    assert {"args", "epoch", "iteration", "last_checkpoint"} <= yaml.safe_load(
        (crash / "context.yaml").read_text()
    ).keys()
    assert (crash / "environment.json").exists()


def test_uncaught_exception_writes_crash(tiny_data, tmp_path):
    boom = make_wrapper(
        tmp_path,
        loss="""
        if n == 2:
            raise RuntimeError("something unexpected")
    """,
    )
    result = run(["--data", tiny_data, "--epochs", "1", "--out", tmp_path / "run", *TINY], wrapper=boom, check=False)
    assert result.returncode != 0
    assert "something unexpected" in (tmp_path / "run/crash/reason.txt").read_text()


def torchrun(tmp_path, args, wrapper=None, port=29517):
    """`torchrun --nproc_per_node 2` on the CPU (gloo); each rank saves its final model as rank{R}.pt."""
    saver = tmp_path / f"ddp_{port}.py"
    saver.write_text(
        (
            wrapper.read_text()
            if wrapper
            else (
                "import os, runpy, sys, torch\nsys.path.insert(0, %r)\nsys.argv = ['train.py'] + sys.argv[1:]\n"
                "g = runpy.run_path('train.py', run_name='__main__')\n"
            )
            % str(REPO)
        )
        + textwrap.dedent(f"""
        from utils.ema import unwrap
        torch.save(unwrap(g["model"]).state_dict(), {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}.pt")
    """)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        str(saver),
        *map(str, args),
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)  # a hang fails here
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    params = [k for k in rank0 if "running" not in k and "num_batches" not in k]  # BN stats stay per rank (M2)
    different = [k for k in params if not torch.equal(rank0[k], rank1[k])]
    assert not different, different[:5]
    return result


def test_torchrun_two_cpu_processes_end_with_identical_weights(tiny_data, tmp_path):
    # --cache ram: the two processes of this machine must map one copy of the decoded images, not hold two
    wrapper = tmp_path / "cache_probe.py"
    wrapper.write_text(
        f"import json, os, runpy, sys, numpy as np, torch\nsys.path.insert(0, {str(REPO)!r})\n"
        "sys.argv = ['train.py'] + sys.argv[1:]\n"
        "g = runpy.run_path('train.py', run_name='__main__')\nimage = g['train_set'].cache[0]\nbase = image\n"
        "while not isinstance(base, np.memmap) and base.base is not None:\n    base = base.base\n"
        f"with open({str(tmp_path)!r} + '/cache' + os.environ['RANK'] + '.json', 'w') as f:\n"
        "    json.dump({'file': getattr(base, 'filename', None), 'writeable': image.flags.writeable}, f)\n"
    )
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "8", "--out", tmp_path / "ddp", "--cache", "ram", *TINY]
    result = torchrun(tmp_path, args, wrapper)
    assert (tmp_path / "ddp/weights/last.pt").exists()
    probes = [json.loads((tmp_path / f"cache{r}.json").read_text()) for r in (0, 1)]
    assert probes[0]["file"] == probes[1]["file"] and probes[0]["file"].startswith("/dev/shm/yolo-cache-")
    assert not probes[1]["writeable"] and not os.path.exists(probes[0]["file"])  # mapped, read-only, unlinked
    assert "one copy shared by the 2 processes of this machine" in result.stdout + result.stderr


@pytest.mark.parametrize("fault", ["oom", "nan"])
def test_torchrun_fault_on_one_rank_skips_the_step_on_both(tiny_data, tmp_path, fault):
    """Rank 1 alone runs out of memory in (or gets a NaN loss from) the forward of the last micro-step
    of a window: both ranks skip that step, nobody hangs, the weights stay identical, and the window
    after it (--accumulate 2: a no_sync micro-step, then one that all-reduces) runs as usual."""
    if fault == "oom":
        wrapper = make_wrapper(
            tmp_path,
            forward="""
            if RANK == 1 and n == 3:
                raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
        """,
        )
    else:
        wrapper = make_wrapper(
            tmp_path,
            loss="""
            if RANK == 1 and n == 3:
                loss, parts = original_loss(self, maps, targets)
                return loss * float("nan"), parts
        """,
        )
    out = tmp_path / "ddp"
    # 12 images, batch 2 per rank: 3 micro-steps per epoch, windows [0, 1] and [2]; 2 epochs = 4 windows.
    # The fault is in micro-step 3, the one-step window [2] that comes before epoch 2's [0, 1].
    torchrun(
        tmp_path,
        ["--data", tiny_data, "--epochs", "2", "--accumulate", "2", "--out", out, *TINY],
        wrapper=wrapper,
        port=29518 if fault == "oom" else 29519,
    )
    rows = list(csv.DictReader(open(out / "results.csv")))
    column = "oom_skipped_steps" if fault == "oom" else "nonfinite_skipped_steps"
    assert [r[column] for r in rows] == ["1", "0"]
    assert load(out / "weights/last.pt")["ema_updates"] == 3


def test_val_map_equals_pycocotools_on_the_saved_detections(tiny_data, tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    run(["--data", tiny_data, "--epochs", "2", "--out", tmp_path / "train", *TINY])
    out = tmp_path / "val"
    args = ["--weights", tmp_path / "train/weights/last.pt", "--data", tiny_data, "--save-json", "--workers", "0"]
    result = run(["val.py", *args, "--out", out], check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mAP50-95" in result.stdout and "inference" in result.stdout and "best F1 at confidence" in result.stdout
    pictures = ["pr_curve.png", "confusion_matrix.png", "F1_curve.png", "P_curve.png", "R_curve.png"]
    assert all((out / p).stat().st_size > 0 for p in pictures + ["val_batch0_labels.jpg", "val_batch0_pred.jpg"])
    metrics = json.loads((out / "metrics.json").read_text())
    gt = COCO(str(out / "ground_truth.json"))
    detections = json.loads((out / "predictions.json").read_text())
    assert detections, "the tiny model should produce some low-confidence detections"
    ev = COCOeval(gt, gt.loadRes(detections), "bbox")
    ev.params.maxDets = [1, 10, 300]  # val.py's --max-det: up to 300 detections of an image count
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ev.stats[0] == -1  # pycocotools' summary asks for maxDets=100 by name; val.py reads the table instead
    precision = ev.eval["precision"][:, :, :, 0, -1]
    assert metrics["mAP50-95"] == pytest.approx(precision[precision > -1].mean(), abs=1e-9)
    assert metrics["mAP50"] == pytest.approx(ev.stats[1], abs=1e-9)
    assert len(metrics["per_class"]) == 6


def test_bad_dataset_yaml_and_bad_checkpoint_get_one_sentence(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("path: .\ntrain: images/train\nnames: [a]\n")
    result = run(["--data", bad, *TINY, "--out", tmp_path / "x"], check=False)
    assert result.returncode != 0 and "'val'" in result.stderr and "Traceback" not in result.stderr
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    result = run(["--resume", junk], check=False)
    assert result.returncode != 0 and "junk.pt" in result.stderr and "Traceback" not in result.stderr


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


def test_dataset_yaml_defaults_apply_and_flags_given_win(tiny_data, tmp_path):
    cfg = yaml.safe_load(tiny_data.read_text())
    with_defaults = tiny_data.parent / "with_defaults.yaml"
    with_defaults.write_text(yaml.safe_dump({**cfg, "defaults": {"epochs": 7, "lr0": 0.005, "close_mosaic": 2}}))
    run(["--data", with_defaults, "--lr0", "0.003", "--benchmark", "1", "--out", tmp_path / "run", *TINY])
    resolved = yaml.safe_load((tmp_path / "run" / "args.yaml").read_text())
    assert (resolved["epochs"], resolved["close_mosaic"], resolved["lr0"]) == (7, 2, 0.003)
    with_defaults.write_text(yaml.safe_dump({**cfg, "defaults": {"epoch": 7}}))
    result = run(["--data", with_defaults, "--benchmark", "1", "--out", tmp_path / "bad", *TINY], check=False)
    assert result.returncode != 0 and "'epoch'" in result.stderr and "Traceback" not in result.stderr


def test_weights_freeze_multi_scale_and_the_other_run_options(tiny_data, one_epoch_run, tmp_path):
    """--weights initialises, --freeze keeps those parameters out of the optimizer and unchanged,
    --multi-scale changes the size per iteration (multiples of 32 in 0.5-1.5x imgsz), and --cache ram,
    --checkpoint-activations, --profile and --benchmark run through and leave what they promise."""
    sizes = make_wrapper(
        tmp_path,
        loss="""
        print("input size", maps[0].shape[-1] * 8)
    """,
    )
    options = ["--multi-scale", "--cache", "ram", "--checkpoint-activations", "--profile", "--accumulate", "1"]
    result = run(
        [
            "--data",
            tiny_data,
            "--epochs",
            "2",
            "--weights",
            one_epoch_run / "weights/last.pt",
            "--freeze",
            "stem,down2",
            *options,
            "--out",
            tmp_path / "second",
            *TINY,
        ],
        wrapper=sizes,
    )
    seen = [int(s) for s in re.findall(r"input size (\d+)", result.stdout)]
    assert len(seen) == 6 and len(set(seen)) > 1 and set(seen) <= {32, 64, 96}, seen
    first, second = load(one_epoch_run / "weights/last.pt"), load(tmp_path / "second/weights/last.pt")
    assert "initialised" in (tmp_path / "second/train.log").read_text()
    for name in ("stem.conv.weight", "down2.bn.weight", "down2.bn.bias"):  # frozen: still the --weights values
        assert torch.equal(second["model"][name], first["ema"][name]), name
    assert not torch.equal(second["model"]["stage2.cv1.conv.weight"], first["ema"]["stage2.cv1.conv.weight"])
    trainable = sum(
        1 for k in second["model"] if k.endswith(("weight", "bias")) and not k.startswith(("stem.", "down2."))
    )
    assert sum(len(g["params"]) for g in second["optimizer"]["param_groups"]) == trainable
    assert json.loads((tmp_path / "second/profile_trace.json").read_text())["traceEvents"]

    result = run(["--data", tiny_data, "--benchmark", "2", "--out", tmp_path / "bench", *TINY])
    assert re.search(r"benchmark: [0-9.]+ images/s", result.stdout)
    # its 3 + 2 iterations cross the end of epoch 1 (3 batches): training is timed, not a validation
    row = next(csv.DictReader(open(tmp_path / "bench/results.csv")))
    assert row["epoch"] == "1" and math.isnan(float(row["mAP50-95"]))
    assert not (tmp_path / "bench/weights/best.pt").exists()


def make_large_objects(root, n_train=16, n_val=8, size=320, seed=0):
    """Filled boxes and ellipses of a quarter to two thirds of the image on a dark noisy background:
    a set that a few epochs of training visibly learn."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for k in range(n):
            img = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
            rows = []
            for _ in range(rng.integers(1, 3)):
                w, h = (int(v) for v in rng.integers(size // 4, size * 2 // 3, 2))
                x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
                cls, colour = int(rng.integers(0, 2)), tuple(int(c) for c in rng.integers(150, 256, 3))
                if cls == 0:
                    cv2.rectangle(img, (x, y), (x + w, y + h), colour, -1)
                else:
                    cv2.ellipse(img, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
                rows.append(f"{cls} {(x + w / 2) / size:.5f} {(y + h / 2) / size:.5f} {w / size:.5f} {h / size:.5f}")
            cv2.imwrite(str(root / "images" / split / f"{k}.jpg"), img)
            (root / "labels" / split / f"{k}.txt").write_text("\n".join(rows) + "\n")
    cfg = root / "large.yaml"
    cfg.write_text("path: .\ntrain: images/train\nval: images/val\nnames: [box, ellipse]\n")
    return cfg


def test_amp_on_cpu_runs_the_model_in_bf16_the_loss_in_fp32_and_learns(tmp_path):
    """`--amp --device cpu` is bf16 autocast: every map the model returns is bf16, the loss is fp32, and the loss
    falls over a few steps on a small set. Sized for a CPU that emulates bf16 (AVX2 only: ~10x slower than fp32),
    where this run must still take seconds; a CPU without native bf16 is told so in one line, and trains on."""
    cfg = make_large_objects(tmp_path / "large", n_train=4, n_val=4, size=160)
    out, steps = tmp_path / "run", tmp_path / "steps.txt"
    wrapper = make_wrapper(
        tmp_path,
        loss=f"""
        result = original_loss(self, maps, targets)
        with open({str(steps)!r}, "a") as f:
            f.write(f"{{','.join(sorted({{str(m.dtype) for m in maps}}))}} {{result[0].dtype}} {{float(result[0])}}\\n")
        return result
        """,
        setup="import utils.distributed; utils.distributed.cpu_has_native_bf16 = lambda: False  # as on AVX2",
    )
    # no --workers: the default follows the machine's cores
    run(["--data", cfg, "--amp", "--device", "cpu", "--imgsz", "160", "--batch", "4", "--epochs", "12",
         "--mosaic", "0", "--close-mosaic", "0", "--accumulate", "1", "--warmup-epochs", "0", "--lr0", "0.01",
         # the same 4 images unaugmented at every step: the loss of a model that learns falls step by step
         "--fliplr", "0", "--hsv-h", "0", "--hsv-s", "0", "--hsv-v", "0", "--translate", "0", "--scale", "0",
         "--val-every", "12", "--out", out], wrapper=wrapper)  # fmt: skip
    log = (out / "train.log").read_text()
    assert "amp bfloat16" in log and "bf16 is emulated and about" in log
    assert yaml.safe_load((out / "args.yaml").read_text())["workers"] == min(8, len(os.sched_getaffinity(0)))
    rows = [line.rsplit(" ", 2) for line in steps.read_text().splitlines()]
    assert len(rows) == 12 and all(maps == "torch.bfloat16" for maps, _, _ in rows), rows
    assert all(dtype == "torch.float32" for _, dtype, _ in rows)
    losses = [float(loss) for _, _, loss in rows]
    assert sum(losses[-3:]) < 0.7 * sum(losses[:3]), losses


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


@pytest.mark.parametrize("imgsz", [416, 608])
def test_multi_scale_at_sizes_that_are_32_mod_64(tiny_data, tmp_path, imgsz):
    """--multi-scale --imgsz 416 used to crash at the first step (a size that was not a multiple of 32)."""
    sizes = make_wrapper(
        tmp_path,
        loss="""
        print("input size", maps[0].shape[-1] * 8, maps[0].shape[-2] * 8)
    """,
    )
    # 3 iterations of one image each: the sizes are the point; 3 images, not 6, halve the convolutions at 608-912 px
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "3", "--out", tmp_path / "run", *TINY]
    args[args.index("--imgsz") + 1], args[args.index("--batch") + 1] = str(imgsz), "1"
    result = run([*args, "--multi-scale", "--accumulate", "1"], wrapper=sizes)
    seen = [tuple(map(int, s)) for s in re.findall(r"input size (\d+) (\d+)", result.stdout)]
    assert len(seen) == 3 and all(
        w == h and w % 32 == 0 and imgsz // 2 - 32 < w <= imgsz * 3 // 2 + 32 for w, h in seen
    ), seen


def test_patience_single_cls_fraction_and_batch_minus_one_on_cpu(tiny_data, tmp_path):
    out = tmp_path / "run"
    args = [
        "--data",
        tiny_data,
        "--epochs",
        "8",
        "--patience",
        "2",
        "--single-cls",
        "--fraction",
        "0.5",
        "--out",
        out,
        *TINY,
    ]
    args[args.index("--batch") + 1] = "-1"
    result = run(args)
    output = result.stdout + result.stderr
    assert "--batch -1 measures free GPU memory and needs a CUDA device; using --batch 16" in output
    assert "6 train / 6 val images, 1 classes" in output  # --fraction 0.5 of 12; --single-cls
    assert "stopping early" in output
    rows = list(csv.DictReader(open(out / "results.csv")))
    last, best = load(out / "weights/last.pt"), load(out / "weights/best.pt")
    assert len(rows) == last["epoch"] == last["best_epoch"] + 2 < 8  # resume-safe: the best epoch is in last.pt
    assert best["names"] == ["object"] and best["nc"] == 1 and last["args"]["batch"] == 16
    result = run(
        ["val.py", "--weights", out / "weights/best.pt", "--workers", "0", "--out", tmp_path / "val"], check=False
    )
    assert result.returncode == 0, result.stderr[
        -2000:
    ]  # the checkpoint says single-cls: val.py merges the classes too
    assert [c["class"] for c in json.loads((tmp_path / "val/metrics.json").read_text())["per_class"]] == ["object"]


def test_resume_on_fewer_gpus_keeps_the_images_per_gpu_and_per_step(one_epoch_run, tmp_path):
    """A run saved on 2 processes of batch 2 each (--batch 4), resumed on one: each GPU keeps its 2 images (the
    total of 4 on one GPU ran out of memory, and the advised smaller --batch was refused by --resume), the
    accumulation doubles so that a step still sees 4 images, and the run goes on from the same images seen."""
    out = tmp_path / "run"
    shutil.copytree(one_epoch_run, out)  # --resume writes beside the last.pt it is given
    last = out / "weights/last.pt"
    state = load(last)
    state.update(epoch=0, iteration=2, world_size=2)  # 8 of the 12 images seen, on 2 processes
    state["args"]["epochs"] = 1  # the rest of that epoch: 2 iterations of 2 images
    torch.save(state, last)
    output = run(["--resume", last, "--workers", "0"]).stdout
    assert "resuming" in output and "at epoch 0, iteration 4" in output  # 8 images = 4 batches of 2
    assert "batch 2 x accumulate 2" in output
    resumed = load(last)
    assert (resumed["epoch"], resumed["args"]["batch"], resumed["args"]["accumulate"]) == (1, 2, 2)
    decay = next(g for g in resumed["optimizer"]["param_groups"] if g["name"] == "decay")
    assert decay["weight_decay"] == pytest.approx(5e-4 * 4 / 64)  # scaled by the step's 4 images, as before

    # The advice of the out-of-memory message, --batch, is accepted by --resume (same number of processes).
    state.update(world_size=1)
    torch.save(state, last)
    output = run(["--resume", last, "--workers", "0", "--batch", "2"]).stdout
    assert "at epoch 0, iteration 4" in output and "batch 2 x accumulate 2" in output


def test_compile_trains_and_saves_plain_weights(tiny_data, tmp_path):
    """--compile wraps the model in torch.compile: last.pt must hold the plain model's names (a checkpoint with
    '_orig_mod.' keys loads nowhere else), best.pt the same. Inductor's C++ build takes minutes on 2 cores,
    so dynamo runs here with its 'eager' backend: the graph capture and the wrapper are what this checks."""
    wrapper = make_wrapper(
        tmp_path,
        setup="""
        original_compile = torch.compile
        def eager_compile(model, **kw):
            compiled.append(type(model).__name__)
            return original_compile(model, backend="eager")
        torch.compile = eager_compile
        compiled = []
        """,
    )
    wrapper.write_text(wrapper.read_text() + "assert compiled == ['YOLO'], compiled\n")
    out = tmp_path / "run"
    run(["--data", tiny_data, "--epochs", "1", "--subset", "4", "--compile", "--out", out, *TINY], wrapper=wrapper)
    state = load(out / "weights/last.pt")
    assert state["args"]["compile"] and not any(k.startswith("_orig_mod") for k in state["model"])
    assert state["model"].keys() == load(out / "weights/best.pt")["model"].keys()


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


def test_a_cls_weights_list_of_the_wrong_length_gets_one_sentence_before_anything_is_written(tiny_data, tmp_path):
    result = run(["--data", tiny_data, "--cls-weights", "1,2", "--out", tmp_path / "x", *TINY], check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        "--cls-weights 1,2 has 2 numbers for a dataset of nc=6 classes; give auto or 6 comma-separated" in result.stderr
    )
    assert not (tmp_path / "x" / "args.yaml").exists() and not any((tmp_path / "x" / "weights").iterdir())


def test_mlflow_without_mlflow_installed_gets_one_sentence_before_anything_is_written(tiny_data, tmp_path):
    wrapper = make_wrapper(tmp_path, setup="sys.modules['mlflow'] = None  # import mlflow now fails, as uninstalled")
    result = run(["--data", tiny_data, "--mlflow", "--out", tmp_path / "x", *TINY], wrapper=wrapper, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--mlflow needs MLflow, which is not installed: pip install mlflow-skinny" in result.stderr
    assert not (tmp_path / "x").exists()


def test_reg_max_1_trains_11n_without_dfl_and_its_checkpoint_rebuilds_that_network(tiny_data, tmp_path):
    """--reg-max 1 (the no-DFL ablation): 4 distances per anchor instead of 4 x 16 bins, the L1 term in place of DFL;
    val.py, detect.py and export.py (model_from_checkpoint), a resume and a fine-tune from the .pt rebuild it from the
    weights."""
    from models.weights import architecture, model_from_checkpoint
    from utils.checkpoints.ours import load_checkpoint

    tiny = [*TINY, "--model", "11n", "--val-every", "9"]  # the last --model wins: 11n
    run(["--data", tiny_data, "--epochs", "1", "--reg-max", "1", "--out", tmp_path / "nodfl", *tiny])
    last = load(tmp_path / "nodfl/weights/last.pt")
    assert last["model"]["head.box.0.2.weight"].shape[0] == 4 and last["args"]["reg_max"] == 1
    assert last["scale"] == "11n" and math.isfinite(json.loads((tmp_path / "nodfl/metrics.json").read_text())["mAP50"])
    model = model_from_checkpoint(last)
    assert model.head.reg_max == 1 and not model.end2end
    with torch.no_grad():
        assert model(torch.rand(1, 3, 64, 64)).shape == (1, 8 * 8 + 4 * 4 + 2 * 2, 4 + 6)  # per anchor, for NMS
    # a .pt as --model (or a resume) is its network, whatever --reg-max says; a scale takes --reg-max
    pt = tmp_path / "nodfl/weights/last.pt"
    assert architecture(str(pt), 0, init_ckpt=load_checkpoint(pt)) == ("11n", 1)
    assert architecture("n", 0, resume_ckpt=last) == ("11n", 1) and architecture("26n", 16) == ("26n", 16)
    result = run(["--data", tiny_data, "--reg-max", "-1", "--out", tmp_path / "x", *tiny], check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--reg-max -1: give 0 (the family's), 1 (no DFL) or the DFL bins per side (16)" in result.stderr


def test_each_setting_that_is_not_the_default_is_printed_and_saved_with_its_source(tiny_data, tmp_path):
    """Four sources (flags, the dataset yaml's defaults:, the optimizer's choice, a resumed run) and which one won,
    at start and in args.yaml, which still reads back as plain yaml."""
    cfg = tmp_path / "with_defaults.yaml"
    cfg.write_text(tiny_data.read_text().replace("path: shapes", f"path: {tiny_data.parent / 'shapes'}")
                   + "defaults: {imgsz: 96, lr0: 0.004}\n")  # fmt: skip
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--imgsz", "64")]
    result = run(["--data", cfg, "--epochs", "1", "--lr0", "0.003", "--out", out, *tiny])
    saved = (out / "args.yaml").read_text()
    assert f"imgsz: 96  # <- {cfg} defaults" in saved.splitlines()
    assert "lr0: 0.003  # <- command line" in saved.splitlines()  # the flag wins over the yaml
    assert "optimizer: adamw  # <- --optimizer auto: 3 iterations" in saved.splitlines()
    assert "seed: 0" in saved.splitlines()  # a default: no comment
    assert yaml.safe_load(saved)["imgsz"] == 96
    assert f"imgsz 96 <- {cfg} defaults" in result.stdout + result.stderr
    result = run(["--resume", out / "weights/last.pt", "--epochs", "2"])
    assert "epochs 2 <- command line, resumed run had 1" in result.stdout + result.stderr
    saved = (out / "args.yaml").read_text().splitlines()
    assert "epochs: 2  # <- command line, resumed run had 1" in saved
    assert f"imgsz: 96  # <- resumed run {out / 'weights/last.pt'}" in saved
