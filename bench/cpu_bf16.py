"""Training step time on the CPU in fp32 and in bf16 autocast (`--amp --device cpu`), with the CPU's own bf16
instructions and without them: the figure behind train.py's warning on CPUs that emulate bf16.

    python bench/cpu_bf16.py                        # n model, 320 px, batch 8: native ISA, then AVX2 only
    python bench/cpu_bf16.py --imgsz 640 --steps 5

"Without them" runs the same steps in a child process with ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2,
so torch's and oneDNN's kernels are those an AVX2-only CPU (most laptops, many servers) runs. Both ISAs are timed
in one run, on one machine, alternating fp32 and bf16 so that a noisy neighbour weighs on both alike.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: the repo's packages


def step_times(imgsz, batch, steps):
    """Median seconds of a forward + backward + SGD step of the n model, fp32 and bf16 autocast (loss in fp32)."""
    import torch

    from models.yolo import YOLO

    torch.manual_seed(0)
    model = YOLO("n", 3).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    images = torch.rand(batch, 3, imgsz, imgsz).contiguous(memory_format=torch.channels_last)
    times = {"fp32": [], "bf16": []}
    for k in range(2 * (steps + 1)):  # alternating; the first step of each is a warm-up
        dtype = "bf16" if k % 2 else "fp32"
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            maps = model(images)
        loss = sum(m.float().square().mean() for m in maps)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if k >= 2:
            times[dtype].append(time.perf_counter() - start)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_times(args.imgsz, args.batch, args.steps)))
        return
    import torch

    from utils.distributed import cpu_has_native_bf16

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, native bf16 here: {cpu_has_native_bf16()}")
    print(f"n model, {args.imgsz} px, batch {args.batch}, median of {args.steps} steps")
    avx2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    for name, extra in (("native ISA", {}), ("AVX2 only", avx2)):
        cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
        out = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True, text=True, check=True).stdout
        t = json.loads(out.strip().splitlines()[-1])
        print(f"{name:>10}: fp32 {t['fp32']:.2f} s, bf16 {t['bf16']:.2f} s per step: bf16 / fp32 = "
              f"{t['bf16'] / t['fp32']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
