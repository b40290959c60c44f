"""Two processes on the same files (issue 40): two train.py runs on one run folder, runs started at once without
--out, a reader loading best.pt while training replaces it, two tools/sweep.py on one spec, two processes building
one label cache. None of them may write over the other or read half a file."""

import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml
from train_runs import REPO, TINY

from utils import locks
from utils.checkpoints.ours import FORMAT, load_checkpoint, save_checkpoint
from utils.data.shapes import make_shapes


def tiny_data(root):
    make_shapes(root / "shapes", n_train=4, n_val=1, seed=3, size=64)
    data = root / "tiny.yaml"
    data.write_text("path: shapes\ntrain: images/train\nval: images/val\nnames: [a, b, c, d, e, f]\n")
    return data


def test_a_second_run_on_the_same_out_folder_stops_with_one_sentence(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "train.py", "--data", str(tiny_data(tmp_path)), "--epochs", "50", "--out", str(out), *TINY]
    first = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / ".lock").exists() or not (out / ".lock").read_text().strip():  # claimed, pid written
            assert first.poll() is None and time.time() < deadline, "the first run ended before it claimed its folder"
            time.sleep(0.05)
        second = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second one started: nothing was tested"
    finally:
        first.send_signal(signal.SIGTERM)  # its step finished, last.pt saved, exit 0
        _, first_errors = first.communicate(timeout=300)
    print(second.stderr.strip())
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    sentence = second.stderr.strip().splitlines()[-1]
    assert sentence.startswith(f"--out {out} is in use by another train.py run (process {first.pid}, still running)")
    assert first.returncode == 0, first_errors[-3000:]  # the first run was not disturbed
    assert torch.load(out / "weights" / "last.pt", weights_only=True)["args"]["out"] == str(out)


def claim_next(base, start, queue):
    while time.time() < start:  # every process looks at the same moment
        pass
    queue.put(str(locks.claim_next_free(base)))
    time.sleep(0.5)  # holds its claim while the others look


def test_runs_started_at_once_without_out_each_get_their_own_folder(tmp_path):
    base, start = tmp_path / "runs" / "train" / "exp", time.time() + 1.0
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=claim_next, args=(base, start, queue)) for _ in range(6)]
    for p in processes:
        p.start()
    folders = sorted(queue.get(timeout=30) for _ in processes)
    for p in processes:
        p.join(30)
    print(folders)
    assert len(set(folders)) == 6 and {Path(f).name for f in folders} == {"exp", *(f"exp{i}" for i in range(2, 7))}


SAVER = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from utils.checkpoints.ours import FORMAT, save_checkpoint
for i in range(int(sys.argv[3])):  # sizes that change: a reader of half a file would see a short or mixed one
    save_checkpoint({"format": FORMAT, "epoch": i, "w": torch.full((250_000 * (1 + i % 4),), float(i))}, sys.argv[2])
"""


def test_a_reader_never_sees_half_of_a_best_pt_being_replaced(tmp_path):
    """val.py / detect.py load best.pt while training writes a new one: each load gets a whole file, old or new
    (save_checkpoint writes a temporary file and renames it over best.pt)."""
    best = tmp_path / "weights" / "best.pt"
    save_checkpoint({"format": FORMAT, "epoch": -1, "w": torch.zeros(1)}, best)
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(REPO), str(best), "20"], stderr=subprocess.PIPE)
    loads, epochs = 0, set()
    while saver.poll() is None:
        ckpt = load_checkpoint(best)  # as val.py and detect.py read it: CheckpointError on a half-written file
        assert ckpt["epoch"] == -1 or (ckpt["w"] == ckpt["epoch"]).all() and len(ckpt["w"]) % 250_000 == 0
        loads, epochs = loads + 1, epochs | {ckpt["epoch"]}
    assert saver.returncode == 0, saver.stderr.read()[-2000:]
    print(f"{loads} loads during 20 saves saw {len(epochs)} different files, each whole")
    assert loads >= 10 and len(epochs) >= 3


JOB = """
import os, sys, time
with open(os.path.join(sys.argv[1], "count"), "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(1.5)
"""


def test_two_sweeps_on_one_spec_run_each_experiment_once(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    spec = {
        "template": {"train": f"{shlex.quote(sys.executable)} job.py {{_output}}"},
        "default": {"lr0": 0.01},
        "resource": ["cpu"],
        "output": "out",
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump_all([spec, {"lr0": [0.1, 0.2, 0.3, 0.4]}], sort_keys=False))
    command = [sys.executable, str(REPO / "tools" / "sweep.py"), "spec.yaml"]
    sweeps = [
        subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [s.communicate(timeout=120)[0] for s in sweeps]
    print(*outputs, sep="\n----\n")
    assert [s.returncode for s in sweeps] == [0, 0], outputs
    counts = {p.parent.name: p.read_text().split() for p in (tmp_path / "out").glob("*/count")}
    assert len(counts) == 4 and all(len(pids) == 1 for pids in counts.values()), counts  # each ran exactly once
    skipped = [line for output in outputs for line in output.splitlines() if line.startswith("SKIP")]
    assert skipped and all("another tools/sweep.py" in line for line in skipped), outputs
    assert "left to another tools/sweep.py on this spec" in "".join(outputs)


BUILDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from utils.data.labels import load_verified
while time.time() < float(sys.argv[3]):
    pass
print(len(load_verified([sys.argv[2]], nc=6, split_name="train")))
"""


def test_two_processes_building_one_label_cache_both_end_with_a_valid_one(tmp_path):
    root = make_shapes(tmp_path / "shapes", n_train=40, n_val=1, size=64)
    images, start = str(root / "images" / "train"), str(time.time() + 2.0)
    env = dict(os.environ, YOLO_CACHE_DIR=str(tmp_path / "user_cache"))
    command = [sys.executable, "-c", BUILDER, str(REPO), images, start]
    builders = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    builders.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [b.communicate(timeout=120) for b in builders]
    assert [r[0].strip() for r in results] == ["40", "40"] and not any("Traceback" in r[1] for r in results), results
    labels = root / "labels"
    assert [p.name for p in labels.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    (cache,) = labels.glob("*.cache.npz")
    written = cache.stat().st_mtime_ns
    reader = subprocess.run(command[:-1] + ["0"], env=env, capture_output=True, text=True, timeout=60)
    assert reader.stdout.strip() == "40" and cache.stat().st_mtime_ns == written, reader  # read from the cache


def test_a_killed_run_leaves_no_claim_behind(tmp_path):
    """The claim is an flock, which the kernel drops with its process: after a SIGKILL the folder is free."""
    code = f"import sys, time; sys.path.insert(0, {str(REPO)!r}); from utils import locks; locks.claim(sys.argv[1]); "
    holder = subprocess.Popen([sys.executable, "-c", code + "print(1, flush=True); time.sleep(60)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "1"
    try:
        locks.claim(tmp_path)
        raise AssertionError("claimed a folder another live process holds")
    except locks.FolderTaken as taken:
        assert taken.pid == str(holder.pid)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert locks.claim(tmp_path) == tmp_path
    locks.release(tmp_path)
