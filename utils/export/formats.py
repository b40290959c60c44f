"""Every export format in one table, FORMATS: export.py's flags, the file names, which options each format takes,
what --benchmark writes, the packages each needs (and the pip line when one is missing), how a file is written and
how load_exported (utils/inference.py) opens it all come from its rows.

Adding a format is one row here, its write function and its load function (utils/export/writers.py and loaders.py;
the phone runtimes' in utils/export/mobile.py, Paddle's in paddle_inference.py, TensorRT's in tensorrt.py,
TensorFlow's in tensorflow.py). Nothing else names a format.
"""

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from utils.export.loaders import load_onnx, load_openvino, load_tflite, load_torchscript
from utils.export.mobile import (
    check_coreml_spec,
    load_coreml,
    load_executorch,
    load_mnn,
    load_ncnn,
    write_coreml,
    write_executorch,
    write_mnn,
    write_ncnn,
)
from utils.export.paddle_inference import load_paddle, write_paddle
from utils.export.tensorflow import load_pb, load_saved_model, write_pb, write_saved_model
from utils.export.tensorrt import load_engine, no_gpu, write_engine
from utils.export.writers import write_onnx, write_openvino, write_tflite, write_torchscript


class Package(NamedTuple):
    pip: str  # what `pip install` takes
    module: str  # what `import` takes


ONNX = Package("onnx", "onnx")
ONNXRUNTIME = Package("onnxruntime", "onnxruntime")  # its quantization tools make ONNX INT8 too
OPENVINO = Package("openvino", "openvino")
NNCF = Package("nncf", "nncf")
LITERT_TORCH = Package("litert-torch", "litert_torch")  # converts; pulls in JAX, transformers, torchao
LITERT = Package("ai-edge-litert", "ai_edge_litert")  # the interpreter that runs a .tflite
PNNX = Package("pnnx", "pnnx")  # PyTorch -> NCNN converter (a program in the wheel)
NCNN = Package("ncnn", "ncnn")
MNN = Package("MNN", "MNN")  # runtime and converter in one wheel
EXECUTORCH = Package("executorch", "executorch")  # lowers and runs; pulls in pandas, hydra, coremltools
COREMLTOOLS = Package("coremltools", "coremltools")  # converts anywhere, runs a model on macOS only
TENSORRT = Package("tensorrt", "tensorrt")  # NVIDIA's; needs a GPU to build or run an engine
PADDLE = Package("paddlepaddle", "paddle")  # Paddle's CPU runtime
X2PADDLE = Package("x2paddle", "x2paddle")  # PyTorch -> Paddle converter
SIX = Package("six", "six")  # x2paddle imports it without declaring it
# TensorFlow: tf_keras (which onnx2tf builds its network with) declares `tensorflow`, so `tensorflow` is the pip name
# that installs one TensorFlow; tensorflow-cpu, half its size, with `pip install --no-deps tf_keras` is what
# requirements-export.txt and .ci/run install. Either one provides the module.
TENSORFLOW = Package("tensorflow", "tensorflow")
TF_KERAS = Package("tf_keras", "tf_keras")
ONNX2TF = Package("onnx2tf", "onnx2tf")  # ONNX -> TensorFlow converter; it declares no dependencies: these follow
ONNX_GRAPHSURGEON = Package("onnx_graphsurgeon", "onnx_graphsurgeon")  # onnx2tf's graph editing, our folding too
SNG4ONNX = Package("sng4onnx", "sng4onnx")  # onnx2tf names unnamed nodes with it
PSUTIL = Package("psutil", "psutil")  # onnx2tf imports it
# converted from the fp32 ONNX graph by onnx2tf, which runs it in ONNX Runtime and imports LiteRT's interpreter
TENSORFLOW_WRITE = (ONNX, ONNX2TF, TF_KERAS, ONNX_GRAPHSURGEON, SNG4ONNX, PSUTIL, ONNXRUNTIME, LITERT)


def not_macos():
    return None if sys.platform == "darwin" else "Core ML runs only on macOS"


OPTIONS = ("half", "int8", "nms", "dynamic")  # the export.py flags that a format may refuse


