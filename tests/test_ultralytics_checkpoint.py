"""Ultralytics checkpoints (yolov8n.pt, yolo11s.pt, a `yolo train` run's best.pt) load without the ultralytics
package and without running code from the file.

ultralytics is not installed here. The test writes a stand-in package of that name whose classes have
Ultralytics' module paths and class names (ultralytics.nn.tasks.DetectionModel, ...modules.block.C2f, ...),
fills one of its models with known weights, torch.save()s it the way Ultralytics' trainer does (the whole
object, fp16, under "ema"), then deletes the package before loading."""

import collections
import copy
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

import models.yolo
from models.weights import model_from_checkpoint
from models.yolo import YOLO
from utils.checkpoints.ours import CheckpointError, load_checkpoint
from utils.checkpoints.safe_unpickle import read_pickled_checkpoint
from utils.checkpoints.ultralytics import FAMILIES, LAYER_NAMES
from utils.data.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]

# Ultralytics' module paths, with empty nn.Module subclasses: the stand-in models adopt our modules' children,
# so their state_dict names are what an Ultralytics model's are.
PACKAGE = {
    "ultralytics/__init__.py": "",
    "ultralytics/nn/__init__.py": "",
    "ultralytics/nn/tasks.py": "import torch.nn as nn\n\nclass DetectionModel(nn.Module):\n    pass\n\n"
    "class SegmentationModel(nn.Module):\n    pass\n",
    "ultralytics/nn/modules/__init__.py": "",
    "ultralytics/nn/modules/conv.py": "import torch.nn as nn\n\nclass Conv(nn.Module):\n    pass\n\n"
    "class Concat(nn.Module):\n    pass\n",
    "ultralytics/nn/modules/block.py": "import torch.nn as nn\n\n"
    + "".join(f"class {c}(nn.Module):\n    pass\n\n" for c in ("C2f", "C3k2", "SPPF", "C2PSA", "DFL", "C3")),
    "ultralytics/nn/modules/head.py": "import torch.nn as nn\n\nclass Detect(nn.Module):\n    pass\n",
}
MODULE_OF = {"Conv": "conv", "Concat": "conv", "Detect": "head"}


def adopt(cls, source):
    """An instance of the stand-in class `cls` holding the children of our module `source`."""
    module = cls()
    for name, child in source.named_children():
        module.add_module(name, child)
    return module


def ultralytics_model(ours, family, classes=None):
    """Our model's weights laid out as Ultralytics' DetectionModel: model.0 ... model.22/23."""
    import ultralytics.nn.modules.block as block
    import ultralytics.nn.modules.conv as conv
    import ultralytics.nn.modules.head as head
    import ultralytics.nn.tasks as tasks

    modules = {"conv": conv, "block": block, "head": head}
    layers = []
    for index, kind in enumerate(classes or FAMILIES[family]):
        cls = getattr(modules[MODULE_OF.get(kind, "block")], kind, None)
        if kind == "Upsample":
            layers.append(nn.Upsample(scale_factor=2, mode="nearest"))
        elif kind == "Concat":
            layers.append(conv.Concat())
        elif kind == "Detect":
            detect = cls()
            detect.cv2, detect.cv3, detect.nc = ours.head.box, ours.head.cls, ours.nc
            if family == "26":  # no DFL (an Identity), and the one-to-one branch
                detect.dfl, detect.one2one_cv2, detect.one2one_cv3 = (
                    nn.Identity(),
                    ours.head.one2one_box,
                    ours.head.one2one_cls,
                )
            else:
                detect.dfl = block.DFL()
                detect.dfl.conv = nn.Conv2d(16, 1, 1, bias=False).requires_grad_(False)
                detect.dfl.conv.weight.data[:] = torch.arange(16.0).view(1, 16, 1, 1)
            layers.append(detect)
        else:
            layers.append(adopt(cls, getattr(ours, LAYER_NAMES[family][index])))
    model = tasks.DetectionModel()
    model.model = nn.Sequential(*layers)
    model.names = {i: f"name{i}" for i in range(ours.nc)}
    return model


def _drop_package(root):
    if str(root) in sys.path:
        sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "ultralytics" or m.startswith("ultralytics.")]:
        del sys.modules[name]
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fake_ultralytics(tmp_path):
    """Imports as `ultralytics` until the test calls the function this yields: then the package is deleted and
    forgotten by Python, so loading a checkpoint cannot import any of its classes."""
    root = tmp_path / "site"
    for name, text in PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    sys.path.insert(0, str(root))
    yield lambda: _drop_package(root)
    _drop_package(root)


def randomised(model):
    """A model whose BatchNorm statistics and biases are not the defaults, so that a layer read into the
    wrong place changes the output."""
    torch.manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2), m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
    return model.eval()


