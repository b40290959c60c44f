"""The detector: a CSP backbone with SPPF, a PAN neck and an anchor-free decoupled head with DFL.

Written as plain modules, top to bottom, so that changing the network means editing this file:
no model yaml, no registry. `YOLO(scale="n", nc=80)` builds one of the five sizes.

Input: RGB, float, 0..1, shape (batch, 3, H, W) with H and W multiples of 32.
Output in training: the raw maps of the three levels (what the loss needs).
Output in eval:     (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then class scores in 0..1.
"""

import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from utils.boxes import dfl_decode, distances_to_boxes, make_anchors
from utils.checkpoint import FORMAT, CheckpointError, load_checkpoint

# scale: (depth multiple, width multiple, max channels), the values users of YOLOv8 know.
SCALES = {
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.25, 512),
}
STRIDES = (8, 16, 32)


class Conv(nn.Module):
    """Conv2d + BatchNorm + SiLU. `fuse()` folds the BN into the conv for inference."""

    def __init__(self, c_in, c_out, k=1, s=1, groups=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))

    def fuse(self):
        # Folding is only valid with frozen statistics, i.e. eval mode
        # (pitfall M1: BatchNorm behaves differently in train and eval).
        self.conv = torch.nn.utils.fusion.fuse_conv_bn_eval(self.conv.eval(), self.bn.eval())
        self.bn = nn.Identity()


class Bottleneck(nn.Module):
    def __init__(self, c_in, c_out, shortcut=True, expansion=1.0):
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 3)
        self.cv2 = Conv(hidden, c_out, 3)
        self.add = shortcut and c_in == c_out

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block: split, run n bottlenecks on one half, concatenate every intermediate output."""

    def __init__(self, c_in, c_out, n=1, shortcut=False):
        super().__init__()
        self.hidden = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden, self.hidden, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools see 5, 9 and 13 pixel windows."""

    def __init__(self, c_in, c_out, k=5):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    """Decoupled head: per level, one branch predicts box side distances as distributions over
    `reg_max` bins (DFL), the other class logits. Anchor-free: one prediction per grid cell."""

    def __init__(self, nc, channels, reg_max=16):
        super().__init__()
        self.nc, self.reg_max = nc, reg_max
        self.strides = STRIDES
        box_hidden = max(16, channels[0] // 4, reg_max * 4)
        cls_hidden = max(channels[0], min(nc, 100))
        self.box = nn.ModuleList(
            nn.Sequential(
                Conv(c, box_hidden, 3), Conv(box_hidden, box_hidden, 3), nn.Conv2d(box_hidden, 4 * reg_max, 1)
            )
            for c in channels
        )
        self.cls = nn.ModuleList(
            nn.Sequential(Conv(c, cls_hidden, 3), Conv(cls_hidden, cls_hidden, 3), nn.Conv2d(cls_hidden, nc, 1))
            for c in channels
        )
        self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32), persistent=False)
        self.init_biases()

    def init_biases(self, imgsz=640):
        # Start with a low object prior (~5 objects per image) so early class loss is not swamped by negatives.
        for box, cls, s in zip(self.box, self.cls, self.strides):
            nn.init.constant_(box[-1].bias, 1.0)
            nn.init.constant_(cls[-1].bias, math.log(5 / self.nc / (imgsz / s) ** 2))

    def forward(self, feats):
        maps = [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, self.box, self.cls)]
        if self.training:
            return maps
        return self.decode(maps)

    def decode(self, maps):
        """Raw maps -> (batch, anchors, 4 + nc): xyxy boxes in input pixels and class probabilities."""
        anchors, strides = make_anchors(maps, self.strides)
        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2)  # batch, anchors, 4*reg_max + nc
        distri, logits = flat.split((4 * self.reg_max, self.nc), 2)
        boxes = distances_to_boxes(dfl_decode(distri, self.bins), anchors) * strides
        return torch.cat((boxes, logits.sigmoid()), 2)


def _width(c, width, max_channels):
    return int(math.ceil(min(c, max_channels) * width / 8) * 8)


