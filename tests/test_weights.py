"""models/weights.py, the one entry for weights: our .pt, an Ultralytics .pt and an exported file each go through
load_weights, which says what the file is; a .pt is opened and read once."""

import builtins
import io

import pytest
import torch
from calibrated_model import make_checkpoint, one_thread  # noqa: F401 (one_thread: autouse fixture)
from test_ultralytics_checkpoint import (  # noqa: F401 (fake_ultralytics: a fixture)
    fake_ultralytics,
    save_like_ultralytics,
    ultralytics_model,
)

import export
import utils.checkpoints.ours
from models.weights import load_weights
from models.yolo import YOLO
from utils.checkpoints.ours import CheckpointError


def opens_of(path, monkeypatch):
    """A list that gets one entry each time `path` is opened (builtins.open and io.open: zipfile uses the latter)."""
    opened, real_open = [], builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(path):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    return opened


def test_our_pt_is_ours_read_once_and_built_fused(tmp_path, monkeypatch):
    path = make_checkpoint(tmp_path / "best.pt")
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    opened = opens_of(path, monkeypatch)
    loaded = load_weights(path)
    assert loaded.kind == "ours" and len(opened) == 1 and len(loads) == 1
    assert (
        isinstance(loaded.model, YOLO) and not loaded.model.training and loaded.model.names == ["ring", "box", "blob"]
    )
    assert loaded.checkpoint["scale"] == "n" and loaded.train_args == {}
    assert all(not isinstance(m, torch.nn.BatchNorm2d) for m in loaded.model.modules())  # fused
    assert load_weights(path, build=False).model is None


def test_an_ultralytics_pt_is_ultralytics_and_read_once(fake_ultralytics, tmp_path, monkeypatch):  # noqa: F811
    ours = YOLO("11n", nc=3).eval()
    path = tmp_path / "yolo11n.pt"
    save_like_ultralytics(ultralytics_model(ours, "11"), path)
    fake_ultralytics()
    reads = []
    real_read = utils.checkpoints.ours.read_pickled_checkpoint
    monkeypatch.setattr(utils.checkpoints.ours, "read_pickled_checkpoint", lambda f: reads.append(f) or real_read(f))
    opened = opens_of(path, monkeypatch)
    loaded = load_weights(path, build=False)
    assert loaded.kind == "ultralytics" and loaded.model is None
    assert len(opened) == 1 and len(reads) == 1 and not isinstance(reads[0], str)  # the file opened, read again
    assert (loaded.checkpoint["scale"], loaded.checkpoint["nc"]) == ("11n", 3)
    assert loaded.checkpoint["source"].startswith("ultralytics")
    assert isinstance(load_weights(path).model, YOLO)


def test_an_exported_onnx_is_its_format_and_refused_where_a_checkpoint_is_needed(tmp_path):
    path = make_checkpoint(tmp_path / "best.pt")
    export.main(["--weights", str(path), "--onnx", "--runs", "1"])
    onnx = path.with_suffix(".onnx")
    loaded = load_weights(onnx)
    assert loaded.kind == "onnx" and loaded.checkpoint is None and loaded.train_args == {}
    assert loaded.model.names == ["ring", "box", "blob"] and callable(loaded.model.run)
    with pytest.raises(CheckpointError) as error:
        load_weights(onnx, build=False)  # train.py --weights best.onnx
    message = str(error.value)
    assert message.startswith(str(onnx)) and "give the .pt checkpoint" in message and "\n" not in message