def save_like_ultralytics(model, path, **extra):
    """What Ultralytics' trainer writes: the whole model object, fp16, under "ema"; "model" None."""
    ckpt = {"epoch": 0, "model": None, "ema": copy.deepcopy(model).half(), "updates": 10, "optimizer": None}
    ckpt.update(train_args={"imgsz": 320, "data": "their.yaml"}, version="8.4.0", **extra)
    torch.save(ckpt, path)


@pytest.mark.parametrize("scale", ["n", "11n", "26n"])
def test_ultralytics_checkpoint_gives_the_same_outputs(fake_ultralytics, tmp_path, scale):
    ours = randomised(YOLO(scale, nc=3))
    family = scale[:-1]
    path = tmp_path / f"yolo{scale}.pt"
    save_like_ultralytics(ultralytics_model(ours, family), path)
    fake_ultralytics()

    ckpt = load_checkpoint(path)
    assert (ckpt["scale"], ckpt["nc"], ckpt["imgsz"]) == (scale, 3, 320)
    assert ckpt["names"] == ["name0", "name1", "name2"]
    assert all(v.dtype != torch.float16 for v in ckpt["model"].values())  # fp16 in the file, fp32 here
    loaded = model_from_checkpoint(path)
    reference = ours.half().float()  # the file holds fp16 weights
    x = torch.rand(2, 3, 128, 96)
    with torch.no_grad():
        expected, got = reference(x), loaded(x)
        expected_maps, got_maps = reference(x, mode="maps"), loaded(x, mode="maps")  # both branches for YOLO26
    anchors = 16 * 12 + 8 * 6 + 4 * 3
    assert got.shape == expected.shape == (2, anchors, 6 if family == "26" else 4 + 3)
    if family == "26":
        # final detections: their scores agree, but near-equal ones may swap places; the maps of both branches
        # must agree exactly as v8's and 11's decoded outputs do (each branch from its own weights)
        assert (got[..., 4] - expected[..., 4]).abs().max() < 1e-3
        assert (got_maps["one2one"][0] - got_maps["one2many"][0]).abs().max() > 0.01
        expected, got = (
            torch.cat([t.flatten(1) for t in m["one2many"] + m["one2one"]], 1) for m in (expected_maps, got_maps)
        )
    assert (got - expected).abs().max() < 1e-3  # channels_last convolutions add rounding, nothing more


@pytest.mark.parametrize("scale", ["s", "11m", "11l", "26s"])  # m and l share their widths, not their depth
def test_the_model_is_recognised_from_its_layers_and_widths(fake_ultralytics, tmp_path, scale):
    with torch.device("meta"):  # shapes only
        ours = YOLO(scale, nc=80)
    path = tmp_path / "model.pt"
    save_like_ultralytics(ultralytics_model(ours.to_empty(device="cpu"), scale[:-1]), path)
    fake_ultralytics()
    assert load_checkpoint(path)["scale"] == scale


def test_a_pickle_that_would_run_a_command_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "yolov8n.pt"
    torch.save({"model": Payload(), "train_args": {}}, path)
    with pytest.raises(CheckpointError, match=r"yolov8n\.pt was refused: its pickle would call \w+\.system"):
        load_checkpoint(path)
    assert not marker.exists()


def test_other_files_are_named_in_one_sentence(fake_ultralytics, tmp_path, monkeypatch):
    import ultralytics.nn.tasks as tasks

    seg = tmp_path / "yolov8n-seg.pt"
    torch.save({"model": tasks.SegmentationModel()}, seg)
    v5u = tmp_path / "yolov5nu.pt"
    classes = FAMILIES[""].copy()
    classes[2] = "C3"  # YOLOv5u: C3 blocks, the v8 head
    save_like_ultralytics(ultralytics_model(YOLO("n", 3), "", classes), v5u)

    class DetectionModel(nn.Module):  # the yolov5 repository's class
        pass

    DetectionModel.__module__, DetectionModel.__qualname__ = "models.yolo", "DetectionModel"
    monkeypatch.setattr(models.yolo, "DetectionModel", DetectionModel, raising=False)
    v5 = tmp_path / "yolov5s.pt"
    torch.save({"model": DetectionModel(), "epoch": 1}, v5)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(v5.read_bytes()[:300])
    fake_ultralytics()

    expected = {
        seg: "is an Ultralytics segmentation model",
        v5u: "layers (C3 C2f SPPF Detect) are neither YOLOv8, YOLO11 nor YOLO26",
        v5: "is a YOLOv5 checkpoint",
        broken: "is not a checkpoint this repo can read",
    }
    for path, words in expected.items():
        with pytest.raises(CheckpointError) as error:
            load_checkpoint(path)
        message = str(error.value)
        assert message.startswith(str(path)) and words in message and "\n" not in message, message


