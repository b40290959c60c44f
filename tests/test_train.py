"""train.py and val.py end to end, on a tiny generated dataset, on the CPU (issue 4).

Every run here is a real `python train.py ...` subprocess, as a user would start it. Faults
(out of memory, NaN loss) are injected by a small wrapper that patches the loss and then runs
train.py unchanged, so train.py itself has no test hooks.
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml

from utils.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": ["circle", "square", "triangle", "star", "cross", "hexagon"]}))
    return cfg


def run(args, cwd=REPO, wrapper=None, check=True, **popen):
    """`python train.py ARGS` (or `python WRAPPER ARGS`); a first argument ending in .py replaces train.py."""
    script = [str(wrapper)] if wrapper else [] if str(args[0]).endswith(".py") else ["train.py"]
    cmd = [sys.executable, *script, *map(str, args)]
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, **popen)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def tensors_equal(a, b):
    """Every tensor of two (nested) checkpoint dicts is bitwise identical."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return True


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)  # checkpoints must load this way


def test_two_epoch_run_writes_every_output(tiny_data, tmp_path):
    out = tmp_path / "run"
    run(["--data", tiny_data, "--epochs", "2", "--out", out, *TINY])
    for name in ["weights/last.pt", "weights/best.pt", "results.csv", "results.png", "args.yaml", "train.log", "metrics.json", "pr_curve.png", "confusion_matrix.png"]:
        assert (out / name).exists(), name
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for column in ["box_loss", "cls_loss", "dfl_loss", "precision", "recall", "mAP50", "mAP50-95", "lr", "seconds"]:
        assert column in rows[0] and float(rows[-1][column]) == float(rows[-1][column])  # present, not NaN
    last, best = load(out / "weights/last.pt"), load(out / "weights/best.pt")
    assert last["epoch"] == 2 and last["iteration"] == 0 and "optimizer" in last and "scaler" in last
    assert "optimizer" not in best and best["names"][0] == "circle" and best["imgsz"] == 64  # deployable, self-describing
    assert torch.equal(best["model"]["head.cls.0.2.bias"], last["ema"]["head.cls.0.2.bias"]) or best["epoch"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"mAP50", "mAP50-95", "precision", "recall"} <= metrics.keys()
    assert yaml.safe_load((out / "args.yaml").read_text())["epochs"] == 2


