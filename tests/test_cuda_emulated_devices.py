"""On the emulated GPU (cuda_emulator.py): the loss's tensors stay on the GPU (empty batch, the OOM retry on the CPU),
a tensor made on the CPU fails the step, and the emulator raises where CUDA would and restores torch."""

import types

import pytest
import torch
from cuda_emulator import EmulatedCudaTensor, emulated_cuda
from emulated_runs import CUDA0, TINY, run_script, without_host_only_work

import utils.loss
from utils.loss import DetectionLoss


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
