"""The CUDA code paths of train.py, val.py, detect.py, export.py and the loss, run on a CUDA GPU emulated on the
CPU (tests/cuda_emulator.py), so that CI without a GPU runs them: `--device 0`, autocast in bf16 (compute
capability 8.0) and in fp16 with GradScaler (7.0), pinned batches, tensors that must all be on the GPU, and
the host syncs of a training step.

The scripts run in this process (runpy), where the emulator lives, not as subprocesses as in test_train.py.
"""

import contextlib
import csv
import logging
import os
import runpy
import signal
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from cuda_emulator import EmulatedCudaTensor, emulated_cuda
from test_train import tensors_equal

import utils.loss
import utils.optim
from models.yolo import YOLO
from utils.data.loader import multi_scale_size
from utils.data.shapes import make_shapes
from utils.loss import DetectionLoss

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--workers", "0", "--device", "0", "--warmup-epochs", "0", "--accumulate", "1"]
CUDA0 = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=8, n_val=4, seed=3, size=96)
    cfg = root / "tiny.yaml"
    names = ["circle", "square", "triangle", "star", "cross", "hexagon"]
    cfg.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": names}))
    return cfg


@contextlib.contextmanager
def process_state():
    """What a script changes in the process and a test run must not leave behind: signal handlers, the excepthook
    (train.py's crash handler), argv, the cwd, torch's determinism flags, the 'yolo' logger's files."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    excepthook, argv, cwd = sys.excepthook, sys.argv, os.getcwd()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.excepthook, sys.argv = excepthook, argv
        os.chdir(cwd)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
        log = logging.getLogger("yolo")
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()


def run_script(script, *args):
    """`python SCRIPT ARGS` in this process; returns its exit status."""
    with process_state():
        os.chdir(REPO)
        sys.argv = [script, *map(str, args)]
        try:
            runpy.run_path(str(REPO / script), run_name="__main__")
        except SystemExit as e:
            return 0 if e.code is None else e.code
    return 0


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def without_host_only_work(monkeypatch):
    """Leave out what does not touch the GPU and costs seconds per run: matplotlib's charts and the label and
    batch pictures (test_train.py and test_plots.py check those), and the GFLOPs count at 640 px (the bf16 run
    keeps it). val_batch0_pred.jpg, which runs the model on the GPU, stays."""
    import utils.plots

    for name in ("plot_results", "plot_labels", "plot_batch", "plot_pr_curve", "plot_confusion_matrix"):
        monkeypatch.setattr(utils.plots, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(utils.plots, "plot_confidence_curves", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(sys.modules["models.yolo"], "count_gflops", lambda *args, **kwargs: 0.0)


def watch_training(monkeypatch, gpu):
    """Record, per training forward, where the model's parameters and input are and the autocast state, and
    the host syncs counted up to the end of each optimizer step."""
    seen = types.SimpleNamespace(forwards=[], syncs_after_step=[])
    forward, step = YOLO.forward, utils.optim.optimizer_step

    def watched_forward(self, x):
        if self.training:
            seen.forwards.append(
                dict(
                    convs=sum(isinstance(m, torch.nn.Conv2d) for m in self.modules()),
                    parameters={p.device for p in self.parameters()},
                    input=x.device,
                    size=x.shape[-1],
                    autocast=torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda"),
                )
            )
        return forward(self, x)

    def watched_step(*args, **kwargs):
        stepped = step(*args, **kwargs)
        seen.syncs_after_step.append(Counter(gpu.host_syncs))
        return stepped

    monkeypatch.setattr(YOLO, "forward", watched_forward)
    monkeypatch.setattr(utils.optim, "optimizer_step", watched_step)  # train.py imports it when it runs
    return seen


@pytest.fixture(scope="module")
def bf16_run(data, tmp_path_factory):
    """train.py --device 0 on an emulated Ampere GPU (bf16 autocast), with --multi-scale and
    --checkpoint-activations: 4 optimizer steps of batch 2, one epoch. Its weights serve the tests of val.py,
    detect.py and export.py."""
    out = tmp_path_factory.mktemp("bf16") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch, emulated_cuda((8, 0)) as gpu:
        seen = watch_training(monkeypatch, gpu)
        recomputed = []
        checkpoint = sys.modules["models.yolo"].checkpoint

        def counted_checkpoint(block, x, **kwargs):
            recomputed.append(x.device)
            return checkpoint(block, x, **kwargs)

        monkeypatch.setattr(sys.modules["models.yolo"], "checkpoint", counted_checkpoint)
        status = run_script(
            "train.py", "--data", data, "--epochs", "1", "--batch", "2", "--multi-scale", "--checkpoint-activations",
            "--out", out, *TINY,
        )  # fmt: skip
    return types.SimpleNamespace(status=status, out=out, gpu=gpu, seen=seen, checkpointed=recomputed)


def test_train_in_bf16_on_an_ampere_gpu_with_multi_scale_and_activation_checkpointing(bf16_run):
    run, gpu = bf16_run, bf16_run.gpu
    assert run.status == 0
    log = (run.out / "train.log").read_text()
    assert "| cuda:0 |" in log and "amp bfloat16" in log
    forwards = run.seen.forwards
    assert len(forwards) == 4
    for f in forwards:  # the model and its input on the GPU, under CUDA autocast in bf16
        assert f["parameters"] == {CUDA0} and f["input"] == CUDA0 and f["autocast"] == torch.bfloat16, f
    # --multi-scale: the sizes of multi_scale_size, which vary
    assert [f["size"] for f in forwards] == [multi_scale_size(64, 0, i) for i in range(4)] == [64, 32, 32, 32]
    # Every convolution of the training forwards ran in bf16, and --checkpoint-activations ran them again in
    # the backward: more bf16 convolutions than the forwards alone have
    assert gpu.count("convolution", torch.bfloat16) > sum(f["convs"] for f in forwards)
    assert run.checkpointed and set(run.checkpointed) == {CUDA0}
    assert gpu.count("convolution_backward", torch.bfloat16) > 0
    assert gpu.pinned > 0  # the loaders pinned the batches, as they do for a CUDA device
    rows = list(csv.DictReader(open(run.out / "results.csv")))
    assert len(rows) == 1 and all(float(rows[0][k]) > 0 for k in ("box_loss", "cls_loss", "dfl_loss"))
    last = load(run.out / "weights/last.pt")  # saved from the GPU, loaded on the CPU
    assert last["epoch"] == 1 and last["ema_updates"] == 4 and not last["scaler"]  # bf16: no loss scaling
    weights = list(last["model"].values()) + list(last["ema"].values())
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in weights)
    assert all(torch.isfinite(t).all() for t in weights if t.is_floating_point())


@pytest.mark.parametrize("emulated_gpu", [(7, 0)], indirect=True)
def test_train_in_fp16_with_grad_scaler_skips_an_overflow_and_resumes_to_the_same_weights(
    emulated_gpu, data, tmp_path, monkeypatch
):
    """On a Volta GPU (no bf16) --amp is fp16 with loss scaling: an inf loss skips its step and halves the scale,
    and the run goes on. A SIGTERM in epoch 2 saves last.pt; --resume finishes the run with the scale it saved,
    to the weights of a run that was never stopped (test_train.py checks the same on the CPU)."""
    gpu = emulated_gpu
    without_host_only_work(monkeypatch)
    seen = watch_training(monkeypatch, gpu)
    calls, pre_empt = Counter(), [True]
    original_loss = DetectionLoss.__call__

    def faulty_loss(self, maps, targets):
        calls["loss"] += 1
        loss, parts = original_loss(self, maps, targets)
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


@pytest.fixture(scope="module")
def weights(bf16_run, tmp_path_factory):
    """best.pt of the bf16 run with its class biases zeroed: a model trained 4 steps scores everything near its
    prior (~1e-4); these scores spread around 0.5, which gives detections to compare."""
    ckpt = load(bf16_run.out / "weights/best.pt")
    for name, value in ckpt["model"].items():
        if name.startswith("head.cls.") and name.endswith(".2.bias"):
            value.zero_()
    path = tmp_path_factory.mktemp("weights") / "best.pt"
    torch.save(ckpt, path)
    return path


def test_val_in_fp16_on_the_gpu(weights, emulated_gpu, data, tmp_path):
    gpu, out = emulated_gpu, tmp_path / "val"
    args = ["--weights", weights, "--data", data, "--half", "--device", "0", "--workers", "0", "--batch", "4"]
    assert run_script("val.py", *args, "--out", out) == 0
    assert "on cuda:0" in (out / "val.log").read_text()
    assert {"mAP50", "mAP50-95", "speed_ms"} <= yaml.safe_load((out / "metrics.json").read_text()).keys()
    assert (out / "val_batch0_pred.jpg").exists()  # plots.plot_val_batch ran the model on the GPU too
    # --half: the whole network in fp16, nothing left in fp32
    assert gpu.count("convolution", torch.float16) > 0 and gpu.count("convolution", torch.float32) == 0
    assert gpu.host_syncs["synchronize"] > 0  # the per-stage timings wait for the GPU


def test_detect_on_the_gpu_finds_what_it_finds_on_the_cpu(weights, emulated_gpu, data, tmp_path):
    import detect

    gpu = emulated_gpu
    images = data.parent / "shapes/images/val"
    args = ["--weights", weights, "--source", images, "--save-txt", "--max-det", "20"]
    on_gpu = detect.main([*map(str, args), "--device", "0", "--out", str(tmp_path / "gpu")])
    assert gpu.count("convolution", torch.float32) > 0 and gpu.host_syncs["synchronize"] >= 4
    on_cpu = detect.main([*map(str, args), "--device", "cpu", "--out", str(tmp_path / "cpu")])
    labels = sorted(p.name for p in (on_gpu / "labels").iterdir())
    assert len(labels) == 4 and labels == sorted(p.name for p in (on_cpu / "labels").iterdir())
    rows = [(on_gpu / "labels" / name).read_text() for name in labels]
    assert all(rows)
    assert rows == [(on_cpu / "labels" / name).read_text() for name in labels]  # fp32 both: the same numbers
    assert len(list(on_gpu.glob("*.jpg"))) == 4


@pytest.mark.parametrize("options", [[], ["--nms"], ["--half"]], ids=["fp32", "nms", "fp16"])
def test_onnx_export_of_a_model_on_the_gpu(weights, emulated_gpu, tmp_path, capsys, options):
    """export.py checks the ONNX file against the PyTorch model on the GPU and exits non-zero if they disagree
    (fp16 once failed: the anchors' arange in half precision made a graph ONNX Runtime refused). In fp16 the raw
    output is the judge: NMS may keep the other one of two near-tied boxes of these barely trained weights."""
    import export

    half = "--half" in options
    copy = tmp_path / "best.pt"  # export.py writes best.onnx next to it
    copy.write_bytes(weights.read_bytes())
    export.main(["--weights", str(copy), "--onnx", "--device", "0", "--runs", "2", *options])
    printed = capsys.readouterr().out
    assert copy.with_suffix(".onnx").exists() and "best.onnx: raw output max |diff|" in printed
    assert (half or " 0 unmatched" in printed) and "detections 0 vs" not in printed
    dtype = torch.float16 if half else torch.float32
    assert emulated_gpu.count("convolution", dtype) > 0  # the PyTorch reference ran on the GPU


def random_batch(nc=6, imgsz=64, b=2, seed=0):
    """Head outputs and targets (image, class, x1, y1, x2, y2 in pixels) of a batch of b images."""
    g = torch.Generator().manual_seed(seed)
    maps = [torch.randn(b, 64 + nc, imgsz // s, imgsz // s, generator=g) for s in (8, 16, 32)]
    xy = torch.rand(5, 2, generator=g) * imgsz / 2
    boxes = torch.cat((xy, xy + 4 + torch.rand(5, 2, generator=g) * imgsz / 2), 1)
    targets = torch.cat(
        (torch.tensor([[0.0], [0], [1], [1], [1]]), torch.randint(0, nc, (5, 1), generator=g), boxes), 1
    )
    return maps, targets


def make_loss(nc=6):
    return DetectionLoss(types.SimpleNamespace(nc=nc, reg_max=16, strides=(8, 16, 32)))


def test_loss_of_an_empty_batch_on_the_gpu(emulated_gpu):
    maps, _ = random_batch()
    reference, reference_parts = make_loss()(maps, torch.zeros(0, 6))
    on_gpu = [m.to("cuda").requires_grad_() for m in maps]
    loss, parts = make_loss()(on_gpu, torch.zeros(0, 6, device="cuda"))
    assert isinstance(loss, EmulatedCudaTensor) and loss.device == parts.device == CUDA0
    assert torch.equal(loss.cpu(), reference) and torch.equal(parts.cpu(), reference_parts)
    assert parts[0].item() == parts[2].item() == 0 and parts[1].item() > 0  # only the class loss: all background
    loss.backward()
    assert all(m.grad.device == CUDA0 and torch.isfinite(m.grad).all().item() for m in on_gpu)


def test_out_of_memory_in_the_assignment_is_redone_on_the_cpu_with_the_same_loss(emulated_gpu, monkeypatch):
    maps, targets = random_batch()
    on_gpu, targets = [m.to("cuda") for m in maps], targets.to("cuda")
    reference, reference_parts = make_loss()(on_gpu, targets)
    calls, original = [], utils.loss.assign_targets

    def assign(*args, device=None, **kwargs):
        calls.append((device, {a.device for a in args}))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        result = original(*args, device=device, **kwargs)
        assert all(t.device == CUDA0 for t in result)  # back on the GPU from the CPU retry
        return result

    monkeypatch.setattr(utils.loss, "assign_targets", assign)
    loss_fn = make_loss()
    loss, parts = loss_fn(on_gpu, targets)
    assert calls == [(None, {CUDA0}), ("cpu", {CUDA0})]  # the retry is handed the GPU tensors and moves them
    assert loss_fn.assignments_on_cpu == 1 and emulated_gpu.empty_cache_calls == 1
    assert loss.device == parts.device == CUDA0
    assert torch.equal(loss.cpu(), reference.cpu()) and torch.equal(parts.cpu(), reference_parts.cpu())


def test_the_emulator_raises_where_cuda_would_on_a_cpu_tensor(emulated_gpu):
    x = torch.ones(3, device="cuda")
    for mixed in (lambda: x + torch.ones(3), lambda: torch.cat([x, torch.ones(3)]), lambda: x @ torch.ones(3, 2)):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            mixed()
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        x.numpy()
    # what CUDA accepts: a 0-dim CPU tensor (a scalar), CPU index tensors, and copies
    assert (x * torch.tensor(2.0)).device == CUDA0 and x[torch.tensor([0, 2])].device == CUDA0
    x.copy_(torch.arange(3.0))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0] and type(x.cpu()) is torch.Tensor


def test_a_loss_that_makes_a_tensor_on_the_cpu_fails_the_training_step(emulated_gpu, data, tmp_path, monkeypatch):
    """A device bug that CPU-only tests cannot see: the anchor grid made without device=, on the CPU."""
    make_anchors = utils.loss.make_anchors

    def anchors_on_the_cpu(maps, strides, offset=0.5):
        return make_anchors([torch.empty(0, 0, *m.shape[-2:], dtype=m.dtype) for m in maps], strides, offset)

    monkeypatch.setattr(utils.loss, "make_anchors", anchors_on_the_cpu)
    without_host_only_work(monkeypatch)
    maps, targets = random_batch()
    loss, _ = make_loss()(maps, targets)  # on the CPU, nothing to see
    assert torch.isfinite(loss)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        run_script("train.py", "--data", data, "--epochs", "1", "--batch", "4", "--out", tmp_path / "run", *TINY)
    assert not (tmp_path / "run/weights/last.pt").exists()


def test_host_syncs_per_optimizer_step(bf16_run):
    """The times a training step makes the host wait for the GPU (.item(), bool(), .tolist(), .cpu(), boolean-mask
    indexing, nonzero, ...), counted by the emulator. Two per optimizer step: the gradient norm's finiteness (the
    one decision a step needs from the GPU) and the progress bar's loss means on rank 0; it was 34 before the
    targets were padded on the host and the assignment and loss were made dense."""
    snapshots = bf16_run.seen.syncs_after_step
    assert len(snapshots) == 4
    per_step = [after - before for before, after in zip(snapshots, snapshots[1:])]  # whole steps: 2-3, 3-4
    for k, step in enumerate(per_step, 2):
        print(f"optimizer step {k}: {sum(step.values())} host syncs: {dict(step.most_common())}")
    assert all(step == Counter(_local_scalar_dense=1, tolist=1) for step in per_step), per_step


def test_the_emulator_leaves_torch_as_it_found_it():
    names = ["is_available", "device_count", "get_device_capability", "synchronize", "get_rng_state_all"]
    before = [getattr(torch.cuda, n) for n in names] + [torch.autocast, torch.amp.autocast, torch.onnx.export]
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    threads = torch.get_num_threads()
    with emulated_cuda((7, 0)) as gpu:
        assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (7, 0)
        assert (torch.ones(2, device="cuda") * 2).device == CUDA0 and gpu.ops
    after = [getattr(torch.cuda, n) for n in names] + [torch.autocast, torch.amp.autocast, torch.onnx.export]
    assert all(a is b for a, b in zip(before, after))
    assert torch.__future__.get_overwrite_module_params_on_conversion() == overwrite
    assert torch.get_num_threads() == threads
    assert torch.ones(2).device.type == "cpu"
    assert not torch._C._is_torch_function_mode_enabled() and not torch._C._len_torch_dispatch_stack()


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
