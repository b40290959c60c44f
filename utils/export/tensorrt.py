"""TensorRT engines (.engine), built on the NVIDIA GPU that will run them and opened there.

An engine is built from our ONNX graph: fp32, fp16 (--half: the fp16 graph, as --onnx --half writes it) or INT8
(--int8: the QDQ graph that --onnx --int8 writes, calibrated on the training images by ONNX Runtime, which
TensorRT compiles as explicit quantization: the scales are ours, the same as the ONNX file's, and the layers that
KEEP_FLOAT names stay in float). Both are built as strongly typed networks where this TensorRT has them, so every
layer runs in the precision the graph gives it. --dynamic: an optimization profile for batch 1 to --batch at the
export size. --workspace: the builder's scratch memory in GiB.

The file: 4 bytes (little-endian) with the length of the metadata's JSON, the JSON, then the serialized engine, so
the metadata is read without TensorRT. An engine runs only with the TensorRT version and the GPU model it was built
with: load_engine says so in one sentence when deserialization fails.
"""

import json
import tempfile
from pathlib import Path

import torch

from utils.checkpoints.ours import CheckpointError
from utils.export.loaders import any_batch, export_metadata, parse_metadata
from utils.export.writers import ExportError, export_onnx, quantize_onnx

MAX_METADATA = 1 << 20  # a crafted file must not make the loader read a gigabyte as JSON


def no_gpu():
    """Why this machine can neither build nor run an engine, or None."""
    if not torch.cuda.is_available():
        return "TensorRT builds and runs engines on an NVIDIA GPU, and torch sees none here (torch.cuda.is_available())"
    return None


def write_engine(module, x, path, options, metadata, calibration):
    import tensorrt as trt

    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = Path(scratch) / "model.onnx"
        if metadata["int8"]:
            float_onnx = Path(scratch) / "fp32.onnx"
            export_onnx(module, x, float_onnx, options, metadata)
            quantize_onnx(float_onnx, onnx_path, metadata, calibration)
        else:
            export_onnx(module, x, onnx_path, options, metadata)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        network = builder.create_network(0 if typed is None else 1 << int(typed))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))[:300]
            raise ExportError(f"TensorRT {trt.__version__} cannot parse the ONNX graph ({errors}); try another --opset")
        config = builder.create_builder_config()
        if options.workspace:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace * (1 << 30)))
        if typed is None and metadata["half"]:  # an older TensorRT: precision by flags
            config.set_flag(trt.BuilderFlag.FP16)
        if typed is None and metadata["int8"]:
            config.set_flag(trt.BuilderFlag.INT8)
        if options.dynamic:
            profile = builder.create_optimization_profile()
            _, channels, h, w = x.shape
            profile.set_shape(
                "images", (1, channels, h, w), (options.batch, channels, h, w), (options.batch, channels, h, w)
            )
            config.add_optimization_profile(profile)
        engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise ExportError(f"TensorRT {trt.__version__} could not build an engine (see its log above); try --workspace")
    strings = json.dumps(export_metadata(**{**metadata, "dynamic": False, "engine_dynamic_batch": options.dynamic}))
    with open(path, "wb") as f:
        f.write(len(strings.encode()).to_bytes(4, "little") + strings.encode() + bytes(engine))


def engine_metadata(path):
    """(metadata strings, offset of the engine) of a file write_engine wrote; ({}, 0) for anything else."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(4), "little")
        if not 0 < size <= MAX_METADATA:
            return {}, 0
        try:
            strings = json.loads(f.read(size))
        except ValueError:
            return {}, 0
    return (strings, 4 + size) if isinstance(strings, dict) else ({}, 0)


def load_engine(path, device):
    import tensorrt as trt

    strings, offset = engine_metadata(path)
    meta = parse_metadata(strings, path)
    if device.type != "cuda":
        device = torch.device("cuda", 0)
    logger = trt.Logger(trt.Logger.ERROR)
    with torch.cuda.device(device):
        engine = trt.Runtime(logger).deserialize_cuda_engine(Path(path).read_bytes()[offset:])
        if engine is None:
            raise CheckpointError(
                f"{path} is not an engine this TensorRT {trt.__version__} can run on {torch.cuda.get_device_name()}: "
                "an engine runs only with the TensorRT and the GPU model it was built with; export it again here"
            )
        context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    output = next(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT)
    dtype = torch.float16 if engine.get_tensor_dtype("images") == trt.DataType.HALF else torch.float32
    out_dtype = torch.float16 if engine.get_tensor_dtype(output) == trt.DataType.HALF else torch.float32

    @torch.no_grad()
    def run_batch(x):
        x = x.to(device, dtype).contiguous()
        context.set_input_shape("images", tuple(x.shape))
        out = torch.empty(tuple(context.get_tensor_shape(output)), dtype=out_dtype, device=device)
        context.set_tensor_address("images", x.data_ptr())
        context.set_tensor_address(output, out.data_ptr())
        stream = torch.cuda.current_stream(device)
        if not context.execute_async_v3(stream.cuda_stream):
            raise CheckpointError(f"{path} failed to run in TensorRT; export it again")
        stream.synchronize()
        return out.float()

    if meta.get("engine_dynamic_batch"):  # any batch up to the profile's: in chunks, without padding
        batch = meta["batch"] or 1
        run = lambda x: torch.cat([run_batch(chunk) for chunk in x.split(batch)])  # noqa: E731
    else:
        run = any_batch(run_batch, meta["batch"])
    return {**meta, "run": run, "device": device}
