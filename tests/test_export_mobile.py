"""The phone, Paddle and NVIDIA formats of export.py: NCNN, MNN, ExecuTorch and Paddle written, run and held to
PyTorch's outputs
(YOLOv8 and YOLO26's end-to-end graph, fp16 weights where the format takes --half); Core ML written with its spec
checked (it runs only on macOS); TensorRT refused in one sentence without a GPU and on the emulated one without its
package; a converter that crashes or a truncated file is one sentence and leaves nothing half-written."""

import json
import sys

import pytest
import torch
from calibrated_model import (  # noqa: F401 (one_thread: autouse fixture)
    CONF,
    assert_gives_the_final_detections,
    batch_of,
    make_checkpoint,
    one_thread,
    pytorch_model,
)
from cuda_emulator import CudaEmulator
from runtimes import missing, needs

import export
from models.predict import load
from utils.checkpoints.ours import CheckpointError
from utils.export import formats as export_formats
from utils.export import mobile
from utils.inference import load_exported

NAMES = ["ring", "box", "blob"]
FILES = {"ncnn": "best_ncnn_model", "mnn": "best.mnn", "executorch": "best.pte", "paddle": "best_paddle_model"}
EACH = [pytest.param(name, marks=needs(name)) for name in FILES]  # each case skips alone where its runtime is missing


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """YOLOv8n at 64 px exported to every phone format that runs here (export.py exits if a file and PyTorch
    disagree), and the YOLO26n end-to-end graph at 96 px likewise."""
    folders = {}
    for scale, imgsz in (("n", 64), ("26n", 96)):
        weights = make_checkpoint(tmp_path_factory.mktemp(scale) / "best.pt", imgsz=imgsz, scale=scale)
        for name in (name for name in FILES if missing(name) is None):  # the others' tests skip (runtimes.py)
            export.main(["--weights", str(weights), f"--{name}", "--runs", "1", "--conf", str(CONF)])
        folders[scale] = weights
    return folders


@pytest.mark.parametrize("name", EACH)
def test_phone_formats_give_pytorchs_outputs_and_carry_their_metadata(exported, name):
    weights = exported["n"]
    model = load_exported(weights.parent / FILES[name])
    assert model.backend == export_formats.by_name(name).runtime
    assert model.names == NAMES and model.imgsz == (64, 64) and model.stride == 32 and not model.end2end
    x = batch_of([3, 4], 64, 64)  # two images through a file exported for one
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = model.run(x)
    assert theirs.shape == ours.shape == (2, 84, 7) and torch.allclose(theirs, ours, rtol=1e-3, atol=1e-3)
    assert load(weights.parent / FILES[name]).backend == model.backend  # predict() and val.py's entry
    if name == "ncnn":  # DFL's expectation as a weighted sum: NCNN's MatMul ran the model ~25% slower
        assert "MatMul" not in (weights.parent / FILES[name] / "best.param").read_text()


@pytest.mark.parametrize("name", EACH)
def test_yolo26_end_to_end_runs_in_each_phone_format(exported, name):
    """NCNN has no TopK (and x2paddle's graph takes none of its kind): the file answers the one-to-one head per
    anchor and the loader picks the best 300, as the graph does elsewhere; MNN and ExecuTorch run the graph's TopK.
    Each gives PyTorch's final detections."""
    weights = exported["26n"]
    assert_gives_the_final_detections(weights, load_exported(weights.parent / FILES[name]))


@pytest.mark.parametrize("name", EACH[:2])
def test_half_stores_fp16_weights_and_keeps_the_detections(exported, tmp_path, name):
    weights = tmp_path / "best.pt"
    weights.write_bytes(exported["n"].read_bytes())
    export.main(["--weights", str(weights), f"--{name}", "--half", "--runs", "1", "--conf", str(CONF)])
    row = export_formats.by_name(name)
    half, full = export_formats.output_path(weights, row, "fp16"), exported["n"].parent / FILES[name]
    half = half if name == "mnn" else half.parent
    assert export_formats.file_size(half) < 0.6 * export_formats.file_size(full)
    assert load_exported(half).half
    with pytest.raises(SystemExit, match=f"^error: --{name} exports the network at a fixed size .*leave out --int8"):
        export.main(["--weights", str(weights), f"--{name}", "--int8"])


