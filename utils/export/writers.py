"""How each format is written: a write function per row of the table in utils/export/formats.py, all called as
write(module, x, path, options, metadata, calibration) by export.py.

module: the fused network (or ModelWithNMS around it) in the precision to trace; x: an input of the exported size;
options: export.py's ExportOptions (utils/export/options.py); metadata: export_metadata's values,
with half and int8 set, completed here with the input and output names and shapes; calibration: for INT8, a
callable giving the calibration inputs (float32 arrays), else None. The packages a row lists are checked before its
write function runs, so these import them plainly. OpenVINO and INT8 start from an fp32 ONNX graph (export_onnx).
"""

import contextlib
import copy
import importlib.util
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch
import torchvision

from utils.disk import UNWRITABLE, is_disk_full, not_written_sentence
from utils.export.loaders import METADATA_FILE, OPENVINO_METADATA, export_metadata
from utils.locks import remove_stale_temporary_files

# Layers left in float by --int8, found by measurement (bench/int8_float_layers.py, docs/deploy.md): regular
# expressions on the ONNX node names (OpenVINO keeps them). The box decoding after the head's convolutions: DFL
# softmax and expectation, the anchor arithmetic in pixels and the concatenation of box coordinates (0..imgsz) with
# class probabilities (0..1), which in INT8 share one scale: quantized, ONNX Runtime's INT8 file scored mAP50-95 0.
# NNCF leaves these ops in float by itself; leaving the head's last convolutions in float as well gained nothing.
# YOLO26's one-to-one copies of the head's convolutions are quantized like the one-to-many ones.
KEEP_FLOAT = [r"^/head/(?!(one2one_)?(box|cls)\.)"]


class ExportError(ValueError):
    """A file that cannot be written as asked, in one sentence (export.py prints it and exits)."""


@contextlib.contextmanager
def written_at_once(path, folder=False):
    """Yields a temporary path beside `path` (same suffix: some writers pick the format by it) for a writer to fill,
    then renames it to `path`: a kill or a full disk while exporting leaves the previous file or none, never a
    half-written one that a later val.py or detect.py would load. folder: the format is a folder of files (OpenVINO:
    .xml and .bin); the whole folder is written aside, then swapped in, as is a package the writer makes a folder
    (Core ML's .mlpackage). A full disk or a folder that cannot be
    written: ExportError, one sentence with the path and the free space; the temporary file is removed."""
    path, pid = Path(path), os.getpid()
    target = path.parent if folder else path
    remove_stale_temporary_files(target.parent)  # an earlier export killed while writing left its temporary file
    temporary = target.with_name(f".{target.stem}.{pid}.tmp{target.suffix}")
    try:
        if folder:
            temporary.mkdir(parents=True)
        yield temporary / path.name if folder else temporary
        if temporary.is_dir():  # a folder (or a package, Core ML's) cannot be renamed over a full one: the old one
            # aside first, then removed
            old = target.with_name(f".{target.name}.old.{pid}.tmp")
            if target.exists():
                os.replace(target, old)
            os.replace(temporary, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, path)
    except Exception as e:
        if not (is_disk_full(e, target.parent) or (isinstance(e, OSError) and e.errno in UNWRITABLE)):
            raise
        kept = f"the previous {target.name} is intact" if target.exists() else f"there is no {target.name}"
        raise ExportError(not_written_sentence(target, e, kept)) from None
    finally:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            temporary.unlink(missing_ok=True)


class ModelWithNMS(torch.nn.Module):
    """The network followed by NMS, written with ops that export to ONNX with a dynamic batch and a
    dynamic number of boxes. One NMS call serves every image and class: each box is shifted by
    (class * span, image * span), span larger than any box, so boxes of different classes or
    images never overlap, and torchvision.ops.nms becomes ONNX NonMaxSuppression. The network answers per anchor
    (Detect.forward's mode "per_anchor": YOLO26's one-to-many head)."""

    def __init__(self, model, conf, iou, max_det):
        super().__init__()
        self.model, self.conf, self.iou, self.max_det = model, conf, iou, max_det

    def forward(self, x):
        pred = self.model(x, mode="per_anchor").float()  # fp32 even for --half: the shifts below would overflow fp16
        boxes, (score, cls) = pred[..., :4], pred[..., 4:].max(2)
        # Image index of every box, and the zero output, derived from tensors rather than from
        # x.shape: the tracer would freeze a Python int into the graph and the batch stop being dynamic.
        image = torch.ones_like(score).cumsum(0) - 1
        images = image[:, 0]
        out = torch.zeros_like(image[:, :1]).repeat(1, self.max_det * 6)
        span = boxes.max() - boxes.min() + 1
        boxes, score, cls, image = boxes.reshape(-1, 4), score.flatten(), cls.flatten().to(boxes.dtype), image.flatten()
        keep = score > self.conf
        boxes, score, cls, image = boxes[keep], score[keep], cls[keep], image[keep]
        # best first
        keep = torchvision.ops.nms(boxes + torch.stack((cls, image, cls, image), 1) * span, score, self.iou)
        boxes, score, cls, image = boxes[keep], score[keep], cls[keep], image[keep]
        # Rank of each kept box among those of its image (they come best first): row in the output.
        same_image = (image[:, None] == images[None, :]).to(boxes.dtype)  # kept boxes x batch
        rank = ((same_image.cumsum(0) * same_image).sum(1) - 1).long()
        fits = rank < self.max_det
        rows = torch.cat((boxes, score[:, None], cls[:, None]), 1)[fits]
        out = out.view(-1, 6).index_put((image[fits].long() * self.max_det + rank[fits],), rows)
        return out.view(-1, self.max_det, 6), same_image.sum(0).clamp(max=self.max_det).long()


