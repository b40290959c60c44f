"""export.py of YOLO11 (its attention stage) to ONNX and of YOLO26's end-to-end graph (final detections without NMS,
--nms, the NMS-free 11n-e2e with DFL) to ONNX and TFLite, held to PyTorch's detections."""

import onnx
import pytest
import torch
from calibrated_model import (
    CONF,
    batch_of,
    make_checkpoint,
    one_thread,  # noqa: F401 (one_thread: autouse fixture)
    pytorch_model,
)
from runtimes import needs

import export
from models.predict import load
from utils.boxes import non_max_suppression
from utils.checkpoints.ours import CheckpointError
from utils.export import writers as export_writers
from utils.inference import compare_detections, load_exported, postprocess


def test_yolo11_with_its_attention_stage_exports_to_onnx(tmp_path):
    weights = make_checkpoint(tmp_path / "best.pt", scale="11n")
    export.main(["--weights", str(weights), "--onnx", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    x = batch_of([3], 64, 64)
    with torch.no_grad():
        raw = pytorch_model(weights)(x)
    theirs = load_exported(weights.with_suffix(".onnx")).run(x)
    assert theirs.shape == raw.shape and torch.allclose(theirs, raw, rtol=1e-4, atol=1e-3)


def test_yolo26_graph_outputs_its_final_detections_without_nms(tmp_path):
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=160, scale="26n")
    path = weights.with_suffix(".onnx")
    # --nms: the one-to-many head and NMS in the graph, checked against PyTorch's one-to-many head + NMS
    export.main(["--weights", str(weights), "--onnx", "--nms", "--runs", "1", "--conf", str(CONF)])
    with_nms = load_exported(path)
    assert not with_nms.end2end and with_nms.nms is not None
    assert "NonMaxSuppression" in {n.op_type for n in onnx.load(str(path)).graph.node}
    network = pytorch_model(weights)
    x = batch_of([3], 160, 160)
    with torch.no_grad():
        expected = non_max_suppression(network(x, mode="per_anchor"), CONF, 0.7)[0]
    got = postprocess(with_nms.run(x), with_nms, CONF)[0]
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
    assert exported.end2end and exported.nms is None
    checkpoint = load(weights, nms=True)  # the .pt with --nms: per anchor, NMS after (postprocess asks end2end)
    assert not checkpoint.end2end and checkpoint.run(x).shape == (1, 525, 4 + 3)
    with pytest.raises(CheckpointError, match="best.onnx was exported end-to-end .* no one-to-many head"):
        load(path, nms=True)  # val.py / detect.py --nms: the graph has no other head to run
    x = batch_of([3], 160, 160)
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported.run(x)
    assert torch.allclose(theirs[..., 4], ours[..., 4], atol=1e-4)  # scores, best first
    detections = postprocess(theirs, exported, CONF)[0]  # no NMS: the rows above the threshold, as they come
    assert 5 <= len(detections) <= 300 and torch.equal(detections, theirs[0, : len(detections)])
    boxes, scores, unmatched = compare_detections(ours[0][ours[0, :, 4] > CONF], detections, CONF)
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4


def test_nms_free_model_with_dfl_exports_its_final_detections(tmp_path):
    """11n-e2e (DFL's 16 bins per side): the expectation over the bins is in the end-to-end graph, which gives
    PyTorch's detections (export.py's own check, then here)."""
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=96, scale="11n-e2e")
    export.main(["--weights", str(weights), "--onnx", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    exported, x = load_exported(weights.with_suffix(".onnx")), batch_of([3], 96, 96)
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported.run(x)
    assert exported.end2end and theirs.shape == ours.shape == (1, 189, 6)
    boxes, scores, unmatched = compare_detections(
        ours[0][ours[0, :, 4] > CONF], postprocess(theirs, exported, CONF)[0], CONF
    )
    assert unmatched == 0 and boxes < 1e-2 and scores < 1e-4


@needs("tflite")
def test_tflite_of_yolo26_gives_its_final_detections(tmp_path):
    """litert-torch converts the end-to-end graph (TopK and gathers, no NMS); export.py's check holds the file to
    PyTorch's detections, and the metadata appended to the flatbuffer is read back."""
    weights = make_checkpoint(tmp_path / "best.pt", imgsz=96, scale="26n")
    for refused in ("--half", "--int8", "--dynamic"):
        with pytest.raises(SystemExit, match="--tflite exports the fp32 network at a fixed size"):
            export.main(["--weights", str(weights), "--tflite", refused])
    export.main(["--weights", str(weights), "--tflite", "--runs", "1", "--conf", str(CONF)])  # exits if they disagree
    exported = load_exported(weights.with_suffix(".tflite"))
    assert exported.backend == "LiteRT" and exported.end2end and exported.imgsz == (96, 96)
    assert exported.names == ["ring", "box", "blob"]
    x = batch_of([3, 4], 96, 96)  # two images through a file exported for one: run in chunks
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = exported.run(x)
    assert theirs.shape == ours.shape == (2, 189, 6)  # 189 anchors at 96 px: all of them
    assert torch.allclose(theirs[..., 4], ours[..., 4], atol=1e-4)
    for a, b in zip(ours, postprocess(theirs, exported, CONF)):
        boxes, scores, unmatched = compare_detections(a[a[:, 4] > CONF], b, CONF)
        assert len(b) >= 5 and unmatched == 0 and boxes < 1e-2 and scores < 1e-4
