"""What export.py's writers (utils/export/*.py) read of its flags: one object, made once the flags are parsed and the
checkpoint is read, and never changed after."""

from typing import NamedTuple


class ExportOptions(NamedTuple):
    """opset: ONNX's; dynamic: batch, height and width chosen at run time; batch: the traced batch (--engine: the
    largest of a dynamic one); nms: NMS inside the graph (writers.ModelWithNMS) with conf, iou and max_det;
    end2end: the graph's output is the one-to-one head's final detections (YOLO26 without --nms); simplify: simplify
    the ONNX graph; workspace: --engine's builder memory in GiB (0: TensorRT's own)."""

    opset: int = 17
    dynamic: bool = False
    batch: int = 1
    nms: bool = False
    conf: float = 0.25
    iou: float = 0.7
    max_det: int = 300
    end2end: bool = False
    simplify: bool = False
    workspace: float = 0

    @classmethod
    def of(cls, args, end2end):
        """From export.py's parsed flags; end2end: the network's eval answer is final detections (YOLO26), whose
        one-to-many head and NMS are exported instead with --nms."""
        flags = {name: getattr(args, name) for name in cls._fields if name != "end2end"}
        return cls(**flags, end2end=end2end and not args.nms)

    @property
    def mode(self):
        """The mode the traced network answers in (models/head.py Detect.forward)."""
        return "end2end" if self.end2end else "per_anchor"
