"""The detector: a CSP backbone with SPPF, a PAN neck and an anchor-free decoupled head (with DFL, or YOLO26's
without DFL and with a one-to-one branch that needs no NMS).

Written as plain modules, top to bottom, so that changing the network means editing this file:
no model yaml, no registry. `YOLO(scale="n", nc=80)` builds one of the five sizes.

Input: RGB, float, 0..1, shape (batch, 3, H, W) with H and W multiples of 32.
Output in training: the raw maps of the three levels (what the loss needs).
Output in eval:     (batch, anchors, 4 + nc) = x1 y1 x2 y2 in input pixels, then class scores in 0..1;
                    YOLO26 (model.end2end): (batch, 300, 6) = x1 y1 x2 y2 score class, final, best first (no NMS).
"""

import contextlib
import copy
import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from utils.boxes import dfl_decode, distances_to_boxes, make_anchors
from utils.checkpoint import FORMAT, CheckpointError, checkpoint_weights, load_checkpoint

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
    """Two 3x3 convs, with a residual connection when the shapes allow it."""

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

    def __init__(self, c_in, c_out, n=1, shortcut=False, expansion=0.5):
        super().__init__()
        self.hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, 2 * self.hidden, 1)
        self.cv2 = Conv((2 + n) * self.hidden, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden, self.hidden, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class C3k(nn.Module):
    """CSP block with two branches: n bottlenecks after one 1x1 projection, the other projection kept as is."""

    def __init__(self, c_in, c_out, n=2, shortcut=True):
        super().__init__()
        hidden = c_out // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(c_in, hidden, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(C2f):
    """YOLO11's C2f: each inner block is a C3k (the deep variant) or a bottleneck of half width.
    attention (YOLO26's last neck block): each inner block is that bottleneck followed by a PSA block."""

    def __init__(self, c_in, c_out, n=1, deep=False, expansion=0.5, shortcut=True, attention=False):
        super().__init__(c_in, c_out, n, shortcut, expansion)
        h = self.hidden

        def inner():
            if attention:
                return nn.Sequential(Bottleneck(h, h, shortcut, expansion=0.5), PSABlock(h, max(h // 64, 1)))
            return C3k(h, h, 2, shortcut) if deep else Bottleneck(h, h, shortcut, expansion=0.5)

        self.m = nn.ModuleList(inner() for _ in range(n))


class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with 1x1 convs as projections and a
    depthwise 3x3 on the values as position encoding. Keys are half the width of values (attn_ratio 0.5)."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.key_dim = self.head_dim // 2
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, groups=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = (
            self.qkv(x)
            .view(b, self.num_heads, 2 * self.key_dim + self.head_dim, h * w)
            .split((self.key_dim, self.key_dim, self.head_dim), 2)
        )
        attn = ((q * self.scale).transpose(-2, -1) @ k).softmax(-1)  # pixels x pixels, per head
        x = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(x)


class PSABlock(nn.Module):
    """Attention then a 1x1 feed-forward, each with a residual connection (a transformer block in convs)."""

    def __init__(self, c, num_heads):
        super().__init__()
        self.attn = Attention(c, num_heads)
        self.ffn = nn.Sequential(Conv(c, 2 * c, 1), Conv(2 * c, c, 1, act=False))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ffn(x)


class C2PSA(nn.Module):
    """YOLO11's attention stage after SPPF: split in two halves, n PSA blocks on one, concatenate."""

    def __init__(self, c, n=1):
        super().__init__()
        self.hidden = c // 2
        self.cv1 = Conv(c, 2 * self.hidden, 1)
        self.cv2 = Conv(2 * self.hidden, c, 1)
        self.m = nn.Sequential(*(PSABlock(self.hidden, max(self.hidden // 64, 1)) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.hidden, self.hidden), 1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools see 5, 9 and 13 pixel windows.
    residual (YOLO26): the first 1x1 conv is linear (no activation) and the input is added to the output."""

    def __init__(self, c_in, c_out, k=5, residual=False):
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, act=not residual)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)
        self.residual = residual and c_in == c_out

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.pool(y[-1]))
        y = self.cv2(torch.cat(y, 1))
        return x + y if self.residual else y


class Detect(nn.Module):
    """Decoupled head: per level, one branch predicts box side distances as distributions over
    `reg_max` bins (DFL), the other class logits. Anchor-free: one prediction per grid cell.
    light_cls (YOLO11): the class branch's 3x3 convs are depthwise, each followed by a 1x1.
    cls_width: the class branch's width; 0 = the usual rule, which grows it with the class count up to 100.
    reg_max=1 (YOLO26): no DFL, the box branch predicts the 4 distances directly.
    end2end (YOLO26): a second copy of both branches, the one-to-one head, trained with one positive anchor per
    object on features detached from the network (so its loss does not reshape them); in eval it alone answers,
    and its top max_det (anchor, class) scores are the final detections: no NMS. Setting `end2end = False` on such
    a head makes eval answer with the one-to-many branch instead, per anchor, for NMS (val.py / detect.py --nms).
    """

    max_det = 300  # end2end: detections per image

    def __init__(self, nc, channels, reg_max=16, light_cls=False, cls_width=0, end2end=False):
        super().__init__()
        # one_to_one: the architecture (the loss trains both branches); end2end: which one answers in eval
        self.nc, self.reg_max, self.one_to_one, self.end2end = nc, reg_max, end2end, end2end
        self.strides = STRIDES
        box_hidden = max(16, channels[0] // 4, reg_max * 4)
        cls_hidden = cls_width or max(channels[0], min(nc, 100))
        self.box = nn.ModuleList(
            nn.Sequential(
                Conv(c, box_hidden, 3), Conv(box_hidden, box_hidden, 3), nn.Conv2d(box_hidden, 4 * reg_max, 1)
            )
            for c in channels
        )
        if light_cls:
            self.cls = nn.ModuleList(
                nn.Sequential(
                    nn.Sequential(Conv(c, c, 3, groups=c), Conv(c, cls_hidden, 1)),
                    nn.Sequential(Conv(cls_hidden, cls_hidden, 3, groups=cls_hidden), Conv(cls_hidden, cls_hidden, 1)),
                    nn.Conv2d(cls_hidden, nc, 1),
                )
                for c in channels
            )
        else:
            self.cls = nn.ModuleList(
                nn.Sequential(Conv(c, cls_hidden, 3), Conv(cls_hidden, cls_hidden, 3), nn.Conv2d(cls_hidden, nc, 1))
                for c in channels
            )
        if end2end:
            self.one2one_box, self.one2one_cls = copy.deepcopy(self.box), copy.deepcopy(self.cls)
        self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32), persistent=False)
        self.init_biases()

    def init_biases(self, imgsz=640):
        # Start with a low object prior (~5 objects per image) so early class loss is not swamped by negatives.
        # Box: equal DFL logits whatever the value; without DFL, boxes 2 cells from the anchor on each side.
        branches = [(self.box, self.cls)] + ([(self.one2one_box, self.one2one_cls)] if self.one_to_one else [])
        for boxes, classes in branches:
            for box, cls, s in zip(boxes, classes, self.strides):
                nn.init.constant_(box[-1].bias, 1.0 if self.reg_max > 1 else 2.0)
                nn.init.constant_(cls[-1].bias, math.log(5 / self.nc / (imgsz / s) ** 2))

    return_maps = False  # eval mode: also return the raw maps (the per-epoch validation loss, no second forward)

    def forward(self, feats):
        both = self.training or self.return_maps  # else eval runs only the branch that answers
        maps = self.branch(feats, self.box, self.cls) if both or not self.end2end else None
        if self.one_to_one:
            detached = [x.detach() for x in feats] if self.training else feats
            one2one = self.branch(detached, self.one2one_box, self.one2one_cls) if both or self.end2end else None
            maps = {"one2many": maps, "one2one": one2one}
        if self.training:
            return maps
        if self.end2end:
            out = self.top_detections(self.decode(maps["one2one"]))
        else:
            out = self.decode(maps["one2many"] if self.one_to_one else maps)
        return (out, maps) if self.return_maps else out

    @staticmethod
    def branch(feats, boxes, classes):
        """One copy of the head on the 3 levels: per level, the box outputs then the class logits."""
        return [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, boxes, classes)]

    def decode(self, maps):
        """Raw maps -> (batch, anchors, 4 + nc): xyxy boxes in input pixels and class probabilities.
        Always float32, also for a half model (val.py --half, export.py --half) or inside autocast (the
        per-epoch metric): fp16 holds pixel coordinates above 512 only to 0.5 px (above 1024 to 1 px), and
        its DFL expectation is up to ~0.01 cell off (0.27 px at stride 32), so fp16 boxes were up to 0.5 px
        off at 640 and 0.7 px at 1280, enough to move a match across the high IoU thresholds of mAP50-95."""
        with torch.autocast(maps[0].device.type, enabled=False):  # autocast would run the DFL matmul in fp16
            anchors, strides = make_anchors(maps, self.strides)
            flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2).float()  # batch, anchors, 4*reg_max + nc
            distri, logits = flat.split((4 * self.reg_max, self.nc), 2)
            distances = dfl_decode(distri, self.bins) if self.reg_max > 1 else distri
            boxes = distances_to_boxes(distances, anchors) * strides
            return torch.cat((boxes, logits.sigmoid()), 2)

    def top_detections(self, decoded):
        """(batch, anchors, 4 + nc) -> (batch, k, 6) x1 y1 x2 y2 score class, best first, k = min(max_det, anchors):
        the k best (anchor, class) pairs among the k anchors with the best top class (as Ultralytics' end-to-end
        head, so that its checkpoints give its detections); an anchor may appear once per class."""
        boxes, scores = decoded.split((4, self.nc), 2)
        k = min(self.max_det, scores.shape[1])
        anchors = scores.amax(2).topk(k, 1).indices  # b, k
        scores = scores.gather(1, anchors.unsqueeze(-1).expand(-1, -1, self.nc))  # b, k, nc
        best, index = scores.flatten(1).topk(k, 1)  # b, k over the k x nc pairs
        boxes = boxes.gather(1, anchors.gather(1, index // self.nc).unsqueeze(-1).expand(-1, -1, 4))
        return torch.cat((boxes, best.unsqueeze(-1), (index % self.nc).unsqueeze(-1).to(boxes.dtype)), 2)


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
    """YOLOv8 (scales n..x), YOLO11 (11n..11x) or YOLO26 (26n..26x). Layer sizes follow the usual tables:
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
        if scale not in SCALES:
            raise ValueError(f"model must be one of {', '.join(SCALES)}, got {scale!r}")
        depth, width, max_ch = SCALES[scale]
        self.scale, self.nc = scale, nc
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
            self.head = Detect(nc, (c3, c4, c5), reg_max, light_cls=True, cls_width=cls_width, end2end=yolo26)
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
        """YOLO26: eval returns the final detections (batch, max_det, 6) of the one-to-one head; nothing downstream
        runs NMS on them (val.py, detect.py, export.py ask this attribute, exported files their metadata)."""
        return self.head.end2end

    @end2end.setter
    def end2end(self, value):
        # False: the one-to-many branch answers, per anchor, and NMS follows (Ultralytics' nms=None on YOLO26)
        if value and not self.head.one_to_one:
            raise ValueError("this model has no one-to-one head (only YOLO26 has): it always needs NMS")
        self.head.end2end = bool(value)

    def _run(self, block, x):
        if self.checkpoint_activations and self.training and torch.is_grad_enabled():
            # The backward pass runs the block's forward again: without the frozen statistics its BatchNorm
            # layers would update their running mean and variance a second time per step (twice the momentum).
            contexts = lambda: (contextlib.nullcontext(), frozen_bn_statistics(block))  # noqa: E731
            return checkpoint(block, x, use_reentrant=False, context_fn=contexts)
        return block(x)

    def forward(self, x):
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
        return self.head([t3, b4, b5])

    @torch.no_grad()
    def fuse(self):
        """Fold every BatchNorm into its conv (inference and export only). Returns self."""
        self.eval()
        for m in self.modules():
            if isinstance(m, Conv) and isinstance(m.bn, nn.BatchNorm2d):
                m.fuse()
        return self


def architecture(model_arg, reg_max=0, resume_ckpt=None, init_ckpt=None):
    """The network a run builds, (scale, reg_max): a resumed run's, that of the .pt given as --model, or --model
    itself with --reg-max (0: the family's)."""
    ckpt = resume_ckpt or (init_ckpt if model_arg.endswith(".pt") else None)
    if ckpt:
        return ckpt["scale"], box_bins(checkpoint_weights(ckpt))
    if model_arg not in SCALES:
        raise ValueError(f"--model {model_arg}: give one of {', '.join(SCALES)} or a .pt file")
    if reg_max < 0:
        raise ValueError(f"--reg-max {reg_max}: give 0 (the family's), 1 (no DFL) or the DFL bins per side (16)")
    return model_arg, reg_max


def class_width(weights):
    """The class branch's width in a state dict (the input width of its last conv)."""
    return weights["head.cls.0.2.weight"].shape[1]


def box_bins(weights):
    """The box branch's bins per side (reg_max) in a state dict: its last conv has 4 of them per anchor."""
    return weights["head.box.0.2.weight"].shape[0] // 4


def load_matching(model, weights):
    """Copy every tensor of `weights` whose name and shape match the model's (fine-tuning from another
    class count or model). Returns the names of the model's tensors left as they were."""
    own = model.state_dict()
    matching = {k: v for k, v in weights.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(matching, strict=False)
    return [k for k in own if k not in matching]


def initialise_from(model, ckpt, path):
    """Fine-tuning: copy the checkpoint's tensors that match (load_matching); returns the sentence that says what
    transferred and what starts fresh."""
    fresh, total = load_matching(model, checkpoint_weights(ckpt)), len(model.state_dict())
    starting_fresh = f"; starting fresh: {', '.join(fresh[:6])}{' ...' * (len(fresh) > 6)}" if fresh else ""
    return (
        f"initialised {total - len(fresh)}/{total} tensors from {path} ({ckpt.get('source', 'this repo')}, "
        f"model {ckpt['scale']}, {ckpt['nc']} classes){starting_fresh}"
    )


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
        weights = checkpoint_weights(ckpt)
        model = YOLO(ckpt["scale"], ckpt["nc"], cls_width=class_width(weights), reg_max=box_bins(weights))
        model.load_state_dict(weights)
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
