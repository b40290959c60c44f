"""Tests for utils/track.py and detect.py --track: ids kept through a crossing and a short occlusion (at
--vid-stride 1 and 3), lost tracks forgotten after so many frames of the source, MOT text scored by TrackEval,
the emulated GPU path, image folders refused, and a stream that drops and comes back."""

import itertools
import threading
import time

import cv2
import numpy as np
import pytest
import torch
from calibrated_model import make_checkpoint, one_thread, scene  # noqa: F401 (one_thread: autouse fixture)
from runtimes import needs
from test_streams import MjpegServer, quick_reconnect  # noqa: F401 (quick_reconnect: a fixture)

import detect
from bench.track_sequence import make_sequence, write_mot
from utils import track
from utils.track import Tracker, TrackWriter, hungarian, linear_assignment

SIZE = 30


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt")


def box(cx, cy, size=SIZE):
    return [cx - size / 2, cy - size / 2, cx + size / 2, cy + size / 2]


def crossing(frames=60, speed=6.0, seed=0):
    """Two objects on one line in opposite directions, meeting at frame 30: B enters at frame 6 (a new track, its
    speed unknown), is hidden behind A for frames 28-32 (no detection of it), and A behind a pillar for frames
    40-47. {frame: (dets, true object of each det)}."""
    rng, sequence = np.random.default_rng(seed), {}
    for t in range(frames):
        centres = {"A": (40 + speed * t, 100), "B": (40 + speed * 60 - speed * t, 106)}
        hidden = {"B"} if t < 6 or 28 <= t <= 32 else {"A"} if 40 <= t <= 47 else set()
        rows, owners = [], []
        for name, (cx, cy) in centres.items():
            if name not in hidden:
                rows.append([*(np.array(box(cx, cy)) + rng.normal(0, 1, 4)), rng.uniform(0.6, 0.9), 0])
                owners.append(name)
        sequence[t] = (np.array(rows), owners)
    return sequence


def ids_per_object(tracker, sequence, stride):
    """The set of track ids each object's detections were given, over the frames a stride keeps."""
    seen = {"A": set(), "B": set()}
    for t in range(0, len(sequence), stride):
        dets, owners = sequence[t]
        tracks = tracker.update(dets, t)
        for owner, det in zip(owners, dets):
            overlap = [i for i, b in zip(tracks.ids, tracks.boxes) if np.abs(b - det[:4]).max() < SIZE / 3]
            seen[owner].update(int(i) for i in overlap)
    return seen


@pytest.mark.parametrize("stride", [1, 3])
def test_ids_kept_through_a_crossing_and_a_short_occlusion(stride):
    """At stride 3 the objects move 18 px between processed frames (60% of their width) and 36 px towards each
    other: the prediction must cover the gap, and B, hidden while they cross, must come back as B."""
    seen = ids_per_object(Tracker(), crossing(), stride)
    assert len(seen["A"]) == 1 and len(seen["B"]) == 1 and seen["A"] != seen["B"], seen


@pytest.mark.parametrize("stride", [1, 3])
def test_a_lost_track_waits_lost_frames_of_the_source(stride):
    """An object gone 20 frames of the source keeps its id, one gone 40 gets a new one, whatever the stride."""
    for gap, same in ((20, True), (40, False)):
        tracker, ids = Tracker(), []
        for t in range(0, 12 + gap + 12, stride):
            if not 12 <= t < 12 + gap:
                ids += tracker.update(np.array([[*box(100, 100), 0.9, 1]]), t).ids.tolist()
        assert len(set(ids)) == (1 if same else 2), (gap, ids)
    assert track.LOST_FRAMES == 30


def test_irregular_gaps_between_frames_predict_as_far_as_the_object_moved():
    """A live stream with a slow model gets frames 1 to 6 apart: the prediction covers each gap (a filter that
    counted processed frames would be 6 times short after a long one, and lose the object)."""
    tracker, ids, t = Tracker(), [], 0
    for gap in [1, 1, 1, 1, 6, 1, 5, 2, 6, 1, 1, 6, 3, 6]:
        t += gap
        ids += tracker.update(np.array([[*box(20 + 9 * t, 100), 0.9, 0]]), t).ids.tolist()
    assert ids == [1] * 14


def test_ids_start_at_one_and_tentative_tracks_need_a_second_detection():
    tracker = Tracker()
    first = tracker.update(np.array([[*box(50, 50), 0.9, 2]]), 0)
    assert first.ids.tolist() == [1] and first.classes.tolist() == [2]  # the first frame confirms at once
    assert len(tracker.update(np.array([[*box(52, 50), 0.9, 2], [*box(300, 300), 0.9, 0]]), 1).ids) == 1
    assert sorted(tracker.update(np.array([[*box(54, 50), 0.9, 2], [*box(300, 300), 0.9, 0]]), 2).ids) == [1, 2]
    assert len(tracker.update(np.zeros((0, 6)), 3).ids) == 0  # nothing seen: nothing reported


