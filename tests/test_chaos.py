"""Killed anywhere (issue 40): SIGKILL at fixed points of a tiny run, in the middle of writing each kind of file,
then --resume: the outcome is bitwise the uninterrupted run's, and no file of the run folder is ever half-written
or unreadable. bench/chaos.py does the same at random moments (k/N in bench/RESULTS.md); export.py and the label
cache are killed while writing too."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_runs import REPO, TINY, make_wrapper, run

from bench.chaos import outcome_differences, unreadable_files
from utils.data.shapes import make_shapes

# the writer of every file a run writes whole (last.pt, best.pt, results.csv's header, args.yaml, plots) is
# utils.general.atomic_write: this one fills the temporary file, cuts it to half, and SIGKILLs the process
# before the rename, at the `nth` write of the file named `name`
KILLED_WHILE_WRITING = """
import os, signal
from pathlib import Path
import utils.general, utils.checkpoints.ours, utils.plots
real_atomic_write, writes = utils.general.atomic_write, {{}}
def atomic_write(path, write, fsync=False):
    writes[Path(path).name] = writes.get(Path(path).name, 0) + 1
    if (Path(path).name, writes[Path(path).name]) != ({name!r}, {nth}):
        return real_atomic_write(path, write, fsync)
    def half_then_killed(f):
        write(f)
        f.flush()
        f.truncate(f.tell() // 2)
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_atomic_write(path, half_then_killed, fsync)
for module in (utils.general, utils.checkpoints.ours, utils.plots):
    module.atomic_write = atomic_write
"""


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every killed one is compared with: 2 epochs of 2 iterations, last.pt after each."""
    root = tmp_path_factory.mktemp("chaos")
    make_shapes(root / "shapes", n_train=8, n_val=2, seed=3, size=96)
    data = root / "tiny.yaml"
    data.write_text("path: shapes\ntrain: images/train\nval: images/val\nnames: [a, b, c, d, e, f]\n")
    args = ["--data", data, "--epochs", "2", "--deterministic", "--accumulate", "1", "--save-every", "1", *TINY]
    run([*args, "--out", root / "straight"])
    return root, args


@pytest.mark.parametrize(
    "name, nth",
    [
        ("last.pt", 2),  # after epoch 1's last iteration: resumed from iteration 1, mid-epoch (its loss sums)
        ("results.png", 1),  # end of epoch 1: results.csv has its row, last.pt is still the mid-epoch one
        ("last.pt", 6),  # the run's last save: epoch 2's row, best.pt and results.png are written again on resume
    ],
)
def test_killed_while_writing_resumes_bitwise_and_leaves_no_broken_file(straight, tmp_path, name, nth):
    root, args = straight
    out = tmp_path / "run"
    wrapper = make_wrapper(tmp_path, setup=KILLED_WHILE_WRITING.format(name=name, nth=nth))
    killed = run([*args, "--out", out], wrapper=wrapper, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    bad, temporary = unreadable_files(out)
    assert not bad, bad
    assert any(t.startswith(f".{name}.") for t in temporary), temporary  # the half-written file is a temporary one
    resumed = run(["--resume", out / "weights" / "last.pt"], check=False)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    bad, temporary = unreadable_files(out)
    assert not bad and not temporary, (bad, temporary)  # the killed run's temporary file removed
    assert outcome_differences(root / "straight", out) == []


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_export_killed_while_writing_leaves_no_half_file(straight, tmp_path):
    """SIGKILL while export.py writes best.torchscript (after half of it): no best.torchscript at all, and the
    temporary file is not one val.py or detect.py would pick; the next export writes it whole."""
    root, _ = straight
    weights = tmp_path / "best.pt"
    weights.write_bytes((root / "straight" / "weights" / "best.pt").read_bytes())
    script = tmp_path / "killed_export.py"
    script.write_text(
        f"import sys, runpy\nsys.path.insert(0, {str(REPO)!r})\n"
        + KILLED_AT_JIT_SAVE
        + "\nsys.argv = ['export.py', *sys.argv[1:]]\nrunpy.run_path('export.py', run_name='__main__')\n"
    )
    export = ["--weights", weights, "--torchscript", "--imgsz", "64", "--data", root / "tiny.yaml", "--runs", "1"]
    killed = subprocess.run([sys.executable, script, *map(str, export)], cwd=REPO, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "best.torchscript").exists()  # the half file is a hidden temporary one, never loaded
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["best.pt", "killed_export.py"]
    finished = subprocess.run(
        [sys.executable, "export.py", *map(str, export)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 0 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
    torch.jit.load(tmp_path / "best.torchscript")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt",
        "best.torchscript",
        "killed_export.py",
    ]  # no temporary


KILLED_AT_JIT_SAVE = """
import os, signal, torch
real_save = torch.jit.save
def save(module, path, *args, **kwargs):
    real_save(module, path, *args, **kwargs)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    os.kill(os.getpid(), signal.SIGKILL)
torch.jit.save = save
"""


def test_label_cache_killed_while_written_is_rebuilt(tmp_path):
    """SIGKILL while the first run writes the label cache: the next run finds no cache (or a whole one), verifies
    again without a traceback, and leaves a valid cache."""
    root = make_shapes(tmp_path / "shapes", n_train=4, n_val=1, size=64)
    script = (
        f"import os, signal, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "import utils.data.labels as L\n"
        "real = L.atomic_write\n"
        "def killed(path, write, fsync=False):\n"
        "    def half(f):\n"
        "        write(f); f.flush(); f.truncate(f.tell() // 2); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(path, half, fsync)\n"
        "L.atomic_write = killed\n"
        "L.load_verified([sys.argv[1]], nc=6, split_name='train')\n"
    )
    env = dict(os.environ, YOLO_CACHE_DIR=str(tmp_path / "user_cache"))
    images = str(root / "images" / "train")
    killed = subprocess.run([sys.executable, "-c", script, images], cwd=REPO, env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    check = (
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nimport utils.data.labels as L\n"
        "print(len(L.load_verified([sys.argv[1]], nc=6, split_name='train')))\n"
    )
    started = time.time()
    for _ in range(2):  # the first verifies again and writes the cache, the second reads it
        again = subprocess.run([sys.executable, "-c", check, images], cwd=REPO, env=env, capture_output=True, text=True)
        assert again.returncode == 0 and again.stdout.strip() == "4" and "Traceback" not in again.stderr, again.stderr
    assert time.time() - started < 120
    assert len(list((root / "labels").glob("*.cache.npz"))) == 1
    assert not [p.name for p in (root / "labels").iterdir() if p.name.startswith(".")]  # the killed one's removed


def test_one_rank_killed_under_torchrun_the_other_stops_in_one_sentence_and_resume_continues(straight, tmp_path):
    """SIGKILL to rank 1 of two gloo ranks on the CPU mid-epoch: rank 0 fails in its next collective and stops
    within seconds with one sentence naming the command that continues (no traceback of ours; torchrun prints its
    own report), and --resume under torchrun finishes the run from the last save."""
    root, _ = straight
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    args = ["--data", root / "tiny.yaml", "--epochs", "2", "--save-every", "1", "--val-every", "3", *TINY]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [*torchrun, "train.py", *map(str, args), "--out", str(out)]
    launcher = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    last, deadline = out / "weights" / "last.pt", time.time() + 240
    while not last.exists():
        assert launcher.poll() is None and time.time() < deadline, launcher.stderr.read()[-3000:]
        time.sleep(0.05)
    rank1 = next(pid for pid in children(launcher.pid) if "LOCAL_RANK=1" in environment(pid))
    os.kill(rank1, signal.SIGKILL)
    killed = time.time()
    _, errors = launcher.communicate(timeout=120)
    print(f"torchrun ended {time.time() - killed:.1f} s after the kill")
    assert launcher.returncode != 0 and time.time() - killed < 60
    sentences = [line for line in errors.splitlines() if line.startswith("stopping: rank 0 lost another process")]
    assert len(sentences) == 1, errors[-3000:]
    assert sentences[0].endswith(f"torchrun ... train.py --resume {last}"), sentences[0]
    # no traceback through this repo's code: torchrun's own report only
    assert f'File "{REPO / "train.py"}' not in errors and f'File "{REPO / "utils"}' not in errors
    assert torch.load(last, weights_only=True)["epoch"] < 2
    resumed = subprocess.run(
        [*torchrun, "train.py", "--resume", str(last)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(last, weights_only=True)["epoch"] == 2


def children(pid):
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def environment(pid):
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
