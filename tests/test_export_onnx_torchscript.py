"""export.py to ONNX and TorchScript of one calibrated checkpoint (calibrated_model.py): outputs agree with PyTorch, the
in-graph NMS, --dynamic, --half on the CPU; a disagreement or a bad checkpoint gets one sentence."""

import gc
import os
import subprocess
import sys
import weakref

import cv2
import onnx
import pytest
import torch
from calibrated_model import (
    CONF,
    ROOT,
    batch_of,
    make_checkpoint,
    one_thread,  # noqa: F401 (one_thread: autouse fixture)
    pytorch_model,
    scene,
)

import export
from utils.boxes import non_max_suppression
from utils.checkpoints.ours import FORMAT, save_checkpoint
from utils.export.loaders import onnx_session
from utils.inference import compare_detections, load_exported


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


@pytest.mark.parametrize("suffix", [".onnx", ".torchscript"])
def test_exported_file_matches_pytorch(exported, suffix):
    path = exported.with_suffix(suffix)
    model, other = pytorch_model(exported), load_exported(path)
    assert (
        other.names == ["ring", "box", "blob"] and other.imgsz == (64, 64) and other.stride == 32 and other.nms is None
    )
    x = batch_of([2], 64, 64)  # an image the check in export.py did not see
    with torch.no_grad():
        raw = model(x)
    theirs = other.run(x)
    assert theirs.shape == raw.shape and torch.allclose(theirs, raw, rtol=1e-4, atol=1e-3)
    reference, detections = non_max_suppression(raw, CONF)[0], non_max_suppression(theirs, CONF)[0]
    assert len(reference) >= 5, "the test model should produce detections, else the comparison means nothing"
    boxes, scores, unmatched = compare_detections(reference, detections, CONF)
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4  # boxes reach ~200 px


def test_onnx_graph_is_fused_and_carries_metadata(exported):
    graph = onnx.load(str(exported.with_suffix(".onnx")))
    ops = {node.op_type for node in graph.graph.node}
    assert "Conv" in ops and not ops & {"BatchNormalization", "Dropout"}
    meta = {p.key for p in graph.metadata_props}
    assert {"names", "imgsz", "stride", "input_names", "output_names", "input_shapes", "output_shapes"} <= meta


def test_onnx_graph_multiplies_no_matrix_by_a_vector(exported):
    # DFL's expectation written as probabilities @ bins exports a MatMul with a 1-D operand, which ONNX Runtime ran
    # about 6x slower than the same product with a (bins, 1) matrix: 3 ms of 11n's 38 at 640 px (utils/boxes.py).
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(exported.with_suffix(".onnx"))))
    known = (v for v in (*graph.graph.value_info, *graph.graph.input) if v.type.tensor_type.HasField("shape"))
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in known}
    ranks |= {t.name: len(t.dims) for t in graph.graph.initializer}
    operands = [ranks.get(name) for node in graph.graph.node if node.op_type == "MatMul" for name in node.input]
    assert operands, "the DFL head should multiply its probabilities by the bins"
    assert 1 not in operands


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
        out = other.run(x)
        assert out.shape == (len(seeds), max_det, 6)
        for ref, rows in zip(reference, out):
            found = rows[rows[:, 4] > 0]
            assert len(found) == len(ref) > 0 and (rows[len(found) :] == 0).all()  # best first, zero padding after
            boxes, scores, unmatched = compare_detections(ref, found, CONF)
            assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4  # boxes reach ~200 px
    # No box above the threshold at all: an empty selection must run, not crash.
    export.main(["--weights", str(weights), "--onnx", "--nms", "--dynamic", "--conf", "0.9999", "--runs", "1"])
    assert (load_exported(weights.with_suffix(".onnx")).run(batch_of([7, 8], 64, 96)) == 0).all()


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
            theirs = other.run(x)
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
    assert other.half and other.dynamic
    model = pytorch_model(weights)
    half = pytorch_model(weights).half()
    for seeds, h, w in [([1, 2, 3, 4], 64, 64), ([3, 5], 96, 128)]:
        x = batch_of(seeds, h, w)
        with torch.no_grad():
            reference, in_half = model(x), half(x.half())
        theirs = other.run(x)
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
        run = model.run
        return model.replace(run=lambda x: run(x) + 1.0)

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


def test_onnx_runtime_treats_subnormal_floats_as_zero(exported, tmp_path):
    """Subnormal floats (below 1.2e-38), which some trained networks produce in their activations, take an x86 CPU
    many times longer per op (two YOLO26 checkpoints ran a third slower for it). Running a .onnx flushes them, on
    ONNX Runtime's pool threads and on the thread that runs the file: a large multiply of subnormals gives zeros,
    where a plain session keeps them; and the calling thread's flag is as it was afterwards (hypothesis refuses to
    run in a process that flushes them). In a fresh process: ORT's flushing outlives its sessions within one."""
    x, y = (onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1 << 20]) for n in "xy")
    two = onnx.helper.make_tensor("two", onnx.TensorProto.FLOAT, [1], [2.0])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Mul", ["x", "two"], ["y"])], "mul", [x], [y], [two])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "mul.onnx")
    script = f"""
import numpy as np, onnxruntime, torch
from calibrated_model import batch_of
from utils.export.loaders import onnx_session, subnormals_flushed
from utils.inference import load_exported
tiny, mul = np.full(1 << 20, 1e-39, np.float32), {str(tmp_path / "mul.onnx")!r}
kept = lambda: (torch.tensor([1e-39]) * 2).item() != 0
plain = onnxruntime.InferenceSession(mul, providers=["CPUExecutionProvider"])
assert plain.run(None, {{"x": tiny}})[0].all(), "subnormals kept by default (else this test could not fail)"
session = onnx_session(mul)  # ORT's own threads: how much of an op they run varies, so the option is read back
assert session.get_session_options().get_session_config_entry("session.set_denormal_as_zero") == "1"
assert kept(), "opening the session left the thread flushing (ORT sets the flag where a session is made)"
assert not session.run(None, {{"x": tiny}})[0].any(), "subnormals left by onnx_session"
assert kept(), "running the session left the thread flushing"
with subnormals_flushed():
    assert not kept()
assert kept(), "subnormals_flushed left the thread flushing"
onnx_model = load_exported({str(exported.with_suffix(".onnx"))!r})
seen = []
torch.set_flush_denormal = lambda on, real=torch.set_flush_denormal: seen.append(on) or real(on)
onnx_model.run(batch_of([2], 64, 64))
assert seen == [True, False] and kept(), f"running a .onnx set the flag {{seen}}, not on then back off"
with subnormals_flushed():
    onnx_model.run(batch_of([2], 64, 64))
    assert not kept(), "running a .onnx turned off a flag that was on before it"
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_onnx_session_is_freed_when_dropped_not_by_the_cyclic_collector(exported):
    """A session in a reference cycle waits for the cyclic collector, which may run in a forked DataLoader worker:
    there ONNX Runtime's destructor waits forever for the parent's threads (a val.py after an export check hung so).
    onnx_session's flushing `run` must not hold its session."""
    gc.collect()
    gc.disable()
    try:
        session = onnx_session(exported.with_suffix(".onnx"))
        assert session.run(None, {session.get_inputs()[0].name: batch_of([2], 64, 64).numpy()})[0].shape[0] == 1
        freed = weakref.ref(session)
        del session
        assert freed() is None, "the session outlived its last reference: a cycle holds it"
    finally:
        gc.enable()
