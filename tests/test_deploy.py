"""Deployment (issue 24): every format export.py runs here (TorchScript, ONNX, ONNX INT8, OpenVINO fp32/fp16/INT8,
TFLite, NCNN, MNN, ExecuTorch, Paddle, TensorFlow SavedModel and GraphDef) runs through val.py, detect.py and
models/predict.py like the .pt, carries its metadata, and is scored by the accuracy gate; a broken export fails the
gate in one sentence and is renamed so that nothing ships it; a missing OpenVINO is one sentence.

A mAP needs a model that finds something in a labelled set. Training one would take minutes, so the set is
labelled by the test model itself (the calibrated random model of calibrated_model.py): its detections above 0.3 on
each image are that image's ground truth. The .pt then scores a high mAP, and an export that moves boxes or scores
loses some of it, which is what the gate measures.
"""

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import warm_python
from calibrated_model import labelled_checkpoint, make_checkpoint, one_thread, scene  # noqa: F401 (one_thread)
from runtimes import needs

import export
from models.predict import load, predict
from models.weights import load_weights
from utils.checkpoints.ours import CheckpointError
from utils.export import formats as export_formats
from utils.export import writers as export_writers
from utils.inference import compare_detections, load_exported

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["ring", "box", "blob"]
FORMATS = {  # --benchmark's files, by the label the table gives them
    ("TorchScript", "fp32"): "best.torchscript",
    ("ONNX Runtime", "fp32"): "best.onnx",
    ("ONNX Runtime", "int8"): "best_int8.onnx",
    ("OpenVINO", "fp32"): "best_openvino_model",
    ("OpenVINO", "fp16"): "best_fp16_openvino_model",
    ("OpenVINO", "int8"): "best_int8_openvino_model",
    ("LiteRT", "fp32"): "best.tflite",
    ("NCNN", "fp32"): "best_ncnn_model",
    ("MNN", "fp32"): "best.mnn",
    ("ExecuTorch", "fp32"): "best.pte",
    ("Paddle Inference", "fp32"): "best_paddle_model",
    ("TF SavedModel", "fp32"): "best_saved_model",
    ("TF GraphDef", "fp32"): "best.pb",
}
# the tests of the benchmark fixture's files need each of their formats' packages, INT8's too
EVERY = needs(*(row.name for row in export_formats.FORMATS if row.runtime in {b for b, _ in FORMATS}), int8=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """best.pt whose checkpoint names a dataset (train 12, val 8 images) that it scores a high mAP on."""
    return labelled_checkpoint(tmp_path_factory.mktemp("deploy"), NAMES, train=range(100, 112))


@pytest.fixture(scope="module")
def benchmark(trained):
    """export.py --benchmark once: every format in <stem>_benchmark/, scored and timed at the checkpoint's 64 px, and
    what it printed (an INT8 file beyond the gate makes it exit non-zero after the table: its sentence is appended)."""
    printed = io.StringIO()
    command = ["--weights", str(trained), "--benchmark", "--runs", "1", "--calib-images", "12", "--latency-imgsz", "64"]
    with contextlib.redirect_stdout(printed):
        try:
            export.main(command)
        except SystemExit as e:
            print(e.code)
    return trained.parent / "best_benchmark", printed.getvalue()


def table_rows(printed, latency=False):
    """{(format, precision): (size MB, mAP50-95, mAP50)} from the benchmark table; latency: {(format, precision):
    [(ms, speed-up) at each size]} instead."""
    rows = {}
    for line in printed.splitlines():
        m = re.match(
            r"(PyTorch|TorchScript|ONNX Runtime|OpenVINO|LiteRT|NCNN|MNN|ExecuTorch|Paddle Inference|TF SavedModel|"
            r"TF GraphDef)"
            r"\s+(fp32|fp16|int8)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)((\s+[\d.]+\s+[\d.]+x)+)$",
            line,
        )
        if m:
            timed = [(float(ms), float(x)) for ms, x in re.findall(r"([\d.]+)\s+([\d.]+)x", m[6])]
            rows[m[1], m[2]] = timed if latency else tuple(float(v) for v in m.groups()[2:5])
    return rows


def run_val(weights, out, *options):
    done = warm_python.run(
        [sys.executable, "val.py", "--weights", str(weights), "--out", str(out), "--workers", "0", *options],
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


@EVERY
def test_benchmark_table_has_every_format_and_the_gate_holds(benchmark):
    folder, printed = benchmark
    rows = table_rows(printed)
    assert set(rows) == {("PyTorch", "fp32"), *FORMATS}, printed
    reference = rows["PyTorch", "fp32"][1]
    assert reference > 0.5, printed  # the set is labelled by the model: a vacuous 0 would hide any drop
    for key, name in FORMATS.items():
        assert (folder / name).exists()
        if key[1] != "int8":  # float formats: within the default gate of 0.002
            assert reference - rows[key][1] <= 0.002, (key, printed)
    assert rows["OpenVINO", "fp16"][0] < 0.6 * rows["OpenVINO", "fp32"][0]  # fp16 weights: half the file
    for note in ("Core ML fp32: Core ML runs only on macOS", "TensorRT fp16: TensorRT builds and runs engines on an"):
        assert f"note: left out of the benchmark: {note}" in printed  # what it cannot run here, and why
    assert rows["ONNX Runtime", "int8"][0] < 0.6 * rows["ONNX Runtime", "fp32"][0]  # int8 weights: a quarter + scales


@needs("openvino", int8=True)
def test_benchmark_times_every_format_again_at_each_latency_size(trained, tmp_path, monkeypatch):
    """--latency-imgsz: at each size that is not the scored one, every format is written again (INT8 calibrated at
    that size) into <stem>_benchmark/<size>px/, checked against PyTorch and timed there; one latency and speed-up
    column per size. Two formats (their three precisions each) keep the test short: the loop is the same for all."""
    weights = tmp_path / "best.pt"
    shutil.copy(trained, weights)
    rows = {row.name: row for row in export_formats.FORMATS}
    monkeypatch.setattr(export_formats, "FORMATS", (rows["onnx"], rows["openvino"]))
    printed = io.StringIO()
    command = ["--weights", str(weights), "--benchmark", "--runs", "1", "--calib-images", "12"]
    with contextlib.redirect_stdout(printed):
        export.main([*command, "--latency-imgsz", "64", "96"])
    printed = printed.getvalue()
    assert "64 px ms  speed-up 96 px ms  speed-up" in printed, printed
    latency = table_rows(printed, latency=True)
    files = {key: name for key, name in FORMATS.items() if key[0] in ("ONNX Runtime", "OpenVINO")}
    assert set(latency) == {("PyTorch", "fp32"), *files}, printed
    assert [speed_up for _, speed_up in latency["PyTorch", "fp32"]] == [1.0, 1.0]  # the speed-ups are over it
    for key, name in files.items():
        assert len(latency[key]) == 2 and all(ms > 0 for ms, _ in latency[key]), (key, printed)
        exported = load_exported(weights.parent / "best_benchmark" / "96px" / name)  # its own file, at 96 px
        assert tuple(exported.imgsz) == (96, 96), key
    with pytest.raises(SystemExit, match="--latency-imgsz 100: each size must be a positive multiple of the stride"):
        export.main([*command, "--latency-imgsz", "100"])


@EVERY
@pytest.mark.parametrize("key", [("OpenVINO", "int8"), ("ONNX Runtime", "fp32"), ("LiteRT", "fp32"), ("NCNN", "fp32")])
def test_val_py_scores_an_exported_file_as_the_gate_did(benchmark, key, tmp_path):
    """val.py needs no --data or --imgsz for an exported file (its metadata names them) and prints the mAP the
    gate computed on the same images."""
    folder, printed = benchmark
    metrics = run_val(folder / FORMATS[key], tmp_path / "val")
    assert metrics["mAP50-95"] == pytest.approx(table_rows(printed)[key][1], abs=1e-4)


@EVERY
def test_metadata_round_trip(benchmark):
    folder, _ = benchmark
    for (backend, precision), name in FORMATS.items():
        model = load_exported(folder / name)
        assert model.backend == backend
        assert model.names == NAMES and model.imgsz == (64, 64) and model.stride == 32
        assert model.int8 == (precision == "int8") and model.half == (precision == "fp16")
        assert model.data.endswith("set.yaml") and model.dynamic is False and model.end2end is False
    xml = folder / "best_openvino_model" / "best.xml"  # in the IR itself, not in a file beside it
    assert "yolo_flat" in xml.read_text() and sorted(p.name for p in xml.parent.iterdir()) == ["best.bin", "best.xml"]


@EVERY
def test_detect_and_predict_on_openvino_give_the_boxes_of_the_pt(trained, benchmark, tmp_path):
    folder, _ = benchmark
    images = trained.parent.parent / "set" / "val" / "images"
    texts = {}
    for weights in (trained, folder / "best_openvino_model"):
        out = tmp_path / weights.name
        done = warm_python.run(
            [sys.executable, "detect.py", "--weights", str(weights), "--source", str(images), "--save-txt"]
            + ["--out", str(out), "--conf", "0.3"],
            cwd=ROOT,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        texts[weights.name] = {p.name: np.loadtxt(p, ndmin=2) for p in sorted((out / "labels").glob("*.txt"))}
    pt, ov = texts.values()
    assert pt.keys() == ov.keys() and sum(len(v) for v in pt.values()) > 10
    for name in pt:  # class cx cy w h conf; the same rows, in the same order
        assert pt[name].shape == ov[name].shape and np.abs(pt[name] - ov[name]).max() < 1e-3, name
    image = str(next(images.iterdir()))
    ours, theirs = predict(load(trained), image, conf=0.3), predict(load(folder / "best_openvino_model"), image, 0.3)
    as_rows = [np.c_[r.boxes, r.scores, r.classes] for r in (ours, theirs)]
    boxes, scores, unmatched = compare_detections(*(torch.from_numpy(r).float() for r in as_rows), conf=0.3)
    assert len(ours.scores) > 0 and boxes < 1e-2 and scores < 1e-4 and unmatched == 0


def test_a_broken_export_fails_the_gate_in_one_sentence(trained, tmp_path, monkeypatch, capsys):
    """A weight corrupted in the written file (as a bad conversion would) fails the raw check and the gate; the
    gate's sentence names the file, the format, both figures and what to try."""
    weights = tmp_path / "best.pt"
    weights.write_bytes(trained.read_bytes())
    write = export_writers.export_onnx

    def corrupted(module, x, path, args, metadata):
        write(module, x, path, args, metadata)
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(str(path))
        for init in graph.graph.initializer:  # the class convolutions of the first level: scores go wrong
            if init.name.startswith("head.cls.0.2"):
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 0 + 0.05, init.name))
        onnx.save(graph, str(path))

    monkeypatch.setattr(export_writers, "export_onnx", corrupted)
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--weights", str(weights), "--onnx", "--runs", "1"])
    lines = str(exit_info.value.code).splitlines()
    gate = [line for line in lines if "--max-map-drop" in line]
    assert len(gate) == 1 and re.fullmatch(
        r"error: best\.onnx \(ONNX Runtime fp32\) scores mAP50-95 0\.\d{4} against the checkpoint's 0\.\d{4} on 8 "
        r"val images, a drop of 0\.\d{4} > --max-map-drop 0\.002: the export is broken: .*",
        gate[0],
    ), lines
    assert any("disagree" in line for line in lines)
    # the file that failed keeps no name that ships: val.py, detect.py and a glob for *.onnx pass it by
    assert lines[-1].endswith("; the file is renamed best.onnx.rejected, where nothing picks it up as a model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.onnx.rejected", "best.pt"]


def test_int8_gate_fails_with_its_advice(trained, tmp_path):
    """--max-map-drop below any drop the INT8 file can have: the sentence says what to try for INT8."""
    weights = tmp_path / "best.pt"
    weights.write_bytes(trained.read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        export.main(
            ["--weights", str(weights), "--onnx", "--int8", "--runs", "1", "--calib-images", "4"]
            + ["--max-map-drop", "-1", "--val-images", "3"]
        )
    message = str(exit_info.value.code)
    assert "\n" not in message and message.startswith("error: best_int8.onnx (ONNX Runtime int8) scores mAP50-95 ")
    assert "on 3 val images" in message and message.endswith(
        "export without --int8, or calibrate on more images (--calib-images); the file is renamed "
        "best_int8.onnx.rejected, where nothing picks it up as a model"
    )
    assert not list(tmp_path.glob("*.onnx")) and (tmp_path / "best_int8.onnx.rejected").is_file()


@EVERY
def test_missing_openvino_is_one_sentence(trained, benchmark, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--weights", str(trained), "--openvino"])
    # the pip line of that format alone, not requirements-export.txt (every format's, ~4 GB)
    sentence = "--openvino needs openvino, which is not installed: pip install onnx openvino"
    assert str(exit_info.value.code) == f"error: {sentence}"
    sentence = r"best_openvino_model \(an OpenVINO model\) needs openvino, which is not installed: pip install openvino"
    with pytest.raises(CheckpointError, match=rf"^\S+{sentence}$"):
        load(benchmark[0] / "best_openvino_model")


@EVERY
def test_tflite_without_its_packages_and_a_foreign_tflite_are_one_sentence(trained, benchmark, tmp_path, monkeypatch):
    foreign = tmp_path / "other.tflite"  # a TFLite file without our metadata: a model from elsewhere
    foreign.write_bytes((benchmark[0] / "best.tflite").read_bytes().split(b"PK\x03\x04")[0])
    with pytest.raises(CheckpointError, match=r"other\.tflite has no metadata from this repo's export\.py"):
        load(foreign)
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(CheckpointError, match=r"garbage\.tflite has no metadata"):
        load(garbage)
    monkeypatch.setitem(sys.modules, "litert_torch", None)
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--weights", str(trained), "--tflite"])
    assert str(exit_info.value.code) == (
        "error: --tflite needs litert-torch, which is not installed: pip install litert-torch ai-edge-litert"
    )
    for module in ("ai_edge_litert", "ai_edge_litert.interpreter"):  # imported by the tests before: both
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        CheckpointError, match=r"best\.tflite \(a TFLite model\) needs ai-edge-litert, .*: pip install ai-edge-litert$"
    ):
        load(benchmark[0] / "best.tflite")


@EVERY
@torch.no_grad()
def test_the_tflite_file_holds_its_anchor_grid_as_constants_and_the_fixed_grid_answers_as_the_computed_one(
    trained, benchmark
):
    """litert-torch keeps the ops that build the anchor grid, which cost the file 1-3% of its time at 320 px against
    Ultralytics' (bench/RESULTS.md): the writer gives the head its grid as constants (Detect.fixed_anchors), which
    must answer exactly as the grid computed from the maps."""
    from ai_edge_litert.interpreter import Interpreter

    ops = {op["op_name"] for op in Interpreter(model_path=str(benchmark[0] / "best.tflite"))._get_ops_details()}
    assert not ops & {"RANGE", "BROADCAST_TO"}, sorted(ops)
    network = load_weights(trained).model.eval()
    x = torch.rand(2, 3, 96, 128)
    computed = network(x)
    network.head.fix_anchors(96, 128)
    assert network.head.fixed_anchors[0].shape == (12 * 16 + 6 * 8 + 3 * 4, 2)
    assert torch.equal(network(x), computed)
