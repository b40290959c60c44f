"""A full disk (issue 40) at each file a run or an export writes (checkpoint, results.csv, label cache, plots, log,
args.yaml, metrics.json, export): one sentence or one warning each, nothing written before lost.

A full disk is injected (an ENOSPC OSError from the write) everywhere; where this machine lets the test mount a tiny
tmpfs (root), the same is also done on a real full disk.
"""

import contextlib
import errno
import logging
import subprocess
from pathlib import Path

import pytest
import torch
from train_runs import TINY, make_wrapper, run

import utils.data.labels as L
from utils import general, monitor
from utils.checkpoints import ours
from utils.data.shapes import make_shapes
from utils.disk import DiskFull

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


@contextlib.contextmanager
def tiny_tmpfs(folder, size="2m"):
    """A real 2 MB disk at `folder` where mount works (root), else None: the caller then injects the error only."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    try:
        yield folder if mounted.returncode == 0 else None
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(folder)], check=True)


def on_a_real_full_disk(tmp_path, check):
    """check(disk) on a real 2 MB tmpfs where mounting is allowed (root), its figure printed; else says so."""
    with tiny_tmpfs(tmp_path / "tmpfs") as disk:
        if disk is None:
            print("mount not allowed here (not root): the injected full disk only")
        else:
            print("real 2 MB tmpfs:", check(disk))


def fill(folder):
    """Fill the disk of `folder` to its last byte."""
    for block in (65536, 1):
        with contextlib.suppress(OSError), open(folder / f"filler{block}", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * block)


def patched(monkeypatch, *patches):
    """A context (factory) in which each (owner, name, value) is patched: the injected full disk."""

    @contextlib.contextmanager
    def context():
        with monkeypatch.context() as m:
            for owner, name, value in patches:
                m.setattr(owner, name, value)
            yield

    return context


def filled(folder):
    """A context (factory) in which the real disk of `folder` is full."""

    @contextlib.contextmanager
    def context():
        fill(folder)
        yield

    return context


def raise_enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def full_torch_save(obj, f, *args, **kwargs):
    """torch.save as it fails on a full disk: part of the file written, then its zip writer's RuntimeError with
    the OSError as its context (seen on a full tmpfs)."""
    f.write(b"PK\x03\x04 half a checkpoint")
    try:
        raise_enospc()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904


# ---------------------------------------------------------------------------------------------
# A full disk
# ---------------------------------------------------------------------------------------------


def check_checkpoint_kept(folder, full):
    """save_checkpoint over a good last.pt on a full disk: one sentence, the old file intact, no temporary file."""
    path = folder / "weights" / "last.pt"
    ours.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    with full(), pytest.raises(DiskFull) as stop:
        ours.save_checkpoint({"epoch": 2, "w": torch.zeros(1_000_000)}, path)  # 4 MB: more than the 2 MB tmpfs
    sentence = str(stop.value)
    assert (
        str(path) in sentence and " free on that disk" in sentence and "--resume" in sentence and "\n" not in sentence
    )
    assert stop.value.code == sentence  # SystemExit: printed as it is, exit status 1, no traceback
    assert torch.load(path, weights_only=True)["epoch"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # the unfinished temporary file removed
    return sentence


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    print(
        "injected:", check_checkpoint_kept(tmp_path / "a", patched(monkeypatch, (ours.torch, "save", full_torch_save)))
    )
    check_checkpoint_kept(tmp_path / "b", patched(monkeypatch, (ours.torch, "save", raise_enospc)))
    check_checkpoint_kept(tmp_path / "c", patched(monkeypatch, (ours.os, "fsync", raise_enospc)))  # NFS: at fsync
    on_a_real_full_disk(tmp_path, lambda disk: check_checkpoint_kept(disk, contextlib.nullcontext))


def test_another_error_of_torch_save_is_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    def broken(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(ours.torch, "save", broken)
    with pytest.raises(RuntimeError, match="unexpected pos"):  # plenty of space left: its own traceback
        ours.save_checkpoint({"epoch": 1}, tmp_path / "last.pt")


def check_results_csv_kept(folder, full):
    path = folder / "results.csv"
    monitor.start_results_csv(path, ["epoch", "loss"])
    monitor.append_results_row(path, [1, 0.5])
    before = path.read_bytes()
    with full():
        with pytest.raises(DiskFull) as stop:
            monitor.append_results_row(path, [2, *[0.25] * 1000])
        assert str(path) in str(stop.value) and " free on that disk" in str(stop.value)
        with pytest.raises(DiskFull):  # a resumed run's header: its kept rows are not lost either
            monitor.start_results_csv(path, ["epoch", "loss", *(f"c{i}" for i in range(1000))], resumed_epoch=1)
    assert path.read_bytes() == before  # no half row
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file


def test_a_full_disk_while_writing_results_csv_keeps_its_rows(tmp_path, monkeypatch):
    real_open = Path.open

    class FullFile:
        """A file on a disk that fills up after the row's first few characters."""

        def __init__(self, path, mode):
            self.f = real_open(path, mode)

        def write(self, text):
            self.f.write(text[:5])
            self.f.flush()
            raise_enospc()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def full_open(self, mode="r", *args, **kwargs):
        return real_open(self, mode) if mode == "r" else FullFile(self, mode)

    full = patched(monkeypatch, (Path, "open", full_open), (general, "atomic_write", raise_enospc))
    check_results_csv_kept(tmp_path, full)
    on_a_real_full_disk(tmp_path, lambda disk: check_results_csv_kept(disk, filled(disk)) or "results.csv kept")


