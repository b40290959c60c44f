"""The phone runtimes' formats, written and opened: NCNN (pnnx converts the traced network), MNN (its converter,
from the fp32 ONNX graph), ExecuTorch (torch.export lowered to XNNPACK) and Core ML (coremltools, from torch.export).
Each is called as the rows of utils/export/formats.py call writers.py's and loaders.py's functions.

Where the metadata lives: NCNN's folder holds metadata.json beside the .param and .bin; MNN keeps it in the model's
bizCode; ExecuTorch as a constant method `metadata` of the program; Core ML in the package's user-defined metadata.

The two converters that are programs of their own (pnnx, MNNConvert) run in a child process: a converter that
crashes, or prints hundreds of lines, leaves export.py standing, and its error becomes one sentence.
"""

import json
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from utils.boxes import dfl_as_weighted_sum, top_detections
from utils.checkpoints.ours import CheckpointError
from utils.export.loaders import METADATA_FILE, any_batch, export_metadata, first_line, parse_metadata
from utils.export.writers import ExportError, export_onnx, float_copy

CONVERTER_TIMEOUT = 1800  # seconds: an n model converts in seconds, an x model at 1280 px in minutes
COREML_METADATA = "yolo_flat"  # the key of the JSON in a Core ML package's user-defined metadata


class OneToOnePerAnchor(torch.nn.Module):
    """An end-to-end network answering in Detect.forward's mode "one2one_per_anchor", for tracers that call
    forward(x) alone."""

    def __init__(self, network):
        super().__init__()
        self.network = network

    def forward(self, x):
        return self.network(x, mode="one2one_per_anchor")


def per_anchor(module, metadata):
    """For runtimes without TopK (NCNN) and converters that fail on it (coremltools): an end-to-end network answers
    its one-to-one head's decoded boxes and scores per anchor, and the loader picks the best max_det of them
    (utils.boxes.top_detections) as the graph would have. The output is then the same (batch, 300, 6) as every
    other format's."""
    if not metadata["end2end"]:
        return module
    metadata["topk_outside"] = module.head.max_det
    return OneToOnePerAnchor(module)


def outside_topk(run, meta):
    """run(x) of a file written by per_anchor, giving the final detections."""
    if not meta.get("topk_outside"):
        return run
    return lambda x: top_detections(run(x), meta["topk_outside"])


def run_converter(command, what, path, **options):
    """Run a converter program; ExportError with its last meaningful line when it fails or writes nothing. options:
    subprocess.run's (cwd, env)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CONVERTER_TIMEOUT, **options)
    except subprocess.TimeoutExpired:
        raise ExportError(f"{what} did not finish writing {path.name} in {CONVERTER_TIMEOUT} s") from None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    if done.returncode != 0 or not path.exists():
        said = next((line for line in reversed(lines) if "rror" in line or "not" in line), lines[-1] if lines else "")
        # the name it was to have, not written_at_once's temporary (.best.123.tmp.mnn)
        name = re.sub(r"^\.(.+)\.\d+\.tmp(\.[^.]+)?$", r"\1\2", path.name)
        raise ExportError(
            f"{what} could not convert the network to {name} (exit status {done.returncode}: "
            f"{said.strip()[:200] or 'no output'}); export --onnx or --openvino instead"
        )


def write_ncnn(module, x, path, options, metadata, calibration):
    """NCNN's .param and .bin (fp16 weights with --half) by pnnx from the traced network, and metadata.json."""
    import pnnx

    module, x = per_anchor(float_copy(module), metadata), x.float().cpu().contiguous()
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings(), dfl_as_weighted_sum():
        warnings.simplefilter("ignore")
        traced = Path(scratch) / "model.pt"
        torch.jit.trace(module, x, check_trace=False).save(str(traced))
        shape = f"[{','.join(map(str, x.shape))}]f32"
        bin_path = path.with_suffix(".bin")
        command = [pnnx.EXEC_PATH, str(traced), f"inputshape={shape}", f"ncnnparam={path}", f"ncnnbin={bin_path}"]
        command += [f"{name}={Path(scratch) / name}" for name in ("pnnxparam", "pnnxbin", "pnnxpy", "pnnxonnx")]
        run_converter(command + [f"ncnnpy={Path(scratch) / 'ncnn.py'}", f"fp16={int(metadata['half'])}"], "pnnx", path)
    with torch.no_grad():
        output = list(module(x).shape)
    metadata.update(input_names=["in0"], output_names=["out0"], input_shapes=[list(x.shape)], output_shapes=[output])
    (path.parent / METADATA_FILE).write_text(json.dumps(export_metadata(**metadata)))


