"""Kill a training run anywhere, resume it, and check that nothing is lost: the resumed run ends bitwise equal to
one never interrupted (every tensor of last.pt and best.pt, optimizer, EMA and random states included, and the rows
of results.csv but their wall-clock seconds), and no file of the run folder is ever half-written or unreadable.

    nice -n 10 python bench/chaos.py --kills 20            # 20 SIGKILLs at moments drawn uniformly over the run
    python bench/chaos.py --kills 3 --seed 1 --epochs 2     # a quick look
    nice -n 10 python bench/chaos.py --what export --kills 5  # export.py killed (best.onnx), then run again
    nice -n 10 python bench/chaos.py --what cache --kills 5   # the first-use label cache build killed, then again

A small run (the shapes set at 96 px, 64 px training, 24 images, --workers 2, --save-every 1) is first trained
straight through; then each trial starts the same run, SIGKILLs its process group at a moment drawn uniformly over
the straight run's wall time, checks every file the killed run left, resumes it with --resume (or starts it again
when it was killed before its first last.pt), and compares the outcome with the straight run. Prints k/N: the
trials that ended intact. tests/test_chaos.py runs the same trial at a few fixed moments.
"""

import argparse
import csv
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from utils.data.shapes import make_shapes  # noqa: E402

NAMES = ["circle", "square", "triangle", "star", "cross", "hexagon"]
LAUNCH_ARGS = ("out", "resume", "device", "workers")
VARYING_COLUMNS = ("seconds",)  # wall-clock time: the only column a resumed run may write differently


def make_data(root, n_train=24, n_val=4):
    """The shapes set at 96 px and its yaml, under root."""
    make_shapes(root / "shapes", n_train=n_train, n_val=n_val, seed=3, size=96)
    data = root / "chaos.yaml"
    data.write_text(yaml.safe_dump({"path": "shapes", "train": "images/train", "val": "images/val", "names": NAMES}))
    return data


def train_args(data, epochs):
    return [
        "--data", data, "--epochs", epochs, "--model", "n", "--imgsz", "64", "--batch", "4", "--accumulate", "2",
        "--workers", "2", "--device", "cpu", "--deterministic", "--warmup-epochs", "0", "--save-every", "1",
        "--seed", "0",
    ]  # fmt: skip


