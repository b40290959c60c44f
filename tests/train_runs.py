"""train.py run as a real subprocess by the end-to-end tests (issue 4): the tiny settings and dataset (TINY, tiny_data),
a wrapper that injects faults into an unchanged train.py (make_wrapper), and bitwise checkpoint comparison."""

import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_python
import yaml

from models.yolo import YOLO
from utils.checkpoints.ours import FORMAT, save_checkpoint
from utils.data.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]
NAMES = ["circle", "square", "triangle", "star", "cross", "hexagon"]  # tiny_data's classes
TINY = ["--model", "n", "--imgsz", "64", "--batch", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=12, n_val=6, seed=3, size=96)
    cfg = root / "tiny.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "path": "shapes",
                "train": "images/train",
                "val": "images/val",
                "names": NAMES,
            }
        )
    )
    return cfg


def run(args, cwd=REPO, wrapper=None, check=True, **popen):
    """`python train.py ARGS` (or `python WRAPPER ARGS`); a first argument ending in .py replaces train.py."""
    script = [str(wrapper)] if wrapper else [] if str(args[0]).endswith(".py") else ["train.py"]
    cmd = [sys.executable, *script, *map(str, args)]
    result = warm_python.run(cmd, cwd, timeout=300, **popen)  # subprocess.run, less torch's import
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def tensors_equal(a, b):
    """Every tensor of two (nested) checkpoint dicts is bitwise identical, and every other value equal."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)  # checkpoints must load this way


WRAPPER = """
import os, runpy, signal, sys, torch
sys.path.insert(0, {repo!r})
import models.yolo, utils.loss
RANK = int(os.environ.get("RANK", 0))
calls = {{"loss": 0, "forward": 0}}
original_loss, original_forward = utils.loss.DetectionLoss.__call__, models.yolo.YOLO.forward

def patched_loss(self, maps, targets, *teacher_maps):
    if not torch.is_grad_enabled():  # the validation loss (utils/evaluate.py, under no_grad): not a training step
        return original_loss(self, maps, targets)
    calls["loss"] += 1
    n = calls["loss"]
{loss_body}
    return original_loss(self, maps, targets, *teacher_maps)

def patched_forward(self, x, mode=None):
    if self.training:
        calls["forward"] += 1
        n = calls["forward"]
{forward_body}
    return original_forward(self, x, mode)

utils.loss.DetectionLoss.__call__ = patched_loss
models.yolo.YOLO.forward = patched_forward
{setup}
sys.argv = ["train.py"] + sys.argv[1:]
g = runpy.run_path("train.py", run_name="__main__")
"""


def make_wrapper(tmp_path, loss="", forward="", setup="", name="wrapper.py"):
    """A script that runs train.py unchanged, after patching the loss and/or the model's training
    forward with the given bodies (which see `n`, the call count on this rank, and RANK)."""
    path = tmp_path / name
    body = {"loss_body": loss, "forward_body": forward}
    body = {k: textwrap.indent(textwrap.dedent(v), " " * (4 if k == "loss_body" else 8)) or "" for k, v in body.items()}
    path.write_text(WRAPPER.format(repo=str(REPO), setup=textwrap.dedent(setup), **body))
    return path


def make_checkpoint(path, scale="s", names=NAMES, imgsz=64, seed=1, opinions=False):
    """A checkpoint of ours as train.py's best.pt holds one: random weights are teacher enough for these tests.
    opinions: class biases away from the prior every new head starts from (untrained heads all score alike)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = YOLO(scale, len(names))
        if opinions:
            for level in model.head.cls:
                level[-1].bias.data += torch.randn(len(names)) * 2
    header = dict(format=FORMAT, scale=scale, nc=len(names), names=list(names), imgsz=imgsz)
    save_checkpoint({**header, "model": model.state_dict()}, path)
    return path
