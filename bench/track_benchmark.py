"""Trackers compared on equal detections: our ByteTrack (utils/track.py) and Ultralytics' (its BYTETracker with
its bytetrack.yaml defaults, run in the peer environment), on generated sequences (bench/track_sequence.py) at
--vid-stride 1 and 3, scored with HOTA, MOTA and IDF1 by TrackEval's metrics.

    python bench/track_benchmark.py --peer-python $PEER_PYTHON      # 3 sequences of 450 frames, about 30 s on 2 cores

Protocol: each sequence's detections (jitter, misses, clutter, low scores when half hidden) are made once; every
tracker gets the same ones, frame by frame, of the frames a stride keeps (0, 3, 6, ... at stride 3), and is scored
on the ground truth of those frames. Each tracker's output goes through MOT-challenge text files (in --out) before
it is scored. Id switches are counted per 100 frames of the video (so a stride does not change the unit).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.track_sequence import make_sequence, write_mot  # noqa: E402

PEER_SCRIPT = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
try:
    import lap  # Ultralytics' trackers need it and would pip-install it at run time
except ImportError:
    sys.exit(f"the peer environment lacks lap, which Ultralytics' tracker needs: {sys.prefix}/bin/pip install lap")
import numpy as np, yaml, ultralytics
from ultralytics.trackers.byte_tracker import BYTETracker

class Boxes:  # what BYTETracker.update reads of Ultralytics' Boxes
    def __init__(self, rows):
        self.rows = rows.reshape(-1, 6)
        self.conf, self.cls, self.xyxy = self.rows[:, 4], self.rows[:, 5], self.rows[:, :4]
        self.xywh = np.c_[(self.xyxy[:, :2] + self.xyxy[:, 2:]) / 2, self.xyxy[:, 2:] - self.xyxy[:, :2]]
    def __getitem__(self, index):
        return Boxes(self.rows[index])
    def __len__(self):
        return len(self.rows)

config = yaml.safe_load((Path(ultralytics.__file__).parent / "cfg/trackers/bytetrack.yaml").read_text())
job = json.loads(Path(sys.argv[1]).read_text())
results = {}
for key, frames in job.items():
    tracker, rows = BYTETracker(SimpleNamespace(**config)), []
    for frame, dets in frames:
        for x1, y1, x2, y2, track_id, score, cls, _ in tracker.update(Boxes(np.array(dets, dtype=np.float32))):
            w, h = float(x2 - x1), float(y2 - y1)
            rows.append([frame, int(track_id), float(x1), float(y1), w, h, float(score), int(cls)])
    results[key] = rows
Path(sys.argv[2]).write_text(json.dumps(results))
"""


def ours(dets, frames):
    """Our tracker over `frames` (the source's frame numbers, in order) -> MOT rows (frame from 0)."""
    from utils.track import Tracker

    tracker, rows = Tracker(), []
    for frame in frames:
        tracks = tracker.update(dets[frame], frame)
        for (x1, y1, x2, y2), track_id, score, cls in zip(tracks.boxes, tracks.ids, tracks.scores, tracks.classes):
            rows.append([frame, track_id, x1, y1, x2 - x1, y2 - y1, score, cls])
    return rows


def ultralytics(jobs, peer_python):
    """{key: (dets, frames)} -> {key: MOT rows} from Ultralytics' BYTETracker, in the peer environment."""
    with tempfile.TemporaryDirectory() as tmp:
        job = {key: [[f, dets[f].tolist()] for f in frames] for key, (dets, frames) in jobs.items()}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        (Path(tmp) / "peer.py").write_text(PEER_SCRIPT)
        command = [peer_python, str(Path(tmp) / "peer.py"), str(Path(tmp) / "job.json"), str(Path(tmp) / "out.json")]
        done = subprocess.run(command, env=peer_environment(peer_python), stderr=subprocess.PIPE, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            sys.exit(f"Ultralytics' tracker in {peer_python} failed: {last}")
        return json.loads((Path(tmp) / "out.json").read_text())


def peer_environment(peer_python):
    import os

    from bench.peer import CONFIG

    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "0"}
    env.setdefault("YOLO_CONFIG_DIR", str(Path(peer_python).resolve().parents[1] / CONFIG))
    return env


def read_mot(path):
    """MOT-challenge text -> (n, 8) array frame(from 1) id x y w h score class; extra columns are ignored."""
    rows = [line.split(",")[:8] for line in Path(path).read_text().splitlines() if line.strip()]
    return np.array(rows, dtype=np.float64).reshape(-1, 8)


