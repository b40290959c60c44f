"""Multi-object tracking for detect.py --track and for Python: ByteTrack (Zhang et al., ECCV 2022), in numpy.

    from models.predict import load, predict
    from utils.track import Tracker

    predictor, tracker = load("best.pt"), Tracker()
    for index, frame in enumerate(frames):  # BGR arrays of one video, in order; skipping some is fine
        tracks = tracker.update(predict(predictor, frame), index)  # index: the frame's number in the source
        for (x1, y1, x2, y2), track_id in zip(tracks.boxes, tracks.ids): ...

Why this module and not a package: supervision no longer ships a tracker; Roboflow's `trackers`, which has
it now, requires opencv-python (it would overwrite the cv2 of our opencv-python-headless) plus supervision, PyAV
and requests; BoxMOT is AGPL and this code is MIT. ByteTrack itself is short: a Kalman filter per object, then
the detections matched to the tracks in two rounds, the confident ones first, then the faint ones (an occluded
object scores low) to the tracks still unmatched.

Two changes from the paper (and from Ultralytics' version), measured in bench/track_benchmark.py:
- Time counts in frames of the source. update() takes the frame's number, and the filter predicts over the gap,
  so a --vid-stride of 3, or a stream whose slow model skipped frames, moves each prediction as far as the objects
  moved. Lost tracks are kept LOST_FRAMES frames of the source, whatever the stride.
- Matching IoU is taken after widening both boxes by the track's position uncertainty (one standard deviation
  of the filter; the buffered IoU of C-BIoU, Yang et al. 2023, with a margin that grows with the gap and with
  the time a track was lost). A new track, whose speed is still unknown, then meets its next detection even when
  the object moved farther than its own width between two processed frames; a perfect match still scores 1.
"""

import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

HIGH_SCORE = 0.25  # first round: detections at least this confident (Ultralytics' bytetrack.yaml too)
LOW_SCORE = 0.1  # second round: the fainter ones above this, only to tracks seen in the previous frame
NEW_TRACK_SCORE = 0.25  # an unmatched detection starts a track from this score
MATCH_COST = 0.8  # first round: 1 - IoU * score at most (IoU * score >= 0.2)
LOW_MATCH_COST = 0.5  # second round: IoU >= 0.5
NEW_MATCH_COST = 0.7  # a new track's second detection: 1 - IoU * score at most
LOST_FRAMES = 30  # frames of the source a lost track waits to be found again (1 s at 30 fps)
RESET_AFTER_S = 5  # a stream away longer than this starts its tracks again: the scene has moved on
UNMATCHABLE = 1e6  # a finite "no": infinities would turn the assignment's sums into NaN

# Kalman noise as a fraction of the box's size (ByteTrack's values): measurements, then the change per frame
POSITION_NOISE = 1 / 20
VELOCITY_NOISE = 1 / 160
NEW_VELOCITY_STD = 1 / 4  # a new track's speed is unknown: up to a quarter of its size per frame


class Tracks(NamedTuple):
    """The objects tracked in one frame: ids (k,) int64, boxes (k, 4) float32 x1 y1 x2 y2 in pixels, scores (k,)
    float32 (of the detection matched this frame), classes (k,) int64."""

    ids: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray


