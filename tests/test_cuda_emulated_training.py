"""train.py on the emulated GPU (cuda_emulator.py): fp16 with GradScaler through an overflow, a SIGTERM and a bitwise
--resume; --batch -1 --multi-scale; YOLO26's two heads in bf16, validated in fp16 end to end and with --nms; a --teacher
beside the student in bf16."""

import csv
import os
import signal
from collections import Counter

import pytest
import torch
import yaml
from cuda_emulator import emulated_cuda
from emulated_runs import CUDA0, TINY, load, run_script, watch_training, without_host_only_work
from train_runs import make_checkpoint, tensors_equal

from models.yolo import YOLO
from utils.loss import DetectionLoss


@pytest.mark.parametrize("emulated_gpu", [(7, 0)], indirect=True)
def test_train_in_fp16_with_grad_scaler_skips_an_overflow_and_resumes_to_the_same_weights(
    emulated_gpu, data, tmp_path, monkeypatch
):
    """On a Volta GPU (no bf16) --amp is fp16 with loss scaling: an inf loss skips its step and halves the scale,
    and the run goes on. A SIGTERM in epoch 2 saves last.pt; --resume finishes the run with the scale it saved,
    to the weights of a run that was never stopped (test_train_resume.py checks the same on the CPU)."""
    gpu = emulated_gpu
    without_host_only_work(monkeypatch)
    seen = watch_training(monkeypatch, gpu)
    calls, pre_empt = Counter(), [True]
    original_loss = DetectionLoss.__call__

    def faulty_loss(self, maps, targets, teacher_maps=None):
        calls["loss"] += 1
        loss, parts = original_loss(self, maps, targets, teacher_maps)
        if calls["loss"] == 1:
            return loss * float("inf"), parts
        if calls["loss"] == 3 and pre_empt[0]:  # epoch 2, first step
            os.kill(os.getpid(), signal.SIGTERM)
        return loss, parts

    monkeypatch.setattr(DetectionLoss, "__call__", faulty_loss)
    out = tmp_path / "run"
    args = ["--data", data, "--epochs", "2", "--batch", "4", "--val-every", "2", *TINY]
    assert run_script("train.py", *args, "--out", out) == 0
    log = (out / "train.log").read_text()
    assert "| cuda:0 |" in log and "amp float16" in log
    assert "epoch 1 iteration 0: optimizer step skipped (1 in a row; fp16 loss scale now 32768)" in log
    assert all(f["autocast"] == torch.float16 and f["parameters"] == {CUDA0} for f in seen.forwards)
    assert gpu.count("convolution", torch.float16) > 0 and gpu.count("convolution", torch.bfloat16) == 0
    # GradScaler's own kernels ran on the (emulated) GPU tensors
    assert gpu.count("_amp_foreach_non_finite_check_and_unscale_") >= 3 and gpu.count("_amp_update_scale_") >= 3
    # Each skipped step halves the scale from 2^16: the injected one, and any true fp16 overflow of the search
    skipped = log.count("optimizer step skipped")
    stopped = load(out / "weights/last.pt")
    assert (stopped["epoch"], stopped["iteration"], stopped["ema_updates"]) == (1, 1, 3 - skipped)
    assert stopped["scaler"]["scale"] == 2.0**16 / 2**skipped

    assert run_script("train.py", "--resume", out / "weights/last.pt", "--workers", "0") == 0
    log = (out / "train.log").read_text()
    assert "resuming" in log and log.count("amp float16") == 2
    skipped = log.count("optimizer step skipped")
    resumed = load(out / "weights/last.pt")
    assert (resumed["epoch"], resumed["iteration"], resumed["ema_updates"]) == (2, 0, 4 - skipped)
    # the resumed run went on with the saved scale (pitfall T1), not a new search from 2^16
    assert resumed["scaler"]["scale"] == 2.0**16 / 2**skipped
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"] and sum(int(r["nonfinite_skipped_steps"]) for r in rows) == skipped

    calls.clear()
    pre_empt[0] = False
    assert run_script("train.py", *args, "--out", tmp_path / "straight") == 0
    straight = load(tmp_path / "straight/weights/last.pt")
    for key in ("model", "ema", "optimizer", "scaler", "ema_updates"):
        assert tensors_equal(straight[key], resumed[key]), key


def test_batch_minus_one_with_multi_scale_measures_at_the_largest_size(emulated_gpu, data, tmp_path, monkeypatch):
    """--batch -1 --multi-scale at 64 px draws sizes up to 96 px: the batch is measured there (at 64 px a quarter
    of the iterations needed more memory than measured), on the GPU, with a model of the run's size."""
    import utils.autobatch

    measured = []

    def fake_measure(model, imgsz, device, amp_dtype=None):
        measured.append((imgsz, device, next(model.parameters()).device, type(model).__name__))
        return 4

    monkeypatch.setattr(utils.autobatch, "auto_batch_size", fake_measure)
    without_host_only_work(monkeypatch)
    args = ["--data", data, "--epochs", "1", "--batch", "-1", "--multi-scale", "--out", tmp_path / "run", *TINY]
    assert run_script("train.py", *args) == 0
    assert measured == [(96, CUDA0, CUDA0, "YOLO")]
    assert yaml.safe_load((tmp_path / "run/args.yaml").read_text())["batch"] == 4