def check_label_cache_warns(dataset, full, caplog):
    with full(), caplog.at_level(logging.WARNING, logger="yolo"):
        records = L.load_verified([dataset / "images" / "train"], nc=6, split_name="train")
    assert len(records) == 3  # trained on: it is only a cache
    warnings = [r.getMessage() for r in caplog.records if "label cache" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "the disk is full" in warnings[0] and " free)" in warnings[0] and str(dataset) in warnings[0]
    caplog.clear()
    return warnings[0]


def test_a_label_cache_that_does_not_fit_on_the_disk_warns_and_training_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("YOLO_CACHE_DIR", str(tmp_path / "user_cache"))
    make_shapes(tmp_path / "a", n_train=3, n_val=1, size=64)
    print(check_label_cache_warns(tmp_path / "a", patched(monkeypatch, (L, "atomic_write", raise_enospc)), caplog))

    def on_disk(disk):
        monkeypatch.setenv("YOLO_CACHE_DIR", str(disk / "user_cache"))  # the fallback folder is full too
        make_shapes(disk / "b", n_train=3, n_val=1, size=64)
        return check_label_cache_warns(disk / "b", filled(disk), caplog)

    on_a_real_full_disk(tmp_path, on_disk)


FULL_AFTER_THE_FIRST_LAST_PT = """
import errno, torch
real_save, saves = torch.save, []
def save(obj, f, *args, **kwargs):
    if saves:  # the disk is full from the second save on
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")
    saves.append(f.name)
    return real_save(obj, f, *args, **kwargs)
torch.save = save
"""


def test_a_run_on_a_full_disk_stops_with_one_sentence_and_resumes_once_there_is_space(tmp_path):
    """--save-every 1: last.pt after the first optimizer step (--accumulate 2: the epoch's only one), then the disk
    is full at the end of the epoch, at best.pt (one epoch keeps this test under 20 s; a later epoch's last.pt or
    best.pt is the same save_checkpoint, tested above)."""
    data = tmp_path / "tiny.yaml"
    make_shapes(tmp_path / "shapes", n_train=2, n_val=1, size=64)
    data.write_text("path: shapes\ntrain: images/train\nval: images/val\nnames: [a, b, c, d, e, f]\n")
    out = tmp_path / "run"
    args = ["--data", data, "--epochs", "1", "--out", out, *TINY]
    args += ["--batch", "1", "--accumulate", "2", "--save-every", "1"]
    stopped = run(args, wrapper=make_wrapper(tmp_path, setup=FULL_AFTER_THE_FIRST_LAST_PT), check=False)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr + stopped.stdout, stopped.stderr[-3000:]
    sentence = stopped.stderr.strip().splitlines()[-1]
    print(sentence)
    last, best = out / "weights" / "last.pt", out / "weights" / "best.pt"
    assert sentence.startswith(f"stopping: the disk is full, {best} could not be written (")
    assert " free on that disk now); there is no best.pt yet; " in sentence and f"--resume {last}" in sentence
    assert torch.load(last, weights_only=True)["epoch"] == 0  # the previous one, loadable
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt"]  # no temporary file
    assert not (out / "crash").exists()
    run(["--resume", last])
    assert torch.load(last, weights_only=True)["epoch"] == 1 and torch.load(best, weights_only=True)["epoch"] == 1
    assert [row.split(",")[0] for row in (out / "results.csv").read_text().splitlines()[1:]] == ["1"]


# ---------------------------------------------------------------------------------------------
# A full disk at the other files a run writes: plots, the log, args.yaml, metrics.json, an export
# ---------------------------------------------------------------------------------------------


def half_then_full(real_atomic_write):
    """atomic_write on a disk that fills up after the first bytes of the new file."""

    def atomic_write(path, write, fsync=False):
        def full(f):
            f.write(b"half a file")
            raise_enospc()

        return real_atomic_write(path, full, fsync)

    return atomic_write


def no_temporary_files(folder):
    return not [p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name]


def check_plot_kept(folder, full, caplog):
    from utils import plots

    csv_path, png = folder / "results.csv", folder / "results.png"
    csv_path.write_text("epoch,loss,mAP50\n1,0.5,0.1\n2,0.4,0.2\n")
    plots.plot_results(csv_path, png)
    before = png.read_bytes()
    with full(), caplog.at_level(logging.WARNING, logger="yolo"):
        plots.plot_results(csv_path, png)  # a plot is not worth a run: a warning, and the run goes on
    warnings = [r.getMessage() for r in caplog.records]
    caplog.clear()
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith(f"{png} could not be written (the disk is full, ") and " free)" in warnings[0]
    assert png.read_bytes() == before and no_temporary_files(folder)  # the previous one intact, nothing left
    return warnings[0]


def test_a_full_disk_while_drawing_a_plot_warns_and_keeps_the_previous_one(tmp_path, monkeypatch, caplog):
    from utils import plots

    full = patched(monkeypatch, (plots, "atomic_write", half_then_full(general.atomic_write)))
    print("injected:", check_plot_kept(tmp_path, full, caplog))
    on_a_real_full_disk(tmp_path, lambda disk: check_plot_kept(disk, filled(disk), caplog))


class FullStream:
    """A log file's stream on a full disk."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        raise_enospc()

    def flush(self):
        pass

    def close(self):
        self.stream.close()


def check_log_file(folder, full, capsys):
    log_file = folder / "train.log"
    log = general.setup_logging(log_file)
    log.info("epoch 1 done")
    with full():
        for epoch in range(2, 5):  # each line larger than the buffer: each reaches the full disk
            log.info(f"epoch {epoch} " + "x" * 70000)
    captured = capsys.readouterr()
    general.setup_logging(None)  # this file's handler closed
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in captured.err and "Logging error" not in captured.err, captured.err
    assert lines[0].startswith(f"warning: {log_file} could not be written (the disk is full, "), lines
    assert lines[0].endswith(" free); its lines go to the console only")
    assert "epoch 4" in captured.out  # the console has every line
    assert log_file.read_text().splitlines()[0].endswith("INFO epoch 1 done")  # the lines before are kept
    return lines[0]


def test_a_full_disk_while_logging_is_said_once_and_the_run_goes_on(tmp_path, capsys):
    @contextlib.contextmanager
    def injected():
        handler = next(h for h in logging.getLogger("yolo").handlers if isinstance(h, general.LogFileHandler))
        handler.stream = FullStream(handler.stream)
        yield

    print("injected:", check_log_file(tmp_path, injected, capsys))
    on_a_real_full_disk(tmp_path, lambda disk: check_log_file(disk, filled(disk), capsys))


def check_run_file_kept(folder, full):
    path = folder / "metrics.json"
    general.write_run_file(path, '{"mAP50": 0.5}')
    with full(), pytest.raises(DiskFull) as stop:
        general.write_run_file(path, '{"mAP50": 0.6, "pad": "' + "x" * 3_000_000 + '"}', "best.pt is intact")
    sentence = str(stop.value)
    assert sentence.startswith(f"stopping: the disk is full, {path} could not be written (") and "\n" not in sentence
    assert " free on that disk now); best.pt is intact" in sentence
    assert path.read_text() == '{"mAP50": 0.5}' and no_temporary_files(folder)
    return sentence


def test_a_full_disk_while_writing_args_yaml_or_metrics_json_stops_with_one_sentence(tmp_path, monkeypatch):
    full = patched(monkeypatch, (general, "atomic_write", half_then_full(general.atomic_write)))
    print("injected:", check_run_file_kept(tmp_path, full))
    on_a_real_full_disk(tmp_path, lambda disk: check_run_file_kept(disk, filled(disk)))


def check_export_kept(folder, write):
    """An exporter that fills the disk while writing best.onnx: one sentence, the previous best.onnx intact."""
    from utils.export.writers import ExportError, written_at_once

    path = folder / "best.onnx"
    path.write_bytes(b"the previous export")
    with pytest.raises(ExportError) as stop, written_at_once(path) as temporary:
        write(temporary)
    sentence = str(stop.value)
    assert sentence.startswith(f"{path} could not be written (the disk is full, ") and "\n" not in sentence
    assert sentence.endswith(" free); the previous best.onnx is intact")
    assert path.read_bytes() == b"the previous export" and no_temporary_files(folder)
    return sentence


def four_megabytes(path):
    with open(path, "wb") as f:
        for _ in range(64):
            f.write(b"\0" * 65536)
            f.flush()


def test_a_full_disk_while_exporting_keeps_the_previous_file(tmp_path):
    def injected(path):
        Path(path).write_bytes(b"half an onnx graph")
        raise_enospc()

    print("injected:", check_export_kept(tmp_path, injected))
    on_a_real_full_disk(tmp_path, lambda disk: check_export_kept(disk, four_megabytes))
