"""The detector: a CSP backbone with SPPF, a PAN neck and an anchor-free decoupled head (with DFL, or YOLO26's
without DFL and with a one-to-one branch that needs no NMS).

Written as plain modules, top to bottom, so that changing the network means editing this file (how the layers
connect, their widths and depths), models/blocks.py (the blocks: Conv, C2f, C3k2, C2PSA, SPPF) or models/head.py
(the Detect head and its decoding): no model yaml, no registry. `YOLO(scale="n", nc=80)` builds one of the sizes.
Loading weights files into it: models/weights.py.

Input: RGB, float, 0..1, shape (batch, 3, H, W) with H and W multiples of 32.
Output in training: the raw maps of the three levels (what the loss needs).
Output in eval:     (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then class scores in 0..1;
                    YOLO26 (model.end2end): (batch, 300, 6) = x1 y1 x2 y2 score class, final, best first (no NMS).
"""

import contextlib
import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from models.blocks import C2PSA, SPPF, C2f, C3k2, Conv
from models.head import Detect
from utils.assigner import E2E_ASSIGNMENT, DualAssignment

# model name: (depth multiple, width multiple, max channels), the values users of Ultralytics know.
# n..x are YOLOv8 (this repo's models since its start), 11n..11x are YOLO11, 26n..26x are YOLO26.
SCALES = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
    "11n": (0.50, 0.25, 1024),
    "11s": (0.50, 0.50, 1024),
    "11m": (0.50, 1.00, 512),
    "11l": (1.00, 1.00, 512),
    "11x": (1.00, 1.50, 512),
    "26n": (0.50, 0.25, 1024),
    "26s": (0.50, 0.50, 1024),
    "26m": (0.50, 1.00, 512),
    "26l": (1.00, 1.00, 512),
    "26x": (1.00, 1.50, 512),
}


# NMS-free YOLO11 (docs/yolo26.md): YOLO11n's network under YOLO26's two heads, each with a DFL box branch of 32
# channels (half 11n's); the one-to-one loss trains the network too, and picks each object's positive on the one level
# its size picks, led by the score (assignment_of). Name: the network it keeps.
E2E = {"11n-e2e": "11n"}
RENAMED = {"11n-d32-stable": "11n-e2e"}  # checkpoints written under an earlier name
MODELS = [*SCALES, *E2E]  # every name --model takes


def assignment_of(scale):
    """The rule by which the loss picks the one-to-one branch's positives when the model `scale` trains."""
    return E2E_ASSIGNMENT if RENAMED.get(scale, scale) in E2E else DualAssignment()


@contextlib.contextmanager
def frozen_bn_statistics(module):
    """Inside: the BatchNorm layers of `module` normalise as in training (with the batch's statistics) but update
    copies of their running statistics and batch count, which are dropped on the way out."""
    # _BatchNorm: SyncBatchNorm too (--sync-bn), which is no BatchNorm2d
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    kept = [(m.running_mean, m.running_var, m.num_batches_tracked) for m in layers]
    # Copies, not track_running_stats=False or momentum 0: the recompute must call batch_norm exactly as the first
    # forward did (checkpoint checks that it saves the same tensors), and momentum 0 would still count the batch.
    for m, buffers in zip(layers, kept):
        m.running_mean, m.running_var, m.num_batches_tracked = (t.clone() for t in buffers)
    try:
        yield
    finally:
        for m, (mean, var, count) in zip(layers, kept):
            m.running_mean, m.running_var, m.num_batches_tracked = mean, var, count


def _width(c, width, max_channels):
    return int(math.ceil(min(c, max_channels) * width / 8) * 8)