@dataclass(frozen=True)
class ExportFormat:
    name: str  # its flag (--onnx) and its key
    title: str  # what the format is called
    runtime: str  # what runs it: the Predictor's `backend`, the gate's sentence and the benchmark table's rows
    suffix: str  # of the file, or of the file inside the folder (folder=True)
    write: Callable  # write(module, x, path, options, metadata, calibration), see utils/export/writers.py
    load: Callable  # load(path, device) -> the metadata, run and device of its Predictor (utils/inference.py)
    options: tuple = OPTIONS  # which of OPTIONS it takes
    benchmark: tuple = ("fp32",)  # the precisions --benchmark writes
    run_packages: tuple = ()  # what loads and runs a file: val.py, detect.py, export.py's check
    write_packages: tuple = ()  # what writes one, beyond run_packages
    int8_packages: tuple = ()  # what --int8 adds
    folder: bool = False  # written as <stem>_<name>_model/<stem><suffix> beside the files it needs (OpenVINO's .bin)
    folder_name: str = "{stem}_{name}_model"  # a folder format's folder, from the file's stem and the format's name
    file_name: str = ""  # the name of the file in its folder where the format fixes it (saved_model.pb)
    refusal: str = ""  # why it refuses the OPTIONS it does not take: "--tflite <refusal>; leave out --half, ..."
    fp16_weights_only: bool = False  # --half stores fp16 weights of the fp32 graph, so fp16 raw outputs move
    cannot_run: Callable = lambda: None  # why this machine cannot run such a file (Core ML off macOS), or None
    cannot_write: Callable = lambda: None  # why it cannot write one (TensorRT without a GPU), or None
    describe: Callable = None  # describe(path): one line on a file this machine cannot run (Core ML: its spec)

    @property
    def flag(self):
        """export.py's flag: --saved-model for the row saved_model (argparse stores it under the row's name)."""
        return "--" + self.name.replace("_", "-")

    def packages(self, precision="fp32"):
        """Everything that writing and checking a file in `precision` needs, in the order of its pip line."""
        return self.write_packages + self.run_packages + (self.int8_packages if precision == "int8" else ())


FORMATS = (
    ExportFormat(  # the first row is the default when no format is named
        "onnx",
        "ONNX",
        "ONNX Runtime",
        ".onnx",
        write_onnx,
        load_onnx,
        benchmark=("fp32", "int8"),
        run_packages=(ONNXRUNTIME,),
        write_packages=(ONNX,),
    ),
    ExportFormat(
        "torchscript",
        "TorchScript",
        "TorchScript",
        ".torchscript",
        write_torchscript,
        load_torchscript,
        options=("half", "nms", "dynamic"),
        refusal="exports the float network (fp32, or fp16 with --half)",
    ),
    ExportFormat(
        "openvino",
        "OpenVINO",
        "OpenVINO",
        ".xml",
        write_openvino,
        load_openvino,
        benchmark=("fp32", "fp16", "int8"),
        run_packages=(OPENVINO,),
        write_packages=(ONNX,),  # converted from the fp32 ONNX graph
        int8_packages=(NNCF,),
        folder=True,
        fp16_weights_only=True,
    ),
    ExportFormat(
        "tflite",
        "TFLite",
        "LiteRT",
        ".tflite",
        write_tflite,
        load_tflite,
        options=(),
        run_packages=(LITERT,),
        write_packages=(LITERT_TORCH,),
        refusal="exports the fp32 network at a fixed size",
    ),
    ExportFormat(
        "ncnn",
        "NCNN",
        "NCNN",
        ".param",
        write_ncnn,
        load_ncnn,
        options=("half",),
        run_packages=(NCNN,),
        write_packages=(PNNX,),
        folder=True,
        refusal="exports the network at a fixed size (fp32, or fp16 weights with --half)",
        fp16_weights_only=True,
    ),
    ExportFormat(
        "mnn",
        "MNN",
        "MNN",
        ".mnn",
        write_mnn,
        load_mnn,
        options=("half",),
        run_packages=(MNN,),
        write_packages=(ONNX,),  # converted from the fp32 ONNX graph
        refusal="exports the network at a fixed size (fp32, or fp16 weights with --half)",
        fp16_weights_only=True,
    ),
    ExportFormat(
        "executorch",
        "ExecuTorch",
        "ExecuTorch",
        ".pte",
        write_executorch,
        load_executorch,
        options=(),
        run_packages=(EXECUTORCH,),
        refusal="exports the fp32 network at a fixed size (XNNPACK)",
    ),
    ExportFormat(
        "coreml",
        "Core ML",
        "Core ML",
        ".mlpackage",
        write_coreml,
        load_coreml,
        options=("half",),
        run_packages=(COREMLTOOLS,),
        refusal="exports the network at a fixed size (fp32, or fp16 compute with --half)",
        cannot_run=not_macos,
        describe=check_coreml_spec,
    ),
    ExportFormat(
        "paddle",
        "PaddlePaddle",
        "Paddle Inference",
        ".pdiparams",
        write_paddle,
        load_paddle,
        options=(),
        run_packages=(PADDLE,),
        write_packages=(X2PADDLE, SIX),
        folder=True,
        refusal="exports the fp32 network at a fixed size",
    ),
    ExportFormat(
        "saved_model",
        "TensorFlow SavedModel",
        "TF SavedModel",
        ".pb",
        write_saved_model,
        load_saved_model,
        options=(),
        run_packages=(TENSORFLOW,),
        write_packages=TENSORFLOW_WRITE,
        folder=True,
        folder_name="{stem}_saved_model",
        file_name="saved_model.pb",
        refusal="exports the fp32 network at a fixed size",
    ),
    ExportFormat(
        "pb",
        "TensorFlow GraphDef",
        "TF GraphDef",
        ".pb",
        write_pb,
        load_pb,
        options=(),
        run_packages=(TENSORFLOW,),
        write_packages=TENSORFLOW_WRITE,
        refusal="exports the fp32 network at a fixed size",
    ),
    ExportFormat(
        "engine",
        "TensorRT",
        "TensorRT",
        ".engine",
        write_engine,
        load_engine,
        options=("half", "int8", "dynamic"),
        benchmark=("fp16", "int8"),
        run_packages=(TENSORRT,),
        write_packages=(ONNX,),
        int8_packages=(ONNXRUNTIME,),  # its QDQ graph is calibrated by ONNX Runtime, as --onnx --int8's
        refusal="builds its engine from the raw network, with NMS after it",
        cannot_run=no_gpu,
        cannot_write=no_gpu,
    ),
)


