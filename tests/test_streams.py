"""Tests for utils/streams.py and detect.py on live sources: MJPEG over HTTP served by the test itself on
127.0.0.1 (what many IP cameras send, and what OpenCV's FFmpeg reads like any other stream URL).

Each frame carries its own number: 10 vertical stripes of 8 px, white for a 1 bit, black for a 0 (aligned
on JPEG's 8x8 blocks, so compression does not blur them), so a test can tell which frames it was given.
Every server streams for at most SERVE_S seconds and then stops by itself.
"""

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
from calibrated_model import make_checkpoint, one_thread  # noqa: F401 (one_thread: autouse fixture)

import detect
from utils import streams
from utils.streams import Stream, display_name, read_streams_file, source_names

ROOT = Path(__file__).resolve().parents[1]
H, W, BITS = 64, 80, 10
SERVE_S = 30


def numbered_frame(index):
    img = np.zeros((H, W, 3), np.uint8)
    for bit in range(BITS):
        if index >> bit & 1:
            img[:, bit * 8 : bit * 8 + 8] = 255
    return img


def frame_number(img):
    return sum(1 << bit for bit in range(BITS) if img[:, bit * 8 : bit * 8 + 8].mean() > 128)


class MjpegServer:
    """multipart/x-mixed-replace JPEG frames at `fps`, numbered from `first`. stop() drops every client
    mid-stream and closes the port; with drop_after, the server does that itself after so many frames."""

    def __init__(self, port=0, fps=30, first=0, drop_after=None):
        self.fps, self.first, self.drop_after, self.sent = fps, first, drop_after, first - 1
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                index, end = server.first, time.monotonic() + SERVE_S
                while not server.stopping.is_set() and time.monotonic() < end:
                    if server.drop_after is not None and index - server.first == server.drop_after:
                        server.stop()  # the port is closed before this client sees the end of its stream
                        return
                    jpeg = cv2.imencode(".jpg", numbered_frame(index))[1].tobytes()
                    head = b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                    try:
                        self.wfile.write(head + jpeg + b"\r\n")
                    except OSError:  # the client went away
                        return
                    server.sent, index = index, index + 1
                    time.sleep(1 / server.fps)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/video"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        if not self.stopping.is_set():
            self.httpd.shutdown()
            self.httpd.server_close()
            self.stopping.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return False


def video_frames(path):
    capture = cv2.VideoCapture(str(path))
    frames = 0
    while capture.read()[0]:
        frames += 1
    return frames


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt")


@pytest.fixture
def quick_reconnect(monkeypatch):
    monkeypatch.setattr(streams, "RECONNECT_BACKOFF_S", 0.05)


def test_opencv_reads_mjpeg_over_http():
    assert any(line.split() == ["FFMPEG:", "YES"] for line in cv2.getBuildInformation().splitlines()), (
        "this OpenCV has no FFmpeg: it cannot read stream URLs"
    )
    with MjpegServer(drop_after=10) as server:
        capture = cv2.VideoCapture(server.url)
        numbers = []
        while (got := capture.read())[0]:
            numbers.append(frame_number(got[1]))
    assert numbers == list(range(10))


def test_names_files_and_passwords(tmp_path):
    sources = [
        "rtsp://admin:secret@192.168.1.10:554/Streaming/Channels/101",
        "http://cam.local/video.mjpg?channel=1",
        "http://cam.local/video.mjpg?channel=2",
        "http://cam.local/video.mjpg?channel=1",
        0,
        "/data/clip.mp4",
    ]
    assert source_names(sources) == [
        "192.168.1.10_554_Streaming_Channels_101",
        "cam.local_video_channel_1",
        "cam.local_video_channel_2",
        "cam.local_video_channel_1_2",
        "webcam0",
        "clip",
    ]
    assert display_name(sources[0]) == "rtsp://admin:***@192.168.1.10:554/Streaming/Channels/101"
    listing = tmp_path / "cameras.streams"
    listing.write_text("# entrance\nrtsp://cam1/live#main\n\n  1  # the USB camera\nclips/door.mp4\n")
    assert read_streams_file(listing) == ["rtsp://cam1/live#main", 1, str(tmp_path / "clips/door.mp4")]


def test_reader_keeps_only_the_newest_frame():
    """A consumer taking a frame every 0.2 s from a 30 fps camera gets the frame just sent, not the next one
    in a queue: the numbers jump by about 6, and it is never more than a few frames behind the camera."""
    with MjpegServer(fps=30) as server:
        stream = Stream(server.url)
        try:
            seen = []
            for _ in range(10):
                time.sleep(0.2)
                got = stream.take()
                if got is not None:
                    seen.append((frame_number(got[1]), server.sent, got[0]))
        finally:
            stream.close()
    numbers = [number for number, _, _ in seen]
    assert len(seen) >= 6 and numbers == sorted(set(numbers)), seen  # a take may find nothing new if the server stalls
    assert (numbers[-1] - numbers[0]) / (len(numbers) - 1) >= 3, seen  # a queue would give steps of 1
    assert all(sent - number <= 8 for number, sent, _ in seen), seen  # a queue would be 50 frames behind at the end
    assert all(index == number for number, _, index in seen), seen  # the index counts the frames received


def take_all(stream, pause=0.0, timeout=20):
    """The numbers of the frames a consumer taking one every `pause` seconds gets, until the stream stops."""
    numbers, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        finished = stream.finished
        got = stream.take()
        if got is not None:
            numbers.append(frame_number(got[1]))
            time.sleep(pause)
        elif finished:
            break
        else:
            time.sleep(0.005)
    return numbers