def test_what_torch_save_writes_reads_back_as_torch_load_reads_it(tmp_path):
    """The hostile-file checks below must pass every view torch.save() writes: views sharing one storage at an
    offset, transposed ones, size-1 dims with any stride, scalars, empty tensors, every dtype; and a model
    with its optimizer's state, as in a last.pt."""
    base = torch.arange(24.0).view(4, 6)
    model = YOLO("n", nc=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.rand(1, 3, 64, 64))[0].sum().backward()
    optimizer.step()
    views = {"base": base, "row": base[2], "column": base[:, 3], "transposed": base.t(), "unsqueezed": base[:, None]}
    dtypes = {str(dt): torch.ones(3, dtype=dt) for dt in (torch.float16, torch.bfloat16, torch.int64, torch.bool)}
    odd = {
        "scalar": torch.tensor(7),
        "empty": torch.zeros(0, 5),
        "stride 0 on a size-1 dim": torch.zeros(3).expand(1, 3),
    }
    saved = {**views, **dtypes, **odd, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = tmp_path / "last.pt"
    torch.save(saved, path)
    got, calls = read_pickled_checkpoint(path)
    expected = torch.load(path, weights_only=True)
    flat_got, flat_expected = flatten(got), flatten(expected)
    assert calls == [] and flat_got.keys() == flat_expected.keys()
    for key, value in flat_expected.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == flat_got[key].dtype and torch.equal(value, flat_got[key]), key
        else:
            assert value == flat_got[key], key


def flatten(obj, prefix=""):
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in flatten(value, f"{prefix}{key}/").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in flatten(value, f"{prefix}{i}/").items()}
    return {prefix: obj}


def load_in_fresh_process(path):
    """(exception class, message, growth of the peak resident memory in MiB) of load_checkpoint(path), run in a
    new interpreter. Not ru_maxrss: a forked child inherits the peak of this big pytest process, hiding growth.
    VmHWM (Linux) is the child's own peak; resetting it drops what importing torch used only for a moment."""
    script = (
        "import json, sys\n"
        "from utils.checkpoints.ours import load_checkpoint\n"
        "def peak_mib():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024\n"
        "try:\n"
        "    open('/proc/self/clear_refs', 'w').write('5')\n"
        "except OSError:\n"
        "    pass  # not allowed here: the baseline keeps the import's peak, which can only hide growth\n"
        "before = peak_mib()\n"
        "try:\n"
        "    load_checkpoint(sys.argv[1])\n"
        "    outcome = ['loaded', '']\n"
        "except Exception as e:\n"
        "    outcome = [type(e).__name__, str(e)]\n"
        "print(json.dumps(outcome + [peak_mib() - before]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def assert_refused(path, kind, message, words):
    assert kind == "CheckpointError", f"{kind}: {message}"
    assert message.startswith(f"{path} is not a checkpoint this repo can read ("), message
    assert words in message and "\n" not in message and "Traceback" not in message, message


def with_entry_replaced(path, suffix, data, compress_type=zipfile.ZIP_STORED):
    """Rewrites the torch.save() zip at `path` with the entry ending in `suffix` holding `data` instead."""
    with zipfile.ZipFile(path) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, "w") as dst:
        for info, content in entries:
            if info.filename.endswith(suffix):
                dst.writestr(info.filename, data, compress_type=compress_type)
            else:
                dst.writestr(info, content)


# Each file is a few bytes to a MiB; reading it the naive way (cloning each tensor view) makes 256 MiB of tensors.
SMALL_FILES_BIG_TENSORS = {
    "stride 0": lambda: torch.zeros(1).expand(2**26),  # one element repeated 2**26 times
    "overlapping rows": lambda: torch.zeros(2**14).as_strided((2**13, 2**13), (1, 1)),  # row i starts at element i
    "one storage viewed 256 times": lambda: [x.view(-1) for x in [torch.zeros(2**18)] * 256],
}


@pytest.mark.parametrize("case", SMALL_FILES_BIG_TENSORS)
def test_a_small_file_claiming_big_tensors_is_refused_without_allocating_them(fake_ultralytics, tmp_path, case):
    import ultralytics.nn.tasks as tasks

    path = tmp_path / "yolov8n.pt"
    # the model object first: torch.load(weights_only=True) stops at its class before reading any storage
    torch.save({"ema": tasks.DetectionModel(), "anchors": SMALL_FILES_BIG_TENSORS[case]()}, path)
    fake_ultralytics()
    assert path.stat().st_size < 2**21
    kind, message, grew_mib = load_in_fresh_process(path)
    assert grew_mib < 32, f"reading a {path.stat().st_size}-byte file took {grew_mib:.0f} MiB more"
    assert_refused(path, kind, message, "tensor")


