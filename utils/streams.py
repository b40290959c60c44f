"""Live sources for detect.py: RTSP/RTMP/HTTP(S) URLs, webcams, and .streams lists of them.

Each source is read by a background thread that keeps only the newest frame. A consumer slower than
the camera otherwise reads frames queued seconds ago and falls further behind the longer it runs
(the usual "RTSP lag"); here it always gets the last frame received, and the ones it had no time
for are dropped. A video file (on disk or behind a URL) has an end and no hurry: every frame is
kept. A live source that drops is reopened RECONNECT_ATTEMPTS times before it counts as stopped.
VideoOut writes detect.py's annotated .mp4 of each video, webcam and stream.
"""

import os
import re
import threading
from pathlib import Path
from urllib.parse import urlsplit

import cv2

RECONNECT_ATTEMPTS = 3  # reopen a dropped source this many times before giving up on it
RECONNECT_BACKOFF_S = 0.5  # wait before the first reopen, doubled before each next one
OPEN_TIMEOUT_S = 10  # a camera that accepts the connection but never answers must not hang the run
READ_TIMEOUT_S = 10  # nor one that stops sending without closing: the read fails and the reopening starts
URL_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://")


def is_url(source):
    return str(source).lower().startswith(URL_SCHEMES)


def read_streams_file(path):
    """The sources a .streams file lists, one a line; '#' starts a comment. Digits are webcam indices,
    relative paths are relative to the file."""
    sources = []
    for line in Path(path).read_text().splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()  # a '#' inside a URL (no space before it) is kept
        if not line:
            continue
        if line.isdigit():
            sources.append(int(line))
        elif is_url(line) or Path(line).is_absolute():
            sources.append(line)
        else:
            sources.append(str(Path(path).parent / line))
    return sources


def display_name(source):
    """The source as messages show it: a URL's password never reaches a terminal or a log."""
    if isinstance(source, int):
        return f"webcam {source}"
    parts = urlsplit(source) if is_url(source) else None
    if parts is None or parts.password is None:
        return source
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()


def source_names(sources):
    """A file-name stem per source, unique among them: host, port, path and query for a URL (never its
    user or password), webcamN, or the file's stem."""
    names, taken = [], set()
    for source in sources:
        if isinstance(source, int):
            name = f"webcam{source}"
        elif is_url(source):
            parts = urlsplit(source)
            path = re.sub(r"\.\w+$", "", parts.path)  # video.mjpg -> video: the name gets .mp4
            name = "_".join(str(p) for p in (parts.hostname, parts.port, path, parts.query) if p)
        else:
            name = Path(source).stem
        name = re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_.")[:100] or "stream"
        unique, k = name, 2
        while unique in taken:
            unique, k = f"{name}_{k}", k + 1
        taken.add(unique)
        names.append(unique)
    return names


def unreachable_hint(source):
    """What to check when a source cannot be opened."""
    if isinstance(source, int):
        return "check that the camera is connected and not in use by another program"
    if is_url(source):
        return (
            "check the address (host, port, path), that the camera or server is running and reachable from this "
            "machine, and the user:password in the URL if it needs one"
        )
    return "check that the file exists and is a video"


def quiet_video_logs():
    """FFmpeg and OpenCV print their own lines when a connection is refused or a stream ends (several per
    reconnection attempt), next to the one sentence detect.py prints; a level the user set still wins."""
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # read when FFmpeg first starts, so before any capture
    if "OPENCV_LOG_LEVEL" not in os.environ:
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


def open_capture(source):
    """A cv2.VideoCapture of a URL, file or webcam index, with time limits on opening and reading."""
    if isinstance(source, int):
        capture = cv2.VideoCapture(source)
    else:
        timeouts = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, OPEN_TIMEOUT_S * 1000, cv2.CAP_PROP_READ_TIMEOUT_MSEC]
        capture = cv2.VideoCapture(source, cv2.CAP_ANY, timeouts + [READ_TIMEOUT_S * 1000])
    # Backends with a queue of their own (V4L2 webcams, some GStreamer pipelines) would otherwise hand out
    # old frames first; FFmpeg has no such queue and ignores it.
    capture.set(cv2.CAP_PROP_BUFFERSIZE, 1)
    return capture


class StreamError(Exception):
    pass


class Stream:
    """One source read by a background thread. take() gives (index, frame): the newest frame received
    since the last take (index counts every frame received since the start, reconnections included),
    or None when there is none yet. With stride N only every Nth frame received is decoded and kept.
    finished: the thread has ended (error says why, when it was not the end of a video file)."""

    def __init__(self, source, stride=1, notify=None):
        self.source, self.stride, self.notify = source, max(1, stride), notify
        self.name = display_name(source)
        capture = open_capture(source)
        if not capture.isOpened():
            capture.release()
            raise StreamError(f"{self.name} cannot be opened: {unreachable_hint(source)}")
        self.fps = capture.get(cv2.CAP_PROP_FPS) or 30  # webcams often report 0
        self.finite = capture.get(cv2.CAP_PROP_FRAME_COUNT) > 0  # a video file; live sources report 0 or less
        self.received, self.reconnections, self.error, self.finished = 0, 0, None, False
        self._frame, self._index = None, -1
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(capture,), name=f"stream {self.name}", daemon=True)
        self._thread.start()

    def take(self):
        with self._changed:
            frame, index, self._frame = self._frame, self._index, None
            self._changed.notify_all()  # a video file's reader waits for its frame to be taken
        return None if frame is None else (index, frame)

    def close(self):
        """Stop the thread. A read blocked in FFmpeg may last up to READ_TIMEOUT_S: the thread is a daemon
        and releases its capture itself, so this waits only a moment for it."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=1)

    def _read(self, capture):
        failures = 0  # reconnection attempts since the last frame received
        try:
            while not self._stop.is_set():
                if self.received % self.stride:
                    ok, frame = capture.grab(), None  # skipped frames are not decoded
                else:
                    ok, frame = capture.read()
                if ok:
                    failures = 0
                    self.received += 1
                    if frame is not None:
                        self._publish(self.received - 1, frame)
                    continue
                capture.release()
                if self.finite:  # the end of the video, not a drop
                    break
                while failures < RECONNECT_ATTEMPTS:
                    if self._stop.wait(RECONNECT_BACKOFF_S * 2**failures):
                        return
                    failures += 1
                    capture = open_capture(self.source)
                    if capture.isOpened():
                        self.reconnections += 1
                        break
                    capture.release()
                else:
                    self.error = f"no frame after {RECONNECT_ATTEMPTS} reconnection attempts"
                    break
        finally:
            capture.release()
            self.finished = True
            if self.notify is not None:
                self.notify.set()

    def _publish(self, index, frame):
        with self._changed:
            if self.finite:  # every frame of a file is wanted: wait until the last one was taken
                self._changed.wait_for(lambda: self._frame is None or self._stop.is_set())
            self._frame, self._index = frame, index
        if self.notify is not None:
            self.notify.set()


class VideoOut:
    """An .mp4 opened at the first frame written, when the size becomes known."""

    def __init__(self, path, fps):
        self.path, self.fps, self.writer, self.size = path, fps, None, None

    def write(self, frame):
        if self.writer is None:
            self.size = frame.shape[1], frame.shape[0]
            self.writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, self.size)
        if (frame.shape[1], frame.shape[0]) != self.size:  # a camera reconfigured while it was away
            frame = cv2.resize(frame, self.size)  # cv2.VideoWriter silently drops frames of another size
        self.writer.write(frame)

    def close(self):
        if self.writer is not None:
            self.writer.release()
