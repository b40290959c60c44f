"""Tests for export.py: ONNX and TorchScript files agree with PyTorch (raw outputs and detections),
the in-graph NMS agrees with utils.boxes.non_max_suppression, --dynamic works at other sizes and
batches, and a foreign or broken checkpoint gets one sentence.

A randomly initialised network gives flat, near-identical scores (its activations shrink layer
after layer), which would make any comparison of detections vacuous. So the test model gets its
BatchNorm statistics calibrated on test-like images (as if trained on them) and a zero class bias: scores then spread
over 0.1..0.9, there are dozens of detections above 0.3, and they differ from image to image.
"""

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch

import export
from models.predict import load
from models.weights import model_from_checkpoint
from models.yolo import YOLO
from utils.boxes import non_max_suppression
from utils.checkpoints.ours import FORMAT, CheckpointError, save_checkpoint
from utils.export import formats as export_formats
from utils.export import writers as export_writers
from utils.inference import compare_detections, load_exported, postprocess, preprocess

ROOT = Path(__file__).resolve().parents[1]
CONF = 0.3


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: on a busy machine, two spinning threads cost far more than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scene(seed, h=64, w=64):
    """A uint8 RGB image: noise plus a few filled shapes."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    for _ in range(4):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(4, max(h, w) // 3))
        cv2.rectangle(img, (x - r, y - r), (x + r, y + r), colour, -1) if seed % 2 else cv2.circle(
            img, (x, y), r, colour, -1
        )
    return img


def make_checkpoint(path, imgsz=64, scale="n"):
    torch.manual_seed(0)
    model = YOLO(scale, nc=3)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average of the calibration batches
    model.train()
    with torch.no_grad():  # at every size the tests use: the statistics of a 2x2 and a 4x3 map differ
        for k, (h, w) in enumerate([(imgsz, imgsz), (128, 96), (96, 128)]):
            model(batch_of(range(10 * k, 10 * k + 4), h, w))
    for branch in [*model.head.cls, *getattr(model.head, "one2one_cls", [])]:
        torch.nn.init.constant_(branch[-1].bias, 0.0)
    save_checkpoint(
        {
            "format": FORMAT,
            "scale": scale,
            "nc": 3,
            "names": ["ring", "box", "blob"],
            "imgsz": imgsz,
            "model": model.state_dict(),
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One checkpoint exported to ONNX and TorchScript with the default settings."""
    folder = tmp_path_factory.mktemp("export")
    weights = make_checkpoint(folder / "best.pt")
    cv2.imwrite(str(folder / "check.jpg"), cv2.cvtColor(scene(1), cv2.COLOR_RGB2BGR))
    export.main(
        [
            "--weights",
            str(weights),
            "--onnx",
            "--torchscript",
            "--runs",
            "1",
            "--conf",
            str(CONF),
            "--source",
            str(folder / "check.jpg"),
        ]
    )
    return weights


def pytorch_model(weights):
    return model_from_checkpoint(weights).fuse()


def batch_of(seeds, h, w):
    return torch.cat([preprocess(scene(s, h, w), (h, w))[0] for s in seeds])


@pytest.mark.parametrize("suffix", [".onnx", ".torchscript"])
def test_exported_file_matches_pytorch(exported, suffix):
    path = exported.with_suffix(suffix)
    model, other = pytorch_model(exported), load_exported(path)
    assert (
        other["names"] == ["ring", "box", "blob"]
        and other["imgsz"] == (64, 64)
        and other["stride"] == 32
        and other["nms"] is None
    )
    x = batch_of([2], 64, 64)  # an image the check in export.py did not see
    with torch.no_grad():
        raw = model(x)
    theirs = other["run"](x)
    assert theirs.shape == raw.shape and torch.allclose(theirs, raw, rtol=1e-4, atol=1e-3)
    reference, detections = non_max_suppression(raw, CONF)[0], non_max_suppression(theirs, CONF)[0]
    assert len(reference) >= 5, "the test model should produce detections, else the comparison means nothing"
    boxes, scores, unmatched = compare_detections(reference, detections, CONF)
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4  # boxes reach ~200 px