def load_ncnn(path, device):
    """An NCNN folder (export.py writes best_ncnn_model/best.param, best.bin, metadata.json), or its .param."""
    import ncnn

    param = path if path.suffix == ".param" else next(iter(sorted(path.glob("*.param"))), None)
    if param is None:
        raise CheckpointError(f"{path} is a folder without an NCNN model (.param); export one with export.py")
    try:
        strings = json.loads((param.parent / METADATA_FILE).read_text())
    except (OSError, ValueError):
        strings = {}
    meta = parse_metadata(strings, path)
    net = ncnn.Net()
    net.opt.num_threads = torch.get_num_threads()
    for option in ("use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic", "use_bf16_storage"):
        setattr(net.opt, option, False)  # fp32 arithmetic: ncnn's fp16 moves boxes by a pixel (an fp16 .bin is read)
    if net.load_param(str(param)) != 0 or net.load_model(str(param.with_suffix(".bin"))) != 0:
        raise CheckpointError(f"{param} and its .bin are not an NCNN model this ncnn can load; export it again")

    def run_batch(x):
        outputs = []
        for image in x.detach().float().cpu().numpy():  # ncnn's Python API takes one image at a time
            extractor = net.create_extractor()
            extractor.input("in0", ncnn.Mat(np.ascontiguousarray(image)).clone())
            status, out = extractor.extract("out0")
            if status != 0:
                raise CheckpointError(f"{param} failed to run in ncnn (status {status}); export it again")
            outputs.append(torch.from_numpy(np.array(out)).float())
        return torch.stack(outputs)

    return {**meta, "run": outside_topk(run_batch, meta), "device": torch.device("cpu")}


# MNN's converter itself (_tools, which MNN.tools.mnnconvert.convert calls), not through that module: importing it
# imports MNN's telemetry logger, which runs `pip install -U aliyun-log-python-sdk` where that is missing, and that
# package's protobuf<6 replaced the 6.x that onnx and TensorFlow need in the user's environment
MNN_CONVERT = "import sys, _tools; _tools.mnnconvert(sys.argv)"


def write_mnn(module, x, path, options, metadata, calibration):
    """MNN from the fp32 ONNX graph by MNN's converter (fp16 weights with --half), the metadata as its bizCode."""
    with tempfile.TemporaryDirectory() as scratch:
        float_onnx = Path(scratch) / "fp32.onnx"
        export_onnx(module, x, float_onnx, options, metadata)
        strings = json.dumps(export_metadata(**metadata))
        command = [sys.executable, "-c", MNN_CONVERT, "-f", "ONNX", "--modelFile", str(float_onnx), "--MNNModel"]
        run_converter(command + [str(path), "--bizCode", strings] + ["--fp16"] * metadata["half"], "MNNConvert", path)


def load_mnn(path, device):
    import MNN

    try:
        manager = MNN.nn.create_runtime_manager(
            ({"precision": "high", "backend": "CPU", "numThread": torch.get_num_threads()},)
        )
        net = MNN.nn.load_module_from_file(str(path), [], [], runtime_manager=manager, rearrange=False)
        strings = json.loads(net.get_info().get("bizCode") or "{}")
    except Exception as e:
        raise CheckpointError(f"{path} is not an MNN model this MNN can load ({first_line(e)})") from None
    if net is None:
        raise CheckpointError(f"{path} is not an MNN model this MNN can load; export it again")
    meta = parse_metadata(strings if isinstance(strings, dict) else {}, path)

    def run_batch(x):
        x = x.detach().float().cpu().contiguous().numpy()
        return torch.from_numpy(net.forward(MNN.expr.const(x, x.shape, MNN.expr.NCHW)).read().copy()).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": torch.device("cpu")}