def iou_matrix(a, b):
    """IoU of each box of a (n, 4) with each of b (m, 4), x1 y1 x2 y2."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a, area_b = np.prod(a[:, 2:] - a[:, :2], axis=1), np.prod(b[:, 2:] - b[:, :2], axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def hungarian(cost):
    """The column of each row that minimises the total of a square cost matrix (Kuhn-Munkres with potentials,
    O(n^3), each inner step one numpy operation over the columns). scipy's linear_sum_assignment does the same
    but is not a dependency of this repo."""
    n = len(cost)
    u, v = np.zeros(n + 1), np.zeros(n + 1)
    row_of = np.zeros(n + 1, dtype=np.int64)  # row_of[j]: the row (1-based) holding column j; 0 = free
    way = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        row_of[0], column = i, 0
        min_slack, used = np.full(n + 1, np.inf), np.zeros(n + 1, dtype=bool)
        while row_of[column]:
            used[column] = True
            slack = cost[row_of[column] - 1] - u[row_of[column]] - v[1:]
            better = ~used[1:] & (slack < min_slack[1:])
            min_slack[1:][better], way[1:][better] = slack[better], column
            free_slack = np.where(used[1:], np.inf, min_slack[1:])
            next_column = int(np.argmin(free_slack)) + 1
            delta = free_slack[next_column - 1]
            u[row_of[used]] += delta
            v[used] -= delta
            min_slack[~used] -= delta
            column = next_column
        while column:  # flip the augmenting path back to the start
            row_of[column] = row_of[way[column]]
            column = way[column]
    column_of = np.zeros(n, dtype=np.int64)
    column_of[row_of[1:] - 1] = np.arange(n)
    return column_of


def linear_assignment(cost, limit):
    """Pairs (row, column) of least total cost with each cost <= limit, as lapjv's cost_limit (which ByteTrack
    uses): leaving a row and a column unmatched costs `limit`, so a pair is kept only when it costs less."""
    feasible = cost <= limit
    rows, columns = np.flatnonzero(feasible.any(1)), np.flatnonzero(feasible.any(0))
    if len(rows) < cost.shape[0] or len(columns) < cost.shape[1]:  # the others stay unmatched: a smaller problem
        pairs = linear_assignment(cost[np.ix_(rows, columns)], limit) if len(rows) else []
        return [(int(rows[i]), int(columns[j])) for i, j in pairs]
    n, m = cost.shape
    square = np.full((n + m, n + m), UNMATCHABLE)
    square[:n, :m] = np.where(cost <= limit, cost, UNMATCHABLE)
    square[np.arange(n), m + np.arange(n)] = limit / 2  # row i left unmatched
    square[n + np.arange(m), np.arange(m)] = limit / 2  # column j left unmatched
    square[n:, m:] = 0
    column_of = hungarian(square)
    return [(i, int(column_of[i])) for i in range(n) if column_of[i] < m and cost[i, column_of[i]] <= limit]


class Track:
    """One object: a constant-velocity Kalman filter on (cx, cy, w, h) with velocities per frame of the source."""

    def __init__(self, box, score, cls, frame):
        cx, cy, w, h = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2, box[2] - box[0], box[3] - box[1]
        self.mean = np.array([cx, cy, w, h, 0, 0, 0, 0], dtype=np.float64)
        size = np.array([w, h, w, h])
        self.covariance = np.diag(np.r_[2 * POSITION_NOISE * size, NEW_VELOCITY_STD * size] ** 2)
        self.score, self.cls, self.id = score, cls, 0  # id 0: not confirmed yet
        self.last_frame = frame

    def predict(self, dt):
        """Move the state `dt` frames of the source ahead; the uncertainty grows with dt (a random walk)."""
        transition = np.eye(8)
        transition[:4, 4:] = dt * np.eye(4)
        size = np.r_[self.mean[2:4], self.mean[2:4]]
        noise = np.r_[POSITION_NOISE * size, VELOCITY_NOISE * size] ** 2 * dt
        self.mean = transition @ self.mean
        self.mean[2:4] = np.maximum(self.mean[2:4], 1.0)  # a shrinking box must not turn inside out
        self.covariance = transition @ self.covariance @ transition.T + np.diag(noise)

    def update(self, box, score, cls, frame):
        measured = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2, box[2] - box[0], box[3] - box[1]])
        noise = np.diag(np.r_[POSITION_NOISE * measured[2:4], POSITION_NOISE * measured[2:4]] ** 2)
        projected = self.covariance[:4, :4] + noise
        gain = np.linalg.solve(projected, self.covariance[:4, :]).T  # P H^T S^-1, S symmetric
        self.mean = self.mean + gain @ (measured - self.mean[:4])
        self.covariance = self.covariance - gain @ projected @ gain.T
        self.score, self.cls, self.last_frame = score, cls, frame

    def box(self):
        cx, cy, w, h = self.mean[:4]
        return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])

    def margin(self):
        """How far (x, y) to widen the boxes before matching: one standard deviation of the position."""
        return np.sqrt(np.diag(self.covariance)[:2])


def buffered_cost(tracks, boxes, scores, fuse_score):
    """1 - IoU (times the detection's score when fuse_score, as ByteTrack's first round) of each track's predicted
    box with each detection, both widened by the track's margin."""
    if not tracks or not len(boxes):
        return np.zeros((len(tracks), len(boxes)))
    cost = np.empty((len(tracks), len(boxes)))
    for i, track in enumerate(tracks):
        margin = np.tile(track.margin(), 2) * [-1, -1, 1, 1]
        cost[i] = 1 - iou_matrix((track.box() + margin)[None], boxes + margin)[0] * (scores if fuse_score else 1)
    return cost


