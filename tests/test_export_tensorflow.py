"""export.py's TensorFlow formats: a SavedModel (best_saved_model/) and a frozen GraphDef (best.pb), converted from the
ONNX graph by onnx2tf, held to PyTorch's outputs and scored by the gate; val.py and predict() run them with no flag
(the metadata travels with them); YOLO26's end-to-end graph (its TopK) runs in both; a missing package, a refused
option, a converter that crashes and a truncated file are one sentence each, and nothing half-written is left."""

import contextlib
import io
import json
import re
import shutil
import sys

import numpy as np
import pytest
import torch
import warm_python
from calibrated_model import (  # noqa: F401 (one_thread: autouse fixture)
    CONF,
    ROOT,
    assert_gives_the_final_detections,
    batch_of,
    labelled_checkpoint,
    make_checkpoint,
    one_thread,
    pytorch_model,
)
from runtimes import needs

import export
from models.predict import load, predict
from utils.checkpoints.ours import CheckpointError
from utils.export import formats as export_formats
from utils.export import tensorflow as tf_export
from utils.inference import compare_detections, load_exported

NAMES = ["ring", "box", "blob"]
FILES = {"saved_model": "best_saved_model", "pb": "best.pb"}
pytestmark = needs(*FILES)  # every test here runs the files of the module fixture below


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """YOLOv8n at 64 px, whose checkpoint names a set it labelled itself (8 val images), exported to both formats
    and scored by the gate (export.py exits if a file and PyTorch disagree or the mAP drops); YOLO26n's end-to-end
    graph at 96 px likewise, without a set. Returns the two checkpoints and what the first export printed."""
    root = tmp_path_factory.mktemp("tensorflow")
    weights = labelled_checkpoint(root, NAMES, train=range(100, 102))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        export.main(["--weights", str(weights), *(f"--{name}" for name in ("saved-model", "pb")), "--runs", "1"])
    e2e = make_checkpoint(root / "e2e" / "best.pt", imgsz=96, scale="26n")
    export.main(["--weights", str(e2e), "--saved-model", "--pb", "--runs", "1", "--conf", str(CONF)])
    return weights, e2e, printed.getvalue()


@pytest.mark.parametrize("name", FILES)
def test_both_give_pytorchs_outputs_and_carry_their_metadata(exported, name):
    weights, _, _ = exported
    model = load_exported(weights.parent / FILES[name])
    assert model.backend == export_formats.by_name(name).runtime
    assert model.names == NAMES and model.imgsz == (64, 64) and model.stride == 32 and not model.end2end
    assert model.data.endswith("set.yaml") and not (model.half or model.int8 or model.dynamic)
    assert model.metadata["input_shapes"] == [[1, 3, 64, 64]]  # NCHW, as every format takes it
    x = batch_of([3, 4], 64, 64)  # two images through a file exported for one
    with torch.no_grad():
        ours = pytorch_model(weights)(x)
    theirs = model.run(x)
    assert theirs.shape == ours.shape == (2, 84, 7) and torch.allclose(theirs, ours, rtol=1e-3, atol=1e-3)
    assert load(weights.parent / FILES[name]).backend == model.backend  # predict() and val.py's entry


def test_the_saved_model_takes_nchw_images_and_is_found_by_its_pb_too(exported):
    """Its signature is the contract of the other formats (not onnx2tf's NHWC); saved_model.pb names its folder."""
    import tensorflow as tf

    folder = exported[0].parent / FILES["saved_model"]
    signature = tf.saved_model.load(str(folder)).signatures["serving_default"]
    assert signature.structured_input_signature[1]["images"].shape == (1, 3, 64, 64)
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == [
        "fingerprint.pb",
        "metadata.json",
        "saved_model.pb",
    ]
    assert export_formats.format_of(folder / "saved_model.pb").name == "saved_model"
    assert export_formats.format_of(exported[0].parent / "best.pb").name == "pb"
    assert load_exported(folder / "saved_model.pb").backend == "TF SavedModel"


