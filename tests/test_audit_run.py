"""audit.py end to end: a trained model scores a set (--folds 0) into issues.csv, index.html (opened in a real headless
browser: it loads offline and shows one row per issue with its crop) and corrections/; K-fold training where a fold
fails (the others are kept, and the same command resumes it); a set with no boxes; an unreadable image."""

import csv
import os
import re
import shutil
import subprocess
import sys

import pytest
import warm_python
import yaml
from train_runs import NAMES, REPO, make_checkpoint

from utils.data.shapes import make_shapes

pytestmark = pytest.mark.usefixtures("user_cache_dir")
TINY_TRAIN = ["--model", "n", "--epochs", "1", "--batch", "4", "--workers", "0", "--warmup-epochs", "0"]
CHROMIUM = "/usr/bin/chromium"  # Debian's, installed by .ci/run


def audit(*args):
    result = warm_python.run([sys.executable, "audit.py", *map(str, args)], REPO, timeout=600)
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def shapes(tmp_path):
    make_shapes(tmp_path / "shapes", n_train=8, n_val=4, seed=3, size=96)
    (tmp_path / "shapes" / "images" / "train" / "broken.jpg").write_bytes(b"not a picture")
    cfg = {"path": str(tmp_path / "shapes"), "train": "images/train", "val": "images/val", "names": NAMES}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "tiny.yaml"


def tree(folder):
    """Every image and label file with its time (the label cache that train.py also writes beside them aside)."""
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file() and ".cache." not in p.name
            and not p.name.endswith(".verify.log")}  # fmt: skip


def test_a_trained_model_scores_the_set_into_csv_page_and_corrections(tmp_path, shapes):
    weights = make_checkpoint(tmp_path / "best.pt", scale="n", imgsz=64, opinions=True)
    before = tree(tmp_path / "shapes")
    code, output = audit("--data", shapes, "--folds", "0", "--weights", weights, "--imgsz", "64", "--device", "cpu",
                         "--fix-score", "0.9", "--out", tmp_path / "audit")  # fmt: skip
    assert code == 0, output
    assert "in sample" in output and "broken.jpg" in output  # the unreadable image is excluded, and said so
    with open(tmp_path / "audit" / "issues.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and not any("broken" in r["image"] for r in rows)
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    assert {r["kind"] for r in rows} <= {"missing", "wrong_class", "badly_placed", "spurious", "duplicate"}
    assert tree(tmp_path / "shapes") == before  # the dataset itself is never written to
    assert list((tmp_path / "audit" / "corrections").rglob("*.txt"))
    page_opens_offline_with_a_row_per_issue(tmp_path / "audit", len(rows), tmp_path)


def page_opens_offline_with_a_row_per_issue(out, count, tmp_path):
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium, which this test opens the page in")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); CI=true makes this a failure")
    page = (out / "index.html").read_text()
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from the network
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}",
             "--virtual-time-budget=10000", "--dump-dom"]  # fmt: skip
    result = subprocess.run([CHROMIUM, *flags, (out / "index.html").as_uri()], capture_output=True, text=True,
                            timeout=180)  # fmt: skip
    dom = result.stdout
    shown = min(count, 500)  # --page-rows
    assert dom.count('<tr class="issue">') == shown, result.stderr[-2000:]
    assert f'data-crops-shown="{shown}"' in dom  # every row's crop image loaded from the folder


def test_a_failed_fold_is_said_the_others_kept_and_the_same_command_resumes_it(tmp_path, shapes):
    out = tmp_path / "audit"
    (out / "folds" / "1" / "weights").mkdir(parents=True)
    (out / "folds" / "1" / "weights" / "last.pt").write_bytes(b"a checkpoint cut off mid-write")
    command = ["--data", shapes, "--folds", "2", "--imgsz", "64", "--device", "cpu", "--out", out, *TINY_TRAIN]
    code, output = audit(*command)
    assert code == 0, output
    assert re.search(r"fold 1 failed \(.*1\.log says why\); its \d+ images are left out", output), output
    first = (out / "predictions.json").read_text()
    assert (out / "folds" / "0" / "weights" / "best.pt").exists()

    shutil.rmtree(out / "folds" / "1")
    code, output = audit(*command)
    assert code == 0, output
    assert "fold 0:" not in output and "fold 1: train.py" in output  # fold 0 is kept, fold 1 trains
    assert len((out / "predictions.json").read_text()) > len(first)  # every image has its prediction now
    code, output = audit(*command[:3], "3", *command[4:])  # another split cannot reuse these folds
    assert code == 1 and f"error: {out} holds folds of another split" in output


def test_a_set_without_boxes_gets_one_sentence(tmp_path):
    make_shapes(tmp_path / "shapes", n_train=4, n_val=2, seed=3, size=96)
    for label in (tmp_path / "shapes" / "labels").rglob("*.txt"):
        label.write_text("")
    cfg = {"path": str(tmp_path / "shapes"), "train": "images/train", "val": "images/val", "names": NAMES}
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump(cfg))
    code, output = audit("--data", tmp_path / "empty.yaml", "--out", tmp_path / "audit")
    assert code == 1
    assert f"error: {tmp_path / 'empty.yaml'} has no box in its 6 train and val images, so nothing to audit" in output


def test_the_folds_print_as_a_sweep_grid_of_one_experiment_each(tmp_path, shapes):
    flags = ["--data", shapes, "--folds", "3", "--epochs", "1", "--print-sweep", "--out", tmp_path / "a"]
    printed = warm_python.run([sys.executable, "audit.py", *map(str, flags)], REPO)
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "folds.yaml").write_text(printed.stdout)
    dry = warm_python.run([sys.executable, "tools/sweep.py", str(tmp_path / "folds.yaml"), "--dry-run"], REPO)
    commands = [line for line in dry.stdout.splitlines() if line.startswith("python audit.py")]
    assert [c.split()[-1] for c in commands] == ["0", "1", "2"]  # --fold K
    assert all(f"--out {tmp_path / 'a'} --fold" in c and "--epochs 1" in c for c in commands)