def by_name(name):
    return next(row for row in FORMATS if row.name == name)


def format_of(path):
    """The row of an exported file (by its name where the format fixes it, saved_model.pb, else by its suffix: a Core
    ML .mlpackage is a folder too) or folder (the folder format whose file it holds: OpenVINO's .xml, NCNN's .param,
    TensorFlow's saved_model.pb), else None."""
    path = Path(path)
    row = next((row for row in FORMATS if row.file_name and path.name == row.file_name), None)
    row = row or next((row for row in FORMATS if not row.file_name and path.suffix == row.suffix), None)
    if row is None and path.is_dir():
        row = next((row for row in FORMATS if row.folder and any(path.glob(row.file_name or f"*{row.suffix}"))), None)
    return row


def installed(module):
    """Whether `module` can be imported, without importing it (a None in sys.modules blocks it, as in the tests)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules without a spec
        return False


def joined(words, conjunction="and"):
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def missing_sentence(what, packages):
    """None when every package is installed, else one sentence: `what` needs the missing ones, then the pip line
    of all `packages` (the whole set for that one format, not the repo's requirements-export.txt)."""
    absent = [package.pip for package in packages if not installed(package.module)]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    line = " ".join(package.pip for package in packages)
    return f"{what} needs {joined(absent)}, which {verb} not installed: pip install {line}"


def a_or_an(word):
    return f"{'an' if word.lstrip('.')[:1].upper() in 'AEIOU' else 'a'} {word}"


def kinds():
    """What load_exported takes, in words: "an .onnx, .torchscript, ... or .engine file or an OpenVINO or NCNN
    folder"."""
    files = [row.suffix for row in FORMATS if not row.folder]
    folders = [row.title for row in FORMATS if row.folder]
    text = f"an {joined(files, 'or')} file" if files else ""
    return text + (f" or {a_or_an(joined(folders, 'or'))} folder" if folders else "")


def output_path(weights, row, precision, folder=None, tag_fp16=False):
    """Where an export is written: best.onnx, best_int8.onnx, best.torchscript, best_openvino_model/best.xml,
    best_int8_openvino_model/best.xml, best.tflite, best_saved_model/saved_model.pb, next to the weights (or in
    `folder`). tag_fp16: best_fp16... too (--benchmark writes both precisions of a format side by side)."""
    weights = Path(weights)
    folder = Path(folder or weights.parent)
    stem = weights.stem + {"int8": "_int8", "fp16": "_fp16" if tag_fp16 else ""}.get(precision, "")
    if row.folder:
        return folder / row.folder_name.format(stem=stem, name=row.name) / (row.file_name or weights.stem + row.suffix)
    return folder / f"{stem}{row.suffix}"


def label(path):
    """What an exported file is called in the report: its file name, or its folder for a folder format."""
    path = Path(path)
    return f"{path.parent.name}/" if format_of(path).folder else path.name


def file_size(path):
    """Bytes on disk: the file, for a folder format every file in its folder (OpenVINO: the .xml and its .bin), for
    a package (Core ML) every file inside it."""
    path = Path(path)
    row = format_of(path)
    if row is not None and row.folder:
        path = path.parent
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
