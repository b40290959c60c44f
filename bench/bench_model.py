"""Model figures: parameters, GFLOPs, forward and forward+backward time per image of each scale,
and the activation memory that --checkpoint-activations saves.

    python bench/bench_model.py                          # every scale at 320 and 640, batch 8, CPU
    python bench/bench_model.py --scales n s --sizes 320 --runs 5 --device 0

Times are medians over --runs after one warm-up, divided by the batch. Activation memory is the
total size of the tensors autograd saves for the backward pass (measured with saved-tensor hooks,
so it means the same on CPU and GPU); on CUDA the peak allocated memory is printed too.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.yolo import SCALES, YOLO, assignment_of, count_gflops, count_parameters  # noqa: E402
from utils.loss import DetectionLoss  # noqa: E402


def timed(fn, runs, device):
    fn()  # warm-up: allocator, kernels, caches
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def saved_activation_bytes(model, x, targets, loss_fn):
    """Bytes autograd keeps for backward during one training forward (the memory checkpointing trades)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = loss_fn(model(x), targets)
    loss.backward()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", default=list(SCALES), help="YOLOv8 n..x, YOLO11 11n..11x")
    parser.add_argument("--sizes", nargs="+", type=int, default=[320, 640])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device("cpu" if args.device == "cpu" else f"cuda:{args.device}")
    print(
        f"device {device} ({torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"batch {args.batch}, median of {args.runs}"
    )
    print(
        f"{'scale':>5} {'params M':>9} {'GFLOPs@640':>10} {'size':>5} {'fwd ms/img':>11} {'fwd+bwd ms/img':>15}"
        f" {'act MB':>8} {'act MB ckpt':>12} {'saved':>6}"
    )
    for scale in args.scales:
        model = YOLO(scale, nc=80).to(device, memory_format=torch.channels_last)  # as train.py and val.py run it
        params, gflops = count_parameters(model) / 1e6, count_gflops(model, 640)
        loss_fn = DetectionLoss(model.head, assignment=assignment_of(model.scale))
        for size in args.sizes:
            x = torch.rand(args.batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
            targets = torch.tensor(
                [[i, i % 80, 10.0 + i, 20.0, size / 2, size / 2 + i] for i in range(args.batch)], device=device
            )

            def forward():
                with torch.no_grad():
                    model.eval()(x)

            def train_step():
                model.train()
                loss, _ = loss_fn(model(x), targets)
                loss.backward()
                model.zero_grad(set_to_none=True)

            fwd = timed(forward, args.runs, device) / args.batch * 1000
            step = timed(train_step, args.runs, device) / args.batch * 1000
            model.train()
            plain = saved_activation_bytes(model, x, targets, loss_fn)
            model.checkpoint_activations = True
            ckpt = saved_activation_bytes(model, x, targets, loss_fn)
            model.checkpoint_activations = False
            model.zero_grad(set_to_none=True)
            print(
                f"{scale:>5} {params:>9.2f} {gflops:>10.1f} {size:>5} {fwd:>11.1f} {step:>15.1f}"
                f" {plain / 2**20:>8.0f} {ckpt / 2**20:>12.0f} {1 - ckpt / plain:>6.0%}"
            )
            if device.type == "cuda":
                print(f"      peak CUDA memory so far: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