def test_reader_vid_stride_keeps_every_third_frame(quick_reconnect):
    with MjpegServer(drop_after=30) as server:
        stream = Stream(server.url, stride=3)
        try:
            numbers = take_all(stream)
        finally:
            stream.close()
    assert numbers and all(n % 3 == 0 for n in numbers), numbers
    assert stream.received == 30 and stream.error == "no frame after 3 reconnection attempts"


def test_reader_reconnects_when_the_server_comes_back():
    first = MjpegServer()
    stream = Stream(first.url)
    try:
        assert wait_for(lambda: stream.take() is not None, 10)
        first.stop()  # mid-stream: the client is dropped and the port closed
        time.sleep(0.2)
        with MjpegServer(port=first.port, first=500):  # back within the first backoff (0.5 s)
            assert wait_for(lambda: (got := stream.take()) is not None and frame_number(got[1]) >= 500, 10)
        assert stream.reconnections == 1 and stream.error is None
    finally:
        stream.close()
        first.stop()


def test_video_url_gives_every_frame(tmp_path):
    """A video file behind a URL has an end and no hurry: a slow consumer still gets every frame, in order,
    and its end is not taken for a drop."""
    writer = cv2.VideoWriter(str(tmp_path / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (W, H))
    for k in range(12):
        writer.write(numbered_frame(k))
    writer.release()

    class Files(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=str(tmp_path)))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        stream = Stream(f"http://127.0.0.1:{httpd.server_address[1]}/clip.avi")
        try:
            numbers = take_all(stream, pause=0.05)
        finally:
            stream.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert numbers == list(range(12)) and stream.error is None and stream.reconnections == 0


def label_indices(out, name):
    return sorted(int(p.stem.rsplit("_", 1)[1]) for p in (out / "labels").glob(f"{name}_*.txt"))


def test_detect_stream_that_drops_for_good(weights, tmp_path, capsys, quick_reconnect):
    """The source is reported in one sentence, detect.py ends normally, and the video holds every frame
    processed before the drop."""
    with MjpegServer(drop_after=40) as server:
        out = detect.main(
            ["--weights", str(weights), "--source", server.url, "--save-txt", "--out", str(tmp_path / "out")]
        )
    printed = capsys.readouterr().out
    name = f"127.0.0.1_{server.port}_video"
    assert printed.count(f"stream {server.url} stopped: no frame after 3 reconnection attempts (") == 1, printed
    indices = label_indices(out, name)
    assert indices and indices[-1] < 40 and video_frames(out / f"{name}.mp4") == len(indices), indices
    assert f"{len(indices)} frames, " in printed and "speed per image" in printed


def test_detect_streams_file_with_two_cameras_and_one_down(weights, tmp_path, capsys, quick_reconnect):
    down = f"http://127.0.0.1:{closed_port()}/video"
    with MjpegServer(drop_after=30) as a, MjpegServer(drop_after=30) as b:
        listing = tmp_path / "cameras.streams"
        listing.write_text(f"# the yard\n{a.url}\n\n{b.url}  # the gate\n{down}\n")
        out = detect.main(["--weights", str(weights), "--source", str(listing), "--save-txt", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert printed.count(f"warning: {down} cannot be opened: check the address") == 1, printed
    for server in (a, b):
        name = f"127.0.0.1_{server.port}_video"
        indices = label_indices(out, name)
        assert indices and video_frames(out / f"{name}.mp4") == len(indices), (name, indices)
        assert printed.count(f"stream {server.url} stopped: ") == 1, printed
    assert len(list(out.glob("*.mp4"))) == 2


def test_vid_stride_on_a_video_file(weights, tmp_path):
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (W, H))
    for k in range(12):
        writer.write(numbered_frame(k))
    writer.release()
    out = detect.main(
        ["--weights", str(weights), "--source", str(video), "--vid-stride", "3", "--save-txt", "--out", str(tmp_path)]
    )
    assert label_indices(out, "clip") == [0, 3, 6, 9]  # named by their frame in the source
    assert video_frames(out / "clip.mp4") == 4


def test_unreachable_source_one_sentence_and_nonzero_exit(weights, tmp_path):
    """In a process of its own: FFmpeg prints its own lines unless silenced before its first use."""
    url = f"http://127.0.0.1:{closed_port()}/video"
    done = subprocess.run(
        [sys.executable, "detect.py", "--weights", str(weights), "--source", url, "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert lines == [f"error: --source {url} cannot be opened: {streams.unreachable_hint(url)}"], done.stderr
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_and_saves(weights, tmp_path, capsys):
    """The first Ctrl+C finishes the frame at hand: detect.py ends normally and the video holds exactly the
    frames whose labels were written."""
    out = tmp_path / "out"

    def ctrl_c_after_5_frames():
        # labels exist only inside detect.py's Ctrl+C handler, so the signal never reaches pytest's own
        if wait_for(lambda: len(list(out.glob("labels/*.txt"))) >= 5, 30):
            os.kill(os.getpid(), signal.SIGINT)

    with MjpegServer() as server:
        threading.Thread(target=ctrl_c_after_5_frames, daemon=True).start()
        detect.main(["--weights", str(weights), "--source", server.url, "--save-txt", "--out", str(out)])
    name = f"127.0.0.1_{server.port}_video"
    indices = label_indices(out, name)
    assert len(indices) >= 5 and video_frames(out / f"{name}.mp4") == len(indices), indices
    assert f"{server.url}: {len(indices)} frames" in capsys.readouterr().out
