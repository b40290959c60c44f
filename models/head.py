"""The detection head: per level, a box branch and a class branch (Detect), and the decoding of their maps into
boxes in input pixels and class scores; YOLO26's one-to-one copy of both branches answers without NMS."""

import copy
import math

import torch
import torch.nn as nn

from models.blocks import Conv
from utils.boxes import dfl_decode, distances_to_boxes, make_anchors, top_detections, top_pairs

STRIDES = (8, 16, 32)


def branch(c, hidden, out, light):
    """One level's branch of the head: two 3x3 convs of `hidden` channels, then a 1x1 to `out` outputs; light: each
    3x3 is depthwise and followed by a 1x1 (YOLO11's class branch), an eighth of the multiply-adds at 64 channels."""
    if light:
        return nn.Sequential(
            nn.Sequential(Conv(c, c, 3, groups=c), Conv(c, hidden, 1)),
            nn.Sequential(Conv(hidden, hidden, 3, groups=hidden), Conv(hidden, hidden, 1)),
            nn.Conv2d(hidden, out, 1),
        )
    return nn.Sequential(Conv(c, hidden, 3), Conv(hidden, hidden, 3), nn.Conv2d(hidden, out, 1))


class Detect(nn.Module):
    """Decoupled head: per level, one branch predicts box side distances as distributions over
    `reg_max` bins (DFL), the other class logits. Anchor-free: one prediction per grid cell.
    light_cls (YOLO11): the class branch's 3x3 convs are depthwise, each followed by a 1x1.
    cls_width: the class branch's width; 0 = the usual rule, which grows it with the class count up to 100.
    box_width: the box branch's width; 0 = the usual rule (16 for n at reg_max 1, 64 with DFL's 16 bins; 11n-e2e: 32).
    reg_max=1 (YOLO26): no DFL, the box branch predicts the 4 distances directly.
    end2end (YOLO26, 11n-e2e): a second copy of both branches, the one-to-one head, trained with one positive anchor
    per object on features detached from the network (so its loss does not reshape them; see detach_one2one); in eval
    it alone answers, and its top max_det (anchor, class) scores are the final detections: no NMS. forward's mode
    "per_anchor" makes eval answer with the one-to-many branch instead, for NMS (val.py / detect.py --nms).
    """

    max_det = 300  # end2end: detections per image
    # YOLO26 / YOLOv10: the one-to-one head learns on detached features, so that its one-positive-per-object loss
    # does not reshape the network the one-to-many head trains. False (11n-e2e): its gradient reaches the network too.
    detach_one2one = True

    def __init__(self, nc, channels, reg_max=16, light_cls=False, cls_width=0, end2end=False, box_width=0):
        super().__init__()
        self.nc, self.reg_max, self.one_to_one = nc, reg_max, end2end  # one_to_one: the NMS-free branch is built
        self.strides = STRIDES
        box_hidden = box_width or max(16, channels[0] // 4, reg_max * 4)
        cls_hidden = cls_width or max(channels[0], min(nc, 100))
        self.box = nn.ModuleList(branch(c, box_hidden, 4 * reg_max, False) for c in channels)
        self.cls = nn.ModuleList(branch(c, cls_hidden, nc, light_cls) for c in channels)
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
                nn.init.constant_(box[-1].bias, 1.0 if box[-1].out_channels > 4 else 2.0)
                nn.init.constant_(cls[-1].bias, math.log(5 / self.nc / (imgsz / s) ** 2))

    def forward(self, feats, mode=None):
        """mode: "maps", the raw maps of each level (a dict of both branches' with a one-to-one head), what the loss
        takes; "end2end", the one-to-one head's final detections (batch, max_det, 6), no NMS; "per_anchor", the
        one-to-many branch decoded (batch, anchors, 4 + nc), for NMS; "one2one_per_anchor", the one-to-one head
        decoded per anchor, whose best max_det are end2end's (for runtimes without TopK); None: "maps" in training,
        else end2end with a one-to-one head and per_anchor without. Each mode runs only the branches it returns."""
        mode = mode or ("maps" if self.training else self.eval_mode)
        if mode == "maps":
            return self.maps(feats)
        if mode in ("end2end", "one2one_per_anchor"):
            if not self.one_to_one:
                raise ValueError("this model has no one-to-one head (only YOLO26 has): it always needs NMS")
            one2one = self.branch(feats, self.one2one_box, self.one2one_cls)
            return self.answer(one2one) if mode == "end2end" else self.decode(one2one)
        if mode == "per_anchor":
            return self.decode(self.branch(feats, self.box, self.cls))
        raise ValueError(f"mode must be one of maps, end2end, per_anchor, one2one_per_anchor or None, got {mode!r}")

    @property
    def eval_mode(self):
        """The mode eval answers in when none is given: end2end where there is a one-to-one head."""
        return "end2end" if self.one_to_one else "per_anchor"

    def maps(self, feats):
        """The raw maps of every branch; the one-to-one branch learns on detached features (see detach_one2one)."""
        maps = self.branch(feats, self.box, self.cls)
        if not self.one_to_one:
            return maps
        o2o_feats = [x.detach() for x in feats] if self.training and self.detach_one2one else feats
        return {"one2many": maps, "one2one": self.branch(o2o_feats, self.one2one_box, self.one2one_cls)}

    def from_maps(self, maps, mode):
        """The answer of `mode` ("end2end" or "per_anchor", see forward) from the raw maps of mode "maps", so that
        one forward gives both (the per-epoch validation loss and its detections)."""
        if mode == "end2end":
            return self.answer(maps["one2one"])
        return self.decode(maps["one2many"] if self.one_to_one else maps)

    @staticmethod
    def branch(feats, boxes, classes):
        """One copy of the head on the 3 levels: per level, the box outputs then the class logits."""
        return [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, boxes, classes)]

    # (anchors, strides) for one input size, set by fix_anchors; None: computed from the maps in each forward
    fixed_anchors = None

    def fix_anchors(self, h, w):
        """Hold the anchor grid of an h x w input as constants, for an exporter that traces at that one size
        (utils/export/writers.py, LiteRT), since a grid computed in the graph slows that file
        (bench/RESULTS.md#export-formats). make_anchors reads only the maps' sizes."""
        sizes = [torch.empty(0, 0, h // s, w // s, device=self.bins.device) for s in self.strides]
        self.fixed_anchors = make_anchors(sizes, self.strides)

    def split(self, maps):
        """Raw maps -> anchors and strides (anchors, 2 and 1), box outputs (batch, anchors, 4 * reg_max), class
        logits (batch, anchors, nc); float32 (see decode)."""
        anchors, strides = self.fixed_anchors or make_anchors(maps, self.strides)
        flat = torch.cat([m.flatten(2) for m in maps], 2).transpose(1, 2).float()  # batch, anchors, 4*reg_max + nc
        return anchors, strides, *flat.split((4 * self.reg_max, self.nc), 2)

    def boxes(self, distri, anchors, strides):
        """Box outputs -> xyxy boxes in input pixels (DFL's expectation first, where there are bins)."""
        distances = dfl_decode(distri, self.bins) if self.reg_max > 1 else distri
        return distances_to_boxes(distances, anchors) * strides

    def decode(self, maps):
        """Raw maps -> (batch, anchors, 4 + nc): xyxy boxes in input pixels and class probabilities.
        Always float32, also for a half model (val.py --half, export.py --half) or inside autocast (the
        per-epoch metric): fp16's coarse pixel coordinates and DFL expectation move boxes enough to cross the high
        IoU thresholds of mAP50-95."""
        with torch.autocast(maps[0].device.type, enabled=False):  # autocast would run the DFL matmul in fp16
            anchors, strides, distri, logits = self.split(maps)
            return torch.cat((self.boxes(distri, anchors, strides), logits.sigmoid()), 2)

    def answer(self, maps):
        """The one-to-one head's raw maps -> its final detections (see top_detections), decoding only the boxes of
        the detections kept: top_detections(decode(maps)), without DFL's softmax over every anchor, which would cost
        an NMS-free graph with a DFL box branch more time than its convs."""
        with torch.autocast(maps[0].device.type, enabled=False):
            anchors, strides, distri, logits = self.split(maps)
            anchor, score, cls = top_pairs(logits.sigmoid(), self.max_det)
            distri = distri.gather(1, anchor.unsqueeze(-1).expand(-1, -1, distri.shape[-1]))
            boxes = self.boxes(distri, anchors[anchor], strides[anchor])
            return torch.cat((boxes, score.unsqueeze(-1), cls.unsqueeze(-1).to(boxes.dtype)), 2)

    def top_detections(self, decoded):
        """(batch, anchors, 4 + nc) decoded -> (batch, max_det, 6) x1 y1 x2 y2 score class (utils.boxes)."""
        return top_detections(decoded, self.max_det)