def write_onnx(module, x, path, options, metadata, calibration):
    """fp32 and fp16: the traced graph. INT8: that graph in fp32, quantized by ONNX Runtime (quantize_onnx)."""
    if not metadata["int8"]:
        return export_onnx(module, x, path, options, metadata)
    with tempfile.TemporaryDirectory() as scratch:
        float_onnx = Path(scratch) / "fp32.onnx"
        export_onnx(module, x, float_onnx, options, dict(metadata))
        quantize_onnx(float_onnx, path, metadata, calibration)


def write_openvino(module, x, path, options, metadata, calibration):
    """The fp32 ONNX graph converted to an OpenVINO IR (export_openvino): fp16 weights with --half, INT8 by NNCF."""
    with tempfile.TemporaryDirectory() as scratch:
        float_onnx = Path(scratch) / "fp32.onnx"
        export_onnx(module, x, float_onnx, options, dict(metadata))
        export_openvino(float_onnx, path, metadata, metadata["half"], calibration if metadata["int8"] else None)


def export_onnx(module, x, path, options, metadata):
    import onnx

    names_out = ["detections", "count"] if options.nms else ["output"]
    dynamic_axes = None
    if options.dynamic:
        dynamic_axes = {
            "images": {0: "batch", 2: "height", 3: "width"},
            names_out[0]: {0: "batch"} if options.nms or options.end2end else {0: "batch", 1: "anchors"},
        }
        if options.nms:
            dynamic_axes["count"] = {0: "batch"}
    with warnings.catch_warnings():  # the tracer's warnings about shapes are expected and would bury the report
        warnings.simplefilter("ignore")
        # dynamo=False: the TorchScript-based exporter, which needs no onnxscript and turns
        # torchvision.ops.nms into NonMaxSuppression.
        torch.onnx.export(
            module,
            x,
            str(path),
            dynamo=False,
            opset_version=options.opset,
            input_names=["images"],
            output_names=names_out,
            dynamic_axes=dynamic_axes,
        )
    graph = onnx.load(str(path))
    if options.nms:  # the exporter cannot infer these two sizes through the scatter; they are fixed
        for dim, size in zip(graph.graph.output[0].type.tensor_type.shape.dim[1:], (options.max_det, 6)):
            dim.dim_value = size
    if options.simplify:
        graph = simplify(graph)
    shape = lambda t: [d.dim_param or d.dim_value for d in t.type.tensor_type.shape.dim]  # noqa: E731
    metadata.update(
        input_names=["images"],
        output_names=names_out,
        input_shapes=[shape(t) for t in graph.graph.input],
        output_shapes=[shape(t) for t in graph.graph.output],
    )
    for key, value in export_metadata(**metadata).items():
        graph.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(graph)
    onnx.save(graph, str(path))


def simplify(graph):
    """Fold constants and remove redundant nodes with whichever simplifier is installed (optional)."""
    if importlib.util.find_spec("onnxslim"):
        import onnxslim

        return onnxslim.slim(graph)
    import onnxsim

    graph, valid = onnxsim.simplify(graph)
    if not valid:
        raise ExportError("onnxsim could not validate the simplified graph; export without --simplify")
    return graph


