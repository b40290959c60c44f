"""Contracts the GPU path depends on, checked on the CPU (issue 12): the loss in fp32 whatever the
model's dtype, multi-scale sizes, devices and RNG states on machines with another GPU count, and
COCO evaluation of dense images. The end-to-end runs (AMP, OOM, NaN, DDP, SIGTERM) are in test_train_*.py."""

import copy
import sys
import types

import numpy as np
import pytest
import torch
from emulated_runs import process_state

from models.yolo import YOLO, Detect
from utils import distributed
from utils.boxes import make_anchors
from utils.checkpoints import ours as checkpoint
from utils.data.loader import multi_scale_max, multi_scale_size
from utils.evaluate import coco_map
from utils.general import seed_everything
from utils.loss import DetectionLoss

STRIDES = (8, 16, 32)


def random_batch(seed, nc, imgsz=640, b=2, reg_max=16):
    """Head outputs as a trained-ish model gives them, and boxes from 4 px to the whole image."""
    g = torch.Generator().manual_seed(seed)
    maps = [torch.randn(b, 4 * reg_max + nc, imgsz // s, imgsz // s, generator=g) * 3 for s in STRIDES]
    rows = []
    for image in range(b):
        n = int(torch.randint(1, 12, (1,), generator=g))
        # log-uniform, 4 px .. imgsz
        sizes = torch.exp(torch.empty(n, 2).uniform_(np.log(4), np.log(imgsz), generator=g))
        x1y1 = torch.rand(n, 2, generator=g) * (imgsz - sizes)
        classes = torch.randint(0, nc, (n, 1), generator=g).float()
        classes[0] = nc - 1  # the highest class id always occurs
        rows.append(torch.cat((torch.full((n, 1), float(image)), classes, x1y1, x1y1 + sizes), 1))
    if seed % 3 == 0:  # and the whole image
        rows.append(torch.tensor([[0.0, nc - 1, 0, 0, imgsz, imgsz]]))
    return maps, torch.cat(rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loss_of_half_precision_maps_is_finite_and_equals_fp32(dtype):
    """bf16 maps used to crash the DFL (its clamp below the last bin rounded onto it) and fp16 ones to
    overflow the assigner's IoU: now the loss runs in fp32 whatever it is given, even inside autocast."""
    nc = 365  # Objects365: class ids up to 364, past what bf16 holds exactly (256)
    loss_fn = DetectionLoss(types.SimpleNamespace(nc=nc, reg_max=16, strides=STRIDES))
    for seed in range(12):
        maps, targets = random_batch(seed, nc)
        half = [m.to(dtype) for m in maps]
        reference, reference_parts = loss_fn([m.float() for m in half], targets)
        loss, parts = loss_fn(half, targets)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            in_autocast, _ = loss_fn(half, targets)
        assert loss.dtype == torch.float32 and torch.isfinite(loss) and torch.isfinite(parts).all(), seed
        assert torch.isfinite(in_autocast) and in_autocast.dtype == torch.float32
        for value in (loss, in_autocast):
            assert abs(value.item() - reference.item()) <= 0.01 * abs(reference.item()), (
                seed,
                value.item(),
                reference.item(),
            )


def test_loss_gradient_flows_back_to_half_precision_maps():
    nc = 6
    loss_fn = DetectionLoss(types.SimpleNamespace(nc=nc, reg_max=16, strides=STRIDES))
    maps, targets = random_batch(1, nc, imgsz=320)
    half = [m.to(torch.bfloat16).requires_grad_() for m in maps]
    loss, _ = loss_fn(half, targets)
    loss.backward()
    assert all(
        m.grad is not None and m.grad.dtype == torch.bfloat16 and torch.isfinite(m.grad.float()).all() for m in half
    )


@pytest.mark.parametrize("imgsz", [640, 1280])
def test_boxes_are_decoded_in_fp32_for_a_half_model_and_inside_autocast(imgsz):
    """val.py --half (a .half() model) and the per-epoch metric (the fp32 EMA inside fp16 autocast) used to
    decode boxes in fp16: up to 0.53 px off at 640 and 0.71 px at 1280 from the same maps decoded in fp32."""
    nc = 80
    head = Detect(nc, (64, 128, 256)).eval()
    maps, _ = random_batch(0, nc, imgsz)
    maps = [m.half() for m in maps]  # what a half backbone hands the head: the same values for all three
    with torch.no_grad():
        reference = head.decode([m.float() for m in maps])
        in_half = copy.deepcopy(head).half().decode(maps)
        with torch.autocast("cpu", dtype=torch.float16):
            in_autocast = head.decode([m.float() for m in maps])
    assert reference[..., :4].max() > imgsz * 0.9  # the boxes reach the far side, where fp16 is coarsest
    for name, out in (("half model", in_half), ("autocast", in_autocast)):
        box_difference = (out[..., :4].float() - reference[..., :4]).abs().max().item()
        assert box_difference < 0.05, (name, box_difference)
        assert out.dtype == torch.float32 and (out[..., 4:] - reference[..., 4:]).abs().max() < 1e-6, name
    anchors, strides = make_anchors(maps, STRIDES)
    assert anchors.dtype == strides.dtype == torch.float32


def test_a_half_model_returns_fp32_boxes_and_scores():
    torch.manual_seed(0)
    model = YOLO("n", nc=3).eval()
    x = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        reference, out = model(x), copy.deepcopy(model).half()(x.half())
    assert out.dtype == torch.float32 and out.shape == reference.shape
    assert torch.allclose(out, reference, rtol=1e-2, atol=0.1)  # the backbone itself runs in fp16


@pytest.mark.parametrize("imgsz", range(320, 641, 32))
def test_multi_scale_sizes_are_multiples_of_32_for_every_imgsz(imgsz):
    sizes = [multi_scale_size(imgsz, seed=0, iteration=i) for i in range(400)]
    assert all(s % 32 == 0 for s in sizes), sorted(set(sizes))
    assert imgsz // 2 - 32 < min(sizes) and max(sizes) <= imgsz * 3 // 2 + 32
    assert len(set(sizes)) >= 8  # it really varies
    assert sizes == [multi_scale_size(imgsz, seed=0, iteration=i) for i in range(400)]  # a pure function
    drawn = {multi_scale_size(imgsz, seed=s, iteration=i) for s in range(3) for i in range(2000)}
    assert max(drawn) == multi_scale_max(imgsz)  # what --batch -1 measures at under --multi-scale


@pytest.fixture
def fake_gpus(monkeypatch):
    """A machine with 4 CUDA GPUs, as far as torch.cuda's device bookkeeping is concerned."""
    made_current, rng_set = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: made_current.append(torch.device(d)))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, index: rng_set.append(index))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    return types.SimpleNamespace(made_current=made_current, rng_set=rng_set)


def test_several_gpus_without_torchrun_exit_with_the_torchrun_command(fake_gpus, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--data", "my data.yaml", "--device", "0,1"])
    with pytest.raises(SystemExit) as e:
        distributed.setup_distributed("0,1")
    message = str(e.value)
    assert "torchrun --nproc_per_node 2 train.py --data 'my data.yaml' --device 0,1" in message
    assert not fake_gpus.made_current  # nothing started on one GPU


def test_the_chosen_gpu_is_made_current(fake_gpus):
    device, rank, local_rank, world_size, group = distributed.setup_distributed("2")
    assert device == torch.device("cuda", 2) and world_size == 1 and group is None
    assert fake_gpus.made_current == [torch.device("cuda", 2)]
    with pytest.raises(SystemExit, match="4 GPU"):
        distributed.select_device("7")


def test_resume_on_a_machine_with_fewer_gpus_restores_the_states_of_those_present(fake_gpus):
    states = checkpoint.rng_states()
    states["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 8  # saved on an 8-GPU machine
    checkpoint.set_rng_states(states)
    assert fake_gpus.rng_set == [0, 1, 2, 3]


def test_an_image_with_150_objects_can_reach_recall_1():
    """COCO's default of 100 detections per image would cap recall at 100/150."""
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 900, (150, 2))
    boxes = np.concatenate((xy, rng.uniform(10, 90, (150, 2))), 1).round(1).tolist()
    gt = {
        "images": [{"id": 1, "width": 1000, "height": 1000}],
        "annotations": [
            {"id": k + 1, "image_id": 1, "category_id": 0, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
            for k, b in enumerate(boxes)
        ],
        "categories": [{"id": 0, "name": "thing"}],
    }
    detections = [{"image_id": 1, "category_id": 0, "bbox": b, "score": 1 - k / 1000} for k, b in enumerate(boxes)]
    map5095, map50, ap, _, ev = coco_map(gt, detections, [0], max_det=300)
    assert map5095 == pytest.approx(1.0) and map50 == pytest.approx(1.0) and ap[0] == pytest.approx(1.0)
    assert ev.eval["recall"][:, 0, 0, -1].min() == pytest.approx(1.0)


def test_batch_minus_one_fits_the_measured_memory_to_the_free_share():
    from utils.autobatch import fit_batch_size

    linear = lambda b: 1e9 + b * 2e8  # noqa: E731  fixed 1 GB + 0.2 GB per image
    assert fit_batch_size(linear, free_bytes=10e9, share=0.6) == 25  # (6 GB - 1 GB) / 0.2 GB
    assert fit_batch_size(lambda b: None if b >= 8 else linear(b), free_bytes=10e9) == 7  # never past an OOM
    assert fit_batch_size(lambda b: None, free_bytes=10e9) == 1


@pytest.fixture
def torchrun_env(fake_gpus, monkeypatch):
    """torchrun's variables for one process of two on this node; process-group creation recorded, not run."""
    started = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **kw: started.append(kw))
    monkeypatch.setattr(distributed.dist, "new_group", lambda *a, **kw: "flags")

    def launch(local_rank, local_world_size=2, visible=4):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
        env = dict(RANK=local_rank, WORLD_SIZE=local_world_size, LOCAL_RANK=local_rank)
        for key, value in {**env, "LOCAL_WORLD_SIZE": local_world_size}.items():
            monkeypatch.setenv(key, str(value))
        return started

    return launch


def test_torchrun_on_named_gpus_puts_each_rank_and_its_ddp_on_that_gpu(torchrun_env, fake_gpus, monkeypatch):
    """torchrun --nproc_per_node 2 train.py --device 2,3: local rank 1 trains on cuda:3, and DDP is told cuda:3
    (it was told device_ids=[1], the local rank: the first forward then mixed cuda:1 and cuda:3)."""
    started = torchrun_env(local_rank=1)
    device, rank, local_rank, world_size, _ = distributed.setup_distributed("2,3")
    assert device == torch.device("cuda", 3) and (rank, local_rank, world_size) == (1, 1, 2)
    assert fake_gpus.made_current == [device] and started[0]["device_id"] == device
    told = {}
    monkeypatch.setattr(distributed, "DistributedDataParallel", lambda model, **kw: told.update(kw))
    distributed.wrap_ddp(torch.nn.Linear(1, 1), device)
    assert told["device_ids"] == [3] and told["broadcast_buffers"] is False


def test_one_gpu_per_task_uses_the_one_gpu_each_task_sees(torchrun_env, fake_gpus):
    """SLURM --gpus-per-task=1: every task sees only cuda:0, so local rank 1 must not ask for cuda:1."""
    torchrun_env(local_rank=1, visible=1)
    device, *_ = distributed.setup_distributed("")
    assert device == torch.device("cuda", 0)
    torchrun_env(local_rank=3, local_world_size=4, visible=2)
    with pytest.raises(SystemExit, match="local rank 3 has no GPU: this process sees 2"):
        distributed.setup_distributed("")


def test_batch_minus_one_measures_at_the_largest_multi_scale_size_and_is_capped(monkeypatch):
    """--batch -1 --multi-scale measured at --imgsz let a quarter of the iterations need more memory than measured
    (repeated OOM); and on a large GPU small images gave thousands of images per step."""
    from utils import autobatch

    measured = []
    monkeypatch.setattr(autobatch, "auto_batch_size", lambda model, imgsz, *a: measured.append(imgsz) or 5000)
    batch = autobatch.batch_from_memory(None, multi_scale_max(640), torch.device("cuda", 0), None, 1, default=16)
    assert measured == [960] and batch == autobatch.MAX_BATCH


@pytest.mark.parametrize("deterministic", [False, True])
def test_cudnn_searches_no_algorithms_per_shape(deterministic):
    """cudnn.benchmark's search per new batch shape cost an H100 run 35 s for no speed-up per epoch: off, always."""
    with process_state():  # the cuDNN and determinism flags as they were, whatever the test leaves
        torch.backends.cudnn.benchmark = True  # as another library may have left it
        seed_everything(0, deterministic)
        assert torch.backends.cudnn.benchmark is False
        if deterministic:
            assert torch.backends.cudnn.deterministic and torch.are_deterministic_algorithms_enabled()