def test_yolo26_trains_in_bf16_with_both_heads_and_validates_in_fp16_on_the_gpu(data, tmp_path, monkeypatch):
    """YOLO26 on the GPU path: its two heads (the one-to-one copy on detached features) train under bf16 autocast
    with the same two host syncs per optimizer step as the other models (both branches' losses share one padding
    of the targets), and val.py --half answers with the end-to-end head, and with --nms with the other one."""
    without_host_only_work(monkeypatch)
    out = tmp_path / "run"
    args = ["--data", data, "--epochs", "1", "--batch", "2", "--out", out, *TINY, "--model", "26n"]
    with emulated_cuda((8, 0)) as gpu:
        seen = watch_training(monkeypatch, gpu)
        assert run_script("train.py", *args) == 0
    assert "amp bfloat16" in (out / "train.log").read_text()
    assert len(seen.forwards) == 4 and all(f["autocast"] == torch.bfloat16 for f in seen.forwards)
    assert all(f["parameters"] == {CUDA0} and f["input"] == CUDA0 for f in seen.forwards)
    per_step = [after - before for before, after in zip(seen.syncs_after_step, seen.syncs_after_step[1:])]
    assert all(step == Counter(_local_scalar_dense=1, tolist=1) for step in per_step), per_step
    last = load(out / "weights/last.pt")
    assert any(k.startswith("head.one2one_box.") for k in last["model"])
    assert all(torch.isfinite(t).all() for t in last["model"].values() if t.is_floating_point())
    row = next(csv.DictReader(open(out / "results.csv")))
    assert all(float(row[k]) > 0 for k in ("box_loss", "cls_loss", "l1_loss"))  # no DFL: its third term is L1

    ops = {}  # mode: (top-k runs, NMS runs)
    for mode in ("end2end", "--nms"):
        val = tmp_path / mode.strip("-")
        with emulated_cuda((8, 0)) as gpu:
            argv = ["--weights", out / "weights/best.pt", "--data", data, "--half", "--device", "0", "--workers", "0"]
            assert run_script("val.py", *argv, *[mode] * (mode == "--nms"), "--out", val) == 0
        assert gpu.count("convolution", torch.float16) > 0 and gpu.count("convolution", torch.float32) == 0
        ops[mode] = gpu.count("topk"), gpu.count("nms")
        assert {"mAP50", "mAP50-95"} <= yaml.safe_load((val / "metrics.json").read_text()).keys()
    # end to end: the head's top-k picks the detections and nothing runs NMS; --nms: NMS picks them, no top-k
    assert ops["end2end"][0] > 0 and ops["end2end"][1] == 0
    assert ops["--nms"][0] == 0 and ops["--nms"][1] > 0


def test_a_teacher_runs_on_the_gpu_in_the_amp_dtype_beside_the_student(emulated_gpu, data, tmp_path, monkeypatch):
    """--teacher under bf16 AMP: the teacher's weights live on the GPU in bf16 (no cast of them each step), it runs
    once per training step in eval under no_grad on the student's batch, in bf16, and adds no host sync to a step."""
    teacher = make_checkpoint(tmp_path / "teacher.pt", opinions=True)
    without_host_only_work(monkeypatch)
    teacher_runs, forward = [], YOLO.forward

    def watched_teacher(self, x, mode=None):
        parameter = next(self.parameters())
        if not self.training and parameter.dtype == torch.bfloat16:  # the EMA that validates is fp32
            teacher_runs.append((parameter.device, x.device, x.dtype, torch.is_grad_enabled(), x.shape[0]))
        return forward(self, x, mode)

    monkeypatch.setattr(YOLO, "forward", watched_teacher)
    seen = watch_training(monkeypatch, emulated_gpu)  # the student's forwards, around the teacher's watch
    out = tmp_path / "run"
    args = ["--data", data, "--epochs", "1", "--batch", "2", "--teacher", teacher, "--out", out, *TINY]
    assert run_script("train.py", *args) == 0
    assert "amp bfloat16" in (out / "train.log").read_text()
    assert len(seen.forwards) == 4 and teacher_runs == [(CUDA0, CUDA0, torch.bfloat16, False, 2)] * 4
    per_step = [after - before for before, after in zip(seen.syncs_after_step, seen.syncs_after_step[1:])]
    assert all(step == Counter(_local_scalar_dense=1, tolist=1) for step in per_step), per_step
    row = next(csv.DictReader(open(out / "results.csv")))
    assert float(row["distill_loss"]) > 0
