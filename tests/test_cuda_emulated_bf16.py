"""One train.py run in bf16 on an emulated Ampere GPU (cuda_emulator.py), --multi-scale, --checkpoint-activations:
its host syncs per step, and its weights on the GPU in val.py --half, detect.py and export.py --onnx."""

import csv
import sys
import types
from collections import Counter

import pytest
import torch
import yaml
from cuda_emulator import emulated_cuda
from emulated_runs import CUDA0, TINY, load, run_script, watch_training

from utils.data.loader import multi_scale_size


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