class YOLO(nn.Module):
    """YOLOv8 (scales n..x), YOLO11 (11n..11x), YOLO26 (26n..26x) or 11n-e2e. Layer sizes follow the usual tables:
    widths 64..1024 times the scale's width multiple (capped), repeats times its depth multiple. The families
    share one layout (backbone, SPPF, FPN top-down, PAN bottom-up, head) and one forward; YOLO11 swaps C2f for
    C3k2, adds the C2PSA attention stage after SPPF and widens the backbone's P2/P3 outputs; YOLO26 changes
    YOLO11 as said where it is built, and its eval output is final detections, not per-anchor predictions.
    cls_width: see Detect; fine-tuning keeps the width of the weights it starts from (class_width), so that a
    checkpoint with another class count transfers all but the last class convolutions.
    reg_max: the box branch's bins per side; 0 = the family's (16, DFL, for v8 and 11; 1, no DFL, for 26). Another
    value is for the ablation (train.py --reg-max: YOLO11 without DFL); checkpoints carry it in their weights."""

    def __init__(self, scale="n", nc=80, checkpoint_activations=False, cls_width=0, reg_max=0):
        super().__init__()
        scale = RENAMED.get(scale, scale)
        if scale not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {scale!r}")
        self.scale, self.nc = scale, nc
        e2e = scale in E2E
        end2end = e2e or scale.startswith("26")  # the one-to-one head (NMS-free)
        scale = E2E.get(scale, scale)
        depth, width, max_ch = SCALES[scale]
        # Recompute activations in backward instead of storing them (pitfall E2: spend compute to save memory).
        self.checkpoint_activations = checkpoint_activations
        c1, c2, c3, c4, c5 = (_width(c, width, max_ch) for c in (64, 128, 256, 512, 1024))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        if scale[:2] in ("11", "26"):
            # YOLO26 is YOLO11 with: deep (C3k) blocks in the whole neck at every scale, a residual SPPF, attention
            # in the last neck block, and a head without DFL that adds the one-to-one (NMS-free) branch.
            yolo26 = scale.startswith("26")
            n2 = max(round(2 * depth), 1)
            deep = scale[-1] in "mlx"  # m, l, x: C3k inner blocks in every C3k2
            deep_neck = deep or yolo26
            # backbone
            self.stem = Conv(3, c1, 3, 2)  # P1/2
            self.down2, self.stage2 = Conv(c1, c2, 3, 2), C3k2(c2, c3, n2, deep, 0.25)  # P2/4
            self.down3, self.stage3 = Conv(c3, c3, 3, 2), C3k2(c3, c4, n2, deep, 0.25)  # P3/8
            self.down4, self.stage4 = Conv(c4, c4, 3, 2), C3k2(c4, c4, n2, True)  # P4/16
            self.down5, self.stage5 = Conv(c4, c5, 3, 2), C3k2(c5, c5, n2, True)  # P5/32
            self.sppf, self.psa = SPPF(c5, c5, residual=yolo26), C2PSA(c5, n2)
            # neck
            self.top4 = C3k2(c5 + c4, c4, n2, deep_neck)
            self.top3 = C3k2(c4 + c4, c3, n2, deep_neck)
            self.down_p3, self.bottom4 = Conv(c3, c3, 3, 2), C3k2(c3 + c4, c4, n2, deep_neck)
            self.down_p4 = Conv(c4, c4, 3, 2)
            self.bottom5 = C3k2(c4 + c5, c5, 1, True, attention=True) if yolo26 else C3k2(c4 + c5, c5, n2, True)
            reg_max = reg_max or (1 if yolo26 else 16)
            self.head = Detect(nc, (c3, c4, c5), reg_max, True, cls_width, end2end, box_width=32 if e2e else 0)
            if e2e:
                self.head.detach_one2one = False
        else:
            n3, n6 = max(round(3 * depth), 1), max(round(6 * depth), 1)
            # backbone
            self.stem = Conv(3, c1, 3, 2)  # P1/2
            self.down2, self.stage2 = Conv(c1, c2, 3, 2), C2f(c2, c2, n3, True)  # P2/4
            self.down3, self.stage3 = Conv(c2, c3, 3, 2), C2f(c3, c3, n6, True)  # P3/8
            self.down4, self.stage4 = Conv(c3, c4, 3, 2), C2f(c4, c4, n6, True)  # P4/16
            self.down5, self.stage5 = Conv(c4, c5, 3, 2), C2f(c5, c5, n3, True)  # P5/32
            self.sppf, self.psa = SPPF(c5, c5), nn.Identity()
            # neck: top-down (FPN), then bottom-up (PAN)
            self.top4 = C2f(c5 + c4, c4, n3)
            self.top3 = C2f(c4 + c3, c3, n3)
            self.down_p3, self.bottom4 = Conv(c3, c3, 3, 2), C2f(c3 + c4, c4, n3)
            self.down_p4, self.bottom5 = Conv(c4, c4, 3, 2), C2f(c4 + c5, c5, n3)
            self.head = Detect(nc, (c3, c4, c5), reg_max or 16, cls_width=cls_width)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-3, 0.03

    @property
    def end2end(self):
        """YOLO26: eval returns, unless a mode says otherwise, the final detections (batch, max_det, 6) of the
        one-to-one head; nothing downstream runs NMS on them (val.py, detect.py, export.py ask this attribute,
        exported files their metadata). mode "per_anchor" (Detect.forward) answers for NMS instead."""
        return self.head.one_to_one

    def _run(self, block, x):
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            # The backward pass runs the block's forward again: without the frozen statistics its BatchNorm
            # layers would update their running mean and variance a second time per step (twice the momentum).
            contexts = lambda: (contextlib.nullcontext(), frozen_bn_statistics(block))  # noqa: E731
            return checkpoint(block, x, use_reentrant=False, context_fn=contexts)
        return block(x)

    def forward(self, x, mode=None):
        """mode: what the head answers (Detect.forward: maps, end2end, per_anchor; None: training's or eval's own)."""
        run = self._run
        x = self.stem(x)
        x = run(self.stage2, self.down2(x))
        p3 = run(self.stage3, self.down3(x))
        p4 = run(self.stage4, self.down4(p3))
        p5 = run(self.psa, self.sppf(run(self.stage5, self.down5(p4))))
        t4 = run(self.top4, torch.cat((self.up(p5), p4), 1))
        t3 = run(self.top3, torch.cat((self.up(t4), p3), 1))
        b4 = run(self.bottom4, torch.cat((self.down_p3(t3), t4), 1))
        b5 = run(self.bottom5, torch.cat((self.down_p4(b4), p5), 1))
        return self.head([t3, b4, b5], mode)

    @torch.no_grad()
    def fuse(self):
        """Fold every BatchNorm into its conv (inference and export only). Returns self."""
        self.eval()
        for m in self.modules():
            if isinstance(m, Conv) and isinstance(m.bn, nn.BatchNorm2d):
                m.fuse()
        return self


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def count_gflops(model, imgsz=640):
    """GFLOPs of one forward pass at imgsz x imgsz (multiply-add = 2 FLOPs, as thop-based tables report)."""
    from torch.utils.flop_counter import FlopCounterMode

    p = next(model.parameters())
    x = torch.zeros(1, 3, imgsz, imgsz, device=p.device, dtype=p.dtype)
    was_training = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    model.train(was_training)
    return counter.get_total_flops() / 1e9