class Tracker:
    """ByteTrack over the frames of one source. update() once per processed frame, in order. Ids start at 1 and
    are given when a track is confirmed (its second detection, or any detection of the first frame)."""

    def __init__(self, lost_frames=LOST_FRAMES):
        self.lost_frames = lost_frames
        self.reset()

    def reset(self):
        """Forget every track; the next ids continue from the last one, so that no id means two objects."""
        self.tracks, self.frame = [], None
        self.next_id = getattr(self, "next_id", 1)

    def update(self, detections, frame=None):
        """Tracks (see the class) of the confirmed objects seen in this frame. detections: predict()'s
        Detections, or an (n, 6) array x1 y1 x2 y2 score class as detect.py has them. frame: the frame's number
        in the source (default: the previous one + 1); a gap of k frames predicts k frames of motion."""
        boxes, scores, classes = split_detections(detections)
        frame = (0 if self.frame is None else self.frame + 1) if frame is None else int(frame)
        first, previous = self.frame is None, self.frame
        dt = 1 if first else max(frame - previous, 1)
        self.frame = frame
        self.tracks = [t for t in self.tracks if frame - t.last_frame <= self.lost_frames]  # before a gap's match
        for track in self.tracks:
            track.predict(dt)
        valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        high = np.flatnonzero(valid & (scores >= HIGH_SCORE))
        low = np.flatnonzero(valid & (scores > LOW_SCORE) & (scores < HIGH_SCORE))
        confirmed = [t for t in self.tracks if t.id]
        unmatched, high_left = self._match(confirmed, high, boxes, scores, classes, True, MATCH_COST)
        recent = [t for t in unmatched if t.last_frame == previous]  # the faint round: tracks not yet lost
        self._match(recent, low, boxes, scores, classes, False, LOW_MATCH_COST)
        tentative = [t for t in self.tracks if not t.id]
        unmatched, high_left = self._match(tentative, high_left, boxes, scores, classes, True, NEW_MATCH_COST)
        for track in tentative:
            if track.last_frame == frame:
                track.id, self.next_id = self.next_id, self.next_id + 1
        dead = {id(t) for t in unmatched}  # a new track not found again at once was noise
        self.tracks = [t for t in self.tracks if id(t) not in dead]
        for j in high_left:
            if scores[j] >= NEW_TRACK_SCORE:
                self.tracks.append(Track(boxes[j], scores[j], classes[j], frame))
                if first:
                    self.tracks[-1].id, self.next_id = self.next_id, self.next_id + 1
        return self._seen(frame)

    def _match(self, tracks, indices, boxes, scores, classes, fuse_score, limit):
        """Match `tracks` to the detections `indices` and update the matched tracks; the tracks and the detection
        indices left unmatched."""
        cost = buffered_cost(tracks, boxes[indices], scores[indices], fuse_score)
        pairs = linear_assignment(cost, limit)
        for i, j in pairs:
            k = indices[j]
            tracks[i].update(boxes[k], float(scores[k]), int(classes[k]), self.frame)
        matched_tracks, matched_detections = {i for i, _ in pairs}, {j for _, j in pairs}
        left = [t for i, t in enumerate(tracks) if i not in matched_tracks]
        return left, np.array([k for j, k in enumerate(indices) if j not in matched_detections], dtype=np.int64)

    def _seen(self, frame):
        seen = [t for t in self.tracks if t.id and t.last_frame == frame]
        return Tracks(
            np.array([t.id for t in seen], dtype=np.int64),
            np.array([t.box() for t in seen], dtype=np.float32).reshape(-1, 4),
            np.array([t.score for t in seen], dtype=np.float32),
            np.array([t.cls for t in seen], dtype=np.int64),
        )


def split_detections(detections):
    """boxes (n, 4), scores (n,), classes (n,) as numpy from predict()'s Detections or an (n, 6) array/tensor."""
    if hasattr(detections, "boxes"):
        boxes, scores, classes = detections.boxes, detections.scores, detections.classes
    else:
        rows = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        boxes, scores, classes = rows[:, :4], rows[:, 4], rows[:, 5]
    return np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64), np.asarray(classes, np.int64)


class TrackWriter:
    """One source's tracker in detect.py --track: update() tracks a frame and appends its MOT-challenge rows
    (`frame, id, x, y, w, h, score, class`, frame = the source's frame number + 1) to `path`."""

    def __init__(self, path, lost_frames=LOST_FRAMES):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path, self.tracker, self.last_time = Path(path), Tracker(lost_frames), None
        self.file = open(path, "w")

    def update(self, detections, frame):
        tracks = self.tracker.update(detections, frame)
        for (x1, y1, x2, y2), track_id, score, cls in zip(tracks.boxes, tracks.ids, tracks.scores, tracks.classes):
            self.file.write(f"{frame + 1},{track_id},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{score:.4f},{cls}\n")
        self.file.flush()  # a run stopped by a second Ctrl+C keeps the rows of the frames it drew
        self.last_time = time.monotonic()
        return tracks

    def reconnected(self):
        """What a stream that dropped and was reopened does with its tracks, in a few words: it keeps them when it
        was away at most RESET_AFTER_S seconds, else they start again (new ids: the objects may have changed)."""
        away = 0.0 if self.last_time is None else time.monotonic() - self.last_time
        if away <= RESET_AFTER_S:
            return f"away {away:.1f} s, its objects keep their track ids"
        self.tracker.reset()
        return f"away {away:.1f} s (over {RESET_AFTER_S} s), its objects get new track ids"

    def close(self):
        self.file.close()


def draw_tracks(img_bgr, tracks, names):
    """Boxes in one colour per track id, labelled 'id name score', on a BGR image (in place)."""
    from utils.plots import colour, draw_labelled_box  # matplotlib, only when drawing

    for box, track_id, score, cls in zip(tracks.boxes, tracks.ids, tracks.scores, tracks.classes):
        label = f"{track_id} {names[cls] if cls < len(names) else cls} {score:.2f}"
        draw_labelled_box(img_bgr, box, colour(int(track_id)), label)
    return img_bgr
