"""train.py, val.py and detect.py run in this process (runpy), where the emulated GPU of cuda_emulator.py lives, for
test_cuda_emulated_*.py: a tiny dataset, a runner that restores the process, what a training run is watched for."""

import contextlib
import logging
import os
import runpy
import signal
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

import utils.optim
from models.yolo import YOLO
from utils.data.shapes import make_shapes

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "n", "--imgsz", "64", "--workers", "0", "--device", "0", "--warmup-epochs", "0", "--accumulate", "1"]
CUDA0 = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "shapes", n_train=8, n_val=4, seed=3, size=96)
    cfg = root / "tiny.yaml"
    names = ["circle", "square", "triangle", "star", "cross", "hexagon"]
    cfg.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": names}))
    return cfg


@contextlib.contextmanager
def process_state():
    """What a script changes in the process and a test run must not leave behind: signal handlers, the excepthook
    (train.py's crash handler), argv, the cwd, torch's determinism flags, the 'yolo' logger's files."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    excepthook, argv, cwd = sys.excepthook, sys.argv, os.getcwd()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        yield
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.excepthook, sys.argv = excepthook, argv
        os.chdir(cwd)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn
        log = logging.getLogger("yolo")
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()


def run_script(script, *args):
    """`python SCRIPT ARGS` in this process; returns its exit status."""
    with process_state():
        os.chdir(REPO)
        sys.argv = [script, *map(str, args)]
        try:
            runpy.run_path(str(REPO / script), run_name="__main__")
        except SystemExit as e:
            return 0 if e.code is None else e.code
    return 0


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def without_host_only_work(monkeypatch):
    """Leave out what does not touch the GPU and costs seconds per run: matplotlib's charts and the label and
    batch pictures (test_train_outputs.py and test_plots.py check those), and the GFLOPs count at 640 px (the bf16 run
    keeps it). val_batch0_pred.jpg, which runs the model on the GPU, stays."""
    import utils.plots

    for name in ("plot_results", "plot_labels", "plot_batch", "plot_pr_curve", "plot_confusion_matrix"):
        monkeypatch.setattr(utils.plots, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(utils.plots, "plot_confidence_curves", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(sys.modules["models.yolo"], "count_gflops", lambda *args, **kwargs: 0.0)


def watch_training(monkeypatch, gpu):
    """Record, per training forward, where the model's parameters and input are and the autocast state, and
    the host syncs counted up to the end of each optimizer step."""
    seen = types.SimpleNamespace(forwards=[], syncs_after_step=[])
    forward, step = YOLO.forward, utils.optim.optimizer_step

    def watched_forward(self, x, mode=None):
        if self.training:
            seen.forwards.append(
                dict(
                    convs=sum(isinstance(m, torch.nn.Conv2d) for m in self.modules()),
                    parameters={p.device for p in self.parameters()},
                    input=x.device,
                    size=x.shape[-1],
                    autocast=torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda"),
                )
            )
        return forward(self, x, mode)

    def watched_step(*args, **kwargs):
        stepped = step(*args, **kwargs)
        seen.syncs_after_step.append(Counter(gpu.host_syncs))
        return stepped

    monkeypatch.setattr(YOLO, "forward", watched_forward)
    monkeypatch.setattr(utils.optim, "optimizer_step", watched_step)  # train.py imports it when it runs
    return seen
