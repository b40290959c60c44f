"""TensorFlow's formats, written and opened like the rows of utils/export/formats.py's other formats: a SavedModel
(best_saved_model/: saved_model.pb, variables/, metadata.json) and a frozen GraphDef (best.pb, the metadata inside).

Both start from the fp32 ONNX graph, converted by onnx2tf (as Ultralytics does) in a child process
(utils/export/tensorflow_convert.py says why and what the files hold). Their input is "images" (batch, 3, h, w),
float 0..1, as every other format's: onnx2tf's network is NHWC, and the transpose to it is inside the file. Both run
on the CPU here: TensorFlow would otherwise take the whole memory of a GPU that PyTorch shares.
"""

import contextlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from utils.checkpoints.ours import CheckpointError
from utils.export.loaders import METADATA_FILE, any_batch, export_metadata, first_line, parse_metadata
from utils.export.mobile import run_converter
from utils.export.tensorflow_convert import METADATA_NODE, SIGNATURE
from utils.export.writers import export_onnx

ROOT = Path(__file__).resolve().parents[2]  # the child imports utils.export.tensorflow_convert from here
CONVERT = "import sys; sys.path.insert(0, sys.argv[1]); from utils.export.tensorflow_convert import convert; " + (
    "convert(*sys.argv[2:])"
)
# TensorFlow's notes at every import: its C++ log, and oneDNN's line, which TensorFlow prints whatever the log level.
# oneDNN's CPU kernels are off: the same latency as measured, and the reference kernels' results. Set where
# TensorFlow is not imported yet (the child's environment, tensorflow()).
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def onnx_for_tensorflow(module, x, options, metadata, scratch):
    """The fp32 ONNX graph of `module` (metadata completed with its names and shapes) and the test images onnx2tf
    runs it on (the check image, NHWC as onnx2tf takes them), in scratch."""
    onnx_path, images = scratch / "fp32.onnx", scratch / "images.npy"
    export_onnx(module, x, onnx_path, options, metadata)
    np.save(images, x.detach().float().cpu().permute(0, 2, 3, 1).numpy())
    return onnx_path, images


def run_onnx2tf(scratch, written, *arguments):
    """convert(*arguments) of utils/export/tensorflow_convert.py in a child process, run in scratch; `written` is the
    file whose absence afterwards says that it failed (run_converter's sentence then)."""
    command = [sys.executable, "-c", CONVERT, str(ROOT), *map(str, arguments)]
    env = {**QUIET, **os.environ, "CUDA_VISIBLE_DEVICES": ""}  # converted on the CPU, where it runs
    run_converter(command, "onnx2tf", written, cwd=scratch, env=env)


def write_saved_model(module, x, path, options, metadata, calibration):
    """A SavedModel in path's folder (path: its saved_model.pb), metadata.json beside it."""
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path, images = onnx_for_tensorflow(module, x, options, metadata, Path(scratch))
        run_onnx2tf(scratch, path, onnx_path, images, path.parent)
    (path.parent / METADATA_FILE).write_text(json.dumps(export_metadata(**metadata)))


def write_pb(module, x, path, options, metadata, calibration):
    """A frozen GraphDef: the SavedModel written in a scratch folder, then frozen into path with the metadata in its
    node METADATA_NODE."""
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path, images = onnx_for_tensorflow(module, x, options, metadata, Path(scratch))
        strings = json.dumps(export_metadata(**metadata))  # with the ONNX graph's names and shapes, as the file's
        run_onnx2tf(scratch, path, onnx_path, images, Path(scratch) / "saved_model", path, strings)


_threads_set = []


def tensorflow():
    """TensorFlow, imported on the CPU only and with as many threads as torch uses (the tests run one), both set
    before its runtime starts, which is once per process."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    import tensorflow as tf

    if not _threads_set:
        with contextlib.suppress(RuntimeError):  # the runtime already started (TensorFlow used before): as it is
            tf.config.set_visible_devices([], "GPU")
            tf.config.threading.set_intra_op_parallelism_threads(torch.get_num_threads())
            tf.config.threading.set_inter_op_parallelism_threads(1)
        _threads_set.append(True)
    return tf


def on_the_cpu(path, device):
    if device.type != "cpu":
        warnings.warn(f"{path}: TensorFlow runs on the CPU here, not on {device}", stacklevel=3)
    return torch.device("cpu")


def load_saved_model(path, device):
    """A SavedModel folder (export.py writes best_saved_model/ with saved_model.pb, variables/, metadata.json), or
    its saved_model.pb."""
    folder = path.parent if path.is_file() else path
    try:
        strings = json.loads((folder / METADATA_FILE).read_text())
    except (OSError, ValueError):
        strings = {}
    meta = parse_metadata(strings, path)
    tf = tensorflow()
    try:
        loaded = tf.saved_model.load(str(folder))
        serve = loaded.signatures[SIGNATURE]
    except Exception as e:  # TensorFlow raises its own types for a broken or foreign folder
        raise CheckpointError(f"{path} is not a SavedModel this TensorFlow can load ({first_line(e)})") from None

    def run_batch(x):
        images = tf.constant(x.detach().float().cpu().numpy())
        return torch.from_numpy(serve(images=images)["output"].numpy()).float()

    run_batch.saved_model = loaded  # the signature's variables are freed with the object it was loaded as

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": on_the_cpu(path, device)}


def load_pb(path, device):
    """A frozen GraphDef written by export.py --pb: the metadata in its node METADATA_NODE, the rest imported and
    pruned to the function from "images" to "output"."""
    tf = tensorflow()
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
    except Exception as e:  # protobuf's DecodeError for a file cut short or not a GraphDef
        raise CheckpointError(f"{path} is not a TensorFlow GraphDef ({first_line(e)}); export it again") from None
    node = next((node for node in graph_def.node if node.name == METADATA_NODE), None)
    strings = json.loads(tf.make_ndarray(node.attr["value"].tensor).item()) if node is not None else {}
    meta = parse_metadata(strings, path)
    graph_def.node.remove(node)
    try:
        wrapped = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(graph_def, name=""), [])
        tensor = wrapped.graph.as_graph_element
        run_graph = wrapped.prune(tensor(f"{meta['input_names'][0]}:0"), tensor(f"{meta['output_names'][0]}:0"))
    except Exception as e:
        raise CheckpointError(f"{path} is not a GraphDef this TensorFlow can run ({first_line(e)})") from None

    def run_batch(x):
        return torch.from_numpy(run_graph(tf.constant(x.detach().float().cpu().numpy())).numpy()).float()

    return {**meta, "run": any_batch(run_batch, meta["batch"]), "device": on_the_cpu(path, device)}
