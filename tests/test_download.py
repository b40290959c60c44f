"""Ultralytics' published checkpoints by name (utils/download.py): `--weights yolo11n.pt` with no such file is
downloaded once into the cache folder, checked, and read from there on; a failed download says what to do in one
sentence and leaves nothing half-written. The checkpoints are served by an HTTP server on 127.0.0.1 that the test
starts ($WEIGHTS_URL is a flat mirror); the file it serves is an Ultralytics-format yolo11n.pt built without the
ultralytics package (test_ultralytics_checkpoint.py). Also: train.py checks every file a run reads before any
dataset work (models/weights.py run_files)."""

import argparse
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import warm_python
import yaml
from test_ultralytics_checkpoint import PACKAGE, _drop_package, save_like_ultralytics, ultralytics_model
from train_runs import REPO, TINY, run

from models.weights import load_weights, run_files
from models.yolo import YOLO
from utils.checkpoints.ours import CheckpointError
from utils.download import PUBLISHED, resolve_weights


@pytest.fixture(scope="module")
def yolo11n_bytes(tmp_path_factory):
    """The bytes of an Ultralytics yolo11n.pt (3 classes), as their trainer writes it."""
    root = tmp_path_factory.mktemp("site")
    for name, text in PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    sys.path.insert(0, str(root))
    try:
        path = root / "yolo11n.pt"
        save_like_ultralytics(ultralytics_model(YOLO("11n", nc=3), "11"), path)
        return path.read_bytes()
    finally:
        _drop_package(root)