@needs("coreml")
def test_coreml_is_written_with_a_checked_spec_and_refused_to_run_off_macos(tmp_path, capsys, monkeypatch):
    weights = make_checkpoint(tmp_path / "best.pt")
    export.main(["--weights", str(weights), "--coreml", "--runs", "1"])
    package = tmp_path / "best.mlpackage"
    printed = capsys.readouterr().out
    assert package.is_dir() and "best.mlpackage: not run here (Core ML runs only on macOS); its spec: input " in printed
    assert "input images 64x64 RGB image, output output [1, 84, 7]" in printed and "3 class names" in printed
    import coremltools as ct

    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    meta = json.loads(dict(spec.description.metadata.userDefined)[mobile.COREML_METADATA])
    assert json.loads(meta["names"]) == NAMES and json.loads(meta["imgsz"]) == [64, 64]
    with pytest.raises(CheckpointError, match=r"best\.mlpackage \(a Core ML model\) cannot run on this machine: Core"):
        load_exported(package)
    export.main(["--weights", str(weights), "--coreml", "--half", "--runs", "1"])  # fp16 compute, written and checked
    assert "fp16" in str(ct.models.MLModel(str(package), skip_model_load=True).get_spec().mlProgram).lower()
    # a package whose spec is not what the app expects (a shape changed after export) is refused in one sentence
    monkeypatch.setattr(mobile, "parse_metadata", lambda strings, path: {**meta_values(meta), "imgsz": (32, 32)})
    with pytest.raises(export.ExportError, match=r"best\.mlpackage was written wrong: input images is not a 32x32 RGB"):
        mobile.check_coreml_spec(package)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.mlpackage", "best.pt"]  # nothing half-written
    monkeypatch.undo()
    e2e = make_checkpoint(tmp_path / "e2e.pt", imgsz=96, scale="26n")  # YOLO26: its one-to-one head per anchor
    export.main(["--weights", str(e2e), "--coreml", "--runs", "1"])
    assert "e2e.mlpackage: not run here" in capsys.readouterr().out
    spec = ct.models.MLModel(str(tmp_path / "e2e.mlpackage"), skip_model_load=True).get_spec()
    meta = meta_values(json.loads(dict(spec.description.metadata.userDefined)[mobile.COREML_METADATA]))
    assert meta["end2end"] and meta["topk_outside"] == 300 and meta["output_shapes"] == [[1, 189, 7]]


def meta_values(strings):
    return {k: json.loads(v) for k, v in strings.items()}


def test_tensorrt_needs_a_gpu_and_its_package_each_said_in_one_sentence(tmp_path):
    weights = make_checkpoint(tmp_path / "best.pt")
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--weights", str(weights), "--engine", "--half"])
    assert exit_info.value.code == (
        "error: --engine cannot be written on this machine: TensorRT builds and runs engines on an NVIDIA GPU, and "
        "torch sees none here (torch.cuda.is_available()); export --onnx here instead"
    )
    with pytest.raises(SystemExit, match="^error: --workspace sizes the TensorRT builder's memory; give it with"):
        export.main(["--weights", str(weights), "--onnx", "--workspace", "4"])
    with pytest.raises(
        SystemExit, match="^error: --engine builds its engine from the raw network, with NMS after it; leave out --nms$"
    ):
        export.main(["--weights", str(weights), "--engine", "--nms"])
    with CudaEmulator():  # a GPU: the next thing missing is TensorRT itself, named with its pip line
        with pytest.raises(SystemExit) as exit_info:
            export.main(["--weights", str(weights), "--engine", "--int8", "--device", "0", "--workspace", "2"])
    assert exit_info.value.code == (
        "error: --engine --int8 needs tensorrt, which is not installed: pip install onnx tensorrt onnxruntime"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]
    engine = tmp_path / "best.engine"
    engine.write_bytes(b"\xff\xff\xff\x7f" + b"\0" * 64)  # a crafted length: not read as a gigabyte of JSON
    with pytest.raises(CheckpointError, match=r"best\.engine \(a TensorRT model\) cannot run on this machine: Tensor"):
        load_exported(engine)


@needs("ncnn", "mnn", "executorch")
def test_a_crashing_converter_and_truncated_files_are_one_sentence(exported, tmp_path, monkeypatch):
    weights = tmp_path / "best.pt"
    weights.write_bytes(exported["n"].read_bytes())
    import pnnx

    monkeypatch.setattr(pnnx, "EXEC_PATH", sys.executable)  # a "converter" that exits 2 with a usage error
    with pytest.raises(SystemExit, match=r"^error: pnnx could not convert the network to best\.param \(exit status "):
        export.main(["--weights", str(weights), "--ncnn", "--runs", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # nothing half-written beside the weights
    for name in ("mnn", "executorch"):
        good = exported["n"].parent / FILES[name]
        truncated = tmp_path / good.name
        truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
        with pytest.raises(CheckpointError, match=rf"^{truncated}"):
            load_exported(truncated).run(batch_of([3], 64, 64))
    folder = tmp_path / "best_ncnn_model"
    folder.mkdir()
    (folder / "best.param").write_text("7767517\n1 1\nNoSuchLayer x 0 1 in0\n")
    (folder / "best.bin").write_bytes(b"")
    (folder / "metadata.json").write_text((exported["n"].parent / FILES["ncnn"] / "metadata.json").read_text())
    with pytest.raises(CheckpointError, match=r"best\.param and its \.bin are not an NCNN model this ncnn can load"):
        load_exported(folder)


@needs("mnn")
def test_mnns_converter_runs_without_its_logger_which_pip_installs_into_the_users_environment(tmp_path):
    """--mnn runs MNN's converter without importing MNN.tools.mnnconvert, whose telemetry logger runs
    `pip install -U aliyun-log-python-sdk` where that is missing: its protobuf<6 replaced the 6.x that onnx needs, and
    a fresh clone's tests then failed in every file that imports onnx after the MNN export. A `pip` that records being
    called is first on PATH; the converter answers --version, and neither pip nor the logger was reached."""
    import os
    import subprocess

    called = tmp_path / "pip_was_called"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pip").write_text(f"#!/bin/sh\ntouch {called}\n")
    (bin_dir / "pip").chmod(0o755)
    reached = "import sys; print(sorted(m for m in sys.modules if m.startswith(('MNN.tools', 'aliyun'))))"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-c", f"{mobile.MNN_CONVERT}\n{reached}", "--version"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
    assert not called.exists()
