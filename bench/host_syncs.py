"""Host synchronisations of one training step: how often the CPU waits for the GPU, by op.

    python bench/host_syncs.py                            # n model, 640 px, batch 8, CPU
    python bench/host_syncs.py --model s --batch 16 --device 0

A CUDA op that hands a value back to Python (.item(), bool(), int(), a boolean-mask index, nonzero, a
device->host copy, ...) makes the CPU wait until the GPU has run everything queued before it: the GPU then
idles while Python launches the next kernels. `count_host_syncs()` counts those ops as they are dispatched,
and does so on the CPU too (a CPU tensor stands for the CUDA tensor it would be on a GPU), so the tests can
hold the loss to a number without a GPU. The step is train.py's: forward, loss, backward, clip + isfinite
check and optimizer step (utils/optim.optimizer_step), EMA update, and the progress bar's read of the loss
means.

The tests import count_host_syncs from here (library code does not carry test tools).
"""

import argparse
import collections
import contextlib
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops (overload packets) that wait for the GPU whatever their arguments: a scalar read, an output whose
# size depends on the data, or (bincount, equal, torchvision's nms) a read inside the CUDA kernel itself.
ALWAYS = {
    "_local_scalar_dense",  # .item(), bool(), int(), float(), `if tensor:`
    "nonzero",  # also torch.where(mask), argwhere
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "bincount",  # its CUDA kernel reads min and max to size the output
    "equal",
    "nms",  # torchvision::nms copies its keep-mask to the host
}
INDEX_PUTS = {"index_put", "index_put_", "_index_put_impl", "_index_put_impl_"}
COPIES = {"_to_copy", "copy_"}


def _is_cuda(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _has_mask_index(indices):
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def sync_op(func, args, kwargs):
    """The name under which this dispatched op is counted, or None when it does not wait for the GPU."""
    name = func.overloadpacket.__name__
    if name in ALWAYS:
        return f"aten.{name}"
    if name == "index" and _has_mask_index(args[1]):
        return "aten.index (bool mask)"
    if name in INDEX_PUTS and _has_mask_index(args[1]):
        values, accumulate = args[2], (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
        # x[mask] = scalar becomes masked_fill with a host value: no wait
        if accumulate or values.numel() != 1 or values.device.type != "cpu":
            return f"aten.{name} (bool mask)"
    if name == "repeat_interleave" and kwargs.get("output_size", args[3] if len(args) > 3 else None) is None:
        if len(args) == 1 or isinstance(args[1], torch.Tensor):  # repeats as a tensor: the output size is read
            return "aten.repeat_interleave"
    if name in COPIES:
        source, destination = (args[0], kwargs.get("device")) if name == "_to_copy" else (args[1], args[0].device)
        destination = torch.device(destination) if destination is not None else source.device
        non_blocking = kwargs.get("non_blocking", args[2] if name == "copy_" and len(args) > 2 else False)
        if source.device.type == "cuda" and destination.type == "cpu":
            return f"aten.{name} (cuda->cpu)"
        # cpu->cuda without non_blocking: torch waits for the stream after the copy (memcpy_and_sync)
        if source.device.type == "cpu" and destination.type == "cuda" and not non_blocking:
            return f"aten.{name} (cpu->cuda, blocking)"
    return None


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, counts, cuda_only):
        super().__init__()
        self.counts, self.cuda_only = counts, cuda_only

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = sync_op(func, args, kwargs)
        if name is not None and (not self.cuda_only or "cuda" in name or _touches_cuda(args, kwargs)):
            self.counts[name] += 1
        return func(*args, **kwargs)


class _HostReadCounter(TorchFunctionMode):
    """Tensor.tolist() and .cpu() of a CPU tensor dispatch nothing (a CUDA one dispatches the copy counted
    above): seen here, where a CPU tensor stands for a CUDA one."""

    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.tolist, torch.Tensor.cpu) and args[0].device.type == "cpu":
            self.counts[f"Tensor.{func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _touches_cuda(args, kwargs):
    flat = [*args, *kwargs.values()]
    return any(_is_cuda(t) or (isinstance(t, (list, tuple)) and any(_is_cuda(x) for x in t)) for t in flat)


@contextlib.contextmanager
def count_host_syncs(cuda_only=False):
    """`with count_host_syncs() as counts: ...`: counts is a collections.Counter of op name -> how many
    times an op that makes the host wait for the GPU ran inside the block (sum(counts.values()): the total).

    cuda_only=False (CPU runs): every tensor stands for a CUDA one, so the ops are counted whatever their
    device, CPU work on host-resident data included. cuda_only=True (on a GPU): only ops on CUDA tensors.
    The backward pass is seen too. Not seen: .numpy() and .to("cpu") of a CPU tensor.
    """
    counts = collections.Counter()
    with _DispatchCounter(counts, cuda_only), contextlib.nullcontext() if cuda_only else _HostReadCounter(counts):
        yield counts


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="n")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--boxes", type=int, default=10, help="per image, on average")
    parser.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off", help="fp16: with loss scaling")
    parser.add_argument("--steps", type=int, default=2, help="counted, after one warm-up step")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args()


