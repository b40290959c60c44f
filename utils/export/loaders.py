"""Each exported format opened in its own runtime (ONNX Runtime, TorchScript, OpenVINO, LiteRT) for a Predictor of
utils/inference.py, and the metadata every exported file carries so that nothing else is needed to run it.

A load function takes (path, device) and returns a dict: the file's metadata, its `run` and `device`
(load_exported makes the Predictor, with the row's runtime as its backend); the table in utils/export/formats.py
names it for its format, and utils.inference.load_exported picks the row by the file's suffix. The packages a row
lists are checked before its load function runs, so these import them plainly. Anything wrong with the file
itself: CheckpointError with one sentence naming it.

The metadata (export_metadata: names, stride, imgsz, batch, dynamic, half, int8, end2end, nms, data, single_cls, the
input/output names and shapes, each as JSON) lives in ONNX metadata_props, in metadata.json among the TorchScript
file's extra files, in the rt_info of the OpenVINO .xml, and in metadata.json in a small zip archive appended to the
.tflite file.
"""

import contextlib
import json
import warnings
import weakref
import zipfile

import numpy as np
import torch

from utils.checkpoints.ours import FORMAT, CheckpointError

METADATA_FILE = "metadata.json"  # inside a TorchScript file (_extra_files) and in the zip appended to a .tflite
OPENVINO_METADATA = ["yolo_flat", "metadata"]  # where export.py puts the metadata in the IR's rt_info


def export_metadata(**values):
    """What val.py and detect.py need to run an exported file (names, imgsz, stride, batch, dynamic, half, int8,
    end2end, nms, data, single_cls, input and output names and shapes), as JSON strings: ONNX metadata_props
    hold strings."""
    return {k: json.dumps(v) for k, v in {"format": FORMAT, **values}.items()}


def parse_metadata(strings, path):
    """The metadata of export_metadata back as values; CheckpointError for a file from elsewhere."""
    if strings.get("format") != json.dumps(FORMAT):
        raise CheckpointError(
            f"{path} has no metadata from this repo's export.py (class names, image size); export it with export.py"
        )
    try:
        meta = {k: json.loads(v) for k, v in strings.items()}
    except ValueError:
        raise CheckpointError(f"{path} has metadata that is not the JSON export.py writes") from None
    # files exported before int8, end2end, data and single_cls were written read as float, NMS-needing, no dataset
    defaults = {"int8": False, "end2end": False, "data": None, "single_cls": False}
    meta = {**defaults, **meta}
    return {**meta, "imgsz": tuple(meta["imgsz"]), "batch": None if meta["dynamic"] else meta["batch"]}


def any_batch(run_batch, batch):
    """run(x) for any number of images, from run_batch(x) of a file exported for exactly `batch` images (None:
    any): in chunks of `batch`, the last one padded with zeros and the padding's outputs dropped."""
    if not batch:
        return run_batch

    def run(x):
        outputs = []
        for chunk in x.split(batch):
            n = len(chunk)
            if n < batch:
                chunk = torch.cat((chunk, chunk.new_zeros(batch - n, *chunk.shape[1:])))
            outputs.append(run_batch(chunk)[:n])
        return torch.cat(outputs)

    return run


def first_line(error):
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


@contextlib.contextmanager
def subnormals_flushed():
    """Inside: this thread's float ops flush subnormals to zero (torch.set_flush_denormal sets the CPU's per-thread
    FTZ/DAZ flags, which ONNX Runtime's work on this thread obeys too); on the way out the flag is as it was, so the
    caller's own code (hypothesis, say, which refuses to run where subnormals vanish) is left as it was."""
    was_on = torch.tensor([1e-39]).mul(2).item() == 0  # torch has no getter for the flag
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was_on)


def onnx_session(path, providers=("CPUExecutionProvider",)):
    """An ONNX Runtime session that treats subnormal floats as zero: ORT's option for its pool's threads, and its
    `run` inside subnormals_flushed() for the calling thread, which computes a share of each op.

    Why: values below float32's smallest normal take an x86 CPU many times longer per operation, and some trained
    networks produce them in their activations, which slows them; flushed they run as fast as the others, with the
    same detections bitwise (bench/RESULTS.md#inference-latency)."""
    import onnxruntime  # imported here: only .onnx weights need it

    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    with subnormals_flushed():  # ORT sets the creating thread's flag with this option and leaves it set: restored
        session = onnxruntime.InferenceSession(str(path), options, providers=list(providers))
    # A weak reference: a bound session.run here would make a cycle (session -> run -> session) that only the cyclic
    # collector frees, and it may do so in a forked DataLoader worker, where ORT's destructor waits forever for the
    # parent's threads (val.py after an export check hung that way).
    owner, run = weakref.ref(session), type(session).run

    def flushed_run(*args, **kwargs):
        with subnormals_flushed():
            return run(owner(), *args, **kwargs)

    session.run = flushed_run  # so that no caller can forget the calling thread's share
    return session