class YOLO(nn.Module):
    """YOLOv8-style network. Layer sizes follow the usual table: widths 64..1024 times the scale's
    width multiple (capped), repeats 3/6/6/3 times its depth multiple."""

    def __init__(self, scale="n", nc=80, checkpoint_activations=False):
        super().__init__()
        if scale not in SCALES:
            raise ValueError(f"model scale must be one of {', '.join(SCALES)}, got {scale!r}")
        depth, width, max_ch = SCALES[scale]
        self.scale, self.nc = scale, nc
        # Recompute activations in backward instead of storing them (pitfall E2: spend compute to save memory).
        self.checkpoint_activations = checkpoint_activations
        c1, c2, c3, c4, c5 = (_width(c, width, max_ch) for c in (64, 128, 256, 512, 1024))
        n3, n6 = max(round(3 * depth), 1), max(round(6 * depth), 1)
        # backbone
        self.stem = Conv(3, c1, 3, 2)  # P1/2
        self.down2, self.stage2 = Conv(c1, c2, 3, 2), C2f(c2, c2, n3, True)  # P2/4
        self.down3, self.stage3 = Conv(c2, c3, 3, 2), C2f(c3, c3, n6, True)  # P3/8
        self.down4, self.stage4 = Conv(c3, c4, 3, 2), C2f(c4, c4, n6, True)  # P4/16
        self.down5, self.stage5 = Conv(c4, c5, 3, 2), C2f(c5, c5, n3, True)  # P5/32
        self.sppf = SPPF(c5, c5)
        # neck: top-down (FPN), then bottom-up (PAN)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.top4 = C2f(c5 + c4, c4, n3)
        self.top3 = C2f(c4 + c3, c3, n3)
        self.down_p3 = Conv(c3, c3, 3, 2)
        self.bottom4 = C2f(c3 + c4, c4, n3)
        self.down_p4 = Conv(c4, c4, 3, 2)
        self.bottom5 = C2f(c4 + c5, c5, n3)
        self.head = Detect(nc, (c3, c4, c5))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-3, 0.03

    def _run(self, block, x):
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def forward(self, x):
        run = self._run
        x = self.stem(x)
        x = run(self.stage2, self.down2(x))
        p3 = run(self.stage3, self.down3(x))
        p4 = run(self.stage4, self.down4(p3))
        p5 = self.sppf(run(self.stage5, self.down5(p4)))
        t4 = run(self.top4, torch.cat((self.up(p5), p4), 1))
        t3 = run(self.top3, torch.cat((self.up(t4), p3), 1))
        b4 = run(self.bottom4, torch.cat((self.down_p3(t3), t4), 1))
        b5 = run(self.bottom5, torch.cat((self.down_p4(b4), p5), 1))
        return self.head([t3, b4, b5])

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


def model_from_checkpoint(ckpt, source=""):
    """Rebuild the network from a checkpoint (a dict or a path), with the EMA weights when it has
    them (last.pt), else its only weights (best.pt holds EMA weights). Returned in eval mode and in
    channels_last layout (10-20% faster convolutions on CPU and CUDA), with `names` and `imgsz`
    attached. A checkpoint that cannot be built: CheckpointError, one sentence."""
    if not isinstance(ckpt, dict):
        ckpt, source = load_checkpoint(ckpt), ckpt
    try:
        model = YOLO(ckpt["scale"], ckpt["nc"])
        model.load_state_dict(ckpt["ema"] if "ema" in ckpt else ckpt["model"])
        model.names, model.imgsz = ckpt["names"], ckpt["imgsz"]
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(
            f"{source or 'the checkpoint'} has the '{FORMAT}' tag but holds no model this code can build "
            f"({type(e).__name__}: {detail})"
        ) from None
    return model.eval().to(memory_format=torch.channels_last)


def load_model(weights):
    """What detect.py and export.py run: a .pt checkpoint -> (the model of model_from_checkpoint with
    Conv+BN fused, the checkpoint's training args or {}). Fusing keeps the output; it makes inference
    faster and leaves no training-only parts in an exported graph. A file that is not one of our
    checkpoints: CheckpointError, one sentence."""
    ckpt = load_checkpoint(weights)
    return model_from_checkpoint(ckpt, weights).fuse(), ckpt.get("args") or {}