def test_yolo11_with_its_attention_stage_exports_to_onnx(tmp_path):
    weights = make_checkpoint(tmp_path / "best.pt", scale="11n")
    export.main(["--weights", str(weights), "--onnx", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    x = batch_of([3], 64, 64)
    with torch.no_grad():
        raw = pytorch_model(weights)(x)
    theirs = load_exported(weights.with_suffix(".onnx"))["run"](x)
    assert theirs.shape == raw.shape and torch.allclose(theirs, raw, rtol=1e-4, atol=1e-3)


def test_yolo26_graph_outputs_its_final_detections_without_nms(tmp_path):
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=160, scale="26n")
    path = weights.with_suffix(".onnx")
    # --nms: the one-to-many head and NMS in the graph, checked against PyTorch's one-to-many head + NMS
    export.main(["--weights", str(weights), "--onnx", "--nms", "--runs", "1", "--conf", str(CONF)])
    with_nms = load_exported(path)
    assert not with_nms["end2end"] and with_nms["nms"] is not None
    assert "NonMaxSuppression" in {n.op_type for n in onnx.load(str(path)).graph.node}
    network = pytorch_model(weights)
    network.end2end = False
    x = batch_of([3], 160, 160)
    with torch.no_grad():
        expected = non_max_suppression(network(x), CONF, 0.7)[0]
    got = postprocess(with_nms["run"](x), with_nms, CONF)[0]
    assert len(expected) >= 5 and compare_detections(expected, got, CONF)[2] == 0
    export.main(["--weights", str(weights), "--onnx", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    graph = onnx.load(str(path))
    assert [d.dim_value for d in graph.graph.output[0].type.tensor_type.shape.dim] == [1, 300, 6]  # 525 anchors
    assert "TopK" in {n.op_type for n in graph.graph.node} and "NonMaxSuppression" not in {
        n.op_type for n in graph.graph.node
    }
    # --int8: every convolution, the one-to-one head's too, is quantized; the decoding and the top-k stay float
    assert not [n.name for n in graph.graph.node if n.op_type == "Conv" and export_writers.keep_float(n.name)]
    last = next(n for n in graph.graph.node if graph.graph.output[0].name in n.output)  # boxes, scores, classes
    assert export_writers.keep_float(last.name) and all(
        export_writers.keep_float(n.name) for n in graph.graph.node if n.op_type == "TopK"
    )
    exported = load_exported(path)
    assert exported["end2end"] and exported["nms"] is None
    checkpoint = load(weights, nms=True)  # the .pt with --nms: per anchor, NMS after (postprocess asks end2end)
    assert not checkpoint["end2end"] and checkpoint["run"](x).shape == (1, 525, 4 + 3)
    with pytest.raises(CheckpointError, match="best.onnx was exported end-to-end .* no one-to-many head"):
        load(path, nms=True)  # val.py / detect.py --nms: the graph has no other head to run
    x = batch_of([3], 160, 160)
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported["run"](x)
    assert torch.allclose(theirs[..., 4], ours[..., 4], atol=1e-4)  # scores, best first
    detections = postprocess(theirs, exported, CONF)[0]  # no NMS: the rows above the threshold, as they come
    assert 5 <= len(detections) <= 300 and torch.equal(detections, theirs[0, : len(detections)])
    boxes, scores, unmatched = compare_detections(ours[0][ours[0, :, 4] > CONF], detections, CONF)
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4


def test_yolo26_variant_with_dfl_exports_its_final_detections(tmp_path):
    """26n-dw (DFL's 16 bins per side, depthwise box branch): the expectation over the bins is in the end-to-end
    graph, which gives PyTorch's detections (export.py's own check, then here)."""
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=96, scale="26n-dw")
    export.main(["--weights", str(weights), "--onnx", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    exported, x = load_exported(weights.with_suffix(".onnx")), batch_of([3], 96, 96)
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported["run"](x)
    assert exported["end2end"] and theirs.shape == ours.shape == (1, 189, 6)
    boxes, scores, unmatched = compare_detections(
        ours[0][ours[0, :, 4] > CONF], postprocess(theirs, exported, CONF)[0], CONF
    )
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4


def test_tflite_of_yolo26_gives_its_final_detections(tmp_path):
    """litert-torch converts the end-to-end graph (TopK and gathers, no NMS); export.py's check holds the file to
    PyTorch's detections, and the metadata appended to the flatbuffer is read back."""
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=96, scale="26n")
    for refused in ("--half", "--int8", "--dynamic"):
        with pytest.raises(SystemExit, match="--tflite exports the fp32 network at a fixed size"):
            export.main(["--weights", str(weights), "--tflite", refused])
    export.main(["--weights", str(weights), "--tflite", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    exported = load_exported(weights.with_suffix(".tflite"))
    assert exported["backend"] == "LiteRT" and exported["end2end"] and exported["imgsz"] == (96, 96)
    assert exported["names"] == ["ring", "box", "blob"]
    x = batch_of([3, 4], 96, 96)  # two images through a file exported for one: run in chunks
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported["run"](x)
    assert theirs.shape == ours.shape == (2, 189, 6)  # 189 anchors at 96 px: all of them
    assert torch.allclose(theirs[..., 4], ours[..., 4], atol=1e-4)
    for a, b in zip(ours, postprocess(theirs, exported, CONF)):
        boxes, scores, unmatched = compare_detections(a[a[:, 4] > CONF], b, CONF)
        assert len(b) >= 5 and unmatched == 0 and boxes < 1e-2 and scores < 1e-4


def test_onnx_graph_is_fused_and_carries_metadata(exported):
    graph = onnx.load(str(exported.with_suffix(".onnx")))
    ops = {node.op_type for node in graph.graph.node}
    assert "Conv" in ops and not ops & {"BatchNormalization", "Dropout"}
    meta = {p.key for p in graph.metadata_props}
    assert {"names", "imgsz", "stride", "input_names", "output_names", "input_shapes", "output_shapes"} <= meta


def test_nms_graph_matches_python_nms_with_dynamic_shapes(exported, tmp_path):
    weights = tmp_path / "nms.pt"
    weights.write_bytes(exported.read_bytes())
    max_det = 8  # small, so that the cap is exercised
    export.main(
        [
            "--weights",
            str(weights),
            "--onnx",
            "--nms",
            "--dynamic",
            "--max-det",
            str(max_det),
            "--conf",
            str(CONF),
            "--runs",
            "1",
        ]
    )
    graph = onnx.load(str(weights.with_suffix(".onnx")))
    assert "NonMaxSuppression" in {node.op_type for node in graph.graph.node}
    model, other = pytorch_model(weights), load_exported(weights.with_suffix(".onnx"))
    for seeds, h, w in [([3], 64, 64), ([4, 5, 6], 96, 128)]:  # two batch sizes, two image sizes
        x = batch_of(seeds, h, w)
        with torch.no_grad():
            reference = non_max_suppression(model(x), CONF, max_det=max_det)
        out = other["run"](x)
        assert out.shape == (len(seeds), max_det, 6)
        for ref, rows in zip(reference, out):
            found = rows[rows[:, 4] > 0]
            assert len(found) == len(ref) > 0 and (rows[len(found) :] == 0).all()  # best first, zero padding after
            boxes, scores, unmatched = compare_detections(ref, found, CONF)
            assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4  # boxes reach ~200 px
    # No box above the threshold at all: an empty selection must run, not crash.
    export.main(["--weights", str(weights), "--onnx", "--nms", "--dynamic", "--conf", "0.9999", "--runs", "1"])
    assert (load_exported(weights.with_suffix(".onnx"))["run"](batch_of([7, 8], 64, 96)) == 0).all()


def test_dynamic_at_two_sizes_and_batches(exported, tmp_path):
    weights = tmp_path / "dynamic.pt"
    weights.write_bytes(exported.read_bytes())
    export.main(["--weights", str(weights), "--onnx", "--torchscript", "--dynamic", "--runs", "1"])
    model = pytorch_model(weights)
    for suffix in (".onnx", ".torchscript"):
        other = load_exported(weights.with_suffix(suffix))
        for seeds, h, w in [([1], 64, 64), ([2, 3], 128, 96)]:
            x = batch_of(seeds, h, w)
            with torch.no_grad():
                raw = model(x)
            theirs = other["run"](x)
            assert theirs.shape == raw.shape and torch.allclose(theirs, raw, rtol=1e-4, atol=1e-3)


def test_half_export_on_the_cpu_runs_in_onnx_runtime_and_matches_pytorch(exported, tmp_path):
    """--half was refused on the CPU, and where it ran it crashed the exporter or wrote a graph ONNX Runtime
    refused (INVALID_GRAPH: the anchors' arange in fp16 became a float16 Range). Now the weights, the input and
    the network are fp16, the decode fp32, and ONNX Runtime's CPU provider runs the file."""
    weights = tmp_path / "half.pt"
    weights.write_bytes(exported.read_bytes())
    for options in (["--torchscript"], ["--dynamic"]):  # each exits if its file and PyTorch disagree beyond 1e-2
        export.main(["--weights", str(weights), "--onnx", "--half", "--runs", "1", "--conf", str(CONF), *options])
    graph = onnx.load(str(weights.with_suffix(".onnx")))
    dtype_of = {t.name: t.data_type for t in graph.graph.initializer}
    conv_weights = {dtype_of[node.input[1]] for node in graph.graph.node if node.op_type == "Conv"}
    assert conv_weights == {onnx.TensorProto.FLOAT16}
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert graph.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    other = load_exported(weights.with_suffix(".onnx"))
    assert other["half"] and other["dynamic"]
    model = pytorch_model(weights)
    half = pytorch_model(weights).half()
    for seeds, h, w in [([1, 2, 3, 4], 64, 64), ([3, 5], 96, 128)]:
        x = batch_of(seeds, h, w)
        with torch.no_grad():
            reference, in_half = model(x), half(x.half())
        theirs = other["run"](x)
        assert theirs.dtype == torch.float32 and theirs.shape == reference.shape
        # This random network amplifies fp16 rounding (relative error 6e-4 after the stem, 1e-2 after SPPF), on
        # some images up to whole DFL bins: the file is held to the accuracy of PyTorch's own fp16 model.
        assert (theirs - reference).abs().max() <= 2 * (in_half - reference).abs().max()
        if h == 64:  # the size the export checked, where fp16 stays close to fp32 on these images
            for ref, found in zip(non_max_suppression(reference, CONF), non_max_suppression(theirs, CONF)):
                boxes, scores, unmatched = compare_detections(ref, found, CONF)
                assert len(ref) >= 5 and unmatched == 0 and boxes < 0.25 and scores < 2e-3


def test_disagreement_exits_non_zero(exported, tmp_path, monkeypatch):
    weights = tmp_path / "bad.pt"
    weights.write_bytes(exported.read_bytes())
    real = export.load_exported

    def off_by_a_pixel(path, device):
        model = real(path, device)
        run = model["run"]
        return {**model, "run": lambda x: run(x) + 1.0}

    monkeypatch.setattr(export, "load_exported", off_by_a_pixel)
    with pytest.raises(SystemExit, match="disagree"):
        export.main(["--weights", str(weights), "--onnx", "--runs", "1"])


def test_cli(exported, tmp_path):
    weights = tmp_path / "cli.pt"
    weights.write_bytes(exported.read_bytes())
    done = subprocess.run(
        [sys.executable, "export.py", "--weights", str(weights), "--runs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert weights.with_suffix(".onnx").exists() and "max |diff|" in done.stdout and "median" in done.stdout
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    done = subprocess.run(
        [sys.executable, "export.py", "--weights", str(foreign)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode != 0 and done.stderr.strip().splitlines() == [
        f"error: {foreign} is not a checkpoint of this repo (no '{FORMAT}' format tag); train one with train.py"
    ]


def test_bad_checkpoints_get_one_sentence(exported, tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint at all" * 10)
    wrong = tmp_path / "wrong.pt"  # our tag, but the weights do not fit the model it names
    save_checkpoint(
        {
            "format": FORMAT,
            "scale": "n",
            "nc": 5,
            "names": list("abcde"),
            "imgsz": 64,
            "model": torch.load(exported, weights_only=True)["model"],
        },
        wrong,
    )
    for path in (broken, wrong, tmp_path / "missing.pt"):
        with pytest.raises(SystemExit) as exit_info:
            export.main(["--weights", str(path), "--onnx"])
        message = str(exit_info.value.code)
        assert message.startswith("error: ") and str(path) in message and "\n" not in message, message


def test_every_format_comes_from_one_table(tmp_path, monkeypatch):
    """export.py's flags, what --benchmark writes, the file names and load_exported's dispatch all read
    utils/export_formats.FORMATS: a row added there is offered, benchmarked, named and opened with nothing else."""
    rows = export_formats.FORMATS
    assert len({row.name for row in rows}) == len({row.suffix for row in rows}) == len(rows)
    assert all(callable(row.write) and callable(row.load) and row.suffix.startswith(".") for row in rows)
    parsed = vars(export.parse_args([]))
    assert all(parsed[row.name] is False for row in rows)
    benchmark = export.jobs_of(export.parse_args(["--benchmark"]))
    assert {(row.name, p) for row, p in benchmark} <= {(row.name, p) for row in rows for p in row.benchmark}
    opened = []

    def load_npz(path, device):
        opened.append(path)
        return {"names": ["a"], "run": None}

    new = export_formats.ExportFormat("npz", "NumPy", "NumPy", ".npz", write=print, load=load_npz, options=("half",))
    new = dataclasses.replace(new, benchmark=("fp32", "fp16"), refusal="is a test row")
    monkeypatch.setattr(export_formats, "FORMATS", (*rows, new))
    assert export.jobs_of(export.parse_args(["--npz", "--half"])) == [(new, "fp16")]  # its flag
    benchmark = export.jobs_of(export.parse_args(["--benchmark"]))
    assert [job for job in benchmark if job[0] is new] == [(new, "fp32"), (new, "fp16")]
    weights = tmp_path / "best.pt"
    assert export_formats.output_path(weights, new, "int8") == tmp_path / "best_int8.npz"
    with pytest.raises(SystemExit, match=r"^error: --npz is a test row; leave out --int8, --nms, --dynamic$"):
        export.check_request(export.parse_args(["--weights", str(make_checkpoint(weights)), "--npz", "--nms"]))
    path = tmp_path / "best.npz"
    path.write_bytes(b"")
    model = load_exported(path)
    assert opened == [path] and model["backend"] == "NumPy" and model["names"] == ["a"]
    other = tmp_path / "best.h5"
    other.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"must be a \.pt checkpoint, an \.onnx, .* or \.npz file or an Open"):
        load_exported(other)


def test_a_missing_package_is_one_sentence_with_the_pip_line_of_that_format(tmp_path, monkeypatch, capsys):
    """Each format names only its own packages (not requirements-dev.txt, ~0.9 GB with litert-torch), looked up
    with importlib.util.find_spec before anything is loaded or written."""
    weights = make_checkpoint(tmp_path / "best.pt")
    find_spec, absent = importlib.util.find_spec, {"onnxruntime", "nncf", "litert_torch"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else find_spec(name, *a))
    expected = {
        "--onnx": "--onnx needs onnxruntime, which is not installed: pip install onnx onnxruntime",
        "--onnx --int8": "--onnx --int8 needs onnxruntime, which is not installed: pip install onnx onnxruntime",
        "--openvino --int8": "--openvino --int8 needs nncf, which is not installed: pip install onnx openvino nncf",
        "--tflite": "--tflite needs litert-torch, which is not installed: pip install litert-torch ai-edge-litert",
    }
    for flags, sentence in expected.items():
        with pytest.raises(SystemExit) as exit_info:
            export.main(["--weights", str(weights), *flags.split()])
        assert exit_info.value.code == f"error: {sentence}"  # a string: exit status 1, printed without a traceback
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # nothing written
    export.jobs_of(export.parse_args(["--benchmark"]))
    notes = capsys.readouterr().out.splitlines()
    note = "OpenVINO int8 needs nncf, which is not installed: pip install onnx openvino nncf"
    assert f"note: left out of the benchmark: {note}" in notes
    assert not any("OpenVINO fp32" in note for note in notes)
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"")
    with pytest.raises(CheckpointError) as error:
        load_exported(onnx_file)
    sentence = f"{onnx_file} (an ONNX model) needs onnxruntime, which is not installed: pip install onnxruntime"
    assert str(error.value) == sentence
    monkeypatch.undo()
    done = subprocess.run(  # the command line: exit status 1, the one sentence, no traceback
        [sys.executable, "-c", "import sys; sys.modules['onnxruntime'] = None; import export; export.main()"]
        + ["--weights", str(weights)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"error: {expected['--onnx']}"], done.stderr