def test_a_compressed_zip_entry_is_refused_without_inflating_it(fake_ultralytics, tmp_path):
    import ultralytics.nn.tasks as tasks

    path = tmp_path / "yolov8n.pt"
    torch.save({"ema": tasks.DetectionModel(), "anchors": torch.zeros(4)}, path)
    fake_ultralytics()
    with_entry_replaced(path, "/data/0", bytes(2**27), zipfile.ZIP_DEFLATED)  # 128 MiB of zeros in ~130 KB
    assert path.stat().st_size < 2**18
    kind, message, grew_mib = load_in_fresh_process(path)
    assert grew_mib < 32, f"reading a {path.stat().st_size}-byte file took {grew_mib:.0f} MiB more"
    assert_refused(path, kind, message, "compressed")


@pytest.mark.parametrize("storage", ["a string", "a model"])
def test_a_tensor_built_from_something_other_than_a_storage_is_refused_in_one_sentence(
    fake_ultralytics, tmp_path, storage
):
    import ultralytics.nn.tasks as tasks

    fake = "not a storage" if storage == "a string" else tasks.DetectionModel()

    class Tensor:  # pickles as a call of torch's tensor rebuilder, with `fake` where the storage belongs
        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, (fake, 0, (1,), (1,), False, collections.OrderedDict())

    path = tmp_path / "yolov8n.pt"
    torch.save({"ema": tasks.DetectionModel(), "anchors": Tensor()}, path)
    fake_ultralytics()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert_refused(path, "CheckpointError", str(error.value), "instead of one of the file's storages")


@pytest.mark.parametrize("entry_bytes", [8, 32])  # the pickle says 4 floats: 16 bytes
def test_a_storage_whose_entry_has_another_size_is_refused(fake_ultralytics, tmp_path, entry_bytes):
    import ultralytics.nn.tasks as tasks

    path = tmp_path / "yolov8n.pt"
    torch.save({"ema": tasks.DetectionModel(), "anchors": torch.zeros(4)}, path)
    fake_ultralytics()
    with_entry_replaced(path, "/data/0", bytes(entry_bytes))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert_refused(path, "CheckpointError", str(error.value), f"its entry has {entry_bytes}")


@pytest.fixture
def six_class_data(tmp_path):
    make_shapes(tmp_path / "shapes", n_train=8, n_val=4, seed=3, size=96)
    cfg = tmp_path / "six.yaml"
    cfg.write_text(
        yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": list("abcdef")})
    )
    return cfg


@pytest.mark.parametrize("scale", ["11n", "26n"])
def test_weights_with_another_class_count_transfer_all_but_the_class_convs(
    fake_ultralytics, six_class_data, tmp_path, scale
):
    """Fine-tuning yolo11n.pt / yolo26n.pt (80 classes) on 6: every tensor but the last class convs transfers (for
    YOLO26 those of both heads' copies), and a run that freezes the rest leaves them exactly as loaded."""
    ours = randomised(YOLO(scale, nc=80))
    path = tmp_path / f"yolo{scale}.pt"
    save_like_ultralytics(ultralytics_model(ours, scale[:2]), path)
    fake_ultralytics()

    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--data", six_class_data, "--model", scale, "--weights", path]
    cmd += ["--epochs", "1", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu"]
    # everything frozen but the fresh last class convs: the transferred weights must come out unchanged
    branches = ["cls", "one2one_cls"] if scale == "26n" else ["cls"]
    frozen = "stem,down,stage,sppf,psa,top,bottom,head.box,head.one2one_box," + ",".join(
        f"head.{b}.{i}.{j}" for b in branches for i in range(3) for j in (0, 1)
    )
    cmd += ["--out", out, "--warmup-epochs", "0", "--freeze", frozen]
    result = subprocess.run(list(map(str, cmd)), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    total, fresh = len(YOLO(scale, nc=6).state_dict()), 6 * len(branches)
    assert f"initialised {total - fresh}/{total} tensors from {path}" in result.stdout + result.stderr
    # the licence of Ultralytics' weights: said, and recorded beside --weights in args.yaml and in the checkpoints
    assert f"{path}: weights under AGPL-3.0" in result.stdout
    assert f"weights: {path}  # <- command line; licence AGPL-3.0" in (out / "args.yaml").read_text()
    assert torch.load(out / "weights" / "best.pt", weights_only=True)["licence"] == "AGPL-3.0"
    trained = torch.load(out / "weights" / "last.pt", weights_only=True)["model"]
    source = ours.half().float().state_dict()
    for name, tensor in trained.items():
        parts = name.split(".")  # head.cls.<level>.2.weight: the last class conv of a level
        if parts[0] == "head" and parts[1] in branches and parts[3] == "2":
            assert tensor.shape[0] == 6
        elif "num_batches_tracked" not in name and "running" not in name:
            assert torch.equal(tensor, source[name]), name