def write_torchscript(module, x, path, options, metadata, calibration):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, x, check_trace=False)  # the NMS output legitimately varies in size
    outputs = module(x)
    outputs = [list(o.shape) for o in (outputs if isinstance(outputs, tuple) else (outputs,))]
    input_shape = list(x.shape)
    if options.dynamic:  # name the dimensions that vary, as the ONNX graph does
        input_shape = ["batch", 3, "height", "width"]
        per_anchor = not (options.nms or options.end2end)
        outputs = [["batch", "anchors", outputs[0][2]]] if per_anchor else [["batch", *o[1:]] for o in outputs]
    names_out = ["detections", "count"] if options.nms else ["output"]
    metadata.update(input_names=["images"], output_names=names_out, input_shapes=[input_shape], output_shapes=outputs)
    with warnings.catch_warnings():  # torch.jit is deprecated in favour of torch.export, yet still the portable format
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(export_metadata(**metadata))})


def write_tflite(module, x, path, options, metadata, calibration):
    """A TFLite (LiteRT) flatbuffer converted from the PyTorch module by litert-torch (torch.export, then LiteRT's
    converter; the input stays NCHW like the other formats), and the metadata as metadata.json in a zip archive
    appended to it, where the interpreter, which reads the flatbuffer from its start, does not look."""
    module, x = float_copy(module), x.float().cpu().contiguous()
    # The anchor grid as constants: litert-torch keeps the ops that build it (arange, broadcast, concat), which other
    # converters fold, and they slow the file (Ultralytics sets its grid before export too)
    module.head.fix_anchors(*x.shape[-2:])
    # In a process of its own: the conversion starts JAX's thread pools, and the data loader workers of the gate
    # would then be forked from a multithreaded process (JAX warns of deadlocks).
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        pool.apply(convert_tflite, (module, x, str(path)))
    with torch.no_grad():
        output = list(module(x).shape)
    metadata.update(
        input_names=["images"], output_names=["output"], input_shapes=[list(x.shape)], output_shapes=[output]
    )
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(METADATA_FILE, json.dumps(export_metadata(**metadata)))


def float_copy(module):
    """A copy of the network to convert, on the CPU, in fp32, with contiguous weights: converters that start from
    torch.export or a trace (litert-torch, pnnx, ExecuTorch, coremltools) were given channels_last weights (as this
    repo loads them, for speed), and litert-torch's file came out silently wrong (its raw outputs far off)."""
    return copy.deepcopy(module).float().cpu().eval().to(memory_format=torch.contiguous_format)


def convert_tflite(module, x, path):
    import litert_torch

    with contextlib.redirect_stdout(sys.stderr):  # its progress lines are not part of the report
        litert_torch.convert(module, (x,)).export(path)


def keep_float(name):
    """Whether the node `name` stays in float in an INT8 export (KEEP_FLOAT)."""
    return any(re.search(pattern, name) for pattern in KEEP_FLOAT)


def export_openvino(onnx_path, xml_path, metadata, half=False, calibration=None):
    """An OpenVINO IR (xml_path and its .bin, in a folder of their own) converted from the ONNX file, with the
    metadata in the IR's rt_info. half: fp16 weights. calibration: callable giving the calibration inputs -> INT8 by
    NNCF's post-training quantization, KEEP_FLOAT's layers in float."""
    import openvino as ov

    network = ov.convert_model(str(onnx_path))
    if calibration is not None:
        import nncf

        nncf.set_log_level(logging.WARNING)  # else a line per op it leaves unquantized would bury the report
        kept = [op.get_friendly_name() for op in network.get_ops() if keep_float(op.get_friendly_name())]
        inputs = list(calibration())
        network = nncf.quantize(
            network,
            nncf.Dataset(inputs),
            # MIXED: symmetric weights, asymmetric activations (SiLU outputs are not centred on zero)
            preset=nncf.QuantizationPreset.MIXED,
            subset_size=len(inputs),  # every calibration image given, not NNCF's default 300
            ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        )
    network.set_rt_info(json.dumps(export_metadata(**metadata)), OPENVINO_METADATA)
    shutil.rmtree(xml_path.parent, ignore_errors=True)  # no stale .bin of an earlier export beside the new .xml
    ov.save_model(network, str(xml_path), compress_to_fp16=half)


def quantize_onnx(fp32_path, path, metadata, calibration):
    """INT8 ONNX (QDQ: QuantizeLinear/DequantizeLinear pairs around the quantized ops, which ONNX Runtime fuses
    into integer kernels) by ONNX Runtime's static quantization, KEEP_FLOAT's nodes in float."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.inputs = iter(calibration())

        def get_next(self):
            x = next(self.inputs, None)
            return None if x is None else {"images": x}

    kept = [node.name for node in onnx.load(str(fp32_path)).graph.node if keep_float(node.name)]
    quantize_static(
        str(fp32_path),
        str(path),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,  # one scale per output channel of each conv: fused Conv+BN weights vary a lot by channel
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=kept,
    )
    graph = onnx.load(str(path))
    del graph.metadata_props[:]
    for key, value in export_metadata(**metadata).items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))