def write_executorch(module, x, path, options, metadata, calibration):
    """An ExecuTorch program (.pte): torch.export, lowered to the XNNPACK delegate (the CPU backend phones use), with
    the metadata as the program's constant method `metadata`."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    module, x = float_copy(module), x.float().cpu().contiguous()
    with torch.no_grad():
        output = list(module(x).shape)
    metadata.update(input_names=["images"], output_names=["output"], input_shapes=[list(x.shape)])
    metadata.update(output_shapes=[output])
    strings = json.dumps(export_metadata(**metadata))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, (x,))
            lowered = to_edge_transform_and_lower(
                exported, partitioner=[XnnpackPartitioner()], constant_methods={"metadata": strings}
            )
            path.write_bytes(lowered.to_executorch().buffer)
    except Exception as e:
        raise ExportError(
            f"ExecuTorch could not lower the network ({first_line(e)}); export --tflite instead"
        ) from None


def load_executorch(path, device):
    from executorch.runtime import Runtime

    try:
        program = Runtime.get().load_program(str(path))
        strings = program.load_method("metadata").execute([])[0] if "metadata" in program.method_names else "{}"
        method = program.load_method("forward")
    except Exception as e:
        raise CheckpointError(f"{path} is not an ExecuTorch program this runtime can load ({first_line(e)})") from None
    meta = parse_metadata(json.loads(strings), path)

    def run_batch(x):
        return method.execute([x.detach().float().cpu().contiguous()])[0].float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": torch.device("cpu")}


def write_coreml(module, x, path, options, metadata, calibration):
    """A Core ML ML program (.mlpackage) from torch.export: its input an RGB image, as Apple's Vision framework
    feeds a model (a CVPixelBuffer, scaled by 1/255 inside), its output the raw predictions as the other formats
    give them; fp16 compute with --half. Its spec is read back and checked (check_coreml_spec)."""
    import coremltools as ct

    # per_anchor: coremltools cannot convert the end-to-end head's gather of the top pairs (its index comes out fp32)
    module, x = per_anchor(float_copy(module), metadata), x.float().cpu().contiguous()
    with torch.no_grad():
        output = list(module(x).shape)
    metadata.update(input_names=["images"], output_names=["output"], input_shapes=[list(x.shape)])
    metadata.update(output_shapes=[output])
    image = ct.ImageType(name="images", shape=x.shape, scale=1 / 255, color_layout=ct.colorlayout.RGB)
    precision = ct.precision.FLOAT16 if metadata["half"] else ct.precision.FLOAT32
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, (x,)).run_decompositions({})
            model = ct.convert(
                exported,
                inputs=[image],
                outputs=[ct.TensorType(name="output")],
                convert_to="mlprogram",
                minimum_deployment_target=ct.target.iOS16,
                compute_precision=precision,
            )
    except Exception as e:
        raise ExportError(
            f"coremltools could not convert the network ({first_line(e)}); export --onnx instead"
        ) from None
    model.short_description = f"YOLO detector: {len(metadata['names'])} classes, {x.shape[2]}x{x.shape[3]} px"
    model.user_defined_metadata[COREML_METADATA] = json.dumps(export_metadata(**metadata))
    model.save(str(path))
    check_coreml_spec(path)


def check_coreml_spec(path):
    """Read a .mlpackage's spec without Core ML (which runs only on macOS) and check what an app relies on: an RGB
    image input of the exported size, the output's shape, our metadata, and only the ML program's built-in ops.
    Returns one line describing it; ExportError naming what is wrong."""
    import coremltools as ct

    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    strings = json.loads(dict(spec.description.metadata.userDefined).get(COREML_METADATA, "{}"))
    meta = parse_metadata(strings, path)
    (image,), (output,) = spec.description.input, spec.description.output
    size = (image.type.imageType.height, image.type.imageType.width)
    shape = list(output.type.multiArrayType.shape)
    blocks = [block for f in spec.mlProgram.functions.values() for block in f.block_specializations.values()]
    ops = {op.type for block in blocks for op in block.operations}
    wrong = [
        f"input {image.name} is not a {meta['imgsz'][0]}x{meta['imgsz'][1]} RGB image" * (size != meta["imgsz"]),
        f"output {output.name} is {shape}, not {meta['output_shapes'][0]}" * (shape != meta["output_shapes"][0]),
        f"it holds custom ops ({', '.join(sorted(op for op in ops if 'custom' in op))})"
        * any("custom" in o for o in ops),
    ]
    if any(wrong):
        raise ExportError(f"{path.name} was written wrong: {'; '.join(w for w in wrong if w)}; export it again")
    return (
        f"input {image.name} {size[0]}x{size[1]} RGB image, output {output.name} {shape}, "
        f"{len(ops)} kinds of ML program op, {len(meta['names'])} class names"
    )


def load_coreml(path, device):
    """A Core ML package run by Core ML (macOS only: formats.py's row says so elsewhere), one image at a time."""
    import coremltools as ct
    from PIL import Image

    try:
        model = ct.models.MLModel(str(path))
        strings = json.loads(dict(model.user_defined_metadata).get(COREML_METADATA, "{}"))
    except Exception as e:
        raise CheckpointError(f"{path} is not a Core ML package this Core ML can load ({first_line(e)})") from None
    meta = parse_metadata(strings, path)

    def run_batch(x):
        images = (x.detach().float().cpu() * 255).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
        outputs = [model.predict({"images": Image.fromarray(image)})["output"] for image in images]
        return torch.from_numpy(np.concatenate(outputs)).float()

    return {**meta, "run": outside_topk(run_batch, meta), "device": torch.device("cpu")}
