"""Inference latency of one model (n, or --model 11n ...; random init, nc=80 or --nc), batch 1, on this machine's
CPU: PyTorch (Conv+BN fused, eval), TorchScript (traced) and ONNX Runtime, at 640 and 320 px.

    python bench/bench_latency.py                                  # median of 50 runs after 5 warm-up runs
    python bench/bench_latency.py --runs 3                         # a quick smoke check (figures mean little)
    python bench/bench_latency.py --ultralytics-onnx yolov8n.onnx  # + Ultralytics YOLOv8n in ORT, timed the same way
    python bench/bench_latency.py --nc 6 --ultralytics-onnx v8n640.onnx v8n320.onnx   # one fixed-size file per size
    python bench/bench_latency.py --model 11n --nc 6 --ultralytics-onnx 11n640.onnx 11n320.onnx   # YOLO11n

Only the network is timed (no letterbox, no NMS): the input is a fixed random tensor. Random
weights run exactly as fast as trained ones. Close other programs first: on a shared CPU the
figures measure the neighbours. An Ultralytics .onnx is made with `yolo export model=yolov8n.pt
format=onnx imgsz=640` (add dynamic=True to time it at 320 too); only its latency is used, its
output layout differs from ours.
"""

import argparse
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.yolo import MODELS, YOLO  # noqa: E402
from utils.export.loaders import onnx_session  # noqa: E402
from utils.inference import median_latency  # noqa: E402


def cpu_name():
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def onnx_runner(path):
    """run(x) for an ONNX file, and the (h, w) it requires (None where the size is dynamic)."""
    session = onnx_session(path)  # subnormals flushed, as detect.py and val.py run a .onnx
    model_input = session.get_inputs()[0]
    fixed = tuple(model_input.shape[2:]) if all(isinstance(s, int) for s in model_input.shape[2:]) else None
    return (lambda x: session.run(None, {model_input.name: x.numpy()})), fixed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="n", choices=MODELS)
    parser.add_argument("--sizes", nargs="+", type=int, default=[640, 320])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = torch's default); ORT uses its own default"
    )
    parser.add_argument(
        "--ultralytics-onnx",
        nargs="*",
        default=[],
        help="Ultralytics .onnx files of the same model (fixed sizes or dynamic) to time in ORT the same way",
    )
    parser.add_argument(
        "--nc",
        type=int,
        default=80,
        help="classes of our model (match the Ultralytics file's: the head's width depends on it)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = (
        YOLO(args.model, nc=args.nc).fuse().to(memory_format=torch.channels_last)
    )  # as model_from_checkpoint returns it
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings, expected here
        theirs = [onnx_runner(p) for p in args.ultralytics_onnx]
        for size in args.sizes:
            x = torch.rand(1, 3, size, size)
            path = Path(tmp) / f"{args.model}{size}.onnx"
            torch.onnx.export(model, x, str(path), dynamo=False, opset_version=17, input_names=["images"])
            traced = torch.jit.trace(model, x)
            ours, _ = onnx_runner(path)
            row = [size] + [median_latency(run, x, args.runs, args.warmup) for run in (model, traced, ours)]
            if theirs:  # the first file that takes this size; None when no file does
                run = next((run for run, fixed in theirs if fixed in (None, (size, size))), None)
                row.append(median_latency(run, x, args.runs, args.warmup) if run else None)
            rows.append(row)

    print(
        f"{args.model} model ({args.nc} classes), batch 1, median ms of {args.runs} runs after {args.warmup} warm-up | "
        f"{cpu_name()}, {os.cpu_count()} CPUs | "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {onnxruntime.__version__}"
    )
    header = ["imgsz", "PyTorch", "TorchScript", "ONNX Runtime"] + (
        ["Ultralytics ORT"] if args.ultralytics_onnx else []
    )
    print(" | ".join(f"{h:>15}" for h in header))
    for size, *times in rows:  # None: the Ultralytics file was exported for another fixed size
        print(" | ".join([f"{size:>15}"] + [f"{'n/a':>15}" if t is None else f"{t:>15.1f}" for t in times]))


if __name__ == "__main__":
    main()