def test_the_gate_scored_both_within_its_tolerance(exported):
    printed = exported[2]
    scored = dict(re.findall(r"(\S+): mAP50-95 (0\.\d{4}) vs the checkpoint's", printed))
    reference = float(re.search(r"vs the checkpoint's (0\.\d{4})", printed)[1])
    assert set(scored) == {"best_saved_model/", "best.pb"} and reference > 0.5, printed
    assert all(reference - float(m) <= 0.002 for m in scored.values()), printed
    assert len(re.findall(r"raw output max \|diff\| \S+; detections \d+ vs PyTorch's \d+, 0 unmatched", printed)) == 2


def test_val_py_and_predict_run_them_with_no_flag(exported, tmp_path):
    weights, _, printed = exported
    done = warm_python.run(
        [sys.executable, "val.py", "--weights", str(weights.parent / FILES["saved_model"]), "--out", str(tmp_path)]
        + ["--workers", "0"],
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    gate = float(re.search(r"best_saved_model/: mAP50-95 (0\.\d{4})", printed)[1])
    assert json.loads((tmp_path / "metrics.json").read_text())["mAP50-95"] == pytest.approx(gate, abs=1e-4)
    image = next((weights.parent.parent / "set" / "val" / "images").iterdir())
    ours, theirs = (
        predict(load(weights), str(image), conf=CONF),
        predict(load(weights.parent / "best.pb"), str(image), CONF),
    )
    rows = [torch.from_numpy(np.c_[r.boxes, r.scores, r.classes]).float() for r in (ours, theirs)]
    boxes, scores, unmatched = compare_detections(*rows, conf=CONF)
    assert len(ours.scores) > 0 and boxes < 1e-2 and scores < 1e-4 and unmatched == 0


@pytest.mark.parametrize("name", FILES)
def test_yolo26_end_to_end_runs_its_topk_inside_both(exported, name):
    e2e = exported[1]
    model = load_exported(e2e.parent / FILES[name])
    assert "topk_outside" not in model.metadata
    assert_gives_the_final_detections(e2e, model)


def test_refused_options_and_missing_packages_are_one_sentence(exported, tmp_path, monkeypatch):
    weights = tmp_path / "best.pt"
    shutil.copy(exported[1], weights)
    for flag in ("--saved-model", "--pb"):
        with pytest.raises(SystemExit) as exit_info:
            export.main(["--weights", str(weights), flag, "--half"])
        assert exit_info.value.code == f"error: {flag} exports the fp32 network at a fixed size; leave out --half, " + (
            "--int8, --nms, --dynamic"
        )
    monkeypatch.setitem(sys.modules, "onnx2tf", None)
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--weights", str(weights), "--saved-model"])
    assert exit_info.value.code == (
        "error: --saved-model needs onnx2tf, which is not installed: pip install onnx onnx2tf tf_keras "
        "onnx_graphsurgeon sng4onnx psutil onnxruntime ai-edge-litert tensorflow"
    )
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(CheckpointError) as error:
        load(exported[1].parent / "best.pb")
    assert str(error.value).endswith(
        "best.pb (a TensorFlow GraphDef model) needs tensorflow, which is not installed: pip install tensorflow"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_a_crashing_converter_and_truncated_files_are_one_sentence(exported, tmp_path, monkeypatch):
    weights = tmp_path / "best.pt"
    shutil.copy(exported[0], weights)

    def garbage(module, x, path, args, metadata):  # an ONNX file that onnx2tf cannot read: the child fails
        path.write_bytes(b"\x08\x07not an onnx graph")
        metadata.update(input_names=["images"], output_names=["output"], input_shapes=[], output_shapes=[])

    monkeypatch.setattr(tf_export, "export_onnx", garbage)
    with pytest.raises(SystemExit, match=r"^error: onnx2tf could not convert the network to best\.pb \(exit status "):
        export.main(["--weights", str(weights), "--pb", "--runs", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # nothing half-written beside the weights
    good = exported[0].parent / "best.pb"
    truncated = tmp_path / "best.pb"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(truncated))} is not a TensorFlow GraphDef \("):
        load_exported(truncated)
    folder = tmp_path / "best_saved_model"
    shutil.copytree(exported[0].parent / "best_saved_model", folder)
    whole = (folder / "saved_model.pb").read_bytes()
    (folder / "saved_model.pb").write_bytes(whole[: len(whole) // 3])
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(folder))} is not a SavedModel this TensorFlow can"):
        load_exported(folder)