class Server:
    """A file server on 127.0.0.1: GET /<mode>/<name> answers as `mode` says, with the checkpoint's bytes:
    good, missing (404), truncated (half the announced bytes), html (a login page), stall (headers never come),
    gated (headers and the first bytes, then the rest once `gate` is set). `requests` counts the GETs by path."""

    def __init__(self, body):
        self.body, self.requests, self.gate, self.asked = body, {}, threading.Event(), threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests[self.path] = server.requests.get(self.path, 0) + 1
                server.answer(self, self.path.split("/")[1])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, mode):
        return f"http://127.0.0.1:{self.httpd.server_port}/{mode}"

    def answer(self, handler, mode):
        if mode == "stall":
            self.gate.wait(30)
            return
        if mode == "missing":
            handler.send_error(404)
            return
        body = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>" if mode == "html" else self.body
        handler.send_response(200)
        handler.send_header("Content-Type", "text/html" if mode == "html" else "application/octet-stream")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if mode == "truncated":
            handler.wfile.write(body[: len(body) // 2])
            return  # the connection closes short of the announced length
        if mode == "gated":
            handler.wfile.write(body[:1000])
            handler.wfile.flush()
            self.asked.set()
            self.gate.wait(60)
            body = body[1000:]
        handler.wfile.write(body)


@pytest.fixture
def server(yolo11n_bytes):
    served = Server(yolo11n_bytes)
    yield served
    served.gate.set()
    served.httpd.shutdown()
    served.httpd.server_close()


@pytest.fixture
def weights_dir(tmp_path, monkeypatch):
    """The cache folder of this test ($WEIGHTS_DIR): never the user's own."""
    folder = tmp_path / "weights"
    monkeypatch.setenv("WEIGHTS_DIR", str(folder))
    return folder


def left_in(folder):
    """The files in the cache folder, but for the lock file that stays (an empty file, never half a checkpoint)."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock") if folder.exists() else []


def test_a_published_name_is_downloaded_once_checked_and_then_read_from_the_cache(
    server, weights_dir, monkeypatch, capsys, yolo11n_bytes
):
    monkeypatch.setenv("WEIGHTS_URL", server.url("good"))
    weights_dir.mkdir()
    (weights_dir / ".yolo11n.pt.4194999.tmp").write_bytes(b"PK")  # what a download killed with SIGKILL left
    path = resolve_weights("yolo11n.pt")
    assert Path(path) == weights_dir / "yolo11n.pt"
    assert Path(path).read_bytes() == yolo11n_bytes
    assert left_in(weights_dir) == ["yolo11n.pt"]  # no temporary file beside it, neither this one's nor the old one
    assert str(weights_dir / "yolo11n.pt") in capsys.readouterr().out  # the path is printed

    loaded = load_weights("yolo11n.pt")  # by name, as every script's --weights and predict's load() take it
    assert (loaded.kind, loaded.checkpoint["scale"], loaded.checkpoint["licence"]) == ("ultralytics", "11n", "AGPL-3.0")
    assert "weights under AGPL-3.0" in capsys.readouterr().out  # the licence, said when the file is used
    assert server.requests == {"/good/yolo11n.pt": 1}  # the second use read the cache


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("missing", "HTTP Error 404"),
        ("truncated", "truncated"),
        ("html", "HTML page"),
        ("stall", "stalled"),
        ("wrong", "holds model 11n, not n"),  # a mirror whose yolov8n.pt is another model
    ],
)
def test_a_failed_download_says_what_to_do_in_one_sentence_and_leaves_nothing(
    server, weights_dir, monkeypatch, mode, reason
):
    name = "yolov8n.pt" if mode == "wrong" else "yolo11n.pt"
    monkeypatch.setenv("WEIGHTS_URL", server.url("good" if mode == "wrong" else mode))
    with pytest.raises(CheckpointError) as error:
        resolve_weights(name, timeout=1)  # a stalled server: a timeout, not a hang
    message = str(error.value)
    assert reason in message
    assert f"{server.url('good' if mode == 'wrong' else mode)}/{name}" in message  # the URL
    assert f"by hand from that URL (or a machine that has it) to {weights_dir / name}" in message
    assert "\n" not in message
    assert left_in(weights_dir) == []


def test_offline_the_sentence_names_the_url_and_the_cache_path(weights_dir, monkeypatch):
    monkeypatch.setenv("WEIGHTS_URL", "http://127.0.0.1:9/mirror")  # the discard port: nothing listens
    with pytest.raises(CheckpointError, match=r"yolo26s\.pt could not be downloaded from http://127\.0\.0\.1:9/mirror"):
        resolve_weights("yolo26s.pt", timeout=2)
    assert left_in(weights_dir) == []


def test_a_cache_folder_that_cannot_be_made_is_named(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("WEIGHTS_DIR", str(tmp_path / "a_file" / "weights"))
    with pytest.raises(
        CheckpointError, match=r"yolo11n\.pt cannot be cached in .*a_file/weights \(Not a directory\); "
    ):
        resolve_weights("yolo11n.pt")


def test_two_processes_asking_for_one_name_download_it_once(server, weights_dir, yolo11n_bytes):
    env = {**os.environ, "WEIGHTS_URL": server.url("gated"), "WEIGHTS_DIR": str(weights_dir), "PYTHONUNBUFFERED": "1"}
    code = "from utils.download import resolve_weights; print('path', resolve_weights('yolo11n.pt'))"
    start = [sys.executable, "-c", code]
    first = subprocess.Popen(start, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.asked.wait(120), "the first process never asked the server"
    # the first is mid-download (the server holds the rest back); the second must wait for it, not fetch again
    second = subprocess.Popen(start, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in second.stdout:
        if "waiting for another process" in line:
            break
    server.gate.set()
    outputs = [p.communicate(timeout=120)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0]
    assert all(f"path {weights_dir / 'yolo11n.pt'}" in out for out in outputs)
    assert server.requests == {"/gated/yolo11n.pt": 1}
    assert (weights_dir / "yolo11n.pt").read_bytes() == yolo11n_bytes
    assert left_in(weights_dir) == ["yolo11n.pt"]


def test_detect_takes_a_published_name_as_its_weights(server, weights_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("WEIGHTS_URL", server.url("good"))
    image = tmp_path / "photo.jpg"
    cv2.imwrite(str(image), np.full((64, 96, 3), 127, np.uint8))
    cmd = [sys.executable, "detect.py", "--weights", "yolo11n.pt", "--source", image, "--out", tmp_path / "out"]
    result = warm_python.run([*map(str, cmd), "--device", "cpu"], REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{weights_dir / 'yolo11n.pt'}: weights under AGPL-3.0" in result.stdout
    assert (tmp_path / "out" / "photo.jpg").is_file()
    assert server.requests == {"/good/yolo11n.pt": 1}


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(CheckpointError) as error:
        resolve_weights("yolo11q.pt", "--weights")
    message = str(error.value)
    assert message.startswith("--weights yolo11q.pt is neither a file nor one of Ultralytics' published")
    assert all(name in message for name in PUBLISHED)
    assert resolve_weights("runs/train/exp/weights/best.pt") == "runs/train/exp/weights/best.pt"  # a path: as is


def test_a_run_records_the_file_and_licence_of_a_published_model(server, weights_dir, monkeypatch):
    monkeypatch.setenv("WEIGHTS_URL", server.url("good"))
    args = argparse.Namespace(model="yolo11n.pt", weights="", teacher="", data="data/shapes.yaml")
    sources = {"model": "command line"}
    files = run_files(args, None, sources)
    assert (files.init_path, files.init_checkpoint["scale"], files.licence) == (
        str(weights_dir / "yolo11n.pt"),
        "11n",
        "AGPL-3.0",
    )
    # args.yaml writes this beside `model: yolo11n.pt`; the checkpoints get `licence` (train.py checkpoint_header)
    assert sources["model"] == f"command line; read from {weights_dir / 'yolo11n.pt'}; licence AGPL-3.0"


@pytest.fixture
def generated_on_use(tmp_path):
    """A dataset yaml of the built-in generator, whose images do not exist until a run generates them."""
    cfg = tmp_path / "gen.yaml"
    spec = {"path": "gen", "train": "images/train", "val": "images/val", "names": ["a", "b", "c", "d", "e", "f"]}
    spec |= {"generated_by": "utils/data/shapes.py", "generator_settings": {"n_train": 4, "n_val": 2, "size": 64}}
    cfg.write_text(yaml.safe_dump(spec))
    return cfg


@pytest.mark.parametrize(
    "flags, sentence",
    [
        (["--weights", "missing.pt"], "error: --weights: checkpoint missing.pt does not exist"),
        (["--model", "yolo11q.pt"], "error: --model: yolo11q.pt is neither a file nor one of Ultralytics' published"),
        (["--teacher", "gone.pt"], "error: --teacher: checkpoint gone.pt does not exist"),
        (["--data", "nowhere.yaml"], "error: --data nowhere.yaml: dataset yaml does not exist"),
    ],
)
def test_train_checks_every_file_before_any_dataset_work(generated_on_use, tmp_path, flags, sentence, weights_dir):
    result = run(["--data", generated_on_use, *TINY, "--out", tmp_path / "run", *flags], check=False)
    assert result.returncode != 0
    assert sentence in result.stderr
    assert not (tmp_path / "gen").exists()  # the dataset was not generated, let alone verified
    assert not (tmp_path / "run").exists()
