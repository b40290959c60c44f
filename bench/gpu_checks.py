"""The checks of the GPU path that only a CUDA machine can run, in one command, with the figures printed.

    python bench/gpu_checks.py                 # all of them, on GPU 0, about 10 minutes on one H100
    python bench/gpu_checks.py --only amp oom  # some of them

- amp:        2-epoch runs on the shapes set with --amp-dtype bf16 and fp16 (mAP50-95, seconds, skipped steps)
- oom:        a run whose GPU memory is capped (torch.cuda.set_per_process_memory_fraction) so that every
              step runs out of memory (in the batch's copy or the forward): it must stop with the --batch advice,
              exit 1 and write crash/, with no traceback
- throughput: train.py --benchmark at 640 px, batch 64, AMP, with the GPU's utilisation sampled by nvidia-smi
              (near 100%: the step is the limit; well below: the loader is)
- export:     export.py --onnx --half on the fp16 run's best.pt (checked against PyTorch by export.py itself)
- tensorrt:   export.py --engine on that best.pt in fp16, INT8 (calibrated on the training images) and fp16 with a
              dynamic batch of up to 8, each built, checked against PyTorch, scored by the gate and timed; then
              --benchmark at 640 px, which adds TensorRT's rows to the table of every format

Ultralytics' side of the throughput comparison runs in its own venv (bench/peer_env.sh DIR makes it), e.g.
`YOLO_CONFIG_DIR=DIR/yolo-config DIR/bin/yolo train model=yolov8n.yaml data=<shapes yaml> imgsz=640 batch=64
amp=True epochs=1 device=0`.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OOM_WRAPPER = """
import runpy, sys, torch
torch.cuda.set_per_process_memory_fraction({fraction}, 0)
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path("train.py", run_name="__main__")
"""


def train(args, script="train.py", timeout=3000):
    start = time.time()
    result = subprocess.run(
        [sys.executable, script, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    return result, time.time() - start


def last_row(run_dir):
    lines = (Path(run_dir) / "results.csv").read_text().splitlines()
    return dict(zip(lines[0].split(","), lines[-1].split(",")))


def check_amp(out, device):
    for dtype in ("bf16", "fp16"):
        result, seconds = train(
            ["--epochs", "2", "--amp", "--amp-dtype", dtype, "--device", device, "--out", out / dtype]
        )
        row = last_row(out / dtype) if result.returncode == 0 else {}
        print(
            f"amp {dtype}: exit {result.returncode}, {seconds:.0f} s, mAP50-95 {row.get('mAP50-95')}, "
            f"skipped steps: oom {row.get('oom_skipped_steps')}, non-finite {row.get('nonfinite_skipped_steps')}"
        )
        if result.returncode:
            print(result.stdout[-2000:] + result.stderr[-2000:])


def check_oom(out, device):
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir=REPO, delete=False) as f:
        f.write(OOM_WRAPPER.format(fraction=0.02))
    try:
        result, seconds = train(
            ["--epochs", "1", "--batch", "256", "--imgsz", "640", "--device", device, "--out", out / "oom"],
            script=f.name,
        )
    finally:
        Path(f.name).unlink()
    output = result.stdout + result.stderr
    message = next((line for line in output.splitlines() if "out of memory in" in line), "(no message)")
    if "Traceback" in output:  # the run must stop with the sentence, not with a stack
        message += "\n  and a traceback:\n" + output[-1500:]
    print(
        f"forced OOM: exit {result.returncode} after {seconds:.0f} s, "
        f"crash/ written: {(out / 'oom/crash/reason.txt').exists()}\n  {message}"
    )


def check_throughput(out, device):
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(0.5):
            query = subprocess.run(
                [
                    "nvidia-smi",
                    f"--id={device}",
                    "--query-gpu=utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
            )
            if query.returncode == 0 and query.stdout.strip():
                samples.append([float(v) for v in query.stdout.split(",")])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result, _ = train(
        [
            "--benchmark",  # 3 warm-up + 12 timed iterations of 64: inside the first epoch of the 1,000 shapes images
            "12",
            "--imgsz",
            "640",
            "--batch",
            "64",
            "--amp",
            "--device",
            device,
            "--out",
            out / "throughput",
        ]
    )
    done.set()
    thread.join()
    figure = re.search(r"benchmark: .*", result.stdout)
    busy = sorted(s[0] for s in samples[len(samples) // 3 :])  # after start-up
    print(f"throughput: {figure.group(0) if figure else result.stderr[-1000:]}")
    if busy:
        print(
            f"  GPU utilisation median {busy[len(busy) // 2]:.0f}%, "
            f"memory used up to {max(s[1] for s in samples):.0f} MiB"
        )


def check_export(out, device):
    weights = out / "fp16" / "weights" / "best.pt"
    if not weights.exists():
        result, _ = train(["--epochs", "1", "--amp", "--device", device, "--out", out / "fp16"])
    result, _ = train(["--weights", weights, "--onnx", "--half", "--device", device], script="export.py")
    print(
        f"export --half: exit {result.returncode}\n"
        + "\n".join("  " + line for line in (result.stdout + result.stderr).strip().splitlines()[-6:])
    )


def check_tensorrt(out, device):
    weights = out / "fp16" / "weights" / "best.pt"
    if not weights.exists():
        train(["--epochs", "1", "--amp", "--device", device, "--out", out / "fp16"])
    for flags in (["--half"], ["--int8"], ["--half", "--dynamic", "--batch", "8"], ["--benchmark", "--imgsz", "640"]):
        engine = [] if "--benchmark" in flags else ["--engine", "--workspace", "4"]
        result, seconds = train(["--weights", weights, *engine, *flags, "--device", device], script="export.py")
        lines = (result.stdout + result.stderr).strip().splitlines()
        kept = [line for line in lines if "engine" in line or "error" in line or "TensorRT" in line]
        print(f"export.py {' '.join(engine + flags)}: exit {result.returncode}, {seconds:.0f} s")
        print("\n".join("  " + line for line in (kept if "--benchmark" not in flags else lines[-16:])))


CHECKS = {
    "amp": check_amp,
    "oom": check_oom,
    "throughput": check_throughput,
    "export": check_export,
    "tensorrt": check_tensorrt,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="0")
    parser.add_argument("--out", default="runs/gpu_checks")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    args = parser.parse_args()
    out = (REPO / args.out).resolve()
    for name in args.only:
        CHECKS[name](out, args.device)