def test_assignment_is_optimal_and_respects_the_limit():
    rng = np.random.default_rng(1)
    for n in range(1, 6):
        cost = rng.random((n, n))
        best = min(sum(cost[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
        assert np.isclose(cost[np.arange(n), hungarian(cost)].sum(), best)
    cost = np.array([[0.1, 0.9], [0.2, 0.95], [0.9, 0.9]])
    assert linear_assignment(cost, 0.8) == [(0, 0)]  # row 1 would rather have column 0 too; column 1 is too dear
    assert linear_assignment(np.zeros((0, 3)), 0.8) == []


@needs("trackeval")
def test_mot_text_round_trips_through_the_evaluator(tmp_path):
    from bench.track_benchmark import evaluate, ours

    gt, dets, _ = make_sequence(seed=4, frames=90, count=12)
    write_mot(tmp_path / "gt.txt", gt)
    frames = np.arange(90) + 1
    perfect = evaluate([(tmp_path / "gt.txt", tmp_path / "gt.txt", frames)])
    assert perfect == {"HOTA": 1.0, "MOTA": 1.0, "IDF1": 1.0, "IDSW": 0}
    switched = gt.copy()
    switched[(switched[:, 1] == 1) & (switched[:, 0] >= 45), 1] = 99  # object 1 changes id half way
    write_mot(tmp_path / "switched.txt", switched)
    scores = evaluate([(tmp_path / "gt.txt", tmp_path / "switched.txt", frames)])
    assert scores["IDSW"] == 1 and scores["IDF1"] < 1 and np.isclose(scores["MOTA"], 1 - 1 / len(gt))
    # the tracker on the generated detections, through its own MOT file
    write_mot(tmp_path / "ours.txt", ours(dets, range(90)))
    tracked = evaluate([(tmp_path / "gt.txt", tmp_path / "ours.txt", frames)])
    assert tracked["HOTA"] > 0.5 and tracked["IDF1"] > 0.6, tracked


def moving_video(path, frames=20, size=96):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (size, size))
    background = scene(5, size, size)
    for t in range(frames):
        img = background.copy()
        cv2.rectangle(img, (5 + 2 * t, 20), (35 + 2 * t, 50), (255, 255, 255), -1)
        cv2.circle(img, (80 - 2 * t, 70), 14, (0, 0, 0), -1)
        writer.write(cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    writer.release()


def read_tracks(path):
    return np.array([line.split(",") for line in path.read_text().splitlines()], dtype=float).reshape(-1, 8)


def test_detect_track_on_the_emulated_gpu(weights, emulated_gpu, tmp_path):
    moving_video(tmp_path / "clip.avi")
    args = ["--weights", weights, "--source", tmp_path / "clip.avi", "--track", "--vid-stride", "2", "--device", "0"]
    out = detect.main([*map(str, args), "--conf", "0.3", "--max-det", "20", "--out", str(tmp_path / "out")])
    assert emulated_gpu.count("convolution", torch.float32) > 0
    rows = read_tracks(out / "tracks" / "clip.txt")
    assert len(rows) and set(rows[:, 0]) <= set(range(1, 21, 2))  # frame numbers of the source, from 1
    assert rows[:, 1].min() >= 1 and (rows[:, 4:6] > 0).all() and set(rows[:, 7]) <= {0, 1, 2}
    assert cv2.VideoCapture(str(out / "clip.mp4")).get(cv2.CAP_PROP_FRAME_COUNT) == 10


def test_track_on_images_only_says_it_needs_a_video(weights, tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), scene(0))
    with pytest.raises(SystemExit, match="--track needs a video, a webcam or a stream; --source .* names images only"):
        detect.main(["--weights", str(weights), "--source", str(tmp_path), "--track", "--out", str(tmp_path / "o")])


def test_a_stream_back_within_seconds_keeps_its_ids_else_starts_new_ones(tmp_path, monkeypatch):
    writer = TrackWriter(tmp_path / "tracks" / "cam.txt")
    for t in range(3):
        writer.update(np.array([[*box(50 + t, 50), 0.9, 0]]), t)
    assert "keep their track ids" in writer.reconnected()
    assert writer.update(np.array([[*box(54, 50), 0.9, 0]]), 4).ids.tolist() == [1]
    writer.last_time = time.monotonic() - track.RESET_AFTER_S - 1  # away longer than RESET_AFTER_S
    assert "get new track ids" in writer.reconnected()
    assert writer.update(np.array([[*box(55, 50), 0.9, 0]]), 5).ids.tolist() == [2]  # a new id, never 1 again
    writer.close()
    assert read_tracks(tmp_path / "tracks" / "cam.txt")[:, :2].tolist() == [[1, 1], [2, 1], [3, 1], [5, 1], [6, 2]]


def test_detect_track_on_a_stream_that_drops_and_comes_back(weights, tmp_path, capsys, quick_reconnect):  # noqa: F811
    first, servers = MjpegServer(), []
    port = first.port

    def drop_then_return():
        wait_for = time.monotonic() + 10
        while first.sent < 15 and time.monotonic() < wait_for:
            time.sleep(0.02)
        first.stop()
        time.sleep(0.1)
        servers.append(MjpegServer(port=port, first=500, drop_after=15))  # back at once; gone for good after 15

    thread = threading.Thread(target=drop_then_return, daemon=True)
    thread.start()
    try:
        out = detect.main(["--weights", str(weights), "--source", first.url, "--track", "--out", str(tmp_path / "o")])
    finally:
        thread.join()
        for server in [first, *servers]:
            server.stop()
    printed = capsys.readouterr().out
    assert f"stream {first.url} dropped and was reopened; away " in printed, printed
    assert "its objects keep their track ids" in printed
    assert (out / "tracks" / f"127.0.0.1_{port}_video.txt").exists()
