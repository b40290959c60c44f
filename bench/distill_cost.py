"""What --teacher costs a training step: the n student's step (forward, loss, backward, AdamW) alone, and with the
teacher's forward and the distillation term, the teacher in fp32 and in bf16 (what train.py picks on a CPU that
computes bf16 itself, utils/distributed.teacher_dtype_for). The batch is made once and kept, so that the data
loader, which shares the cores, does not move the figures; the three kinds of step alternate.

    python bench/distill_cost.py --teacher bccd_s_teacher.pt --imgsz 320 --batch 16 --steps 10
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models.teacher import load_teacher  # noqa: E402
from models.weights import load_weights  # noqa: E402
from models.yolo import YOLO, assignment_of  # noqa: E402
from utils.loss import DetectionLoss  # noqa: E402


def batch(n, imgsz, boxes_per_image=8):
    """Random images and boxes (image index, class 0, xyxy in pixels) of a plausible size."""
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(n, 3, imgsz, imgsz, generator=gen).contiguous(memory_format=torch.channels_last)
    corner = torch.rand(n * boxes_per_image, 2, generator=gen) * imgsz * 0.7
    size = 16 + torch.rand(n * boxes_per_image, 2, generator=gen) * imgsz * 0.25
    index = torch.arange(n).repeat_interleave(boxes_per_image)[:, None].float()
    return images, torch.cat((index, torch.zeros_like(index), corner, corner + size), 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="a trained .pt (ours or Ultralytics'), s for the issue's aim")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each kind, after 2 untimed ones")
    args = parser.parse_args()
    device = torch.device("cpu")
    names = load_weights(args.teacher, build=False).checkpoint["names"]
    student = YOLO("n", len(names)).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)
    loss_fn = DetectionLoss(student.head, distill_gain=0.5, assignment=assignment_of(student.scale))
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    teachers = {
        name: load_teacher(args.teacher, names, args.imgsz, device, dtype)[0].to(memory_format=torch.channels_last)
        for name, dtype in dtypes.items()
    }
    images, targets = batch(args.batch, args.imgsz)

    def step(teacher_name):
        start = time.perf_counter()
        maps = student(images)
        teacher_maps = None
        if teacher_name:
            with torch.no_grad():
                teacher_maps = teachers[teacher_name](images.to(dtypes[teacher_name]), mode="maps")
        loss, _ = loss_fn(maps, targets, teacher_maps)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    kinds = (None, "fp32", "bf16")
    times = {kind: [] for kind in kinds}
    for i in range(args.steps + 2):
        for kind in kinds:
            seconds = step(kind)
            if i >= 2:
                times[kind].append(seconds)
    alone = statistics.median(times[None])
    print(f"n student, {Path(args.teacher).name} teacher, batch {args.batch}, {args.imgsz} px, median of {args.steps}")
    for kind in kinds:
        ms = statistics.median(times[kind])
        label = f"with the teacher in {kind}" if kind else "without a teacher"
        print(f"  {label:28s} {ms * 1000:7.0f} ms per step  {ms / alone:.2f}x")


if __name__ == "__main__":
    main()