def test_killed_run_resumes_to_bitwise_identical_weights(tiny_data, tmp_path):
    common = ["--data", tiny_data, "--epochs", "3", "--deterministic", "--accumulate", "2", "--save-every", "2", "--val-every", "3", *TINY]
    common[common.index("--workers") + 1] = "2"  # real worker processes: the data must not depend on them
    run([*common, "--out", tmp_path / "straight"])

    # Start the same run, SIGKILL it after its second mid-run save, resume it.
    out = tmp_path / "runs" / "train" / "killed"
    proc = subprocess.Popen([sys.executable, "train.py", *map(str, common), "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last, seen, deadline = out / "weights" / "last.pt", set(), time.time() + 240
    while len(seen) < 2 and proc.poll() is None and time.time() < deadline:
        if last.exists():
            seen.add(last.stat().st_mtime_ns)
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    state = load(last)
    assert (state["epoch"], state["iteration"]) < (3, 0)
    # --resume without a path: the newest runs/train/*/weights/last.pt under the working directory
    run([REPO / "train.py", "--resume", "--workers", "2"], cwd=tmp_path)

    straight, resumed = load(tmp_path / "straight/weights/last.pt"), load(last)
    for key in ("model", "ema", "optimizer"):
        assert tensors_equal(straight[key], resumed[key]), key
    assert straight["ema_updates"] == resumed["ema_updates"]


def test_sigterm_saves_and_exits_cleanly(tiny_data, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", "--data", str(tiny_data), "--epochs", "50", "--out", str(out), *TINY], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (out / "results.csv").exists() and time.time() < deadline:  # written once the handlers are set
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-2000:]
    state = load(out / "weights/last.pt")
    assert state["epoch"] < 50
    assert "resume with --resume" in output


WRAPPER = """
import runpy, sys, torch
sys.path.insert(0, {repo!r})
import utils.loss
original = utils.loss.DetectionLoss.__call__
calls = {{"n": 0}}

def patched(self, maps, targets, assign_on=None):
    calls["n"] += 1
{body}
    return original(self, maps, targets, assign_on=assign_on)

utils.loss.DetectionLoss.__call__ = patched
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def make_wrapper(tmp_path, body):
    path = tmp_path / "wrapper.py"
    path.write_text(WRAPPER.format(repo=str(REPO), body=textwrap.indent(textwrap.dedent(body), "    ")))
    return path


def test_out_of_memory_step_is_retried_on_cpu_with_the_same_result(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", "--subset", "4", "--deterministic", *TINY]
    run([*args, "--out", tmp_path / "plain"])
    wrapper = make_wrapper(tmp_path, """
        if calls["n"] == 1 and assign_on is None:  # the first step runs out of memory on the GPU
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        if calls["n"] == 2:
            assert assign_on == "cpu", "the retry must move the assignment to the CPU"
    """)
    result = run([*args, "--out", tmp_path / "oom"], wrapper=wrapper)
    assert "retrying with the assignment on the CPU" in result.stdout + result.stderr
    row = next(csv.DictReader(open(tmp_path / "oom/results.csv")))
    assert row["oom_retries"] == "1" and row["skipped_batches"] == "0"
    plain, retried = load(tmp_path / "plain/weights/last.pt"), load(tmp_path / "oom/weights/last.pt")
    assert tensors_equal(plain["model"], retried["model"])


def test_nan_loss_is_skipped_and_repeated_nan_writes_crash(tiny_data, tmp_path):
    args = ["--data", tiny_data, "--epochs", "1", *TINY]
    once = make_wrapper(tmp_path, """
        if calls["n"] == 1:
            loss, parts = original(self, maps, targets, assign_on=assign_on)
            return loss * float("nan"), parts
    """)
    run([*args, "--out", tmp_path / "once"], wrapper=once)
    row = next(csv.DictReader(open(tmp_path / "once/results.csv")))
    assert row["bad_losses"] == "1"
    assert torch.isfinite(load(tmp_path / "once/weights/last.pt")["model"]["head.cls.0.2.weight"]).all()

    (tmp_path / "always").mkdir()
    always = make_wrapper(tmp_path / "always", """
        loss, parts = original(self, maps, targets, assign_on=assign_on)
        return loss + float("inf"), parts
    """)
    result = run([*args, "--epochs", "3", "--out", tmp_path / "dead"], wrapper=always, check=False)
    assert result.returncode != 0
    crash = tmp_path / "dead" / "crash"
    assert "non-finite" in (crash / "reason.txt").read_text()
    batch = torch.load(crash / "batch.pt", weights_only=True)
    assert batch["images"].dtype == torch.uint8 and batch["images"].shape[1:] == (3, 64, 64)
    assert {"args", "epoch", "iteration", "last_checkpoint"} <= yaml.safe_load((crash / "context.yaml").read_text()).keys()
    assert (crash / "environment.json").exists()


def test_uncaught_exception_writes_crash(tiny_data, tmp_path):
    boom = make_wrapper(tmp_path, """
        if calls["n"] == 2:
            raise RuntimeError("something unexpected")
    """)
    result = run(["--data", tiny_data, "--epochs", "1", "--out", tmp_path / "run", *TINY], wrapper=boom, check=False)
    assert result.returncode != 0
    assert "something unexpected" in (tmp_path / "run/crash/reason.txt").read_text()


def test_torchrun_two_cpu_processes_end_with_identical_weights(tiny_data, tmp_path):
    saver = tmp_path / "ddp_wrapper.py"
    saver.write_text(textwrap.dedent(f"""
        import os, runpy, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        sys.argv = ["train.py"] + sys.argv[1:]
        g = runpy.run_path("train.py", run_name="__main__")
        from utils.ema import unwrap
        torch.save(unwrap(g["model"]).state_dict(), {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}.pt")
    """))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517", str(saver), "--data", str(tiny_data), "--epochs", "1", "--subset", "8", "--out", str(tmp_path / "ddp"), *TINY]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    params = [k for k in rank0 if "running" not in k and "num_batches" not in k]  # BN stats stay per rank (M2)
    assert all(torch.equal(rank0[k], rank1[k]) for k in params)
    assert (tmp_path / "ddp/weights/last.pt").exists()


def test_val_map_equals_pycocotools_on_the_saved_detections(tiny_data, tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    run(["--data", tiny_data, "--epochs", "2", "--out", tmp_path / "train", *TINY])
    out = tmp_path / "val"
    result = subprocess.run([sys.executable, "val.py", "--weights", tmp_path / "train/weights/last.pt", "--data", tiny_data, "--save-json", "--workers", "0", "--out", out], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mAP50-95" in result.stdout and "inference" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    gt = COCO(str(out / "ground_truth.json"))
    detections = json.loads((out / "predictions.json").read_text())
    assert detections, "the tiny model should produce some low-confidence detections"
    ev = COCOeval(gt, gt.loadRes(detections), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert metrics["mAP50-95"] == pytest.approx(ev.stats[0], abs=1e-9)
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


def test_weights_freeze_multi_scale_and_the_other_run_options(tiny_data, tmp_path):
    """--weights initialises, --freeze keeps those parameters out of the optimizer and unchanged,
    --multi-scale changes the size per iteration (multiples of 32 in 0.5-1.5x imgsz), and --cache ram,
    --checkpoint-activations, --profile and --benchmark run through and leave what they promise."""
    run(["--data", tiny_data, "--epochs", "1", "--out", tmp_path / "first", *TINY])
    sizes = make_wrapper(tmp_path, """
        print("input size", maps[0].shape[-1] * 8)
    """)
    options = ["--multi-scale", "--cache", "ram", "--checkpoint-activations", "--profile", "--accumulate", "1"]
    result = run(["--data", tiny_data, "--epochs", "2", "--weights", tmp_path / "first/weights/last.pt", "--freeze", "stem,down2", *options, "--out", tmp_path / "second", *TINY], wrapper=sizes)
    seen = [int(s) for s in re.findall(r"input size (\d+)", result.stdout)]
    assert len(seen) == 6 and len(set(seen)) > 1 and set(seen) <= {32, 64, 96}, seen
    first, second = load(tmp_path / "first/weights/last.pt"), load(tmp_path / "second/weights/last.pt")
    assert "initialised" in (tmp_path / "second/train.log").read_text()
    for name in ("stem.conv.weight", "down2.bn.weight", "down2.bn.bias"):  # frozen: still the --weights values
        assert torch.equal(second["model"][name], first["ema"][name]), name
    assert not torch.equal(second["model"]["stage2.cv1.conv.weight"], first["ema"]["stage2.cv1.conv.weight"])
    trainable = sum(1 for k in second["model"] if k.endswith(("weight", "bias")) and not k.startswith(("stem.", "down2.")))
    assert sum(len(g["params"]) for g in second["optimizer"]["param_groups"]) == trainable
    assert json.loads((tmp_path / "second/profile_trace.json").read_text())["traceEvents"]

    result = run(["--data", tiny_data, "--benchmark", "2", "--out", tmp_path / "bench", *TINY])
    assert re.search(r"benchmark: [0-9.]+ images/s", result.stdout)