def synthetic_batch(args, on_gpu):
    """(images, targets) of --batch images with about --boxes random boxes each."""
    # a batch as the loader gives it (pinned on a GPU machine): uint8 images, targets on the host
    images = torch.randint(0, 256, (args.batch, 3, args.imgsz, args.imgsz), dtype=torch.uint8)
    per_image = torch.randint(args.boxes // 2, args.boxes * 3 // 2 + 1, (args.batch,))
    image_index = torch.repeat_interleave(torch.arange(args.batch), per_image)[:, None]
    xy = torch.rand(len(image_index), 2) * args.imgsz * 0.8
    wh = 8 + torch.rand(len(image_index), 2) * args.imgsz * 0.2
    classes = torch.randint(0, 80, (len(image_index), 1))
    targets = torch.cat((image_index, classes, xy, xy + wh), 1).float()
    if on_gpu:
        images, targets = images.pin_memory(), targets.pin_memory()
    return images, targets


def make_step(args, device):
    """train.py's training step on one synthetic batch: (step, pieces, boxes in the batch); step(count=True) adds
    the host syncs of each piece of the step to pieces[name], step(count=False) only runs it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.yolo import YOLO, assignment_of
    from utils.ema import ModelEMA
    from utils.loss import DetectionLoss
    from utils.optim import build_optimizer, optimizer_step

    on_gpu = device.type == "cuda"
    amp_dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    torch.manual_seed(0)
    model = YOLO(args.model, nc=80).to(device, memory_format=torch.channels_last).train()
    loss_fn = DetectionLoss(model.head, assignment=assignment_of(model.scale))
    optimizer = build_optimizer(model, "sgd", 0.01, 0.937, 5e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    ema = ModelEMA(model)
    images, targets = synthetic_batch(args, on_gpu)
    sums = torch.zeros(3, device=device)
    pieces = {}

    def step(count):
        def piece(name):
            if not count:
                return contextlib.nullcontext()
            pieces.setdefault(name, collections.Counter())
            return _into(pieces[name], cuda_only=on_gpu)

        with piece("images to the device"):
            x = images.to(device, non_blocking=True).float().div_(255).contiguous(memory_format=torch.channels_last)
        with piece("forward"), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            maps = model(x)
        with piece("loss (assignment included)"):
            loss, parts = loss_fn(maps, targets)
        with piece("backward"):
            scaler.scale(loss).backward()
            sums.add_(parts)
        with piece("clip + isfinite + step"):
            stepped = optimizer_step(model, optimizer, scaler, 10.0)
        with piece("EMA update"):
            if stepped:
                ema.update(model)
        with piece("progress bar (train.py)"):
            sums.tolist()

    return step, pieces, len(targets)


def print_counts(args, device, pieces, boxes):
    """The table: syncs per step of each piece, by op, and the total."""
    on_gpu = device.type == "cuda"
    where = f"on {device}" if on_gpu else "on the CPU, every tensor counted as if it were on a GPU"
    print(f"{args.model} model, {args.imgsz} px, batch {args.batch}, {boxes} boxes, amp {args.amp}, {where}")
    print(f"{'piece':<28} {'syncs/step':>10}  by op")
    for name, c in pieces.items():
        ops = ", ".join(f"{op} {n / args.steps:g}" for op, n in sorted(c.items())) or "-"
        print(f"{name:<28} {sum(c.values()) / args.steps:>10g}  {ops}")
    print(f"{'total':<28} {sum(sum(c.values()) for c in pieces.values()) / args.steps:>10g}")
    if not on_gpu:
        print(
            "(the loss's scalar read is the largest box count of the targets, which train.py keeps on the host: "
            "no sync on a GPU)"
        )


def main():
    args = parse_args()
    device = torch.device("cpu" if args.device == "cpu" else f"cuda:{args.device}")
    step, pieces, boxes = make_step(args, device)
    step(count=False)
    for _ in range(args.steps):
        step(count=True)
    print_counts(args, device, pieces, boxes)


@contextlib.contextmanager
def _into(counter, cuda_only):
    with count_host_syncs(cuda_only) as counts:
        yield
    counter.update(counts)


if __name__ == "__main__":
    main()