def evaluation_data(gt, tracked, frames):
    """TrackEval's per-sequence input from MOT arrays (frame from 1), scored on `frames` (from 1) only."""
    from trackeval.datasets._base_dataset import _BaseDataset

    gt_ids = {v: k for k, v in enumerate(np.unique(gt[np.isin(gt[:, 0], frames), 1]))}
    tracker_ids = {v: k for k, v in enumerate(np.unique(tracked[np.isin(tracked[:, 0], frames), 1]))}
    data = {"num_timesteps": len(frames), "gt_ids": [], "tracker_ids": [], "similarity_scores": []}
    for frame in frames:
        g, t = gt[gt[:, 0] == frame], tracked[tracked[:, 0] == frame]
        data["gt_ids"].append(np.array([gt_ids[i] for i in g[:, 1]], dtype=int))
        data["tracker_ids"].append(np.array([tracker_ids[i] for i in t[:, 1]], dtype=int))
        data["similarity_scores"].append(_BaseDataset._calculate_box_ious(g[:, 2:6], t[:, 2:6], box_format="xywh"))
    data.update(num_gt_ids=len(gt_ids), num_tracker_ids=len(tracker_ids))
    data.update(num_gt_dets=sum(map(len, data["gt_ids"])), num_tracker_dets=sum(map(len, data["tracker_ids"])))
    return data


def evaluate(sequences):
    """[(gt MOT file, tracker MOT file, frames scored (from 1))] -> HOTA, MOTA, IDF1, IDSW over all of them."""
    from trackeval.metrics import CLEAR, HOTA, Identity

    quiet = {"PRINT_CONFIG": False}
    metrics = {"HOTA": HOTA(quiet), "CLEAR": CLEAR(quiet), "Identity": Identity(quiet)}
    per_sequence = {name: {} for name in metrics}
    for k, (gt_file, tracker_file, frames) in enumerate(sequences):
        data = evaluation_data(read_mot(gt_file), read_mot(tracker_file), np.asarray(frames))
        for name, metric in metrics.items():
            per_sequence[name][k] = metric.eval_sequence(data)
    combined = {name: metric.combine_sequences(per_sequence[name]) for name, metric in metrics.items()}
    return {
        "HOTA": float(np.mean(combined["HOTA"]["HOTA"])),
        "MOTA": float(combined["CLEAR"]["MOTA"]),
        "IDF1": float(combined["Identity"]["IDF1"]),
        "IDSW": int(combined["CLEAR"]["IDSW"]),
    }


def run(seeds, length, strides, out, peer_python):
    """{(tracker, stride): scores} with every MOT file written under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    sequences, jobs = {}, {}
    for seed in seeds:
        gt, dets, _ = make_sequence(seed, length)
        write_mot(out / f"seq{seed}_gt.txt", gt)
        for stride in strides:
            frames = list(range(0, length, stride))
            sequences[(seed, stride)] = frames
            jobs[f"{seed}_{stride}"] = (dets, frames)
            write_mot(out / f"seq{seed}_stride{stride}_ours.txt", ours(dets, frames))
    trackers = ["ours"]
    if peer_python:
        for key, rows in ultralytics(jobs, peer_python).items():
            write_mot(out / f"seq{key.split('_')[0]}_stride{key.split('_')[1]}_ultralytics.txt", rows)
        trackers.append("ultralytics")
    scores = {}
    for tracker in trackers:
        for stride in strides:
            files = [
                (out / f"seq{s}_gt.txt", out / f"seq{s}_stride{stride}_{tracker}.txt", np.array(f) + 1)
                for (s, st), f in sequences.items()
                if st == stride
            ]
            result = evaluate(files)
            result["IDSW per 100 frames"] = 100 * result["IDSW"] / (length * len(seeds))
            scores[(tracker, stride)] = result
    return scores


def table(scores):
    lines = [
        "| tracker | --vid-stride | HOTA | MOTA | IDF1 | id switches | per 100 frames |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {"ours": "ours (utils/track.py)", "ultralytics": "Ultralytics 8.4.190 BYTETracker"}
    for stride in sorted({s for _, s in scores}):
        for (tracker, s), r in scores.items():
            if s == stride:
                lines.append(
                    f"| {names[tracker]} | {s} | {100 * r['HOTA']:.1f} | {100 * r['MOTA']:.1f} | "
                    f"{100 * r['IDF1']:.1f} | {r['IDSW']} | {r['IDSW per 100 frames']:.2f} |"
                )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one generated sequence per seed")
    parser.add_argument("--frames", type=int, default=450, help="frames per sequence")
    parser.add_argument("--strides", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--out", default="runs/track_benchmark", help="the MOT text files of every tracker")
    parser.add_argument("--peer-python", default="", help="the peer Ultralytics python (or $PEER_PYTHON)")
    parser.add_argument("--no-peer", action="store_true", help="ours alone")
    args = parser.parse_args()
    peer_python = None
    if not args.no_peer:
        from bench.peer import find_peer_python

        peer_python = find_peer_python(args.peer_python)
    scores = run(args.seeds, args.frames, args.strides, Path(args.out), peer_python)
    print(table(scores))


if __name__ == "__main__":
    main()