def start(args, log):
    """train.py ARGS in a session of its own (its data-loader workers in its process group)."""
    cmd = [sys.executable, str(REPO / "train.py"), *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(args, log, timeout=900):
    proc = start(args, log)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


def kill_after(args, seconds, log):
    """Start the run and SIGKILL its whole process group after `seconds`. Returns whether it was still running."""
    return killed_at([sys.executable, str(REPO / "train.py"), *map(str, args)], seconds, log)


def unreadable_files(run_dir):
    """The files of the run folder that are half-written or do not load, each with the reason; and the temporary
    files an interrupted atomic write left (hidden, never read, removed by the next run)."""
    bad, temporary = [], []
    for path in sorted(p for p in Path(run_dir).rglob("*") if p.is_file()):
        if path.name.startswith(".") and ".tmp" in path.name:
            temporary.append(path.name)
            continue
        try:
            check_file(path)
        except Exception as e:  # any failure to read is the finding
            bad.append(f"{path.relative_to(run_dir)}: {type(e).__name__}: {str(e)[:120]}")
    return bad, temporary


def check_file(path):
    suffix = path.suffix
    if suffix == ".pt":
        torch.load(path, map_location="cpu", weights_only=True)
    elif suffix in (".png", ".jpg"):
        with Image.open(path) as image:
            image.load()
    elif suffix == ".csv":
        rows = list(csv.reader(io.StringIO(path.read_text())))
        if any(len(row) != len(rows[0]) for row in rows):
            raise ValueError("a row of another length than the header (half a row)")
    elif suffix == ".yaml":
        yaml.safe_load(path.read_text())
    elif suffix == ".json":
        json.loads(path.read_text())
    else:
        path.read_bytes().decode()  # train.log and the rest: text


def differences(a, b, where=""):
    """The keys where two checkpoint dicts differ (tensors bitwise), as 'model.stem.conv.weight' paths."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}.{k}" if where else str(k))]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]


def results_rows(path):
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in VARYING_COLUMNS} for row in csv.DictReader(f)]


def outcome_differences(straight, resumed):
    """What differs between the straight run's folder and a resumed one: checkpoint keys and results.csv rows."""
    found = []
    for name in ("weights/last.pt", "weights/best.pt"):
        a, b = (torch.load(run / name, map_location="cpu", weights_only=True) for run in (straight, resumed))
        # where a run was started or resumed (its folder, the last.pt it resumed, this machine's devices and
        # workers: utils/settings.py, resume_arguments) is not training state
        a["args"], b["args"] = ({k: v for k, v in c["args"].items() if k not in LAUNCH_ARGS} for c in (a, b))
        found += [f"{name}: {d}" for d in differences(a, b)]
    rows_a, rows_b = results_rows(straight / "results.csv"), results_rows(resumed / "results.csv")
    found += [
        f"results.csv row {i + 1}"
        for i in range(max(len(rows_a), len(rows_b)))
        if rows_a[i : i + 1] != rows_b[i : i + 1]
    ]
    return found


def trial(args, run_dir, straight_dir, moment, log):
    """One SIGKILL at `moment` seconds, then --resume. Returns a dict of what happened."""
    killed = kill_after([*args, "--out", run_dir], moment, log)
    bad, temporary = unreadable_files(run_dir)
    last = run_dir / "weights" / "last.pt"
    saved = torch.load(last, map_location="cpu", weights_only=True) if last.exists() and not bad else None
    where = f"epoch {saved['epoch']} iteration {saved['iteration']}" if saved else "no last.pt yet"
    # the killed run's own command again when it never saved: a user starts it over
    again = ["--resume", last] if saved else [*args, "--out", run_dir]
    code = finish(again, log)
    after_bad, after_temporary = unreadable_files(run_dir)
    lost = outcome_differences(straight_dir, run_dir) if code == 0 else [f"resumed run exited {code}"]
    log.seek(0)
    tracebacks = log.read().decode(errors="replace").count("Traceback")
    intact = killed is not None and not bad and not after_bad and not after_temporary and not lost and not tracebacks
    return dict(
        moment=moment, killed=killed, at=where, unreadable=bad + after_bad, temporary_left=after_temporary,
        temporary_after_kill=temporary, differences=lost, tracebacks=tracebacks, intact=intact,
    )  # fmt: skip


EXPORT_ARGS = ["--onnx", "--imgsz", "64", "--runs", "1", "--workers", "0"]
BUILD_CACHE = """
import sys
sys.path.insert(0, sys.argv[1])
from utils.data.labels import load_verified
print("imported", flush=True)  # the moments count from here: the build, not the interpreter's start
print(len(load_verified([sys.argv[2]], nc=6, split_name="train")))
"""


def timed(cmd, log):
    began = time.time()
    code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    return code, time.time() - began


def killed_at(cmd, seconds, log):
    """Start `cmd` in a session of its own and SIGKILL its process group after `seconds`: whether it still ran."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(seconds)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def export_trials(root, straight, kills, draw):
    """export.py --onnx SIGKILLed at moments uniform over its wall time: afterwards no best.onnx, or one that ONNX
    Runtime loads; the export run again succeeds and leaves no temporary file."""
    import onnxruntime

    def export(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "best.pt").write_bytes((straight / "weights" / "best.pt").read_bytes())
        return [sys.executable, "export.py", "--weights", str(folder / "best.pt"), "--data", str(root / "chaos.yaml")]

    with open(root / "export.log", "w+b") as log:
        code, wall = timed([*export(root / "export_straight"), *EXPORT_ARGS], log)
    assert code == 0, f"export.py failed: {root / 'export.log'}"
    results = []
    for k in range(kills):
        folder, moment = root / f"export{k}", round(draw.uniform(0, wall), 2)
        with open(root / f"export{k}.log", "w+b") as log:
            killed = killed_at([*export(folder), *EXPORT_ARGS], moment, log)
            onnx = folder / "best.onnx"
            bad = []
            if onnx.exists():
                try:
                    onnxruntime.InferenceSession(str(onnx))
                except Exception as e:  # the finding: a half-written file under the real name
                    bad.append(f"best.onnx: {str(e)[:120]}")
            code = subprocess.run([*export(folder), *EXPORT_ARGS], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            log.seek(0)
            tracebacks = log.read().decode(errors="replace").count("Traceback")
        left = [p.name for p in folder.iterdir() if p.name.startswith(".")]
        intact = not bad and code.returncode == 0 and not left and not tracebacks
        results.append(dict(moment=moment, killed=killed, unreadable=bad, temporary_left=left, differences=[],
                            tracebacks=tracebacks, intact=intact))  # fmt: skip
        print(json.dumps({"export trial": k, **results[-1]}), flush=True)
    return results


def build_killed_at(build, seconds):
    """The cache build, SIGKILLed `seconds` after its imports (or timed to its end when seconds is None)."""
    proc = subprocess.Popen(build, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    proc.stdout.readline()
    began = time.time()
    try:
        proc.wait(seconds)
        return time.time() - began if seconds is None else False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def cache_trials(root, kills, draw):
    """The first-use label cache build (1000 images) SIGKILLed at moments uniform over the build: the next build
    verifies again without a traceback, gives every image, and leaves one whole cache, no temporary file."""
    shapes = make_shapes(root / "cache_shapes", n_train=1000, n_val=1, seed=4, size=64)
    labels, images = shapes / "labels", str(shapes / "images" / "train")
    build = [sys.executable, "-c", BUILD_CACHE, str(REPO), images]

    def clear():
        for path in labels.iterdir():
            if path.is_file():
                path.unlink()

    clear()
    wall = build_killed_at(build, None)
    print(f"label cache build: {wall:.1f} s after the imports; killing {kills} builds at moments uniform in it")
    results = []
    for k in range(kills):
        clear()
        moment = round(draw.uniform(0, wall), 2)
        killed = build_killed_at(build, moment)
        again = subprocess.run(build, cwd=REPO, capture_output=True, text=True)
        caches = [p.name for p in labels.glob("*.cache.npz")]
        left = [p.name for p in labels.iterdir() if p.name.startswith(".")]
        tracebacks = again.stderr.count("Traceback")
        intact = again.stdout.split()[-1:] == ["1000"] and len(caches) == 1 and not left and not tracebacks
        results.append(dict(moment=moment, killed=killed, unreadable=[], temporary_left=left, differences=[],
                            tracebacks=tracebacks, intact=intact))  # fmt: skip
        print(json.dumps({"cache trial": k, **results[-1]}), flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="trials, one SIGKILL each")
    parser.add_argument("--seed", type=int, default=0, help="draws the moments")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--images", type=int, default=24, help="training images (4 per iteration)")
    parser.add_argument("--dir", default="", help="work folder (default: a temporary one, removed)")
    parser.add_argument("--what", default="train", choices=["train", "export", "cache"], help="what is killed")
    opt = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(opt.dir or temporary)
        root.mkdir(parents=True, exist_ok=True)
        args = train_args(make_data(root, opt.images), opt.epochs)
        straight = root / "straight"
        if opt.what == "cache":
            results = cache_trials(root, opt.kills, random.Random(opt.seed))
            print(summary(results))
            sys.exit(0 if all(r["intact"] for r in results) else 1)
        began = time.time()
        with open(root / "straight.log", "w+b") as log:
            if finish([*args, "--out", straight], log) != 0:
                log.seek(0)
                sys.exit("the straight run failed:\n" + log.read().decode()[-3000:])
        wall = time.time() - began
        draw = random.Random(opt.seed)
        if opt.what == "export":
            results = export_trials(root, straight, opt.kills, draw)
            print(summary(results))
            sys.exit(0 if all(r["intact"] for r in results) else 1)
        print(f"straight run: {wall:.0f} s; killing {opt.kills} runs at moments uniform in [0, {wall:.0f}) s")
        results = []
        for k in range(opt.kills):
            moment = round(draw.uniform(0, wall), 2)
            with open(root / f"trial{k}.log", "w+b") as log:
                results.append(trial(args, root / f"trial{k}", straight, moment, log))
            print(json.dumps({"trial": k, **results[-1]}), flush=True)
        print(summary(results))
        sys.exit(0 if all(r["intact"] for r in results) else 1)


def summary(results):
    """k/N and the fault table's columns."""
    intact = sum(r["intact"] for r in results)
    killed = sum(bool(r["killed"]) for r in results)
    lost = sum(bool(r["differences"]) for r in results)
    broken = sum(len(r["unreadable"]) for r in results)
    tracebacks = sum(r["tracebacks"] for r in results)
    return (
        f"intact: {intact}/{len(results)} ({killed} killed while running, the others had ended before their moment); "
        f"runs that lost or changed something: {lost}; unreadable files: {broken}; tracebacks: {tracebacks}"
    )


if __name__ == "__main__":
    main()