def load_onnx(path, device):
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    try:
        session = onnx_session(path, providers)
    except Exception as e:  # onnxruntime raises its own types for broken or foreign files
        raise CheckpointError(f"{path} is not an ONNX model that ONNX Runtime can load ({first_line(e)})") from None
    meta = parse_metadata(session.get_modelmeta().custom_metadata_map, path)
    model_input, model_output = session.get_inputs()[0], session.get_outputs()[0].name
    dtype = np.float16 if model_input.type == "tensor(float16)" else np.float32

    def run_batch(x):
        x = x.detach().cpu().numpy().astype(dtype)
        return torch.from_numpy(session.run([model_output], {model_input.name: x})[0]).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": device}


def load_torchscript(path, device):
    extra = {METADATA_FILE: ""}
    try:
        # torch.jit is deprecated in favour of torch.export, yet still the portable format
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
        strings = json.loads(extra[METADATA_FILE] or "{}")
    except Exception as e:
        raise CheckpointError(f"{path} is not a TorchScript file this torch can load ({first_line(e)})") from None
    meta = parse_metadata(strings, path)
    dtype = torch.float16 if meta["half"] else torch.float32

    @torch.no_grad()
    def run(x):
        out = module(x.to(device, dtype))
        return (out[0] if isinstance(out, (tuple, list)) else out).float()  # with NMS: (detections, count)

    return {**meta, "run": run, "device": device}


_openvino_core = []


def openvino_core():
    """The process's one openvino.Core. One for all models, kept to the end: a Core collected while a model compiled
    by it still runs unloads the CPU plugin under that model (a segmentation fault in the tests)."""
    import openvino

    if not _openvino_core:
        _openvino_core.append(openvino.Core())
    return _openvino_core[0]


def load_openvino(path, device):
    """An OpenVINO IR: a folder holding one .xml (export.py writes best_openvino_model/best.xml), or the .xml."""
    xml = path if path.suffix == ".xml" else next(iter(sorted(path.glob("*.xml"))), None)
    if xml is None:
        raise CheckpointError(f"{path} is a folder without an OpenVINO model (.xml); export one with export.py")
    core = openvino_core()
    try:
        network = core.read_model(str(xml))
    except Exception as e:
        raise CheckpointError(f"{xml} is not an OpenVINO model this OpenVINO can read ({first_line(e)})") from None
    strings = (
        json.loads(network.get_rt_info(OPENVINO_METADATA).astype(str)) if network.has_rt_info(OPENVINO_METADATA) else {}
    )
    meta = parse_metadata(strings, path)
    # The CPU plugin runs f32 layers in bf16 where the CPU has bf16 instructions (AVX512_BF16, AMX) unless told
    # otherwise. bf16 keeps 8 bits of mantissa: box coordinates in pixels and the DFL's expectations move enough to
    # lose mAP50-95. So float layers compute in f32, also in an fp16 IR (its weights are stored in fp16 and expanded)
    # and in the layers an INT8 IR keeps in float.
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if device.type != "cpu":
        warnings.warn(f"{path}: OpenVINO runs on the CPU here, not on {device}", stacklevel=3)
    compiled = core.compile_model(network, "CPU", config)
    request = compiled.create_infer_request()
    output = compiled.outputs[0]

    def run_batch(x):
        x = x.detach().cpu().numpy().astype(np.float32)  # an fp16 IR takes f32 input too: the plugin converts
        return torch.from_numpy(request.infer({0: x})[output].copy()).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": torch.device("cpu")}


def tflite_metadata(path):
    """The metadata export.py appends to a .tflite file as a small zip archive (the interpreter reads the
    flatbuffer from the front and ignores what follows it), or {} when there is none or it is implausibly large."""
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo(METADATA_FILE).file_size > 1 << 20:  # a crafted archive must not inflate 1 GB
                return {}
            return json.loads(archive.read(METADATA_FILE))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return {}


def load_tflite(path, device):
    from ai_edge_litert.interpreter import Interpreter  # imported here: only .tflite weights need it

    meta = parse_metadata(tflite_metadata(path), path)
    try:
        interpreter = Interpreter(model_path=str(path), num_threads=torch.get_num_threads())
        interpreter.allocate_tensors()
    except Exception as e:
        raise CheckpointError(f"{path} is not a TFLite model this interpreter can load ({first_line(e)})") from None
    model_input, model_output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    if device.type != "cpu":
        warnings.warn(f"{path}: the TFLite interpreter runs on the CPU here, not on {device}", stacklevel=3)

    def run_batch(x):
        interpreter.set_tensor(model_input["index"], x.detach().cpu().numpy().astype(np.float32))
        interpreter.invoke()
        return torch.from_numpy(interpreter.get_tensor(model_output["index"]).copy()).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": torch.device("cpu")}
